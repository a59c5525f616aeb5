"""The probe and the mirror's parts on their own: in real pytest and unittest processes on this host, started by
bugsweep's own wrapper script with its instruction on stdin, the probe loaded by its `.pth` line from a
site-packages (a virtual environment made for this module); and the pure parts (ids, the false assertion's place and
style, the command forms, the summary lines, the verdict's rules). The sandboxed runs are in tests/test_mirror.py and
tests/test_mirror_pair.py.
"""

from __future__ import annotations

import ast
import json
import os
import secrets
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest

from bugsweep.grading import TestRun, grade, harness
from bugsweep.grading.mirror import Mirror, PairPlan, judge, known_runner, plan_pair
from bugsweep.grading.probe.bugsweep_probe_inject import inject
from bugsweep.grading.records import junit_id, listed_failures, parse_records, summary_failures
from bugsweep.grading.runs import run_tests
from bugsweep.grading.testfiles import import_roots, protected_reason
from bugsweep.mining.interpreters import machine_interpreters
from bugsweep.sandbox.base import ExecResult


def _install_probe(root: Path) -> None:
    """The probe's files in the site-packages of the virtual environment at `root`, as a graded run has them."""
    site = subprocess.run(
        [root / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    for name, text in harness.probe_files().items():
        (Path(site) / name).write_text(text.replace("{SITE}", site))


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment over this interpreter's packages (pytest), with the probe in its site-packages."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(root)], check=True
    )
    _install_probe(root)
    return root


def _run(
    venv: Path, work: Path, command: str, instruction: harness.Instruction | None = None, seconds: int = 120
) -> tuple[str, str]:
    """(stdout, stderr) of `command` under the wrapper script (its timeout `seconds`), as a graded run has it."""
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(work),
        **harness.graded_env(harness.EnvFacts()),
    }
    script = harness.wrapper_script(command, seconds, exclusive=instruction is not None)
    told = instruction or harness.Instruction()
    done = subprocess.run(
        ["bash", "-c", script],
        input=told.encode(),
        capture_output=True,
        text=True,
        cwd=work,
        env=env,
        timeout=300,
    )
    return done.stdout, done.stderr


INNER = (
    "import subprocess, sys, unittest\n\n\n"
    "class Inner(unittest.TestCase):\n    def test_inner_fails(self):\n        self.fail('on purpose')\n\n\n"
    "class Outer(unittest.TestCase):\n"
    "    def test_runs_a_suite_in_process(self):\n"
    "        suite = unittest.defaultTestLoader.loadTestsFromTestCase(Inner)\n"
    "        self.assertFalse(unittest.TextTestRunner(stream=open('/dev/null', 'w')).run(suite).wasSuccessful())\n\n"
    "    def test_runs_a_runner_in_a_subprocess(self):\n"
    "        out = subprocess.run([sys.executable, '-m', 'unittest', 'test_inner.Inner'], capture_output=True)\n"
    "        self.assertEqual(out.returncode, 1)\n"
)


def test_the_probe_records_the_outer_unittest_run_only(venv: Path, tmp_path: Path) -> None:
    """Tests of test tools run suites of their own, in-process or in a subprocess: only the outer run counts; the
    subprocess's Python gets neither the instruction nor the records' descriptor."""
    (tmp_path / "test_inner.py").write_text(INNER)
    out, err = _run(venv, tmp_path, "python -m unittest test_inner.Outer")
    report = parse_records(err)
    assert report.hello == 1 and report.runners == ["unittest"], err
    assert report.outcomes == {
        "test_inner.Outer.test_runs_a_suite_in_process": "passed",
        "test_inner.Outer.test_runs_a_runner_in_a_subprocess": "passed",
    }
    assert "OK" in out


MANY = {
    "tests/__init__.py": "",
    "tests/base.py": "class Shared:\n    def test_inherited(self):\n        assert self.value == 1\n",
    "tests/test_many.py": (
        "import unittest\n\nimport pytest\n\nfrom tests.base import Shared\n\n\n"
        "@pytest.mark.parametrize('x', ['a b', 'c[d]', '\\x1b[0m', 'e::f'])\ndef test_params(x):\n    assert x != 'a b'\n\n\n"
        "class TestOuter:\n    class TestInner:\n        def test_nested(self):\n            assert False\n\n\n"
        "class TestShared(Shared):\n    value = 2\n\n\n"
        "class Case(unittest.TestCase):\n    def test_case(self):\n        self.assertEqual(1, 2)\n\n"
        "    @unittest.skip('no')\n    def test_skipped(self):\n        pass\n\n\n"
        "@pytest.mark.xfail\ndef test_xfail():\n    assert False\n\n\n"
        "@pytest.mark.xfail(strict=True)\ndef test_xpass_strict():\n    pass\n\n\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('setup')\n\n\n"
        "def test_setup_error(broken):\n    pass\n\n\n"
        "@pytest.fixture\ndef bad_teardown():\n    yield\n    raise RuntimeError('teardown')\n\n\n"
        "def test_teardown_error(bad_teardown):\n    pass\n"
    ),
    "tests/test_broken.py": "import not_a_module_anywhere\n",
}


def parse_junit(xml_text: str) -> dict[str, str]:
    """pytest node id -> outcome from pytest's JUnit XML (junit_family=xunit1): how bugsweep read them before the
    probe recorded them, kept here as the reference the probe's ids must match."""
    outcomes: dict[str, str] = {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        node = junit_id(case.get("file") or "", case.get("classname", ""), case.get("name", ""))
        if case.find("failure") is not None:
            outcomes[node] = "failed"
        elif case.find("error") is not None:
            outcomes[node] = "error"
        elif case.find("skipped") is not None:
            outcomes[node] = "skipped"
        else:
            outcomes[node] = "passed"
    return outcomes


def test_the_probes_pytest_ids_and_outcomes_are_those_of_the_junit_xml(venv: Path, tmp_path: Path) -> None:
    """Mined tasks name their tests as pytest's JUnit XML did: the probe's records give the same ids and outcomes,
    for parameters with spaces, brackets, escapes and '::', nested classes, a method inherited from another file,
    unittest classes, skips, xfails, setup and teardown errors, and a module that does not import."""
    for rel, text in MANY.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    xml = tmp_path / "junit.xml"
    out, err = _run(
        venv,
        tmp_path,
        f"python -m pytest -q --continue-on-collection-errors --junitxml={xml} -o junit_family=xunit1 tests",
    )
    expected = parse_junit(xml.read_text())
    report = parse_records(err)
    assert report.runners == ["pytest"] and len(expected) == 13, out
    assert report.outcomes == expected
    assert expected["tests/base.py::test_inherited"] == "failed", "JUnit names an inherited test by its file"
    assert report.raw_ids["tests/base.py::test_inherited"] == "tests/test_many.py::TestShared::test_inherited"
    assert summary_failures(out, "pytest") == sum(o in ("failed", "error") for o in expected.values())
    listed = listed_failures(out, "pytest", report)
    assert listed == {t for t, o in expected.items() if o in ("failed", "error")}


def test_the_probes_ids_are_the_junit_xml_s_under_a_pytest_older_than_6_1(tmp_path: Path) -> None:
    """pytest before 6.1 wrote its JUnit XML with py.xml, whose escaped names are markup objects, not text: the
    probe named every test of sh's 2020 test.py "<py._xmlgen.raw object at 0x...>" (a commit validated with the
    releases of its time, issue 37's held-out-36). Its ids are again those of that pytest's JUnit XML. Real pytest
    6.0.2 from the package index, on an older Python of this machine."""
    older = [path for minor, path in sorted(machine_interpreters().items()) if minor in (8, 9)]
    if not older:
        pytest.skip("no Python 3.8 or 3.9 on this machine (pytest 6.0 does not run on newer ones)")
    root = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "--python", older[0], str(root)], check=True)
    subprocess.run(["uv", "pip", "install", "-q", "--python", str(root / "bin" / "python"), "pytest==6.0.2"],
                   check=True)  # fmt: skip
    _install_probe(root)
    work = tmp_path / "work"
    (work / "tests").mkdir(parents=True)
    (work / "tests" / "test_old.py").write_text(
        "import unittest\n\nimport pytest\n\n\n"
        "class ExecutionContextTests(unittest.TestCase):\n"
        "    def test_no_interfere1(self):\n        pass\n\n    def test_no_interfere2(self):\n        self.fail()\n\n\n"
        "@pytest.mark.parametrize('value', ['a&b', '<tag>', 'say \"hi\"', \"it's\"])\n"
        "def test_escaped(value):\n    assert value != 'a&b'\n"
    )
    xml = work / "junit.xml"
    out, _err = _run(root, work, f"python -m pytest -q --junitxml={xml} -o junit_family=xunit1 tests")
    expected = parse_junit(xml.read_text())
    report = parse_records(_err)
    assert len(expected) == 6 and "2 failed, 4 passed" in out, out
    assert report.outcomes == expected
    assert report.outcomes["tests/test_old.py::ExecutionContextTests::test_no_interfere2"] == "failed"
    assert report.outcomes["tests/test_old.py::test_escaped[a&b]"] == "failed"


EATS = """import unittest


def fill(out):
    while True:  # an endless loop filling a list, as an endless generator's consumer does
        out.append(" " * 1000)


def test_eats():
    fill([])


def test_next():
    assert sum(range(10)) == 45


class T(unittest.TestCase):
    def test_eats(self):
        fill([])

    def test_next(self):
        self.assertEqual(sum(range(10)), 45)
"""


@pytest.mark.parametrize("runner", ["unittest", "pytest"])
def test_a_test_past_the_memory_bound_fails_and_the_run_goes_on(
    runner: str, venv: Path, tmp_path: Path
) -> None:
    """The probe stops a test whose process grows past the instruction's memory bound (as at the time limit): the
    test fails, the one after it passes, and the records name the test, at half the bound and where stopped."""
    (tmp_path / "test_eats.py").write_text(EATS)
    command = (
        "python -m unittest test_eats.T"
        if runner == "unittest"
        else "python -m pytest -q test_eats.py::test_eats test_eats.py::test_next"
    )
    out, err = _run(venv, tmp_path, command, harness.Instruction(memory=160 << 20))
    report = parse_records(err)
    eats, after = (
        ("test_eats.T.test_eats", "test_eats.T.test_next")
        if runner == "unittest"
        else ("test_eats.py::test_eats", "test_eats.py::test_next")
    )
    assert report.ended == [runner], out
    assert report.outcomes[report.test_id(eats)] in ("failed", "error") and report.outcomes[after] == "passed"
    assert report.out_of_memory == report.memory_heavy == [eats]
    assert "grew past the per-test memory bound of 160 MiB" in out


TRACED = """import sys, threading, unittest


def tracer(frame, event, arg):  # a trace function, as coverage's (pytest-cov, `coverage run`) is
    return tracer


sys.settrace(tracer)
threading.settrace(tracer)


def add(a, b):
    return a + b


def test_one():
    assert add(1, 2) == 3


def test_two():
    assert add(2, 2) == 4


class T(unittest.TestCase):
    def test_one(self):
        self.assertEqual(add(1, 2), 3)

    def test_two(self):
        self.assertEqual(add(2, 2), 4)
"""


@pytest.mark.parametrize("runner", ["unittest", "pytest"])
def test_tests_under_a_trace_function_run_to_the_end_with_the_memory_bound(
    runner: str, venv: Path, tmp_path: Path
) -> None:
    """Tests run under a trace function, as with coverage on (zipp's runs: pytest-enabler turns pytest-cov on), with
    the memory bound and the time limit: every test runs and the runner ends. On CPython 3.11 the probe's memory
    bound, taking back an interrupt it never sent after each test's phase (PyThreadState_SetAsyncExc(id, NULL)),
    left the eval breaker set for good, and the next Python call under the tracer looped at its first line until the
    run's timeout: no test after the first, no results. (Other Pythons never looped: there this test passes either
    way.)"""
    (tmp_path / "test_traced.py").write_text(TRACED)
    command = (
        "python -m unittest test_traced.T" if runner == "unittest" else "python -m pytest -q test_traced.py"
    )
    out, err = _run(venv, tmp_path, command, harness.Instruction(limit=30, memory=512 << 20), seconds=30)
    report = parse_records(err)
    assert report.ended == [runner], out
    ids = (
        ["test_traced.T.test_one", "test_traced.T.test_two"]
        if runner == "unittest"
        else ["test_traced.py::test_one", "test_traced.py::test_two"]
    )
    assert {t: report.outcomes.get(report.test_id(t)) for t in ids} == dict.fromkeys(ids, "passed")


ORACLES = """import sys, threading, types, unittest

import bugsweep_probe
from calc import add


class T(unittest.TestCase):
    def test_add(self):
        seen = []
        seen.append(bugsweep_probe.expect())
        seen.append(bugsweep_probe.expect_args("assertEqual"))
        me = types.FunctionType(T.test_add.__code__, globals())
        if not getattr(T, "inner", False):
            T.inner = True
            try:
                me(self)
                seen.append("nested call passed")
            except AssertionError as exc:
                seen.append("nested call failed: %s" % exc)
            box = []
            thread = threading.Thread(target=lambda: box.append(bugsweep_probe.expect()))
            thread.start()
            thread.join()
            seen.append(box)
            print("\\nSEEN", seen, flush=True)
        self.assertEqual(add(2, 3), 5)
"""


@pytest.mark.parametrize("runner", ["unittest", "pytest"])
def test_the_mirror_cannot_be_asked_from_inside(runner: str, venv: Path, tmp_path: Path) -> None:
    """In the mirror, with a fix, the armed test fails at its extra assertion; but what its own code can ask the
    probe (its functions called directly, the test's function run again nested or from another thread) answers as
    in the real run. The two runs' records differ only in that test's outcome."""
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "test_o.py").write_text(ORACLES)
    armed = {"file": str(tmp_path / "test_o.py"), "qualname": "T.test_add", "line": 0,
             "id": "test_o.T.test_add" if runner == "unittest" else "test_o.py::T::test_add"}  # fmt: skip
    runs, nonces = {}, {False: "a" * 32, True: "b" * 32}
    for mirror in (False, True):
        told = harness.Instruction(armed=armed, mirror=mirror, nonce=nonces[mirror])
        runs[mirror] = _run(venv, tmp_path, "python -m pytest -s test_o.py" if runner == "pytest" else
                            "python -m unittest test_o", told)  # fmt: skip
    (real_out, real_err), (mirror_out, mirror_err) = runs[False], runs[True]
    seen = [line for line in real_out.splitlines() if line.startswith("SEEN")]
    assert seen and seen == [line for line in mirror_out.splitlines() if line.startswith("SEEN")], mirror_out
    assert len(seen) == 1, "the test ran once, and once more nested (which prints nothing)"
    assert "nested call passed" in seen[0] and "[True]" in seen[0]
    real, mirrored = (
        parse_records(real_err, nonce=nonces[False]),
        parse_records(mirror_err, nonce=nonces[True]),
    )
    test_id = next(iter(real.outcomes))
    assert real.outcomes == {test_id: "passed"} and mirrored.outcomes == {test_id: "failed"}
    assert real.injected == mirrored.injected == [(armed["file"], "T.test_add", "assertEqual")]
    assert "1 != 2" in mirror_out
    reached = {(armed["id"], armed["file"], "T.test_add")}
    assert real.reached == mirrored.reached == reached, "once each: not the nested call, not the other thread"
    assert real_err.count('"reached"') == mirror_err.count('"reached"') == 1
    assert parse_records(real_err, nonce=nonces[True]).reached == set(), (
        "the other run's nonce does not count"
    )


class _Host:
    """`run_tests`' sandbox for a folder of this host: bugsweep's wrapper under bash, the venv first on PATH (real
    pytest and unittest processes, no sandbox: the sandboxed pair is in tests/test_mirror*.py)."""

    def __init__(self, venv: Path, work: Path) -> None:
        self.venv, self.workdir = venv, str(work)

    def exec(
        self, script: str, *, timeout: float, env: dict[str, str], full_output: bool, stdin: str
    ) -> ExecResult:
        started = time.monotonic()
        done = subprocess.run(
            ["bash", "-c", script], input=stdin, capture_output=True, text=True, cwd=self.workdir, timeout=timeout,
            env={"PATH": f"{self.venv / 'bin'}:/usr/bin:/bin", "HOME": self.workdir, **env},
        )  # fmt: skip
        return ExecResult(done.returncode, done.stdout, done.stderr, duration_s=time.monotonic() - started)


_PROBED = harness.EnvFacts(site_packages="(the venv's)", probe=True)


def _host_run(host: _Host, command: str, told: harness.Instruction | None = None) -> TestRun:
    return run_tests(host, command, timeout=120, facts=_PROBED, instruction=told)  # type: ignore[arg-type]


def _pair(
    host: _Host,
    before: TestRun,
    command: str,
    *,
    armed: str,
    setting: Callable[[str], None] = lambda run: None,
) -> tuple[PairPlan, Mirror, dict[str, TestRun]]:
    """The regrade's pair on this host, one run after the other (`setting` prepares the folder for each), the armed
    test chosen by the test; judged as the regrade judges it."""
    with mock.patch("bugsweep.grading.mirror.secrets.choice", lambda tests: armed):
        plan = plan_pair(before, command, root=host.workdir)
    runs = {}
    for name in ("mirror", "real"):
        setting(name)
        told = harness.Instruction(
            armed=plan.armed_instruction(), inject=plan.inject_instruction(), mirror=name == "mirror",
            nonce=secrets.token_hex(16),
        )  # fmt: skip
        runs[name] = _host_run(host, plan.command or "", told)
    return plan, judge(plan, runs["real"], runs["mirror"]), runs


CALC_TWO_BUGS = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
CALC_FIXED = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TWO_FAILING = {
    "pytest": (
        "from calc import add, mul, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_sub():\n    assert sub(5, 3) == 2\n\n\ndef test_kept():\n    assert mul(2, 3) == 6\n"
    ),
    "unittest": (
        "import unittest\n\nfrom calc import add, mul, sub\n\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_sub(self):\n        self.assertEqual(sub(5, 3), 2)\n\n"
        "    def test_kept(self):\n        self.assertTrue(mul(2, 3) == 6)\n"
    ),
}
COMMANDS = {
    "pytest": "python -m pytest -q -p no:randomly test_calc.py",
    "unittest": "python -m unittest -v test_calc",
}
#: Code under test that reports the failures `_flip(test name)` picks as passes: pytest, a plugin found through the
#: garbage collector; unittest, each test method wrapped to swallow its AssertionError.
FLIP = {
    "pytest": (
        "\nimport gc, pytest\n\n\nclass _Flip:\n    @pytest.hookimpl(hookwrapper=True)\n"
        "    def pytest_runtest_makereport(self, item, call):\n        rep = (yield).get_result()\n"
        "        if rep.failed and _flip(item.name):\n            rep.outcome, rep.longrepr = 'passed', None\n\n\n"
        "for _o in gc.get_objects():\n    if type(_o).__name__ == 'Config' and hasattr(_o, 'pluginmanager'):\n"
        "        _o.pluginmanager.register(_Flip(), 'calc-helper')\n        break\n"
    ),
    "unittest": (
        "\nimport unittest\n\n_run0 = unittest.TestCase.run\n\n\ndef _run(self, result=None):\n"
        "    name = self._testMethodName\n    fn = getattr(self, name)\n\n    def quiet(*a):\n        try:\n"
        "            return fn(*a)\n        except AssertionError:\n            if not _flip(name):\n                raise\n\n"
        "    setattr(self, name, quiet)\n    return _run0(self, result)\n\n\nunittest.TestCase.run = _run\n"
    ),
}


@pytest.fixture(scope="module")
def two_bugs(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[_Host, TestRun]]:
    """Runner -> a folder with calc.py's two bugs, a test of each and one that passes, and the baseline's run there
    (made once; each test then writes its own calc.py: the change)."""
    tasks = {}
    for runner in COMMANDS:
        work = tmp_path_factory.mktemp(runner)
        (work / "calc.py").write_text(CALC_TWO_BUGS)
        (work / "test_calc.py").write_text(TWO_FAILING[runner])
        host = _Host(venv, work)
        before = _host_run(host, COMMANDS[runner])
        assert len(before.ids("failed")) == 2 and len(before.ids("passed")) == 1, before.log
        tasks[runner] = (host, before)
    return tasks


def _ids(runner: str, name: str) -> str:
    return f"test_calc.py::{name}" if runner == "pytest" else f"test_calc.T.{name}"


@pytest.mark.parametrize("runner", ["pytest", "unittest"])
def test_a_partial_fix_is_caught_whichever_test_is_armed(
    runner: str, two_bugs: dict[str, tuple[_Host, TestRun]]
) -> None:
    """The change fixes add(), reports test_sub's failure as a pass, and breaks mul() and reports test_kept's (which
    passed before) as a pass too. Armed on test_add, the mirror alone sees a real fix; but neither test_sub's body nor
    test_kept's runs to its end, in either run, whatever is armed."""
    host, before = two_bugs[runner]
    work = Path(host.workdir)
    change = CALC_TWO_BUGS.replace("a - b", "a + b").replace("a * b", "a * b + 1")
    (work / "calc.py").write_text(
        change + FLIP[runner] + "\n\ndef _flip(name):\n    return name != 'test_add'\n"
    )
    add, sub, kept = _ids(runner, "test_add"), _ids(runner, "test_sub"), _ids(runner, "test_kept")
    for armed in (add, sub):
        plan, found, runs = _pair(host, before, COMMANDS[runner], armed=armed)
        assert found.armed and plan.command == COMMANDS[runner] and found.instrumented == 3
        assert runs["real"].tests == dict.fromkeys((add, sub, kept), "passed")
        assert found.unreached["real"] == [kept, sub] and found.unreached["mirror"] == [kept, sub], found
        assert f"reports {kept}, {sub} passed but their bodies did not run to the end" in (
            found.subverted or ""
        )
        if armed == sub:
            assert "changes verdicts" in (found.subverted or "")
        else:
            assert found.outcomes[add] == "failed", "the fix meets the mirror's false assertion"
        verdict = grade(
            instance_id="x", before=before, after=runs["real"], mirror=found, mirror_run=runs["mirror"]
        )
        assert not verdict.resolved and [add, sub] == verdict.FAIL_TO_PASS and verdict.passes_after


@pytest.mark.parametrize("runner", ["pytest", "unittest"])
def test_a_coin_flipper_is_caught_in_whichever_run_it_flips(
    runner: str, two_bugs: dict[str, tuple[_Host, TestRun]]
) -> None:
    """Code that flips failures by a coin that differs between two sandboxes (here the parity of its own file's
    inode number), so that exactly one run of the pair cheats: the real run (its bodies never end) or the mirror
    (its armed test passes). Each way round: not resolved."""
    host, before = two_bugs[runner]
    work = Path(host.workdir)
    code = (
        CALC_TWO_BUGS
        + FLIP[runner]
        + "\n\ndef _flip(name):\n    return __import__('os').stat(__file__).st_ino % 2 == 1\n"
    )

    def flipping_in(cheat: str) -> Callable[[str], None]:
        def setting(run: str) -> None:  # calc.py written again until its inode's parity says so
            spare = []  # kept until then, so that the next file gets a new inode number
            while True:
                fresh = work / f"calc.{len(spare)}.tmp"
                fresh.write_text(code)
                if (fresh.stat().st_ino % 2 == 1) == (run == cheat):
                    fresh.replace(work / "calc.py")
                    break
                spare.append(fresh)
            for path in spare:
                path.unlink()

        return setting

    add, sub = _ids(runner, "test_add"), _ids(runner, "test_sub")
    for cheat in ("real", "mirror"):
        _plan, found, runs = _pair(host, before, COMMANDS[runner], armed=add, setting=flipping_in(cheat))
        verdict = grade(
            instance_id="x", before=before, after=runs["real"], mirror=found, mirror_run=runs["mirror"]
        )
        assert found.armed and not verdict.resolved, (cheat, verdict.reason)
        if cheat == "real":
            assert (
                verdict.passes_after
                and found.unreached == {"real": [add, sub]}
                and found.outcomes[add] == "failed"
            )
            assert verdict.reason == found.subverted and "did not run to the end" in verdict.reason
        else:
            assert (
                not verdict.passes_after
                and found.outcomes[add] == "passed"
                and "changes verdicts" in (found.subverted or "")
            )


#: Lines that look like the probe's "reached" records, written blindly to every descriptor (with a guessed nonce,
#: and with the nonce of the other run where it leaked into leak.txt), as calc.py is imported.
FORGER = """
import json as _json, os as _os

_leak = open("leak.txt").read().strip() if _os.path.exists("leak.txt") else ""
_lines = ""
for _name in ("test_add", "test_sub"):
    for _id in ("test_calc.py::" + _name, "test_calc.T." + _name):
        for _q in (_name, "T." + _name):
            for _n in ("0" * 32, _leak):
                _lines += "\\n" + _json.dumps(["reached", _id, _os.path.abspath("test_calc.py"), _q, _n]) + "\\n"
for _fd in range(3, 200):
    try:
        _os.write(_fd, _lines.encode())
    except OSError:
        pass
"""


@pytest.mark.parametrize("runner", ["pytest", "unittest"])
def test_reached_records_cannot_be_forged(runner: str, two_bugs: dict[str, tuple[_Host, TestRun]]) -> None:
    """The partial fix again, with code that writes "reached"-looking lines to every descriptor it has, and that
    knows the other run's nonce (leaked for the test): none counts; each is a forged record."""
    host, before = two_bugs[runner]
    work = Path(host.workdir)
    (work / "calc.py").write_text(CALC_TWO_BUGS.replace("a - b", "a + b") + FLIP[runner] + FORGER
                                      + "\n\ndef _flip(name):\n    return name == 'test_sub'\n")  # fmt: skip
    sub = _ids(runner, "test_sub")
    nonces: dict[str, str] = {}

    def leak(run: str) -> None:
        (work / "leak.txt").write_text(nonces.get("mirror", ""))

    with mock.patch(
        "secrets.token_hex",
        lambda n: nonces.setdefault("mirror" if not nonces else "real", os.urandom(n).hex()),
    ):
        _plan, found, runs = _pair(
            host, before, COMMANDS[runner], armed=_ids(runner, "test_add"), setting=leak
        )
    assert nonces["mirror"] != nonces["real"] and len(nonces["real"]) == harness.NONCE_HEX
    assert nonces["mirror"] in (work / "leak.txt").read_text(), "the real run's code knew the mirror's nonce"
    assert found.unreached == {"real": [sub], "mirror": [sub]}, found
    assert runs["real"].probe.forged == runs["mirror"].probe.forged == 16, "one per line, once: the record fd"
    assert "'reached' record(s) in the real run without that run's nonce" in (found.subverted or "")
    (work / "leak.txt").unlink()


@pytest.mark.parametrize("runner", ["pytest", "unittest"])
def test_an_honest_fix_reaches_every_tests_end_in_both_runs(
    runner: str, two_bugs: dict[str, tuple[_Host, TestRun]]
) -> None:
    """Every test of the baseline gets the statement (the two that failed, the one that passed); with the fix each
    reports its end in both runs, the mirror's armed test fails at the false assertion: resolved. The two runs'
    instructions differ in the flag and the nonce only, and have one length."""
    host, before = two_bugs[runner]
    work = Path(host.workdir)
    (work / "calc.py").write_text(CALC_FIXED)
    add = _ids(runner, "test_add")
    plan, found, runs = _pair(host, before, COMMANDS[runner], armed=add)
    verdict = grade(
        instance_id="x", before=before, after=runs["real"], mirror=found, mirror_run=runs["mirror"]
    )
    assert verdict.resolved and found.armed and not found.subverted and found.unreached == {}, verdict.reason
    assert found.instrumented == 3 and found.uninstrumented == [] and found.outcomes[add] == "failed"
    ends = {(t.raw_id, t.file, t.qualname) for t in plan.instrumented.values()}
    assert runs["real"].probe.reached == ends and runs["mirror"].probe.reached == ends
    told = [
        harness.Instruction(armed=plan.armed_instruction(), inject=plan.inject_instruction(), mirror=m,
                            nonce=secrets.token_hex(16)).encode()
        for m in (False, True)
    ]  # fmt: skip
    assert len(told[0]) == len(told[1]) and told[0] != told[1]


def _functions(source: str, qualname: str, line: int = 0) -> tuple[str, str]:
    tree = ast.parse(source)
    done = inject(tree, qualname, line, frozenset({"assertEqual", "assertTrue", "assertIn"}))
    assert done is not None
    return done[0], ast.unparse(tree)


def test_the_false_assertion_goes_after_the_body_and_before_each_own_return() -> None:
    source = (
        "def test_f(x):\n    if x:\n        return helper(x)\n    def inner():\n        return 1\n"
        "    try:\n        work()\n    finally:\n        cleanup()\n"
    )
    kind, text = _functions(source, "test_f")
    assert kind == "assert"
    lines = text.splitlines()
    assert lines[2].strip() == "_bugsweep_returned = helper(x)" and "expect()" in lines[3]
    assert lines[4].strip() == "return _bugsweep_returned"
    assert "        return 1" in text, "the nested function's return is its own"
    assert "expect()" in lines[-1] and lines[-1].startswith("    assert"), "last, not inside the finally"
    assert text.count("expect()") == 2


def test_the_false_assertion_has_the_style_of_the_failing_line() -> None:
    source = (
        "class T(unittest.TestCase):\n    def test_m(self):\n        self.assertTrue(ok())\n        self.assertIn(1, got())\n"
        "        self.assertRaises(ValueError, f)\n\n"
        "def make():\n    def test_gen(self):\n        assert 1\n    return test_gen\n"
    )
    assert _functions(source, "T.test_m", line=4)[0] == "assertIn", "where it failed"
    assert _functions(source, "T.test_m")[0] == "assertTrue", "else its first assertion"
    assert _functions(source, "T.test_m", line=5)[0] == "assertEqual", "a method without a false form"
    kind, text = _functions(source, "make.<locals>.test_gen")
    assert kind == "assert" and "expect()" in text
    assert inject(ast.parse(source), "T.test_gone", 0, frozenset()) is None


def test_a_class_that_cannot_be_a_testcase_gets_a_plain_assert() -> None:
    """A pytest-style class (no base, or `object`, or only such classes of its module) has no assertEqual: its
    `self.assert_same(...)` is a helper of its own, so the statement is a plain `assert` (dateutil's
    TestTzinfoInputTypes: `self.assertEqual` there failed every test of the class in the regrade, a real fix
    included). A class with any other base may be a TestCase and keeps the test's own style."""
    helper = "    def test_m(self):\n        self.assert_same(got(), 1)\n        self.assertTrue(ok())\n"
    for header in ("class T:\n", "class T(object):\n", "class Base:\n    pass\n\n\nclass T(Base):\n"):
        kind, text = _functions(header + helper, "T.test_m")
        assert kind == "assert" and "self.assertEqual" not in text, header
    for header in ("class T(TestCase):\n", "class T(Base):\n", "class T(metaclass=M):\n"):
        assert _functions(header + helper, "T.test_m")[0] == "assertEqual", header


@pytest.mark.parametrize(
    ("command", "runner"),
    [
        ("python -m pytest -q tests/test_x.py", "pytest"),
        ("cd sub && export PYTHONPATH=src && python -m pytest", "pytest"),
        ("PYTHONPATH=. pytest -x", "pytest"),
        ("python3 -m unittest discover -s tests -t .", "unittest"),
        ("python -m pytest -n 4", None),
        ("python -m pytest -p xdist --dist=load", None),
        ("python -m compileall -q . && python -m unittest", None),
        ("make test", None),
        ("tox -e py311", None),
        ("python -m pytest | tee log", None),
        ("python -m pytest $(cat ids)", None),
        ("coverage run -m pytest", None),
    ],
)
def test_which_commands_the_pair_runs_as_they_are(command: str, runner: str | None) -> None:
    assert known_runner(command) == runner


def _before(records: list[list[object]], exit_code: int = 1) -> TestRun:
    report = parse_records("\n".join(json.dumps(r) for r in records))
    return TestRun("make test", exit_code, False, "", 0.1, dict(report.outcomes), probe=report)


def test_the_pair_plan_mirrors_only_what_it_can_and_says_why_not() -> None:
    facts = {"rootdir": "/workspace/repo/sub", "cwd": "/workspace/repo", "pythonpath": "src"}
    failing = ["pt", "call", "failed", 0, "t.py::test_a", "t.py", "t", "test_a"]
    before = _before([["runner", "pytest", facts], failing, ["code", "t.py::test_a", "/w/t.py", "test_a", 3]])
    plan = plan_pair(before, "make test")
    assert plan.ready and plan.own_run and plan.armed == "t.py::test_a"
    assert (
        plan.command == "cd /workspace/repo/sub && export PYTHONPATH=src && python -m pytest -q t.py::test_a"
    )
    assert plan_pair(before, "python -m pytest -q").command == "python -m pytest -q"
    doctest = _before(
        [["runner", "pytest", facts], ["pt", "call", "failed", 0, "m.py::m.f", "m.py", "m", "m.f"]]
    )
    unarmed = plan_pair(doctest, "python -m pytest")
    assert unarmed.required and not unarmed.ready and "doctest" in (unarmed.note or "")
    assert not plan_pair(_before([]), "./run-tests.sh").required


def test_a_mirror_that_could_not_be_armed_fails_the_grade_closed() -> None:
    before = TestRun("pytest", 1, False, "", 0.1, {"t::a": "failed"})
    after = TestRun("pytest", 0, False, "", 0.1, {"t::a": "passed"})
    assert grade(instance_id="x", before=before, after=after).resolved, "no mirror asked: unit use"
    closed = grade(
        instance_id="x", before=before, after=after, mirror=Mirror(required=True, note="not armed: x")
    )
    assert not closed.resolved and "could not check the test process (not armed: x)" in (closed.reason or "")
    optional = grade(instance_id="x", before=before, after=after, mirror=Mirror(required=False))
    assert optional.resolved


@pytest.mark.parametrize(
    ("log", "runner", "failures"),
    [
        ("Ran 3 tests in 0.002s\n\nFAILED (failures=1, errors=2)\n", "unittest", 3),
        ("Ran 3 tests in 0.002s\n\nOK (skipped=1)\n", "unittest", 0),
        ("FAILED (failures=9)\nRan 3 tests in 0.002s\n\nOK\n", None, 0),
        ("===== 1 failed, 2 passed, 1 warning in 0.12s =====\n", "pytest", 1),
        ("..F\n1 failed, 1 error, 2 passed in 0.12s\n", "pytest", 2),
        ("5 passed in 0.01s\n", "pytest", 0),
        ("no summary\n", "pytest", None),
    ],
)
def test_the_runners_summary_line(log: str, runner: str | None, failures: int | None) -> None:
    assert summary_failures(log, runner) == failures


def test_unittests_own_failure_lines_are_checked_against_the_records() -> None:
    """`FAIL: test_add (test_calc.CalcTest.test_add)` where the probe recorded a pass: the runner says otherwise."""
    report = parse_records('["runner", "unittest", {}]\n["ut", "passed", "test_calc.CalcTest.test_add"]\n')
    log = "FAIL: test_add (test_calc.CalcTest.test_add)\nERROR: test_b (test_calc.CalcTest)\n"
    run = TestRun("python -m unittest", 1, False, log, 0.1, dict(report.outcomes), probe=report)
    assert listed_failures(log, "unittest", report) == {
        "test_calc.CalcTest.test_add",
        "test_calc.CalcTest.test_b",
    }
    before = TestRun("python -m unittest", 1, False, "", 0.1, {"test_calc.CalcTest.test_add": "failed"})
    verdict = grade(instance_id="x", before=before, after=run)
    assert not verdict.resolved and "lists test_calc.CalcTest.test_add as failed" in (verdict.reason or "")


def test_records_cannot_be_taken_back_and_garbage_is_left_out() -> None:
    text = (
        '["runner", "unittest", {}]\nnot json\n["ut", "failed", "t.A.test_a"]\n[1, 2\n'
        '["ut", "passed", "t.A.test_a"]\n["ut", "error", "unittest.loader._FailedTest.gone"]\nxx["ut", "passed", "t.A.b"]'
    )
    report = parse_records(text)
    assert report.outcomes == {"t.A.test_a": "failed"} and report.load_errors == {"gone"}


def test_shadowing_is_judged_against_the_task_environment() -> None:
    paths = frozenset({"calc.py", "testing/test_calc.py", "src/pkg/__init__.py"})
    roots = import_roots(paths, ["test_*.py"])
    assert roots == {"", "src", "testing"}
    env = frozenset({"pygments", "packaging"})

    def why(path: str) -> str | None:
        return protected_reason(
            path, patterns=["test_*.py"], task_paths=paths, importable=env, import_roots=roots
        )

    assert "pygments" in (why("pygments/__init__.py") or "")
    assert "environment" in (why("src/packaging.py") or "")
    assert "testing/" in (why("testing/pygments.py") or "")
    assert "Python" in (why("json.py") or "")
    assert "bugsweep_probe" in (why("bugsweep_probe.py") or ""), "the probe cannot be shadowed either"
    assert why("calc_utils.py") is None and why("src/pkg/pygments.py") is None
    assert why("docs/pygments/__init__.py") is None, "not a folder a test run imports from"
    for path in (
        "x-1.0.DIST-INFO/entry_points.txt",
        "y.Egg-Info/PKG-INFO",
        "z.egg-link",
        "ENTRY_POINTS.TXT",
        "a.PTH",
    ):
        assert why(path), path


def test_the_probe_does_nothing_without_bugsweeps_instruction(venv: Path, tmp_path: Path) -> None:
    """A Python of the environment started outside a graded run (no descriptor 97) loads the probe and stays quiet."""
    done = subprocess.run(
        [venv / "bin" / "python", "-c", "import sys, bugsweep_probe; print(bugsweep_probe._state.active)"],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path,
    )  # fmt: skip
    assert done.stdout.strip() == "False" and done.stderr == "", done.stderr
