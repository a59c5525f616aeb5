"""`bugsweep review`: one self-contained HTML page to review a run, a sweep or a comparison.

`runs.py` finds and reads the graded runs below a folder or an S3 prefix, `timeline.py` turns a trajectory into
turns, `page.py` renders the page from `templates/` (package data: the Jinja2 template, its CSS and script).
"""

from __future__ import annotations

from pathlib import Path

from bugsweep.review.page import render_page
from bugsweep.review.runs import Reviewed, read_location, read_runs
from bugsweep.storage import ArtifactStore

#: The page's file name, beside what it reviews.
PAGE_FILE = "review.html"

__all__ = [
    "PAGE_FILE",
    "Reviewed",
    "default_output",
    "read_location",
    "render_page",
    "store_review",
    "write_review",
]


def default_output(location: str) -> Path:
    """Where the page goes unless told: into the folder it reviews; for s3://, into the current folder."""
    if location.startswith("s3://"):
        return Path(PAGE_FILE)
    return Path(location).expanduser() / PAGE_FILE


def write_review(location: str, out: Path | None = None) -> tuple[Path, Reviewed]:
    """Read every run below `location` (a folder or s3://BUCKET/PREFIX) and write the page; returns its path."""
    reviewed = read_location(location)
    path = out or default_output(location)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render_page(reviewed), encoding="utf-8")
    tmp.replace(path)
    return path, reviewed


def store_review(store: ArtifactStore, folder: str) -> str:
    """The page of every run under `folder` in `store` (a sweep's), stored beside them as FOLDER/review.html;
    returns its key."""
    prefix = folder.strip("/") + "/"
    reviewed = read_runs(store, prefix, store.uri(folder.strip("/")))
    key = f"{prefix}{PAGE_FILE}"
    store.put_bytes(key, render_page(reviewed).encode("utf-8"))
    return key
