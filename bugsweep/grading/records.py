"""What a test run says about itself: the probe's records, and the runner's own lines in its log.

The code under test runs in the test runner's process, so it can change what the runner reports. What is read
here is what that process wrote: the probe's records (bugsweep/grading/probe/, one JSON list a line on the
command's stderr) and the runner's summary and failure lines in its log (stdout). None of it is trusted alone;
the grade checks them against each other (bugsweep.grading.verdict) and against the mirror run, which the test
process cannot tell from the real one (bugsweep.grading.mirror).

Per-test ids are those pytest's JUnit XML gave before the probe recorded them (`junit_id`: the XML's `file`,
`classname` and `name`, put together as bugsweep always has; the probe takes the names from the task's own pytest)
so that mined tasks' FAIL_TO_PASS and PASS_TO_PASS lists keep matching; unittest's ids are `TestCase.id()`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

#: A unittest record of a module that could not be loaded: not a test (after a fix the module's own tests run).
_FAILED_LOAD = "unittest.loader._FailedTest."
#: unittest's outcomes: the worst recorded wins (a "passed" line added later changes nothing).
_RANK = {"error": 4, "failed": 3, "passed": 2, "skipped": 1}
#: pytest's outcomes, as its JUnit XML ranks what one test case holds: a failure, else an error, else skipped.
_JUNIT_RANK = {"failed": 4, "error": 3, "skipped": 2, "passed": 1}


@dataclass
class TestFunction:
    """A test's function, as the baseline's probe saw it (what the pair compiles bugsweep's statement into)."""

    __test__ = False  # not a pytest class

    raw_id: str
    """The test as its runner names it (pytest's node id, unittest's id)."""
    file: str
    qualname: str
    line: int
    """The line of the function the test failed at (0: it passed, or failed outside the function itself)."""
    kind: str = ""
    """'async' (a coroutine function), 'gen' (a generator function) or '' (a plain one)."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.file, self.qualname)


@dataclass
class ProbeReport:
    """What the probe recorded during one run."""

    hello: int = 0
    """Processes that read bugsweep's instruction (the probe was there and armed with it)."""
    runners: list[str] = field(default_factory=list)
    """The test runners that ran (the first one recorded its tests)."""
    ended: list[str] = field(default_factory=list)
    """The runners that finished (pytest's session, unittest's outermost run): a runner killed half way gives no
    per-test results, as pytest's JUnit XML was never written then."""
    runner_facts: dict[str, dict[str, str | None]] = field(default_factory=dict)
    """What each runner said about itself: its working directory, pytest's rootdir, unittest's top-level folder."""
    errors: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    """Per-test outcomes (test id -> the worst outcome recorded for it)."""
    raw_ids: dict[str, str] = field(default_factory=dict)
    """Test id -> the id its runner gave it (pytest's node id), where they differ."""
    runner_of: dict[str, str] = field(default_factory=dict)
    """Test id -> 'pytest' or 'unittest'."""
    load_errors: set[str] = field(default_factory=set)
    """Modules unittest could not load: not tests, but its summary counts each as an error."""
    timeouts: list[str] = field(default_factory=list)
    """Tests stopped at the per-test time limit (pytest node ids, unittest ids), recorded as the alarm went off."""
    out_of_memory: list[str] = field(default_factory=list)
    """Tests stopped at the per-test memory bound (runner ids), recorded as they were stopped."""
    hard_stopped: list[str] = field(default_factory=list)
    """Tests that went on past the per-test time limit though told to stop each second, until the probe ended their
    process (runner ids)."""
    running: str | None = None
    """The test whose start was recorded and whose end was not (pytest: its setup reported and its teardown not;
    unittest: started and not stopped), by runner id: the one running when the process ended, where it ended half
    way."""
    memory_heavy: list[str] = field(default_factory=list)
    """Tests whose process held half the memory bound or more, in the order they did (runner ids): the last one was
    running when a process killed for its memory was."""
    code: dict[str, TestFunction] = field(default_factory=dict)
    """Runner's test id -> its function (every test that ran, in a run without an instruction to compile any)."""
    injected: list[tuple[str, str, str]] = field(default_factory=list)
    """(file, qualname, style) of each function compiled with bugsweep's statement."""
    missed: list[tuple[str, str]] = field(default_factory=list)
    """(file, qualname) of the functions the probe was told of and could not find when their file was compiled."""
    reached: set[tuple[str, str, str]] = field(default_factory=set)
    """(runner's test id, file, qualname): the test's body ran to its end (bugsweep's statement ran in its function's
    outermost call while the runner ran that test), by records that hold this run's nonce."""
    forged: int = 0
    """"reached" records without this run's nonce: written by something that is not the probe."""
    cut: bool = False
    """The records were cut (more than the backend keeps): what is missing cannot be known."""

    def test_id(self, raw: str) -> str:
        """The id of a test the runner names `raw` (pytest node ids map to their JUnit-style ids)."""
        for test_id, known in self.raw_ids.items():
            if known == raw:
                return test_id
        return raw


def junit_id(file: str, classname: str, name: str) -> str:
    """A pytest test's id from its JUnit XML attributes (junit_family=xunit1): `file::Class::name`."""
    if file:
        module = file[:-3].replace("/", ".") if file.endswith(".py") else file
        rest = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
        return "::".join([file, *(rest.split(".") if rest else []), name])
    return f"{classname}::{name}" if classname else name


def parse_records(text: str, *, cut: bool = False, nonce: str | None = None) -> ProbeReport:
    """The probe's records from a run's stderr. Lines that are not records (anything the process wrote there) are
    left out; a record cannot be taken back, and the worst outcome recorded for a test wins. "reached" records count
    only with the run's `nonce` (the others are counted in `forged`)."""
    report = ProbeReport(cut=cut)
    pytest_kinds: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line.startswith("["):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (
            not isinstance(record, list)
            or not record
            or not all(isinstance(x, str | int | dict) for x in record)
        ):
            continue
        kind, values = record[0], record[1:]
        try:
            _take(report, pytest_kinds, kind, values, nonce)
        except (ValueError, TypeError, IndexError):
            continue
    for test_id, kinds in pytest_kinds.items():
        report.outcomes[test_id] = max(kinds, key=lambda k: _JUNIT_RANK[k])
    return report


def _take(
    report: ProbeReport, pytest_kinds: dict[str, set[str]], kind: object, values: list, nonce: str | None
) -> None:
    if kind == "hello":
        report.hello += 1
    elif kind == "runner":
        name = str(values[0])
        report.runners.append(name)
        facts = values[1] if len(values) > 1 and isinstance(values[1], dict) else {}
        report.runner_facts.setdefault(name, {k: None if v is None else str(v) for k, v in facts.items()})
    elif kind == "end":
        report.ended.append(str(values[0]))
    elif kind == "probe-error":
        report.errors.append(str(values[0]))
    elif kind == "memory":
        test, stopped = str(values[0]), int(values[2])
        seen = report.out_of_memory if stopped else report.memory_heavy
        if test not in seen:
            seen.append(test)
    elif kind == "timeout":
        if str(values[0]) not in report.timeouts:
            report.timeouts.append(str(values[0]))
    elif kind == "hard-stop":
        if str(values[0]) not in report.hard_stopped:
            report.hard_stopped.append(str(values[0]))
    elif kind == "pt":  # a phase of a pytest test, as JUnit XML takes it
        when, outcome, xfail, nodeid, file, classname, name = (str(v) for v in values[:7])
        if when == "setup":
            report.running = nodeid
        elif when == "teardown" and report.running == nodeid:
            report.running = None
        test_id = junit_id(file, classname, name)
        if test_id != nodeid:
            report.raw_ids[test_id] = nodeid
        report.runner_of[test_id] = "pytest"
        junit = _junit_outcome(when, outcome, xfail == "1")
        if junit:
            pytest_kinds.setdefault(test_id, set()).add(junit)
    elif kind == "pc":  # a collection that failed or was skipped
        outcome, nodeid, file, classname, name = (str(v) for v in values[:5])
        test_id = junit_id(file, classname, name)
        if test_id != nodeid:
            report.raw_ids[test_id] = nodeid
        report.runner_of[test_id] = "pytest"
        pytest_kinds.setdefault(test_id, set()).add("error" if outcome == "failed" else "skipped")
    elif kind == "ut":
        outcome, test_id = str(values[0]), str(values[1])
        if test_id.startswith(_FAILED_LOAD):
            report.load_errors.add(test_id[len(_FAILED_LOAD) :])
        elif outcome in _RANK and test_id and _RANK[outcome] > _RANK.get(report.outcomes.get(test_id, ""), 0):
            report.outcomes[test_id] = outcome
            report.runner_of[test_id] = "unittest"
    elif kind == "ut-start":
        report.running = str(values[0])
    elif kind == "ut-stop":
        if report.running == str(values[0]):
            report.running = None
    elif kind == "code":
        raw, file, qualname, line = str(values[0]), str(values[1]), str(values[2]), int(values[3])
        flavour = str(values[4]) if len(values) > 4 else ""
        known = report.code.get(raw)
        if known is None or (line and not known.line):  # where it failed, once known, is kept
            report.code[raw] = TestFunction(raw, file, qualname, line, flavour)
    elif kind == "inj":
        report.injected.append((str(values[0]), str(values[1]), str(values[2])))
    elif kind == "inj-miss":
        report.missed.append((str(values[0]), str(values[1])))
    elif kind == "reached":
        raw, file, qualname, said = (str(v) for v in values[:4])
        if nonce and said == nonce:
            report.reached.add((raw, file, qualname))
        else:
            report.forged += 1


def _junit_outcome(when: str, outcome: str, xfail: bool) -> str | None:
    """What pytest's JUnit XML makes of one report: a passing call is a pass (setup and teardown passes are not
    recorded), a failing call a failure (an xpass(strict) is "skipped"), a failing setup or teardown an error."""
    if outcome == "passed":
        return "passed" if when == "call" else None
    if outcome == "failed":
        if when == "call":
            return "skipped" if xfail else "failed"
        return "error"
    return "skipped" if outcome == "skipped" else None


def code_of(report: ProbeReport, test_id: str) -> TestFunction | None:
    """The function of a test (recorded under the runner's own id)."""
    return report.code.get(report.raw_ids.get(test_id, test_id))


# -- the runner's own lines -------------------------------------------------------------------------------------

_UNITTEST_END = re.compile(
    r"^Ran (\d+) tests? in [\d.]+s\s*\n\s*\n(OK|FAILED)\b(?: \((.*)\))?\s*$", re.MULTILINE
)
_PYTEST_END = re.compile(
    r"^=*\s*((?:\d+ (?:passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?|rerun)(?:, )?)+)"
    r"(?: in [\d.]+s)",
    re.MULTILINE,
)
#: unittest's list of failures: `FAIL: test_add (test_calc.CalcTest.test_add)` (3.11+; before: `(test_calc.CalcTest)`),
#: a subtest's with its parameters after.
_UNITTEST_LISTED = re.compile(r"^(FAIL|ERROR): (\S+) \(([^)\s]+)\)", re.MULTILINE)


def summary_failures(log: str, runner: str | None) -> int | None:
    """How many tests failed (failures and errors) by the runner's own last summary line; None without one."""
    if runner in (None, "unittest"):
        ends = _UNITTEST_END.findall(log)
        if ends:
            detail = ends[-1][2]
            counts = dict(re.findall(r"(\w+(?: \w+)?)=(\d+)", detail or ""))
            return sum(int(counts.get(k, 0)) for k in ("failures", "errors", "unexpected successes"))
    if runner in (None, "pytest"):
        lines = _PYTEST_END.findall(log)
        if lines:
            return sum(int(n) for n, _ in re.findall(r"(\d+) (failed|errors?)", lines[-1]))
    return None


def listed_failures(log: str, runner: str | None, report: ProbeReport) -> set[str]:
    """The tests the runner's own log lists as failed (unittest's `FAIL:`/`ERROR:` lines; pytest's short summary
    `FAILED id`/`ERROR id` lines, looked up for the tests the probe has ids for)."""
    listed: set[str] = set()
    if runner == "unittest":
        for _, method, where in _UNITTEST_LISTED.findall(log):
            test_id = where if where.endswith("." + method) else f"{where}.{method}"
            if not test_id.startswith(_FAILED_LOAD):
                listed.add(test_id)
    elif runner == "pytest":
        lines = {line.rstrip() for line in log.splitlines() if line.startswith(("FAILED ", "ERROR "))}
        for test_id in report.outcomes:
            raw = report.raw_ids.get(test_id, test_id)
            for word in ("FAILED", "ERROR"):
                said = f"{word} {raw}"
                if said in lines or any(line.startswith(said + " - ") for line in lines):
                    listed.add(test_id)
    return listed
