"""The run folder: what one task's run leaves on disk (grade.json last, so that a folder with a grade is complete),
patch.diff, the test logs (before, after, and the regrade's mirror run: grade.json `mirror`), setup.log, environment.txt
and task.json. trajectory.json is the loop's (saved after every step); bugsweep.upload uploads the folder. A run of
more than one attempt keeps each attempt's trajectory, patch and after-run and mirror logs in attempts/N/
(bugsweep.attempts), and the kept (else the last) attempt's at the top.
"""

from __future__ import annotations

from pathlib import Path

from bugsweep.grading import Grade, TestRun
from bugsweep.runconfig import RunConfig
from bugsweep.sandbox.base import PACKAGES_FILE, Environment
from bugsweep.spec import TaskSpec


def write_run_dir(
    out_dir: Path,
    verdict: Grade,
    *,
    patch: str | None = None,
    before: TestRun | None = None,
    after: TestRun | None = None,
    mirror: TestRun | None = None,
    setup_log: str | None = None,
    spec: TaskSpec | None = None,
    environment: Environment | None = None,
    config: RunConfig | None = None,
) -> Path:
    """Write what a run produced: grade.json (with the run's configuration), patch.diff, test logs, the task
    environment's package list (trajectory.json is written by the loop)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if config is not None:
        verdict.config, verdict.config_digest = config.model_dump(mode="json"), config.digest
    if environment is not None:
        (out_dir / PACKAGES_FILE).write_text(environment.packages_text(), encoding="utf-8")
        verdict.environment = environment.record()
    if patch is not None:
        (out_dir / "patch.diff").write_text(patch, encoding="utf-8")
    for name, run in (("tests_before.log", before), ("tests_after.log", after), ("tests_mirror.log", mirror)):
        if run is not None:
            (out_dir / name).write_text(_test_log(run), encoding="utf-8")
    if setup_log:
        (out_dir / "setup.log").write_text(setup_log, encoding="utf-8")
    if spec is not None:
        (out_dir / "task.json").write_text(
            spec.model_dump_json(indent=2, exclude_none=True), encoding="utf-8"
        )
    tmp = out_dir / "grade.json.tmp"
    tmp.write_text(verdict.model_dump_json(indent=2), encoding="utf-8")
    tmp.replace(out_dir / "grade.json")
    return out_dir


def write_attempt_dir(
    folder: Path, *, patch: str | None, after: TestRun | None, mirror: TestRun | None = None
) -> Path:
    """Write one attempt's files into its folder of the run folder (attempts/N, bugsweep.attempts): its patch.diff
    and its after-run's and mirror run's logs, beside the trajectory.json the loop wrote there. No grade.json: the
    run's one grade records every attempt."""
    folder.mkdir(parents=True, exist_ok=True)
    if patch is not None:
        (folder / "patch.diff").write_text(patch, encoding="utf-8")
    for name, run in (("tests_after.log", after), ("tests_mirror.log", mirror)):
        if run is not None:
            (folder / name).write_text(_test_log(run), encoding="utf-8")
    return folder


def _test_log(run: TestRun) -> str:
    status = "timed out" if run.timed_out else f"exit code {run.exit_code}"
    header = f"$ {run.command}\n# {status}, {run.duration_s:.1f} s\n"
    return header + run.log
