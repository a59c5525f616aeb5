"""Grading: failed before, passes after, test files untouched — and a tampered test can never turn a grade green.

Real parts: pytest runs for real (on the host for the JUnit parser, in the real local bubblewrap sandbox for the rest).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bugsweep.grading import (
    TestRun,
    changed_files,
    commit_task_state,
    compute_patch,
    grade,
    parse_junit,
    restore_test_files,
    run_tests,
    touched_test_files,
)
from bugsweep.sandbox import RepoSource, get_provider
from bugsweep.settings import DEFAULT_TEST_GLOBS
from tests.support.repos import make_repo


def _run(tests: dict[str, str] | None, exit_code: int) -> TestRun:
    return TestRun(
        command="pytest", exit_code=exit_code, timed_out=False, log="", duration_s=0.1, tests=tests
    )


def test_parse_junit_gives_pytest_node_ids(tmp_path: Path) -> None:
    """Real pytest writes the XML; the parser turns it into node ids a user can paste into pytest."""
    repo = make_repo(tmp_path / "r")
    (repo / "tests" / "test_cls.py").write_text(
        "import pytest\n\nclass TestThing:\n    def test_ok(self):\n        pass\n\n"
        "    @pytest.mark.skip\n    def test_skip(self):\n        pass\n"
    )
    xml = tmp_path / "out.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            f"--junitxml={xml}",
            "-o",
            "junit_family=xunit1",
            "-p",
            "no:cacheprovider",
        ],
        cwd=repo,
        capture_output=True,
    )
    outcomes = parse_junit(xml.read_text())
    assert outcomes == {
        "tests/test_calc.py::test_add": "failed",
        "tests/test_calc.py::test_mul": "passed",
        "tests/test_cls.py::TestThing::test_ok": "passed",
        "tests/test_cls.py::TestThing::test_skip": "skipped",
    }


def test_grade_needs_all_three_conditions() -> None:
    before = _run({"t::a": "failed", "t::b": "passed"}, 1)
    fixed = _run({"t::a": "passed", "t::b": "passed"}, 0)
    broken = _run({"t::a": "passed", "t::b": "failed"}, 1)

    ok = grade(instance_id="x", before=before, after=fixed, touched=[])
    assert ok.resolved and ok.FAIL_TO_PASS == ["t::a"] and ok.PASS_TO_PASS == ["t::b"]

    assert not grade(instance_id="x", before=before, after=fixed, touched=["tests/test_t.py"]).resolved
    regress = grade(instance_id="x", before=before, after=broken, touched=[])
    assert not regress.resolved and regress.PASS_TO_FAIL == ["t::b"]
    already_passing = grade(instance_id="x", before=_run({"t::a": "passed"}, 0), after=fixed, touched=[])
    assert not already_passing.resolved and not already_passing.failed_before


def test_grade_checks_the_tasks_own_fail_to_pass_list() -> None:
    """A mined task names the tests that must pass; passing the command alone is not enough if one is missing."""
    before = _run({"t::a": "failed"}, 1)
    after = _run({"t::a": "passed"}, 0)
    assert grade(
        instance_id="x", before=before, after=after, touched=[], expected_fail_to_pass=["t::a"]
    ).resolved
    assert not grade(
        instance_id="x", before=before, after=after, touched=[], expected_fail_to_pass=["t::a", "t::gone"]
    ).resolved


def test_touched_test_files_uses_the_protected_patterns() -> None:
    changed = ["calc.py", "tests/test_calc.py", "conftest.py", "pkg/test_util.py", "docs/testing.md"]
    assert touched_test_files(changed, DEFAULT_TEST_GLOBS) == [
        "conftest.py",
        "pkg/test_util.py",
        "tests/test_calc.py",
    ]
    assert touched_test_files(["data/golden.json"], DEFAULT_TEST_GLOBS, extra=["data/golden.json"]) == [
        "data/golden.json"
    ]


@pytest.fixture
def sandbox(buggy_repo: Path):
    with get_provider("local").create(RepoSource(str(buggy_repo))) as sbx:
        yield sbx


def test_tampered_tests_are_restored_before_the_after_run(sandbox, buggy_repo: Path) -> None:
    """The agent weakens the test, deletes another and adds a conftest: all undone, and the grade stays red."""
    state = commit_task_state(sandbox)
    before = run_tests(sandbox, "python -m pytest -q")
    assert not before.passed and before.tests == {
        "tests/test_calc.py::test_add": "failed",
        "tests/test_calc.py::test_mul": "passed",
    }
    sandbox.files.write("/workspace/repo/tests/test_calc.py", "def test_add():\n    assert True\n")
    sandbox.files.write("/workspace/repo/conftest.py", "collect_ignore = ['tests']\n")
    changed = changed_files(sandbox, state)
    touched = touched_test_files(changed, DEFAULT_TEST_GLOBS)
    assert touched == ["conftest.py", "tests/test_calc.py"]
    assert "test_add" in compute_patch(sandbox, state)

    restore_test_files(sandbox, state, touched)
    after = run_tests(sandbox, "python -m pytest -q")
    verdict = grade(instance_id="calc", before=before, after=after, touched=touched)
    assert not verdict.passes_after and not verdict.tests_untouched and not verdict.resolved
    assert not sandbox.files.exists("/workspace/repo/conftest.py")
    assert "return a - b" in (buggy_repo / "calc.py").read_text(), "the user's checkout is never modified"


def test_a_real_fix_grades_green_and_the_patch_is_a_clean_diff(sandbox) -> None:
    state = commit_task_state(sandbox)
    before = run_tests(sandbox, "python -m pytest -q")
    sandbox.exec("sed -i 's/a - b/a + b/' calc.py && python -c 'import calc'")
    patch = compute_patch(sandbox, state)
    assert "-    return a - b\n+    return a + b" in patch
    assert "__pycache__" not in patch and ".pyc" not in patch
    touched = touched_test_files(changed_files(sandbox, state), DEFAULT_TEST_GLOBS)
    after = run_tests(sandbox, "python -m pytest -q")
    verdict = grade(instance_id="calc", before=before, after=after, touched=touched)
    assert verdict.resolved
    assert verdict.FAIL_TO_PASS == ["tests/test_calc.py::test_add"]
    assert verdict.PASS_TO_PASS == ["tests/test_calc.py::test_mul"]
