"""The `sweep` flow: many bug-fix tasks at once, each graded and uploaded, with a summary at the end.

Tasks run either in this flow's process (threads, at most `concurrency` at once) or as runs of the `solve-bug`
deployment (`run_on="workers"`), so that every worker of the deployment's work pool, on any number of machines,
takes a share of one sweep; the sweep then collects each run's grade from the artifact store.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from prefect import flow, get_run_logger
from prefect.states import Completed
from prefect_aws import S3Bucket
from pydantic import Field

from blocks import GitBranches, ModelEndpoint
from bugsweep.agent.model import ChatModel
from bugsweep.branches import BRANCH_FILE
from bugsweep.discover import RepoBranch, TaskFile
from bugsweep.errors import BugsweepError, ConfigError, InfraError, StorageError, first_line
from bugsweep.grading import Grade
from bugsweep.pipeline import failed_grade
from bugsweep.runconfig import CODE_FIELDS, chosen
from bugsweep.spec import TaskSpec
from bugsweep.storage import GRADE_FILE, key_part, run_key
from bugsweep.swebench import write_predictions
from bugsweep.upload import pending_runs, upload_pending
from flows.common import (
    CRASH_RERUNS,
    RELEASE_SANDBOXES_HOOKS,
    AgentChoices,
    RunSetup,
    SandboxName,
    block_ref,
    branches_field,
    current_flow_run_id,
    escalate_to_field,
    failed_state,
    form_field,
    limits_field,
    load_run_config,
    model_endpoint,
    model_field,
    previous_grade,
    push_branches_field,
    sandbox_field,
    store_field,
)
from flows.solve_bug import Job, TaskOutcome, configured, solve_many
from tasks import quiet_prefect_logs, steps
from tasks.publish import RUN_FILE, ReviewPage, after_late_upload

#: A plain union (not a discriminated one): the Prefect UI draws it as a choice of two forms, not a JSON box.
TaskSource = TaskFile | RepoBranch
#: How often the sweep looks at its solve-bug runs when they run on workers.
POLL_S = 2.0
#: How long the sweep waits for a crashed solve-bug run to be scheduled again by the rerun automation.
RERUN_GRACE_S = 30.0


@flow(
    name="sweep",
    log_prints=True,
    **RELEASE_SANDBOXES_HOOKS,
)
def sweep(
    source: TaskSource = form_field(
        ...,
        "Tasks",
        "A task file (a path on the worker, best absolute, or s3://BUCKET/KEY), or a repository and branch whose "
        "failing test files become the tasks.",
    ),
    name: str = form_field(
        "", "Sweep name", "The folder in the artifact store; empty: the task file's or repository's name."
    ),
    model: ModelEndpoint | None = model_field(),
    sandbox: SandboxName | None = sandbox_field(),
    store: S3Bucket | None = store_field(),
    limits: AgentChoices = limits_field(
        "The agent's budget per task (turns, tokens, cost, time) and policy; a field left empty: the worker's "
        "BUGSWEEP_* variable, else the default."
    ),
    concurrency: Annotated[int, Field(ge=1, le=256)] = form_field(
        4, "Tasks at once", "In this run's process, or solve-bug runs in flight on the workers."
    ),
    run_on: Literal["this-process", "workers"] = form_field(
        "this-process",
        "Run tasks on",
        "this-process: in the sweep's own process; workers: each task as a run of the solve-bug deployment, taken "
        "by any worker of its pool.",
    ),
    deployment: str = form_field(
        "solve-bug/solve-bug",
        "solve-bug deployment",
        "The deployment that runs each task with run_on: workers.",
    ),
    redo_graded: bool = form_field(
        False,
        "Run graded tasks again",
        "Run tasks already graded for this model, commit and configuration again, e.g. after a bad night (other "
        "configurations' grades are kept).",
    ),
    keep_graded_by_other_code: bool = form_field(
        False,
        "Keep grades made by another bugsweep",
        "A task graded by another bugsweep (before an upgrade: another code digest) under an otherwise identical "
        "configuration keeps that grade instead of running again; the summary says so. Off: such tasks run "
        "again and both grades are kept.",
    ),
    push_branches: bool = push_branches_field(),
    branches: GitBranches | None = branches_field(),
    escalate_to: list[ModelEndpoint] = escalate_to_field(),
) -> Any:  # the final State; a caller of the flow gets its grades (list[Grade]), or SweepFailed raised
    """Run every task of a task file (or every failing test file of a branch) and grade each.

    A task that cannot be run becomes a failed grade and never stops the others; the sweep then ends Failed,
    whatever the reason (an outage, configuration, a crash, or the task's own setup or tests), with each such task
    and its reason in the summary: Completed means every task was graded. Tasks already graded for this model at this commit under the same sweep
    name and the same configuration (bugsweep.runconfig: model settings, policy, limits, sandbox, environment,
    bugsweep's version and code) are skipped, unless `redo_graded`; a sweep under another configuration runs them
    and keeps both, and its summary shows every configuration's grades. A task graded by another bugsweep (another
    code digest, the configuration otherwise the same) runs again, and the log and the summary say how many ("3
    graded by another bugsweep: running again"), unless `keep_graded_by_other_code`, which keeps those grades and
    says so in the summary. Results an earlier run kept after a failed upload
    are uploaded first. The review page of every run in the sweep's folder (`bugsweep review`) is stored beside
    them as SWEEP/review.html and linked from the summary and a link artifact; a page that cannot be made is a
    failed `review-page` step and a line of the final state. The final state's message says how many tasks were
    resolved, not resolved, held for review and could not run, why each of the last could not, and how many were
    skipped as graded before. With `push_branches`, each resolved fix of this run is pushed as branch
    PREFIX/SWEEP/TASK (bugsweep.branches; tasks skipped as graded before are not pushed again); a push that fails
    leaves the grade as it is and ends the sweep Failed, naming the task.

    Each parameter's title and help (what the run form shows) are in its declaration above.
    """
    quiet_prefect_logs()
    try:
        run = load_run_config(
            model, sandbox, store, limits, flow_run_id=current_flow_run_id(), push_branches=push_branches,
            branches=branches, escalate_to=escalate_to,
        )  # fmt: skip
        sweep_name = name or default_name(source)
        # a wrong URL, key or model name fails now, not after a branch's setup
        for endpoint in [run.model, *run.escalate_to]:
            if endpoint.base_url:
                ChatModel(endpoint).check()
        upload_kept(run, sweep_name)
        list_tasks = steps.list_tasks.with_options(retry_delay_seconds=steps.retry_delays_s())
        specs = list_tasks(source, run.provider, run.store, setup_network=run.setup_network)
        todo, graded = (specs, Graded()) if redo_graded else split_graded(specs, run, sweep_name)
        if graded.by_other_code and keep_graded_by_other_code:
            graded.keep_other_code()
            todo = [spec for spec in todo if spec.instance_id not in graded.kept]
        if run_on == "workers":
            shared = worker_parameters(model, sandbox, store, limits, push_branches, branches, escalate_to)
            outcomes = run_on_workers(todo, run, sweep_name, concurrency, deployment, shared)
        else:
            with model_endpoint(run) as run:
                outcomes = solve_many([Job(spec, run, sweep_name) for spec in todo], concurrency)
    except BugsweepError as exc:  # the night could not run (its tasks, its model, its store): one line
        return failed_state(exc)
    rows = summary_rows(graded, outcomes)
    notes = ([skipped_note(graded.same)] if graded.same else []) + graded.notes()
    try:
        predictions = write_predictions(
            run.store, key_part(sweep_name), run.model.model,
            prediction_runs(specs, run, sweep_name, outcomes, graded), run.local_dir,
        )  # fmt: skip
        get_run_logger().info("predictions (SWE-bench's format): %s", predictions)
    except StorageError as exc:  # the grades are stored; the file made from them is not
        notes.append(f"No predictions file in the store: {first_line(str(exc))}")
    review = None
    if rows:
        made = steps.review_page(sweep_name, run.store, return_state=True)
        page = made.result(raise_on_failure=False)
        if isinstance(page, ReviewPage):
            review = page
        else:  # the step failed (its state in the UI); the night says so too, and the grades stand
            why = str(page) if isinstance(page, BaseException) else made.message or "its step failed"
            notes.append(f"No review page: {first_line(why)}")
            get_run_logger().warning("%s", notes[-1])
    others = other_configurations(run, sweep_name, specs, shown={key for key, _ in graded.kept.values()})
    steps.summarize(sweep_name, rows + others, run.store.location, review, notes)
    grades = graded.grades() + [o.grade for o in outcomes]
    message = "; ".join([f"sweep {sweep_name} {steps.sweep_outcome(rows)}", *notes])
    if not all(r["ran"] for r in rows):
        return failed_state(SweepFailed(message, grades), message)
    return Completed(message=message, data=grades)


def skipped_note(graded: list[Grade]) -> str:
    """What a rerun says about the tasks it did not run again."""
    return (
        f"{len(graded)} task(s) already graded under this configuration were not run again (redo_graded, "
        "`bugsweep sweep --redo-graded`, runs them again)"
    )


class SweepFailed(BugsweepError):
    """Ends a sweep FAILED when a task could not be run (for any reason) or its result could not be stored; carries
    every grade, so the command line still shows them."""

    kind = "infra"

    def __init__(self, message: str, grades: list[Grade]) -> None:
        super().__init__(message)
        self.grades = grades


def default_name(source: TaskFile | RepoBranch) -> str:
    """A stable name, so running the same sweep again finds (and skips) what it already graded."""
    if isinstance(source, TaskFile):
        return Path(source.path).stem or "tasks"
    repo = Path(source.repo.rstrip("/")).name.removesuffix(".git")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{repo}-{source.branch}")


def upload_kept(run: RunSetup, sweep_name: str) -> None:
    """Upload what earlier runs of this sweep kept on this machine when their upload failed, so that their tasks
    count as graded and the agent does not run on them again. What still fails stays for the next time."""
    logger = get_run_logger()
    for folder in pending_runs(run.local_dir / key_part(sweep_name)):
        try:
            uploaded = upload_pending(run.store, folder)
        except StorageError as exc:
            logger.error("the result kept in %s is still not uploaded: %s", folder, exc)
            continue
        logger.warning(
            "uploaded the result an earlier run kept in %s (its upload had failed) to %s/%s",
            folder, uploaded.location, uploaded.key,
        )  # fmt: skip
        after_late_upload(run.store, uploaded.key, folder, by=f"sweep {sweep_name} as it started")


@dataclass
class Graded:
    """The tasks of a sweep graded before: under this configuration, and (by instance id) under this configuration
    made by another bugsweep (another code digest; a grade from before an upgrade)."""

    same: list[Grade] = field(default_factory=list)
    by_other_code: dict[str, tuple[str, Grade]] = field(default_factory=dict)
    """instance id -> (run key, grade)."""
    kept: dict[str, tuple[str, Grade]] = field(default_factory=dict)
    """Those of `by_other_code` kept by choice (keep_graded_by_other_code) instead of running again."""

    def keep_other_code(self) -> None:
        self.kept, self.by_other_code = self.by_other_code, {}
        get_run_logger().warning(
            "%d graded by another bugsweep: keeping their grades (keep_graded_by_other_code)", len(self.kept)
        )

    def grades(self) -> list[Grade]:
        return self.same + [grade for _, grade in self.kept.values()]

    def notes(self) -> list[str]:
        """What the sweep's summary says of them."""
        notes = []
        if self.by_other_code:
            notes.append(
                f"{len(self.by_other_code)} graded by another bugsweep (another code digest): run again, the "
                "earlier grades kept under their configurations"
            )
        if self.kept:
            notes.append(
                f"{len(self.kept)} graded by another bugsweep: their grades kept by choice (keep_graded_by_other_code, "
                f"`--keep-graded-by-other-code`), not run with this bugsweep: {', '.join(sorted(self.kept))}"
            )
        return notes


def split_graded(specs: list[TaskSpec], run: RunSetup, sweep_name: str) -> tuple[list[TaskSpec], Graded]:
    """(tasks still to run, what was graded before): a task counts as graded when this model graded this very task
    (bugsweep.spec.same_task) under this configuration; one graded under this configuration by another bugsweep
    is still to run (and said so in one line), unless the sweep keeps those grades."""
    todo: list[TaskSpec] = []
    graded = Graded()
    for spec in specs:
        key = run_key(sweep_name, spec.instance_id, run.model.model, run.config.digest)
        earlier = previous_grade(run.store, key, spec)
        if earlier is None:
            todo.append(spec)
        else:
            graded.same.append(earlier)
    logger = get_run_logger()
    if graded.same:
        logger.warning("%s: %s (model %s, configuration %s)", skipped_note(graded.same),
                       ", ".join(g.instance_id for g in graded.same), run.model.model, run.config.digest)  # fmt: skip
    graded.by_other_code = graded_by_other_code(run, sweep_name, todo)
    if graded.by_other_code:
        logger.warning("%d graded by another bugsweep: running again", len(graded.by_other_code))
    return todo, graded


def graded_by_other_code(
    run: RunSetup, sweep_name: str, specs: list[TaskSpec]
) -> dict[str, tuple[str, Grade]]:
    """Per task of `specs` (by instance id), a grade this model made of it under this very configuration but by
    another bugsweep: the same configuration once its code (bugsweep_version, bugsweep_code) is left out, and the
    same task (bugsweep.spec.same_task). One listing of the sweep's folder."""
    wanted = {key_part(spec.instance_id): spec for spec in specs}
    model, ours = key_part(run.model.model), run.config.without_code()
    found: dict[str, tuple[str, Grade]] = {}
    for key in run.store.list(key_part(sweep_name) + "/"):
        parts = key.split("/")  # SWEEP/TASK/MODEL/CONFIG/grade.json
        if len(parts) != 5 or parts[4] != GRADE_FILE or parts[2] != model or parts[3] == run.config.digest:
            continue
        spec = wanted.get(parts[1])
        if spec is None or spec.instance_id in found:
            continue
        folder = key.rsplit("/", 1)[0]
        grade = previous_grade(run.store, folder, spec)
        config = dict(grade.config or {}) if grade is not None else {}
        if grade is not None and {k: v for k, v in config.items() if k not in CODE_FIELDS} == ours:
            found[spec.instance_id] = (folder, grade)
    return found


def worker_parameters(
    model: ModelEndpoint | None, sandbox: str | None, store: S3Bucket | None, limits: AgentChoices,
    push_branches: bool, branches: GitBranches | None, escalate_to: list[ModelEndpoint] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The sweep's own parameters that each solve-bug run on a worker takes too, as the deployment run's JSON:
    blocks as references, and only the limits the sweep was given (the worker builds the rest as any run)."""
    return {
        "model": block_ref(model), "sandbox": sandbox, "store": block_ref(store), "limits": chosen(limits),
        "push_branches": push_branches, "branches": block_ref(branches),
        "escalate_to": [block_ref(block) for block in escalate_to or []],
    }  # fmt: skip


def run_on_workers(
    specs: list[TaskSpec],
    run: RunSetup,
    sweep_name: str,
    concurrency: int,
    deployment: str,
    parameters: dict[str, Any],
) -> list[TaskOutcome]:
    """Each task as a run of the solve-bug deployment, at most `concurrency` at once; whichever worker of the pool
    is free picks it up. Each run's grade is read back from the artifact store (so use S3 across machines).

    `parameters` are the sweep's own that each solve-bug run takes too (`worker_parameters`).
    """
    from prefect.client.orchestration import get_client

    logger = get_run_logger()
    pending = list(specs)
    running: dict[Any, tuple[TaskSpec, float]] = {}
    outcomes: list[TaskOutcome] = []
    with get_client(sync_client=True) as client:
        try:
            while pending or running:
                while pending and len(running) < concurrency:
                    spec = pending.pop(0)
                    flow_run = start_solve_bug(deployment, spec, sweep_name, parameters)
                    logger.info("%s -> flow run %s", spec.instance_id, flow_run.name)
                    running[flow_run.id] = (spec, time.monotonic())
                time.sleep(POLL_S)
                for run_id, (spec, started) in list(running.items()):
                    flow_run = client.read_flow_run(run_id)
                    if flow_run.state is None or not flow_run.state.is_final() or awaiting_rerun(flow_run):
                        continue
                    del running[run_id]
                    outcomes.append(collect(spec, str(run_id), flow_run.state, run, sweep_name, started))
                    logger.info("%s: %s", spec.instance_id, flow_run.state.name)
        except BaseException:
            cancel_runs(client, list(running))  # the sweep was cancelled or crashed: its tasks stop too
            raise
    return outcomes


def awaiting_rerun(flow_run: Any) -> bool:
    """A solve-bug run that just crashed for the first time: the rerun automation (`bugsweep deploy`) is about to
    schedule it again, so the sweep follows it instead of counting the task as lost. Given up after RERUN_GRACE_S
    (a server without that automation)."""
    from prefect.client.schemas.objects import StateType

    state = flow_run.state
    if state.type != StateType.CRASHED or flow_run.run_count > CRASH_RERUNS:
        return False
    return (datetime.now(UTC) - state.timestamp).total_seconds() < RERUN_GRACE_S


def start_solve_bug(deployment: str, spec: TaskSpec, sweep_name: str, parameters: dict[str, Any]) -> Any:
    """A new run of the solve-bug deployment for one task (returns at once; a worker picks it up)."""
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
            tags=[f"sweep:{sweep_name}"],
        )
    except ObjectNotFound as exc:
        raise ConfigError(
            f"no deployment {deployment!r} to run the tasks on: deploy it first (`bugsweep deploy`)"
        ) from exc


def cancel_runs(client: Any, run_ids: list[Any]) -> None:
    """Ask the workers to cancel these flow runs (best effort: the sweep is ending anyway)."""
    from prefect.states import Cancelling

    for run_id in run_ids:
        try:
            client.set_flow_run_state(run_id, Cancelling(message="its sweep ended"), force=True)
        except Exception:
            get_run_logger().warning("could not cancel flow run %s", run_id, exc_info=True)


def collect(
    spec: TaskSpec, run_id: str, state: Any, run: RunSetup, sweep_name: str, started: float
) -> TaskOutcome:
    """The outcome of one solve-bug run, from the grade it uploaded (only if that run wrote it, not an older one).

    A worker makes the run's configuration from its own settings; one that made another configuration than the
    sweep's (other BUGSWEEP_*/LLM_* settings, another bugsweep version) stored its grade under another digest,
    and the task is a configuration failure that says so."""
    key = run_key(sweep_name, spec.instance_id, run.model.model, run.config.digest)
    stored_at = f"{run.store.location}/{key}"
    try:
        written_by = json.loads(run.store.get_bytes(f"{key}/{RUN_FILE}")).get("flow_run_id")
        if written_by != run_id:
            raise FileNotFoundError(f"{stored_at} holds flow run {written_by}'s results, not this run's")
        verdict = Grade.model_validate_json(run.store.get_bytes(f"{key}/{GRADE_FILE}"))
    except (FileNotFoundError, ValueError) as exc:
        elsewhere = [k.split("/")[-2] for k in written_by_run(run, key.rsplit("/", 1)[0], run_id)]
        why: BugsweepError = InfraError(
            f"solve-bug run {run_id} ended {state.name} with no grade in the store ({exc})"
        )
        if elsewhere:
            why = ConfigError(
                f"solve-bug run {run_id} ran under configuration {elsewhere[0]} on its worker, not the sweep's "
                f"{run.config.digest}: the worker's settings (LLM_*, BUGSWEEP_*, its blocks) or bugsweep version "
                "differ from this machine's (compare the two grade.json `config`s)"
            )
        verdict = configured(failed_grade(spec, run.model.model, why, started=started), run)
        return TaskOutcome(grade=verdict, key=key, local_dir=run.local_dir / key)
    outcome = TaskOutcome(grade=verdict, key=key, local_dir=run.local_dir / key, stored_at=stored_at)
    if run.branches is not None and verdict.resolved:
        stored_branch(outcome, run, key)
    return outcome


def stored_branch(outcome: TaskOutcome, run: RunSetup, key: str) -> None:
    """The branch a solve-bug run on a worker pushed, or why it could not, from the branch.json it stored."""
    try:
        record = json.loads(run.store.get_bytes(f"{key}/{BRANCH_FILE}"))
    except (FileNotFoundError, ValueError):
        record = {"error": "the solve-bug run stored no branch.json"}
    if record.get("commit"):
        outcome.branch = (
            f"branch {record.get('branch')} ({str(record['commit'])[:12]}) on {record.get('remote')}"
        )
    else:
        outcome.branch_error = f"the fix was not pushed as a branch: {record.get('error')}"


def written_by_run(run: RunSetup, task_prefix: str, run_id: str) -> list[str]:
    """The run.json files under SWEEP/TASK/MODEL that flow run `run_id` wrote (under any configuration)."""
    found = []
    for key in run.store.list(task_prefix + "/"):
        if key.endswith(f"/{RUN_FILE}") and key.count("/") == task_prefix.count("/") + 2:
            with contextlib.suppress(FileNotFoundError, ValueError):
                if json.loads(run.store.get_bytes(key)).get("flow_run_id") == run_id:
                    found.append(key)
    return found


def prediction_runs(
    specs: list[TaskSpec],
    run: RunSetup,
    sweep_name: str,
    outcomes: list[TaskOutcome],
    graded: Graded | None = None,
) -> list[tuple[str, str, Path | None]]:
    """(instance_id, run key, local run folder) of every task of the sweep in task-file order, for its
    predictions: read from the store (a grade kept from another bugsweep: its own folder), or from the run folder
    on this machine when its upload failed."""
    local: dict[str, tuple[str, Path | None]] = {
        task: (key, None) for task, (key, _) in (graded.kept if graded else {}).items()
    }
    local.update({o.grade.instance_id: (o.key, None if o.stored_at else o.local_dir) for o in outcomes})
    found: list[tuple[str, str, Path | None]] = []
    for spec in specs:
        key, folder = local.get(spec.instance_id, (run_key(sweep_name, spec.instance_id, run.model.model,
                                                           run.config.digest), None))  # fmt: skip
        found.append((spec.instance_id, key, folder))
    return found


def summary_rows(graded: Graded, outcomes: list[TaskOutcome]) -> list[dict[str, Any]]:
    rows = [steps.summary_row(g, skipped=True) for g in graded.same]
    rows += [steps.summary_row(g, kept_other_code=True) for _, g in graded.kept.values()]
    for o in outcomes:
        where = o.stored_at or (f"upload failed, kept at {o.local_dir}" if o.upload_error else "")
        failed = o.upload_error is not None
        rows.append(
            steps.summary_row(
                o.grade, uploaded_to=where, upload_failed=failed, reused=o.reused, branch=o.branch,
                branch_error=o.branch_error,
            )
        )  # fmt: skip
    return rows


def other_configurations(
    run: RunSetup,
    sweep_name: str,
    specs: list[TaskSpec],
    shown: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[dict[str, Any]]:
    """Summary rows of the grades these tasks have in the store under this model's other configurations (another
    policy, turn budget, temperature, bugsweep, ...), so that a sweep's summary shows them side by side with its
    own; those of the run folders in `shown` are among the sweep's own rows already. One listing of the sweep's
    folder; a failed attempt is no grade and is not listed."""
    tasks = {key_part(spec.instance_id): i for i, spec in enumerate(specs)}
    model = key_part(run.model.model)
    found: list[tuple[int, str, Grade]] = []
    for key in run.store.list(key_part(sweep_name) + "/"):
        parts = key.split("/")  # SWEEP/TASK/MODEL/CONFIG/grade.json
        if len(parts) != 5 or parts[4] != GRADE_FILE or parts[1] not in tasks or parts[2] != model:
            continue
        if parts[3] == run.config.digest or key.rsplit("/", 1)[0] in shown:
            continue
        with contextlib.suppress(FileNotFoundError, ValueError):
            other = Grade.model_validate_json(run.store.get_bytes(key))
            if not other.error:
                found.append((tasks[parts[1]], parts[3], other))
    return [steps.summary_row(g, other_configuration=True) for _, _, g in sorted(found, key=lambda f: f[:2])]
