"""One run of a test command in a sandbox, with the probe in its process: the log, the exit code, per-test results.

`run_tests` is used for every graded run: the baseline (in the agent's sandbox, before the agent), the mining
validations, and the regrade's runs in fresh sandboxes (bugsweep.grading.regrade, which installs the probe itself
and gives the mirror pair their instruction).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from bugsweep.errors import SandboxError
from bugsweep.grading import harness
from bugsweep.grading.records import ProbeReport, parse_records
from bugsweep.sandbox.base import Sandbox

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
    """Per-test outcome ('passed', 'failed', 'error', 'skipped') by pytest test id (as its JUnit XML names it) or
    unittest id, as the probe recorded them, when the runner was one of those."""
    log_bytes: int = 0
    """The size of the whole output; more than `len(log)` when the middle was cut."""
    probe: ProbeReport = field(default_factory=ProbeReport)
    """What the probe recorded inside the test process (bugsweep.grading.records)."""
    per_test_timeout_s: float | None = None
    """The per-test time limit the run had (None: none)."""
    tests_timed_out: list[str] = field(default_factory=list)
    """Tests stopped at the per-test time limit: failed in `tests`, whatever the runner reported for them."""
    tests_out_of_memory: list[str] = field(default_factory=list)
    """Tests stopped at the per-test memory bound: failed in `tests`, whatever the runner reported for them."""
    memory_bound_bytes: int = 0
    """The per-test memory bound the run had (0: none)."""
    tests_crashed: list[str] = field(default_factory=list)
    """Tests whose process died while they ran (see `run_tests`): failed in `tests`, the run again without them."""

    @property
    def killed_in(self) -> str | None:
        """The test that was running when the test process was killed (its memory: exit 137) before its runner
        finished, as far as the probe saw it: the last test that held half the memory bound. None otherwise."""
        heavy = self.probe.memory_heavy
        if self.tests is not None or not heavy:
            return None
        return self.probe.test_id(heavy[-1])

    @property
    def count(self) -> int | None:
        """How many tests ran, where the runner prints it (unittest's 'Ran N tests', pytest's summary line)."""
        return count_tests(self.log)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def runner(self) -> str | None:
        """The test runner the probe saw first (its tests are the run's), or None."""
        return self.probe.runners[0] if self.probe.runners else None

    def ids(self, *outcomes: str) -> set[str]:
        return {t for t, o in (self.tests or {}).items() if o in outcomes}


def run_tests(
    sandbox: Sandbox,
    test_command: str,
    timeout: float = 1800.0,
    *,
    per_test_timeout: float | None = None,
    memory_bound: int | None = None,
    facts: harness.EnvFacts | None = None,
    instruction: harness.Instruction | None = None,
    env: dict[str, str] | None = None,
) -> TestRun:
    """Run the test command with the probe in its process and collect per-test results.

    Without `facts`, the probe is written into the task environment's site-packages for this run and taken out
    again (the baseline, mining); with them, it is already there (the regrade's fresh sandboxes). `instruction`
    (the mirror pair's) is read once by the one test runner; without one, every Python process of the command
    reads the default one (per-test time limit only).

    `per_test_timeout`: seconds one pytest or unittest test may take; the probe stops a test still running then (it
    fails, and the run goes on) and records it, and such a test counts as failed here whatever the runner reported
    for it. `memory_bound`: bytes the test process may hold while a test runs (default: MEMORY_BOUND_SHARE of the
    sandbox's memory limit; 0: none); past it the probe stops the test as at the time limit. `timeout` bounds the
    whole run; the command gets its own `timeout` inside the sandbox so that its log is
    complete up to the moment it was stopped; a run stopped so after tests ran on to their per-test limit goes on
    without them (they failed), with a timeout of its own, up to TIMEOUT_ROUNDS timeouts in all. The log keeps the
    first LOG_HEAD_BYTES and the last LOG_TAIL_BYTES.
    """
    own_probe = facts is None
    if facts is None:
        facts = harness.install_probe(sandbox)
    loaded = harness.for_command(facts, test_command)
    try:
        told = instruction or harness.Instruction()
        told.limit = float(per_test_timeout or 0)
        told.memory = sandbox_memory_bound(sandbox) if memory_bound is None else memory_bound
        run = _run_once(sandbox, test_command, timeout, told, loaded, env, exclusive=instruction is not None)
        if instruction is not None:
            return run  # the regrade's pair is judged as it ran: a run that died half way fails closed
        # A test process that died half way (a test that would not stop at its limit, or was killed for its
        # memory or by a crash) gave no per-test results. As pytest-xdist does with a crashed worker, the test
        # that was running failed, and the rest run again without it, within what is left of the run's time.
        # A run that reached its timeout because tests ran on to their per-test limit one after another (each
        # looping in the code under test at the task state) goes on the same way: those
        # tests failed, and the rest run again without them, with a timeout of their own (TIMEOUT_ROUNDS at most).
        skipped: list[str] = []  # runner ids (pytest node ids, unittest test ids) the runs again leave out
        spent, allowed, reruns, given_at = run.duration_s, timeout, 0, 0
        while True:
            ended = (
                [t for t in dict.fromkeys(run.probe.timeouts) if t not in skipped] if run.timed_out else []
            )
            culprit = crashed_in(run)
            if (
                run.timed_out
                and per_test_timeout
                and (ended or len(skipped) > given_at)  # tests left out (ran to their limit, died) since then
                and spent < TIMEOUT_ROUNDS * timeout
            ):
                allowed, given_at = spent + timeout, len(skipped) + len(ended)
                said = (
                    "[bugsweep: the run reached its timeout after tests ran on to the per-test limit; they failed, "
                    "and the tests ran again without them]"
                )
            elif (
                culprit is not None
                and culprit not in skipped
                and reruns < CRASH_RERUNS
                and allowed - spent > 1
            ):
                reruns += 1
                said = f"[bugsweep: the test process died while {culprit} ran; it failed, and the tests ran again without it]"
            else:
                break
            skipped += [*ended, *([culprit] if culprit else [])]
            told.skip = list(skipped)
            again = _run_once(sandbox, test_command, allowed - spent, told, loaded, env, exclusive=False)
            spent += again.duration_s
            crashed = [run.probe.test_id(culprit)] if culprit is not None else []
            run = _merge_rerun(run, again, [run.probe.test_id(t) for t in ended], crashed, spent, said)
        return run
    finally:
        if own_probe:
            harness.remove_probe(sandbox, facts)


#: How many times one run goes on without a test its process died in (see `run_tests`); the run's timeout bounds
#: them all (loguru's ed0daf8b63: at its task state more than three tests' failure reports recurse without end).
CRASH_RERUNS = 10
#: A run whose timeout came while tests ran on to their per-test limit goes on without them, each time with a
#: timeout of its own, until it has taken this many timeouts in all.
TIMEOUT_ROUNDS = 3


def crashed_in(run: TestRun) -> str | None:
    """The test (pytest node id, unittest test id) that was running when the run's test process died before its
    runner finished, where the probe can name it: the one it ended for running on past its time limit, else the one
    started and not ended, else the last that held half the memory bound. None for a run that has per-test
    results, ran to its timeout, or ran under another runner."""
    report = run.probe
    if run.tests is not None or run.timed_out or not report.runners:
        return None
    if report.runners[0] not in ("pytest", "unittest"):
        return None
    if report.hard_stopped:
        return report.hard_stopped[-1]
    return report.running or (report.memory_heavy[-1] if report.memory_heavy else None)


def _merge_rerun(
    first: TestRun, again: TestRun, ended: list[str], crashed: list[str], spent: float, said: str
) -> TestRun:
    """The run again without the tests (ids) that ran on to their limit in a run that then timed out (`ended`) or
    that its process died in (`crashed`): they fail, what both runs recorded is kept, and both logs with `said`
    between."""
    again.duration_s = spent
    again.tests_crashed = [*first.tests_crashed, *crashed]
    again.tests_timed_out = list(dict.fromkeys([*first.tests_timed_out, *again.tests_timed_out]))
    again.tests_out_of_memory = list(dict.fromkeys([*first.tests_out_of_memory, *again.tests_out_of_memory]))
    again.log = f"{first.log}\n{said}\n{again.log}"
    again.log_bytes += first.log_bytes
    for test in dict.fromkeys([*again.tests_crashed, *ended]):  # for the regrade's pair: never run again
        raw = first.probe.raw_ids.get(test, test)
        if raw in first.probe.code:
            again.probe.code[raw] = first.probe.code[raw]
        if raw != test:
            again.probe.raw_ids[test] = raw
        again.probe.runner_of[test] = first.probe.runners[0]
    if again.tests is not None:
        again.tests.update({t: "failed" for t in [*again.tests_crashed, *ended]})
    if again.exit_code in (0, PYTEST_NO_TESTS):
        again.exit_code = 1  # tests failed: those the process died in (and the runner may have had none left)
    return again


def _run_once(
    sandbox: Sandbox,
    test_command: str,
    timeout: float,
    told: harness.Instruction,
    facts: harness.EnvFacts,
    env: dict[str, str] | None,
    *,
    exclusive: bool,
) -> TestRun:
    seconds = max(int(timeout), 1)
    script = harness.wrapper_script(test_command, seconds, exclusive=exclusive)
    result = sandbox.exec(
        script,
        timeout=timeout + 60,
        env=harness.graded_env(facts, extra=env),
        full_output=True,
        stdin=told.encode(),
    )
    log, total = _cut(result.stdout)
    if not log and result.stderr and not result.stdout:
        log = result.stderr[-LOG_TAIL_BYTES:]  # the wrapper itself failed: show why
    # `timeout` exits 124 (137 after -k). Its message can miss the log's tail (seen in CI under load, the log
    # ending in the command's own output), so the duration measured outside the sandbox decides as well.
    timed_out = result.timed_out or (
        result.exit_code in (124, 137) and (_TIMEOUT_LINE in log[-4096:] or result.duration_s >= seconds)
    )
    report = parse_records(result.stderr, cut=result.truncated, nonce=told.nonce or None)
    tests: dict[str, str] | None = None
    if report.runners and report.runners[0] in ("pytest", "unittest") and report.runners[0] in report.ended:
        tests = dict(report.outcomes)
        # stopped at the limit is failed, even where code under test caught the exception
        tests.update({report.test_id(t): "failed" for t in (*report.timeouts, *report.out_of_memory)})
    return TestRun(
        command=test_command,
        exit_code=None if timed_out else result.exit_code,
        timed_out=timed_out,
        log=log,
        duration_s=result.duration_s,
        tests=tests,
        log_bytes=total,
        probe=report,
        per_test_timeout_s=told.limit or None,
        tests_timed_out=[report.test_id(t) for t in report.timeouts],
        tests_out_of_memory=[report.test_id(t) for t in report.out_of_memory],
        memory_bound_bytes=told.memory,
    )


#: The share of the sandbox's memory limit one test's process may hold before the probe stops the test: under the
#: limit, so that the test fails and the run goes on instead of the whole process being killed.
MEMORY_BOUND_SHARE = 0.75


def sandbox_memory_bound(sandbox: Sandbox) -> int:
    """MEMORY_BOUND_SHARE of the sandbox's memory limit in bytes (its `memory_mib`, or its settings'), 0 where
    the sandbox does not say its limit."""
    mib = getattr(sandbox, "memory_mib", None) or getattr(
        getattr(sandbox, "settings", None), "memory_mib", None
    )
    return int(mib * 1024 * 1024 * MEMORY_BOUND_SHARE) if isinstance(mib, int) and mib > 0 else 0


_TIMEOUT_LINE = "timeout: sending signal"


def _cut(output: str) -> tuple[str, int]:
    """The kept head and tail of a test log, and the whole log's size in bytes (as far as the backend kept it)."""
    data = output.encode("utf-8", "replace")
    total = len(data)
    if total <= LOG_HEAD_BYTES + LOG_TAIL_BYTES:
        return output, total
    first = data[:LOG_HEAD_BYTES].decode("utf-8", "ignore")
    last = data[-LOG_TAIL_BYTES:].decode("utf-8", "ignore")
    cut = total - LOG_HEAD_BYTES - LOG_TAIL_BYTES
    return f"{first}\n[... bugsweep: {cut} bytes of output cut here; {total} in all ...]\n{last}", total


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


def _pathspecs() -> str:
    return " ".join(shlex.quote(p) for p in PATCH_EXCLUDES)
