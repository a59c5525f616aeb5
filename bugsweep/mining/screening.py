"""Screening a commit without running anything: it must change a runnable test and a source file, and read like
a fix."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePosixPath

from bugsweep.mining.records import Commit, Rejection, RejectReason, Screened
from bugsweep.settings import DEFAULT_TEST_GLOBS
from bugsweep.testfiles import is_test_file

#: Words in a commit message that suggest a bug fix. Matched case-insensitively on whole words, subject and body.
FIX_PATTERN = re.compile(
    r"\b(fix(es|ed|ing)?|bug(s|fix)?|hotfix|regression|crash(es|ed|ing)?|errors?|exceptions?|broken|"
    r"incorrect(ly)?|wrong(ly)?|fail(s|ed|ing|ure)?|mistakes?|typo|handle[sd]?|prevent(s|ed)?|avoid(s|ed)?|"
    r"correct(ly|s|ed)?|don't|doesn't|can't|cannot)\b"
    r"|\w+(Error|Exception)\b",
    re.IGNORECASE,
)
#: An issue named as the thing fixed ("closes #12", "issue 45", "gh-7"). Counts in the subject only: a body's
#: "Closes #467" is how every pull request ends, features included. A bare "(#123)" is a PR number, not a fix.
ISSUE_PATTERN = re.compile(r"\b(issue|closes|closed|resolves|resolved|fixes|gh)\s*-?#?\d+", re.IGNORECASE)
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


def not_a_fix_reason(message: str, subject: str | None = None) -> str | None:
    """Why the message does not read like a bug fix, or None if it does.

    - a subject starting with revert, merge, release or bump is no fix;
    - a conventional-commit subject of a type other than fix (feat, refactor, chore, docs, test, perf, style,
      build, ci) is no fix unless the subject itself says fix (fix, bug, hotfix, regression, crash), whatever the
      body says;
    - otherwise a fix keyword (FIX_PATTERN) in the subject or body, or an issue named as fixed in the subject
      ("closes #12"). An issue reference in the body alone does not make a fix.
    """
    first = subject if subject is not None else (message.strip().splitlines()[0] if message.strip() else "")
    if NOT_A_FIX_PATTERN.search(first):
        return f"the subject starts with {first.split()[0].lower()!r}"
    conventional = CONVENTIONAL_SUBJECT.match(first)
    if conventional and conventional["type"].lower() in NOT_A_FIX_TYPES:
        if SAYS_FIX.search(conventional["rest"]):
            return None
        return f"a {conventional['type'].lower()!r} commit whose subject does not say fix"
    if FIX_PATTERN.search(message) or ISSUE_PATTERN.search(first):
        return None
    if ISSUE_PATTERN.search(message) or re.search(r"(^|\s)\(?#\d+\b", message):
        return "only an issue reference, no fix keyword (fix, bug, error, crash, ...)"
    return "no fix keyword in the message (fix, bug, error, crash, ...)"


def looks_like_fix(message: str, subject: str | None = None) -> bool:
    """True when the message reads like a bug fix (see not_a_fix_reason)."""
    return not_a_fix_reason(message, subject) is None


def screen(commit: Commit, test_globs: Sequence[str] = MINING_TEST_GLOBS) -> Screened | Rejection:
    """The cheap checks, in order: a runnable test changed, a source file changed, the message reads like a fix."""
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
    if why := not_a_fix_reason(commit.text_to_match, commit.subject):
        return reject(RejectReason.NOT_A_FIX, why)
    return Screened(commit=commit, test_files=tests, runnable_tests=runnable, source_files=sources)
