"""The mirror pair: two runs of the same tests that the code under test cannot tell apart, one with a false assertion.

The code under test runs in the test runner's process, and whatever that process can read, it can act on: a
check that differs from the real run in anything observable (a canary module, a marker file, a variable) is a
check it can recognise and pass while it subverts the real run. So the regrade runs the tests twice, at the same
time, in two fresh sandboxes made from the same task state, with the change written identically into both: the
same command, environment, files (the probe's included), working directory, runner options and set of tests. One
of them, chosen at random, is the **mirror**; the other is the real run the verdict reads. In both, every test
of the baseline that has a Python function in the repository (those that failed, and those that passed but for
coroutine and generator functions) gets one more statement after its body, in the style of its own assertions
(bugsweep/grading/probe/). In the real run it passes everywhere; in the mirror it fails in one test that failed
before, chosen at random (the armed test). Only the instruction read at interpreter start-up, then kept in the
probe's memory alone, says which run is which, and holds the run's own nonce.

Two kinds of evidence come of it (`judge`):
- **The armed test's verdict in the mirror.** With a real fix it fails at the false statement. With a bogus fix it
  fails at its own assertion, earlier, exactly as in the real run: code that turns failures into passes (a patched
  report, a replaced assertion method, a forged result line, a plugin found through the garbage collector) cannot
  spare the mirror without knowing which run it is in, so the mirror reads "passed" (or the run exits 0).
- **Each body's end.** Where the statement runs in its function's outermost call, while the runner runs that test,
  the probe records "reached" with the run's nonce. A test reported passed without that record, in either run, did
  not run its body to the end: its verdict was changed after the fact (a flipped report, a swallowed assertion
  error). So code that flips at random, or in one run of the pair only (by what the kernel numbers differently in
  two sandboxes), or only the tests a partial fix did not fix, is caught whatever test is armed: in the real run
  its flipped test has no "reached"; in the mirror its armed test passes. And the armed test that fails before the
  end of its body in the mirror while the real run reports it passed shows a process that behaves differently in
  the two runs. A "reached" line without the run's nonce was written by something that is not the probe.
Any of these, and the grade is not resolved, with the reason. A mirror that could not be armed where the tests run
under pytest or unittest fails the grade closed. Tests without a function (doctests, generated tests) get no
statement (`Mirror.uninstrumented`): their verdict is the runner's report, checked as before.

The pair's command is the task's own where it is one known runner invocation (`python -m pytest ...`, `pytest ...`,
`python -m unittest ...`, optionally after `cd` and `export`: `known_runner`); otherwise (several steps, `make`,
`tox`) it is bugsweep's own (`python -m pytest <failing node ids>`, `python -m unittest <failing ids>`, from where
the baseline's runner ran), the task's own command runs as well in a third sandbox and still decides the exit code
and PASS_TO_PASS, and the failing tests must come out the same under both.

What still passes is in the README's threat model: code that reads the probe's memory (which run is the mirror, its
nonce) or drives the runner's internals (a test run under another's name), code that makes the tests' own
assertions not fail while leaving bugsweep's statement alone (a tracer that jumps over them; in a partial fix, an
assertion method neutralised for the tests it did not fix, caught only when the armed test is one of those), and
what the tests themselves cannot tell (a value equal to anything).
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from bugsweep.grading.records import TestFunction, code_of
from bugsweep.grading.runs import TestRun


class Mirror(BaseModel):
    """What the mirror pair showed (grade.json `mirror`)."""

    required: bool = False
    """The tests run under pytest or unittest (the baseline's probe saw one): without an armed mirror the grade
    fails closed."""
    armed: bool = False
    """The mirror ran with its false assertion compiled into `test`."""
    runner: str | None = None
    command: str | None = None
    """The pair's command: the task's own, or bugsweep's (`own_command`)."""
    test: str | None = None
    """The test given the false assertion (one of those that failed before, chosen at random)."""
    outcomes: dict[str, str] = Field(default_factory=dict)
    """The mirror run's outcome of each test that failed before ('missing' when not reported)."""
    instrumented: int = 0
    """How many tests had bugsweep's statement compiled after their body, in both runs: every test that failed or
    passed before and has a Python function in the repository. Each one reported passed must have run its body to
    the end (the probe's "reached" record, with the run's own nonce)."""
    uninstrumented: list[str] = Field(default_factory=list)
    """Tests that passed before and got no statement (no Python function in the repository: a doctest, a generated
    test; a coroutine or generator function, which can pass without running its body): their outcome is what the
    test process reports, as before the statement."""
    unreached: dict[str, list[str]] = Field(default_factory=dict)
    """Run ('real', 'mirror') -> its tests reported passed whose body did not run to its end (or whose function was
    not compiled with the statement)."""
    exit_code: int | None = None
    """The mirror run's exit code."""
    note: str | None = None
    """Why the mirror could not be armed, or what else it saw."""
    subverted: str | None = None
    """Why the test process's reports cannot be trusted, when they cannot."""


@dataclass
class PairPlan:
    """What the regrade's pair runs: the command, the armed test, whether the task's own command runs beside."""

    required: bool
    note: str | None = None
    runner: str | None = None
    command: str | None = None
    failing: list[str] = field(default_factory=list)
    armed: str | None = None
    code: TestFunction | None = None
    instrumented: dict[str, TestFunction] = field(default_factory=dict)
    """Test id -> its function, for every test that gets bugsweep's statement (the armed one among them)."""
    uninstrumented: list[str] = field(default_factory=list)
    own_run: bool = False
    """The pair runs bugsweep's own command: the task's command runs as well, in a sandbox of its own."""

    @property
    def ready(self) -> bool:
        return self.command is not None and self.code is not None

    def armed_instruction(self) -> dict[str, object] | None:
        if self.code is None:
            return None
        return {
            "id": self.code.raw_id,
            "file": self.code.file,
            "qualname": self.code.qualname,
            "line": self.code.line,
        }

    def inject_instruction(self) -> list[tuple[str, list[tuple[str, int]]]]:
        """Each file's functions that get the statement, with the line the test failed at before (the armed test's,
        else the first failing one's; 0 for a function whose tests passed): the same in both runs."""
        lines: dict[tuple[str, str], int] = {}
        for code in sorted(self.instrumented.values(), key=lambda c: (c.file, c.qualname, -c.line, c.raw_id)):
            lines.setdefault(code.key, code.line)
        if self.code is not None:
            lines[self.code.key] = self.code.line
        files: dict[str, list[tuple[str, int]]] = {}
        for (file, qualname), line in sorted(lines.items()):
            files.setdefault(file, []).append((qualname, line))
        return sorted(files.items())


_NAMES_RUNNER = re.compile(r"(^|[\s/;&|(])(py\.test|pytest|unittest)(\s|$|;|&|\||\))")


def plan_pair(
    before: TestRun, test_command: str, root: str = "/workspace/repo", fail_to_fail: Iterable[str] = ()
) -> PairPlan:
    """The pair for this task, from what the baseline showed: its runner, its failing tests and their functions,
    and the functions of the tests that passed (those in the repository at `root`, the sandbox's workdir). The
    task's own FAIL_TO_FAIL tests (mined: failing in both states, a module that does not import) are not among
    the failing tests it can arm."""
    runner = before.runner
    if runner not in ("pytest", "unittest"):
        named = _NAMES_RUNNER.search(test_command)
        return PairPlan(
            required=False,
            note="no test runner the probe knows (pytest, unittest) ran in the task's environment"
            + (" (the command names one: it runs in an environment of its own?)" if named else ""),
        )
    failing = sorted(before.ids("failed", "error") - set(fail_to_fail))
    if before.tests is None or not failing:
        return PairPlan(
            required=True, runner=runner, note="no test failed before by per-test results: none to mirror"
        )
    unmirrored = [t for t in failing if (code_of(before.probe, t) or _GENERATOR).kind == "gen"]
    if unmirrored:
        return PairPlan(
            required=True,
            runner=runner,
            failing=failing,
            note=f"{len(unmirrored)} test(s) that failed before have no Python test function the mirror can give an "
            f"assertion (a doctest, a collection error, a generated test, a generator function): "
            f"{', '.join(unmirrored[:5])}",
        )
    armed = secrets.choice(failing)
    code = code_of(before.probe, armed)
    armed_runner = before.probe.runner_of.get(armed, runner)
    instrumented, uninstrumented = instrumentable(before, root)
    plan = PairPlan(
        required=True,
        runner=armed_runner,
        failing=failing,
        armed=armed,
        code=code,
        instrumented=instrumented,
        uninstrumented=uninstrumented,
    )
    if known_runner(test_command) == armed_runner:
        plan.command = test_command
    else:
        plan.command = own_command(
            before,
            armed_runner,
            [t for t in failing if before.probe.runner_of.get(t, runner) == armed_runner],
        )
        plan.own_run = True
    return plan


#: What a test without a function to compile into counts as (a generator function's body need not run either).
_GENERATOR = TestFunction("", "", "", 0, "gen")


def instrumentable(before: TestRun, root: str) -> tuple[dict[str, TestFunction], list[str]]:
    """The baseline's tests that get bugsweep's statement (test id -> function), and those that passed before and
    get none. Every test that failed has its function (else there is no pair); a test that passed gets one when its
    function is in the repository and is not a coroutine or generator function (unittest calls such a function and
    drops what it returns: the test passes without its body running)."""
    inside = root.rstrip("/") + "/"
    instrumented: dict[str, TestFunction] = {}
    uninstrumented: list[str] = []
    for test_id, outcome in sorted((before.tests or {}).items()):
        if outcome not in ("passed", "failed", "error"):
            continue
        code = code_of(before.probe, test_id)
        if outcome != "passed":
            if code is not None and code.kind != "gen":
                instrumented[test_id] = code
        elif code is None or code.kind or not code.file.startswith(inside) or "/site-packages/" in code.file:
            uninstrumented.append(test_id)
        else:
            instrumented[test_id] = code
    return instrumented, uninstrumented


_PYTHON = re.compile(r"^(?:\S*/)?python(?:3(?:\.\d+)?)?$")
_PYTEST_SCRIPT = re.compile(r"^(?:\S*/)?(?:pytest|py\.test)$")
#: pytest options that run tests in other processes (pytest-xdist), or stop to debug: never in the pair's command.
_ELSEWHERE = re.compile(
    r"^(-n\S*|--numprocesses(=.*)?|-d|--dist(=.*)?|--tx(=.*)?|-f|--looponfail|--boxed|--forked|--pdb)$"
)


def known_runner(command: str) -> str | None:
    """'pytest' or 'unittest' when `command` is one runner invocation in this process (optionally after `cd DIR`
    and `export NAME=VALUE` steps, with `NAME=VALUE` before it), else None."""
    if "$(" in command or "`" in command:
        return None
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        return None
    steps: list[list[str]] = [[]]
    for word in words:
        if word in ("&&", ";"):
            steps.append([])
        elif word and set(word) <= set("|&;()<>"):
            return None
        else:
            steps[-1].append(word)
    steps = [s for s in steps if s]
    if not steps:
        return None
    for step in steps[:-1]:
        if not (
            (step[0] == "cd" and len(step) == 2)
            or (step[0] == "export" and all(re.match(r"^[A-Za-z_]\w*=", w) for w in step[1:]))
        ):
            return None
    last = steps[-1]
    while last and re.match(r"^[A-Za-z_]\w*=", last[0]):
        last = last[1:]
    if len(last) >= 3 and _PYTHON.match(last[0]) and last[1] == "-m" and last[2] in ("pytest", "unittest"):
        runner, args = last[2], last[3:]
    elif last and _PYTEST_SCRIPT.match(last[0]):
        runner, args = "pytest", last[1:]
    else:
        return None
    if runner == "pytest" and any(_ELSEWHERE.match(a) for a in args):
        return None
    return runner


def own_command(before: TestRun, runner: str, failing: list[str]) -> str:
    """bugsweep's own command for the pair: the runner the baseline showed, on the failing tests by id, from the
    folder its runner ran in (pytest's rootdir; unittest's top-level folder), with its PYTHONPATH."""
    facts = before.probe.runner_facts.get(runner, {})
    if runner == "pytest":
        where = facts.get("rootdir") or facts.get("cwd")
        ids = [before.probe.raw_ids.get(t, t) for t in failing]
        run = "python -m pytest -q " + " ".join(shlex.quote(i) for i in ids)
    else:
        where = facts.get("top") or facts.get("cwd")
        run = "python -m unittest " + " ".join(shlex.quote(i) for i in failing)
    steps = [f"cd {shlex.quote(where)}"] if where else []
    if facts.get("pythonpath"):
        steps.append(f"export PYTHONPATH={shlex.quote(str(facts['pythonpath']))}")
    return " && ".join([*steps, run])


def judge(
    plan: PairPlan, real: TestRun | None, mirror: TestRun | None, task: TestRun | None = None
) -> Mirror:
    """What the pair shows: armed or not (and why), and whether the test process changed verdicts.

    `real` and `mirror` are the pair's runs, their "reached" records read with each run's own nonce; `task` the
    task's own command's run where it ran apart (`own_run`)."""
    found = Mirror(
        required=plan.required,
        runner=plan.runner,
        command=plan.command,
        test=plan.armed,
        note=plan.note,
        instrumented=len(plan.instrumented),
        uninstrumented=list(plan.uninstrumented),
    )
    if not plan.ready or real is None or mirror is None or plan.code is None or plan.armed is None:
        return found
    found.exit_code = mirror.exit_code
    found.outcomes = {t: (mirror.tests or {}).get(t, "missing") for t in plan.failing}
    why = _not_armed(plan, real, mirror)
    if why:
        found.note = why
        return found
    found.armed = True
    outcome = found.outcomes[plan.armed]
    said = (real.tests or {}).get(plan.armed, "missing")
    subverted: list[str] = []
    if outcome == "passed" or (outcome in ("skipped", "missing") and said == "passed"):
        subverted.append(
            f"the test process changes verdicts: in the mirror run, {plan.armed} (given a false assertion after its "
            f"body) was reported {outcome}"
        )
    elif mirror.exit_code == 0:
        subverted.append(
            f"the test process changes how it ends: the mirror run exited 0 although {plan.armed} failed there by "
            "construction"
        )
    for name, run in (("real", real), ("mirror", mirror)):
        unreached = unreached_tests(plan, run)
        if unreached:
            found.unreached[name] = unreached
            where = "" if name == "real" else " in the mirror run"
            bodies = "its body" if len(unreached) == 1 else "their bodies"
            subverted.append(
                f"the test process reports {_some(unreached)} passed{where} but {bodies} did not run to the end"
            )
        if run.probe.forged:
            subverted.append(
                f"something in the test process writes the probe's records: {run.probe.forged} 'reached' record(s) "
                f"in the {name} run without that run's nonce"
            )
        if (
            name == "real"
            and said == "passed"
            and outcome != "passed"
            and not _reached(plan, mirror, plan.armed)
        ):
            subverted.append(
                f"{plan.armed} fails before the end of its body in the mirror run but passes in the real run: the "
                "test process behaves differently in two runs it should not tell apart"
            )
    if task is not None:
        differ = [
            t
            for t in plan.failing
            if (task.tests or {}).get(t) == "passed" and (real.tests or {}).get(t, "missing") != "passed"
        ]
        if differ:
            subverted.append(
                "the tests report differently under bugsweep's own runner: "
                + ", ".join(f"{t} passed under the task's command but is {(real.tests or {}).get(t, 'missing')} under "
                            f"`{plan.command}`" for t in differ[:3])
            )  # fmt: skip
    found.subverted = "; ".join(subverted) or None
    return found


def _some(tests: list[str]) -> str:
    shown = ", ".join(tests[:3])
    return shown + (f" and {len(tests) - 3} more" if len(tests) > 3 else "")


def _reached(plan: PairPlan, run: TestRun, test_id: str) -> bool:
    """The run's probe recorded, with the run's nonce, that `test_id`'s body ran to the end of its function."""
    code = plan.instrumented.get(test_id)
    return code is not None and (code.raw_id, code.file, code.qualname) in run.probe.reached


def unreached_tests(plan: PairPlan, run: TestRun) -> list[str]:
    """The run's tests reported passed that have bugsweep's statement and did not run it: their body did not run to
    the end (or their function was not compiled with it)."""
    return sorted(
        t
        for t, outcome in (run.tests or {}).items()
        if outcome == "passed" and t in plan.instrumented and not _reached(plan, run, t)
    )


def _not_armed(plan: PairPlan, real: TestRun, mirror: TestRun) -> str | None:
    assert plan.code is not None
    for name, run in (("mirror", mirror), ("real", real)):
        if run.timed_out:
            return f"not armed: the {name} run timed out"
        if not run.probe.hello:
            return f"not armed: the probe did not start in the {name} run's test process"
        if run.probe.cut:
            return f"not armed: the probe's records of the {name} run were cut"
        if plan.runner not in run.probe.runners:
            seen = ", ".join(run.probe.runners) or "none"
            return f"not armed: the {name} run's probe did not see {plan.runner} run (it saw: {seen})"
        if plan.code.key in run.probe.missed or not any(
            (f, q) == plan.code.key for f, q, _ in run.probe.injected
        ):
            where = f"{plan.code.qualname} in {plan.code.file}"
            return f"not armed: the {name} run did not compile the false assertion into {where}"
    return None
