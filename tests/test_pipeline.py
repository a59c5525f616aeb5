"""The one-task pipeline's steps, on the real local sandbox with real git and pytest (no model involved)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bugsweep.errors import NotARealTask, SetupFailed, TaskError, TestCommandCannotRun
from bugsweep.pipeline import baseline, prepare, regrade, setup
from bugsweep.sandbox import get_provider
from bugsweep.spec import TaskSpec
from tests.support.repos import PYTEST_SETUP, make_repo

GOOD_CALC = {
    "calc.py": "def add(a, b):\n    return a + b\n",
    "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\n',
}
NEW_TEST_PATCH = """\
diff --git a/tests/test_new.py b/tests/test_new.py
new file mode 100644
--- /dev/null
+++ b/tests/test_new.py
@@ -0,0 +1,5 @@
+from calc import add
+
+
+def test_negative():
+    assert add(-2, -3) == -6
"""


def test_test_patch_is_applied_and_becomes_part_of_the_task_state(tmp_path: Path) -> None:
    """A mined task: the repo's own tests pass, the fix commit's test (applied as test_patch) fails."""
    repo = make_repo(tmp_path / "r", GOOD_CALC)
    spec = TaskSpec(
        repo=str(repo),
        problem_statement="x",
        test_command="python -m pytest -q",
        test_patch=NEW_TEST_PATCH,
        setup_command=PYTEST_SETUP,
    )
    prepared = prepare(spec, get_provider("local"))
    try:
        setup(prepared)
        before = baseline(prepared)
        assert before.tests == {"tests/test_new.py::test_negative": "failed"}
        grade, _after, patch = regrade(prepared, before, None)
        assert patch == "", "the test patch is part of the task state, not of the agent's change"
        assert grade.tests_untouched and not grade.resolved
    finally:
        prepared.sandbox.release()


def test_a_patch_that_does_not_apply_is_a_task_error(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", GOOD_CALC)
    bad = NEW_TEST_PATCH.replace("new file mode 100644\n--- /dev/null", "--- a/tests/test_new.py")
    spec = TaskSpec(repo=str(repo), problem_statement="x", test_command="true", test_patch=bad)
    with pytest.raises(TaskError, match="does not apply"):
        prepare(spec, get_provider("local"))


def test_passing_tests_mean_no_task(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", GOOD_CALC)
    prepared = prepare(
        TaskSpec(repo=str(repo), problem_statement="x", test_command="true"), get_provider("local")
    )
    with prepared.sandbox, pytest.raises(NotARealTask, match="already pass"):
        setup(prepared)
        baseline(prepared)


@pytest.mark.parametrize(
    "test_command",
    [
        "pytest-that-is-not-installed -q",
        "python -m pytest -q --no-such-option",
        "python -m pytest -q -k nothing",
    ],
)
def test_a_test_command_that_cannot_run_is_not_a_failing_test(tmp_path: Path, test_command: str) -> None:
    prepared = prepare(
        TaskSpec(
            repo=str(make_repo(tmp_path / "r")),
            problem_statement="x",
            test_command=test_command,
            setup_command=PYTEST_SETUP,
        ),
        get_provider("local"),
    )
    with prepared.sandbox, pytest.raises(TestCommandCannotRun, match="cannot run") as info:
        setup(prepared)
        baseline(prepared)
    assert test_command in str(info.value)


def test_a_real_failure_is_not_mistaken_for_a_command_that_cannot_run(tmp_path: Path) -> None:
    """A test that fails on a missing import is a failing test (the bug), not a missing test runner."""
    files = {"tests/test_x.py": "def test_x():\n    import not_written_yet\n"}
    prepared = prepare(
        TaskSpec(
            repo=str(make_repo(tmp_path / "r", files)),
            problem_statement="x",
            test_command="python -m pytest -q",
            setup_command=PYTEST_SETUP,
        ),
        get_provider("local"),
    )
    with prepared.sandbox:
        setup(prepared)
        before = baseline(prepared)
    assert before.tests == {"tests/test_x.py::test_x": "failed"}


def test_setup_output_is_not_part_of_the_patch_and_failures_are_reported(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r")
    spec = TaskSpec(
        repo=str(repo),
        problem_statement="x",
        test_command="python -m pytest -q",
        setup_command=f"{PYTEST_SETUP} && mkdir -p build && echo made > build/out.txt",
    )
    prepared = prepare(spec, get_provider("local"))
    with prepared.sandbox:
        setup(prepared)
        before = baseline(prepared)
        _, _, patch = regrade(prepared, before, None)
        assert "build/out.txt" not in patch
    failing = spec.model_copy(update={"setup_command": "echo broken >&2; exit 3"})
    prepared = prepare(failing, get_provider("local"))
    with prepared.sandbox, pytest.raises(SetupFailed, match="exited with 3") as info:
        setup(prepared)
    assert "broken" in str(info.value)


def test_a_setup_that_cannot_reach_the_package_index_is_an_outage_not_the_tasks_failure(
    tmp_path: Path,
) -> None:
    """A real pip in the real sandbox, pointed at an index where nothing listens (the sandbox's own loopback): the
    setup fails as an outage (infra, retried), while a package that does not exist on a reachable index would be
    the task's failure (the case above)."""
    from bugsweep.errors import SetupUnreachable, failure_kind

    repo = make_repo(tmp_path / "r")
    spec = TaskSpec(
        repo=str(repo),
        problem_statement="x",
        test_command="python -m pytest -q",
        setup_command="python -m pip install --retries 1 --timeout 5 --index-url http://127.0.0.1:9/simple "
        "no-such-package-bugsweep",
    )
    prepared = prepare(spec, get_provider("local"))
    with prepared.sandbox, pytest.raises(SetupUnreachable, match="could not be reached") as info:
        setup(prepared)
    assert failure_kind(info.value) == "infra"
    assert "no-such-package-bugsweep" in str(info.value)
