"""Grading: per-test verdicts, protected files, bounded logs, and the tree read from outside the sandbox.

Real parts: pytest and unittest run for real, in the real local bubblewrap sandbox.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bugsweep.grading import TestRun, grade, run_tests
from bugsweep.grading.cleanroom import SYMLINK, diff, host_repo_dir, read_entry, read_tree
from bugsweep.grading.signals import suspicious_signals
from bugsweep.grading.testfiles import protected_reason
from bugsweep.sandbox import RepoSource, get_provider
from bugsweep.settings import DEFAULT_TEST_GLOBS
from tests.support.repos import BUGGY_CALC, make_repo, with_pytest


def _run(tests: dict[str, str] | None, exit_code: int) -> TestRun:
    return TestRun(
        command="pytest", exit_code=exit_code, timed_out=False, log="", duration_s=0.1, tests=tests
    )


def test_grade_needs_all_three_conditions() -> None:
    before = _run({"t::a": "failed", "t::b": "passed"}, 1)
    fixed = _run({"t::a": "passed", "t::b": "passed"}, 0)
    broken = _run({"t::a": "passed", "t::b": "failed"}, 1)

    ok = grade(instance_id="x", before=before, after=fixed)
    assert ok.resolved and ok.FAIL_TO_PASS == ["t::a"] and ok.PASS_TO_PASS == ["t::b"]
    assert ok.evidence == "per-test" and ok.reason is None

    touched = grade(instance_id="x", before=before, after=fixed, dropped={"tests/test_t.py": "test file"})
    assert (
        not touched.resolved and not touched.tests_untouched and "tests/test_t.py" in (touched.reason or "")
    )
    regress = grade(instance_id="x", before=before, after=broken)
    assert not regress.resolved and regress.PASS_TO_FAIL == ["t::b"]
    already_passing = grade(instance_id="x", before=_run({"t::a": "passed"}, 0), after=fixed)
    assert not already_passing.resolved and not already_passing.failed_before


def test_tests_the_task_names_as_failing_in_both_states_need_not_pass_after() -> None:
    """A mined task whose command cannot leave out a module that does not import (a conftest.py overriding
    `--ignore`) names it in FAIL_TO_FAIL: the grade does not ask it to pass after, and the mirror never arms it;
    any other test that failed before still must pass."""
    from bugsweep.grading.mirror import plan_pair
    from bugsweep.grading.records import ProbeReport

    module = "tests/test_old.py::tests.test_old"
    before = _run({module: "error", "t::a": "failed", "t::b": "passed"}, 1)
    fixed = _run({module: "error", "t::a": "passed", "t::b": "passed"}, 1)
    assert not grade(instance_id="x", before=before, after=fixed).resolved
    named = grade(instance_id="x", before=before, after=fixed, expected_fail_to_fail=[module])
    assert (
        named.FAIL_TO_PASS == ["t::a"]
        and named.FAIL_TO_FAIL == []
        and "failed before" not in (named.reason or "")
    )
    # its exit code 1 is those tests failing: resolved (bench/gold.py: 7 of boltons' own fixes were not)
    assert named.resolved and named.passes_after, named.reason
    interrupted = grade(instance_id="x", before=before, after=_run({**fixed.tests, module: "error"}, 2),
                        expected_fail_to_fail=[module])  # fmt: skip
    assert not interrupted.resolved, "exit 2: pytest was interrupted, not only those tests failing"
    still = grade(instance_id="x", before=before, after=_run({module: "error", "t::a": "failed", "t::b": "passed"}, 1),
                  expected_fail_to_fail=[module])  # fmt: skip
    assert not still.resolved and still.FAIL_TO_FAIL == ["t::a"]
    under_pytest = TestRun(**{**vars(before), "probe": ProbeReport(runners=["pytest"])})
    assert plan_pair(under_pytest, "python -m pytest", fail_to_fail=[module]).failing == ["t::a"]
    assert plan_pair(under_pytest, "python -m pytest").failing == ["t::a", module]


@pytest.mark.parametrize(
    ("after_tests", "field"),
    [
        ({"t::a": "skipped", "t::b": "passed"}, "FAIL_TO_FAIL"),  # skipped (or xfailed) is not a pass
        ({"t::b": "passed"}, "FAIL_TO_FAIL"),  # the failing test is gone
        ({"t::a": "passed"}, "PASS_TO_MISSING"),  # a passing test is gone
        ({"t::a": "passed", "t::b": "skipped"}, "PASS_TO_MISSING"),  # a passing test is skipped now
        (None, None),  # no per-test results after, though there were before
    ],
)
def test_per_test_verdicts_see_through_a_green_exit_code(after_tests, field) -> None:
    """SWE-bench style: exit code 0 is not enough when the per-test results say a test did not pass."""
    before = _run({"t::a": "failed", "t::b": "passed"}, 1)
    verdict = grade(instance_id="x", before=before, after=_run(after_tests, 0))
    assert verdict.passes_after and not verdict.resolved and verdict.reason
    if field:
        assert getattr(verdict, field)
    else:
        assert "no per-test results" in verdict.reason


def test_without_per_test_results_fewer_tests_may_not_run_after() -> None:
    """unittest prints only a count: a change that makes tests vanish is not a fix."""

    def run(log: str, code: int) -> TestRun:
        return TestRun(command="python -m unittest", exit_code=code, timed_out=False, log=log, duration_s=0.1)

    before = run("F.\n----\nRan 2 tests in 0.001s\n\nFAILED (failures=1)\n", 1)
    fewer = grade(instance_id="x", before=before, after=run("Ran 1 test in 0.001s\n\nOK\n", 0))
    assert (
        not fewer.resolved
        and fewer.evidence == "exit code and test count"
        and "fewer tests" in (fewer.reason or "")
    )
    same = grade(instance_id="x", before=before, after=run("Ran 2 tests in 0.001s\n\nOK\n", 0))
    assert same.resolved and (same.tests_run_before, same.tests_run_after) == (2, 2)
    bare = grade(instance_id="x", before=run("boom", 1), after=run("fine", 0))
    assert bare.resolved and bare.evidence == "exit code"


def test_grade_checks_the_tasks_own_fail_to_pass_list() -> None:
    """A mined task names the tests that must pass; passing the command alone is not enough if one is missing."""
    before = _run({"t::a": "failed"}, 1)
    after = _run({"t::a": "passed"}, 0)
    assert grade(instance_id="x", before=before, after=after, expected_fail_to_pass=["t::a"]).resolved
    assert not grade(
        instance_id="x", before=before, after=after, expected_fail_to_pass=["t::a", "t::gone"]
    ).resolved


def test_protected_changes_cover_the_test_infrastructure() -> None:
    task = frozenset({"calc.py", "tests/test_calc.py", "pyproject.toml", "Makefile", "scripts/test.sh"})
    pyproject = b'[tool.pytest.ini_options]\npythonpath = ["."]\n'

    def why(
        path: str, old: bytes | None = None, new: bytes | None = b"", command: str = "python -m pytest"
    ) -> str | None:
        return protected_reason(
            path, patterns=DEFAULT_TEST_GLOBS, test_command=command, old=old, new=new, task_paths=task
        )

    assert why("calc.py") is None and why("src/pkg/util.py") is None
    assert why("tests/test_calc.py") == why("pkg/test_util.py") == why("sub/conftest.py") == "test file"
    assert why("tests") == "holds test files"  # the folder replaced by a link or a file
    for name in ("pytest.ini", "tox.ini", "sub/.pytest.ini"):
        assert why(name) == "test-runner configuration"
    assert why("pyproject.toml", pyproject, pyproject + b'[project]\ndependencies = ["attrs"]\n') is None
    assert (
        why("pyproject.toml", pyproject, pyproject + b'addopts = "-k mul"\n')
        == "test-runner section of pyproject.toml"
    )
    assert why("setup.cfg", None, b"[metadata]\nname = x\n") is None
    assert why("setup.cfg", None, b"[tool:pytest]\naddopts = -x\n") == "test-runner section of setup.cfg"
    for path in ("sitecustomize.py", "lib/usercustomize.py", "evil.pth"):
        assert why(path) == "run by Python at start-up"
    assert why("unittest/__init__.py") and why("pytest.py") and why("json.py") and why("src/_pytest/main.py")
    assert why("Makefile", command="make test") == "run by the test command"
    assert why("scripts/test.sh", command="bash scripts/test.sh") == "run by the test command"
    assert why("Makefile") is None, "a Makefile the test command does not use is code like any other"
    assert why("noxfile.py", command="nox -s tests") == "run by the test command"


def test_suspicious_signals_flag_code_that_games_tests_without_deciding() -> None:
    old = b"def add(a, b):\n    return a - b\n"
    new = (
        old
        + b"import unittest\nunittest.TestCase.assertEqual = lambda *a: None\nimport sys; sys._getframe(1)\n"
    )
    signals = suspicious_signals({"calc.py": (old, new), "README.md": (None, b"import unittest")})
    assert len(signals) == 3 and all(s.startswith("calc.py:") for s in signals)
    assert any("assertion" in s for s in signals) and any("caller" in s for s in signals)
    assert suspicious_signals({"calc.py": (old, old.replace(b"-", b"+"))}) == []


@pytest.fixture
def sandbox(buggy_repo: Path):
    with with_pytest(get_provider("local").create(RepoSource(str(buggy_repo)))) as sbx:
        yield sbx


def test_a_test_run_that_prints_without_end_is_cut_head_and_tail_kept(sandbox) -> None:
    command = "echo FIRST-LINE; yes filler | head -c 20000000; echo; echo LAST-LINE; exit 3"
    run = run_tests(sandbox, command)
    assert run.exit_code == 3 and not run.timed_out
    assert run.log.startswith("FIRST-LINE") and run.log.rstrip().endswith("LAST-LINE")
    assert run.log_bytes > 20_000_000 and len(run.log) < 600_000 and "bytes of output cut here" in run.log


def test_a_test_run_that_times_out_keeps_its_log(sandbox) -> None:
    run = run_tests(sandbox, "echo started; yes | head -c 3000000; sleep 30", timeout=3)
    assert run.timed_out and run.exit_code is None and run.log.startswith("started")


def test_the_tree_is_read_from_outside_without_following_links(sandbox, tmp_path: Path) -> None:
    """Links are recorded as links, never followed; caches, .git and FIFOs are not part of a change."""
    root = host_repo_dir(sandbox)
    assert root is not None
    state = read_tree(root)
    assert {"calc.py", "tests/test_calc.py", "pyproject.toml"} <= state.entries.keys()
    assert not any(p.startswith(".git/") for p in state.entries)
    secret = tmp_path / "host-secret"
    secret.write_text("host only")
    sandbox.exec(
        f"ln -s {secret} link && ln -s /etc etc_link && mkfifo pipe && mkdir -p __pycache__ && "
        "echo x > __pycache__/calc.cpython-311.pyc && sed -i 's/a - b/a + b/' calc.py && echo x > .git/evil"
    )
    after = read_tree(root, state)
    changes = {c.path: c for c in diff(state, after)}
    assert sorted(changes) == ["calc.py", "etc_link", "link"] and after.skipped == ["pipe"]
    assert changes["link"].new is not None and changes["link"].new.mode == SYMLINK
    assert read_entry(root, "link", changes["link"].new) == str(secret).encode(), (
        "the target, not the content"
    )


# -- the per-test time limit: a test that hangs fails, and the run goes on -----------------------------------------

HANGING_ADD = "def add(a, b):\n    while True:\n        pass\n\n\ndef mul(a, b):\n    return a * b\n"
#: A "fix" that waits past the limit, catches what stops it, and returns the right answer: the test then passes
#: as far as pytest can tell.
CATCHING_ADD = (
    "import time\n\n\ndef add(a, b):\n    try:\n        while True:\n            time.sleep(0.05)\n"
    "    except BaseException:\n        return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
)


@pytest.mark.parametrize("change", [HANGING_ADD, CATCHING_ADD], ids=["hangs", "catches-the-stop"])
def test_a_change_whose_test_hangs_is_not_resolved_and_the_run_goes_on(buggy_repo: Path, change: str) -> None:
    """The agent's change (written into its real sandbox, as an agent would) makes test_add loop for ever: in the
    fresh sandbox that test is stopped at the per-test limit and fails, test_mul still runs and passes, the whole
    run ends long before its own timeout, and the grade says which test hit the limit. A change that catches the
    stop and then returns the right answer is no better: the probe recorded the timeout as it happened."""
    from bugsweep.pipeline import baseline, prepare, regrade, setup
    from bugsweep.settings import AgentSettings
    from bugsweep.spec import TaskSpec
    from tests.support.repos import PYTEST_SETUP

    spec = TaskSpec(
        repo=str(buggy_repo),
        problem_statement="add() subtracts",
        test_command="python -m pytest -q",
        setup_command=PYTEST_SETUP,
    )
    prepared = prepare(spec, get_provider("local"))
    with prepared.sandbox:
        setup(prepared)
        before = baseline(prepared, per_test_timeout=2)
        prepared.sandbox.files.write(f"{prepared.sandbox.workdir}/calc.py", change)
        verdict, after, _ = regrade(
            prepared, before, None, agent_settings=AgentSettings(per_test_timeout_s=2)
        )
    assert after is not None and not after.timed_out and after.duration_s < 60
    assert not verdict.resolved and verdict.tests_timed_out == ["tests/test_calc.py::test_add"]
    assert verdict.FAIL_TO_FAIL == ["tests/test_calc.py::test_add"]
    assert verdict.PASS_TO_PASS == ["tests/test_calc.py::test_mul"]
    assert "ran past the per-test time limit of 2 s" in (verdict.reason or "")
    if change == HANGING_ADD:
        assert (
            "TestTimedOut: bugsweep: tests/test_calc.py::test_add ran past the per-test time limit"
            in after.log
        )
    else:  # pytest saw test_add pass: the recorded timeout decides
        assert "2 passed" in after.log, after.log


#: add() that waits and swallows every exception, the per-test time limit's included: its test never stops when told.
SWALLOWING_ADD = (
    "import time\n\n\ndef add(a, b):\n    while True:\n        try:\n            time.sleep(0.05)\n"
    "        except BaseException:\n            pass\n\n\ndef mul(a, b):\n    return a * b\n"
)


@pytest.mark.parametrize("fixed", [True, False], ids=["real-fix", "still-swallows"])
def test_a_baseline_test_that_will_not_stop_fails_and_a_real_fix_of_it_is_graded(
    tmp_path: Path, fixed: bool
) -> None:
    """At the baseline test_add swallows the stop each second: the probe ends its process once it has gone on as
    long again, and the run goes on without it (test_mul passes), so test_add failed before, and the mirror pair
    can still be armed on it (its function was recorded as it started). A real fix is resolved; a change that
    still swallows is not, in seconds rather than at the whole run's timeout (the pair's run that died fails closed)."""
    from bugsweep.pipeline import baseline, prepare, regrade, setup
    from bugsweep.settings import AgentSettings
    from bugsweep.spec import TaskSpec
    from tests.support.repos import PYTEST_SETUP

    repo = make_repo(tmp_path / "calc", {**BUGGY_CALC, "calc.py": SWALLOWING_ADD})
    spec = TaskSpec(repo=str(repo), problem_statement="add() never returns", test_command="python -m pytest -q",
                    setup_command=PYTEST_SETUP)  # fmt: skip
    prepared = prepare(spec, get_provider("local"))
    with prepared.sandbox:
        setup(prepared)
        before = baseline(prepared, per_test_timeout=2)
        assert before.tests == {
            "tests/test_calc.py::test_add": "failed",
            "tests/test_calc.py::test_mul": "passed",
        }
        assert before.tests_crashed == ["tests/test_calc.py::test_add"] and not before.timed_out
        change = (
            SWALLOWING_ADD.replace("while True", "return a + b\n    while True") if fixed else "import time\n"
        )
        prepared.sandbox.files.write(
            f"{prepared.sandbox.workdir}/calc.py", change if fixed else SWALLOWING_ADD + change
        )
        verdict, after, _ = regrade(
            prepared, before, None, agent_settings=AgentSettings(per_test_timeout_s=2)
        )
    assert after is not None and after.duration_s < 60
    if fixed:
        assert verdict.resolved, verdict.reason
        assert verdict.FAIL_TO_PASS == ["tests/test_calc.py::test_add"]
        assert (
            verdict.mirror is not None
            and verdict.mirror.armed
            and verdict.mirror.test == "tests/test_calc.py::test_add"
        )
    else:
        assert not verdict.resolved and after.tests is None, "the pair's run that died is not run again"


def test_a_hanging_unittest_test_fails_and_the_others_still_run(tmp_path: Path) -> None:
    """`python -m unittest` in the real sandbox, with nothing installed: the probe's alarm stops the hanging test,
    unittest reports it as an error, and the test after it runs."""
    repo = make_repo(tmp_path / "r", {
        "tests/__init__.py": "",
        "tests/test_loop.py": "import unittest\n\n\nclass T(unittest.TestCase):\n"
        "    def test_a_hangs(self):\n        while True:\n            pass\n\n"
        "    def test_b_runs(self):\n        self.assertEqual(1, 1)\n",
    })  # fmt: skip
    with get_provider("local").create(RepoSource(str(repo))) as sbx:
        run = run_tests(sbx, "python -m unittest discover -s tests -t .", timeout=120, per_test_timeout=2)
    assert not run.timed_out and run.duration_s < 60, run.log
    assert run.tests == {
        "tests.test_loop.T.test_a_hangs": "failed",
        "tests.test_loop.T.test_b_runs": "passed",
    }
    assert run.tests_timed_out == ["tests.test_loop.T.test_a_hangs"]
    assert "FAILED (errors=1)" in run.log
