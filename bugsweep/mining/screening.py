"""Screening a commit without running anything: it must change a runnable test and a source file, and read like
a fix, by its words and, when its Python change can be read, by what it changed (bugsweep/mining/change.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from bugsweep.grading.testfiles import is_test_file
from bugsweep.mining.change import BUILTIN_EXCEPTIONS, ChangeShape, read_change
from bugsweep.mining.records import Commit, Rejection, RejectReason, Screened
from bugsweep.settings import DEFAULT_TEST_GLOBS

#: Words that say a bug was fixed, whatever else the commit does. Matched case-insensitively on whole words.
STRONG_FIX_WORDS = (
    r"fix(es|ed|ing)?|bug(s|fix|fixes)?|hotfix|regression|crash(es|ed|ing)?|broken|incorrect(ly)?|wrong(ly)?|"
    r"typo|mistakes?"
)
#: Words that often come with a fix but also with features ("better error messages", "handle new format").
WEAK_FIX_WORDS = (
    r"errors?|exceptions?|fail(s|ed|ing|ure)?|handle[sd]?|prevent(s|ed)?|avoid(s|ed)?|correct(ly|s|ed)?|"
    r"don't|doesn't|can't|cannot"
)
#: Every fix word, strong or weak. An exception's name counts too, but only a real one (see ChangeShape.is_exception).
FIX_PATTERN = re.compile(rf"\b({STRONG_FIX_WORDS}|{WEAK_FIX_WORDS})\b", re.IGNORECASE)
STRONG_FIX = re.compile(rf"\b({STRONG_FIX_WORDS})\b", re.IGNORECASE)
#: A CamelCase word naming an exception class (`OSError`, `SignatureExpired` does not count, `ParsedException` may).
EXCEPTION_WORD = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b")
#: An issue named as the thing fixed ("closes #12", "issue 45", "gh-7"). Counts in the subject only: a body's
#: "Closes #467" is how every pull request ends, features included. A bare "(#123)" is a PR number, not a fix.
ISSUE_PATTERN = re.compile(r"\b(issue|closes|closed|resolves|resolved|fixes|gh)\s*-?#?\d+", re.IGNORECASE)
#: An issue reference that opens a subject ("Fix #131: Add cache_info()", "Issue #12 - ..."): some projects title
#: every commit so, features included; what the commit does is the rest of the subject.
ISSUE_PREFIX = re.compile(
    r"^\s*(?:(?:(?:fix(?:es|ed)?|closes|resolves)\s*#\d+|(?:issue|gh)\s*-?\s*#?\d+|#\d+)\s*(?:,|&|and)?\s*)+[:.)\]-]?\s*",
    re.IGNORECASE,
)
#: Subjects that announce something new: with new public names in the change, a feature.
FEATURE_SUBJECT = re.compile(
    r"^\s*(add(s|ed|ing)?|implement(s|ed)?|introduce[sd]?|support(s|ed)?|allow(s|ed)?|expose[sd]?|new|"
    r"provide[sd]?|enable[sd]?|make\s+\S+\s+configurable)\b",
    re.IGNORECASE,
)
#: Subjects that announce work other than a fix (a refactor, a clean-up, speed, docs): never a fix without a fix word.
OTHER_WORK_SUBJECT = re.compile(
    r"^\s*(improve[sd]?|reduce[sd]?|optimi[sz]e[sd]?|speed\s+up|refactor\w*|clean\w*|minor|small|deprecate[sd]?|"
    r"drop(s|ped)?|remove[sd]?|rename[sd]?|re-?format\w*|format\w*|moderni[sz]e[sd]?|update[sd]?|upgrade[sd]?|"
    r"convert(s|ed)?|move[sd]?|simplif(y|ies|ied)|document\w*|tidy|replace[sd]?|switch(es|ed)?|migrate[sd]?|"
    r"split|extract(s|ed)?|type\s+hints?|annotate|lint|tests?\b|more\s+tests|also\s+test)",
    re.IGNORECASE,
)
#: Conventional-commit types that are not bug fixes (`feat: ...`, `refactor(core)!: ...`).
NOT_A_FIX_TYPES = (
    "feat",
    "feature",
    "refactor",
    "chore",
    "docs",
    "doc",
    "test",
    "tests",
    "perf",
    "style",
    "build",
    "ci",
)
CONVENTIONAL_SUBJECT = re.compile(r"^\s*(?P<type>[A-Za-z]+)(\([^)]*\))?!?:\s*(?P<rest>.*)$")
#: What a conventional-commit subject of another type must say to count as a fix anyway ("refactor: fix ...").
SAYS_FIX = re.compile(r"\b(fix(es|ed|ing)?|bug(s|fix)?|hotfix|regression|crash(es|ed|ing)?)\b", re.IGNORECASE)
#: Messages that look like fixes but are not bug fixes to learn from.
NOT_A_FIX_PATTERN = re.compile(r"^\s*(revert\b|merge\b|release\b|bump\b|prepare release)", re.IGNORECASE)
#: A fix without a fix word must be small: source lines added plus removed, at most.
MAX_WORDLESS_FIX_LINES = 40
#: ... and touch few existing functions: a clean-up or a linter's pass touches many a little.
MAX_WORDLESS_FIX_FUNCTIONS = 3
#: Single-module test suites of older projects (`tests.py`), counted as test files too when mining.
LONE_TEST_MODULES = {"tests.py", "test.py"}
#: Test-file patterns used to split a commit: the agent's protected globs plus the lone test modules.
MINING_TEST_GLOBS = [*DEFAULT_TEST_GLOBS, *sorted(LONE_TEST_MODULES)]
#: File endings that count as source code (a change to docs, changelogs or CI configuration alone is no fix).
SOURCE_SUFFIXES = {
    ".py", ".pyx", ".pxd", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go", ".js", ".ts", ".java", ".rb",
}  # fmt: skip
#: Source files that are packaging or tooling, not the code under test.
NOT_SOURCE_NAMES = {"setup.py", "noxfile.py", "tasks.py", "fabfile.py", "conftest.py", "docs/conf.py"}


class Reading(NamedTuple):
    """What the screen made of a commit's message and change: a fix or not, and why, in words a user reads."""

    fix: bool
    reason: str


def is_source_file(path: str, test_globs: Sequence[str] = MINING_TEST_GLOBS) -> bool:
    p = PurePosixPath(path)
    if is_test_file(path, test_globs) or path in NOT_SOURCE_NAMES or p.name in NOT_SOURCE_NAMES:
        return False
    if p.parts and p.parts[0] in {"docs", "doc", "examples", "benchmarks", ".github"}:
        return False
    return p.suffix in SOURCE_SUFFIXES


def is_runnable_test(path: str) -> bool:
    name = PurePosixPath(path).name
    return name.endswith(".py") and (
        name.startswith("test_") or name.endswith("_test.py") or name in LONE_TEST_MODULES
    )


def _listed(names: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _fix_word(text: str, shape: ChangeShape | None) -> str | None:
    """The first fix word of `text` (FIX_PATTERN), or a real exception's name in it."""
    if found := FIX_PATTERN.search(text):
        return found.group(0)
    for word in EXCEPTION_WORD.findall(text):
        if word in BUILTIN_EXCEPTIONS if shape is None else shape.is_exception(word):
            return word
    return None


def _feature_shape(shape: ChangeShape) -> str | None:
    """Why the change reads as a feature: new public names, and the tests it adds or changes test only those."""
    tests = [*shape.new_tests, *shape.changed_tests]
    if not shape.added_names or not tests or shape.tests_on_existing_names:
        return None
    return (
        f"it adds new public names ({_listed(shape.added_names)}) and its tests ({_listed(tests)}) "
        "assert nothing about code that existed before"
    )


def _fix_shape(shape: ChangeShape) -> tuple[str | None, str]:
    """(why the change reads as a fix, or None; else why not): existing functions changed, a small source change,
    no new public names, tests asserting on existing names."""
    if shape.added_names:
        return None, f"it adds new public names ({_listed(shape.added_names)})"
    if not shape.changed_functions:
        return None, "it changes no existing function"
    if len(shape.changed_functions) > MAX_WORDLESS_FIX_FUNCTIONS:
        return None, (
            f"it changes {len(shape.changed_functions)} existing functions (over {MAX_WORDLESS_FIX_FUNCTIONS}: "
            "a clean-up rather than a fix)"
        )
    if shape.source_lines > MAX_WORDLESS_FIX_LINES:
        return None, f"its source change is large ({shape.source_lines} lines, over {MAX_WORDLESS_FIX_LINES})"
    if not shape.tests_on_existing_names:
        return None, "no test it adds or changes asserts anything"
    return (
        f"it changes existing code ({_listed(shape.changed_functions)}, {shape.source_lines} "
        f"line{'' if shape.source_lines == 1 else 's'}, no new public "
        f"names) and tests assert on it ({_listed(shape.tests_on_existing_names)})"
    ), ""


def read_commit(message: str, subject: str | None = None, shape: ChangeShape | None = None) -> Reading:
    """Whether a commit is a bug fix to learn from, by its message and, when known, the shape of its change.

    In order, the first rule that decides:
    1. a subject starting with revert, merge, release or bump is no fix;
    2. a conventional-commit subject of a type other than fix (feat, refactor, chore, docs, test, perf, style,
       build, ci) is no fix unless the subject itself says fix (fix, bug, hotfix, regression, crash);
    3. a leading issue reference ("Fix #131:", "Issue #12:") is set aside: the rest of the subject says what the
       commit does; a rest that announces something (Add, Implement, Support, Allow, ...) while the change adds
       new public names is a feature;
    4. a subject (past that reference) with a strong fix word (fix, bug, regression, crash, broken, wrong,
       incorrect, typo, mistake) is a fix;
    5. a change that adds new public names and whose new or changed tests test only those is a feature, whatever
       weaker words the message has;
    6. a fix word anywhere in the message (FIX_PATTERN: also error, fail, handle, prevent, avoid, correct,
       don't, ...), a real exception's name (a builtin one, or one the changed code raises or catches and the commit
       did not add), or an issue named as fixed in the subject ("closes #12"; with a shape, not the leading
       reference set aside in 3) make a fix;
    7. with no such word, a change that reads like a fix (`_fix_shape`: 1 to MAX_WORDLESS_FIX_FUNCTIONS existing
       functions changed, at most MAX_WORDLESS_FIX_LINES source lines, no new public names, tests asserting on existing names) is one;
       anything else is not.
    Without a shape (no repository given, or a change that is not readable Python) rules 5 and 7 do not apply and
    only builtin exception names count.
    """
    first = subject if subject is not None else (message.strip().splitlines()[0] if message.strip() else "")
    if NOT_A_FIX_PATTERN.search(first):
        return Reading(False, f"the subject starts with {first.split()[0].lower()!r}")
    conventional = CONVENTIONAL_SUBJECT.match(first)
    if conventional and conventional["type"].lower() in NOT_A_FIX_TYPES:
        if said := SAYS_FIX.search(conventional["rest"]):
            return Reading(
                True, f"a {conventional['type'].lower()!r} commit whose subject says {said.group(0)!r}"
            )
        return Reading(False, f"a {conventional['type'].lower()!r} commit whose subject does not say fix")
    prefix = ISSUE_PREFIX.match(first)
    rest = first[prefix.end() :] if prefix else first
    if shape is not None and shape.added_names and (verb := FEATURE_SUBJECT.match(rest)):
        return Reading(
            False,
            f"a feature: the subject says {verb.group(0).strip()!r} and the change adds new public names "
            f"({_listed(shape.added_names)})",
        )
    if strong := STRONG_FIX.search(rest):
        return Reading(True, f"the subject says {strong.group(0)!r}")
    if shape is not None and (feature := _feature_shape(shape)):
        return Reading(False, f"a feature or refactor: {feature}")
    # The leading issue reference says nothing (some projects write "Fix #N:" before every subject).
    words = message.replace(first, rest, 1) if prefix else message
    if word := _fix_word(words, shape):
        return Reading(True, f"the message says {word!r}")
    if ISSUE_PATTERN.search(first if shape is None else rest):
        return Reading(True, "the subject names an issue as fixed")
    if shape is not None:
        if other := FEATURE_SUBJECT.match(rest) or OTHER_WORK_SUBJECT.match(rest):
            return Reading(
                False, f"no fix word in the message, and the subject says {other.group(0).strip()!r}"
            )
        why, why_not = _fix_shape(shape)
        if why:
            return Reading(True, f"no fix word, but the change reads like a fix: {why}")
        return Reading(False, f"no fix word in the message (fix, bug, error, crash, ...), and {why_not}")
    if ISSUE_PATTERN.search(message) or re.search(r"(^|\s)\(?#\d+\b", message):
        return Reading(False, "only an issue reference, no fix keyword (fix, bug, error, crash, ...)")
    return Reading(False, "no fix keyword in the message (fix, bug, error, crash, ...)")


def not_a_fix_reason(
    message: str, subject: str | None = None, shape: ChangeShape | None = None
) -> str | None:
    """Why the commit is not a bug fix (read_commit), or None if it is one."""
    reading = read_commit(message, subject, shape)
    return None if reading.fix else reading.reason


def looks_like_fix(message: str, subject: str | None = None, shape: ChangeShape | None = None) -> bool:
    """True when the commit reads like a bug fix (see read_commit)."""
    return read_commit(message, subject, shape).fix


def screen(
    commit: Commit, test_globs: Sequence[str] = MINING_TEST_GLOBS, repo: Path | None = None
) -> Screened | Rejection:
    """The cheap checks, in order: a runnable test changed, a source file changed, the commit reads like a fix.

    With `repo` (the git directory holding the commit), the change's Python code is read too (read_change) and
    judged with the words (read_commit); without it, the words alone decide."""
    tests = [path for _, path in commit.changes if is_test_file(path, test_globs)]
    runnable = [
        path for status, path in commit.changes if status != "D" and path in tests and is_runnable_test(path)
    ]
    sources = [path for _, path in commit.changes if is_source_file(path, test_globs)]

    def reject(reason: RejectReason, detail: str) -> Rejection:
        return Rejection(commit=commit.sha, subject=commit.subject, reason=reason, detail=detail)

    if not commit.parents:
        return reject(RejectReason.NO_PARENT, "the root commit has nothing to start from")
    if not runnable:
        detail = "changes no test module" if not tests else f"changes only {', '.join(tests[:3])}"
        return reject(RejectReason.NO_TEST_CHANGE, detail)
    if not sources:
        return reject(RejectReason.NO_SOURCE_CHANGE, f"changes tests only ({', '.join(runnable[:3])})")
    shape = read_change(repo, commit, sources, tests) if repo is not None else None
    reading = read_commit(commit.text_to_match, commit.subject, shape)
    if not reading.fix:
        return reject(RejectReason.NOT_A_FIX, reading.reason)
    return Screened(
        commit=commit, test_files=tests, runnable_tests=runnable, source_files=sources, why_fix=reading.reason
    )
