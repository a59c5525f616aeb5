"""Mining bug-fix tasks from a repository's own git history.

The method: a commit that fixed a bug and changed a test already holds a task. Check out its parent, copy in only
the commit's test files (the test_patch), and the changed tests fail for the reason the bug had; at the commit
itself they pass. The commit message's first line is the task text.

Steps, newest commit first:
1. `scan_history` lists candidate commits (no merges) with their changed files.
2. `screen` rejects, without running anything, commits that change no runnable test file, no source file, or whose
   message does not look like a fix (see FIX_PATTERN).
3. `build_task` makes the TaskSpec: base_commit = parent, test_patch = the commit's diff of its test files, setup
   and test commands detected from the layout (`detect_commands`) unless given.
4. `validate` runs the tests `runs` times in a sandbox at the task state (parent + test_patch, exactly as a sweep
   prepares it) and `runs` times at the fix commit. A test whose outcome differs between runs is flaky: it is
   reported and deselected from the task's test command. FAIL_TO_PASS are the tests that failed in every run before
   and passed in every run after; PASS_TO_PASS passed everywhere. A task needs at least one FAIL_TO_PASS test and
   no test that keeps failing at the fix (the grader requires the test command to pass after the fix).

Every rejected candidate gets a reason (RejectReason) and a detail line, so a user can see why their history
yielded what it did.
"""

from __future__ import annotations

import configparser
import hashlib
import re
import shlex
import subprocess
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, Field

from bugsweep.errors import BugsweepError, ConfigError, SetupFailed
from bugsweep.grading import TestRun, run_tests, why_cannot_run
from bugsweep.sandbox.base import Sandbox, SandboxProvider
from bugsweep.sandbox.sources import is_git_url
from bugsweep.settings import DEFAULT_TEST_GLOBS
from bugsweep.spec import TaskSpec, dump_tasks
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
#: The first line of a pull request's (or branch's) merge commit; the PR title follows on the next line.
MERGE_LINE = re.compile(
    r"^\s*Merge (pull request #\d+|branch '[^']*'|remote-tracking branch '[^']*')( of \S+)?( into \S+)?"
)
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
#: Files that, when present, hold the test dependencies (first match wins).
TEST_REQUIREMENTS = [
    "requirements/tests.txt", "requirements/test.txt", "requirements/testing.txt", "requirements-test.txt",
    "requirements-tests.txt", "requirements_test.txt", "test-requirements.txt", "tests/requirements.txt",
    "requirements/dev.txt", "requirements-dev.txt", "dev-requirements.txt",
]  # fmt: skip


class RejectReason(StrEnum):
    """Why a candidate commit did not become a task."""

    NO_TEST_CHANGE = "no test change"
    NO_SOURCE_CHANGE = "no source change"
    NOT_A_FIX = "not a fix"
    NO_PARENT = "no parent commit"
    NO_TEST_COMMAND = "no test command"
    PATCH_DOES_NOT_APPLY = "test patch does not apply"
    SETUP_FAILED = "setup failed"
    TESTS_PASS_AT_PARENT = "tests pass at parent"
    TESTS_FAIL_AT_FIX = "tests fail at fix"
    FLAKY = "flaky"
    TIMED_OUT = "tests timed out"
    NO_TEST_RESULTS = "no test results"
    TESTS_CANNOT_RUN = "tests cannot run"
    SANDBOX_ERROR = "sandbox error"


@dataclass
class Commit:
    """A commit of the history being mined, with the files it changed (status letter, path)."""

    sha: str
    parents: list[str]
    date: str
    message: str
    changes: list[tuple[str, str]]

    @property
    def subject(self) -> str:
        """The task text: the first line, or for a pull request's merge commit the PR title (the next line)."""
        lines = [line.strip() for line in self.message.strip().splitlines() if line.strip()]
        if not lines:
            return ""
        if MERGE_LINE.match(lines[0]) and len(lines) > 1:
            return lines[1]
        return lines[0]

    @property
    def text_to_match(self) -> str:
        """What the fix keywords are matched on: a merge's "Merge pull request #N" says nothing, its branch may."""
        return MERGE_LINE.sub(" ", self.message, count=1)


@dataclass
class Screened:
    """A commit that passed the cheap checks, split into its test and source files."""

    commit: Commit
    test_files: list[str]
    """Every test file the commit changed (added, modified or deleted); all of them go into the test_patch."""
    runnable_tests: list[str]
    """Changed test modules that still exist after the commit (test_*.py / *_test.py): what the tests run."""
    source_files: list[str]


class Rejection(BaseModel):
    commit: str
    subject: str
    reason: RejectReason
    detail: str = ""


class Unfinished(BaseModel):
    """A candidate whose validation a stopped run cut short."""

    commit: str
    subject: str


class MiningResult(BaseModel):
    """What a mining run found: the tasks, every rejected candidate with its reason, and how long it took."""

    repo: str
    tasks: list[TaskSpec] = Field(default_factory=list)
    rejected: list[Rejection] = Field(default_factory=list)
    flaky_tests: dict[str, list[str]] = Field(default_factory=dict)
    """Flaky tests seen, by commit sha (dropped from kept tasks; the reason for rejecting others)."""
    scanned: int = 0
    """Commits looked at."""
    validated: int = 0
    """Candidates that were run in a sandbox (kept or not)."""
    total: int = 0
    """Commits in the range (branch, --since/--until, --max-candidates)."""
    unfinished: list[Unfinished] = Field(default_factory=list)
    """Candidates whose validation was cut short by a stop: neither kept nor rejected."""
    stopped: str | None = None
    """Why the run stopped before its end (Ctrl-C, a test command that is not found), or None."""
    elapsed_s: float = 0.0

    @property
    def done(self) -> int:
        """Commits decided: kept or rejected."""
        return len(self.tasks) + len(self.rejected)

    def write_report(self, path: Path) -> None:
        """Everything but the tasks (those are in the task file), as JSON, written atomically."""
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(self.model_dump_json(indent=2, exclude={"tasks"}), encoding="utf-8")
        tmp.replace(path)

    def reasons(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rejected:
            counts[r.reason.value] = counts.get(r.reason.value, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


@dataclass
class MiningEvent:
    """Progress, for the command line: kind is 'scan', 'validate', 'run', 'kept' or 'rejected'."""

    kind: str
    commit: str
    subject: str
    message: str = ""
    scanned: int = 0
    kept: int = 0
    done: int = 0
    """Commits decided so far (rejected or kept)."""
    total: int = 0
    """Commits in the range being mined (the most that can be looked at)."""


ProgressCallback = Callable[[MiningEvent], None]


# -- git ---------------------------------------------------------------------------------------------------------


def _git(repo: Path, *args: str, timeout: float = 120) -> str:
    proc = subprocess.run(
        ["git", "-c", "core.quotepath=off", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        errors="replace",
    )
    if proc.returncode != 0:
        raise ConfigError(f"git {' '.join(args[:3])} failed in {repo}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def local_clone(repo: str, cache_dir: Path | None = None) -> Path:
    """A local git directory for `repo`: the path itself, or a bare clone of a URL kept in a cache folder."""
    if not is_git_url(repo):
        path = Path(repo).expanduser().resolve()
        if not path.exists():
            raise ConfigError(f"{repo!r} is neither a folder nor a git URL")
        _git(path, "rev-parse", "--git-dir")
        return path
    cache = cache_dir or Path.home() / ".cache" / "bugsweep" / "mirrors"
    cache.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9]+", "-", repo.rstrip("/").rsplit("/", 1)[-1]).strip("-")
    target = cache / f"{stem}-{hashlib.sha256(repo.encode()).hexdigest()[:8]}.git"
    if target.exists():
        _git(target, "fetch", "-q", "--prune", "origin", "+refs/heads/*:refs/heads/*", timeout=1800)
    else:
        proc = subprocess.run(
            ["git", "clone", "-q", "--bare", repo, str(target)], capture_output=True, text=True, timeout=1800
        )
        if proc.returncode != 0:
            raise ConfigError(f"could not clone {repo}: {proc.stderr.strip()[-500:]}")
    return target


def parse_date(value: str, option: str = "--since") -> str:
    """Check a --since/--until value and return it in a form git reads the same way.

    git reads anything as a date (an unknown word means "now", so a typo silently scans nothing); here only an
    ISO 8601 date or time (`2024-01-31`, `2024-01-31T12:00:00+02:00`) or an age (`6 months ago`, `2 weeks ago`,
    `yesterday`) is taken. Anything else raises ConfigError naming the value.
    """
    text = value.strip()
    if RELATIVE_DATE.fullmatch(text):
        return text
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"{option} {value!r} is not a date: give an ISO date (2024-01-31, 2024-01-31T12:00) "
            "or an age (6 months ago, 2 weeks ago)"
        ) from None
    return when.isoformat()


#: Ages git understands and means: "3 days ago", "1 year ago", "yesterday".
RELATIVE_DATE = re.compile(
    r"(\d+\s+(second|minute|hour|day|week|month|year)s?\s+ago|yesterday|today|now)", re.IGNORECASE
)


def list_history(
    repo: Path,
    *,
    branch: str | None = None,
    since: str | None = None,
    until: str | None = None,
    max_commits: int | None = None,
    merges: bool = False,
) -> list[str]:
    """The shas `scan_history` walks, newest first (so a run knows how many candidates it has)."""
    args = ["rev-list", "--first-parent", "--merges"] if merges else ["rev-list", "--no-merges"]
    if since:
        args.append(f"--since={parse_date(since, '--since')}")
    if until:
        args.append(f"--until={parse_date(until, '--until')}")
    if max_commits:
        args.append(f"--max-count={max_commits}")
    args.append(branch or "HEAD")
    return _git(repo, *args).split()


def scan_history(
    repo: Path,
    *,
    branch: str | None = None,
    since: str | None = None,
    until: str | None = None,
    max_commits: int | None = None,
    merges: bool = False,
    shas: Sequence[str] | None = None,
) -> Iterator[Commit]:
    """Commits reachable from `branch` (default HEAD), newest first, with their changed files.

    By default every commit that is not a merge. With `merges=True`, the merge commits of the branch's own line
    (`--first-parent`), each with its whole change against the first parent: a merged pull request as one
    candidate, for projects whose pull requests put the fix and its test in separate commits. `shas`, when given,
    is the list `list_history` made.
    """
    if shas is None:
        shas = list_history(
            repo, branch=branch, since=since, until=until, max_commits=max_commits, merges=merges
        )
    for sha in shas:
        meta = _git(repo, "show", "-s", "--format=%P%n%cI%n%B", sha)
        parents_line, date, message = [*meta.split("\n", 2), "", ""][:3]
        parents = parents_line.split()
        if len(parents) > 1:
            status = _git(repo, "diff", "-z", "--name-status", "--no-renames", parents[0], sha)
        else:
            status = _git(
                repo, "diff-tree", "--no-commit-id", "-r", "-z", "--name-status", "--no-renames", sha
            )
        fields = status.split("\0")
        changes = [(fields[i], fields[i + 1]) for i in range(0, len(fields) - 1, 2) if fields[i]]
        yield Commit(sha=sha, parents=parents, date=date.strip(), message=message, changes=changes)


# -- screening -------------------------------------------------------------------------------------------------


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


# -- building a task ---------------------------------------------------------------------------------------------


@dataclass
class Commands:
    setup: str | None
    test: str | None
    why: list[str] = field(default_factory=list)


def _show(repo: Path, commit: str, path: str) -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, text=True, errors="replace"
    )
    return proc.stdout if proc.returncode == 0 else None


#: Names of the extra / dependency group / tox section that holds test dependencies.
TEST_GROUP_NAMES = ("tests", "test", "testing")
_PLAIN_REQUIREMENT = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?\s*([<>=!~]=?\s*[\w.*+!-]+\s*,?\s*)*$"
)


def _pyproject_test_deps(text: str) -> tuple[str | None, list[str]]:
    """(the test extra's name, the test dependency group's requirements) from pyproject.toml."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None, []
    extras = data.get("project", {}).get("optional-dependencies", {}) or {}
    extra = next((g for g in TEST_GROUP_NAMES if g in extras), None)
    groups = data.get("dependency-groups", {}) or {}
    group: list[object] = next((groups[g] for g in TEST_GROUP_NAMES if g in groups), [])
    return extra, [r for r in group if isinstance(r, str)]  # {include-group = ...} tables are left out


def _setup_cfg_extra(text: str) -> str | None:
    cfg = configparser.ConfigParser(interpolation=None)
    try:
        cfg.read_string(text)
    except configparser.Error:
        return None
    if not cfg.has_section("options.extras_require"):
        return None
    return next((g for g in TEST_GROUP_NAMES if cfg.has_option("options.extras_require", g)), None)


def _tox_extra(text: str) -> str | None:
    """The test extra tox installs ([testenv] extras = tests), if it is one of TEST_GROUP_NAMES."""
    cfg = configparser.ConfigParser(interpolation=None)
    try:
        cfg.read_string(text)
    except configparser.Error:
        return None
    if not cfg.has_option("testenv", "extras"):
        return None
    listed = re.split(r"[\s,]+", cfg.get("testenv", "extras"))
    return next((g for g in TEST_GROUP_NAMES if g in listed), None)


#: A test extra declared as a literal in setup.py: `"tests": [` inside extras_require or a dict built for it.
_SETUP_PY_EXTRA = re.compile(r"""["'](tests|test|testing)["']\s*:\s*\[""")


def _tox_deps(text: str) -> list[str]:
    """The plain requirements of tox.ini's [testenv] deps (factor-conditional and templated lines left out)."""
    cfg = configparser.ConfigParser(interpolation=None)
    try:
        cfg.read_string(text)
    except configparser.Error:
        return []
    if not cfg.has_option("testenv", "deps"):
        return []
    lines = [line.strip() for line in cfg.get("testenv", "deps").splitlines()]
    return [line for line in lines if line and "{" not in line and _PLAIN_REQUIREMENT.match(line)]


def detect_commands(repo: Path, commit: str, test_files: Sequence[str]) -> Commands:
    """Setup and test commands for common Python layouts, read from the tree at `commit`.

    - pyproject.toml with [project] or [build-system], or setup.py: `pip install -e .`, with the
      `tests`/`test`/`testing` extra when pyproject.toml, setup.cfg, tox.ini's [testenv] extras or a literal
      in setup.py's extras_require names one;
    - then the test dependencies where the project keeps them: a requirements file (TEST_REQUIREMENTS), a
      `tests`/`test`/`testing` dependency group in pyproject.toml, or tox.ini's [testenv] deps;
    - tests run with `python -m pytest -q <changed test modules>` (pytest also runs unittest-style tests, and
      gives per-test results the grader reads), so the setup ends with `pip install pytest`.
    """
    names = set(_git(repo, "ls-tree", "-r", "--name-only", commit).split("\n"))
    why: list[str] = []
    steps: list[str] = []
    pyproject = _show(repo, commit, "pyproject.toml") if "pyproject.toml" in names else None
    extra, group = _pyproject_test_deps(pyproject) if pyproject else (None, [])
    if extra is None and "setup.cfg" in names:
        extra = _setup_cfg_extra(_show(repo, commit, "setup.cfg") or "")
    if extra is None and "tox.ini" in names:
        extra = _tox_extra(_show(repo, commit, "tox.ini") or "")
    if extra is None and "setup.py" in names:
        setup_py = _show(repo, commit, "setup.py") or ""
        found = _SETUP_PY_EXTRA.search(setup_py) if "extras_require" in setup_py else None
        extra = found[1] if found else None
    installable = "setup.py" in names or bool(
        pyproject and re.search(r"^\[(project|build-system)\]", pyproject, re.M)
    )
    if installable:
        steps.append(f"pip install -e '.[{extra}]'" if extra else "pip install -e .")
        why.append(
            "setup.py/pyproject.toml: pip install -e ." + (f" with the [{extra}] extra" if extra else "")
        )
    reqs = next((r for r in TEST_REQUIREMENTS if r in names), None)
    if reqs:
        steps.append(f"pip install -r {reqs}")
        why.append(f"test requirements in {reqs}")
    elif group:
        steps.append("pip install " + " ".join(shlex.quote(r) for r in group))
        why.append("the test dependency group in pyproject.toml")
    elif "tox.ini" in names and (deps := _tox_deps(_show(repo, commit, "tox.ini") or "")):
        steps.append("pip install " + " ".join(shlex.quote(r) for r in deps))
        why.append("tox.ini [testenv] deps")
    test = "python -m pytest -q " + " ".join(shlex.quote(t) for t in test_files) if test_files else None
    if test:
        if not re.search(r"(^|\s|')pytest([\s<>=!~']|$)", " ".join(steps)):
            steps.append(
                "pip install pytest"
            )  # the task's own environment has no test runner until its setup
        why.append("pytest on the changed test modules")
    return Commands(setup=" && ".join(steps) or None, test=test, why=why)


def test_patch(repo: Path, commit: Commit, test_files: Sequence[str]) -> str:
    """The commit's changes to its test files, as a diff that applies to its parent."""
    return _git(repo, "diff", "--binary", "--no-renames", commit.parents[0], commit.sha, "--", *test_files)


#: Folder names that say nothing about the project (a mirror's `repo/`, a `src/` checkout).
GENERIC_DIR_NAMES = {"repo", "repository", "src", "source", "checkout", "git", "work"}


def default_prefix(repo_name: str) -> str:
    """The project's name for instance ids: the last meaningful part of the path or URL, without `.git`."""
    parts = [p.removesuffix(".git") for p in re.split(r"[/:]", repo_name.rstrip("/")) if p]
    while len(parts) > 1 and parts[-1].lower() in GENERIC_DIR_NAMES | {""}:
        parts.pop()
    return re.sub(r"[^A-Za-z0-9]+", "-", parts[-1] if parts else "").strip("-") or "repo"


def build_task(
    repo: Path,
    screened: Screened,
    *,
    repo_name: str,
    test_command: str | None = None,
    setup_command: str | None = None,
    task_prefix: str | None = None,
) -> TaskSpec:
    """The task for a screened commit: parent + test_patch, task text = the message's first line."""
    c = screened.commit
    detected = detect_commands(repo, c.sha, screened.runnable_tests)
    files = " ".join(shlex.quote(t) for t in screened.runnable_tests)
    test = test_command.replace("{test_files}", files) if test_command else detected.test
    setup = detected.setup if setup_command is None else (setup_command or None)
    return TaskSpec(
        instance_id=f"{task_prefix or default_prefix(repo_name)}-{c.sha[:10]}",
        repo=repo_name,
        base_commit=c.parents[0],
        problem_statement=c.subject,
        test_command=test or "",
        setup_command=setup,
        test_patch=test_patch(repo, c, screened.test_files),
        test_files=sorted(screened.test_files),
        fix_commit=c.sha,
        created_at=c.date,
    )


# -- validation ------------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    """What the test runs say about a candidate."""

    reason: RejectReason | None
    detail: str = ""
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)


def _status(run: TestRun, test_id: str) -> str:
    outcome = (run.tests or {}).get(test_id, "missing")
    return "pass" if outcome == "passed" else "skip" if outcome == "skipped" else "fail"


def _stable(runs: Sequence[TestRun], ids: set[str]) -> tuple[dict[str, str], set[str]]:
    """The status of each test that came out the same in every run, and the tests that did not."""
    stable: dict[str, str] = {}
    flaky: set[str] = set()
    for t in ids:
        seen = {_status(r, t) for r in runs}
        if len(seen) == 1:
            stable[t] = seen.pop()
        else:
            flaky.add(t)
    return stable, flaky


def _all_ids(runs: Sequence[TestRun]) -> set[str]:
    return {t for r in runs for t in (r.tests or {})}


def judge(before: Sequence[TestRun], after: Sequence[TestRun]) -> Verdict:
    """Decide from the runs at the task state (`before`) and at the fix commit (`after`, may be empty if stopped early).

    Per test when JUnit results exist (pytest); by exit code otherwise.
    """
    if any(r.timed_out for r in (*before, *after)):
        return Verdict(RejectReason.TIMED_OUT, "a test run timed out")
    no_results = next((r for r in before if r.tests is None), None)
    if no_results is not None and after and all(r.tests is not None for r in after):
        # pytest ran to the end at the fix but not at the task state: the run there was killed (an endless loop
        # at the memory limit, a crash) before it wrote its results, so no test can be named FAIL_TO_PASS.
        code = no_results.exit_code
        how = (
            f"was killed (exit {code}: out of memory, or a signal)"
            if code is not None and (code < 0 or code >= 128)
            else f"exited {code}"
        )
        return Verdict(
            RejectReason.NO_TEST_RESULTS,
            f"the test run at the task state {how} before pytest wrote its results: no test to name FAIL_TO_PASS",
        )
    if all(r.tests is not None for r in (*before, *after)):
        return _judge_tests(before, after)
    return _judge_exit_codes(before, after)


def _judge_tests(before: Sequence[TestRun], after: Sequence[TestRun]) -> Verdict:
    ids = _all_ids(before) | _all_ids(after)
    st_before, flaky_before = _stable(before, ids)
    failing = {t for t, s in st_before.items() if s == "fail"}
    if not after:
        if flaky_before and not failing:
            return Verdict(
                RejectReason.FLAKY, _ids("flaky at the task state", flaky_before), flaky=sorted(flaky_before)
            )
        return Verdict(RejectReason.TESTS_PASS_AT_PARENT, "every changed test passed at the task state")
    # Only tests the fix commit's runs report: a collection error before the fix shows up as a pseudo-test that
    # no longer exists after it.
    st_after, flaky_after = _stable(after, _all_ids(after))
    flaky = flaky_before | flaky_after
    still_failing = {t for t, s in st_after.items() if s == "fail" and t not in flaky}
    fail_to_pass = sorted(t for t in failing if st_after.get(t) == "pass" and t not in flaky)
    pass_to_pass = sorted(
        t for t, s in st_before.items() if s == "pass" and st_after.get(t) == "pass" and t not in flaky
    )
    if still_failing:
        return Verdict(
            RejectReason.TESTS_FAIL_AT_FIX,
            _ids("failing at the fix commit", still_failing),
            flaky=sorted(flaky),
        )
    if not fail_to_pass:
        if flaky:
            return Verdict(RejectReason.FLAKY, _ids("flaky", flaky), flaky=sorted(flaky))
        return Verdict(
            RejectReason.TESTS_PASS_AT_PARENT, "no test failed at the task state and passed at the fix"
        )
    return Verdict(None, fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass, flaky=sorted(flaky))


def _judge_exit_codes(before: Sequence[TestRun], after: Sequence[TestRun]) -> Verdict:
    b = {r.passed for r in before}
    if b == {True}:
        return Verdict(RejectReason.TESTS_PASS_AT_PARENT, "the test command exited 0 at the task state")
    if len(b) > 1:
        return Verdict(
            RejectReason.FLAKY, "the test command passed in some runs at the task state and failed in others"
        )
    if not after:
        return Verdict(RejectReason.TESTS_PASS_AT_PARENT, "stopped before the fix commit")
    a = {r.passed for r in after}
    if len(a) > 1:
        return Verdict(
            RejectReason.FLAKY, "the test command passed in some runs at the fix commit and failed in others"
        )
    if a == {False}:
        return Verdict(RejectReason.TESTS_FAIL_AT_FIX, "the test command failed at the fix commit")
    return Verdict(None)


def _is_collection_error(test_id: str) -> bool:
    """pytest reports a module that does not import as one pseudo-test named after the module (`tests.py::tests`)."""
    path, _, name = test_id.partition("::")
    return bool(name) and name.replace(".", "/") == path.removesuffix(".py")


def _ids(what: str, ids: set[str], limit: int = 4) -> str:
    broken = sorted(t for t in ids if _is_collection_error(t))
    if broken:
        what += f" ({', '.join(t.partition('::')[0] for t in broken)} could not be imported or collected)"
    shown = sorted(ids)[:limit]
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return f"{what}: {', '.join(shown)}{more}"


def deselect(test_command: str, flaky: Sequence[str]) -> str:
    """The pytest command with flaky tests deselected, so grading never depends on them."""
    return test_command + "".join(f" --deselect {shlex.quote(t)}" for t in flaky)


class CommandNotFound(ConfigError):
    """The test or setup command exited 127 or 126: the shell did not find it or cannot run it. Every candidate
    would fail the same way, so mining stops at the first one instead of rejecting the history as "tests fail at
    fix"."""


class Stopper:
    """The sandboxes of the validations in flight, so that a stopped run (Ctrl-C, a missing command) releases them
    at once instead of waiting for their tests to finish. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sandboxes: dict[int, Sandbox] = {}
        self.stopped = False

    def track(self, sandbox: Sandbox) -> None:
        with self._lock:
            if not self.stopped:
                self._sandboxes[id(sandbox)] = sandbox
                return
        sandbox.release()
        raise MiningStopped("mining was stopped")

    def untrack(self, sandbox: Sandbox) -> None:
        with self._lock:
            self._sandboxes.pop(id(sandbox), None)

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            sandboxes, self._sandboxes = list(self._sandboxes.values()), {}
        for sandbox in sandboxes:
            sandbox.release()  # never raises; the command running in it returns with SandboxGone


class CannotRun(BugsweepError):
    """The tests of one candidate test nothing (no module, pytest usage error, no test collected)."""


class MiningStopped(BugsweepError):
    """A validation cut short because the run was stopped; its candidate is reported as unfinished, not judged."""


def _run_state(
    spec: TaskSpec,
    provider: SandboxProvider,
    runs: int,
    *,
    keep_going: Callable[[list[TestRun]], bool],
    timeout: float,
    setup_timeout: float,
    stopper: Stopper | None = None,
) -> list[TestRun]:
    """Prepare a sandbox exactly as a sweep would (pipeline.prepare + setup), then run the tests up to `runs` times."""
    from bugsweep.pipeline import prepare, setup

    prepared = prepare(spec, provider, labels={"purpose": "mining", "task": spec.instance_id})
    try:
        if stopper is not None:
            stopper.track(prepared.sandbox)
        try:
            setup(prepared, timeout=setup_timeout)
        except SetupFailed as exc:
            first = str(exc).splitlines()[0]
            if "exited with 127" in first or "exited with 126" in first:
                code = "127: not found" if "127" in first else "126: cannot be executed"
                raise CommandNotFound(
                    f"the setup command {spec.setup_command!r} cannot run in the sandbox (exit {code}): "
                    f"{_last_line(prepared.setup_log)}; give --setup-command"
                ) from None
            raise
        results: list[TestRun] = []
        for _ in range(runs):
            run = run_tests(prepared.sandbox, spec.test_command, timeout=timeout)
            why = why_cannot_run(run)
            if run.exit_code in (126, 127):
                raise CommandNotFound(
                    f"the test command {spec.test_command!r} cannot run in the sandbox: {why}: "
                    f"{_last_line(run.log)}; give --test-command (and --setup-command to install it)"
                )
            if why:
                raise CannotRun(f"{why}: {_last_line(run.log)}")
            results.append(run)
            if not keep_going(results):
                break
        if stopper is not None and stopper.stopped:
            raise MiningStopped("mining was stopped")
        return results
    finally:
        if stopper is not None:
            stopper.untrack(prepared.sandbox)
        prepared.sandbox.release()


def _last_line(log: str) -> str:
    lines = [line.strip() for line in log.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def validate(
    spec: TaskSpec,
    provider: SandboxProvider,
    *,
    runs: int = 3,
    timeout: float = 900.0,
    setup_timeout: float = 1800.0,
    stopper: Stopper | None = None,
) -> Verdict:
    """Run the tests `runs` times at the task state and, if some fail there, `runs` times at the fix commit.

    Raises CommandNotFound when the test or setup command exits 127, and MiningStopped when `stopper` was stopped
    meanwhile (the verdict would be about a killed sandbox, not about the commit).
    """
    if not spec.test_command:
        return Verdict(RejectReason.NO_TEST_COMMAND, "no test command detected; give --test-command")

    def still_failing(results: list[TestRun]) -> bool:
        # Stop early once nothing can become a FAIL_TO_PASS test (everything passed at least once).
        if results[-1].timed_out:
            return False
        if results[-1].tests is None:
            return not results[-1].passed
        stable, _ = _stable(results, _all_ids(results))
        return any(s == "fail" for s in stable.values())

    def state(spec: TaskSpec, keep_going: Callable[[list[TestRun]], bool]) -> list[TestRun]:
        return _run_state(
            spec,
            provider,
            runs,
            keep_going=keep_going,
            timeout=timeout,
            setup_timeout=setup_timeout,
            stopper=stopper,
        )

    try:
        before = state(spec, still_failing)
        verdict = judge(before, [])
        if not still_failing(before) or verdict.reason == RejectReason.TIMED_OUT:
            return verdict
        at_fix = spec.model_copy(update={"base_commit": spec.fix_commit, "test_patch": None})
        after = state(at_fix, lambda r: not r[-1].timed_out)
        return judge(before, after)
    except (CommandNotFound, MiningStopped):
        raise
    except CannotRun as exc:
        return Verdict(RejectReason.TESTS_CANNOT_RUN, str(exc))
    except BugsweepError as exc:
        if stopper is not None and stopper.stopped:
            raise MiningStopped("mining was stopped") from exc
        if isinstance(exc, SetupFailed):
            return Verdict(RejectReason.SETUP_FAILED, str(exc).strip().splitlines()[-1][:300])
        text = str(exc)
        if "does not apply" in text:
            return Verdict(RejectReason.PATCH_DOES_NOT_APPLY, text[:300])
        if exc.kind == "infra":
            return Verdict(RejectReason.SANDBOX_ERROR, text[:300])
        raise


# -- the whole thing -------------------------------------------------------------------------------------------


def mine(
    repo: str,
    *,
    provider: SandboxProvider,
    limit: int = 10,
    since: str | None = None,
    until: str | None = None,
    branch: str | None = None,
    test_command: str | None = None,
    setup_command: str | None = None,
    runs: int = 3,
    max_candidates: int | None = None,
    merges: bool = False,
    concurrency: int = 1,
    out: Path | None = None,
    report: Path | None = None,
    on_progress: ProgressCallback | None = None,
    test_timeout: float = 900.0,
    task_prefix: str | None = None,
) -> MiningResult:
    """Scan `repo`'s history newest first and keep up to `limit` validated tasks (`merges`: see scan_history).

    Up to `concurrency` candidates are validated at once (each in its own sandboxes), never more than could still
    be kept, so the history is scanned no further than with one at a time. Tasks stay in history order.
    `out`, when given, is rewritten (atomically) after every kept task, so an interrupted run keeps what it found.
    `report`, when given, gets the rejections and counts (MiningResult without the tasks) however the run ends.

    A run stops early on Ctrl-C (KeyboardInterrupt) or when the test or setup command is not found
    (CommandNotFound, exit 127): the candidates in flight are not judged (their sandboxes are released at once and
    they are listed as `unfinished`), the report is written, and the exception goes on to the caller.
    """
    started = time.monotonic()
    progress = on_progress or (lambda e: None)
    git_dir = local_clone(repo)
    repo_name = repo if is_git_url(repo) else str(Path(repo).expanduser().resolve())
    result = MiningResult(repo=repo_name)
    shas = list_history(
        git_dir, branch=branch, since=since, until=until, max_commits=max_candidates, merges=merges
    )
    result.total = len(shas)
    # Scan order of each commit, so that results coming back out of order are still kept newest first.
    position: dict[str, int] = {}

    def event(kind: str, commit: Commit, message: str = "") -> MiningEvent:
        return MiningEvent(
            kind,
            commit.sha,
            commit.subject,
            message,
            scanned=result.scanned,
            kept=len(result.tasks),
            done=result.done,
            total=result.total,
        )

    def next_candidate(history: Iterator[Commit]) -> tuple[Commit, TaskSpec, int] | None:
        """Scan and screen until a commit needs the sandbox; None when the history is used up."""
        for commit in history:
            result.scanned += 1
            position[commit.sha] = result.scanned
            progress(event("scan", commit))
            screened = screen(commit)
            if isinstance(screened, Rejection):
                result.rejected.append(screened)
                progress(_rejected_event(screened, result))
                continue
            spec = build_task(
                git_dir,
                screened,
                repo_name=repo_name,
                test_command=test_command,
                setup_command=setup_command,
                task_prefix=task_prefix,
            )
            return commit, spec, len(screened.runnable_tests)
        return None

    def record(commit: Commit, spec: TaskSpec, verdict: Verdict) -> None:
        if verdict.flaky:
            result.flaky_tests[commit.sha] = verdict.flaky
        if verdict.reason is not None:
            rejection = Rejection(
                commit=commit.sha, subject=commit.subject, reason=verdict.reason, detail=verdict.detail
            )
            result.rejected.append(rejection)
            progress(_rejected_event(rejection, result))
            return
        spec.FAIL_TO_PASS = verdict.fail_to_pass
        spec.PASS_TO_PASS = verdict.pass_to_pass
        if verdict.flaky:
            spec.test_command = deselect(spec.test_command, verdict.flaky)
        result.tasks.append(spec)
        result.tasks.sort(key=lambda t: position[t.fix_commit or ""])
        if out is not None:
            dump_tasks(result.tasks, out)
        note = f"{len(verdict.fail_to_pass)} fail->pass, {len(verdict.pass_to_pass)} pass->pass"
        if verdict.flaky:
            note += f", {len(verdict.flaky)} flaky test(s) deselected"
        progress(event("kept", commit, note))

    history = scan_history(git_dir, shas=shas, merges=merges)
    pending: dict[Future[Verdict], tuple[Commit, TaskSpec]] = {}
    exhausted = False
    stopper = Stopper()
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="mine")
    try:
        while True:
            while (
                not exhausted
                and len(pending) < max(1, concurrency)
                and len(result.tasks) + len(pending) < limit
            ):
                found = next_candidate(history)
                if found is None:
                    exhausted = True
                    break
                commit, spec, modules = found
                # Validate against the local clone (fast); the task file names the repository as the user gave it.
                in_sandbox = spec.model_copy(update={"repo": str(git_dir)})
                progress(event("validate", commit, f"{modules} test module(s), {runs} run(s) each"))
                result.validated += 1
                future = pool.submit(
                    validate, in_sandbox, provider, runs=runs, timeout=test_timeout, stopper=stopper
                )
                pending[future] = (commit, spec)
            if not pending:
                break
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: position[pending[f][0].sha]):
                commit, spec = pending[future]
                verdict = future.result()  # CommandNotFound stops the run here, this candidate unfinished
                del pending[future]
                record(commit, spec, verdict)
    except BaseException as exc:  # Ctrl-C or a command that is not there: judge nothing that was cut short
        stopper.stop()
        result.stopped = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else str(exc)
        for future, (commit, _) in sorted(pending.items(), key=lambda kv: position[kv[1][0].sha]):
            future.cancel()
            result.unfinished.append(Unfinished(commit=commit.sha, subject=commit.subject))
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        result.rejected.sort(key=lambda r: position.get(r.commit, 0))
        result.elapsed_s = time.monotonic() - started
        if report is not None:
            result.write_report(report)
    return result


def _rejected_event(rejection: Rejection, result: MiningResult) -> MiningEvent:
    return MiningEvent(
        "rejected",
        rejection.commit,
        rejection.subject,
        f"{rejection.reason.value}: {rejection.detail}" if rejection.detail else rejection.reason.value,
        scanned=result.scanned,
        kept=len(result.tasks),
        done=result.done,
        total=result.total,
    )
