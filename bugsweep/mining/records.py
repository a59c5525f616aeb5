"""What mining deals in: the commits of a history, why one was rejected, and what a run found."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, Field

from bugsweep.spec import TaskSpec

#: The first line of a pull request's (or branch's) merge commit; the PR title follows on the next line.
MERGE_LINE = re.compile(
    r"^\s*Merge (pull request #\d+|branch '[^']*'|remote-tracking branch '[^']*')( of \S+)?( into \S+)?"
)


class RejectReason(StrEnum):
    """Why a candidate commit did not become a task."""

    NO_TEST_CHANGE = "no test change"
    NO_SOURCE_CHANGE = "no source change"
    NOT_A_FIX = "not a fix"
    NO_PARENT = "no parent commit"
    SAME_CHANGE = "same change as another commit"
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
    why_fix: str = ""
    """Why the screen took it for a fix, in words a user reads ("the subject says 'fix'")."""
    rule: str = ""
    """The screen's rule that admitted it (bugsweep.mining.screening.Rule: "fix word in the subject", ...)."""


class Rejection(BaseModel):
    commit: str
    subject: str
    reason: RejectReason
    detail: str = ""
    rule: str = ""
    """For 'not a fix': the screen's rule that decided (bugsweep.mining.screening.Rule)."""


class Kept(BaseModel):
    """A candidate that became a task, and why the screen took it for a fix (the task file says the same)."""

    commit: str
    subject: str
    screen_rule: str = ""
    """The screen's rule that admitted it (bugsweep.mining.screening.Rule)."""
    screen_reason: str = ""
    """Why, in words ("the subject says 'Fix'")."""
    test_command: str = ""
    """The task's test command, its deselections included."""


class Unfinished(BaseModel):
    """A candidate whose validation a stopped run cut short."""

    commit: str
    subject: str


class MiningResult(BaseModel):
    """What a mining run found: the tasks, every rejected candidate with its reason, and how long it took."""

    repo: str
    tasks: list[TaskSpec] = Field(default_factory=list)
    rejected: list[Rejection] = Field(default_factory=list)
    kept: list[Kept] = Field(default_factory=list)
    """The kept candidates, newest first, each with the screen's rule and reason (the tasks are in the task file)."""
    flaky_tests: dict[str, list[str]] = Field(default_factory=dict)
    """Flaky tests seen, by commit sha (dropped from kept tasks; the reason for rejecting others)."""
    failing_in_both: dict[str, list[str]] = Field(default_factory=dict)
    """Of kept tasks, by commit sha: tests that failed at the task state and at the fix commit alike (the task's
    FAIL_TO_FAIL), left out of its FAIL_TO_PASS and PASS_TO_PASS and deselected."""
    out_of_memory: dict[str, list[str]] = Field(default_factory=dict)
    """Of validated candidates, by commit sha: tests the probe stopped at the per-test memory bound (failed there,
    the run going on), at the task state or the fix commit."""
    crashed: dict[str, list[str]] = Field(default_factory=dict)
    """Of validated candidates, by commit sha: tests whose test process died while they ran (one that went on past
    the per-test time limit though told to stop, one killed for its memory, a crash), failed there, the rest of the
    run run again without them."""
    older_python: dict[str, str] = Field(default_factory=dict)
    """Of kept tasks, by commit sha: the other interpreter the task was kept on (older, or newer where its package
    requires one), its environment having failed on the running Python (the task's `python`)."""
    dated: dict[str, str] = Field(default_factory=dict)
    """Of kept tasks, by commit sha: the commit's time, where the task was kept with the releases of that time
    installed (its setup sets UV_EXCLUDE_NEWER), its environment having failed with today's."""
    extras: dict[str, list[str]] = Field(default_factory=dict)
    """Of kept tasks, by commit sha: the project's extras the task was kept with (its setup installs them), its
    tests having failed to import a module they install without them."""
    scanned: int = 0
    """Commits looked at."""
    validated: int = 0
    """Candidates that were run in a sandbox (kept or not)."""
    total: int = 0
    """Commits in the range (branch, --since/--until, --max-candidates)."""
    unfinished: list[Unfinished] = Field(default_factory=list)
    """Candidates whose validation was cut short by a stop: neither kept nor rejected."""
    stopped: str | None = None
    """Why the run stopped before its end ('interrupted (Ctrl-C)', 'terminated (SIGTERM)', a test command that
    cannot run), or None."""
    tasks_file: str | None = None
    """The task file this run wrote (every kept task, none: an empty file), or None when it wrote none."""
    report_file: str | None = None
    """This report's own path, once the run writes it (None: not written)."""
    per_test_timeout_s: float | None = None
    """The per-test time limit of the validation runs (None: none, only the whole run's timeout)."""
    unreleased_fixes: bool = False
    """Whether the screen kept commits mending work since the last release (`bugsweep mine --unreleased-fixes`);
    by default they are no fix (the rules 'own unreleased work' and 'others' unreleased work')."""
    environments_built: int = 0
    """Task environments the validations built (their setup ran)."""
    environments_reused: int = 0
    """Task environments the validations reused (a finished setup with the same key: no install ran)."""
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
    environments: str = ""
    """For a validated candidate: how each state's task environment came about ('built, reused'), else ''."""


ProgressCallback = Callable[[MiningEvent], None]
