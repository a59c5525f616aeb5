"""Run folders into the artifact store: one uploaded whole (grade.json last), one whose upload failed kept pending."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bugsweep.errors import StorageError
from bugsweep.storage import GRADE_FILE, ArtifactStore

#: Left in a run folder whose upload failed: where it belongs in the store and why it is not there yet. Never
#: uploaded; removed once the folder is (see `mark_pending`, `upload_pending`).
PENDING_FILE = "upload-pending.json"


@dataclass
class UploadResult:
    """Where one run folder went."""

    key: str
    """The run's key prefix in the store (SWEEP/TASK/MODEL/CONFIG)."""
    uris: dict[str, str]
    """File name (relative to the run folder) -> object URI."""
    location: str
    """The store's root, e.g. s3://bucket/prefix."""


def _files(local_dir: Path) -> Iterator[Path]:
    for path in sorted(local_dir.rglob("*")):
        if path.is_file() and not path.name.endswith(".tmp") and path.name != PENDING_FILE:
            yield path


def upload_run(store: ArtifactStore, local_dir: str | Path, key: str) -> UploadResult:
    """Copy every file of a run folder to `key/` in the store; grade.json goes last.

    grade.json is the "this task is done" marker (a sweep skips tasks that have one), so it is written only once
    every other file is in place: a sweep interrupted mid-upload redoes the task instead of skipping it with half
    its artifacts missing. Uploading a folder again writes the same keys again: an upload is idempotent.
    On failure the StorageError says where the local copy is; the local folder is left as it was.
    """
    local_dir = Path(local_dir)
    if not local_dir.is_dir():
        raise StorageError(f"run folder {local_dir} does not exist: nothing to upload")
    files = sorted(_files(local_dir), key=lambda p: (p.name == GRADE_FILE, p.as_posix()))
    uris: dict[str, str] = {}
    try:
        for path in files:
            rel = path.relative_to(local_dir).as_posix()
            uris[rel] = store.put_file(f"{key}/{rel}", path)
    except StorageError as exc:
        raise StorageError(
            f"{exc} (uploading to {store.location}/{key}; the artifacts are kept in {local_dir})",
            retried=exc.retried,
        ) from exc
    return UploadResult(key=key, uris=uris, location=store.location)


def mark_pending(local_dir: Path, key: str, store: ArtifactStore, error: str) -> Path:
    """Record in a run folder that its upload failed, so a later run uploads it instead of solving the task again."""
    marker = local_dir / PENDING_FILE
    record = {"key": key, "store": store.location, "error": error,
              "failed_at": datetime.now(UTC).isoformat(timespec="seconds")}  # fmt: skip
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2), encoding="utf-8")
    tmp.replace(marker)
    return marker


def pending_key(local_dir: Path) -> str | None:
    """The store key a run folder waits to be uploaded under; None when nothing is pending there."""
    try:
        return str(json.loads((local_dir / PENDING_FILE).read_text(encoding="utf-8"))["key"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def pending_runs(root: Path) -> list[Path]:
    """Every run folder below `root` (or `root` itself) whose upload failed and is still pending."""
    if (root / PENDING_FILE).is_file():
        return [root]
    return sorted(marker.parent for marker in root.rglob(PENDING_FILE)) if root.is_dir() else []


def upload_pending(store: ArtifactStore, local_dir: Path) -> UploadResult:
    """Upload a run folder kept after a failed upload, under the key it was meant for, and clear its marker.

    Uploading is idempotent (each file is written whole, under the same key, grade.json last), so a folder half
    uploaded before is simply uploaded again.
    """
    key = pending_key(local_dir)
    if key is None:
        raise StorageError(f"{local_dir} has no readable {PENDING_FILE}: nothing is pending there")
    result = upload_run(store, local_dir, key)
    (local_dir / PENDING_FILE).unlink(missing_ok=True)
    return result
