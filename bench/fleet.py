"""The same night on one, two and three workers, side by side: the wall time of a sweep on workers (issue 35).

Real parts: `prefect server start`, `bugsweep blocks create` and `bugsweep deploy` as a user runs them (the
deployments of prefect.yaml: solve-bug with its concurrency limit, the nightly on its own queue), `bugsweep worker
--limit K` on N "machines" (folders of their own; one real machine here), the local sandbox, a folder store.
Stand-in: the scripted model server answering each request after `--latency` seconds (a model's time to think; a
latency-bound night, as with a real model), its limit on requests at once high enough never to be the bottleneck.
Each task asks the model `--turns` times (commands, then the fix, then finish), so the night is bound by the
model's latency, not by this machine's two cores.

Each round runs the same night (the same tasks, under a sweep name of its own so nothing is skipped as graded) once
per worker count, in turn, so that every count sees the same load; the wall time is from the sweep's creation to
its end (Completed), as the API records it.

    python bench/fleet.py --tasks 12 --workers 1 2 3 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bugsweep.spec import TaskSpec, dump_tasks
from tests.support.prefect_server import PrefectServer
from tests.support.repos import PYTEST_SETUP, make_repo
from tests.support.scripted_model import ScriptedModelServer, tool_call

PROJECT = Path(__file__).resolve().parent.parent
POOL = "bench-fleet"


def latency_bound(turns: int) -> Any:
    """`turns - 2` commands, then the fix, then finish: every task asks the model `turns` times."""

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        done = sum(1 for m in body["messages"] if m.get("role") == "tool")
        if done < turns - 2:
            return tool_call("run", command="true")
        if done == turns - 2:
            return tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")
        return tool_call("finish", summary="add() now adds")

    return reply


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def one_night(
    server: PrefectServer, tasks_file: Path, root: Path, workers: int, limit: int, name: str
) -> float:
    """Start `workers` workers, run the night, stop them; the night's wall time (created to end)."""
    import httpx

    procs = []
    for i in range(workers):
        folder = root / f"{name}-machine-{i}"
        (folder / "sandboxes").mkdir(parents=True)
        command = [sys.executable, "-m", "bugsweep", "worker", "--pool", POOL, "--limit", str(limit),
                   "--name", f"{name}-{i}", *([] if i == 0 else ["--no-sweeps"])]  # fmt: skip
        procs.append(server.spawn(f"{name}-{i}", command, cwd=folder, PREFECT_WORKER_QUERY_SECONDS="1",
                                  PREFECT_WORKER_PREFETCH_SECONDS="0",
                                  BUGSWEEP_SANDBOX_STATE_DIR=str(folder / "sandboxes"),
                                  BUGSWEEP_STORE_URL=str(root / "store")))  # fmt: skip
    http = httpx.Client(base_url=server.api_url, timeout=60)
    try:
        deployment = http.get("/deployments/name/sweep/nightly-sweep").json()["id"]
        params = {"source": {"kind": "file", "path": str(tasks_file)}, "name": name, "run_on": "workers"}
        run = http.post(f"/deployments/{deployment}/create_flow_run", json={"parameters": params}).json()
        while True:
            run = http.get(f"/flow_runs/{run['id']}").json()
            if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                break
            time.sleep(2)
        if run["state"]["type"] != "COMPLETED":
            raise SystemExit(f"{name}: {run['state']['type']}: {run['state'].get('message')}")
        return parse_time(run["end_time"]) - parse_time(run["created"])
    finally:
        for proc in procs:
            server.stop_process(proc)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--limit", type=int, default=2, help="tasks at once per worker")
    parser.add_argument("--latency", type=float, default=5.0, help="seconds per model answer")
    parser.add_argument("--turns", type=int, default=6, help="model requests per task")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    server = PrefectServer(root / "prefect").start()
    model = ScriptedModelServer([latency_bound(args.turns)] * 100_000, latency_s=args.latency).start()
    env = {"LLM_BASE_URL": model.base_url, "LLM_MODEL": "scripted-model", "LLM_MAX_CONCURRENT_REQUESTS": "0",
           "BUGSWEEP_STORE_URL": str(root / "store")}  # fmt: skip
    repo = make_repo(root / "calc")
    tasks_file, warm_up_file = root / "night.jsonl", root / "warm-up.jsonl"
    tasks = [TaskSpec(instance_id=f"calc-{i}", repo=str(repo), problem_statement=f"({i}) add() subtracts.",
                      test_command="python -m pytest -q", setup_command=PYTEST_SETUP)
             for i in range(args.tasks)]  # fmt: skip
    dump_tasks(tasks, tasks_file)
    dump_tasks(tasks[:1], warm_up_file)
    walls: dict[int, list[float]] = {n: [] for n in args.workers}
    try:
        server.run([sys.executable, "-m", "bugsweep", "blocks", "create", "--no-check"], cwd=PROJECT, **env)
        server.run([sys.executable, "-m", "bugsweep", "deploy", "--pool", POOL], cwd=PROJECT, **env)
        # warm-up: one task, so the task environment (pytest) is built once and no night pays for it
        one_night(server, warm_up_file, root, 1, args.limit, "warm-up")
        for r in range(args.rounds):
            for n in args.workers:
                wall = one_night(server, tasks_file, root, n, args.limit, f"night-{n}w-{r}")
                walls[n].append(wall)
                print(json.dumps({"round": r, "workers": n, "wall_s": round(wall, 1)}), flush=True)
    finally:
        server.stop()
        model.stop()
    base = statistics.median(walls[args.workers[0]])
    for n in args.workers:
        median = statistics.median(walls[n])
        print(f"{n} worker(s) x {args.limit}: median {median:.0f} s ({', '.join(f'{w:.0f}' for w in walls[n])}); "
              f"speed-up {base / median:.2f}x over {args.workers[0]}")  # fmt: skip


if __name__ == "__main__":
    main()
