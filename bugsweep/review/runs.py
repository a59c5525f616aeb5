"""What a review page is made of: every graded run below a location, read back from its files.

A location is a run folder (`runs/<time>-<task>/`, grade.json at its top), a sweep's folder (the runs under
`TASK/MODEL/CONFIG/`, bugsweep.storage.run_key), a comparison's folder (`TASK/ENTRY/CONFIG/run-N/`, with the
comparison's report.json at its top), on this machine or in S3 (`s3://BUCKET/PREFIX`, read with the
BUGSWEEP_STORE_* / AWS_* settings). Every folder holding a grade.json is one run.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bugsweep.errors import ConfigError
from bugsweep.grading import Grade
from bugsweep.storage import (
    GRADE_FILE,
    ArtifactStore,
    LocalStore,
    S3Store,
    StoreSettings,
    settings_s3_client,
    split_s3_uri,
)

#: How much of each test log the page shows: its end, where the runner's summary is (the whole log is in the run
#: folder).
LOG_TAIL_CHARS = 8_000
#: The most of a patch the page shows (a change that writes megabytes stays readable; the whole one is patch.diff).
PATCH_SHOWN_CHARS = 200_000
#: Files of a run folder the page reads, besides grade.json.
LOG_FILES = ("tests_before.log", "tests_after.log", "tests_mirror.log")
#: Runs read from a store at once (each run is a few small GETs).
READERS = 8


@dataclass
class RunFiles:
    """One graded run as the page shows it."""

    key: str
    """Its folder relative to the location ('' for a run folder given itself)."""
    grade: Grade
    patch: str | None = None
    patch_cut: int = 0
    """Characters of patch.diff not shown."""
    trajectory: list[dict[str, Any]] | None = None
    logs: dict[str, str] = field(default_factory=dict)
    """Log name -> its last LOG_TAIL_CHARS characters."""
    task: dict[str, Any] | None = None
    """task.json: the problem statement, the test command, the repository."""

    @property
    def run(self) -> int | None:
        """The run number of a comparison's repeated runs (its `run-N` folder)."""
        found = re.search(r"(?:^|/)run-(\d+)$", self.key)
        return int(found.group(1)) if found else None


@dataclass
class Reviewed:
    """Everything below one location."""

    location: str
    runs: list[RunFiles]
    report: dict[str, Any] | None = None
    """A comparison's report.json (bugsweep.report.ComparisonReport), when the location holds one."""


def open_location(location: str) -> tuple[ArtifactStore, str]:
    """(the store that holds the location, the key prefix of the location in it, '' or ending in '/')."""
    if location.startswith("s3://"):
        bucket, prefix = split_s3_uri(location)
        settings = StoreSettings()
        store = S3Store(bucket=bucket, client=settings_s3_client(settings), attempts=settings.attempts)
        prefix = prefix.strip("/")
        return store, f"{prefix}/" if prefix else ""
    if "://" in location:
        raise ConfigError(f"cannot review {location!r}: give a folder or s3://BUCKET/PREFIX")
    path = Path(location).expanduser()
    if not path.exists():
        raise ConfigError(
            f"{location} does not exist: give a run folder, a sweep's folder or s3://BUCKET/PREFIX"
        )
    if not path.is_dir():
        raise ConfigError(
            f"{location} is a file: give the folder that holds grade.json (a run), or a sweep's folder"
        )
    return LocalStore(path), ""


def read_location(location: str) -> Reviewed:
    """Every run below `location` with its files. Raises ConfigError when there is none."""
    store, prefix = open_location(location)
    return read_runs(store, prefix, location)


def read_runs(store: ArtifactStore, prefix: str, location: str) -> Reviewed:
    """Every run below `prefix` ('' or ending in '/') in `store`; `location` names it on the page and in errors."""
    keys = [k[len(prefix) :] for k in store.list(prefix)]
    folders = sorted({k.rpartition("/")[0] for k in keys if k == GRADE_FILE or k.endswith(f"/{GRADE_FILE}")})
    if not folders:
        raise ConfigError(
            f"no graded run in {location} (no grade.json below it): give a run folder, a sweep's folder or a "
            "comparison's"
        )
    present = set(keys)
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        runs = list(pool.map(lambda folder: read_run(store, prefix, folder, present), folders))
    report = None
    if "report.json" in present:
        report = _json(store, f"{prefix}report.json")
    return Reviewed(location=location, runs=runs, report=report if isinstance(report, dict) else None)


def _json(store: ArtifactStore, key: str) -> Any:
    try:
        return json.loads(store.get_bytes(key).decode("utf-8", errors="replace"))
    except (FileNotFoundError, ValueError):
        return None


def _text(store: ArtifactStore, key: str) -> str | None:
    try:
        return store.get_bytes(key).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None


def read_run(store: ArtifactStore, prefix: str, folder: str, present: set[str]) -> RunFiles:
    """One run folder's files (those it has: a run that could not run has only some)."""
    base = f"{folder}/" if folder else ""
    raw = store.get_bytes(f"{prefix}{base}{GRADE_FILE}").decode("utf-8", errors="replace")
    try:
        grade = Grade.model_validate_json(raw)
    except ValueError as exc:
        raise ConfigError(
            f"{prefix}{base}{GRADE_FILE} is not a bugsweep grade: {str(exc).splitlines()[0]}"
        ) from exc
    run = RunFiles(key=folder, grade=grade)
    if f"{base}patch.diff" in present:
        patch = _text(store, f"{prefix}{base}patch.diff") or ""
        run.patch, run.patch_cut = patch[:PATCH_SHOWN_CHARS], max(len(patch) - PATCH_SHOWN_CHARS, 0)
    if f"{base}trajectory.json" in present:
        events = _json(store, f"{prefix}{base}trajectory.json")
        run.trajectory = events if isinstance(events, list) else None
    for name in LOG_FILES:
        if f"{base}{name}" in present:
            run.logs[name] = (_text(store, f"{prefix}{base}{name}") or "")[-LOG_TAIL_CHARS:]
    if f"{base}task.json" in present:
        task = _json(store, f"{prefix}{base}task.json")
        run.task = task if isinstance(task, dict) else None
    return run
