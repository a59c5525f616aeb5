"""Mining when tests hang, when the task's setup cannot test, and what a run says it wrote.

Real parts: real git repositories built by the test (tests.support.repos), the real local sandbox (bubblewrap +
overlayfs) running real pytest, and `bugsweep mine` as a user runs it, in a subprocess. No stand-ins.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bugsweep.mining import RejectReason, mine
from tests.support.repos import PYTEST_SETUP, commit_all, make_repo, write_files

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")

PYPROJECT = '[tool.pytest.ini_options]\npythonpath = ["."]\n'
#: Counting down by a step that skips zero never ends (without using memory: the loop only counts).
STEPS = "def steps_to_zero(n, step):\n    steps = 0\n    while n != 0:\n        n -= step\n        steps += 1\n    return steps\n"
TEST_EVEN = "from steps import steps_to_zero\n\n\ndef test_even():\n    assert steps_to_zero(4, 2) == 2\n"
TEST_ODD = "\n\ndef test_odd():\n    assert steps_to_zero(3, 2) == 2\n"


def endless_loop_history(root: Path) -> str:
    """A repository whose newest commit fixes an endless loop and adds the test that hangs without the fix."""
    repo = make_repo(root, {"steps.py": STEPS, "tests/test_steps.py": TEST_EVEN, "pyproject.toml": PYPROJECT})
    write_files(repo, {"steps.py": STEPS.replace("while n != 0", "while n > 0"),
                       "tests/test_steps.py": TEST_EVEN + TEST_ODD})  # fmt: skip
    return commit_all(repo, "Fix steps_to_zero() looping for ever when the step skips zero")


def test_a_fix_of_an_endless_loop_is_a_task_with_the_hanging_test_in_fail_to_pass(tmp_path: Path) -> None:
    from bugsweep.sandbox import get_provider

    sha = endless_loop_history(tmp_path / "repo")
    provider = get_provider("local")
    started = time.monotonic()
    result = mine(
        str(tmp_path / "repo"),
        provider=provider,
        runs=2,
        test_timeout=300,
        per_test_timeout=2,
        max_candidates=1,
    )
    took = time.monotonic() - started
    (task,) = result.tasks
    assert task.fix_commit == sha
    assert task.FAIL_TO_PASS == ["tests/test_steps.py::test_odd"]
    assert task.PASS_TO_PASS == ["tests/test_steps.py::test_even"]
    assert result.per_test_timeout_s == 2
    assert took < 120, f"two hanging runs of 2 s each took {took:.0f} s"

    # without a per-test limit the same history only has whole runs that time out: no task
    hung = mine(
        str(tmp_path / "repo"),
        provider=provider,
        runs=1,
        test_timeout=5,
        per_test_timeout=None,
        max_candidates=1,
    )
    assert hung.tasks == [] and [r.reason for r in hung.rejected] == [RejectReason.TIMED_OUT]


def _mine(repo: Path, out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "bugsweep.cli", "mine", str(repo), "--runs", "1", "--out", str(out), *args]


ENV = {**os.environ, "COLUMNS": "200"}


CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a + b\n"


def fix_history(root: Path) -> dict[str, str]:
    """Two fixes with their tests (add, then mul): candidates that all need the same environment."""
    repo = make_repo(root, {"calc.py": CALC, "pyproject.toml": PYPROJECT})
    shas = {}
    add_fixed = CALC.replace("a - b", "a + b")
    write_files(repo, {"calc.py": add_fixed,
                       "tests/test_add.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"})  # fmt: skip
    shas["add"] = commit_all(repo, "Fix add() returning the difference")
    write_files(repo, {"calc.py": add_fixed[: add_fixed.rindex("a + b")] + "a * b\n",
                       "tests/test_mul.py": "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"})  # fmt: skip
    shas["mul"] = commit_all(repo, "Fix mul() adding")
    return shas


@pytest.mark.parametrize(
    ("args", "module"),
    [(("--setup-command", ""), "pytest"), (("--test-command", "python -m pytset -q {test_files}"), "pytset")],
    ids=["no-pytest-installed", "misspelt-runner"],
)
def test_a_setup_that_cannot_test_stops_at_the_first_candidate(
    tmp_path: Path, args: tuple[str, str], module: str
) -> None:
    """Without the test runner in the task's environment (a setup that does not install pytest), or with a runner
    whose name is misspelt, every candidate would be rejected for the same reason: the run stops at the first one,
    exit 2, one line saying what is missing."""
    fix_history(tmp_path / "repo")
    out = tmp_path / "t.jsonl"
    proc = subprocess.run(
        _mine(tmp_path / "repo", out, *args), capture_output=True, text=True, env=ENV, timeout=300
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"no module {module}" in line and "--setup-command" in line and "Traceback" not in line
    report = json.loads(out.with_name("t.mining.json").read_text())
    assert report["validated"] == 1 and report["rejected"] == [] and len(report["unfinished"]) == 1
    assert f"no module {module}" in report["stopped"]
    assert f"no task was kept, and {out} was not written" in line and not out.exists()


OLD_TASKS = '{"old": "task from an earlier run"}\n'


def test_a_run_that_keeps_nothing_writes_an_empty_task_file_over_an_old_one(tmp_path: Path) -> None:
    make_repo(tmp_path / "repo", {"calc.py": "x = 1\n", "tests/test_calc.py": "def test_x():\n    pass\n"})
    out = tmp_path / "t.jsonl"
    out.write_text(OLD_TASKS)
    proc = subprocess.run(_mine(tmp_path / "repo", out), capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert out.read_text() == "" and f"tasks: {out} (0)" in proc.stdout
    assert json.loads(out.with_name("t.mining.json").read_text())["tasks_file"] == str(out)
    # a folder that is not there is bad input, said before anything runs
    proc = subprocess.run(_mine(tmp_path / "repo", tmp_path / "nowhere" / "t.jsonl"), capture_output=True,
                          text=True, env=ENV, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_each_candidate_says_whether_its_environment_was_built_or_reused(tmp_path: Path) -> None:
    """A setup command no earlier run used: the first state builds the environment, the next one reuses it."""
    shas = fix_history(tmp_path / "repo")
    out = tmp_path / "t.jsonl"
    setup = f"{PYTEST_SETUP} && : {tmp_path.name}-{time.time_ns()}"
    proc = subprocess.run(_mine(tmp_path / "repo", out, "--setup-command", setup), capture_output=True, text=True,
                          env=ENV, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kept = [line for line in proc.stdout.splitlines() if " kept " in line]
    assert len(kept) == 2 and shas["mul"][:10] in kept[0], proc.stdout
    assert kept[0].endswith("(environment built, reused)") and kept[1].endswith(
        "(environment reused, reused)"
    )
    assert "task environments: 1 built, 3 reused" in proc.stdout
    report = json.loads(out.with_name("t.mining.json").read_text())
    assert (report["environments_built"], report["environments_reused"]) == (1, 3)


def test_sigterm_is_reported_as_sigterm_naming_only_the_files_written(tmp_path: Path) -> None:
    fix_history(tmp_path / "repo")
    out = tmp_path / "t.jsonl"
    out.write_text(OLD_TASKS)
    state = tmp_path / "state"
    env = {**ENV, "BUGSWEEP_SANDBOX_STATE_DIR": str(state)}
    cmd = _mine(tmp_path / "repo", out, "--test-command", "sleep 600; python -m pytest -q {test_files}")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:  # progress comes line by line through a pipe
            if line.lstrip("[0123456789/] ").startswith("validate"):
                break
        time.sleep(3)  # the candidate's sandbox is up and its tests are sleeping
    finally:
        proc.send_signal(signal.SIGTERM)
    rest, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, rest + stderr
    assert "terminated (SIGTERM)" in stderr and "Ctrl-C" not in stderr and "Traceback" not in stderr
    # nothing was kept, so an older task file is left as it was, and not named as this run's
    assert f"no task was kept, and {out} was not written" in stderr and out.read_text() == OLD_TASKS
    report = json.loads(out.with_name("t.mining.json").read_text())
    assert report["stopped"] == "terminated (SIGTERM)" and len(report["unfinished"]) == 1
    assert not state.exists() or not any(state.iterdir())  # no sandbox left behind
