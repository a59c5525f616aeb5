"""Grading: a fix counts only when the tests failed before, pass after, and the test files are untouched.

The grader never trusts the model's word (its `finish` summary is recorded, never read). Before the after-run, every
test file the agent changed, created or deleted is put back as it was in the task state, so a tampered test can
never turn a grade green; `tests_untouched` records whether anything had to be put back. When the test runner is
pytest, per-test results come from JUnit XML and FAIL_TO_PASS / PASS_TO_PASS are reported as in SWE-bench.
"""

from __future__ import annotations

import re
import shlex
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from bugsweep.errors import SandboxError
from bugsweep.sandbox.base import Sandbox
from bugsweep.testfiles import is_test_file

#: Files that running code leaves behind and that are never part of a fix.
PATCH_EXCLUDES = [
    ":(exclude,glob)**/__pycache__/**",
    ":(exclude,glob)**/*.pyc",
    ":(exclude,glob)**/.pytest_cache/**",
    ":(exclude,glob)**/*.egg-info/**",
]
GIT = (
    "git -c core.quotepath=off -c user.name=bugsweep -c user.email=bugsweep@localhost -c commit.gpgsign=false"
)


@dataclass
class TestRun:
    """One run of the test command, with the whole log."""

    __test__ = False  # not a pytest class

    command: str
    exit_code: int | None
    timed_out: bool
    log: str
    duration_s: float
    tests: dict[str, str] | None = field(default=None)
    """Per-test outcome ('passed', 'failed', 'error', 'skipped') by pytest node id, when JUnit XML was available."""

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def ids(self, *outcomes: str) -> set[str]:
        return {t for t, o in (self.tests or {}).items() if o in outcomes}


class Grade(BaseModel):
    """The verdict on one task, written to grade.json."""

    instance_id: str
    model: str = ""
    resolved: bool = False
    """failed_before and passes_after and tests_untouched (and the task's own FAIL_TO_PASS/PASS_TO_PASS, if given)."""
    failed_before: bool = False
    passes_after: bool = False
    tests_untouched: bool = True
    touched_test_files: list[str] = Field(default_factory=list)
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    """Tests that failed before and pass after (observed)."""
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    """Tests that passed before and still pass after (observed)."""
    PASS_TO_FAIL: list[str] = Field(default_factory=list)
    """Tests the change broke."""
    stop_reason: str | None = None
    policy: str | None = None
    """The agent policy the run was under ('plain', 'small-model': bugsweep/agent/policy.py); None when the agent
    never ran."""
    summary: str | None = None
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    """Token cost from the model's prices."""
    sandbox_cost_usd: float | None = None
    """Sandbox cost where the backend bills (Runtime); None for the local sandbox."""
    wall_s: float = 0.0
    agent_wall_s: float = 0.0
    peak_memory_mib: float | None = None
    """Resource use of the run's sandbox (setup, tests and agent), where the backend measures it (local): the
    most memory held at once, page cache included."""
    cpu_s: float | None = None
    """CPU seconds of every command in the sandbox."""
    peak_disk_mib: float | None = None
    """The most disk the sandbox's writable layers held at once."""
    disk_quota_mib: float | None = None
    """The disk quota the run had (None: none)."""
    error: str | None = None
    """Why the task could not be run, if it could not."""
    failure_kind: str | None = None
    """'config', 'infra', 'task' or 'crash' when `error` is set."""


def run_tests(sandbox: Sandbox, test_command: str, timeout: float = 1800.0) -> TestRun:
    """Run the test command with the whole log kept; for pytest, also collect per-test results."""
    junit = f"/tmp/bugsweep-junit-{uuid.uuid4().hex[:8]}.xml"
    env = {
        # Affects only pytest; other runners ignore it. xunit1 adds the file attribute we need for node ids.
        "PYTEST_ADDOPTS": f"--junitxml={junit} -o junit_family=xunit1 -p no:cacheprovider",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    result = sandbox.exec(test_command, timeout=timeout, env=env, full_output=True)
    tests: dict[str, str] | None = None
    try:
        if sandbox.files.exists(junit):
            tests = parse_junit(sandbox.files.read_text(junit))
    except (SandboxError, ET.ParseError, OSError):
        tests = None
    return TestRun(
        command=test_command,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        log=result.output,
        duration_s=result.duration_s,
        tests=tests,
    )


#: pytest's exit codes for "nothing was tested": 4 a usage error (bad option or path), 5 no test collected.
PYTEST_USAGE_ERROR, PYTEST_NO_TESTS = 4, 5
_PYTEST = re.compile(r"(^|[\s/;&|(])(py\.test|pytest)(\s|$|;|&|\|)")
_MISSING_MODULE = re.compile(r"^\S*python[0-9.]*: No module named (\S+)", re.MULTILINE)
_MISSING_SCRIPT = re.compile(r"^\S*python[0-9.]*: can't open file ", re.MULTILINE)


def why_cannot_run(run: TestRun) -> str | None:
    """Why a test run tested nothing at all (the program is missing, pytest was misused or found no test), or None.

    Such a run fails, but not because of a bug: grading it as "failed before" would set the model a task that does
    not exist.
    """
    if run.timed_out:
        return None
    code = run.exit_code
    if code == 127:
        return "its program was not found (exit 127)"
    if code == 126:
        return "its program cannot be executed (exit 126)"
    missing = _MISSING_MODULE.search(run.log)
    if missing and code not in (0, None):
        return f"Python has no module {missing.group(1)} (`python -m` exited {code})"
    if _MISSING_SCRIPT.search(run.log) and code not in (0, None):
        return f"Python cannot open the script it names (exit {code})"
    if _PYTEST.search(run.command):
        if code == PYTEST_USAGE_ERROR:
            return "pytest reports a usage error (exit 4: a bad option or a path that does not exist)"
        if code == PYTEST_NO_TESTS:
            return "pytest collected no test (exit 5)"
    return None


def parse_junit(xml_text: str) -> dict[str, str]:
    """pytest node id -> outcome, from pytest's JUnit XML (junit_family=xunit1)."""
    outcomes: dict[str, str] = {}
    root = ET.fromstring(xml_text)
    for case in root.iter("testcase"):
        name = case.get("name", "")
        classname = case.get("classname", "")
        file = case.get("file")
        if file:
            module = file[:-3].replace("/", ".") if file.endswith(".py") else file
            rest = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
            node = "::".join([file, *(rest.split(".") if rest else []), name])
        else:
            node = f"{classname}::{name}" if classname else name
        if case.find("failure") is not None:
            outcome = "failed"
        elif case.find("error") is not None:
            outcome = "error"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        outcomes[node] = outcome
    return outcomes


def commit_task_state(sandbox: Sandbox, message: str = "bugsweep: task state") -> str:
    """Commit everything in the repo so later diffs are against exactly what the agent was given. Returns the sha."""
    script = (
        f"{GIT} add -A -- . {_pathspecs()} >/dev/null && "
        f"{GIT} commit -q --allow-empty --no-verify -m {shlex.quote(message)} && {GIT} rev-parse HEAD"
    )
    result = sandbox.exec(script, timeout=300)
    if not result.ok:
        raise SandboxError(f"could not record the task state with git: {result.output.strip()[-500:]}")
    return result.stdout.strip().splitlines()[-1]


def changed_files(sandbox: Sandbox, task_state: str) -> list[str]:
    """Every path the agent changed, created or deleted since the task state (committed or not)."""
    script = f"{GIT} add -A -- . {_pathspecs()} >/dev/null 2>&1; {GIT} diff --cached --name-only --no-renames {task_state}"
    result = sandbox.exec(script, timeout=300)
    if result.exit_code != 0:
        raise SandboxError(f"git diff failed in the sandbox: {result.output.strip()[-500:]}")
    return [line for line in result.stdout.splitlines() if line.strip()]


def compute_patch(sandbox: Sandbox, task_state: str) -> str:
    """The agent's change as a `git diff` against the task state, new files included."""
    script = f"{GIT} add -A -- . {_pathspecs()} >/dev/null 2>&1; {GIT} diff --cached --binary {task_state} -- . {_pathspecs()}"
    result = sandbox.exec(script, timeout=300, full_output=True)
    if result.exit_code != 0:
        raise SandboxError(f"git diff failed in the sandbox: {result.output.strip()[-500:]}")
    return result.stdout


def touched_test_files(
    changed: Iterable[str], patterns: Iterable[str], extra: Iterable[str] = ()
) -> list[str]:
    patterns, extra = list(patterns), list(extra)
    return sorted(p for p in changed if is_test_file(p, patterns, extra))


def restore_test_files(sandbox: Sandbox, task_state: str, paths: Iterable[str]) -> None:
    """Put test files back exactly as in the task state: modified and deleted ones restored, new ones removed."""
    paths = list(paths)
    if not paths:
        return
    quoted = " ".join(shlex.quote(p) for p in paths)
    # `git rm --cached` + `git checkout` handle all three cases: in the task state -> restored; not -> deleted.
    script = (
        f"for p in {quoted}; do "
        f'if {GIT} cat-file -e {task_state}:"$p" 2>/dev/null; then {GIT} checkout -q {task_state} -- "$p"; '
        f'else {GIT} rm -q -f --cached -- "$p" >/dev/null 2>&1; rm -rf -- "$p"; fi; done'
    )
    result = sandbox.exec(script, timeout=300)
    if result.exit_code != 0:
        raise SandboxError(f"could not restore the test files: {result.output.strip()[-500:]}")


def grade(
    *,
    instance_id: str,
    before: TestRun,
    after: TestRun,
    touched: list[str],
    expected_fail_to_pass: Iterable[str] = (),
    expected_pass_to_pass: Iterable[str] = (),
) -> Grade:
    """The verdict from the two test runs and the list of test files the agent touched."""
    failed_before = not before.passed
    passes_after = after.passed
    fail_to_pass = sorted(before.ids("failed", "error") & after.ids("passed"))
    pass_to_pass = sorted(before.ids("passed") & after.ids("passed"))
    pass_to_fail = sorted(before.ids("passed") & after.ids("failed", "error"))
    # A task that names its own tests (mined tasks) also needs those to come out right.
    expected_ok = True
    if after.tests is not None:
        wanted = set(expected_fail_to_pass) | set(expected_pass_to_pass)
        expected_ok = wanted <= after.ids("passed")
    return Grade(
        instance_id=instance_id,
        failed_before=failed_before,
        passes_after=passes_after,
        tests_untouched=not touched,
        touched_test_files=touched,
        resolved=failed_before and passes_after and not touched and expected_ok,
        FAIL_TO_PASS=fail_to_pass,
        PASS_TO_PASS=pass_to_pass,
        PASS_TO_FAIL=pass_to_fail,
    )


def _pathspecs() -> str:
    return " ".join(shlex.quote(p) for p in PATCH_EXCLUDES)
