"""`bugsweep solve` end to end, as a user runs it: the real command line, the real local sandbox (bubblewrap +
overlayfs), real pytest. The model is a scripted OpenAI-compatible HTTP server (a stand-in, not a model), so each
run is deterministic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.repos import PYTEST_SETUP
from tests.support.scripted_model import text_reply, tool_call

SOLVE = [sys.executable, "-m", "bugsweep.cli"]


def solve(
    repo: Path,
    out: Path,
    base_url: str,
    *extra: str,
    task: str = "test_add fails: add() is wrong. Fix it.",
    test_command: str = "python -m pytest -q",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    environment = {
        **os.environ,
        "LLM_BASE_URL": base_url,
        "LLM_MODEL": "scripted",
        "LLM_API_KEY": "sk-test-SECRET-do-not-leak",
        "COLUMNS": "200",
        **(env or {}),
    }
    args = [
        *SOLVE,
        "solve",
        "--repo",
        str(repo),
        "--task",
        task,
        "--test-command",
        test_command,
        "--setup-command",
        PYTEST_SETUP,
        "--out",
        str(out),
    ]
    return subprocess.run([*args, *extra], env=environment, capture_output=True, text=True, timeout=300)


def read_grade(out: Path) -> dict:
    return json.loads((out / "grade.json").read_text())


def test_a_model_that_fixes_the_bug_is_resolved(buggy_repo: Path, tmp_path: Path, scripted_model) -> None:
    server = scripted_model(
        [
            tool_call("run", command="python -m pytest -q"),
            tool_call("read_file", path="calc.py"),
            tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b"),
            tool_call("run", command="python -m pytest -q"),
            tool_call("finish", summary="add() subtracted; it adds now."),
        ]
    )
    out = tmp_path / "out"
    proc = solve(buggy_repo, out, server.base_url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    grade = read_grade(out)
    assert grade["resolved"] and grade["failed_before"] and grade["passes_after"] and grade["tests_untouched"]
    assert grade["stop_reason"] == "finished" and grade["turns"] == 5
    assert grade["prompt_tokens"] > 0 and grade["completion_tokens"] > 0
    assert grade["FAIL_TO_PASS"] == ["tests/test_calc.py::test_add"]
    assert "+    return a + b" in (out / "patch.diff").read_text()
    trajectory = (out / "trajectory.json").read_text()
    assert "edit_file" in trajectory and "sk-test-SECRET" not in trajectory
    assert "1 failed" in (out / "tests_before.log").read_text()
    assert "2 passed" in (out / "tests_after.log").read_text()
    mirrored = (out / "tests_mirror.log").read_text()
    assert "1 failed, 1 passed" in mirrored and "the mirror run's false assertion" in mirrored, (
        "test_add, made to fail"
    )
    assert grade["mirror"]["armed"] and grade["mirror"]["test"] == "tests/test_calc.py::test_add"
    # progress: one line per tool call, then the summary
    assert proc.stdout.count("edit_file") >= 1 and "RESOLVED" in proc.stdout
    assert "sk-test-SECRET" not in proc.stdout + proc.stderr
    assert "return a - b" in (buggy_repo / "calc.py").read_text(), "the user's checkout is untouched"


def test_a_model_that_edits_the_test_is_not_resolved(
    buggy_repo: Path, tmp_path: Path, scripted_model
) -> None:
    """edit_file refuses test files, so the model writes it with a shell command; the grader restores it."""
    server = scripted_model(
        [
            tool_call("edit_file", path="tests/test_calc.py", old="== 5", new="== -1"),
            tool_call("run", command="sed -i 's/== 5/== -1/' tests/test_calc.py && python -m pytest -q"),
            tool_call("finish", summary="tests pass"),
        ]
    )
    out = tmp_path / "out"
    proc = solve(buggy_repo, out, server.base_url)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    grade = read_grade(out)
    assert not grade["resolved"] and not grade["tests_untouched"] and not grade["passes_after"]
    assert grade["touched_test_files"] == ["tests/test_calc.py"]
    assert grade["dropped"] == {"tests/test_calc.py": "test file"}
    assert (
        "dropped before grading: tests/test_calc.py (test file)" in proc.stdout and "why not:" in proc.stdout
    )
    refusal = json.dumps(json.loads((out / "trajectory.json").read_text()))
    assert "test file" in refusal.lower()
    assert "NOT RESOLVED" in proc.stdout


def test_a_model_that_finishes_at_once_is_not_resolved(
    buggy_repo: Path, tmp_path: Path, scripted_model
) -> None:
    server = scripted_model([tool_call("finish", summary="All done, trust me.")])
    out = tmp_path / "out"
    proc = solve(buggy_repo, out, server.base_url)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    grade = read_grade(out)
    assert not grade["resolved"] and grade["failed_before"] and not grade["passes_after"]
    assert (out / "patch.diff").read_text() == ""


def test_tests_that_already_pass_could_not_run(buggy_repo: Path, tmp_path: Path, scripted_model) -> None:
    server = scripted_model([])
    out = tmp_path / "out"
    # the test command names only the passing test
    proc = solve(
        buggy_repo, out, server.base_url, test_command="python -m pytest -q tests/test_calc.py::test_mul"
    )
    assert proc.returncode == 2
    assert "already pass" in proc.stderr
    assert read_grade(out)["failure_kind"] == "task"
    assert server.requests == [], "the model is never called for a task that is not real"


@pytest.mark.parametrize(
    ("test_command", "why"),
    [
        ("no-such-test-runner --all", "not found (exit 127)"),
        ("python -m no_such_runner", "no module no_such_runner"),
        ("python -m pytest -q tests/test_missing.py", "usage error (exit 4"),
        ("python -m pytest -q -k no_test_has_this_name", "collected no test (exit 5)"),
    ],
)
def test_a_test_command_that_cannot_run_stops_before_the_model(
    buggy_repo: Path, tmp_path: Path, scripted_model, test_command: str, why: str
) -> None:
    """A command that tests nothing fails, but not because of a bug: no task, exit 2, the command named."""
    server = scripted_model([])
    out = tmp_path / "out"
    proc = solve(buggy_repo, out, server.base_url, test_command=test_command)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = " ".join(proc.stderr.split())
    assert "cannot run" in message and test_command in message and why in message.lower()
    grade = read_grade(out)
    assert grade["failure_kind"] == "task" and test_command in grade["error"]
    assert server.requests == [], "the model is never called for a task that does not exist"


def test_a_model_url_where_nothing_listens_could_not_run_and_is_not_retried(
    buggy_repo: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    # the discard port: nothing listens there, so the connection is refused (a wrong URL, not an outage)
    proc = solve(buggy_repo, out, "http://127.0.0.1:9/v1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "could not run" in proc.stderr and "http://127.0.0.1:9/v1" in proc.stderr
    grade = read_grade(out)
    assert grade["failure_kind"] == "config" and "after 1 attempt" in grade["error"]


def test_a_wrong_model_name_fails_in_seconds_before_the_setup(
    buggy_repo: Path, tmp_path: Path, scripted_model
) -> None:
    """The endpoint serves other models (a scripted stand-in listing them on GET /models, as real servers do); the
    setup would take five minutes. The run fails at once, naming the model and what is served, and no setup ran."""
    server = scripted_model([], served=["deepseek-chat", "deepseek-reasoner"])
    out = tmp_path / "out"
    proc = solve(
        buggy_repo, out, server.base_url, "--setup-command", "sleep 300",
        env={"LLM_MODEL": "deepseek-chta"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = " ".join(proc.stderr.split())
    assert "does not serve model 'deepseek-chta'" in message and "deepseek-chat" in message
    grade = read_grade(out)
    assert grade["failure_kind"] == "config" and grade["wall_s"] < 30
    assert "▸ model" in proc.stdout and "▸ sandbox" not in proc.stdout, "no sandbox was made, no setup ran"
    assert server.requests == [], "no chat request either: the models list said enough"


def test_a_missing_repo_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*SOLVE, "solve", "--repo", str(tmp_path / "nope"), "--task", "x", "--test-command", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "neither a folder nor a git URL" in proc.stderr


@pytest.mark.parametrize("args", [["--help"], ["solve", "--help"], ["demo", "--help"]])
def test_help_explains(args: list[str]) -> None:
    proc = subprocess.run(
        [*SOLVE, *args], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"}
    )
    assert proc.returncode == 0 and "Usage" in proc.stdout


# -- policies: what the harness does for the model is named and recorded ---------------------------------------
# The same script under each policy: a wrong one-line edit inside add(), then a whole corrected function written as
# a code block, then finish. The model is the scripted stand-in server, so the difference is the harness's alone.
WRONG_EDIT = tool_call("edit_file", path="calc.py", old="return a - b", new="return a * b")
FUNCTION_AS_TEXT = text_reply("```python\ndef add(a, b):\n    return a + b\n```")


def test_policy_plain_is_recorded_and_runs_edits_as_sent(
    buggy_repo: Path, tmp_path: Path, scripted_model
) -> None:
    server = scripted_model([WRONG_EDIT, FUNCTION_AS_TEXT, tool_call("finish", summary="x")])
    out = tmp_path / "out"
    proc = solve(buggy_repo, out, server.base_url, "--policy", "plain")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    grade = read_grade(out)
    assert grade["policy"] == "plain" and not grade["resolved"]
    assert "+    return a * b" in (out / "patch.diff").read_text(), "the edit was applied as sent"
    events = json.loads((out / "trajectory.json").read_text())
    assert events[0]["type"] == "meta" and events[0]["policy"] == "plain"
    assert not [e for e in events if e["type"] in ("edit_tried", "rewrite_requested", "forgotten")]
    assert "policy: plain" in proc.stdout
    # what made the run, in grade.json and the trajectory, with its digest, and never the key
    digest = grade["config_digest"]
    assert (
        len(digest) == 12
        and grade["config"]["policy"] == "plain"
        and grade["config"]["model"]["model"] == "scripted"
    )
    assert events[0]["config_digest"] == digest and events[0]["config"] == grade["config"]
    assert f"configuration: {digest}" in proc.stdout
    assert "sk-test-SECRET" not in (out / "grade.json").read_text()


def test_policy_small_model_is_recorded_and_asks_for_the_whole_function(
    buggy_repo: Path, tmp_path: Path, scripted_model
) -> None:
    server = scripted_model([WRONG_EDIT, FUNCTION_AS_TEXT, tool_call("finish", summary="x")])
    out = tmp_path / "out"
    proc = solve(buggy_repo, out, server.base_url, env={"BUGSWEEP_POLICY": "small-model"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    grade = read_grade(out)
    assert grade["policy"] == "small-model" and grade["resolved"]
    events = json.loads((out / "trajectory.json").read_text())
    assert events[0]["policy"] == "small-model"
    tried = [e for e in events if e["type"] == "edit_tried"]
    assert [(e["function"], e["kept"]) for e in tried] == [("add", False)], (
        "the wrong edit was tried and undone"
    )
    assert [e["function"] for e in events if e["type"] == "rewrite_requested"] == ["add"]
    assert "policy: small-model" in proc.stdout


def test_an_unknown_policy_is_refused(buggy_repo: Path, tmp_path: Path, scripted_model) -> None:
    server = scripted_model([])
    proc = solve(buggy_repo, tmp_path / "out", server.base_url, "--policy", "helpful")
    assert proc.returncode == 2 and "helpful" in proc.stderr
    assert server.requests == []


# -- exit codes: 2 for whatever is not the model's failure, with one line and no traceback ------------------------


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"LLM_MAX_RETRIES": "abc"}, "LLM_MAX_RETRIES"),
        ({"BUGSWEEP_MAX_TURNS": "0"}, "BUGSWEEP_MAX_TURNS"),
        ({"LLM_PRICE_PROMPT_PER_MTOK": "-1"}, "LLM_PRICE_PROMPT_PER_MTOK"),
        ({"BUGSWEEP_POLICY": "helpful"}, "BUGSWEEP_POLICY"),
    ],
)
def test_bad_settings_could_not_run_with_one_line(
    buggy_repo: Path, tmp_path: Path, scripted_model, env: dict[str, str], named: str
) -> None:
    server = scripted_model([])
    proc = solve(buggy_repo, tmp_path / "out", server.base_url, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    message = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(message) == 1 and "could not run" in message[0] and named in message[0], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert server.requests == [], "nothing ran"


@pytest.mark.parametrize("option", [["--max-turns", "0"], ["--max-cost", "-1"]])
def test_bad_argument_values_are_refused(buggy_repo: Path, tmp_path: Path, option: list[str]) -> None:
    proc = solve(buggy_repo, tmp_path / "out", "http://127.0.0.1:9/v1", *option)
    assert proc.returncode == 2 and option[0] in proc.stderr and "Traceback" not in proc.stderr


def test_a_crash_in_bugsweep_could_not_run_and_its_traceback_goes_to_a_log(
    buggy_repo: Path, tmp_path: Path, scripted_model
) -> None:
    """A bug in bugsweep, injected: the real command line in a real process, with pipeline.regrade replaced by a
    function that raises. Exit 2 (not 1, which would blame the model), one line naming the log, no traceback."""
    server = scripted_model([tool_call("finish", summary="x")])
    out = tmp_path / "out"
    inject = (
        "import sys, bugsweep.pipeline as p\n"
        "def regrade(*args, **kwargs):\n"
        "    raise RuntimeError('injected crash')\n"
        "p.regrade = regrade\n"
        "from bugsweep.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    environment = {**os.environ, "LLM_BASE_URL": server.base_url, "LLM_MODEL": "scripted", "COLUMNS": "300"}
    args = ["solve", "--repo", str(buggy_repo), "--task", "fix add", "--test-command", "python -m pytest -q"]
    args += ["--setup-command", PYTEST_SETUP]
    proc = subprocess.run(
        [sys.executable, "-c", inject, *args, "--out", str(out)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "crash" in line and "RuntimeError: injected crash" in line
    log = out / "crash.log"
    assert str(log.resolve()) in line
    assert "Traceback" in log.read_text() and "injected crash" in log.read_text()
    grade = read_grade(out)
    assert grade["failure_kind"] == "crash" and "injected crash" in grade["error"]


# -- an interrupted solve keeps what the agent used ------------------------------------------------------------


def test_sigterm_mid_agent_records_turns_tokens_and_time_and_releases_the_sandbox(
    buggy_repo: Path, tmp_path: Path, scripted_model
) -> None:
    """A real SIGTERM to a real `bugsweep solve` process while the agent's second command runs (`sleep 120` in
    the sandbox): the grade keeps the two turns, their tokens and the time, and no sandbox is left behind."""
    import signal
    import time

    server = scripted_model([tool_call("read_file", path="calc.py"), tool_call("run", command="sleep 120")])
    out, state = tmp_path / "out", tmp_path / "sandboxes"
    environment = {
        **os.environ,
        "LLM_BASE_URL": server.base_url,
        "LLM_MODEL": "scripted",
        "BUGSWEEP_SANDBOX_STATE_DIR": str(state),
        "BUGSWEEP_POLICY": "plain",
    }
    args = ["solve", "--repo", str(buggy_repo), "--task", "fix add", "--test-command", "python -m pytest -q"]
    args += ["--setup-command", PYTEST_SETUP]
    proc = subprocess.Popen(
        [*SOLVE, *args, "--out", str(out)],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while len(server.requests) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert len(server.requests) == 2, "the agent reached its second turn"
        time.sleep(2)  # the reply is in, and `sleep 120` is running in the sandbox
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, stdout + stderr
    assert "terminated" in stderr and "Traceback" not in stdout + stderr
    grade = read_grade(out)
    assert grade["failure_kind"] == "cancelled" and not grade["resolved"]
    assert grade["turns"] == 2 and grade["policy"] == "plain"
    assert grade["prompt_tokens"] > 0 and grade["completion_tokens"] > 0
    assert 2 <= grade["agent_wall_s"] <= grade["wall_s"]
    assert json.loads((out / "trajectory.json").read_text())[-1]["type"] == "crash"
    assert not [p for p in state.glob("*") if p.is_dir()], "the sandbox was released"
