"""Start-to-running latency of a run started from the UI: Prefect's default worker polling against bugsweep's.

One run, side by side on the same machine and server: a real `prefect server start` (SQLite), `bugsweep blocks
create` and `bugsweep deploy` as a user runs them, then for each worker setting a process worker on the pool and
N runs of `solve-bug` created one after another with `POST /api/deployments/{id}/create_flow_run` (what the UI's
Run button does). For each run: created -> Running (the worker noticing the run, starting a Python process,
importing the flow, loading its blocks) and created -> Completed. The task is the buggy `calc` repository and the
scripted model fixes it in two turns, so the task's own work is a few seconds of sandbox and pytest.

Worker settings compared:
- **prefect default**: `prefect worker start` (PREFECT_WORKER_QUERY_SECONDS=10, PREFECT_WORKER_PREFETCH_SECONDS=10);
- **bugsweep worker**: `bugsweep worker`, which polls every 2 s unless told otherwise.

Usage: python bench/ui_latency.py [--runs 4]
Needs: Linux, root, bubblewrap; starts (and stops) its own Prefect server and workers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.prefect_server import PrefectServer  # noqa: E402  (sets the offline Prefect environment)

POOL = "bench-latency"


def fixer(body: dict[str, Any]) -> dict[str, Any]:
    from tests.support.scripted_model import tool_call

    if any(m.get("role") == "tool" for m in body["messages"]):
        return tool_call("finish", summary="add() now adds")
    return tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")


def seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def call(http: httpx.Client, method: str, path: str, **kwargs: Any) -> Any:
    """One REST call; the SQLite-backed server answers 503 for a moment under load: try again, as the UI does."""
    for _ in range(30):
        response = http.request(method, path, **kwargs)
        if response.status_code != 503:
            break
        time.sleep(1)
    response.raise_for_status()
    return response.json()


def measure(
    server: PrefectServer, deployment_id: str, repo: Path, runs: int, tag: str
) -> list[dict[str, float]]:
    http = httpx.Client(base_url=server.api_url, timeout=30)
    found = []
    for i in range(runs):
        task = {"repo": str(repo), "problem_statement": "add() subtracts: fix it.", "test_command": "python -m pytest -q",
                "instance_id": f"calc-{tag}-{i}"}  # fmt: skip
        created = call(http, "POST", f"/deployments/{deployment_id}/create_flow_run",
                       json={"parameters": {"repo": task["repo"], "problem": task["problem_statement"],
                                            "task": task, "sweep": tag}})  # fmt: skip
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            run = call(http, "GET", f"/flow_runs/{created['id']}")
            if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"run {created['id']} did not finish")
        if run["state"]["type"] != "COMPLETED":
            raise RuntimeError(f"run {created['id']} ended {run['state']['type']}: {run['state']['message']}")
        found.append(
            {
                "to_running_s": seconds(run["created"], run["start_time"]),
                "to_completed_s": seconds(run["created"], run["end_time"]),
                "running_s": seconds(run["start_time"], run["end_time"]),
            }
        )
        print(f"  {tag} run {i}: " + ", ".join(f"{k} {v:.1f}" for k, v in found[-1].items()), flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()

    from tests.support.repos import make_repo
    from tests.support.scripted_model import ScriptedModelServer

    work = Path(tempfile.mkdtemp(prefix="bugsweep-bench-latency-"))
    server = PrefectServer(work / "prefect")
    model = ScriptedModelServer([fixer] * 1000).start()
    env = {"LLM_BASE_URL": model.base_url, "LLM_MODEL": "scripted-model", "LLM_API_KEY": "sk-bench",
           "BUGSWEEP_STORE_URL": str(work / "store"), "BUGSWEEP_STORE_LOCAL_DIR": str(work / "local")}  # fmt: skip
    python = sys.executable
    settings = {
        "prefect default": [python, "-m", "prefect", "worker", "start", "--pool", POOL],
        "bugsweep worker": [python, "-m", "bugsweep", "worker", "--pool", POOL],
    }
    results: dict[str, list[dict[str, float]]] = {}
    try:
        started = time.monotonic()
        server.start()
        print(f"prefect server healthy after {time.monotonic() - started:.0f} s", flush=True)
        server.run([python, "-m", "bugsweep", "blocks", "create"], cwd=ROOT, **env)
        server.run([python, "-m", "bugsweep", "deploy", "--pool", POOL], cwd=ROOT, **env)
        deployment_id = httpx.get(
            f"{server.api_url}/deployments/name/solve-bug/solve-bug", timeout=30
        ).json()["id"]
        repo = make_repo(work / "calc")
        for name, command in settings.items():
            # the store is a folder (no S3 bucket block): the runs read it from the worker's environment
            store_env = {k: v for k, v in env.items() if k.startswith("BUGSWEEP_STORE")}
            worker = server.spawn(name.replace(" ", "-"), command, cwd=work, **store_env)
            time.sleep(15)  # the worker has started and polled at least once
            measure(server, deployment_id, repo, 1, f"warmup-{name.split()[0]}")
            results[name] = measure(server, deployment_id, repo, args.runs, name.split()[0])
            server.stop_process(worker)
    finally:
        server.stop()
        model.stop()

    print(f"\n{args.runs} runs each; median (min-max), seconds")
    for name, rows in results.items():
        parts = []
        for key in ("to_running_s", "to_completed_s", "running_s"):
            values = [r[key] for r in rows]
            parts.append(f"{key} {statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        print(f"{name}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
