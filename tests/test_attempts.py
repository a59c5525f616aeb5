"""Several attempts at a task, and a cheaper model first (bugsweep.attempts), as a user runs them: the real
`bugsweep solve` command line, the real local sandbox (bubblewrap + overlayfs), real pytest, the clean room's
regrade, and `bugsweep review` on the run folder.

Stand-in: the models are scripted OpenAI-compatible HTTP servers (tests/support/scripted_model.py), NOT models.
Each reply is decided from the request: the temperature it was sent at tells a run's first attempt (the model's
own temperature, 0) from a later one (`retry_temperature`, 0.7), so each script is deterministic.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.repos import PYTEST_SETUP
from tests.support.scripted_model import ScriptedModelServer, tool_call

SOLVE = [sys.executable, "-m", "bugsweep.cli"]
SECRET = "sk-attempts-SECRET-never-written"
STRONG_SECRET = "sk-strong-SECRET-never-written"
FIX = tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")
#: edit_file refuses test files, so this "fix" rewrites the test with a shell command and claims success.
CHEAT = tool_call("run", command="sed -i 's/== 5/== -1/' tests/test_calc.py && python -m pytest -q")


def answered(body: dict[str, Any]) -> bool:
    return any(m.get("role") == "tool" for m in body["messages"])


def first_attempt(body: dict[str, Any]) -> bool:
    return body.get("temperature") == 0


def cheats_then_fixes(body: dict[str, Any]) -> dict[str, Any]:
    """First attempt: edits the test file and says the tests pass. Later attempts: the real fix."""
    if answered(body):
        return tool_call("finish", summary="the tests pass")
    return CHEAT if first_attempt(body) else FIX


def fixes(body: dict[str, Any]) -> dict[str, Any]:
    return tool_call("finish", summary="fixed") if answered(body) else FIX


def gives_up(body: dict[str, Any]) -> dict[str, Any]:
    return tool_call("finish", summary="nothing to fix")


def posts(server: ScriptedModelServer) -> int:
    """Chat requests the server answered (its GET /models, the endpoint check, is not one)."""
    return len(server.requests)


def solve(
    repo: Path, out: Path, base_url: str, *extra: str, env: dict[str, str] | None = None, **popen: Any
) -> Any:
    environment = {
        **os.environ, "LLM_BASE_URL": base_url, "LLM_MODEL": "cheap", "LLM_API_KEY": SECRET, "COLUMNS": "250",
        "BUGSWEEP_POLICY": "plain", "LLM_PRICE_PROMPT_PER_MTOK": "1.0", "LLM_PRICE_COMPLETION_PER_MTOK": "2.0",
        **(env or {}),
    }  # fmt: skip
    args = [*SOLVE, "solve", "--repo", str(repo), "--task", "test_add fails: add() is wrong. Fix it.",
            "--test-command", "python -m pytest -q", "--setup-command", PYTEST_SETUP, "--out", str(out), *extra]  # fmt: skip
    if popen:
        return subprocess.Popen(args, env=environment, text=True, **popen)
    return subprocess.run(args, env=environment, capture_output=True, text=True, timeout=300)


def read_grade(out: Path) -> dict[str, Any]:
    return json.loads((out / "grade.json").read_text())


def every_file_text(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


def test_a_second_attempt_that_fixes_is_kept_and_the_first_that_cheated_is_not(
    buggy_repo: Path, tmp_path: Path, scripted_model
) -> None:
    """The first attempt edits the test file and says the tests pass: the clean room drops the edit, the tests
    fail, not resolved. The second attempt (at the retry temperature) fixes the code: resolved at attempt 2, the
    honest attempt is the one kept, both trajectories are kept, turns, tokens and cost are summed. The model the
    task escalates to ('strong', a second scripted endpoint) is never asked: the first model resolved it."""
    server, strong = scripted_model([cheats_then_fixes] * 10), scripted_model([fixes] * 10)
    out = tmp_path / "out"

    proc = solve(
        buggy_repo, out, server.base_url, "--attempts", "3", "--escalate-to", f"strong={strong.base_url}"
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["temperature"] for r in server.requests] == [0, 0, 0.7, 0.7], (
        "attempt 2 at the retry temperature"
    )
    assert posts(strong) == 0, "the cascade stops at the first model that resolves"
    grade = read_grade(out)
    assert grade["resolved"] and grade["kept_attempt"] == 2 and grade["tests_untouched"]
    assert grade["FAIL_TO_PASS"] == ["tests/test_calc.py::test_add"]
    cheat, honest = grade["attempts"]  # the third was never made
    assert (cheat["verdict"], cheat["temperature"], cheat["turns"]) == ("not resolved", 0.0, 2)
    assert cheat["summary"] == "the tests pass" and "test_calc.py" in cheat["reason"]
    assert (honest["verdict"], honest["temperature"], honest["turns"]) == ("resolved", 0.7, 2)
    # turns, tokens and cost are the sum over the attempts; the cost is the tokens at the model's prices
    assert grade["turns"] == 4 and grade["stop_reason"] == "finished"
    for field in ("prompt_tokens", "completion_tokens", "cost_usd", "agent_wall_s"):
        assert grade[field] == pytest.approx(cheat[field] + honest[field]), field
    assert cheat["prompt_tokens"] > 0 and honest["prompt_tokens"] > 0
    assert grade["cost_usd"] == pytest.approx((grade["prompt_tokens"] + 2 * grade["completion_tokens"]) / 1e6)
    assert grade["wall_s"] >= cheat["wall_s"] + honest["wall_s"]
    # both trajectories kept, each its own agent run; the kept one at the top, with its patch
    trajectories = [json.loads((out / f"attempts/{n}/trajectory.json").read_text()) for n in (1, 2)]
    assert [(t[0]["attempt"], t[0]["temperature"]) for t in trajectories] == [(1, 0), (2, 0.7)]
    assert [t[-1]["summary"] for t in trajectories] == ["the tests pass", "the tests pass"]
    assert (out / "trajectory.json").read_text() == (out / "attempts/2/trajectory.json").read_text()
    assert "tests/test_calc.py" in (out / "attempts/1/patch.diff").read_text()
    kept_patch = (out / "patch.diff").read_text()
    assert kept_patch == (out / "attempts/2/patch.diff").read_text() and "+    return a + b" in kept_patch
    assert "tests/test_calc.py" not in kept_patch, "the kept patch is the honest one"
    assert "FAILED tests/test_calc.py::test_add" in (out / "attempts/1/tests_after.log").read_text()
    assert not list(out.glob("attempts/*/grade.json")), "one grade per run: a review lists one run"
    assert "resolved at attempt 2 of 6 (cheap)" in proc.stdout
    assert "attempt 1: cheap at temperature 0, not resolved" in proc.stdout
    assert SECRET not in every_file_text(out) + proc.stdout + proc.stderr
    agent = grade["config"]["agent"]
    later = [m["model"] for m in grade["config"]["escalate_to"]]
    assert (agent["attempts"], agent["retry_temperature"], later) == (3, 0.7, ["strong"])

    # the review page of the run folder says so (HTML: its text is enough, no browser needed)
    page = subprocess.run([*SOLVE, "review", str(out)], capture_output=True, text=True, timeout=120)
    assert page.returncode == 0, page.stdout + page.stderr
    html = (out / "review.html").read_text()
    assert html.count("resolved at attempt 2 of 6 (cheap)") == 2, "in the index and in the run's head"
    attempts_table = html.split("<h3>Attempts</h3>")[1].split("</table>")[0]
    assert "2 (kept)" in attempts_table and "touched the test infrastructure" in attempts_table


def test_when_no_attempt_is_resolved_none_is_kept_and_the_task_is_not_resolved(
    buggy_repo: Path, tmp_path: Path, scripted_model
) -> None:
    """The first attempt cheats, the second gives up: neither is kept; the verdict (and the files at the run
    folder's top) are the last attempt's."""
    server = scripted_model(
        [lambda body: cheats_then_fixes(body) if first_attempt(body) else gives_up(body)] * 10
    )
    out = tmp_path / "out"

    proc = solve(buggy_repo, out, server.base_url, "--attempts", "2")

    assert proc.returncode == 1, proc.stdout + proc.stderr
    grade = read_grade(out)
    assert not grade["resolved"] and grade["kept_attempt"] is None
    assert [a["verdict"] for a in grade["attempts"]] == ["not resolved", "not resolved"]
    assert grade["attempts"][0]["summary"] == "the tests pass" and grade["summary"] == "nothing to fix"
    assert grade["tests_untouched"] and grade["dropped"] == {}, "the last attempt's verdict, not the cheat's"
    assert (out / "trajectory.json").read_text() == (out / "attempts/2/trajectory.json").read_text()
    assert (out / "patch.diff").read_text() == ""
    assert grade["turns"] == 3 and "not resolved in 2 attempts" in proc.stdout


def test_a_cascade_asks_the_stronger_model_on_what_the_cheaper_one_did_not_resolve(
    buggy_repo: Path, tmp_path: Path, scripted_model
) -> None:
    """Two scripted endpoints: LLM_MODEL ('cheap', free) first, then 'strong' (its key in its own variable, its own
    prices). Cheap does not fix the bug, so strong's attempt is kept, and the grade says which model made each
    attempt and what each cost. (Where cheap fixes it, strong is never asked: the first test above.)"""
    strong_prices = ["--escalate-set", "strong:price_prompt_per_mtok=10", "--escalate-set",
                     "strong:price_completion_per_mtok=30"]  # fmt: skip
    free = {
        "LLM_PRICE_PROMPT_PER_MTOK": "0",
        "LLM_PRICE_COMPLETION_PER_MTOK": "0",
        "STRONG_KEY": STRONG_SECRET,
    }

    cheap, strong = scripted_model([gives_up] * 10), scripted_model([fixes] * 10)
    out = tmp_path / "escalated"
    proc = solve(buggy_repo, out, cheap.base_url, "--escalate-to", f"strong={strong.base_url},STRONG_KEY",
                 *strong_prices, env=free)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (posts(cheap), posts(strong)) == (1, 2)
    assert all(h["authorization"] == f"Bearer {STRONG_SECRET}" for h in strong.request_headers)
    assert all(h["authorization"] == f"Bearer {SECRET}" for h in cheap.request_headers), "each key to its own"
    grade = read_grade(out)
    assert grade["resolved"] and grade["kept_attempt"] == 2 and grade["model"] == "cheap"
    first, second = grade["attempts"]
    assert (first["model"], first["endpoint"], first["verdict"]) == ("cheap", 1, "not resolved")
    assert (second["model"], second["endpoint"], second["verdict"]) == ("strong", 2, "resolved")
    assert first["cost_usd"] == 0 and second["cost_usd"] == pytest.approx(
        (10 * second["prompt_tokens"] + 30 * second["completion_tokens"]) / 1e6
    )
    assert grade["cost_usd"] == pytest.approx(second["cost_usd"]) and grade["cost_usd"] > 0
    # the configuration names the whole cascade, never a key
    later = grade["config"]["escalate_to"]
    assert [(m["model"], m["base_url"]) for m in later] == [("strong", strong.base_url)]
    assert "resolved at attempt 2 of 2 (strong)" in proc.stdout
    text = every_file_text(out) + proc.stdout + proc.stderr
    assert SECRET not in text and STRONG_SECRET not in text


def test_a_sigterm_mid_attempt_keeps_every_attempts_use_and_releases_their_sandboxes(
    buggy_repo: Path, tmp_path: Path, scripted_model
) -> None:
    """A real SIGTERM to a real `bugsweep solve` while its second attempt's command runs (`sleep 120` in that
    attempt's own sandbox): grade.json records the first attempt, the second as cut short with what it used, the
    sums; no sandbox is left behind."""
    sleeper = tool_call("run", command="sleep 120")
    server = scripted_model([lambda body: gives_up(body) if first_attempt(body) else sleeper] * 5)
    out, state = tmp_path / "out", tmp_path / "sandboxes"
    proc = solve(buggy_repo, out, server.base_url, "--attempts", "2", env={"BUGSWEEP_SANDBOX_STATE_DIR": str(state)},
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while posts(server) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert posts(server) == 2, "the second attempt's agent asked its first turn"
        time.sleep(2)  # `sleep 120` is running in the second attempt's sandbox
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, stdout + stderr
    grade = read_grade(out)
    assert grade["failure_kind"] == "cancelled" and not grade["resolved"] and grade["kept_attempt"] is None
    first, cut = grade["attempts"]
    assert first["verdict"] == "not resolved" and first["turns"] == 1
    assert (cut["verdict"], cut["failure_kind"], cut["turns"]) == ("could not run", "cancelled", 1)
    assert cut["prompt_tokens"] > 0 and cut["wall_s"] >= 2
    assert grade["turns"] == 2 and grade["prompt_tokens"] == first["prompt_tokens"] + cut["prompt_tokens"]
    assert json.loads((out / "attempts/2/trajectory.json").read_text())[-1]["type"] == "crash"
    assert not [p for p in state.glob("*") if p.is_dir()], "both attempts' sandboxes were released"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--attempts", "0"], "--attempts"),
        (["--attempts", "21"], "--attempts"),
        (["--escalate-to", "strong=not-a-url"], "not an http(s) URL"),
        (
            ["--escalate-to", "strong=http://127.0.0.1:9/v1,NO_SUCH_KEY_VARIABLE"],
            "NO_SUCH_KEY_VARIABLE is not set",
        ),
        (["--escalate-set", "strong:temperature=1"], "--escalate-set is for --escalate-to"),
        (["--escalate-to", "s=http://127.0.0.1:9/v1", "--escalate-set", "s:api_key=x"], "not a setting"),
    ],
)
def test_bad_attempts_or_escalation_options_exit_2_in_one_line(
    buggy_repo: Path, tmp_path: Path, args: list[str], says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line in this process (typer's runner): each is refused before anything runs."""
    from typer.testing import CliRunner

    from bugsweep.cli import app

    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.delenv("NO_SUCH_KEY_VARIABLE", raising=False)
    out = tmp_path / "out"
    given = [
        "solve",
        "--repo",
        str(buggy_repo),
        "--task",
        "x",
        "--test-command",
        "true",
        "--out",
        str(out),
        *args,
    ]
    result = CliRunner().invoke(app, given)
    assert result.exit_code == 2 and says in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output and not out.exists()


def test_an_attempt_held_for_review_is_not_kept_and_the_next_one_runs() -> None:
    """The grade of a run whose first attempt's tests passed with a suspicious signal (held for review: not
    resolved) and whose second attempt was resolved keeps the second; had the second not been resolved either,
    none would be kept and the verdict would be the last attempt's (the grades here are made by hand: the clean
    room's side of it is tests/test_grading.py's)."""
    from bugsweep.attempts import AttemptOutcome, PlannedAttempt, combine, kept, resolved_at
    from bugsweep.grading import Grade
    from bugsweep.settings import ModelSettings

    model = ModelSettings(base_url="http://m/v1", model="m")
    held = Grade(instance_id="t", passes_after=True, held_for_review=True, suspicious=["calc.py:2: inspect"],
                 reason="held", turns=2, cost_usd=0.5)  # fmt: skip
    fixed = Grade(instance_id="t", resolved=True, passes_after=True, turns=3, cost_usd=0.25)
    failed = Grade(instance_id="t", reason="the tests fail after the change", turns=1, cost_usd=0.125)

    def outcome(n: int, grade: Grade) -> AttemptOutcome:
        return AttemptOutcome(
            PlannedAttempt(n, 1, model), grade, None, "", wall_s=1.0, folder=f"attempts/{n}"
        )

    config = {"agent": {"attempts": 2}, "escalate_to": []}
    both = combine([outcome(1, held), outcome(2, fixed)], model="m").model_copy(update={"config": config})
    assert both.resolved and both.kept_attempt == 2 and not both.held_for_review
    assert [a.verdict for a in both.attempts] == ["held for review", "resolved"]
    assert (both.turns, both.cost_usd) == (5, 0.75) and resolved_at(both) == "resolved at attempt 2 of 2"

    neither = [outcome(1, held), outcome(2, failed)]
    assert kept(neither) is None
    grade = combine(neither, model="m").model_copy(update={"config": config})
    assert not grade.resolved and grade.kept_attempt is None and not grade.held_for_review
    assert grade.reason == "the tests fail after the change" and grade.attempts[0].held_for_review
    assert resolved_at(grade) == "not resolved in 2 attempts"
