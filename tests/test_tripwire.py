"""The tripwire's parts on their own: the canary it writes, the probe in a real test process, the summary lines.

Real parts: the probe runs in real `python -m unittest` and `python -m pytest` processes on this host (the
sandboxed runs are in tests/test_tamper_inside.py); the canary's source is parsed and run as written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bugsweep import grading, tripwire
from bugsweep.testfiles import import_roots, protected_reason
from bugsweep.tripwire import make_canary, parse_report, single_runner, summary_failures

CLASS_TESTS = (
    "import os\nimport sys\nsys.path.insert(0, os.path.dirname(__file__))\n"
    "from helpers import Base\nfrom calc import add\n\n\n"
    "class CalcTest(Base):\n    def test_add(self):\n        self.assertIn(add(2, 3), [5])\n\n"
    "    def test_raises(self):\n        with self.assertRaises(TypeError):\n            add(1, None)\n\n"
    "    def test_mul(self):\n        self.assertEqual(1, 1)\n\n\n"
    "if __name__ == '__main__':\n    import unittest\n    unittest.main()\n"
)


def test_the_canary_mirrors_the_failing_tests_class_imports_and_assertions() -> None:
    paths = frozenset({"tests/test_calc.py", "tests/helpers.py", "calc.py"})
    canary = make_canary(
        ["tests.test_calc.CalcTest.test_add", "tests.test_calc.CalcTest.test_raises"],
        ["tests.test_calc.CalcTest.test_mul"],
        paths,
        {"tests/test_calc.py": CLASS_TESTS}.get,
        test_command="python -m unittest discover -s tests -t .",
    )
    assert canary is not None
    assert canary.path.startswith("tests/_test_calc_") and canary.module == "tests." + canary.path[6:-3]
    assert canary.must_fail == ["CalcTest.test_add", "CalcTest.test_raises"]
    assert canary.must_pass == ["CalcTest.test_mul"]
    source = canary.source
    assert "class CalcTest(Base):" in source and "from helpers import Base" in source
    assert "sys.path.insert(0, os.path.dirname(__file__))" in source and "__main__" not in source
    assert "self.assertIn(1, [])" in source and "self.assertRaises(ValueError)" in source
    compile(source, canary.path, "exec")
    assert canary.name_of(f"{canary.module}.CalcTest.test_add") == "CalcTest.test_add"
    assert canary.name_of(f"{canary.path}::CalcTest::test_add") == "CalcTest.test_add"
    assert canary.name_of("tests.test_calc.CalcTest.test_add") is None


def test_no_canary_where_it_could_stop_another_step() -> None:
    args = (["t.py::test_a"], [], frozenset({"t.py"}), {"t.py": "def test_a():\n    assert 0\n"}.get)
    assert make_canary(*args, test_command="python -m pytest -q") is not None
    assert make_canary(*args, test_command="cd sub && python -m pytest") is not None
    assert make_canary(*args, test_command="pytest a && pytest b") is None
    assert make_canary(*args, test_command="pytest; echo done") is None
    assert single_runner("python -m pytest 'a && b'")
    assert make_canary(["gone.py::test_a"], *args[1:], test_command="pytest") is None


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


def _probe(tmp_path: Path, canary: str = "") -> dict[str, str]:
    probe = tmp_path / "probe"
    for name, text in tripwire.probe_files().items():
        (probe / name).parent.mkdir(parents=True, exist_ok=True)
        (probe / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(probe), "BUGSWEEP_PROBE_DIR": str(probe)}
    if canary:
        env["BUGSWEEP_PROBE_CANARY"] = canary
    return env


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


def test_the_probe_records_the_outer_unittest_run_only(tmp_path: Path) -> None:
    """Tests of test tools run suites of their own, in-process or in a subprocess: only the outer run counts."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "test_inner.py").write_text(INNER)
    env = _probe(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "unittest", "test_inner.Outer"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    report = parse_report((tmp_path / "probe" / "report").read_text())
    assert report.runners == ["unittest"]
    assert report.outcomes == {
        "test_inner.Outer.test_runs_a_suite_in_process": "passed",
        "test_inner.Outer.test_runs_a_runner_in_a_subprocess": "passed",
    }


def test_the_probe_adds_the_canary_last_even_when_failing_fast(tmp_path: Path) -> None:
    work = tmp_path / "w"
    work.mkdir()
    (work / "test_a.py").write_text(
        "import unittest\n\n\nclass A(unittest.TestCase):\n    def test_a(self):\n        self.assertEqual(1, 2)\n"
    )
    paths = frozenset({"test_a.py"})
    canary = make_canary(["test_a.A.test_a"], [], paths, {"test_a.py": (work / "test_a.py").read_text()}.get,
                         test_command="python -m unittest -f")  # fmt: skip
    assert canary is not None
    (work / canary.path).write_text(canary.source)
    env = _probe(tmp_path, f"{work / canary.path}\t{canary.module}")
    # the task's own test passes now: the canary's must-fail test is then the run's only failure
    (work / "test_a.py").write_text((work / "test_a.py").read_text().replace("1, 2", "2, 2"))
    run = subprocess.run(
        [sys.executable, "-m", "unittest", "-f"], cwd=work, env=env, capture_output=True, text=True
    )
    report = parse_report((tmp_path / "probe" / "report").read_text())
    assert report.canary_taken and run.returncode == 1
    assert report.outcomes["test_a.A.test_a"] == "passed"
    assert report.outcomes[f"{canary.module}.A.test_a"] == "failed"
    assert summary_failures(run.stderr, "unittest") == 1


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
    assert why("calc_utils.py") is None and why("src/pkg/pygments.py") is None
    assert why("docs/pygments/__init__.py") is None, "not a folder a test run imports from"


@pytest.mark.parametrize("runner", ["pytest", "unittest"])
def test_a_canary_that_cannot_be_imported_stops_nothing(runner: str, tmp_path: Path) -> None:
    """A canary whose imports fail is said in the report; the task's tests run as without it (a collection error
    would stop a pytest session before any test), and the tripwire notes that it could not judge."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "test_a.py").write_text(
        "import unittest\n\n\nclass A(unittest.TestCase):\n    def test_a(self):\n        self.assertEqual(1, 1)\n"
    )
    canary = tripwire.Canary(path="_test_a_0.py", module="_test_a_0", source="import not_here_at_all\n",
                             must_fail=["A.test_a"], must_pass=["A.test_b"])  # fmt: skip
    (work / canary.path).write_text(canary.source)
    env = _probe(tmp_path, f"{work / canary.path}\t{canary.module}")
    command = ["-m", "pytest", "-q", "-p", "no:cacheprovider"] if runner == "pytest" else ["-m", "unittest"]
    run = subprocess.run([sys.executable, *command], cwd=work, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    report = parse_report((tmp_path / "probe" / "report").read_text())
    assert not report.canary_taken and report.errors and "not_here_at_all" in report.errors[0]
    _, wire = tripwire.check(canary, {"test_a.py::A::test_a": "passed"}, report)
    assert not wire.armed and wire.subverted is None and wire.note and "not_here_at_all" in wire.note


def test_no_canary_for_a_doctest_or_a_nested_class() -> None:
    read = {"pkg/mod.py": "def f():\n    '''\n    >>> f()\n    1\n    '''\n"}.get
    paths = frozenset({"pkg/mod.py", "t.py"})
    assert make_canary(["pkg/mod.py::pkg.mod.f"], [], paths, read, test_command="pytest") is None
    nested = {"t.py": "class A:\n    class B:\n        def test_x(self):\n            assert 0\n"}.get
    assert make_canary(["t.py::A::B::test_x"], [], paths, nested, test_command="pytest") is None


SHARED = "import unittest\n\n\nclass SharedTests(unittest.TestCase):\n    def test_shared(self):\n        self.assertEqual(1, 1)\n"
MIXED = (
    "import typing\nimport unittest\nfrom shared import SharedTests\n\n\n"
    "class Mixin:\n    def test_from_mixin(self):\n        self.assertEqual(1, 1)\n\n\n"
    "class Local(Mixin, SharedTests):\n    pass\n\n\n"
    "T = typing.TypeVar('T')\n\n\n"
    "class BTest(Local, unittest.TestCase, typing.Generic[T]):\n"
    "    def test_b(self):\n        self.assertEqual(1, 2)\n\n"
    "    def test_ok(self):\n        self.assertEqual(1, 1)\n\n\n"
    "def test_param():\n    assert True\n"
)


def test_the_canary_names_only_what_its_imports_bind() -> None:
    """The failing tests' class may extend classes of its own module (a mixin, a base with fixtures): the canary
    holds only the module's imports, so those are replaced by their own bases (else its import fails: NameError).
    A must-pass test is named by its function, never by a dotted parameter (`[typing.ClassVar]`)."""
    paths = frozenset({"test_b.py", "shared.py"})
    passing = ["test_b.py::test_param[typing.ClassVar]", "test_b.py::BTest::test_from_mixin[x.y]"]
    canary = make_canary(["test_b.py::BTest::test_b"], passing, paths, {"test_b.py": MIXED}.get,
                         test_command="python -m pytest -q")  # fmt: skip
    assert canary is not None
    assert "class BTest(SharedTests, unittest.TestCase):" in canary.source
    assert "Mixin" not in canary.source and "Local" not in canary.source
    assert canary.must_fail == ["BTest.test_b"] and canary.must_pass == ["BTest.test_from_mixin"]
    plain = make_canary(
        ["test_b.py::test_param[1]"], passing, paths, {"test_b.py": MIXED}.get, test_command="pytest"
    )
    assert plain is not None and plain.must_pass == ["test_param_" + plain.path[-9:-3]]


@pytest.mark.parametrize("runner", ["pytest", "unittest"])
def test_only_the_canarys_own_tests_run(runner: str, tmp_path: Path) -> None:
    """The canary module imports what the test module imports (test classes too) and its class inherits tests: the
    runner runs only the canary's own tests, so its summary counts exactly the task's tests and the canary's."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "shared.py").write_text(SHARED)
    (work / "test_b.py").write_text(MIXED)
    failing = "test_b.py::BTest::test_b" if runner == "pytest" else "test_b.BTest.test_b"
    canary = make_canary([failing], [], frozenset({"test_b.py", "shared.py"}), {"test_b.py": MIXED}.get,
                         test_command=f"python -m {runner}")  # fmt: skip
    assert canary is not None
    (work / canary.path).write_text(canary.source)
    names = ",".join([*canary.must_fail, *canary.must_pass])
    env = _probe(tmp_path, f"{work / canary.path}\t{canary.module}\t{names}")
    (work / "test_b.py").write_text(
        MIXED.replace("1, 2", "2, 2")
    )  # the fix: the canary's failure is the only one
    junit = tmp_path / "junit.xml"
    command = (
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "-o", "junit_family=xunit1"]
        if runner == "pytest"
        else ["-m", "unittest"]
    )
    run = subprocess.run([sys.executable, *command], cwd=work, env=env, capture_output=True, text=True)
    report = parse_report((tmp_path / "probe" / "report").read_text())
    tests = grading.parse_junit(junit.read_text()) if runner == "pytest" else report.outcomes
    own, wire = tripwire.check(canary, tests, report)
    assert run.returncode == 1 and wire.armed and wire.subverted is None and wire.note is None, (
        run.stdout + run.stderr
    )
    ran = {t for t in tests if canary.name_of(t)}
    assert len(ran) == 2 and wire.outcomes == {"BTest.test_b": "failed", canary.must_pass[0]: "passed"}
    assert own is not None and not [t for t, o in own.items() if o != "passed"]
    assert summary_failures(run.stdout + run.stderr, runner) == 1


def test_a_module_unittest_cannot_load_is_counted_as_its_summary_counts_it() -> None:
    """Not a test (after a fix the module's own tests run), but `FAILED (errors=1)` counts it: no disagreement."""
    from bugsweep.grading import TestRun, grade

    report = parse_report(
        "runner\tunittest\nerror\tunittest.loader._FailedTest.test_gone\npassed\tt.A.test_a\n"
    )
    assert report.outcomes == {"t.A.test_a": "passed"} and report.load_errors == {"test_gone"}
    log = "Ran 2 tests in 0.001s\n\nFAILED (errors=1)\n"
    after = TestRun("python -m unittest", 1, False, log, 0.1, dict(report.outcomes), probe=report)
    before = TestRun("python -m unittest", 1, False, log, 0.1, {"t.A.test_a": "failed"})
    verdict = grade(instance_id="x", before=before, after=after)
    assert not verdict.resolved and "summary" not in (verdict.reason or ""), verdict.reason
