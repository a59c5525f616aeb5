"""Crash recovery: from SIGKILL of a worker and its flow-run process to the rerun's completion, and what the killed
run left on the machine meanwhile (issue #25 item 6).

Real parts, as tests/test_deploy.py uses them: `prefect server start`, SeaweedFS, `bugsweep blocks create`,
`bugsweep deploy` (heartbeats every 30 s, a run silent for 60 s marked Crashed, crashed solve-bug runs run again),
`bugsweep worker` process workers, the local sandbox. Stand-in: the scripted model server, which stalls the run
mid-agent until it is killed. Each repetition: a worker takes a stalling run and is killed with it (SIGKILL); a
second worker is already running on the machine (a live worker); the script samples every second whether the
killed run's sandbox mount and folder are still there, and records when the run was marked Crashed, scheduled
again, and completed.

    python bench/crash_recovery.py --runs 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bugsweep.spec import TaskSpec
from tests.support.prefect_server import PrefectServer
from tests.support.repos import PYTEST_SETUP, make_repo
from tests.support.scripted_model import ScriptedModelServer, tool_call
from tests.support.seaweed import SeaweedServer
from tests.test_deploy import POOL, PROJECT, Deployed, pid_of, sandbox_leftovers, sandboxes_in

#: Set once the KILL-ME run's processes are killed: its rerun is then answered like any other task.
KILLED = {"rerun": False}


def fixer(body: dict[str, object]) -> dict[str, object]:
    """Fix on the first turn, finish on the next; a task saying KILL-ME (until it was killed) runs a command, then
    stalls its next reply, so that it is mid-task when it is killed."""
    messages: list[dict[str, object]] = body["messages"]  # type: ignore[assignment]
    answered = any(m.get("role") == "tool" for m in messages)
    if "KILL-ME" in json.dumps(messages[:2]) and not KILLED["rerun"]:
        return (
            {"sleep": 300, **tool_call("finish", summary="too late")}
            if answered
            else tool_call("run", command="true")
        )
    if answered:
        return tool_call("finish", summary="add() now adds")
    return tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")


def start_stalling_run(
    deployed: Deployed, repo: Path, marker: str, state_dir: Path
) -> tuple[str, int, list[Path]]:
    """A solve-bug run whose agent ran a command and now waits for the model: its id, its process, its sandboxes."""
    task = TaskSpec(instance_id=f"calc-{marker.lower()}", repo=str(repo), problem_statement=marker,
                    test_command="python -m pytest -q", setup_command=PYTEST_SETUP)  # fmt: skip
    run_id = deployed.run_deployment(
        "solve-bug/solve-bug",
        {"repo": task.repo, "problem": marker, "task": task.model_dump(mode="json"), "sweep": marker},
    )

    def stalled() -> bool:
        return any(marker in json.dumps(r["messages"][:2]) and any(m.get("role") == "tool" for m in r["messages"])
                   for r in list(deployed.model.requests))  # fmt: skip

    deadline = time.monotonic() + 180
    while not stalled() and time.monotonic() < deadline:
        time.sleep(0.5)
    pid = pid_of(deployed.api("GET", f"/flow_runs/{run_id}"))
    return run_id, pid, sandboxes_in(state_dir, {pid})


def one_crash(deployed: Deployed, root: Path, i: int) -> dict[str, float]:
    state_dir = root / f"sandboxes-{i}"
    env = {"PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "0",
           "BUGSWEEP_SANDBOX_STATE_DIR": str(state_dir), "BUGSWEEP_STORE_LOCAL_DIR": str(root / "local")}  # fmt: skip
    worker = [sys.executable, "-m", "bugsweep", "worker", "--pool", POOL, "--no-sweeps"]
    doomed = deployed.server.spawn(f"doomed-{i}", [*worker, "--name", f"doomed-{i}"], cwd=root, **env)
    KILLED["rerun"] = False
    marker = f"KILL-ME-{i}"
    run_id, pid, sandboxes = start_stalling_run(deployed, make_repo(root / f"calc-{i}"), marker, state_dir)
    live = deployed.server.spawn(f"live-{i}", [*worker, "--name", f"live-{i}"], cwd=root, **env)
    time.sleep(3)  # the live worker is polling before the kill
    with contextlib.suppress(ProcessLookupError):
        os.killpg(doomed.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    KILLED["rerun"] = True
    seen: dict[str, float] = {}
    while time.monotonic() - killed < 400:
        now = time.monotonic() - killed
        if sandbox_leftovers(sandboxes) or any(d.exists() for d in sandboxes):
            seen["left_until_s"] = now
        states = [s["type"] for s in deployed.api("GET", "/flow_run_states/", params={"flow_run_id": run_id})]
        if "CRASHED" in states:
            seen.setdefault("crashed_s", now)
        if "CRASHED" in states and states[-1] in ("SCHEDULED", "PENDING", "RUNNING", "COMPLETED"):
            seen.setdefault("rescheduled_s", now)
        if states and states[-1] == "COMPLETED":
            seen["completed_s"] = now
            break
        time.sleep(1)
    # the rerun's own sandboxes: released by its process before that process exits (the worker keeps running)
    deadline = time.monotonic() + 60
    while f"{state_dir}/local-" in Path("/proc/mounts").read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    seen["mounted_after_rerun_s"] = round(time.monotonic() - killed - seen.get("completed_s", 0.0), 1)
    seen["still_mounted"] = float(f"{state_dir}/local-" in Path("/proc/mounts").read_text())
    deployed.server.stop_process(live)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-crash-"))
    seaweed = SeaweedServer(root / "seaweed").start()
    server = PrefectServer(root / "prefect").start()
    model = ScriptedModelServer([fixer] * 500).start()
    store = seaweed.new_store(prefix="runs")
    env = {"LLM_BASE_URL": model.base_url, "LLM_MODEL": "scripted-model", "LLM_API_KEY": "sk-bench",
           "BUGSWEEP_STORE_URL": f"s3://{store.bucket}/runs", "AWS_ENDPOINT_URL": seaweed.endpoint_url,
           "AWS_ACCESS_KEY_ID": "bugsweep-test", "AWS_SECRET_ACCESS_KEY": "bugsweep-test-secret"}  # fmt: skip
    rows = []
    try:
        server.run([sys.executable, "-m", "bugsweep", "blocks", "create"], cwd=PROJECT, **env)
        server.run([sys.executable, "-m", "bugsweep", "deploy", "--pool", POOL], cwd=PROJECT, **env)
        deployed = Deployed(server, store, model, {})
        for i in range(args.runs):
            row = one_crash(deployed, root, i)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        server.stop()
        model.stop()
        seaweed.stop()
    for key in (
        "crashed_s",
        "rescheduled_s",
        "completed_s",
        "left_until_s",
        "mounted_after_rerun_s",
        "still_mounted",
    ):
        values = [r[key] for r in rows if key in r]
        if values:
            print(
                f"{key}: median {statistics.median(values):.0f} s, {min(values):.0f}-{max(values):.0f} s over {len(values)}"
            )


if __name__ == "__main__":
    main()
