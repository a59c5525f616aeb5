"""The deployed project for the deployment tests (tests/test_deploy.py), as a user deploys it:
`prefect server start` (SQLite, its own PREFECT_HOME), `bugsweep blocks create` and `bugsweep deploy` run as
commands, and `bugsweep worker` processes on "machines" (each a folder with its own HOME, sandbox state folder and
local artifacts), each running the flows in their own processes with the local sandbox, a SeaweedFS S3 server.
Runs are created with `POST /api/deployments/{id}/create_flow_run`, the call the UI's Run button makes. Stand-in:
the scripted model server (real HTTP, 1 s to answer each request, counting the requests it answers at once) in
place of a model.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bugsweep.spec import TaskSpec
from tests.support.repos import PYTEST_SETUP
from tests.support.scripted_model import ScriptedModelServer, tool_call

PROJECT = Path(__file__).resolve().parent.parent.parent
POOL = "bugsweep-test"
#: The shortest heartbeat Prefect allows: the crash automation then marks a silent run Crashed after 60 s.
HEARTBEAT_S = 30
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
#: The model endpoint's limit on requests at once (LLM_MAX_CONCURRENT_REQUESTS, saved in the model block).
ENDPOINT_LIMIT = 3
#: Turns the nightly's task spends running the tests before its fix.
NIGHTLY_LOOKS = 6
#: What `bugsweep blocks create` saves (TYPE/NAME).
SAVED_BLOCKS = (
    "bugsweep-model-endpoint/bugsweep-model",
    "s3-bucket/bugsweep-artifacts",
    "aws-credentials/bugsweep-artifacts",
    "bugsweep-local-sandbox/bugsweep-local",
)
#: Requests of the night's two sweeps answered so far, by sweep (each sweep's first request waits for the other's).
ASKED = {"night-a": 0, "nightly": 0}
ASKED_CHANGED = threading.Condition()
#: Tasks whose last answer (`finish`) is held until the night's test releases them, KILLED is set, or 2 minutes
#: pass. The test holds every task of night-a, then, as each waits (`HELD`: still RUNNING, so no poll can miss it),
#: releases those running on a worker it will not kill; one running on the worker it kills is surely mid-task when
#: the kill lands. (Holding only the tasks seen running on that worker lost the race under load: a task went from
#: its start to its finish between two polls, seen in CI with all seven finished and none ever seen there.)
HOLD: set[str] = set()
HELD: set[str] = set()
RELEASED: set[str] = set()
HOLD_CHANGED = threading.Condition()
KILLED = threading.Event()


def release(*tasks: str, killed: bool = False) -> None:
    """Let held tasks answer (or all of them, and every later one, once the worker is killed)."""
    with HOLD_CHANGED:
        RELEASED.update(tasks)
        if killed:
            KILLED.set()
        HOLD_CHANGED.notify_all()


def task_of(text: str) -> str:
    """The task a request is for, from its first user message (the night's problem text: "[SWEEP] (TASK) ...")."""
    found = re.search(r"\] \(([\w.-]+)\) ", text)
    return found.group(1) if found else ""


def fixer(body: dict[str, Any]) -> dict[str, Any]:
    """Fix on the first turn, finish on the next; works for any number of tasks at once. The nightly's task first
    runs the tests NIGHTLY_LOOKS times, and the first request of each of the night's two sweeps is answered only
    once the other sweep has asked too (up to 5 minutes): whichever asks first is still being answered when the
    other's first request comes, so both sweeps ask at once however the machine's load spaces their runs (seen: on
    a loaded machine the nightly's requests all came between night-a's, and on a quiet one after all of them).
    The `finish` of a task in HOLD waits until it is released (`release`).

    A task whose text says CANCEL-ME instead runs a command, then stalls the next reply (a run mid-task, waiting
    for the model); one that says STALL-ME runs a command that sleeps in its sandbox."""
    asked = json.dumps(body["messages"][:2])
    answered = any(m.get("role") == "tool" for m in body["messages"])
    if "CANCEL-ME" in asked:
        if answered:
            return {"sleep": 45, **tool_call("finish", summary="too late")}
        return tool_call("run", command="python -m pytest -q || true")
    if "STALL-ME" in asked:
        return tool_call("finish", summary="too late") if answered else tool_call("run", command="sleep 600")
    looked = sum(m.get("role") == "tool" for m in body["messages"])
    for sweep, other in (("night-a", "nightly"), ("nightly", "night-a")):
        if f"[{sweep}]" in asked:  # a sweep's first request is answered once the other sweep asks too
            with ASKED_CHANGED:
                first = ASKED[sweep] == 0
                ASKED[sweep] += 1
                ASKED_CHANGED.notify_all()
                if first:
                    ASKED_CHANGED.wait_for(lambda other=other: ASKED[other] > 0, timeout=300)
    # the nightly's task asks longer, so that both sweeps ask at once
    if "[nightly]" in asked and looked < NIGHTLY_LOOKS:
        return tool_call("run", command="python -m pytest -q || true")
    if "[nightly]" in asked and looked == NIGHTLY_LOOKS:
        return tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")
    if answered:
        task = task_of(asked)
        with HOLD_CHANGED:
            if task and task in HOLD and not KILLED.is_set():
                HELD.add(task)
                HOLD_CHANGED.wait_for(lambda: task in RELEASED or KILLED.is_set(), timeout=120)
                HELD.discard(task)
        return tool_call("finish", summary="add() now adds")
    return tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")


@dataclass
class Machine:
    """A folder standing for one machine: its HOME, its sandboxes' state folder, its workers' folder."""

    root: Path

    @property
    def state_dir(self) -> Path:
        return self.root / "sandboxes"

    def env(self, worker: str) -> dict[str, str]:
        return {
            "HOME": str(self.root / "home"),
            "BUGSWEEP_SANDBOX_STATE_DIR": str(self.state_dir),
            "BUGSWEEP_RETRY_DELAYS_S": "0.5,1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "0",
            "BUGSWEEP_TEST_WORKER": worker,  # marks every process of this worker (its runs inherit it)
        }


class Deployed:
    """The deployed project: the server, the S3 store the runs write to, the machines, and helpers for the API."""

    def __init__(
        self,
        server: Any,
        store: Any,
        model: ScriptedModelServer,
        machines: dict[str, Machine],
        workers: dict[str, str],
    ) -> None:
        self.server, self.store, self.model, self.machines = server, store, model, machines
        self.worker_machines = workers
        """Worker -> machine. Each runs `bugsweep worker --limit 2`; only the first takes sweeps."""
        self.workers = list(workers)
        self.deploy_out = ""
        """What `bugsweep deploy` printed (on one line)."""

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """One REST call (a 503 for a moment is tried again: PrefectServer.request)."""
        response = self.server.request(method, path, **kwargs)
        response.raise_for_status()
        return response.json()

    def deployment_id(self, name: str) -> str:
        return str(self.api("GET", f"/deployments/name/{name}")["id"])

    def run_deployment(self, name: str, parameters: dict[str, Any], **run: Any) -> str:
        """What the UI's Run button does (with a custom parameter form); `run`: more of the flow run (its state)."""
        url = f"/deployments/{self.deployment_id(name)}/create_flow_run"
        return str(self.api("POST", url, json={"parameters": parameters, **run})["id"])

    def wait(self, flow_run_id: str, timeout_s: float = 240, through_rerun: bool = False) -> dict[str, Any]:
        """The run once it is final (`through_rerun`: a first crash is not, the rerun automation runs it again)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.api("GET", f"/flow_runs/{flow_run_id}")
            crashed_once = run["state"] and run["state"]["type"] == "CRASHED" and run["run_count"] < 2
            if run["state"] and run["state"]["type"] in FINAL and not (through_rerun and crashed_once):
                return dict(run)
            time.sleep(1)
        raise AssertionError(
            f"flow run {flow_run_id} not finished after {timeout_s} s; worker logs in {self.server.logs}"
        )

    def runs_tagged(self, tag: str) -> list[dict[str, Any]]:
        return list(self.api("POST", "/flow_runs/filter", json={"flow_runs": {"tags": {"all_": [tag]}}}))

    def worker_log(self, name: str) -> str:
        return (self.server.logs / f"{name}.log").read_text(errors="replace")

    def run_folder(self, prefix: str) -> str:
        """The one run folder under SWEEP/TASK/MODEL: SWEEP/TASK/MODEL/CONFIG (the configuration's digest)."""
        (grade,) = [k for k in self.store.list(prefix) if k.endswith("/grade.json")]
        return grade.rsplit("/", 1)[0]

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        machine = self.machines[self.worker_machines[name]]
        command = [sys.executable, "-m", "bugsweep", "worker", "--pool", POOL, "--limit", "2", "--name", name]
        if name != "worker-1":
            command.append("--no-sweeps")
        return self.server.spawn(name, command, cwd=machine.root, **machine.env(name))


@contextlib.contextmanager
def deploy_project(
    prefect_api: Any,
    seaweed: Any,
    tmp_path_factory: pytest.TempPathFactory,
    workers: dict[str, str],
    nightly_tasks: Path | None = None,
) -> Iterator[Deployed]:
    """Blocks created and deployments deployed through the CLI (`nightly_tasks`: with `--tasks FILE`, as the first
    night's step does), and `workers` (worker -> machine) on the pool."""
    model = ScriptedModelServer([fixer] * 400, latency_s=1.0).start()
    store = seaweed.new_store(prefix="runs")
    env = {
        "LLM_BASE_URL": model.base_url,
        "LLM_MODEL": "scripted-model",
        "LLM_API_KEY": "sk-deploy-secret",
        "LLM_MAX_CONCURRENT_REQUESTS": str(ENDPOINT_LIMIT),
        "BUGSWEEP_STORE_URL": f"s3://{store.bucket}/runs",
        "AWS_ENDPOINT_URL": seaweed.endpoint_url,
        "AWS_ACCESS_KEY_ID": "bugsweep-test",
        "AWS_SECRET_ACCESS_KEY": "bugsweep-test-secret",
    }
    bugsweep = [sys.executable, "-m", "bugsweep"]
    try:
        created = prefect_api.run([*bugsweep, "blocks", "create"], cwd=PROJECT, **env)
        assert "sk-deploy-secret" not in created and "bugsweep-test-secret" not in created
        assert "bugsweep-model" in created and "bugsweep-artifacts" in created
        deploy = [*bugsweep, "deploy", "--pool", POOL, "--heartbeat-s", str(HEARTBEAT_S)]
        if nightly_tasks is not None:
            deploy += ["--tasks", str(nightly_tasks)]
        deployed_out = " ".join(prefect_api.run(deploy, cwd=PROJECT, **env).split())
        assert "solve-bug/solve-bug" in deployed_out and "sweep/nightly-sweep" in deployed_out
        # The project has no tasks.jsonl: the nightly schedule would fail every night, so it is deployed paused.
        assert not (PROJECT / "tasks.jsonl").exists()
        assert nightly_tasks is not None or (
            f"sweep/nightly-sweep with its schedule PAUSED: its task source '{PROJECT / 'tasks.jsonl'}' does not "
            "exist on this machine" in deployed_out
        )
        assert (
            "grow-benchmark/nightly-benchmark with its schedule PAUSED: its parameters name no repository"
            in deployed_out
        )
        nightly = prefect_api.request("GET", "/deployments/name/sweep/nightly-sweep").json()
        assert nightly["paused"] is (nightly_tasks is None)
        solve_bug = prefect_api.request("GET", "/deployments/name/solve-bug/solve-bug").json()
        assert solve_bug["paused"] is False
        assert (
            "the run forms offer the saved blocks bugsweep-model, bugsweep-artifacts, already chosen"
            in deployed_out
        )
        assert set(solve_bug["parameters"]) >= {"model", "store"}, solve_bug["parameters"]
        assert "sk-deploy-secret" not in json.dumps(solve_bug) + json.dumps(nightly)
        assert solve_bug["job_variables"]["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == str(HEARTBEAT_S)
        # no path of this machine in a deployment: a worker anywhere with bugsweep installed runs them
        for deployment in (solve_bug, nightly):
            assert deployment["pull_steps"] == [] and deployment["path"] is None, deployment
            assert str(PROJECT) not in json.dumps(deployment)
        assert (solve_bug["work_queue_name"], nightly["work_queue_name"]) == ("default", "sweeps")
        assert solve_bug["global_concurrency_limit"]["limit"] == 32
        assert solve_bug["concurrency_options"]["collision_strategy"] == "ENQUEUE"
        machines = {m: Machine(tmp_path_factory.mktemp(m)) for m in sorted(set(workers.values()))}
        for machine in machines.values():
            machine.state_dir.mkdir()
        result = Deployed(prefect_api, store, model, machines, workers)
        result.deploy_out = deployed_out
        for name in workers:
            result.start_worker(name)
        yield result
    finally:
        for proc in prefect_api.processes[
            1:
        ]:  # the workers (and the flow runs they started); the server stays
            prefect_api.stop_process(proc)
        del prefect_api.processes[1:]
        model.stop()
        # The server is the session's: the next file on it (test_blocks, the other deployment file) starts with
        # no saved blocks, as a team's first night does.
        for slug in SAVED_BLOCKS:
            block_type, name = slug.split("/")
            found = prefect_api.request("GET", f"/block_types/slug/{block_type}/block_documents/name/{name}")
            if found.status_code == 200:
                prefect_api.request("DELETE", f"/block_documents/{found.json()['id']}").raise_for_status()


def calc_task(repo: Path, instance_id: str, problem: str | None = None) -> TaskSpec:
    return TaskSpec(
        instance_id=instance_id,
        repo=str(repo),
        problem_statement=problem
        or "tests/test_calc.py::test_add fails: add() returns the wrong result. Fix the code.",
        test_command="python -m pytest -q",
        setup_command=PYTEST_SETUP,
    )


CHROMIUM = Path("/usr/bin/chromium")  # Debian's, driven by Playwright (no browser download)


def sandboxes_in(state_dir: Path, pids: set[int] | None = None) -> list[Path]:
    """The local sandboxes in a machine's state folder (only those made by `pids`, when given)."""
    found = []
    for meta in state_dir.glob("local-*/meta.json"):
        try:
            owner = json.loads(meta.read_text()).get("owner_pid")
        except (OSError, ValueError):
            continue
        if pids is None or owner in pids:
            found.append(meta.parent)
    return found


def sandbox_leftovers(sandbox_dirs: list[Path], cgroups: dict[Path, list[str]] | None = None) -> list[str]:
    """Mounts, processes, cgroups and folders of these local sandboxes still on the machine (`cgroups`: each
    one's cgroups, read from its meta.json while it was there)."""
    mounts = Path("/proc/mounts").read_text()
    found = [f"mount {d}" for d in sandbox_dirs if str(d) in mounts]
    found += [f"folder {d}" for d in sandbox_dirs if d.exists()]
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace") if proc.name.isdigit() else ""
        except OSError:
            continue
        found += [f"process {proc.name}" for d in sandbox_dirs if d.name in cmdline]
    for d in sandbox_dirs:
        meta = d / "meta.json"
        known = (cgroups or {}).get(d) or (
            json.loads(meta.read_text()).get("cgroups", []) if meta.exists() else []
        )
        found += [f"cgroup {c}" for c in known if Path(c).exists()]
    return found


def cgroups_of(sandbox_dirs: list[Path]) -> dict[Path, list[str]]:
    return {d: json.loads((d / "meta.json").read_text()).get("cgroups", []) for d in sandbox_dirs}


def processes_of(worker: str) -> list[int]:
    """The processes of one worker (`bugsweep worker`, its Prefect workers, the flow runs they started): those
    whose environment carries its BUGSWEEP_TEST_WORKER."""
    marker = f"BUGSWEEP_TEST_WORKER={worker}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def pid_of(run: dict[str, Any]) -> int:
    return int(str(run.get("infrastructure_pid") or "0").rsplit(":", 1)[-1])
