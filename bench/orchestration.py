"""Orchestration overhead: the same N tasks through the `sweep` flow and through the core called directly.

Both sides do the same work on the same machine, in one run, interleaved by concurrency level:
- **core**: `bugsweep.pipeline.solve_task` for each task (threads, at most C at once), then
  `bugsweep.upload.upload_run` to a local-folder store: what a script without Prefect would do;
- **flow**: the `sweep` flow (`run_on="this-process"`, concurrency C) against a real `prefect server start`
  (SQLite) on this machine, with the same model, sandbox and a local-folder store; its tasks are the same steps
  as Prefect task runs (setup, baseline, solve, regrade, upload, per task; list-tasks and summarize per sweep).
The model is the scripted OpenAI-compatible server (fix on the first turn, finish on the second), so the model
costs nothing and what remains is sandbox, tests, grading, and on the flow side, Prefect.

Where the time goes: per-step medians on both sides (the core's from `solve_task`'s step callbacks, the flow's
from the task runs' start and end times in the Prefect API), the flow's time before the first task and after
the last, and the cost of one empty Prefect task run measured in the same flow engine.

Usage: python bench/orchestration.py [--tasks 6] [--concurrency 1 3] [--repeat 2] [--json out.json]
Needs: Linux, root, bubblewrap; starts (and stops) its own Prefect server.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.prefect_server import PrefectServer  # noqa: E402  (sets the offline Prefect environment)


def fixer(body: dict[str, Any]) -> dict[str, Any]:
    from tests.support.scripted_model import tool_call

    if any(m.get("role") == "tool" for m in body["messages"]):
        return tool_call("finish", summary="add() now adds")
    return tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")


def make_tasks(root: Path, n: int, tag: str) -> list[Any]:
    from bugsweep.spec import TaskSpec
    from tests.support.repos import PYTEST_SETUP, make_repo

    repo = make_repo(root / f"calc-{tag}")
    return [
        TaskSpec(
            instance_id=f"calc-{tag}-{i}",
            repo=str(repo),
            problem_statement="tests/test_calc.py::test_add fails: add() returns the wrong result. Fix the code.",
            test_command="python -m pytest -q",
            setup_command=PYTEST_SETUP,
        )
        for i in range(n)
    ]


def run_core(tasks: list[Any], base_url: str, concurrency: int, out: Path) -> dict[str, Any]:
    """solve_task + upload_run per task, C at once; step times from solve_task's on_step callback."""
    from bugsweep import pipeline
    from bugsweep.sandbox import get_provider
    from bugsweep.settings import AgentSettings, ModelSettings
    from bugsweep.storage import LocalStore, run_key
    from bugsweep.upload import upload_run

    provider = get_provider("local")
    model = ModelSettings(base_url=base_url, model="scripted-model")
    agent = AgentSettings(max_turns=6)
    store = LocalStore(out / "store")
    steps: dict[str, list[float]] = {}

    def one(spec: Any) -> bool:
        marks: list[tuple[str, float]] = []
        grade = pipeline.solve_task(
            spec,
            provider=provider,
            model_settings=model,
            agent_settings=agent,
            out_dir=out / "runs" / spec.instance_id,
            on_step=lambda name, info: marks.append((name, time.perf_counter())),
        )
        marks.append(("upload", time.perf_counter()))
        key = run_key("core", spec.instance_id, model.model, grade.config_digest or "none")
        upload_run(store, out / "runs" / spec.instance_id, key)
        marks.append(("end", time.perf_counter()))
        names = {
            "sandbox": "setup",
            "baseline": "baseline",
            "agent": "solve",
            "regrade": "regrade",
            "upload": "upload",
        }
        for (name, t0), (_, t1) in itertools.pairwise(marks):
            steps.setdefault(names.get(name, name), []).append(t1 - t0)
        return grade.resolved

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        resolved = list(pool.map(one, tasks))
    return {"wall_s": time.perf_counter() - started, "resolved": sum(resolved), "steps": steps}


def run_flow(tasks: list[Any], model_block: str, concurrency: int, out: Path) -> dict[str, Any]:
    """The sweep flow on the same tasks; step times from the task runs the Prefect API recorded."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from blocks import ModelEndpoint
    from bugsweep.discover import TaskFile
    from bugsweep.spec import dump_tasks
    from flows.common import AgentChoices
    from flows.sweep import sweep

    tasks_file = out / "tasks.jsonl"
    tasks_file.parent.mkdir(parents=True, exist_ok=True)
    dump_tasks(tasks, tasks_file)
    started = time.perf_counter()
    state = sweep(
        source=TaskFile(path=str(tasks_file)),
        name=f"bench-{uuid.uuid4().hex[:6]}",
        model=ModelEndpoint.load(model_block),
        limits=AgentChoices(max_turns=6),
        concurrency=concurrency,
        return_state=True,
    )
    wall = time.perf_counter() - started
    grades = state.result()
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(state.state_details.flow_run_id)
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])), limit=200
        )
    steps: dict[str, list[float]] = {}
    for task_run in runs:
        if task_run.start_time and task_run.end_time:
            name = task_run.name.rsplit("-", 1)[0]
            steps.setdefault(name, []).append((task_run.end_time - task_run.start_time).total_seconds())
    starts = [r.start_time for r in runs if r.start_time]
    ends = [r.end_time for r in runs if r.end_time]
    before_first = (
        (min(starts) - flow_run.start_time).total_seconds() if starts and flow_run.start_time else None
    )
    after_last = (flow_run.end_time - max(ends)).total_seconds() if ends and flow_run.end_time else None
    step_total = sum(
        sum(v) for k, v in steps.items() if k in {"setup", "baseline", "solve", "regrade", "upload"}
    )
    return {
        "wall_s": wall,
        "resolved": sum(g.resolved for g in grades),
        "steps": steps,
        "gap_per_task_s": (sum(steps.get("solve-one", [])) - step_total) / max(1, len(tasks)),
        "flow_run_s": flow_run.total_run_time.total_seconds(),
        "before_first_task_s": before_first,
        "after_last_task_s": after_last,
    }


def empty_task_cost(n: int = 40) -> float:
    """Seconds per empty task run, sequential, in one flow (the fixed cost Prefect adds to every step)."""
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    @task(cache_policy=NO_CACHE, persist_result=False)
    def nothing() -> None:
        return None

    @flow
    def empty_tasks() -> float:
        nothing()  # warm-up
        started = time.perf_counter()
        for _ in range(n):
            nothing()
        return (time.perf_counter() - started) / n

    return float(empty_tasks())


def summarize_level(cores: list[dict[str, Any]], flows: list[dict[str, Any]]) -> dict[str, Any]:
    """Walls and ratios of each repetition, their medians, and per-step medians over all repetitions."""

    def pooled(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
        steps: dict[str, list[float]] = {}
        for run in runs:
            for name, values in run["steps"].items():
                steps.setdefault(name, []).extend(values)
        return steps

    ratios = [f["wall_s"] / c["wall_s"] for c, f in zip(cores, flows, strict=True)]
    return {
        "core_wall_s": [round(c["wall_s"], 2) for c in cores],
        "flow_wall_s": [round(f["wall_s"], 2) for f in flows],
        "ratios": [round(r, 3) for r in ratios],
        "median_ratio": round(statistics.median(ratios), 3),
        "resolved": [[c["resolved"], f["resolved"]] for c, f in zip(cores, flows, strict=True)],
        "core_steps": medians(pooled(cores)),
        "flow_steps": medians(pooled(flows)),
        "flow_gap_per_task_s": [round(f["gap_per_task_s"], 3) for f in flows],
        "flow_before_first_task_s": [f["before_first_task_s"] for f in flows],
        "flow_after_last_task_s": [f["after_last_task_s"] for f in flows],
    }


def medians(steps: dict[str, list[float]]) -> dict[str, float]:
    return {name: round(statistics.median(v), 3) for name, v in sorted(steps.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 3])
    parser.add_argument(
        "--repeat", type=int, default=2, help="Alternate core and flow this many times per level."
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("BUGSWEEP_RETRY_DELAYS_S", "1,5")

    work = Path(tempfile.mkdtemp(prefix="bugsweep-bench-orch-"))
    server = PrefectServer(work / "prefect")
    t0 = time.perf_counter()
    server.start()
    server_start_s = time.perf_counter() - t0
    os.environ.update(
        {k: v for k, v in server.env().items() if k.startswith("PREFECT_") or k == "DO_NOT_TRACK"}
    )
    try:
        from pydantic import SecretStr

        from blocks import ModelEndpoint
        from tests.support.scripted_model import ScriptedModelServer

        model = ScriptedModelServer([fixer] * 10_000).start()
        ModelEndpoint(base_url=model.base_url, model="scripted-model", api_key=SecretStr("")).save(
            "bench-model"
        )
        os.environ["BUGSWEEP_STORE_URL"] = str(work / "flow-store")  # a folder store: no S3 bucket block
        empty = empty_task_cost()
        results: dict[str, Any] = {
            "tasks": args.tasks,
            "server_start_s": server_start_s,
            "empty_task_run_s": empty,
        }
        for c in args.concurrency:
            cores: list[dict[str, Any]] = []
            flows: list[dict[str, Any]] = []
            for r in range(args.repeat):  # alternate, so both sides see the same machine load
                cores.append(
                    run_core(
                        make_tasks(work, args.tasks, f"core{c}-{r}"),
                        model.base_url,
                        c,
                        work / f"core-{c}-{r}",
                    )
                )
                flows.append(
                    run_flow(
                        make_tasks(work, args.tasks, f"flow{c}-{r}"),
                        "bench-model",
                        c,
                        work / f"flow-{c}-{r}",
                    )
                )
            results[f"c{c}"] = summarize_level(cores, flows)
            print(json.dumps({f"c{c}": results[f"c{c}"]}, indent=2), flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        model.stop()
    finally:
        from prefect.logging.handlers import APILogHandler

        APILogHandler().flush()  # send the last run logs before the server goes away
        server.stop()
    print(json.dumps({k: v for k, v in results.items() if not k.startswith("c")}, indent=2))


if __name__ == "__main__":
    main()
