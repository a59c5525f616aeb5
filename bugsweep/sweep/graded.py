"""What a sweep finds graded before it runs: this configuration's grades of the same tasks (skipped, unless the
sweep redoes them), grades by another bugsweep under an otherwise identical configuration (run again, or kept by
choice), other configurations' grades (shown beside the sweep's own), and results an earlier run kept on this
machine after its upload failed (uploaded first, so their tasks count as graded)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bugsweep.errors import StorageError
from bugsweep.grading import Grade
from bugsweep.runconfig import CODE_FIELDS
from bugsweep.spec import TaskSpec, same_task
from bugsweep.storage import GRADE_FILE, key_part, run_key
from bugsweep.upload import pending_runs, upload_pending

if TYPE_CHECKING:
    from bugsweep.storage import ArtifactStore
    from bugsweep.sweep.setup import RunSetup

    Log = logging.Logger | logging.LoggerAdapter[Any]

module_log = logging.getLogger(__name__)


def previous_grade(store: ArtifactStore, key: str, spec: TaskSpec) -> Grade | None:
    """The grade already stored under `key` for this very task (bugsweep.spec.same_task), if it was graded.

    A failed attempt (setup failed, an outage) does not count: a rerun tries it again. Neither does a grade of a
    task with the same name but another definition (another commit, test command, setup, test patch, named tests),
    nor one whose task.json cannot be read (then nothing says what was graded).
    """
    try:
        verdict = Grade.model_validate(json.loads(store.get_bytes(f"{key}/{GRADE_FILE}")))
    except FileNotFoundError:
        return None
    except ValueError:
        module_log.warning("ignoring an unreadable %s/%s", key, GRADE_FILE)
        return None
    if verdict.error:
        return None
    try:
        stored = TaskSpec.model_validate(json.loads(store.get_bytes(f"{key}/task.json")))
    except (FileNotFoundError, ValueError):
        return None
    return verdict if same_task(stored, spec) else None


def skipped_note(graded: list[Grade]) -> str:
    """What a rerun says about the tasks it did not run again."""
    return (
        f"{len(graded)} task(s) already graded under this configuration were not run again (redo_graded, "
        "`bugsweep sweep --redo-graded`, runs them again)"
    )


@dataclass
class Graded:
    """The tasks of a sweep graded before: under this configuration, and (by instance id) under this configuration
    made by another bugsweep (another code digest; a grade from before an upgrade)."""

    same: list[Grade] = field(default_factory=list)
    by_other_code: dict[str, tuple[str, Grade]] = field(default_factory=dict)
    """instance id -> (run key, grade)."""
    kept: dict[str, tuple[str, Grade]] = field(default_factory=dict)
    """Those of `by_other_code` kept by choice (keep_graded_by_other_code) instead of running again."""

    def keep_other_code(self, todo: list[TaskSpec], log: Log = module_log) -> list[TaskSpec]:
        """Keep the grades made by another bugsweep instead of running their tasks; the tasks still to run."""
        self.kept, self.by_other_code = self.by_other_code, {}
        log.warning(
            "%d graded by another bugsweep: keeping their grades (keep_graded_by_other_code)", len(self.kept)
        )
        return [spec for spec in todo if spec.instance_id not in self.kept]

    def grades(self) -> list[Grade]:
        return self.same + [grade for _, grade in self.kept.values()]

    def notes(self) -> list[str]:
        """What the sweep's summary says of them."""
        notes = [skipped_note(self.same)] if self.same else []
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


def split_graded(
    specs: list[TaskSpec], run: RunSetup, sweep_name: str, log: Log = module_log
) -> tuple[list[TaskSpec], Graded]:
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
    if graded.same:
        log.warning("%s: %s (model %s, configuration %s)", skipped_note(graded.same),
                    ", ".join(g.instance_id for g in graded.same), run.model.model, run.config.digest)  # fmt: skip
    graded.by_other_code = graded_by_other_code(run, sweep_name, todo)
    if graded.by_other_code:
        log.warning("%d graded by another bugsweep: running again", len(graded.by_other_code))
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


def other_configurations(
    run: RunSetup,
    sweep_name: str,
    specs: list[TaskSpec],
    shown: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[Grade]:
    """The grades these tasks have in the store under this model's other configurations (another policy, turn
    budget, temperature, bugsweep, ...), in task-file order, so that a sweep's summary shows them side by side with
    its own; those of the run folders in `shown` are among the sweep's own already. One listing of the sweep's
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
    return [grade for _, _, grade in sorted(found, key=lambda f: f[:2])]


def upload_kept(
    store: ArtifactStore, local_dir: Path, sweep_name: str, log: Log = module_log,
    after: Callable[[ArtifactStore, str, Path], object] | None = None,
) -> list[str]:  # fmt: skip
    """Upload what earlier runs of this sweep kept on this machine when their upload failed, so that their tasks
    count as graded and the agent does not run on them again; `after(store, key, folder)` for each uploaded (the
    flows make its artifacts and set its run Completed). What still fails stays for the next time. Returns the keys
    uploaded."""
    uploaded_keys = []
    for folder in pending_runs(local_dir / key_part(sweep_name)):
        try:
            uploaded = upload_pending(store, folder)
        except StorageError as exc:
            log.error("the result kept in %s is still not uploaded: %s", folder, exc)
            continue
        log.warning(
            "uploaded the result an earlier run kept in %s (its upload had failed) to %s/%s",
            folder, uploaded.location, uploaded.key,
        )  # fmt: skip
        uploaded_keys.append(uploaded.key)
        if after is not None:
            after(store, uploaded.key, folder)
    return uploaded_keys
