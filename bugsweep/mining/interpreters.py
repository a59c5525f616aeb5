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
- `newer_python(repo, commit)`: for a commit whose package requires a newer Python than the running one
  (`requires-python = ">=3.12"`: pint's 2025-2026 commits, whose setup fails on 3.11), the oldest interpreter of
  this machine it allows, or None.
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

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from bugsweep.mining.building import _show, _toml

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
    14: "2025-10-07",
}
#: Releases older than the oldest Python a task environment is made from, for dating what a commit names.
EARLIER = {5: "2015-09-13", 6: "2016-12-23", 7: "2018-06-27"}
#: A Python 3 version named in words: "Python 3.13", "python3.9", "CPython 3.12", "py3.10", "py310".
_NAMED_PYTHON = re.compile(r"\b(?:c?python|py)\s*-?\s*3\.(\d{1,2})\b|\bpy3(\d{1,2})\b", re.IGNORECASE)

_CLASSIFIER = re.compile(r"Programming Language :: Python :: 3\.(\d+)\b")
_TOX_ENV = re.compile(r"\bpy3\.?(\d+)\b")
_TOX_BRACES = re.compile(r"\bpy\{([\d,\s]+)\}")
#: The Python versions a package allows, as setup.cfg's `python_requires = >=3.8` or setup.py's
#: `python_requires=">=3.8"` write it.
_PYTHON_REQUIRES = re.compile(r"""\bpython_requires\s*=\s*["']?([^"'\n]+)""")


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


def required_python(repo: Path, commit: str) -> SpecifierSet | None:
    """The Python versions the commit's package allows (pyproject.toml's `requires-python`, else setup.cfg's or
    setup.py's `python_requires`), or None where it says none (or nothing readable)."""
    project = _toml(_show(repo, commit, "pyproject.toml") or "").get("project", {})
    found = project.get("requires-python") if isinstance(project, dict) else None
    for path in ("setup.cfg", "setup.py"):
        if not isinstance(found, str) and (match := _PYTHON_REQUIRES.search(_show(repo, commit, path) or "")):
            found = match.group(1).strip()
    try:
        return SpecifierSet(found) if isinstance(found, str) else None
    except InvalidSpecifier:
        return None


@functools.cache
def machine_interpreters() -> dict[int, str]:
    """Python 3 minor version -> an interpreter of it on this machine, for the versions from 3.8 other than the
    running one: `python3.X` on PATH, then pyenv's (`$PYENV_ROOT` or ~/.pyenv) and uv's installed Pythons."""
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    uv = os.environ.get("UV_PYTHON_INSTALL_DIR") or os.path.expanduser("~/.local/share/uv/python")
    found: dict[int, str] = {}
    for minor in (m for m in range(OLDEST_MINOR, max(RELEASED) + 2) if m != sys.version_info[1]):
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


def released_on(minor: int) -> str:
    """When Python 3.`minor` was released (ISO date), or is to be: October of its year in PEP 602's annual cycle."""
    return RELEASED.get(minor) or EARLIER.get(minor) or f"{2011 + minor}-10-01"


def python_to_come(text: str, date: str) -> int | None:
    """The Python 3 minor version `text` names that had not been released by `date` (ISO 8601), or None: work
    for a Python to come ("Fix compatibility with Python 3.14 beta 1", "Fix ABI tag for CPython 3.13")."""
    when = datetime.fromisoformat(date).astimezone(UTC).date().isoformat()
    named = (int(found[0] or found[1]) for found in _NAMED_PYTHON.findall(text))
    return next((minor for minor in named if released_on(minor) > when), None)


def older_python(repo: Path, commit: str, date: str) -> str | None:
    """The interpreter to validate `commit` on again where it failed on the running Python, or None: see the
    module's docstring."""
    running = sys.version_info[1]
    declared = declared_versions(repo, commit)
    newest = max(declared) if declared else _minor_at(date)
    if newest >= running:
        return None  # it says it runs on this Python (or came after it): its failure is not the Python's
    older = {m: path for m, path in machine_interpreters().items() if m < running}
    if not older:
        return None
    fitting = [m for m in older if m <= newest]
    return older[max(fitting)] if fitting else older[min(older)]


def newer_python(repo: Path, commit: str) -> str | None:
    """The oldest interpreter of this machine newer than the running Python that the commit's package allows, where
    it does not allow the running one; None otherwise."""
    allowed = required_python(repo, commit)
    running = sys.version_info
    if allowed is None or allowed.contains(f"{running[0]}.{running[1]}.{running[2]}", prereleases=True):
        return None
    newer = sorted(m for m in machine_interpreters() if m > running[1] and allowed.contains(f"3.{m}"))
    return machine_interpreters()[newer[0]] if newer else None
