"""The `solve-bug` flow: one bug-fix task, end to end: setup, baseline, solve, regrade, upload.

`solve_one` is that task as the flows run it (`pipeline.solve_task` with Prefect steps, then the upload), and
`solve_many` runs many of them at once for the sweep and the model comparison.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import flow, get_run_logger
from prefect import task as prefect_task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_aws import S3Bucket

from blocks import GitBranches, ModelEndpoint
from bugsweep import pipeline
from bugsweep.attempts import resolved_at
from bugsweep.branches import ADHOC, read_branch_record
from bugsweep.errors import BugsweepError, ConfigError, InfraError, StorageError, failure_kind
from bugsweep.grading import Grade, verdict_word
from bugsweep.pipeline import failed_grade
from bugsweep.spec import DEFAULT_SETUP_COMMAND, DEFAULT_TEST_COMMAND, TaskSpec, same_task
from bugsweep.storage import GRADE_FILE, run_key
from bugsweep.upload import PENDING_FILE, mark_pending, pending_key
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
from tasks.publish import RUN_FILE, complete_late, made_by

if TYPE_CHECKING:
    from bugsweep.sandbox.base import Sandbox

#: Written next to grade.json: which flow run made the run folder.


@dataclass
class TaskOutcome:
    """What one task produced: its grade, where its artifacts are, and whether the upload failed."""

    grade: Grade
    key: str
    """SWEEP/TASK/MODEL/CONFIG in the artifact store."""
    local_dir: Path
    """The run folder on the machine that ran the task."""
    stored_at: str | None = None
    """The run folder in the artifact store (e.g. s3://bucket/prefix/SWEEP/TASK/MODEL/CONFIG), once uploaded."""
    upload_error: str | None = None
    reused: bool = False
    """The grade is an earlier run's, kept after its upload failed and uploaded now: the agent did not run again."""
    branch: str | None = None
    """The branch the resolved fix was pushed as (with push_branches), in words."""
    branch_error: str | None = None
    """Why the resolved fix could not be pushed as a branch (the grade stands)."""

    @property
    def artifacts(self) -> str:
        """Where to look for the artifacts: the store, or the local folder when the upload failed."""
        return self.stored_at or str(self.local_dir)


def solve_one(
    spec: TaskSpec, run: RunSetup, sweep: str, *, attempt: int | None = None, name: str | None = None
) -> TaskOutcome:
    """One task end to end through `pipeline.solve_task`, each step a Prefect task, then the upload.

    Never raises for a task that cannot be run: that is a failed Grade. The sandbox is released by solve_task
    (and, should this process die first, by the flow's hooks, which find it in LIVE_SANDBOXES). The results go
    to SWEEP/TASK/NAME/CONFIG (NAME: the model's, or a comparison's entry name).
    """
    started = time.monotonic()
    key = run_key(sweep, spec.instance_id, name or run.model.model, run.config.digest, attempt)
    out_dir = run.local_dir / key
    kept = kept_grade(out_dir, spec, run.model.model, run.config.digest)
    if kept is not None:
        get_run_logger().warning(
            "%s: an earlier run's grade is kept in %s (its upload failed): uploading it instead of running the "
            "agent again",
            spec.instance_id,
            out_dir,
        )
        kept_outcome = TaskOutcome(grade=kept, key=key, local_dir=out_dir, reused=True)
        return upload_outcome(push_outcome(kept_outcome, spec, run, sweep), run)
    flow_run_id = current_flow_run_id()
    held: list[Sandbox] = []

    def hold(sandbox: Sandbox) -> None:
        held.append(sandbox)
        LIVE_SANDBOXES.add(flow_run_id, sandbox)

    try:
        fresh_folder(out_dir)
        verdict = pipeline.solve_task(
            spec,
            provider=run.provider,
            model_settings=run.model,
            agent_settings=run.agent,
            out_dir=out_dir,
            on_event=steps.log_event,
            on_sandbox=hold,
            labels=sandbox_labels(run, spec),
            setup_network=run.setup_network,
            runner=steps.PrefectSteps(run.agent),
            raise_on_failure=False,
            config=run.config,
            escalate_to=run.escalate_to,
        )
    except (
        Exception
    ) as exc:  # outside solve_task's own steps (the run folder): still this task's failed grade
        verdict = configured(failed_grade(spec, run.model.model, exc, started=started), run)
        return TaskOutcome(grade=verdict, key=key, local_dir=out_dir)
    finally:
        for sandbox in held:
            LIVE_SANDBOXES.discard(flow_run_id, sandbox)
    write_run_record(out_dir, flow_run_id, key)
    outcome = push_outcome(TaskOutcome(grade=verdict, key=key, local_dir=out_dir), spec, run, sweep)
    return upload_outcome(outcome, run)


def push_outcome(outcome: TaskOutcome, spec: TaskSpec, run: RunSetup, sweep: str) -> TaskOutcome:
    """With branches asked for, push a resolved task's fix as a branch before the run folder is uploaded (so its
    branch.json goes too). A push that fails is this outcome's `branch_error`: the grade stands. A kept folder
    whose branch was pushed before is not pushed again; nothing is pushed for an unresolved task."""
    if run.branches is None or not outcome.grade.resolved or outcome.grade.error:
        return outcome
    earlier = read_branch_record(outcome.local_dir)
    if outcome.reused and earlier and earlier.get("commit"):
        outcome.branch = f"branch {earlier.get('branch')} ({str(earlier['commit'])[:12]}), pushed before"
        return outcome
    try:
        pushed = steps.push_branch.with_options(retry_delay_seconds=steps.retry_delays_s())(
            outcome.local_dir, spec, outcome.grade, sweep, run.branches
        )
        outcome.branch = pushed.describe()
    except Exception as exc:  # a task's own outcome, like any failure of its steps: the grade stands
        outcome.branch_error = f"the fix was not pushed as a branch ({failure_kind(exc)}): {exc}"
        get_run_logger().error("%s: %s", spec.instance_id, outcome.branch_error)
    return outcome


def upload_outcome(outcome: TaskOutcome, run: RunSetup) -> TaskOutcome:
    """Upload the run folder (the store retries each S3 call); when it still fails, keep the folder with a marker,
    so the next run of the task (or `bugsweep upload`, or a sweep as it starts) uploads it instead of solving
    again."""
    try:
        uploaded = steps.upload(outcome.local_dir, run.store, outcome.key, outcome.grade)
        outcome.stored_at = f"{uploaded.location}/{uploaded.key}"
        (outcome.local_dir / PENDING_FILE).unlink(missing_ok=True)
        earlier = made_by(outcome.local_dir)
        if outcome.reused and earlier and earlier != current_flow_run_id() and not outcome.grade.error:
            complete_late(
                earlier, outcome.stored_at, f"flow run {current_flow_run_id()} (a rerun of the task)"
            )
    except StorageError as exc:
        mark_pending(outcome.local_dir, outcome.key, run.store, str(exc))
        outcome.upload_error = (
            f"{exc}. The run folder is kept with its grade: the next run of this task uploads it instead of running "
            f"the agent again, or upload it now with `bugsweep upload {outcome.local_dir}`"
        )
        get_run_logger().error("upload failed: %s", outcome.upload_error)
    return outcome


def kept_grade(out_dir: Path, spec: TaskSpec, model: str, config_digest: str) -> Grade | None:
    """The grade an earlier run of this very task left in `out_dir` when its upload failed; None if there is none.

    Only a real grade (not a failed attempt) of the same task (bugsweep.spec.same_task) by the same model under the
    same configuration counts.
    """
    if pending_key(out_dir) is None:
        return None
    try:
        verdict = Grade.model_validate_json((out_dir / GRADE_FILE).read_text(encoding="utf-8"))
        stored = TaskSpec.model_validate_json((out_dir / "task.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if verdict.error or verdict.model != model or verdict.config_digest != config_digest:
        return None
    if not same_task(stored, spec):
        return None
    return verdict


def configured(verdict: Grade, run: RunSetup) -> Grade:
    """A grade made outside `pipeline.solve_task` (a task that could not even start), with what made its run."""
    verdict.config, verdict.config_digest = run.config.model_dump(mode="json"), run.config.digest
    verdict.policy = verdict.policy or run.config.policy
    return verdict


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
    fan-out). Each job's outcome is its own: `solve_one` turns whatever ends a task into that task's failed grade.
    """
    # Any: mypy picks Prefect's async overload of submit for this sync task.
    runner: Any
    with ThreadPoolTaskRunner(max_workers=concurrency) as runner:
        futures = [
            runner.submit(
                solve_one_task,
                parameters={
                    "spec": j.spec,
                    "run": j.run,
                    "sweep": j.sweep,
                    "attempt": j.attempt,
                    "name": j.name,
                },
            )
            for j in jobs
        ]
        return [_outcome(job, future) for job, future in zip(jobs, futures, strict=True)]


def _outcome(job: Job, future: Any) -> TaskOutcome:
    """The job's outcome; should Prefect itself fail to run `solve_one` (it never raises), a failed grade."""
    try:
        outcome: TaskOutcome = future.result()
        return outcome
    except Exception as exc:
        name = job.name or job.run.model.model
        key = run_key(job.sweep, job.spec.instance_id, name, job.run.config.digest, job.attempt)
        verdict = configured(
            failed_grade(job.spec, job.run.model.model, exc, started=time.monotonic()), job.run
        )
        return TaskOutcome(grade=verdict, key=key, local_dir=job.run.local_dir / key)


def write_run_record(out_dir: Path, flow_run_id: str | None, key: str) -> None:
    """run.json: which Prefect flow run produced this folder (a sweep on workers checks it is not an older one)."""
    record = {
        "flow_run_id": flow_run_id,
        "key": key,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    (out_dir / RUN_FILE).write_text(json.dumps(record, indent=2), encoding="utf-8")


def sandbox_labels(run: RunSetup, spec: TaskSpec) -> dict[str, str]:
    return {**run.labels, "task": spec.instance_id, "model": run.model.model}


def fresh_folder(path: Path) -> Path:
    """An empty run folder: a rerun must not leave the previous attempt's trajectory next to the new grade."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


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
    try:
        refuse_endless_reruns()
        task = task or one_off_task(repo, problem, test_command, setup_command, ref)
        run = load_run_config(
            model, sandbox, store, limits, flow_run_id=current_flow_run_id(), push_branches=push_branches,
            branches=branches, escalate_to=escalate_to,
        )  # fmt: skip
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
        super().__init__(f"{verdict.failure_kind} failure: {verdict.error}")
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
