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

from bugsweep.report import ComparisonReport
from bugsweep.spec import TaskSpec, dump_tasks
from bugsweep.testing.repos import BUGGY_CALC, make_repo
from bugsweep.testing.scripted_model import ScriptedModelServer, tool_call

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


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory):
    """A Prefect test server for this module's session, with its own PREFECT_HOME (no stale caches)."""
    import os

    home = tmp_path_factory.mktemp("prefect-home")
    saved = {
        k: os.environ.get(k) for k in ("PREFECT_HOME", "DO_NOT_TRACK", "PREFECT_SERVER_ANALYTICS_ENABLED")
    }
    os.environ.update(PREFECT_HOME=str(home), DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    from prefect.testing.utilities import prefect_test_harness

    try:
        with prefect_test_harness(server_startup_timeout=180):
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def make_tasks(root: Path) -> list[TaskSpec]:
    add_repo = make_repo(root / "add")
    mul_files = dict(BUGGY_CALC)
    mul_files["calc.py"] = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n"
    mul_repo = make_repo(root / "mul", mul_files)
    return [
        TaskSpec(instance_id="calc-add", repo=str(add_repo), problem_statement="add() subtracts: fix it.",
                 test_command="python -m pytest -q"),
        TaskSpec(instance_id="calc-mul", repo=str(mul_repo), problem_statement="mul() adds: fix it.",
                 test_command="python -m pytest -q"),
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
    tmp_path: Path, prefect_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.compare import ModelEntry, compare

    tasks_file = tmp_path / "tasks.jsonl"
    dump_tasks(make_tasks(tmp_path / "repos"), tasks_file)
    monkeypatch.setenv("FIXER_KEY", SECRET)

    barrier = threading.Barrier(2, timeout=120)
    # More steps than the runs can use: each step is the same callable, deciding from the request.
    with (
        ScriptedModelServer([fixer(barrier)] * 50, model="fixer") as good,
        ScriptedModelServer([quitter] * 50, model="quitter") as bad,
    ):
        models = [
            ModelEntry.parse(f"fixer={good.base_url},FIXER_KEY"),
            ModelEntry.parse(f"quitter={bad.base_url}"),
        ]
        out = tmp_path / "out"
        report: ComparisonReport = compare(tasks_file, models, runs=2, concurrency=4, out_dir=out)

    by_model = {m.model: m for m in report.models}
    assert (by_model["fixer"].resolved, by_model["fixer"].graded, by_model["fixer"].rate) == (4, 4, 1.0)
    assert (by_model["quitter"].resolved, by_model["quitter"].graded, by_model["quitter"].rate) == (0, 4, 0.0)
    assert by_model["fixer"].mean_turns == 2 and by_model["quitter"].mean_turns == 1
    assert by_model["fixer"].prompt_tokens > 0
    (pair,) = report.pairs
    assert (pair.a, pair.b, pair.mean_diff, pair.a_better) == ("fixer", "quitter", 1.0, 2)
    assert [row.instance_id for row in report.tasks] == ["calc-add", "calc-mul"]

    # the files a user opens
    md = (out / "report.md").read_text()
    assert "| fixer | 4/4 | 100% |" in md and "| quitter | 0/4 | 0% |" in md
    data = json.loads((out / "report.json").read_text())
    assert [m["rate"] for m in data["models"]] == [1.0, 0.0]
    page = (out / "report.html").read_text()
    assert "<svg" in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    grades = sorted(out.glob("runs/*/*/run-*/grade.json"))
    assert len(grades) == 8

    # the key went to its endpoint, and nowhere else
    assert all(h.get("authorization") == f"Bearer {SECRET}" for h in good.request_headers)
    assert all(not h.get("authorization", "").endswith(SECRET) for h in bad.request_headers)
    for path in out.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path

    # the Prefect table artifact
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["model-comparison"]))
        )
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
