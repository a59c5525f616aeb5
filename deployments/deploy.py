"""`deploy()`: create the work pool if it is missing, deploy everything prefect.yaml lists, and the automations that
mark a flow run whose heartbeats stopped (or whose process never started) as Crashed and run a crashed solve-bug run or
sweep again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from bugsweep.errors import ConfigError, InfraError

#: The deployments prefect.yaml defines, as FLOW/DEPLOYMENT.
DEPLOYMENTS = ("solve-bug/solve-bug", "sweep/nightly-sweep", "grow-benchmark/nightly-benchmark")
#: Seconds between a flow run's heartbeats (Prefect's PREFECT_FLOWS_HEARTBEAT_FREQUENCY; at least 30): the
#: shortest Prefect allows, so that a killed run is marked Crashed, and run again, about a minute after its kill.
HEARTBEAT_S = 30
#: Heartbeats a run may miss before the automation marks it Crashed (a run silent for 60 s has no live process:
#: heartbeats come from a thread of their own, and the flows' work runs in other threads and processes).
MISSED_HEARTBEATS = 2
#: The automation `deploy` creates (or replaces).
CRASH_AUTOMATION = "bugsweep: mark runs without heartbeats as crashed"
#: The automation `deploy` creates (or replaces) that marks a run Crashed when it never sent a heartbeat.
PENDING_AUTOMATION = "bugsweep: mark runs that never sent a heartbeat as crashed"
#: Seconds from a worker taking a run (Pending) to its first heartbeat, at most: a run's process reports Running
#: within seconds (27 s at most in a loaded night on 2 shared cores, measured) and sends its first heartbeat as it
#: starts its flow. A run with none by then had its worker or machine lost before or just after its process started,
#: and no heartbeat will ever come from it.
PENDING_LIMIT_S = 120
#: The tag every bugsweep deployment carries (prefect.yaml), which the automation matches on.
TAG = "bugsweep"
#: The automation `deploy` creates (or replaces) that runs a crashed solve-bug run or sweep again.
RERUN_AUTOMATION = "bugsweep: run crashed solve-bug runs and sweeps again"
#: The deployments whose crashed runs are run again: a crash never loses a graded result (an upload that failed is
#: kept and uploaded by the next run, without the agent), so running a task again only redoes unfinished work; a
#: sweep run again finds the runs it had started (tasks/fanout.py) and collects them instead of starting them twice.
RERUN_DEPLOYMENTS = ("solve-bug/solve-bug", "sweep/nightly-sweep")
#: Seconds a run stays Crashed before the rerun automation schedules it again: a process worker reports a killed
#: run's crash twice, once at once and once when its watch of the process ends (about 15 s later, measured); the
#: second report, proposed to a run already Crashed, is refused (a run scheduled again at once would be crashed by
#: it as it starts, and started twice).
RERUN_AFTER_S = 45
#: Where `deploy` puts the nightly's task file in an S3 artifact store, so a sweep on any machine reads it.
TASK_FILES = "task-files"


@dataclass
class DeployResult:
    pool: str
    pool_created: bool
    deployments: list[str] = field(default_factory=list)
    output: str = ""
    paused: dict[str, str] = field(default_factory=dict)
    """Deployment -> why it was deployed with its schedule paused."""
    automation: str = ""
    pending_automation: str = ""
    rerun_automation: str = ""
    task_sources: dict[str, str] = field(default_factory=dict)
    """Deployment -> the task file its runs read (an s3:// object of the artifact store, or a path)."""
    chosen_blocks: list[str] = field(default_factory=list)
    """The saved blocks every run form offers already chosen (`bugsweep-model`, `bugsweep-artifacts`,
    `bugsweep-branches`)."""


def _prefect(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "prefect", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PREFECT_CLI_PROMPT": "false"},
        )
    except subprocess.TimeoutExpired as exc:
        raise InfraError(f"`prefect {' '.join(args)}` did not finish in {timeout:.0f} s") from exc


def ensure_work_pool(name: str, pool_type: str = "process", cwd: Path | None = None) -> bool:
    """Create the work pool unless it exists. Returns True when it was created."""
    cwd = cwd or Path.cwd()
    if _prefect(["work-pool", "inspect", name], cwd).returncode == 0:
        return False
    created = _prefect(["work-pool", "create", name, "--type", pool_type], cwd)
    if created.returncode != 0:
        raise _failure(f"could not create the {pool_type} work pool {name!r}", created)
    return True


def deploy(
    pool: str = "bugsweep",
    pool_type: str = "process",
    project_dir: Path | None = None,
    prefect_file: str = "prefect.yaml",
    heartbeat_s: int = HEARTBEAT_S,
    nightly_tasks: str | None = None,
) -> DeployResult:
    """Create `pool` if needed, deploy every deployment of `prefect_file` onto it, and ship the crash automations.

    `project_dir` (default: the folder this runs in) holds prefect.yaml; the deployments record no path of it (their
    entrypoints are modules of the installed bugsweep). The nightly's task source is one a sweep on any machine
    can read: `nightly_tasks` (a tasks file, or s3://), else prefect.yaml's `source` (a relative path taken from
    `project_dir`); a file on this machine is put into the artifact store when that is S3 (`task_file_source`).
    A deployment whose schedule has no task source to read is deployed with its schedule paused, and the result
    says why.
    """
    project_dir = (project_dir or Path.cwd()).resolve()
    if not (project_dir / prefect_file).is_file():
        raise ConfigError(
            f"no {prefect_file} in {project_dir}: run `bugsweep deploy` in the project folder (the one holding "
            f"{prefect_file}, flows/ and deployments/); process workers run the flows from that folder"
        )
    if heartbeat_s < 30:
        raise ConfigError(f"--heartbeat-s {heartbeat_s}: Prefect's heartbeats are at least 30 s apart")
    config = _read_yaml(project_dir / prefect_file)
    result = DeployResult(pool=pool, pool_created=ensure_work_pool(pool, pool_type, project_dir))
    register_block_types()
    env = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(heartbeat_s)}
    # One deployment at a time: with --all, Prefect ignores --pool.
    for full_name in DEPLOYMENTS:
        name = full_name.split("/", 1)[1]
        deployment = _deployment(config, name)
        source = task_source(deployment, project_dir, nightly_tasks)
        params = ["--params", json.dumps({"source": source})] if source is not None else []
        done = _prefect(
            ["--no-prompt", "deploy", "--name", name, "--pool", pool, "--prefect-file", prefect_file,
             "--job-variable", json.dumps({"env": env}), *params],
            project_dir,
        )  # fmt: skip
        if done.returncode != 0:
            raise _failure(f"`prefect deploy --name {name}` failed", done)
        result.deployments.append(full_name)
        result.output += done.stdout
        if source is not None and source.get("path"):
            result.task_sources[full_name] = str(source["path"])
        if source is not None:
            deployment = {
                **deployment,
                "parameters": {**(deployment.get("parameters") or {}), "source": source},
            }
        missing = missing_task_source(deployment, project_dir)
        for chosen in choose_saved_blocks(full_name):
            if chosen not in result.chosen_blocks:
                result.chosen_blocks.append(chosen)
        _set_paused(full_name, paused=missing is not None)  # deployed again once the source exists: resumed
        if missing:
            result.paused[full_name] = missing
    result.automation = ensure_crash_automation(heartbeat_s)
    result.pending_automation = ensure_pending_automation()
    result.rerun_automation = ensure_rerun_automation(RERUN_DEPLOYMENTS)
    return result


def register_block_types() -> None:
    """Make the blocks the flows take known to the server, so the run forms list them and the UI (Blocks) can
    create them before any was saved: bugsweep's own, Prefect's Secret (a git branches block's token) and
    prefect-aws's S3Bucket and AwsCredentials."""
    from prefect.blocks.system import Secret
    from prefect_aws import AwsCredentials, S3Bucket

    from blocks import GitBranches, LocalSandbox, ModelEndpoint, RuntimeSandbox

    for block_class in (
        ModelEndpoint,
        LocalSandbox,
        RuntimeSandbox,
        GitBranches,
        Secret,
        AwsCredentials,
        S3Bucket,
    ):
        block_class.register_type_and_schema()


def task_source(deployment: dict[str, Any], project_dir: Path, tasks: str | None) -> dict[str, Any] | None:
    """The `source` parameter a scheduled sweep deployment is deployed with, or None to leave prefect.yaml's: a
    tasks file given on the command line (relative to the folder deploy runs in), or prefect.yaml's relative path
    (relative to the project folder), as `task_file_source` records it."""
    params = deployment.get("parameters") or {}
    if "source" not in params:
        return None
    if tasks is not None:
        path = tasks if tasks.startswith("s3://") else str(Path(tasks).expanduser().resolve())
        return {"kind": "file", "path": task_file_source(path)}
    source = dict(params["source"] or {})
    path = str(source.get("path") or "")
    if source.get("kind", "file") == "file" and path and (project_dir / path).is_file():
        source["path"] = task_file_source(str((project_dir / path).resolve()))
        return source
    return None  # s3://, a repository, or a file not there (deployed paused, as prefect.yaml names it)


def task_file_source(path: str) -> str:
    """Where the nightly reads a task file from: an s3:// file as it is; a file on this machine put into the
    artifact store (the `bugsweep-artifacts` bucket block, else BUGSWEEP_STORE_URL) as TASK_FILES/NAME when that is
    S3, so that the sweep reads it on whichever machine it runs (with the store's keys); else (a folder store: one
    machine) its absolute path. A file that does not exist stays a path (the deployment is paused, saying so)."""
    if path.startswith("s3://") or not Path(path).is_file():
        return path
    from bugsweep.storage import S3Store
    from flows.common import load_store

    store, _ = load_store(None)
    if not isinstance(store, S3Store):
        return path
    return store.put_file(f"{TASK_FILES}/{Path(path).name}", Path(path))


def missing_task_source(deployment: dict[str, Any], project_dir: Path) -> str | None:
    """Why a scheduled deployment has nothing to run, or None. A tasks file on this machine must exist (a path
    relative to the project folder, where process workers run); s3:// files and repositories are checked by the
    run itself."""
    if not any(schedule.get("active", True) for schedule in deployment.get("schedules") or []):
        return None
    params = deployment.get("parameters") or {}
    if "repos" in params and not params["repos"]:
        return (
            "its parameters name no repository (`repos`): list the repositories whose new fixes join the "
            "benchmark in prefect.yaml, then deploy again"
        )
    if "source" not in params:
        return None
    source = params.get("source") or {}
    if source.get("kind", "file") != "file":
        return None
    path = str(source.get("path") or "")
    if path.startswith("s3://"):
        return None
    if not path:
        return "its parameters name no task source (`source`)"
    if not (project_dir / path).is_file():  # an absolute path is taken as it is
        return (
            f"its task source {str(project_dir / path)!r} does not exist on this machine: write one (`bugsweep mine REPO --out "
            f"{path}`), or deploy with `--tasks FILE` (a tasks file here, or s3://BUCKET/KEY), or point `source` in "
            "prefect.yaml at a repository, then deploy again (or resume the deployment in the UI once the file is "
            "there)"
        )
    return None


def ensure_crash_automation(heartbeat_s: int) -> str:
    """Create (or replace) the automation that marks a bugsweep flow run Crashed when its heartbeats stop.

    A run's process emits `prefect.flow-run.heartbeat` every `heartbeat_s`; when none (nor a final state) follows
    within MISSED_HEARTBEATS of them, the process is gone (killed, out of memory, the machine lost), and the
    automation sets the run Crashed, so it does not stay Running for good. Returns the automation's name.
    """
    window = heartbeat_s * MISSED_HEARTBEATS
    _crash_when_silent(
        CRASH_AUTOMATION,
        description=f"A flow run tagged {TAG!r} whose heartbeats (every {heartbeat_s} s) stop for {window} s "
        "without a final state is marked Crashed. Shipped by `bugsweep deploy`.",
        after="heartbeat",
        expect={"heartbeat", "Completed", "Failed", "Cancelled", "Crashed"},
        within_s=window,
        message=f"no heartbeat for {window} s: the flow run's process is gone (killed, out of memory, or its "
        "machine lost). Its sandboxes are removed when a worker or run starts on that machine.",
    )
    return CRASH_AUTOMATION


def ensure_pending_automation() -> str:
    """Create (or replace) the automation that marks a bugsweep flow run Crashed when no heartbeat (nor a final
    state) came PENDING_LIMIT_S after a worker took it (Pending): the worker was lost (killed, its machine gone)
    before the run's process started, or the process died before its first heartbeat, so the heartbeat automation,
    whose windows start at a heartbeat, never sees it (seen twice in nights whose worker was killed: a run stayed
    Pending, and one Running, for good, and their sweep waited for them). Crashed, it is run again like any crashed
    run. Returns the automation's name."""
    _crash_when_silent(
        PENDING_AUTOMATION,
        description=f"A flow run tagged {TAG!r} with no heartbeat nor final state {PENDING_LIMIT_S} s after a worker "
        "took it (its process never started, or died before its first heartbeat: the worker or its machine lost) "
        "is marked Crashed. Shipped by `bugsweep deploy`.",
        after="Pending",
        expect={
            "heartbeat",
            "Completed",
            "Failed",
            "Cancelled",
            "Cancelling",
            "Crashed",
            "Scheduled",
            "AwaitingRetry",
        },
        within_s=PENDING_LIMIT_S,
        message=f"no heartbeat {PENDING_LIMIT_S} s after a worker took it: its process never started, or died before "
        "its first heartbeat (the worker or its machine lost).",
    )
    return PENDING_AUTOMATION


def _crash_when_silent(
    name: str, description: str, after: str, expect: set[str], within_s: int, message: str
) -> None:
    """The automation `name`, made or replaced: a flow run tagged TAG whose event `prefect.flow-run.AFTER` is not
    followed by one of `prefect.flow-run.EXPECT` within `within_s` is set Crashed with `message`."""
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    automation = AutomationCore(
        name=name,
        description=description,
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{TAG}"},
            after={f"prefect.flow-run.{after}"},
            expect={f"prefect.flow-run.{event}" for event in expect},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within_s),
        ),
        actions=[ChangeFlowRunState(name=None, force=False, state=StateType.CRASHED, message=message)],
    )
    _replace_automation(automation)


def _replace_automation(automation: Any) -> None:
    """The automation of that name on the server, replaced by `automation` (created when there is none)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        for old in client.read_automations_by_name(automation.name):
            client.delete_automation(old.id)
        client.create_automation(automation)


def ensure_rerun_automation(deployments: tuple[str, ...]) -> str:
    """Create (or replace) the automation that schedules a crashed run of any of `deployments` again, as the same
    flow run (same parameters, its run count one higher), for the next worker of the pool to take.

    solve-bug and the nightly sweep: running a task again is safe (a graded result is never lost; one kept after a
    failed upload is uploaded without running the agent), and a sweep run again (the same flow run) finds the
    solve-bug runs it had started by their idempotency keys and collects them, whatever state they are in, rather
    than starting them twice (tasks/fanout.py). The flows refuse a run crashed more than `CRASH_RERUNS` times (it
    then ends Failed, which no automation repeats), so a task that kills its process every time (out of memory) is
    not run forever. Returns the automation's name.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    from tasks.fanout import CRASH_RERUNS

    with get_client(sync_client=True) as client:
        ids = [f"prefect.deployment.{client.read_deployment_by_name(name).id}" for name in deployments]
        automation = AutomationCore(
            name=RERUN_AUTOMATION,
            description=(
                f"A run of {' or '.join(deployments)} that ends Crashed (its process killed, out of memory, its "
                f"machine lost) is scheduled again {RERUN_AFTER_S} s later, at most {CRASH_RERUNS} time(s). Shipped "
                "by `bugsweep deploy`."
            ),
            trigger=EventTrigger(  # a run Crashed that nothing moved on from within RERUN_AFTER_S
                match={"prefect.resource.id": "prefect.flow-run.*"},
                match_related={"prefect.resource.role": "deployment", "prefect.resource.id": ids},
                after={"prefect.flow-run.Crashed"},
                expect={"prefect.flow-run.*"},
                for_each={"prefect.resource.id"},
                posture=Posture.Proactive,
                threshold=1,
                within=timedelta(seconds=RERUN_AFTER_S),
            ),
            actions=[
                ChangeFlowRunState(
                    name="AwaitingRetry",
                    force=True,
                    state=StateType.SCHEDULED,
                    message="crashed: scheduled again by the automation "
                    f"{RERUN_AUTOMATION!r} (a graded result is never lost, and a sweep collects the runs it had "
                    "started, so running it again is safe)",
                )
            ],
        )
    _replace_automation(automation)
    return RERUN_AUTOMATION


def choose_saved_blocks(full_name: str) -> list[str]:
    """Make the default-named saved blocks (the model endpoint, the S3 bucket, the git branches block) the
    deployment's defaults for its `model`, `store` and `branches` parameters, so that its run form shows their
    pickers with them chosen.

    A default is a reference to the saved block (`{"$ref": {"block_document_id": ...}}`), the form a run's
    parameters keep: the key stays in the block. A parameter prefect.yaml sets is left as it is. Returns the
    names of the blocks chosen.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.exceptions import ObjectNotFound
    from prefect_aws import S3Bucket

    from blocks import BRANCHES_BLOCK, MODEL_BLOCK, STORE_BLOCK, GitBranches, ModelEndpoint

    chosen: list[str] = []
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(full_name)
        parameters = dict(deployment.parameters)
        takes = set((deployment.parameter_openapi_schema or {}).get("properties") or {})
        for parameter, block_class, name in (
            ("model", ModelEndpoint, MODEL_BLOCK),
            ("store", S3Bucket, STORE_BLOCK),
            ("branches", GitBranches, BRANCHES_BLOCK),  # where branches go; pushing stays off until asked
        ):
            if parameter not in takes or parameters.get(parameter) is not None:
                continue
            try:
                saved = client.read_block_document_by_name(name, block_class.get_block_type_slug())
            except ObjectNotFound:
                continue
            parameters[parameter] = {"$ref": {"block_document_id": str(saved.id)}}
            chosen.append(name)
        if chosen:
            client.update_deployment(deployment.id, DeploymentUpdate(parameters=parameters))
    return chosen


def worker_command(pool: str) -> str:
    """The command that starts a worker for `pool` (run it on every machine that should take runs)."""
    return f"bugsweep worker --pool {pool}"


def _set_paused(full_name: str, paused: bool) -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(full_name)
        if paused and not deployment.paused:
            client.pause_deployment(deployment.id)
        elif not paused and deployment.paused:
            client.resume_deployment(deployment.id)


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _deployment(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next((d for d in config.get("deployments") or [] if d.get("name") == name), {})


def _failure(what: str, done: subprocess.CompletedProcess[str]) -> Exception:
    text = (done.stdout + "\n" + done.stderr).strip()[-2000:]
    if "Connect" in text or "connection" in text.lower():
        return InfraError(f"{what}: the Prefect API is not reachable (is PREFECT_API_URL right?)\n{text}")
    return ConfigError(f"{what}:\n{text}")
