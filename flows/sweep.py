"""The `sweep` flow: many bug-fix tasks at once, each graded and uploaded, with a summary at the end.

Tasks run either in this flow's process (threads, at most `concurrency` at once: one machine) or as runs of the
`solve-bug` deployment (`run_on="workers"`), created at once and scheduled by Prefect over every worker of the
deployment's work pool, on any number of machines (tasks/fanout.py); the sweep then collects each run's grade from
the artifact store as it ends. What a sweep decides besides (what was graded before, results kept after a failed
upload, the predictions file) is plain code in bugsweep.sweep.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from prefect import flow, get_run_logger
from prefect.states import Completed
from prefect_aws import S3Bucket
from pydantic import Field

from blocks import GitBranches, ModelEndpoint
from bugsweep.agent import endpoint
from bugsweep.agent.model import ChatModel
from bugsweep.discover import RepoBranch, TaskFile
from bugsweep.errors import BugsweepError, StorageError, first_line
from bugsweep.grading import Grade
from bugsweep.runconfig import chosen
from bugsweep.spec import TaskSpec
from bugsweep.storage import key_part
from bugsweep.swebench import write_predictions
from bugsweep.sweep import RunSetup, TaskOutcome
from bugsweep.sweep.collect import prediction_runs
from bugsweep.sweep.graded import Graded, other_configurations, split_graded, upload_kept
from flows.common import (
    RELEASE_SANDBOXES_HOOKS,
    AgentChoices,
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
    push_branches_field,
    refuse_endless_reruns,
    sandbox_field,
    store_field,
)
from flows.solve_bug import Job, solve_many
from tasks import fanout, quiet_prefect_logs, steps
from tasks.limits import use_prefect_limits
from tasks.publish import ReviewPage, after_late_upload

#: A plain union (not a discriminated one): the Prefect UI draws it as a choice of two forms, not a JSON box.
TaskSource = TaskFile | RepoBranch


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
        4,
        "Tasks at once",
        "In this run's process (this-process). On workers Prefect decides: each worker's --limit, the pool's "
        "limit and the solve-bug deployment's concurrency limit.",
    ),
    run_on: Literal["this-process", "workers"] = form_field(
        "this-process",
        "Run tasks on",
        "this-process: in the sweep's own process; workers: each task as a run of the solve-bug deployment, all "
        "created at once and taken by the workers of its pool (any machine) as their limits allow.",
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
    use_prefect_limits()
    logger = get_run_logger()
    try:
        refuse_endless_reruns()
        run = load_run_config(
            model, sandbox, store, limits, flow_run_id=current_flow_run_id(), push_branches=push_branches,
            branches=branches, escalate_to=escalate_to,
        )  # fmt: skip
        sweep_name = name or default_name(source)
        # a wrong URL, key or model name fails now, not after a branch's setup; a sweep run again reached its
        # endpoints before it crashed: a refusal now is a server restarting, waited for
        for settings in [run.model, *run.escalate_to]:
            if settings.base_url and fanout.run_again():
                endpoint.mark_answered(settings)
            if settings.base_url:
                ChatModel(settings).check()
        upload_kept(run.store, run.local_dir, sweep_name, log=logger, after=late_upload_by(sweep_name))
        list_tasks = steps.list_tasks.with_options(retry_delay_seconds=steps.retry_delays_s())
        specs = list_tasks(source, run.provider, run.store, setup_network=run.setup_network)
        todo, graded = (specs, Graded()) if redo_graded else split_graded(specs, run, sweep_name, log=logger)
        if graded.by_other_code and keep_graded_by_other_code:
            todo = graded.keep_other_code(todo, log=logger)
        if run_on == "workers":
            todo = resumed(specs, todo, graded)
            shared = worker_parameters(model, sandbox, store, limits, push_branches, branches, escalate_to)
            outcomes = fanout.run_on_workers(todo, run, sweep_name, deployment, shared, log=logger)
        else:
            with model_endpoint(run) as run:
                outcomes = solve_many([Job(spec, run, sweep_name) for spec in todo], concurrency)
    except BugsweepError as exc:  # the night could not run (its tasks, its model, its store): one line
        return failed_state(exc)
    return publish_night(sweep_name, specs, run, graded, outcomes)


def late_upload_by(sweep_name: str) -> Any:
    """What a sweep does for each result an earlier run kept and it uploaded as it started: the artifacts that run
    would have made, and that run set Completed."""
    return lambda store, key, folder: after_late_upload(
        store, key, folder, by=f"sweep {sweep_name} as it started"
    )


def resumed(specs: list[TaskSpec], todo: list[TaskSpec], graded: Graded) -> list[TaskSpec]:
    """A sweep run again after a crash (the rerun automation) collects every task it had started as a run, graded
    by now or not, instead of counting it as graded before; on a first run, `todo` as it is."""
    again = fanout.tasks_started_before()
    if not again:
        return todo
    get_run_logger().warning("run again after a crash: collecting the %d run(s) it had started", len(again))
    graded.same = [grade for grade in graded.same if grade.instance_id not in again]
    return [spec for spec in specs if spec.instance_id in again or spec in todo]


def publish_night(
    sweep_name: str, specs: list[TaskSpec], run: RunSetup, graded: Graded, outcomes: list[TaskOutcome]
) -> Any:
    """The night's summary, predictions file and review page, and its final state (Completed only when every task
    was graded and stored)."""
    rows = summary_rows(graded, outcomes)
    notes = graded.notes()
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
    shown = {key for key, _ in graded.kept.values()}
    others = other_configurations(run, sweep_name, specs, shown)
    steps.summarize(
        sweep_name, rows + [steps.summary_row(g, other_configuration=True) for g in others], run.store.location,
        review, notes,
    )  # fmt: skip
    grades = graded.grades() + [o.grade for o in outcomes]
    message = "; ".join([f"sweep {sweep_name} {steps.sweep_outcome(rows)}", *notes])
    if not all(r["ran"] for r in rows):
        return failed_state(SweepFailed(message, grades), message)
    return Completed(message=message, data=grades)


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
