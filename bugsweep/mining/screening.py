"""Screening a commit without running anything: it must change a runnable test and a source file, and read like
a fix, by its words and, when its Python change can be read, by what it changed (bugsweep/mining/change.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import NamedTuple

from bugsweep.grading.testfiles import is_test_file
from bugsweep.mining.change import BUILTIN_EXCEPTIONS, ChangeShape, read_change
from bugsweep.mining.files import MINING_TEST_GLOBS, is_runnable_test, is_source_file
from bugsweep.mining.interpreters import python_to_come, released_on
from bugsweep.mining.records import Commit, Rejection, RejectReason, Screened
from bugsweep.mining.releases import own_work
from bugsweep.mining.shapes import feature_shape, fix_shape, listed

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
#: What precedes "fixed" as an adjective (an article, a word at most between: "a single fixed schema"): no fix word,
#: nor is "fixed-point" (issue 37's round 10: every such reading over the eleven labelled sets was an adjective).
FIXED_ADJECTIVE = re.compile(r"\b(a|an|the)\s+(\w+\s+)?$", re.IGNORECASE)
#: A weak word that says what was wrong: "Correct parsing of ...", "... correctly" need no backing (read_commit).
CORRECTED = re.compile(r"\bcorrect(ly|s|ed)?\b", re.IGNORECASE)
#: A CamelCase word naming an exception class (`OSError`, `SignatureExpired` does not count, `ParsedException` may).
EXCEPTION_WORD = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b")
#: An issue named as the thing fixed ("closes #12", "issue 45", "gh-7"). Counts in the subject only: a body's
#: "Closes #467" is how every pull request ends, features included. A bare "(#123)" is a PR number, not a fix.
ISSUE_PATTERN = re.compile(r"\b(issue|closes|closed|resolves|resolved|fixes|gh)\s*-?#?\d+", re.IGNORECASE)
#: An issue reference that opens a subject ("Fix #131: Add cache_info()", "Fix 144: Add ...", "Issue #12 - ..."):
#: some projects title every commit so, features included; what the commit does is the rest of the subject.
ISSUE_PREFIX = re.compile(
    r"^\s*(?:(?:(?:fix(?:es|ed)?|closes|resolves)\s*(?:#\d+|\d+(?=\s*[:,]))|(?:issue|gh)\s*-?\s*#?\d+|#\d+)\s*"
    r"(?:,|&|and)?\s*)+[:.)\]-]?\s*",
    re.IGNORECASE,
)
#: Subjects that announce something new: with new public names in the change, a feature.
FEATURE_SUBJECT = re.compile(
    r"^\s*(add(s|ed|ing)?(?!\s+(a\s+|an\s+|missing\s+)?(check|guard|validation|handling)s?\b)|implement(s|ed)?|introduce[sd]?|support(s|ed)?|allow(s|ed)?|expose[sd]?|new|"
    r"provide[sd]?|enable[sd]?|make\s+\S+\s+configurable|internationali[sz]e[sd]?|locali[sz]e[sd]?|translate[sd]?)\b",
    re.IGNORECASE,
)
#: Phrases that announce something new wherever they are in a subject ("naturaltime can also accept a float",
#: "parse(generator) is now possible", "make catch() usable as an async context manager", "choices can be callable").
FEATURE_PHRASE = re.compile(
    r"\b((can|may)\s+(now\s+|also\s+)?(accept|take|handle|support|be\s+(used|callable|passed|given))|"
    r"(also|now)\s+(accept|support|handle)s?|(is\s+)?now\s+possible|usable\s+(as|with|in|from)|better\s+support|"
    r"internationali[sz]\w*|locali[sz]ation|translations?)\b",
    re.IGNORECASE,
)
#: Subjects that announce work other than a fix (a refactor, a clean-up, speed, docs, tests, tooling): without a
#: strong fix word in the message, never a fix; weak words in the body (error, avoid, ...) do not outweigh them.
#: Addressing review comments is iterating on a pull request's own work.
OTHER_WORK_SUBJECT = re.compile(
    r"^\s*(optimi[sz]e[sd]?|speed\s+up|refactor\w*|clean\w*|minor|small|deprecate[sd]?|drop(s|ped)?|"
    r"rename[sd]?|re-?format\w*|format\w*|moderni[sz]e[sd]?|upgrade[sd]?|move[sd]?|document\w*|docs?\b|tidy|"
    r"migrate[sd]?|sync\w*|type\s+hints?|annotate|lint\w*|tests?\b|more\s+tests|also\s+test|cover(s|ed)?\b|"
    r"run\b|apply\b|applied\b|enforce[sd]?|prepare\b|bump\w*|various|misc\w*|relax\w*|repackag\w*|"
    r"cache\b|memoi[sz]e[sd]?\b|address(es|ed|ing)?\s+(the\s+|some\s+|all\s+)?(code\s+)?(review|pr\b|feedback|comments?))",
    re.IGNORECASE,
)
#: Subjects of work that may be a fix or not ("Update __eq__ for numeric_range", "Replace the fill value logic"):
#: with an issue reference and a change shaped like a fix, a fix; otherwise like OTHER_WORK_SUBJECT.
MAYBE_WORK_SUBJECT = re.compile(
    r"^\s*(add(s|ed|ing)?\s+(a\s+|an\s+|missing\s+)?(check|guard|validation)s?|improve[sd]?|reduce[sd]?|remove[sd]?|update[sd]?|convert(s|ed)?|simplif(y|ies|ied)|replace[sd]?|"
    r"switch(es|ed)?|split|extract(s|ed)?)\b",
    re.IGNORECASE,
)
#: What tooling and housekeeping are called. A subject naming one of TOOLING_SUBJECT ("resolve tornado mypy
#: errors", "expose .retry to type checkers") is about tooling whatever fix word it has; a fix word about one of
#: TOOLING ("fix typos", "fix the failing tests", "fix pep8 error", "lint fixes", "auto-fix") says nothing about a
#: bug; a subject naming one without a fix word is other work.
TOOLING_SUBJECT = (
    r"typos|lint\w*|linters?|flake8|pep\s?8|ruff|isort|pre-commit|pyupgrade|autotyping|codespell|mypy|pyright|"
    r"pylint|pyflakes|pycodestyle|pydocstyle|autopep8|yapf|bugbear|code[- ]?styles?|"
    r"type[- ]?check(ers?|ing)|type[- ]?hints?|typing(?!\.)|type\s+annotations|ci|coverage|noqa|black\s+(formatting|style)|"
    r"(apply|run)\s+black|static\s+(analysis|typing|checks?)|chores?|housekeeping|"
    r"(?<=[(,\s])[A-Z]{1,3}\d{3,4}(?=[,)])"  # a linter's rule code in parentheses: "(B017)", "(E501, W503)"
)
TOOLING = (
    rf"{TOOLING_SUBJECT}|spelling|docs|documentation|docstrings?|comments?|tests?|test\s*suite|review(\s+comments?)?|(pr|review|pull\s+request)\s+(remarks?|feedback)|"
    r"violations?|warnings?|import\s+order|readme|changelog|annotation|packaging|setup|tox|builds?|jobs?"
)
TOOLING_WORD = re.compile(rf"\b({TOOLING_SUBJECT})\b", re.IGNORECASE)
#: Where a fix is when it is "in" them ("fix unicode in tests", "fix errors in docs found with doctest"): only
#: places no library's own behaviour is called (a parser's comments, a scheduler's jobs are).
IN_TOOLING = r"tests?|test\s*suite|docs|documentation|docstrings?|readme|changelog"
#: A fix word whose object is tooling ("fix typos", "fix the failing tests", "fix pep8 error", "lint fixes",
#: "auto-fix codebase", "fixing code style errors", "trivial grammar fix", "fix unicode in tests"): it says nothing
#: about a bug.
TOOLING_FIX = re.compile(
    rf"\b(fix(es|ed|ing)?|correct(s|ed)?)\s+((a\s+few|a\s+couple\s+of|some|several|many|more|minor|small|all|the)\s+)?"
    rf"(\w[\w-]*\s+)?({TOOLING})\b|"
    rf"\b(fix(es|ed|ing)?|correct(s|ed)?)\s+(\w[\w-]*\s+){{1,3}}in\s+(the\s+)?({IN_TOOLING})\b|"
    rf"\b({TOOLING}|auto|typo|grammar|wording)[- ]fix(es|ed)?\b|\bautofix\w*",
    re.IGNORECASE,
)
#: A fix word whose object is speed ("Fixed some performance issues", "fix a performance regression"): work on how
#: fast, not on what the code does (a fix of code that hangs or backtracks names that instead: "Fix slow backtracking").
SPEED_FIX = re.compile(
    r"\b(fix(es|ed|ing)?|correct(s|ed)?)\s+((a|the|some|several|many|more|minor|small|all)\s+)?(\w[\w-]*\s+)?"
    r"(performance|speed|slowdown)\b",
    re.IGNORECASE,
)
#: Words anywhere in a subject that announce work other than a fix ("a few more py3 improvements", "Make functions
#: private and deprecate public aliases", "make the error more informative", "catch a more specific exception",
#: "make star paths the default", "change default parser to ...", "warn instead of raising for now").
OTHER_WORK_PHRASE = re.compile(
    r"\b(improvements?|clean-?ups?|refactor\w*|polish\w*|deprecat\w+|(error|exception|warning)\s+messages?|"
    r"more\s+(informative|helpful|descriptive|readable|useful|specific|explicit)|(by|the)\s+default|"
    r"change[sd]?\s+default|for\s+now)\b",
    re.IGNORECASE,
)
#: Speed and memory, in a subject or a message: work on how fast, not on what the code does.
SPEED_PHRASE = re.compile(
    r"\b(performance|faster|slower|speed(s|ed)?\s+up|speed-?ups?|optimi[sz]\w*|hot\s+path|overhead|"
    r"benchmark\w*|memory\s+usage)\b",
    re.IGNORECASE,
)
#: A fix word that is part of an issue reference ("Fixes #31", "fix #350", "fixes: #393", "closes gh-7"): in a
#: message body it is how pull requests end, features included, and says nothing about a bug.
ISSUE_REFERENCE = re.compile(r"\s*:?\s*(#|gh-?|issue\s*#?)\d+", re.IGNORECASE)
#: A `module: ...` prefix of a subject ("statsutils: add mode()", "tbutils: round-trip ...", "JSON Schema: Support
#: ..."): what the commit does comes after it. A prefix of several words counts only when none of them is a fix
#: word or opens a feature or other work ("Fix regression: ..." is no module).
MODULE_PREFIX = re.compile(r"^\s*(?P<module>[\w./-]+(?:\s[\w./-]+){0,2}):\s+(?=\S)")
#: Conventional-commit types that are not bug fixes (`feat: ...`, `refactor(core)!: ...`), and the kinds of change a
#: changelog files apart from fixes, used the same way ("NEW: tomli.load()", "add: `--no-validate` option",
#: "improve: warn when ...", "deprecate: ...", "BREAKING: ...", "Added: `Selector.re_first`": Keep a Changelog's
#: section names, tomli's and mdformat's prefixes).
NOT_A_FIX_TYPES = frozenset({
    "feat", "feature", "refactor", "chore", "docs", "doc", "test", "tests", "perf", "style", "build", "ci",
    "new", "add", "added", "improve", "improved", "improvement", "enhance", "enhancement", "deprecate", "deprecated",
    "deprecation", "breaking", "removed", "lint",
})  # fmt: skip
#: Those whose fixes are of tooling, whatever they name ("lint: fix C4xx comprehension errors").
TOOLING_TYPES = frozenset({"lint", "style", "ci", "build"})
CONVENTIONAL_SUBJECT = re.compile(r"^\s*(?P<type>[A-Za-z]+)(\([^)]*\))?!?:\s*(?P<rest>.*)$")
#: A gitmoji (or its `:shortcode:`) opening a subject ("🐛 fix(api): ...", "🧪 test: ...", ":bug: fix ..."): set
#: aside, so that the conventional type after it is read.
GITMOJI = re.compile(r"^\s*(?:[^\x00-\x7f\w]|:[a-z0-9_+-]+:)+\s*")
#: What a conventional-commit subject of another type must say to count as a fix anyway ("refactor: fix ...").
SAYS_FIX = re.compile(r"\b(fix(es|ed|ing)?|bug(s|fix)?|hotfix|regression|crash(es|ed|ing)?)\b", re.IGNORECASE)
#: Conventional-commit types that are fixes (`fix: ...`, `fix(parser): ...`).
FIX_TYPES = ("fix", "bugfix", "hotfix")
#: How a reason names the kind a changelog entry says.
CHANGELOG_WORDS = {"fix": "a bug fix", "feature": "a feature", "removal": "a removal or deprecation"}
#: Messages that look like fixes but are not bug fixes to learn from. "Merge" only as a merge of branches or
#: changes ("Merge branch 'x'", "Merge changes from 3.2.5", "Merge commit from fork"), not the verb ("Merge AoT
#: fragments when ...").
NOT_A_FIX_PATTERN = re.compile(
    r"^\s*(revert\b|merge\s+(pull\s+requests?|(remote-tracking\s+)?branch(es)?|tags?|(changes|commits?)\s+from|"
    r"upstream|origin|master|main|develop|trunk|['\"]|[\w.-]+/)|release\b|bump\b|prepare release)",
    re.IGNORECASE,
)
#: GitHub's title for a security advisory's fix merged from its private fork: it says nothing of the change, so the
#: commit is read without it (its body, changelog entry and change), not as a merge of branches.
ADVISORY_MERGE = re.compile(r"^\s*merge\s+commit\s+from\s+fork\s*$", re.IGNORECASE)
#: A later clause of a release or bump subject that fixes something ("Bump version to 1.5.6 and fix setitem ..."):
#: the subject is then read past its release part.
AND_FIX_CLAUSE = re.compile(r"\b(and|with|plus|[,;])\s+(?=(fix(es|ed)?|correct(s|ed)?)\s+\w)", re.IGNORECASE)
#: An exception the subject says the code now raises ("Make viewkeys raise AttributeError", "raise TypeError for
#: bytes"): behaviour asked for, not a failure fixed; the name is then no fix word ("raised TypeError" is a failure).
RAISES_EXCEPTION = re.compile(r"\b(raises?|throws?)\s+(an?\s+)?(?P<name>[A-Z]\w*(Error|Exception))\b")


class Rule(StrEnum):
    """The rule of the screen that decided, as recorded with every decision (`Screened.rule`, a task's
    `screen_rule`): the first that applies, in read_commit's order, then screen's PYTHON_TO_COME,
    OWN_UNRELEASED and OTHERS_UNRELEASED."""

    NOT_A_FIX_SUBJECT = "revert, merge, release or bump"
    CONVENTIONAL = "conventional-commit type"
    NO_CODE = "no code changed"
    CHANGELOG = "changelog entry"
    FEATURE = "feature: new names"
    SUBJECT_FIX_WORD = "fix word in the subject"
    FEATURE_ASKED = "feature: the issue it answers"
    FEATURE_SHAPE = "feature: tests only of new names"
    OTHER_WORK = "other work announced"
    ISSUE_FIX_SHAPE = "issue reference and a fix-shaped change"
    MESSAGE_FIX_WORD = "fix word in the message"
    EXCEPTION = "exception named"
    ISSUE_FIXED = "issue named as fixed"
    NO_FIX_WORD = "no fix word"
    PYTHON_TO_COME = "a Python to come"
    OWN_UNRELEASED = "own unreleased work"
    OTHERS_UNRELEASED = "others' unreleased work"


class Reading(NamedTuple):
    """What the screen made of a commit's message and change: a fix or not, why in words a user reads, and the
    rule that decided."""

    fix: bool
    reason: str
    rule: Rule = Rule.NO_FIX_WORD


def _about_tooling(text: str, start: int) -> bool:
    """Whether the fix word at `start` of `text` is about tooling ("fix typos", "lint fixes", "auto-fix", "fixed PR
    remarks") or speed ("fixed some performance issues"), not about what the code does."""
    return any(
        m.start() <= start < m.end() for found in (TOOLING_FIX, SPEED_FIX) for m in found.finditer(text)
    )


def _fix_word(
    text: str,
    shape: ChangeShape | None,
    *,
    weak: bool = True,
    references: bool = True,
    raised: frozenset[str] = frozenset(),
    exceptions: bool | None = None,
) -> str | None:
    """The first fix word of `text` not about tooling (FIX_PATTERN, or only STRONG_FIX without `weak`; without
    `references`, not one of an issue reference such as "Fixes #31"), or with `exceptions` (by default `weak`) a
    real exception's name that is not one of `raised` (those the subject says the code now raises)."""
    for found in (FIX_PATTERN if weak else STRONG_FIX).finditer(text):
        if _about_tooling(text, found.start()):
            continue
        if found.group(0).lower() == "fixed" and (
            text.startswith("-", found.end())
            or FIXED_ADJECTIVE.search(text[max(0, found.start() - 40) : found.start()])
        ):
            continue
        if not references and ISSUE_REFERENCE.match(text, found.end()):
            continue
        if text[: found.start()].rstrip().endswith("=") or text[found.end() :].lstrip().startswith("="):
            continue  # a setting's name or value ("CONTINUATION_ALIGN_STYLE=FIXED", "fix=True"), not a word
        return found.group(0)
    if weak if exceptions is None else exceptions:
        for word in EXCEPTION_WORD.findall(text):
            if word in raised:
                continue
            if word in BUILTIN_EXCEPTIONS if shape is None else shape.is_exception(word):
                return word
    return None


def _word_rule(word: str) -> Rule:
    return Rule.EXCEPTION if EXCEPTION_WORD.fullmatch(word) else Rule.MESSAGE_FIX_WORD


def _announced(rest: str) -> str | None:
    """What a subject announces that is not a fix: a feature or other work (its opening words), a feature phrase,
    or tooling it names; None for a neutral subject."""
    if (
        found := FEATURE_SUBJECT.match(rest)
        or OTHER_WORK_SUBJECT.match(rest)
        or MAYBE_WORK_SUBJECT.match(rest)
    ):
        return found.group(0).strip()
    if found := FEATURE_PHRASE.search(rest) or OTHER_WORK_PHRASE.search(rest) or TOOLING_FIX.search(rest):
        return found.group(0).strip()
    if found := SPEED_PHRASE.search(rest):
        return found.group(0).strip()
    return None


def _maybe_work(rest: str) -> str | None:
    """The opening words of a subject of work that may be a fix ("Update", "Replace"), when nothing else in it
    announces a feature or other work."""
    found = MAYBE_WORK_SUBJECT.match(rest)
    if (
        found is None
        or FEATURE_PHRASE.search(rest)
        or OTHER_WORK_PHRASE.search(rest)
        or TOOLING_FIX.search(rest)
    ):
        return None
    return found.group(0).strip()


def _is_module(prefix: str) -> bool:
    """Whether a subject's `prefix:` names a part of the code, not a commit type or what the commit does."""
    if prefix.lower() in NOT_A_FIX_TYPES:
        return False
    return " " not in prefix or not (
        FIX_PATTERN.search(prefix)
        or FEATURE_SUBJECT.match(prefix)
        or OTHER_WORK_SUBJECT.match(prefix)
        or MAYBE_WORK_SUBJECT.match(prefix)
    )


def _subject_parts(first: str) -> tuple[str, bool, bool]:
    """(what the subject says past its prefixes, whether it opened with a conventional `fix:` type, whether it
    opened with an issue reference). Prefixes set aside: a conventional `fix:`, a `module:` and a leading issue
    reference ("Issue 1214:", "Fix #131:"), in any order."""
    rest, conventional_fix, issue = first, False, False
    while True:
        if (conventional := CONVENTIONAL_SUBJECT.match(rest)) and conventional["type"].lower() in FIX_TYPES:
            rest, conventional_fix = conventional["rest"], True
        elif (prefix := ISSUE_PREFIX.match(rest)) and prefix.end() > 0:
            rest, issue = rest[prefix.end() :], True
        elif (module := MODULE_PREFIX.match(rest)) and _is_module(module["module"]):
            rest = rest[module.end() :]
        else:
            return rest, conventional_fix, issue


def read_commit(message: str, subject: str | None = None, shape: ChangeShape | None = None) -> Reading:
    """Whether a commit is a bug fix to learn from, by its message and, when known, its change (read_change).

    A gitmoji opening the subject ("🐛 fix(api): ...") is set aside first, and a subject that says nothing of the
    change (GitHub's "Merge commit from fork" for a security advisory's fix) is set aside whole: the commit is then
    read by its body, changelog entry and change. In order, the first rule that decides (Rule):
    1. a subject starting with revert, a merge of branches or changes ("Merge branch ...", "Merge changes
       from ...", not the verb: "Merge AoT fragments ..."), release or bump is no fix, unless a release or bump
       also fixes something ("Bump version to 1.5.6 and fix setitem ..."): then the subject is read from that
       fix on;
    2. a conventional-commit subject of a type other than fix (feat, refactor, chore, docs, test, perf, style,
       build, ci; or a changelog's kind of change other than a fix: new, add, improve, deprecate, breaking, ...)
       is no fix unless the subject itself says fix (fix, bug, hotfix, regression, crash) about
       something other than tooling and not as an issue reference ("feat: add X (fixes #510)") and its change
       changes code (rule 3: "chore: fix a lot of typos" changing comments only is no fix);
    then the subject's prefixes are set aside (a conventional `fix:`, a `module:`, a leading issue reference such
    as "Fix #131:" or "Issue 1214:"): what is left says what the commit does;
    3. a change whose Python code does not change once docstrings, comments, formatting, type annotations and
       statements for type checkers only (typing imports, TypeVars, `if TYPE_CHECKING:`) are set aside (and
       that changes no file shipped with the code) is no fix; then a subject naming tooling or
       housekeeping (typing, lint, mypy, static analysis, chores, ...) is no fix, whatever its fix words or
       changelog entry say;
    4. changelog entries of one kind (by their first word or the section they are added under) decide: a bug
       fix is a fix, a feature or a removal is not;
    5. a subject announcing something new (Add, Implement, Support, Allow, ...) while the change adds new public
       names is a feature;
    6. a strong fix word (fix, bug, regression, crash, broken, wrong, incorrect, typo, mistake, or a conventional
       `fix:`) in the subject, not about tooling ("fix typos", "fix lint"), makes a fix ("fixed" as an adjective,
       "a fixed schema", "fixed-point", is no fix word anywhere); one only naming an issue ("Fixes #24") names
       it as fixed, as "closes #12" in rule 10: with the change read, it needs a fix's shape (`fix_shape`);
    7. a change that adds new public names and whose new or changed tests test only those is a feature;
    8. a subject with a leading issue reference whose change reads like a fix (existing functions changed, no new
       public names, tests asserting on existing names: `fix_shape`, any size) is a fix, unless the subject
       announces a feature or other work (OTHER_WORK_SUBJECT);
    9. a subject announcing a feature or other work (Refactor, Clean up, Update, Remove, Replace, docs, typing,
       "can also accept", ...) is no fix, whatever fix word its body has: that names the issue that asked for the
       work ("Fixes #312"), the bug a removed workaround was for, or a step of a squashed pull request ("* Fix
       mypy errors"); over eight held-out sets such commits kept by `bugsweep mine` were 6 fixes, 4 not-fixes
       and 3 borderline (issue 37, round 17);
    10. otherwise a fix word in the subject (also error, exception, fail, handle, prevent, avoid, correct,
        don't, ...), a strong one in the body (a weak word there explains whatever the commit did: "Use logging
        instead of warnings ... users don't know what to do with that"), a real exception's name (not one the
        subject says the code now raises: "Make viewkeys raise AttributeError"), or an issue named as fixed in
        the subject ("closes #12"; read, shaped like a fix) make a fix; with the change read, a weak word in the
        subject (but "correct(ly)", which says the code was not) needs a strong word in the body ("Handle kwargs
        ..." names a feature too, new test or not: issue 37's eighth session); an exception's name needs that or
        a change that reads like a fix (`fix_shape`: 1 to MAX_FIX_FUNCTIONS functions, up to MAX_FIX_LINES lines)
        adding a test of existing code (a changed expectation is no new test: deliberate changes make those too);
    11. anything else is no fix: a change that reads like a fix but says nothing of one is not taken (until issue
        37's round 17 it was, when small: over eight held-out sets those `bugsweep mine` kept were 32 fixes, 9
        not-fixes and 10 borderline).
    Without a readable shape (no repository given, or a change with files the screen cannot read) rules 3, 5, 7
    and 8 do not apply, only builtin exception names count, a leading issue reference counts as an issue
    named as fixed, and the reason says so.
    """
    first = subject if subject is not None else (message.strip().splitlines()[0] if message.strip() else "")
    if ADVISORY_MERGE.match(first):
        message, first = message.replace(first, "", 1), ""
    first = GITMOJI.sub("", first, count=1)
    known = shape if shape is not None and shape.readable else None
    words_only = (
        f" (words only: the change has files the screen cannot read: {listed(shape.unreadable)})"
        if shape is not None and not shape.readable
        else ""
    )

    def decide(fix: bool, reason: str, rule: Rule) -> Reading:
        return Reading(fix, reason + words_only, rule)

    said_first = first
    if release := NOT_A_FIX_PATTERN.search(first):
        clause = AND_FIX_CLAUSE.search(first)
        if (
            release.group(0).split()[0].lower() in {"revert", "merge"}
            or not clause
            or _about_tooling(first, clause.end())
        ):
            return decide(
                False, f"the subject starts with {first.split()[0].lower()!r}", Rule.NOT_A_FIX_SUBJECT
            )
        said_first = first[clause.end() :]  # a release or bump that also fixes something: what it fixes
    no_code = None
    if known is not None and not known.code_changed:
        what = "type annotations, docstrings" if known.only_annotations else "docstrings"
        no_code = decide(False, f"it changes no code (only {what}, comments or formatting)", Rule.NO_CODE)
    conventional = CONVENTIONAL_SUBJECT.match(first)
    if conventional and conventional["type"].lower() in NOT_A_FIX_TYPES:
        kind, said_rest = conventional["type"].lower(), conventional["rest"]
        # "feat: add X flag (fixes #510)": the issue that asked for the feature, no bug
        said = next(
            (
                found
                for found in SAYS_FIX.finditer(said_rest)
                if not _about_tooling(said_rest, found.start())
                and not ISSUE_REFERENCE.match(said_rest, found.end())
            ),
            None,
        )
        if said and kind in TOOLING_TYPES:
            return decide(False, f"a {kind!r} commit: what it fixes is tooling", Rule.CONVENTIONAL)
        if said:  # "chore: fix a lot of typos" with only comments changed: rule 3 decides
            return no_code or decide(
                True, f"a {kind!r} commit whose subject says {said.group(0)!r}", Rule.CONVENTIONAL
            )
        if reference := ISSUE_PATTERN.search(said_rest):
            return decide(False, f"a {kind!r} commit whose subject says fix only of an issue ({reference.group(0)!r})",
                          Rule.CONVENTIONAL)  # fmt: skip
        return decide(False, f"a {kind!r} commit whose subject does not say fix", Rule.CONVENTIONAL)
    rest, conventional_fix, issue = _subject_parts(said_first)
    raised = frozenset(found["name"] for found in RAISES_EXCEPTION.finditer(rest))
    if no_code:
        return no_code
    if tooling := TOOLING_WORD.search(rest):
        return decide(False, f"the subject is about tooling ({tooling.group(0)!r}), not the code's behaviour",
                      Rule.OTHER_WORK)  # fmt: skip
    if shape is not None and (kind := shape.changelog_kind):
        files = listed(shape.changelog[kind], 2)
        return decide(
            kind == "fix", f"its changelog entry says {CHANGELOG_WORDS[kind]} ({files})", Rule.CHANGELOG
        )
    if known is not None and (defined := known.added_definitions) and (verb := FEATURE_SUBJECT.match(rest)):
        return decide(
            False,
            f"a feature: the subject says {verb.group(0).strip()!r} and the change adds new public names "
            f"({listed(defined)})",
            Rule.FEATURE,
        )
    if conventional_fix:
        return decide(True, "a 'fix' commit", Rule.SUBJECT_FIX_WORD)
    if strong := _fix_word(rest, known, weak=False):
        if not _fix_word(rest, known, weak=False, references=False):
            # "add value kwarg to filter ..., fixes #40", "add unichr (fixes #25)": the issue that asked for the
            # feature, which the subject's opening verb announces or the change and its tests are shaped as
            if verb := FEATURE_SUBJECT.match(rest):
                return decide(False, f"a feature: the subject says {verb.group(0).strip()!r}, and its {strong!r} "
                              "names the issue that asked for it", Rule.FEATURE_ASKED)  # fmt: skip
            if known is not None and (feature := feature_shape(known)):
                return decide(False, f"a feature: {feature}; the subject's {strong!r} names the issue that asked "
                              "for it", Rule.FEATURE_SHAPE)  # fmt: skip
            if known is not None:  # an issue named as fixed, as "closes #N" in rule 10
                why, why_not = fix_shape(known)
                if why is None:
                    return decide(False, f"the subject's {strong!r} only names an issue, and {why_not}",
                                  Rule.ISSUE_FIXED)  # fmt: skip
                return decide(True, f"the subject names an issue as fixed and {why}", Rule.ISSUE_FIXED)
        return decide(True, f"the subject says {strong!r}", Rule.SUBJECT_FIX_WORD)
    if known is not None and (feature := feature_shape(known)):
        return decide(False, f"a feature or refactor: {feature}", Rule.FEATURE_SHAPE)
    announced = _announced(rest)
    if known is not None and issue and (not announced or announced == _maybe_work(rest)):
        why, _ = fix_shape(known)
        if why:
            return decide(True, f"the subject opens with an issue reference and the change reads like a fix: {why}",
                          Rule.ISSUE_FIX_SHAPE)  # fmt: skip
    body, says = message.replace(first, "", 1), "the subject says"
    if not announced and (speed := SPEED_PHRASE.search(body)):
        announced, says = speed.group(0), "the message speaks of speed:"
    if announced:
        # the subject says what the commit is; a fix word in the body names the issue that asked for the work
        # ("Fixes #31"), the bug a removed workaround was for, or one step of a squashed pull request
        if strong := _fix_word(body, known, weak=False):
            return decide(False, f"{says} {announced!r}; the message's {strong!r} does not make it a fix",
                          Rule.OTHER_WORK)  # fmt: skip
        return decide(False, f"no fix word in the message, and {says} {announced!r}", Rule.OTHER_WORK)
    # a weak word (error, handle, don't, ...) is evidence in the subject; in the body it explains whatever was
    # done ("Use logging instead of warnings: users don't know what to do with that"), so there only a strong
    # word or a real exception's name counts
    in_subject = _fix_word(rest, known, raised=raised)
    word = in_subject or _fix_word(body, known, weak=False, exceptions=True)
    named = ""
    exception = bool(word and EXCEPTION_WORD.fullmatch(word))
    if word and known is not None and (exception or (word == in_subject and not CORRECTED.search(rest))):
        # a weak word in the subject (handle, error, avoid, ...) or an exception's name says what a feature is
        # about too: a strong word in the body backs either, a fix-shaped change with a new test the exception
        if strong := _fix_word(body, known, weak=False, exceptions=False):
            word = strong
        elif not exception:
            word, named = None, f" but only a weak word ({word!r}) and no strong word in the body"
        else:
            why, why_not = fix_shape(known, new_test=True)
            if why is not None:
                return decide(True, f"the message says {word!r} and {why}", Rule.EXCEPTION)
            word, named = None, f" but an exception's name ({word!r}), and {why_not}"
    if word:
        return decide(True, f"the message says {word!r}", _word_rule(word))
    if issue_named := ISSUE_PATTERN.search(rest if known is not None else first):
        # "closes #561" closes feature requests too ("--stop-after option, closes #561"): read, shaped like a fix
        why, why_not = fix_shape(known) if known is not None else ("", "")
        if why is not None:
            return decide(
                True, f"the subject names an issue as fixed{' and ' + why if why else ''}", Rule.ISSUE_FIXED
            )
        named = f" but only an issue named ({issue_named.group(0)!r}), and {why_not}"
    if known is not None:
        return decide(
            False,
            f"no fix word in the subject nor a strong one in the message (fix, bug, crash, ...){named}",
            Rule.NO_FIX_WORD,
        )
    if ISSUE_PATTERN.search(message) or re.search(r"(^|\s)\(?#\d+\b", message):
        return decide(
            False, "only an issue reference, no fix keyword (fix, bug, error, crash, ...)", Rule.NO_FIX_WORD
        )
    return decide(False, "no fix keyword in the message (fix, bug, error, crash, ...)", Rule.NO_FIX_WORD)


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
    commit: Commit,
    test_globs: Sequence[str] = MINING_TEST_GLOBS,
    repo: Path | None = None,
    *,
    unreleased_fixes: bool = False,
) -> Screened | Rejection:
    """The cheap checks, in order: a runnable test changed, a source file changed, the commit reads like a fix.

    With `repo` (the git directory holding the commit), the whole change is read too (read_change: its Python
    code and stubs, its tests, its changelog entries) and judged with the words (read_commit); a fix mending work
    since the last release (mostly lines no release had, its author's or others') is then no fix, unless
    `unreleased_fixes` (releases.own_work).
    Without `repo`, the words alone decide. A subject naming a Python not yet released at the commit's date is
    support for a new Python, which issue 37's labels call no fix, whatever the words ("Fix compatibility with
    Python 3.14 beta 1")."""
    tests = [path for _, path in commit.changes if is_test_file(path, test_globs)]
    runnable = [
        path for status, path in commit.changes if status != "D" and path in tests and is_runnable_test(path)
    ]
    sources = [path for _, path in commit.changes if is_source_file(path, test_globs)]

    def reject(reason: RejectReason, detail: str, rule: str = "") -> Rejection:
        return Rejection(commit=commit.sha, subject=commit.subject, reason=reason, detail=detail, rule=rule)

    if not commit.parents:
        return reject(RejectReason.NO_PARENT, "the root commit has nothing to start from")
    if not runnable:
        detail = "changes no test module" if not tests else f"changes only {', '.join(tests[:3])}"
        return reject(RejectReason.NO_TEST_CHANGE, detail)
    if not sources:
        return reject(RejectReason.NO_SOURCE_CHANGE, f"changes tests only ({', '.join(runnable[:3])})")
    others = [path for _, path in commit.changes if path not in tests and path not in sources]
    shape = read_change(repo, commit, sources, tests, others) if repo is not None else None
    reading = read_commit(commit.text_to_match, commit.subject, shape)
    if not reading.fix:
        return reject(RejectReason.NOT_A_FIX, reading.reason, reading.rule.value)
    if (minor := python_to_come(commit.subject, commit.date)) is not None:
        detail = f"its subject names Python 3.{minor}, not released until {released_on(minor)}: work for a Python to come"
        return reject(RejectReason.NOT_A_FIX, detail, Rule.PYTHON_TO_COME.value)
    own = own_work(repo, commit, sources) if not unreleased_fixes and repo is not None else None
    if own is not None and own.unreleased:
        return reject(RejectReason.NOT_A_FIX, own.describe(), Rule.OWN_UNRELEASED.value)
    if own is not None and own.others_unreleased:
        return reject(RejectReason.NOT_A_FIX, own.describe(), Rule.OTHERS_UNRELEASED.value)
    return Screened(
        commit=commit,
        test_files=tests,
        runnable_tests=runnable,
        source_files=sources,
        why_fix=reading.reason,
        rule=reading.rule.value,
    )
