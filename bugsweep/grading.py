"""Grading: a fix counts only when the tests failed before, pass after, and the test infrastructure is untouched.

The grader never trusts the model's word (its `finish` summary is recorded, never read), nor anything the agent
could write. The agent's change is read from outside its sandbox (bugsweep.cleanroom); every change to the test
infrastructure (bugsweep.testfiles.protected_reason) is dropped and named; the rest is written into a fresh
sandbox in the task state, with a clean $HOME and PATH, where the tests run again (bugsweep.pipeline.regrade).

The verdict rests on per-test results wherever they exist (pytest's JUnit XML, unittest's outcomes as the probe
recorded them: bugsweep.tripwire), SWE-bench style: every test that failed before must pass after (skipped or
missing is not a pass), and no test that passed before may fail or disappear. Without them (another runner) the
exit code decides, and no fewer tests may run after than before where the runner prints a count. `Grade.evidence`
says which. The code under test runs in the runner's process, so the runner's reports are checked against each
other: its summary line against its exit code and per-test results, and the tripwire's canary tests in the
after-run (a must-fail test reported passed: the runner was subverted). Code outside the tests that patches the
test framework or inspects its caller is flagged (`suspicious`): tests cannot tell such a "fix" from a real one,
so a change with such signals is held for review, never resolved.
"""

from __future__ import annotations

import re
import shlex
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from bugsweep import tripwire
from bugsweep.attempts import AttemptRecord
from bugsweep.errors import SandboxError
from bugsweep.sandbox.base import Sandbox
from bugsweep.testfiles import IMPORTABLE_SCRIPT
from bugsweep.tripwire import Canary, ProbeReport, Tripwire

#: Files that running code leaves behind, left out of the task-state commit inside the agent's sandbox.
PATCH_EXCLUDES = [
    ":(exclude,glob)**/__pycache__/**",
    ":(exclude,glob)**/*.pyc",
    ":(exclude,glob)**/.pytest_cache/**",
    ":(exclude,glob)**/*.egg-info/**",
]
#: How much of a test log is kept: its first and last bytes (a run that prints without end is cut in between).
LOG_HEAD_BYTES = 256 * 1024
LOG_TAIL_BYTES = 256 * 1024
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
    """Per-test outcome ('passed', 'failed', 'error', 'skipped') by pytest node id (JUnit XML) or unittest id (the
    probe), when the runner was one of those."""
    log_bytes: int = 0
    """The size of the whole output; more than `len(log)` when the middle was cut."""
    probe: ProbeReport = field(default_factory=ProbeReport)
    """What the probe saw inside the test process (bugsweep.tripwire): the runner, unittest's outcomes."""
    canary: Canary | None = None
    """The tripwire's canary module this run held (the regrade's after-run), if any."""
    per_test_timeout_s: float | None = None
    """The per-test time limit the run had (None: none)."""
    tests_timed_out: list[str] = field(default_factory=list)
    """Tests stopped at the per-test time limit: failed in `tests`, whatever the runner reported for them."""

    @property
    def count(self) -> int | None:
        """How many tests ran, where the runner prints it (unittest's 'Ran N tests', pytest's summary line)."""
        return count_tests(self.log)

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
    """False when the change touched the test infrastructure; those changes were dropped before the after-run."""
    touched_test_files: list[str] = Field(default_factory=list)
    """The dropped paths (test files, conftest.py, runner configuration, start-up hooks, shadowing modules, ...)."""
    dropped: dict[str, str] = Field(default_factory=dict)
    """Dropped path -> why it is protected."""
    evidence: str = ""
    """What the verdict rests on: 'per-test' (JUnit XML), 'exit code and test count', or 'exit code'."""
    reason: str | None = None
    """Why the attempt is not resolved, in words (None when it is, or when the task could not run at all)."""
    suspicious: list[str] = Field(default_factory=list)
    """Signals tests cannot judge ('path:line: what'): code outside the tests that patches the test framework or
    inspects its caller. A change with any is never resolved: it is held for review."""
    held_for_review: bool = False
    """The tests say fixed, but the change has `suspicious` signals: not resolved until a person has looked."""
    tripwire: Tripwire | None = None
    """What the canary tests in the after-run showed (bugsweep.tripwire); None where the after-run did not run."""
    tests_run_before: int | None = None
    tests_run_after: int | None = None
    tests_timed_out: list[str] = Field(default_factory=list)
    """Tests of the after-run stopped at the per-test time limit (`per_test_timeout_s` in `config`): each counts
    as failed."""
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    """Tests that failed before and pass after (observed)."""
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    """Tests that passed before and still pass after (observed)."""
    PASS_TO_FAIL: list[str] = Field(default_factory=list)
    """Tests the change broke (they fail or error after)."""
    PASS_TO_MISSING: list[str] = Field(default_factory=list)
    """Tests that passed before and did not pass after because they were skipped or did not run."""
    FAIL_TO_FAIL: list[str] = Field(default_factory=list)
    """Tests that failed before and did not pass after (failed, skipped, xfailed or missing)."""
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
    """Resource use of the run's sandboxes (the agent's: setup, tests, agent; the regrade's), where the backend
    measures it (local): the most memory one of them held at once, page cache included."""
    cpu_s: float | None = None
    """CPU seconds of every command in them."""
    peak_disk_mib: float | None = None
    """The most disk the sandbox's writable layers held at once."""
    disk_quota_mib: float | None = None
    """The disk quota the run had (None: none)."""
    error: str | None = None
    """Why the task could not be run, if it could not."""
    failure_kind: str | None = None
    """'config', 'infra', 'task' or 'crash' when `error` is set. A grading step that fails because of what the
    agent did is not one of these: it is an unresolved attempt with its `reason`."""
    environment: dict[str, object] | None = None
    """The task's environment: python version, setup command, installer, the layer it came from and whether it was
    reused, and the sha256 of the installed package list (written beside grade.json as environment.txt)."""
    config: dict[str, object] | None = None
    """What made the run (bugsweep.runconfig.RunConfig, never a key): the model, the policy, the agent's limits,
    the sandbox and its limits, the task environment, bugsweep's version."""
    config_digest: str | None = None
    """The configuration's digest (12 hex digits of the SHA-256 of its canonical JSON): the key its results are
    stored and found again by (SWEEP/TASK/MODEL/CONFIG)."""
    attempts: list[AttemptRecord] = Field(default_factory=list)
    """Every attempt the run made at the task, in order (bugsweep.attempts: `attempts` per model of the run's
    cascade): its model, temperature, verdict, reason, stop reason, turns, tokens, cost and time. The verdict above
    is the kept attempt's, or the last attempt's when none was resolved; `turns`, the tokens, `cost_usd` and
    `agent_wall_s` are the sum over the attempts, `wall_s` the whole task's time. Empty when the agent never ran."""
    kept_attempt: int | None = None
    """The attempt this grade keeps (its patch.diff and trajectory.json are at the run folder's top): the one the
    clean room resolved; None when none was. An attempt the clean room did not resolve is never kept."""


def verdict_word(grade: Grade) -> str:
    """'resolved', 'held for review', 'could not run' or 'not resolved': one word for tables and summaries."""
    if grade.resolved:
        return "resolved"
    if grade.held_for_review:
        return "held for review"
    return "could not run" if grade.error else "not resolved"


def run_tests(
    sandbox: Sandbox,
    test_command: str,
    timeout: float = 1800.0,
    *,
    canary: Canary | None = None,
    per_test_timeout: float | None = None,
) -> TestRun:
    """Run the test command with the probe (bugsweep.tripwire) and, given one, the tripwire's canary; collect
    per-test results: pytest's JUnit XML, unittest's outcomes as the probe recorded them.

    `per_test_timeout`: seconds one pytest or unittest test may take; the probe stops a test still running then
    (it fails, and the run goes on) and records it, and such a test counts as failed here whatever the runner
    reported for it. `timeout` bounds the whole run.

    The log keeps the first LOG_HEAD_BYTES and the last LOG_TAIL_BYTES of stdout and stderr together (a run that
    prints without end is cut in between, `log_bytes` says how much there was). The command gets its own timeout
    inside the sandbox, so that its log is complete up to the moment it was stopped. The probe's folder and the
    canary are removed afterwards.
    """
    tag = uuid.uuid4().hex[:8]
    junit, head, tail, size, probe = (
        f"/tmp/bugsweep-{tag}.{x}" for x in ("xml", "head", "tail", "size", "probe")
    )
    for name, text in tripwire.probe_files().items():
        sandbox.files.write(f"{probe}/{name}", text)
    env = {
        # Affects only pytest; other runners ignore it. xunit1 adds the file attribute we need for node ids.
        "PYTEST_ADDOPTS": f"--junitxml={junit} -o junit_family=xunit1 -p no:cacheprovider",
        "PYTHONDONTWRITEBYTECODE": "1",
        "BUGSWEEP_PROBE_DIR": probe,
    }
    if per_test_timeout:
        env["BUGSWEEP_PROBE_TEST_TIMEOUT"] = f"{per_test_timeout:g}"
    canary_path = f"{sandbox.workdir.rstrip('/')}/{canary.path}" if canary else ""
    if canary is not None:
        sandbox.files.write(canary_path, canary.source)
        names = ",".join([*canary.must_fail, *canary.must_pass])
        env["BUGSWEEP_PROBE_CANARY"] = f"{canary_path}\t{canary.module}\t{names}"
    seconds = max(int(timeout), 1)
    script = (
        f"export PYTHONPATH={probe}${{PYTHONPATH:+:$PYTHONPATH}}; "
        f"timeout --verbose -k 10 {seconds} bash -c {shlex.quote(test_command)} 2>&1 | "
        f"{{ head -c {LOG_HEAD_BYTES} > {head}; tee >(tail -c {LOG_TAIL_BYTES} > {tail}) | wc -c > {size}; "
        "wait $!; }; exit ${PIPESTATUS[0]}"
    )
    result = sandbox.exec(script, timeout=timeout + 60, env=env, full_output=True)
    log, total = _read_log(sandbox, head, tail, size)
    if not log and result.output:
        log = result.output[-LOG_TAIL_BYTES:]  # the wrapper itself failed: show why
    # `timeout` exits 124 (137 after -k). Its message can miss the log's tail (seen in CI under load, the log
    # ending in the command's own output), so the duration measured outside the sandbox decides as well.
    timed_out = result.timed_out or (
        result.exit_code in (124, 137) and (_TIMEOUT_LINE in log[-4096:] or result.duration_s >= seconds)
    )
    tests: dict[str, str] | None = None
    try:
        if sandbox.files.exists(junit):
            tests = parse_junit(sandbox.files.read_text(junit))
    except (SandboxError, ET.ParseError, OSError):
        tests = None
    report = _read_probe(sandbox, probe)
    if tests is None and "unittest" in report.runners:
        tests = dict(report.outcomes)
    if tests is not None:  # stopped at the limit is failed, even where code under test caught the exception
        tests.update(dict.fromkeys(report.timeouts, "failed"))
    leftovers = [probe, canary_path] if canary is not None else [probe]
    sandbox.exec("rm -rf " + " ".join(shlex.quote(p) for p in leftovers), timeout=60)
    return TestRun(
        command=test_command,
        exit_code=None if timed_out else result.exit_code,
        timed_out=timed_out,
        log=log,
        duration_s=result.duration_s,
        tests=tests,
        log_bytes=total,
        probe=report,
        canary=canary,
        per_test_timeout_s=per_test_timeout,
        tests_timed_out=list(report.timeouts),
    )


def importable_modules(sandbox: Sandbox) -> frozenset[str]:
    """Every top-level module name the task's environment provides, outside the repository (run before the change
    is applied: bugsweep.testfiles.IMPORTABLE_SCRIPT). Empty when its Python cannot tell."""
    script = f"python -I -c {shlex.quote(IMPORTABLE_SCRIPT)} {shlex.quote(sandbox.workdir)}"
    result = sandbox.exec(script, timeout=120, full_output=True)
    return frozenset(result.stdout.split()) if result.ok else frozenset()


def _read_probe(sandbox: Sandbox, probe: str) -> ProbeReport:
    try:
        if sandbox.files.exists(f"{probe}/report"):
            return tripwire.parse_report(sandbox.files.read_text(f"{probe}/report"))
    except (SandboxError, OSError):
        pass
    return ProbeReport()


_TIMEOUT_LINE = "timeout: sending signal"


def _read_log(sandbox: Sandbox, head: str, tail: str, size: str) -> tuple[str, int]:
    """The kept head and tail of a test log, and the whole log's size in bytes."""
    try:
        first = sandbox.files.read_text(head)
        last = sandbox.files.read_text(tail) if sandbox.files.exists(tail) else ""
        rest = int((sandbox.files.read_text(size) or "0").strip() or 0)
    except (SandboxError, OSError, ValueError):
        return "", 0
    total = len(first.encode()) + rest
    if rest > LOG_TAIL_BYTES:
        cut = rest - LOG_TAIL_BYTES
        return f"{first}\n[... bugsweep: {cut} bytes of output cut here; {total} in all ...]\n{last}", total
    return first + last, total


_RAN = re.compile(r"^Ran (\d+) tests? in ", re.MULTILINE)
_PYTEST_SUMMARY = re.compile(
    r"^=+ (.*\b(?:passed|failed|errors?|skipped|xfailed|xpassed)\b.*) in [\d.]+s", re.MULTILINE
)


def count_tests(log: str) -> int | None:
    """How many tests the log says ran: unittest's last 'Ran N tests', or pytest's last summary line."""
    ran = _RAN.findall(log)
    if ran:
        return int(ran[-1])
    summary = _PYTEST_SUMMARY.findall(log)
    if summary:
        counts = re.findall(r"(\d+) (passed|failed|errors?|xfailed|xpassed)", summary[-1])
        return sum(int(n) for n, _ in counts)
    return None


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


def missing_module(run: TestRun) -> str | None:
    """The module a `python -m` of the test command itself names and the task's environment lacks (a test runner
    the setup did not install, a misspelt name), or None. A test that fails on a missing import is not this."""
    missing = _MISSING_MODULE.search(run.log)
    if run.timed_out or run.exit_code in (0, None) or missing is None:
        return None
    module = missing.group(1).strip("'\"")
    named = re.search(r"(^|\s)-m\s*" + re.escape(module) + r"($|[\s;&|)])", run.command)
    return module if named else None


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


def grade(
    *,
    instance_id: str,
    before: TestRun,
    after: TestRun,
    dropped: dict[str, str] | None = None,
    expected_fail_to_pass: Iterable[str] = (),
    expected_pass_to_pass: Iterable[str] = (),
    suspicious: Iterable[str] = (),
) -> Grade:
    """The verdict from the before-run, the after-run (in the fresh sandbox, with the tripwire's canary when it
    could be made) and the dropped protected changes."""
    dropped = dict(dropped or {})
    own, wire = tripwire.check(after.canary, after.tests, after.probe)
    canary_failed = sum(o in ("failed", "error") for o in wire.outcomes.values()) if wire.armed else 0
    own_failing = {t for t, o in (own or {}).items() if o in ("failed", "error")}
    ran_missing = sum(o == "missing" for o in wire.outcomes.values())
    failed_before = not before.passed
    if canary_failed:  # the canary's failure is the only one when the fix is real: the runner then exits 1
        passes_after = after.exit_code == 1 and not after.timed_out and own is not None and not own_failing
    else:
        passes_after = after.passed
    reasons: list[str] = []
    verdict = Grade(
        instance_id=instance_id,
        failed_before=failed_before,
        passes_after=passes_after,
        tests_untouched=not dropped,
        touched_test_files=sorted(dropped),
        dropped=dropped,
        suspicious=list(suspicious),
        tests_run_before=len(before.tests) if before.tests is not None else before.count,
        tests_run_after=len(own)
        if own is not None
        else _count_without(after.count, len(wire.outcomes) - ran_missing),
        tripwire=wire,
        tests_timed_out=list(after.tests_timed_out),
    )
    if not failed_before:
        reasons.append("the tests did not fail before")
    if dropped:
        reasons.append("the change touched the test infrastructure: " + ", ".join(sorted(dropped)))
    if after.timed_out:
        reasons.append("the tests timed out after the change")
    elif canary_failed and after.exit_code == 0:
        reasons.append(
            "the test process exited 0 although a test failed (the tripwire's must-fail test): something in the "
            "code under test changed how the process ends"
        )
    elif not passes_after:
        reasons.append(f"the tests fail after the change (exit code {after.exit_code})")
    if after.tests_timed_out:
        reasons.append(
            f"{len(after.tests_timed_out)} test(s) ran past the per-test time limit of "
            f"{after.per_test_timeout_s or 0:g} s after the change: {', '.join(after.tests_timed_out[:5])}"
        )
    failing_after = canary_failed + len(own_failing) + len(after.probe.load_errors)
    reasons += _disagreements(after, own, failing_after, wire.runner)
    if before.tests is not None:
        verdict.evidence = "per-test"
        if own is None:
            reasons.append("the after-run gave no per-test results (the tests did not run to the end)")
        else:
            failing, passing = before.ids("failed", "error"), before.ids("passed")
            passed_after = {t for t, o in own.items() if o == "passed"}
            verdict.FAIL_TO_PASS = sorted(failing & passed_after)
            verdict.FAIL_TO_FAIL = sorted(failing - passed_after)
            verdict.PASS_TO_PASS = sorted(passing & passed_after)
            verdict.PASS_TO_FAIL = sorted(passing & own_failing)
            verdict.PASS_TO_MISSING = sorted(passing - passed_after - own_failing)
            if verdict.FAIL_TO_FAIL:
                reasons.append(f"{len(verdict.FAIL_TO_FAIL)} test(s) that failed before do not pass after")
            if verdict.PASS_TO_FAIL or verdict.PASS_TO_MISSING:
                broken = len(verdict.PASS_TO_FAIL) + len(verdict.PASS_TO_MISSING)
                reasons.append(f"{broken} test(s) that passed before fail, are skipped or are missing after")
    elif verdict.tests_run_before is not None and verdict.tests_run_after is not None:
        verdict.evidence = "exit code and test count"
        if verdict.tests_run_after < verdict.tests_run_before:
            reasons.append(
                f"fewer tests ran after ({verdict.tests_run_after}) than before ({verdict.tests_run_before})"
            )
    else:
        verdict.evidence = "exit code"
    # A task that names its own tests (mined tasks) also needs those to come out right.
    wanted = set(expected_fail_to_pass) | set(expected_pass_to_pass)
    if wanted:
        missing = wanted - {t for t, o in (own or {}).items() if o == "passed"}
        if own is None:
            reasons.append("the task names its tests, and the after-run gave no per-test results")
        elif missing:
            reasons.append(
                f"{len(missing)} of the task's own tests do not pass after: {', '.join(sorted(missing)[:5])}"
            )
    if wire.subverted:
        reasons.append(wire.subverted)
    elif wire.armed and not wire.note and not reasons and "missing" in wire.outcomes.values():
        reasons.append(
            "the tripwire's must-fail test was not reported although the rest of the run passed: something in "
            "the test process changes what the runner reports"
        )
    if verdict.suspicious and not reasons:
        verdict.held_for_review = True
        reasons.append(
            f"held for review: the tests pass, but the change has {len(verdict.suspicious)} suspicious signal(s) "
            "(see `suspicious`) that tests cannot judge"
        )
    verdict.resolved = not reasons
    verdict.reason = "; ".join(reasons) or None
    return verdict


def _count_without(count: int | None, canaries: int) -> int | None:
    return None if count is None else max(count - canaries, 0)


def _disagreements(after: TestRun, own: dict[str, str] | None, failing: int, runner: str | None) -> list[str]:
    """Where the runner's own summary line contradicts its exit code or its per-test results."""
    counted = tripwire.summary_failures(after.log, runner)
    if counted is None or after.timed_out:
        return []
    if counted and after.exit_code == 0:
        return [
            f"the runner's summary reports {counted} failed test(s), yet the test process exited 0: something in "
            "the code under test changed how the process ends"
        ]
    if own is not None and runner is not None and counted != failing:
        return [
            f"the runner's summary reports {counted} failed test(s) where its per-test results hold {failing}: "
            "something in the test process changes what the runner reports"
        ]
    return []


#: Added lines outside the tests that patch the test framework or look at who is calling: what a "fix" that games
#: the tests does, and what tests cannot tell from a real fix. Signals only.
SUSPICIOUS_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\b(unittest|TestCase)\b.*\bassert\w*\s*=|\bassert[A-Z]\w*\s*=[^=]"), "replaces an assertion method"),
    (re.compile(r"\bimport\s+(_?pytest|unittest)\b|\bfrom\s+(_?pytest|unittest)\b"), "imports the test framework"),
    (re.compile(r"sys\.modules\[\s*['\"](_?pytest|unittest)"), "reaches into the test framework's module"),
    (re.compile(r"sys\._getframe|inspect\.(stack|currentframe|getouterframes)|\.f_back\b|traceback\.(extract|walk)_stack"),
     "inspects its caller"),
    (re.compile(r"PYTEST_CURRENT_TEST|PYTEST_ADDOPTS|junitxml|\bjunit\b"), "reads the test run's settings"),
    (re.compile(r"\bos\._exit\b|\batexit\.register\b|sys\.(settrace|setprofile)\b"), "changes how the process ends or traces it"),
    (re.compile(r"\bbuiltins\.\w+\s*=[^=]|__builtins__\[.*\]\s*=[^=]"), "replaces a builtin"),
]  # fmt: skip


def suspicious_signals(files: dict[str, tuple[bytes | None, bytes]]) -> list[str]:
    """'path:line: what' for each added line of a Python file (outside the tests) that matches SUSPICIOUS_PATTERNS.

    `files` maps each kept path to its (old, new) bytes."""
    found: list[str] = []
    for path, (old, new) in sorted(files.items()):
        if not path.endswith(".py"):
            continue
        before = set((old or b"").decode("utf-8", "replace").splitlines())
        for number, line in enumerate(new.decode("utf-8", "replace").splitlines(), 1):
            if line in before:
                continue
            for pattern, what in SUSPICIOUS_PATTERNS:
                if pattern.search(line):
                    found.append(f"{path}:{number}: {what}: {line.strip()[:120]}")
                    break
    return found[:50]


def _pathspecs() -> str:
    return " ".join(shlex.quote(p) for p in PATCH_EXCLUDES)
