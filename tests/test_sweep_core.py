"""What a sweep does besides calling Prefect, as plain functions (bugsweep.sweep), without a Prefect server: one
task end to end with a refused upload kept and uploaded by the next run without the agent, a kept result uploaded
as a sweep starts, what counts as graded before.

Real parts: the local sandbox running real pytest on a real git repository, a folder store. Stand-in: the scripted
model server (real HTTP, scripted replies: not a model).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bugsweep.errors import StorageError
from bugsweep.spec import TaskSpec
from bugsweep.storage import LocalStore
from bugsweep.upload import PENDING_FILE
from tests.support.repos import PYTEST_SETUP
from tests.support.scripted_model import tool_call

FIX = tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")


def calc_task(repo: Path, instance_id: str, **fields: Any) -> TaskSpec:
    return TaskSpec(
        instance_id=instance_id,
        repo=str(repo),
        problem_statement="tests/test_calc.py::test_add fails: add() returns the wrong result. Fix the code.",
        **{"test_command": "python -m pytest -q", "setup_command": PYTEST_SETUP, **fields},
    )


class RefusingStore(LocalStore):
    """A folder store that refuses every write while `down` (an S3 outage past the store's own tries)."""

    down = True

    def put_file(self, key: str, path: Path) -> str:
        if self.down:
            raise StorageError("the store refused the write (down)")
        return super().put_file(key, path)


def test_one_task_without_prefect_a_refused_upload_is_kept_and_the_next_run_uploads_it_without_the_agent(
    scripted_model, buggy_repo: Path, tmp_path: Path
) -> None:
    from bugsweep.runbuilder import build_run
    from bugsweep.settings import ModelSettings
    from bugsweep.sweep import RunSetup, TaskSteps, solve_one
    from bugsweep.sweep.graded import upload_kept

    server = scripted_model([FIX, tool_call("finish", summary="add() now adds")])
    built = build_run(
        endpoint=ModelSettings(base_url=server.base_url, model="scripted-model"), backend="local"
    )
    store = RefusingStore(tmp_path / "store")
    run = RunSetup.of(built, store, tmp_path / "local")
    spec = calc_task(buggy_repo, "calc-plain")
    completed: list[tuple[str, str, str]] = []
    steps = TaskSteps(run_id="first-run")

    refused = solve_one(spec, run, "night", steps)

    assert refused.grade.resolved and refused.upload_error and "bugsweep upload" in refused.upload_error
    assert (refused.local_dir / PENDING_FILE).is_file()
    assert json.loads((refused.local_dir / "run.json").read_text())["flow_run_id"] == "first-run"
    asked = len(server.requests)

    store.down = False
    again = solve_one(
        spec, run, "night", TaskSteps(run_id="second-run", late_upload=lambda *a: completed.append(a))
    )

    assert again.reused and again.grade.resolved and again.stored_at == f"{store.location}/{again.key}"
    assert len(server.requests) == asked, "the agent did not run again"
    assert store.exists(f"{again.key}/grade.json") and store.exists(f"{again.key}/patch.diff")
    assert completed == [("first-run", again.stored_at, "flow run second-run (a rerun of the task)")]
    assert not (again.local_dir / PENDING_FILE).exists()
    assert upload_kept(store, run.local_dir, "night") == [], "nothing is kept any more"


def test_a_sweep_uploads_what_earlier_runs_kept_as_it_starts(tmp_path: Path) -> None:
    from bugsweep.sweep.graded import upload_kept
    from bugsweep.upload import mark_pending

    store = RefusingStore(tmp_path / "store")
    kept = tmp_path / "local" / "night" / "calc-9" / "m" / "c0ffee"
    kept.mkdir(parents=True)
    (kept / "grade.json").write_text(json.dumps({"instance_id": "calc-9", "resolved": True}))
    mark_pending(kept, "night/calc-9/m/c0ffee", store, "S3 was down")
    other_sweep = tmp_path / "local" / "other" / "calc-1" / "m" / "c0ffee"
    other_sweep.mkdir(parents=True)
    mark_pending(other_sweep, "other/calc-1/m/c0ffee", store, "S3 was down")
    uploaded: list[str] = []

    assert upload_kept(store, tmp_path / "local", "night", after=lambda s, key, f: uploaded.append(key)) == []
    assert (kept / PENDING_FILE).exists(), "still down: kept for the next time"
    store.down = False
    assert upload_kept(store, tmp_path / "local", "night", after=lambda s, key, f: uploaded.append(key)) == [
        "night/calc-9/m/c0ffee"
    ]
    assert uploaded == ["night/calc-9/m/c0ffee"] and store.exists("night/calc-9/m/c0ffee/grade.json")
    assert (other_sweep / PENDING_FILE).exists(), "another sweep's results wait for that sweep"


def test_a_rerun_skips_only_real_grades_of_the_same_task(tmp_path: Path) -> None:
    """The skip rule on its own (no Prefect): a stored grade counts only if it is a grade and its task.json is the
    same task (bugsweep.spec.same_task, the rule the kept-grade check uses too): another commit, test command,
    setup, test patch or named tests is another task; its history (when it was added) is not."""
    from bugsweep.grading import Grade
    from bugsweep.sweep.graded import previous_grade
    from bugsweep.sweep.task import kept_grade

    store = LocalStore(tmp_path / "store")
    spec = calc_task(tmp_path / "repo", "calc-1", base_commit="a" * 40)

    def stored(grade: Grade, **task: Any) -> None:
        store.put_bytes("s/calc-1/m/grade.json", grade.model_dump_json().encode())
        store.put_bytes("s/calc-1/m/task.json", spec.model_copy(update=task).model_dump_json().encode())

    assert previous_grade(store, "s/calc-1/m", spec) is None, "nothing stored yet"
    stored(Grade(instance_id="calc-1", resolved=False))
    assert previous_grade(store, "s/calc-1/m", spec) is not None, "not resolved is still a grade"
    graded = Grade(instance_id="calc-1", model="m", config_digest="c0ffee", resolved=True)
    folder = tmp_path / "store" / "s/calc-1/m"
    stored(graded, added_at="2026-01-01T00:00:00Z", fix_commit="f" * 40)
    (folder / "upload-pending.json").write_text(json.dumps({"key": "s/calc-1/m"}))
    assert previous_grade(store, "s/calc-1/m", spec) is not None, "the same task, whenever it was added"
    assert kept_grade(folder, spec, "m", "c0ffee") is not None, (
        "the same task's grade, kept after its upload failed"
    )
    for edited in (
        {"base_commit": "b" * 40}, {"test_command": "python -m pytest -q -x"}, {"setup_command": "pip install -e ."},
        {"FAIL_TO_PASS": ["tests/test_calc.py::test_add"]}, {"test_patch": "diff --git a/x b/x"}, {"python": "python3.12"},
    ):  # fmt: skip
        stored(graded, **edited)
        assert previous_grade(store, "s/calc-1/m", spec) is None, f"graded as another task: {edited}"
        assert kept_grade(folder, spec, "m", "c0ffee") is None, f"a kept grade of another task: {edited}"
    stored(Grade(instance_id="calc-1", error="setup failed", failure_kind="task"))
    assert previous_grade(store, "s/calc-1/m", spec) is None, "a failure is tried again"
    store.put_bytes(
        "s/calc-1/m/grade.json", Grade(instance_id="calc-1", resolved=True).model_dump_json().encode()
    )
    (tmp_path / "store" / "s/calc-1/m/task.json").unlink()
    assert previous_grade(store, "s/calc-1/m", spec) is None, "no task.json: nothing says what was graded"
