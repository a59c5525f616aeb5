"""A sweep's tasks as runs of the solve-bug deployment, scheduled by Prefect: created at once, and taken by the
workers of the pool as Prefect's limits allow (each worker's `--limit`, the pool's, and solve-bug's own
concurrency limit with collision strategy ENQUEUE in prefect.yaml); the sweep only waits for them and collects
each run's grade from the artifact store as it ends (bugsweep.sweep.collect).

Each run is a child of the sweep's flow run (a subflow): cancelling the sweep cancels them (Prefect's own
cancellation of the subflows of a cancelled run). A sweep that crashes leaves them running; they finish and store
their grades, and the sweep's rerun (the crash automation of `bugsweep deploy`, as the same flow run) finds them
again by their idempotency keys (one per sweep run and task) and collects them instead of starting them again.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from bugsweep.errors import ConfigError
from bugsweep.sweep.collect import collect
from tasks.publish import publish_stored_patch

if TYPE_CHECKING:
    from bugsweep.spec import TaskSpec
    from bugsweep.sweep.setup import RunSetup
    from bugsweep.sweep.task import TaskOutcome

#: How often the sweep reads the states of its runs still going (one query for all of them).
POLL_S = 3.0
#: How long the sweep waits for a crashed solve-bug run to be scheduled again by the rerun automation (which waits
#: deployments.deploy.RERUN_AFTER_S first).
RERUN_GRACE_S = 120.0
#: A run of the sweep carries this tag (with its sweep's name), so a run can tell it was started by a sweep.
SWEEP_TAG = "sweep:"
#: How many times a crashed run of solve-bug or of a sweep is run again (deployments.deploy.ensure_rerun_automation
#: schedules it; flows.common.refuse_endless_reruns ends a run that has crashed more often Failed).
CRASH_RERUNS = 1


def run_on_workers(
    specs: list[TaskSpec],
    run: RunSetup,
    sweep_name: str,
    deployment: str,
    parameters: dict[str, Any],
    log: Any,
) -> list[TaskOutcome]:
    """Each task as a run of `deployment` (all created now), then each run's outcome as it ends, in task order.

    `parameters` are the sweep's own that each run takes too (the blocks as references, the limits given)."""
    from prefect.runtime import flow_run

    sweep_run = str(flow_run.get_id() or "")
    runs = {start(deployment, spec, sweep_name, parameters, key=f"{sweep_run}:{spec.instance_id}").id: spec
            for spec in specs}  # fmt: skip
    log.info(
        "%d task(s) scheduled as runs of %s; the workers take them as their limits allow",
        len(runs),
        deployment,
    )
    outcomes = {spec.instance_id: outcome for spec, outcome in wait_and_collect(runs, run, sweep_name, log)}
    return [outcomes[spec.instance_id] for spec in specs]


def start(deployment: str, spec: TaskSpec, sweep_name: str, parameters: dict[str, Any], key: str) -> Any:
    """A run of the solve-bug deployment for one task, as a child of this flow run (returns at once). The same
    `key` gives the same run: a sweep run again finds the runs it started before."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    try:
        return run_deployment(
            deployment,
            parameters={
                **parameters,
                "repo": spec.repo,
                "problem": spec.problem_statement,
                "task": spec.model_dump(mode="json"),
                "sweep": sweep_name,
            },
            timeout=0,
            tags=[f"{SWEEP_TAG}{sweep_name}"],
            idempotency_key=key,
            flow_run_name=f"{sweep_name}-{spec.instance_id}"[:100],
        )
    except ObjectNotFound as exc:
        raise ConfigError(
            f"no deployment {deployment!r} to run the tasks on: deploy it first (`bugsweep deploy`)"
        ) from exc


def wait_and_collect(
    runs: dict[Any, TaskSpec], run: RunSetup, sweep_name: str, log: Any
) -> list[tuple[TaskSpec, TaskOutcome]]:
    """Wait for every run (one query for all those still going, every POLL_S) and collect each one's outcome from
    the store as it ends."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    going = dict(runs)
    done: list[tuple[TaskSpec, TaskOutcome]] = []
    with get_client(sync_client=True) as client:
        while going:
            ids = list(going)
            for chunk in (ids[i : i + 200] for i in range(0, len(ids), 200)):
                for child in client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=chunk))
                ):
                    state = child.state
                    if state is None or not state.is_final() or awaiting_rerun(child):
                        continue
                    spec = going.pop(child.id)
                    outcome = collect(spec, str(child.id), state.name or state.type.value, run, sweep_name)
                    if (
                        outcome.stored_at
                    ):  # its patch on the sweep's page too, as for a task run in its process
                        publish_stored_patch(run.store, outcome.key, outcome.grade)
                    done.append((spec, outcome))
                    log.info("%s: %s (%d to go)", spec.instance_id, state.name, len(going))
            if going:
                time.sleep(POLL_S)
    return done


def awaiting_rerun(flow_run: Any) -> bool:
    """A solve-bug run that just crashed for the first time: the rerun automation (`bugsweep deploy`) is about to
    schedule it again, so the sweep follows it instead of counting the task as lost. Given up after RERUN_GRACE_S
    (a server without that automation)."""
    from prefect.client.schemas.objects import StateType

    state = flow_run.state
    if state.type != StateType.CRASHED or flow_run.run_count > CRASH_RERUNS:
        return False
    return (datetime.now(UTC) - state.timestamp).total_seconds() < RERUN_GRACE_S


def run_again() -> bool:
    """Whether this flow run is a rerun (its process crashed, and the rerun automation scheduled it again)."""
    from prefect.runtime import flow_run

    return int(flow_run.run_count or 0) > 1


def tasks_started_before() -> set[str]:
    """The tasks this sweep's flow run started as runs before it crashed and was run again (none on a first run):
    the rerun collects them, whatever their state, instead of counting them as graded before."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
    from prefect.runtime import flow_run

    sweep_run = flow_run.get_id()
    if not run_again() or not sweep_run:
        return set()
    parent = FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[UUID(sweep_run)]))
    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(flow_run_filter=parent)
    return {str((child.parameters.get("task") or {}).get("instance_id")) for child in children}


def started_by_sweep() -> bool:
    """Whether this flow run is one of a sweep's (its tag says so)."""
    from prefect.runtime import flow_run

    return any(str(tag).startswith(SWEEP_TAG) for tag in flow_run.tags or [])
