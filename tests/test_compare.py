"""The compare flow end to end: two models x two tasks x two runs, concurrently, under a real Prefect server.

Real parts: a Prefect test server (prefect_test_harness: real API, real SQLite database), the real local sandbox
(bubblewrap + overlayfs) with real pytest, real HTTP to the model endpoints, real git repositories.
Stand-ins: the two models are ScriptedModelServer instances (scripted, not models): "fixer" edits the code and
finishes, "quitter" finishes at once. Their steps are callables that look at the request (which task, which turn),
because concurrent runs interleave requests in no fixed order.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from bugsweep.spec import TaskSpec, dump_tasks
from tests.support.repos import BUGGY_CALC, PYTEST_SETUP, make_repo
from tests.support.scripted_model import ScriptedModelServer, tool_call

pytest_plugins = ["tests.support.prefect_server"]

pytestmark = [
    pytest.mark.prefect,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap"),
]

SECRET = "sk-compare-SECRET-never-printed"

#: Per task: the text the model is given, and the edit that fixes it.
FIXES = {
    "add() subtracts": ("calc.py", "return a - b", "return a + b"),
    "mul() adds": ("calc.py", "def mul(a, b):\n    return a + b", "def mul(a, b):\n    return a * b"),
}


def make_tasks(root: Path) -> list[TaskSpec]:
    add_repo = make_repo(root / "add")
    mul_files = dict(BUGGY_CALC)
    mul_files["calc.py"] = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n"
    mul_repo = make_repo(root / "mul", mul_files)
    return [
        TaskSpec(instance_id="calc-add", repo=str(add_repo), problem_statement="add() subtracts: fix it.",
                 test_command="python -m pytest -q", setup_command=PYTEST_SETUP),
        TaskSpec(instance_id="calc-mul", repo=str(mul_repo), problem_statement="mul() adds: fix it.",
                 test_command="python -m pytest -q", setup_command=PYTEST_SETUP),
    ]  # fmt: skip


def fixer(rendezvous: threading.Barrier):
    """Turn 1: edit the code for whichever task this is; turn 2: finish.

    The first turn waits at a barrier until another run's first turn arrives too: if runs went one after another,
    the barrier would break and this model would resolve nothing.
    """

    def step(body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        task_text = next(m["content"] for m in messages if m["role"] == "user")
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if turn == 0:
            rendezvous.wait()
            path, old, new = next(fix for key, fix in FIXES.items() if key in task_text)
            return tool_call("edit_file", path=path, old=old, new=new)
        return tool_call("finish", summary="fixed")

    return step


def quitter(body: dict[str, Any]) -> dict[str, Any]:
    return tool_call("finish", summary="nothing to do")


def test_compare_two_models_on_two_tasks(
    tmp_path: Path, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bugsweep compare` as a user runs it (in-process, so it reports to the session's Prefect test server)."""
    from typer.testing import CliRunner

    from bugsweep.cli import app

    tasks_file = tmp_path / "tasks.jsonl"
    dump_tasks(make_tasks(tmp_path / "repos"), tasks_file)
    monkeypatch.setenv("FIXER_KEY", SECRET)
    monkeypatch.setenv("BUGSWEEP_STORE_URL", str(tmp_path / "artifacts"))
    monkeypatch.setenv("COLUMNS", "250")

    barrier = threading.Barrier(2, timeout=120)
    # More steps than the runs can use: each step is the same callable, deciding from the request.
    with (
        ScriptedModelServer([fixer(barrier)] * 50, model="fixer") as good,
        ScriptedModelServer([quitter] * 50, model="quitter") as bad,
    ):
        result = CliRunner().invoke(
            app,
            [
                "compare", "--tasks", str(tasks_file),
                "--model", f"fixer={good.base_url},FIXER_KEY", "--model", f"quitter={bad.base_url}",
                "--runs", "2", "--concurrency", "4", "--max-turns", "5", "--price", "fixer=1.0,2.0",
            ],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    assert "fixer - quitter: +100 points per task" in result.output
    assert "Every model ran under the same agent policy: plain." in result.output

    report_dir = tmp_path / "artifacts" / "compare-tasks"
    data = json.loads((report_dir / "report.json").read_text())
    by_model = {m["model"]: m for m in data["models"]}
    assert (by_model["fixer"]["resolved"], by_model["fixer"]["graded"], by_model["fixer"]["rate"]) == (
        4,
        4,
        1.0,
    )
    assert (by_model["quitter"]["resolved"], by_model["quitter"]["graded"], by_model["quitter"]["rate"]) == (
        0,
        4,
        0.0,
    )
    assert by_model["fixer"]["mean_turns"] == 2 and by_model["quitter"]["mean_turns"] == 1
    assert by_model["fixer"]["prompt_tokens"] > 0
    paid = by_model["fixer"]
    assert paid["cost_usd"] == pytest.approx(
        (paid["prompt_tokens"] * 1.0 + paid["completion_tokens"] * 2.0) / 1e6
    )
    assert by_model["quitter"]["cost_usd"] == 0
    (pair,) = data["pairs"]
    assert (pair["a"], pair["b"], pair["mean_diff"], pair["a_better"]) == ("fixer", "quitter", 1.0, 2)
    assert [row["instance_id"] for row in data["tasks"]] == ["calc-add", "calc-mul"]
    assert data["policy"] == "plain" and all(m["policies"] == ["plain"] for m in data["models"])
    assert {json.loads(g.read_text())["policy"] for g in report_dir.glob("*/*/*/run-*/grade.json")} == {
        "plain"
    }

    # the files a user opens
    md = (report_dir / "report.md").read_text()
    assert "| fixer | 4/4 | 100% |" in md and "| quitter | 0/4 | 0% |" in md
    assert "Every model ran under the same agent policy: plain." in md
    page = (report_dir / "report.html").read_text()
    assert "<svg" in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    # every run graded and stored as NAME/TASK/ENTRY/CONFIG/run-N
    grades = sorted(p.relative_to(report_dir) for p in report_dir.glob("*/*/*/run-*/grade.json"))
    (fixer_config,) = by_model["fixer"]["configs"]
    assert len(grades) == 8 and Path(f"calc-add/fixer/{fixer_config}/run-1/grade.json") in grades

    # the key went to its endpoint, and nowhere else
    assert good.request_headers and all(
        h.get("authorization") == f"Bearer {SECRET}" for h in good.request_headers
    )
    assert not any(SECRET in h.get("authorization", "") for h in bad.request_headers)
    for path in (tmp_path / "artifacts").rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path

    # the Prefect table artifact
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["compare-tasks"]))
        )
        flow_runs = client.read_flow_runs()
    compare_runs = [r for r in flow_runs if r.name and r.parameters.get("models")]
    assert compare_runs, "the compare-models flow run is recorded in Prefect"
    assert all(
        SECRET not in json.dumps(r.parameters, default=str) for r in flow_runs
    )  # only FIXER_KEY's name
    assert artifacts and artifacts[-1].type == "table"
    rows = json.loads(artifacts[-1].data) if isinstance(artifacts[-1].data, str) else artifacts[-1].data
    assert {r["model"]: r["rate"] for r in rows} == {"fixer": "100%", "quitter": "0%"}


def test_model_option_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    from bugsweep.errors import ConfigError
    from flows.compare import ModelEntry

    m = ModelEntry.parse("deepseek-chat=https://api.deepseek.com/v1,DEEPSEEK_API_KEY")
    assert (m.name, m.base_url, m.key_env) == (
        "deepseek-chat",
        "https://api.deepseek.com/v1",
        "DEEPSEEK_API_KEY",
    )
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="DEEPSEEK_API_KEY is not set"):
        m.settings()
    monkeypatch.setenv("DEEPSEEK_API_KEY", SECRET)
    settings = m.settings()
    assert settings.api_key.get_secret_value() == SECRET and SECRET not in repr(settings)
    assert SECRET not in m.model_dump_json()
    for bad in ("no-equals", "x=notaurl", "x=http://h/v1,bad name"):
        with pytest.raises(ConfigError):
            ModelEntry.parse(bad)


def late_fixer(body: dict[str, Any]) -> dict[str, Any]:
    """add(): fixed by the first attempt. mul(): the first attempt (temperature 0) gives up, a later one (at the
    retry temperature) fixes it."""
    messages = body["messages"]
    task_text = next(m["content"] for m in messages if m["role"] == "user")
    if any(m["role"] == "tool" for m in messages):
        return tool_call("finish", summary="fixed")
    if "mul() adds" in task_text and body.get("temperature") == 0:
        return tool_call("finish", summary="nothing to do")
    path, old, new = next(fix for key, fix in FIXES.items() if key in task_text)
    return tool_call("edit_file", path=path, old=old, new=new)


def test_a_comparison_with_3_attempts_shows_pass_at_1_beside_pass_at_3(
    tmp_path: Path, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bugsweep compare --attempts 3`: one task resolved by its first attempt, one by its second. The report's
    rate is pass@3 (2 of 2), with pass@1 (1 of 2, the same runs' first attempts) beside it, in the table the command
    prints, report.md, report.json and the comparison's review page."""
    from typer.testing import CliRunner

    from bugsweep.cli import app
    from bugsweep.review.page import render_page
    from bugsweep.review.runs import read_location

    tasks_file = tmp_path / "tasks.jsonl"
    dump_tasks(make_tasks(tmp_path / "repos"), tasks_file)
    monkeypatch.setenv("BUGSWEEP_STORE_URL", str(tmp_path / "artifacts"))
    monkeypatch.setenv("COLUMNS", "250")
    with ScriptedModelServer([late_fixer] * 20, model="late") as server:
        result = CliRunner().invoke(
            app,
            ["compare", "--tasks", str(tasks_file), "--model", f"late={server.base_url}", "--runs", "1",
             "--concurrency", "2", "--max-turns", "5", "--attempts", "3"],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(server.requests) == 5, "add: 2 turns; mul: 1 turn, then 2 at the retry temperature"
    assert "pass@3" in result.output and "pass@1" in result.output

    report_dir = tmp_path / "artifacts" / "compare-tasks"
    (model,) = json.loads((report_dir / "report.json").read_text())["models"]
    assert (model["attempts"], model["resolved"], model["graded"], model["rate"]) == (3, 2, 2, 1.0)
    assert (model["resolved_first"], model["pass_at_1"]) == (1, 0.5)
    md = (report_dir / "report.md").read_text()
    assert "| model | resolved | pass@3 | 95% CI | pass@1 |" in md
    assert re.search(r"\| late \| 2/2 \| 100% \| [0-9]+%-100% \| 50% \(1/2\) \|", md), md
    assert "pass@1 those resolved by their first" in md

    page = render_page(read_location(str(report_dir)))
    assert "<th>pass@3</th>" in page and "50% (1/2)" in page
    assert "resolved at attempt 2 of 3" in page and "resolved at attempt 1 of 3" in page

    # in Prefect, each attempt's steps are task runs of their own, named with the attempt
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="-attempt-")))
    names = {r.name for r in runs}
    assert {f"{step}-attempt-{n}" for step in ("solve", "regrade") for n in (1, 2)} <= names, names
    assert "sandbox-attempt-2" in names and "sandbox-attempt-1" not in names, (
        "the first attempt: the setup's sandbox"
    )


def test_a_comparison_of_models_with_different_attempts_settings_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pass@3 is never set beside pass@1: the command refuses before any server starts or any model is asked, and
    so does the report built from records of mixed settings."""
    from typer.testing import CliRunner

    from bugsweep.cli import app
    from bugsweep.report import MixedAttempts, RunRecord, build_report

    tasks_file = tmp_path / "tasks.jsonl"
    dump_tasks(make_tasks(tmp_path / "repos"), tasks_file)
    monkeypatch.setenv("COLUMNS", "250")
    with ScriptedModelServer([quitter] * 5) as server:
        result = CliRunner().invoke(
            app,
            ["compare", "--tasks", str(tasks_file), "--model", f"a={server.base_url}", "--model",
             f"b={server.base_url}", "--attempts", "3", "--model-set", "b:attempts=1"],
        )  # fmt: skip
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "same attempts setting" in message and "a: 3, b: 1" in message
    assert server.requests == [] and "comparing" not in result.output

    records = [RunRecord(model="a", instance_id="t", max_attempts=3), RunRecord(model="b", instance_id="t")]
    with pytest.raises(MixedAttempts, match="a: 3, b: 1"):
        build_report(records)
