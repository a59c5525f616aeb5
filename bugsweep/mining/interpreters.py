"""The Python of a commit's time: which Python versions a commit says it supports, and the older interpreters of
this machine to validate it on when its environment cannot be made, or its tests not imported, on the Python
bugsweep runs on (a 2017 commit whose code imports `collections.MutableMapping`, which Python 3.10 removed).

- `declared_versions(repo, commit)`: the Python 3 minor versions the commit names: its trove classifiers
  (`Programming Language :: Python :: 3.6`, in setup.py, setup.cfg or pyproject.toml) and its tox envlist (`py36`,
  `py3.6`, `py{27,35,36}`).
- `older_python(repo, commit, date)`: the interpreter to validate it on again, or None: the commit predates the
  running Python (the newest version it names is older; naming none, it was made before that Python's release),
  and this machine has an older interpreter (`python3.X` on PATH, pyenv's, uv's). The newest one not newer than
  what the commit names (or than the Python of its date) is taken, else the oldest found.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from bugsweep.mining.building import _show

#: The oldest Python a task environment is made from: bugsweep's probe runs in the test process (3.8 and newer).
OLDEST_MINOR = 8
#: When each Python 3 minor version was released (the Python of a commit's time is the newest released before it).
RELEASED = {
    8: "2019-10-14",
    9: "2020-10-05",
    10: "2021-10-04",
    11: "2022-10-24",
    12: "2023-10-02",
    13: "2024-10-07",
}

_CLASSIFIER = re.compile(r"Programming Language :: Python :: 3\.(\d+)\b")
_TOX_ENV = re.compile(r"\bpy3\.?(\d+)\b")
_TOX_BRACES = re.compile(r"\bpy\{([\d,\s]+)\}")


def declared_versions(repo: Path, commit: str) -> set[int]:
    """The Python 3 minor versions the commit's packaging and tox configuration name (empty: it names none)."""
    found: set[int] = set()
    for path in ("setup.py", "setup.cfg", "pyproject.toml"):
        text = _show(repo, commit, path) or ""
        found.update(int(m) for m in _CLASSIFIER.findall(text))
    tox = _show(repo, commit, "tox.ini") or ""
    envlist = re.search(r"^\s*envlist\s*=\s*((?:.*\n?)(?:[ \t]+.*\n?)*)", tox, re.M)
    if envlist:
        listed = envlist.group(1)
        found.update(int(m) for m in _TOX_ENV.findall(listed))
        for group in _TOX_BRACES.findall(listed):
            found.update(int(d[1:]) for d in re.split(r"[,\s]+", group) if len(d) >= 2 and d.startswith("3"))
    return found


def _minor_of(path: str) -> int | None:
    """The Python 3 minor version `path` runs as, or None where it does not run (a pyenv shim of a version that
    is not selected exits 127)."""
    try:
        done = subprocess.run(
            [path, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    parts = done.stdout.split()
    if done.returncode != 0 or len(parts) != 2 or parts[0] != "3":
        return None
    return int(parts[1])


@functools.cache
def machine_interpreters() -> dict[int, str]:
    """Python 3 minor version -> an interpreter of it on this machine, for the versions older than the running one
    (from 3.8): `python3.X` on PATH, then pyenv's (`$PYENV_ROOT` or ~/.pyenv) and uv's installed Pythons."""
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    uv = os.environ.get("UV_PYTHON_INSTALL_DIR") or os.path.expanduser("~/.local/share/uv/python")
    found: dict[int, str] = {}
    for minor in range(OLDEST_MINOR, sys.version_info[1]):
        candidates = [shutil.which(f"python3.{minor}") or ""]
        candidates += sorted(glob.glob(f"{pyenv}/versions/3.{minor}.*/bin/python3.{minor}"), reverse=True)
        candidates += sorted(glob.glob(f"{uv}/cpython-3.{minor}.*/bin/python3.{minor}"), reverse=True)
        for path in candidates:
            if path and _minor_of(path) == minor:
                found[minor] = path
                break
    return found


def _minor_at(date: str) -> int:
    """The newest Python 3 minor version released before `date` (ISO 8601)."""
    when = datetime.fromisoformat(date).astimezone(UTC).date().isoformat()
    return max((m for m, released in RELEASED.items() if released <= when), default=OLDEST_MINOR)


def older_python(repo: Path, commit: str, date: str) -> str | None:
    """The interpreter to validate `commit` on again where it failed on the running Python, or None: see the
    module's docstring."""
    running = sys.version_info[1]
    declared = declared_versions(repo, commit)
    newest = max(declared) if declared else _minor_at(date)
    if newest >= running:
        return None  # it says it runs on this Python (or came after it): its failure is not the Python's
    older = machine_interpreters()
    if not older:
        return None
    fitting = [m for m in older if m <= newest]
    return older[max(fitting)] if fitting else older[min(older)]
