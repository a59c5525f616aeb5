"""One task as a sweep runs it: `pipeline.solve_task`, then its branch and its upload, with a graded result never
lost (a folder the store refused is kept with its grade, and the next run of the task uploads it instead of
solving again).

The steps that touch the outside (each of solve_task's steps, the upload, the push) come in through `TaskSteps`:
plain calls by default, Prefect tasks in the flows (flows/solve_bug.py), the same code either way.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bugsweep import pipeline
from bugsweep.branches import PushedBranch, push_run_folder, read_branch_record
from bugsweep.errors import StorageError, failure_kind
from bugsweep.grading import Grade
from bugsweep.pipeline import failed_grade
from bugsweep.spec import TaskSpec, same_task
from bugsweep.storage import GRADE_FILE, run_key
from bugsweep.upload import PENDING_FILE, mark_pending, pending_key, upload_run

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentEvent
    from bugsweep.sandbox.base import Sandbox
    from bugsweep.settings import BranchSettings
    from bugsweep.storage import ArtifactStore
    from bugsweep.sweep.setup import RunSetup
    from bugsweep.upload import UploadResult

    Log = logging.Logger | logging.LoggerAdapter[Any]

#: Written next to grade.json: which run (a Prefect flow run's id) made the run folder.
RUN_FILE = "run.json"

module_log = logging.getLogger(__name__)


def plain_upload(out_dir: Path, store: ArtifactStore, key: str, verdict: Grade) -> UploadResult:
    return upload_run(store, out_dir, key)


def plain_push(
    out_dir: Path, spec: TaskSpec, verdict: Grade, sweep: str, settings: BranchSettings
) -> PushedBranch:
    return push_run_folder(out_dir, spec, verdict, sweep=sweep, settings=settings, token=settings.token)


@dataclass
class TaskSteps:
    """How a task's steps run: plain calls by default; the flows hand in their Prefect tasks."""

    runner: pipeline.StepRunner = pipeline.call_step
    """Runs each step of `pipeline.solve_task` (setup, baseline, solve, regrade)."""
    upload: Callable[[Path, ArtifactStore, str, Grade], UploadResult] = plain_upload
    push: Callable[[Path, TaskSpec, Grade, str, BranchSettings], PushedBranch] = plain_push
    on_event: Callable[[AgentEvent], None] | None = None
    on_sandbox: Callable[[Sandbox], None] | None = None
    """Told of each sandbox as soon as it exists (the flows' hooks release what a dead run still holds)."""
    run_id: str | None = None
    """Who runs the task (a Prefect flow run's id), written into the run folder's run.json."""
    late_upload: Callable[[str, str, str], object] | None = None
    """(run id, where, by): an earlier run's grade kept after its failed upload reached the store now (the flows
    set that run Completed)."""
    log: Log = field(default=module_log)


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
    spec: TaskSpec, run: RunSetup, sweep: str, steps: TaskSteps | None = None, *, attempt: int | None = None,
    name: str | None = None,
) -> TaskOutcome:  # fmt: skip
    """One task end to end through `pipeline.solve_task`, then its branch and its upload.

    Never raises for a task that cannot be run: that is a failed Grade. The sandbox is released by solve_task.
    The results go to SWEEP/TASK/NAME/CONFIG (NAME: the model's, or a comparison's entry name). An earlier run's
    grade of this very task, kept here after its upload failed, is uploaded instead of running the agent again.
    """
    steps = steps or TaskSteps()
    started = time.monotonic()
    key = run_key(sweep, spec.instance_id, name or run.model.model, run.config.digest, attempt)
    out_dir = run.local_dir / key
    kept = kept_grade(out_dir, spec, run.model.model, run.config.digest)
    if kept is not None:
        steps.log.warning(
            "%s: an earlier run's grade is kept in %s (its upload failed): uploading it instead of running the "
            "agent again", spec.instance_id, out_dir,
        )  # fmt: skip
        kept_outcome = TaskOutcome(grade=kept, key=key, local_dir=out_dir, reused=True)
        return upload_outcome(push_outcome(kept_outcome, spec, run, sweep, steps), run, steps)
    try:
        fresh_folder(out_dir)
        verdict = pipeline.solve_task(
            spec, provider=run.provider, model_settings=run.model, agent_settings=run.agent, out_dir=out_dir,
            on_event=steps.on_event, on_sandbox=steps.on_sandbox, labels=sandbox_labels(run, spec),
            setup_network=run.setup_network, runner=steps.runner, raise_on_failure=False, config=run.config,
            escalate_to=run.escalate_to,
        )  # fmt: skip
    except (
        Exception
    ) as exc:  # outside solve_task's own steps (the run folder): still this task's failed grade
        return failed_outcome(spec, run, key, exc, started)
    write_run_record(out_dir, steps.run_id, key)
    outcome = push_outcome(TaskOutcome(grade=verdict, key=key, local_dir=out_dir), spec, run, sweep, steps)
    return upload_outcome(outcome, run, steps)


def failed_outcome(
    spec: TaskSpec, run: RunSetup, key: str, exc: BaseException, started: float
) -> TaskOutcome:
    """The outcome of a task that could not even start (or whose runner failed): its failed grade."""
    verdict = configured(failed_grade(spec, run.model.model, exc, started=started), run)
    return TaskOutcome(grade=verdict, key=key, local_dir=run.local_dir / key)


def push_outcome(
    outcome: TaskOutcome, spec: TaskSpec, run: RunSetup, sweep: str, steps: TaskSteps
) -> TaskOutcome:
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
        outcome.branch = steps.push(outcome.local_dir, spec, outcome.grade, sweep, run.branches).describe()
    except Exception as exc:  # a task's own outcome, like any failure of its steps: the grade stands
        outcome.branch_error = f"the fix was not pushed as a branch ({failure_kind(exc)}): {exc}"
        steps.log.error("%s: %s", spec.instance_id, outcome.branch_error)
    return outcome


def upload_outcome(outcome: TaskOutcome, run: RunSetup, steps: TaskSteps) -> TaskOutcome:
    """Upload the run folder (the store retries each call); when it still fails, keep the folder with a marker, so
    the next run of the task (or `bugsweep upload`, or a sweep as it starts) uploads it instead of solving
    again."""
    try:
        uploaded = steps.upload(outcome.local_dir, run.store, outcome.key, outcome.grade)
        outcome.stored_at = f"{uploaded.location}/{uploaded.key}"
        (outcome.local_dir / PENDING_FILE).unlink(missing_ok=True)
        earlier = made_by(outcome.local_dir)
        if (
            outcome.reused
            and earlier
            and earlier != steps.run_id
            and not outcome.grade.error
            and steps.late_upload
        ):
            steps.late_upload(earlier, outcome.stored_at, f"flow run {steps.run_id} (a rerun of the task)")
    except StorageError as exc:
        mark_pending(outcome.local_dir, outcome.key, run.store, str(exc))
        outcome.upload_error = (
            f"{exc}. The run folder is kept with its grade: the next run of this task uploads it instead of running "
            f"the agent again, or upload it now with `bugsweep upload {outcome.local_dir}`"
        )
        steps.log.error("upload failed: %s", outcome.upload_error)
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


def write_run_record(out_dir: Path, run_id: str | None, key: str) -> None:
    """run.json: which run (a Prefect flow run) produced this folder (a sweep on workers checks it is not an older
    one's)."""
    record = {
        "flow_run_id": run_id,
        "key": key,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    (out_dir / RUN_FILE).write_text(json.dumps(record, indent=2), encoding="utf-8")


def made_by(local_dir: Path) -> str | None:
    """The id of the run that wrote this run folder, if it recorded one."""
    try:
        return json.loads((local_dir / RUN_FILE).read_text(encoding="utf-8")).get("flow_run_id") or None
    except (OSError, ValueError, AttributeError):
        return None


def sandbox_labels(run: RunSetup, spec: TaskSpec) -> dict[str, str]:
    return {**run.labels, "task": spec.instance_id, "model": run.model.model}


def fresh_folder(path: Path) -> Path:
    """An empty run folder: a rerun must not leave the previous attempt's trajectory next to the new grade."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path
