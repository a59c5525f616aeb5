"""This repository's code at an earlier commit, for the benchmarks that run it beside the working tree."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def export(commit: str, folder: Path) -> Path:
    """This repository's tree at `commit` (`git archive`), as files in `folder` (made here)."""
    folder.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder
