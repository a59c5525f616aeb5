"""The compare flow end to end: two models x two tasks x two runs, concurrently, under a real Prefect server.

Real parts: a Prefect test server (prefect_test_harness: real API, real SQLite database), the real local sandbox
(bubblewrap + overlayfs) with real pytest, real HTTP to the model endpoints, real git repositories.
Stand-ins: the two models are ScriptedModelServer instances (scripted, not models): "fixer" edits the code and
finishes, "quitter" finishes at once. Their steps are callables that look at the request (which task, which turn),
because concurrent runs interleave requests in no fixed order.
"""

from __future__ import annotations

import json
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
