"""The `solve-bug` flow: one bug-fix task, end to end: setup, baseline, solve, regrade, upload.

`solve_one` is that task as the flows run it: bugsweep.sweep.solve_one with each step a Prefect task
(tasks/steps.py), and `solve_many` runs many of them at once in this process, for the sweep and the model
comparison.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prefect import flow, get_run_logger
from prefect import task as prefect_task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_aws import S3Bucket

from blocks import GitBranches, ModelEndpoint
from bugsweep.agent import endpoint
from bugsweep.attempts import resolved_at
from bugsweep.branches import ADHOC
from bugsweep.errors import BugsweepError, ConfigError, InfraError, StorageError
from bugsweep.grading import Grade, verdict_word
from bugsweep.spec import DEFAULT_SETUP_COMMAND, DEFAULT_TEST_COMMAND, TaskSpec
from bugsweep.storage import run_key
from bugsweep.sweep import task as one_task
from bugsweep.sweep.task import TaskOutcome, TaskSteps
from flows.common import (
    LIVE_SANDBOXES,
    RELEASE_SANDBOXES_HOOKS,
    AgentChoices,
    RunSetup,
    SandboxName,
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
from tasks import quiet_prefect_logs, steps
from tasks.fanout import started_by_sweep
from tasks.limits import use_prefect_limits
from tasks.publish import complete_late


def solve_one(
    spec: TaskSpec, run: RunSetup, sweep: str, *, attempt: int | None = None, name: str | None = None
) -> TaskOutcome:
    """One task end to end (bugsweep.sweep.solve_one) with Prefect's steps: each step of `pipeline.solve_task` a
    task run with its retries, the upload and the branch push as task runs, a log line per agent event. Never
    raises for a task that cannot be run: that is a failed Grade. The sandboxes it holds are known to the flow's
    hooks meanwhile (LIVE_SANDBOXES), which release them should this process die first."""
    run_id = current_flow_run_id()
    with LIVE_SANDBOXES.held_by(run_id) as hold:
        prefect_steps = TaskSteps(
            runner=steps.PrefectSteps(run.agent), upload=steps.upload,
            push=steps.push_branch.with_options(retry_delay_seconds=steps.retry_delays_s()),
            on_event=steps.log_event, on_sandbox=hold, run_id=run_id, late_upload=complete_late,
            log=get_run_logger(),
        )  # fmt: skip
        return one_task.solve_one(spec, run, sweep, prefect_steps, attempt=attempt, name=name)


@prefect_task(name="solve-one", cache_policy=NO_CACHE, persist_result=False)
def solve_one_task(
    spec: TaskSpec, run: RunSetup, sweep: str, attempt: int | None = None, name: str | None = None
) -> TaskOutcome:
    """`solve_one` as a task, so a flow can run many at once on a task runner (each task's steps nest under it)."""
    return solve_one(spec, run, sweep, attempt=attempt, name=name)


@dataclass
class Job:
    """One task to run in `solve_many`: the task, its run setup, the sweep (key prefix), the attempt, and the name
    its results are filed under (default: the model's)."""

    spec: TaskSpec
    run: RunSetup
    sweep: str
    attempt: int | None = None
    name: str | None = None


def solve_many(jobs: list[Job], concurrency: int) -> list[TaskOutcome]:
    """Every job in this process, `concurrency` at a time, in the order given (the sweep's and the comparison's
    fan-out on one machine). Each job's outcome is its own: `solve_one` turns whatever ends a task into that
    task's failed grade."""
    # Any: mypy picks Prefect's async overload of submit for this sync task.
    runner: Any
    with ThreadPoolTaskRunner(max_workers=concurrency) as runner:
        futures = [runner.submit(solve_one_task, parameters=dict(vars(job))) for job in jobs]
        return [_outcome(job, future) for job, future in zip(jobs, futures, strict=True)]


def _outcome(job: Job, future: Any) -> TaskOutcome:
    """The job's outcome; should Prefect itself fail to run `solve_one` (it never raises), a failed grade."""
    try:
        outcome: TaskOutcome = future.result()
        return outcome
    except Exception as exc:
        name = job.name or job.run.model.model
        key = run_key(job.sweep, job.spec.instance_id, name, job.run.config.digest, job.attempt)
        return one_task.failed_outcome(job.spec, job.run, key, exc, time.monotonic())


@flow(
    name="solve-bug",
    log_prints=True,
    **RELEASE_SANDBOXES_HOOKS,
)
def solve_bug(
    repo: str = form_field(
        ...,
        "Repository",
        "A git URL (https://... or git@...), or a folder on the worker. (With a whole task below: its repository.)",
    ),
    problem: str = form_field(
        ...,
        "What is wrong",
        "The bug in words, as you would tell a colleague: what fails, and what should happen.",
    ),
    test_command: str = form_field(
        DEFAULT_TEST_COMMAND,
        "Test command",
        "Runs the tests in the repository: it must fail before the fix and pass after it.",
    ),
    setup_command: str = form_field(
        DEFAULT_SETUP_COMMAND,
        "Setup command",
        "Runs once before the tests, with network access, in the task's own environment: installs what the tests "
        "need, the test runner included (e.g. pip install -e . pytest). Empty: none.",
    ),
    ref: str = form_field(
        "", "Commit, branch or tag", "Where to start from; empty: the repository's default branch."
    ),
    sweep: str = form_field(ADHOC, "Folder", "Folder in the artifact store: SWEEP/TASK/MODEL/CONFIG."),
    model: ModelEndpoint | None = model_field(),
    sandbox: SandboxName | None = sandbox_field(),
    store: S3Bucket | None = store_field(),
    limits: AgentChoices = limits_field(
        "The agent's budget (turns, tokens, cost, time) and policy; a field left empty: the worker's BUGSWEEP_* "
        "variable, else the default."
    ),
    push_branches: bool = push_branches_field(),
    branches: GitBranches | None = branches_field(),
    escalate_to: list[ModelEndpoint] = escalate_to_field(),
    task: TaskSpec | None = form_field(
        None,
        "A whole task (advanced)",
        "A task as a tasks file holds it (mined tasks: test patch, FAIL_TO_PASS, ...); when set, it is what runs, "
        "and Repository and What is wrong only name it. Sweeps send their tasks this way.",
    ),
) -> (
    Any
):  # the Grade; an outcome that is not a grade: a Failed state whose error a caller of the flow gets raised
    """Fix one bug in a sandbox and grade the fix; the run folder goes to s3://BUCKET/PREFIX/SWEEP/TASK/MODEL/CONFIG/
    (CONFIG: the digest of the run's configuration, bugsweep.runconfig).

    Give the repository, what is wrong and the test command (a one-off fix), or a whole `task` (a mined task, or
    what a sweep sends). The run ends Completed with the grade when the task could be run (resolved or not), and
    Failed when it could not (setup failed, tests already passing, an outage that outlasted the retries) or its
    artifacts could not be uploaded; grade.json says which kind of failure it was either way. With
    `push_branches`, a resolved fix is pushed as branch PREFIX/SWEEP/TASK (bugsweep.branches); a push that fails
    ends the run Failed too, with its grade stored as it was.
    """
    quiet_prefect_logs()
    use_prefect_limits()
    try:
        refuse_endless_reruns()
        task = task or one_off_task(repo, problem, test_command, setup_command, ref)
        run = load_run_config(
            model, sandbox, store, limits, flow_run_id=current_flow_run_id(), push_branches=push_branches,
            branches=branches, escalate_to=escalate_to,
        )  # fmt: skip
        if run.model.base_url and started_by_sweep():  # the sweep reached it: a refusal now is a restart
            endpoint.mark_answered(run.model)
        with model_endpoint(run) as run:
            outcome = solve_one(task, run, sweep)
    except (
        BugsweepError
    ) as exc:  # an outcome bugsweep expects: one line in the state, no traceback in the log
        return failed_state(exc)
    report(outcome)
    if outcome.grade.error:
        return failed_state(TaskNotRun(outcome.grade))
    if outcome.upload_error:
        return failed_state(StorageError(outcome.upload_error))
    if outcome.branch_error:
        return failed_state(InfraError(outcome.branch_error))
    return outcome.grade


def one_off_task(
    repo: str | None, problem: str | None, test_command: str, setup_command: str | None, ref: str | None
) -> TaskSpec:
    """The task of a one-off fix, from the form's fields."""
    if not repo or not problem or not test_command:
        raise ConfigError(
            "solve-bug needs a repository, what is wrong, and a test command (or a whole task): fill them in the "
            "run form (Custom run)"
        )
    return TaskSpec(
        repo=repo, problem_statement=problem, test_command=test_command, setup_command=setup_command or None,
        base_commit=ref or None,
    )  # fmt: skip


class TaskNotRun(BugsweepError):
    """Ends the flow Failed when the task could not be run; carries the kind of failure the grade records."""

    def __init__(self, verdict: Grade) -> None:
        # failed_state names the kind ("config failure: ..."): the message is the error alone, said once
        super().__init__(verdict.error or "the task could not be run")
        self.kind = verdict.failure_kind or "crash"


def report(outcome: TaskOutcome) -> None:
    g = outcome.grade
    status = verdict_word(g).upper() if g.resolved else verdict_word(g)
    if resolved_at(g):
        status += f" ({resolved_at(g)})"
    if outcome.reused:
        status += " (an earlier run's grade, kept after its upload failed; the agent did not run again)"
    print(
        f"{g.instance_id} with {g.model} (policy {g.policy}, configuration {g.config_digest}): {status} | turns "
        f"{g.turns} | tokens {g.prompt_tokens}+{g.completion_tokens} | ${g.cost_usd:.4f} | {g.wall_s:.1f} s | "
        f"artifacts: {outcome.artifacts}"
    )
    if outcome.branch:
        print(f"{g.instance_id}: {outcome.branch}")
    if outcome.branch_error:
        print(f"{g.instance_id}: {outcome.branch_error}")
