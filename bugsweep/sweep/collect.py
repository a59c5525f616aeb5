"""A task's result read back from the artifact store: what a sweep whose tasks ran elsewhere (runs of the solve-bug
deployment on workers) collects as each ends, and the runs its predictions file is made from."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bugsweep.branches import BRANCH_FILE
from bugsweep.errors import BugsweepError, ConfigError, InfraError
from bugsweep.grading import Grade
from bugsweep.pipeline import failed_grade
from bugsweep.storage import GRADE_FILE, run_key
from bugsweep.sweep.task import RUN_FILE, TaskOutcome, configured

if TYPE_CHECKING:
    from bugsweep.spec import TaskSpec
    from bugsweep.sweep.graded import Graded
    from bugsweep.sweep.setup import RunSetup


def collect(
    spec: TaskSpec, run_id: str, ended: str, run: RunSetup, sweep_name: str, started: float | None = None
) -> TaskOutcome:
    """The outcome of one task run elsewhere (run `run_id`, which ended in state `ended`), from the grade it
    uploaded (only if that run wrote it, not an older one).

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
            f"solve-bug run {run_id} ended {ended} with no grade in the store ({exc})"
        )
        if elsewhere:
            why = ConfigError(
                f"solve-bug run {run_id} ran under configuration {elsewhere[0]} on its worker, not the sweep's "
                f"{run.config.digest}: the worker's settings (LLM_*, BUGSWEEP_*, its blocks) or bugsweep version "
                "differ from this machine's (compare the two grade.json `config`s)"
            )
        failed = failed_grade(
            spec, run.model.model, why, started=time.monotonic() if started is None else started
        )
        return TaskOutcome(grade=configured(failed, run), key=key, local_dir=run.local_dir / key)
    outcome = TaskOutcome(grade=verdict, key=key, local_dir=run.local_dir / key, stored_at=stored_at)
    if run.branches is not None and verdict.resolved:
        stored_branch(outcome, run, key)
    return outcome


def stored_branch(outcome: TaskOutcome, run: RunSetup, key: str) -> None:
    """The branch a run elsewhere pushed, or why it could not, from the branch.json it stored."""
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
    """The run.json files under SWEEP/TASK/MODEL that run `run_id` wrote (under any configuration)."""
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
    predictions (bugsweep.swebench.write_predictions): read from the store (a grade kept from another bugsweep:
    its own folder), or from the run folder on this machine when its upload failed."""
    local: dict[str, tuple[str, Path | None]] = {
        task: (key, None) for task, (key, _) in (graded.kept if graded else {}).items()
    }
    local.update({o.grade.instance_id: (o.key, None if o.stored_at else o.local_dir) for o in outcomes})
    found: list[tuple[str, str, Path | None]] = []
    for spec in specs:
        default = (run_key(sweep_name, spec.instance_id, run.model.model, run.config.digest), None)
        key, folder = local.get(spec.instance_id, default)
        found.append((spec.instance_id, key, folder))
    return found
