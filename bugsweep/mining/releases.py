"""Fixes of code no release had yet: the last release before a commit, and how much of what the commit changes came
after it (blamed at its parent). A commit that changes mostly such code is kept only when its failing tests pass on
that release's code (the behaviour worked there: a regression), which bugsweep.mining.validation checks in a
sandbox."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bugsweep.grading.testfiles import is_test_file
from bugsweep.mining.history import _git

#: A tag that names a release: a version number in it (`v1.2`, `1.2.0rc1`, `release-2.0`, `mylib-0.3`), or a bare
#: `v3` / `12`. Other tags (`stable`, `before-refactor`) are not releases.
VERSION_TAG = re.compile(r"\d+\.\d+|^v?\d+$")
#: More than this share of the changed lines newer than the last release: the commit changes unreleased code.
UNRELEASED_SHARE = 0.5
#: Blame reads no more files than this (a commit changing more is not a small fix of new code).
MAX_BLAMED_FILES = 20

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+", re.M)
_BLAMED_LINE = re.compile(r"^([0-9a-f]{40}) \d+ \d+", re.M)


@dataclass(frozen=True)
class Release:
    tag: str
    sha: str


@dataclass(frozen=True)
class Unreleased:
    """What blame says of the lines a commit changes, against the last release before it."""

    release: Release
    newer: int
    blamed: int

    @property
    def mostly(self) -> bool:
        return self.blamed > 0 and self.newer / self.blamed > UNRELEASED_SHARE

    def describe(self) -> str:
        return (
            f"{self.newer} of the {self.blamed} source lines it changes came after {self.release.tag}, the last "
            "release before it"
        )


def last_release(git_dir: Path, rev: str) -> Release | None:
    """The newest tag reachable from `rev` that names a release (VERSION_TAG), by its date; None when there is none
    (a project before its first release, or one that tags nothing)."""
    out = _git(
        git_dir,
        "for-each-ref",
        f"--merged={rev}",
        "--sort=-creatordate",
        "--format=%(refname:short)%09%(objectname)%09%(*objectname)",
        "refs/tags",
    )
    for line in out.splitlines():
        name, obj, peeled = [*line.split("\t"), "", ""][:3]
        if VERSION_TAG.search(name):
            return Release(name, peeled or obj)
    return None


def changed_lines_blamed(git_dir: Path, parent: str, sha: str, files: Sequence[str]) -> list[str]:
    """The commit that last changed each line `sha` changes in `files`, blamed at `parent` (a pure insertion: the
    line it follows). Files new in `sha` have no such lines."""
    commits: list[str] = []
    for path in files[:MAX_BLAMED_FILES]:
        diff = _git(git_dir, "diff", "-U0", "--no-renames", parent, sha, "--", path)
        ranges: list[str] = []
        for hunk in _HUNK.finditer(diff):
            start, count = int(hunk.group(1)), int(hunk.group(2) if hunk.group(2) is not None else 1)
            if count > 0:
                ranges += ["-L", f"{start},{start + count - 1}"]
            elif start > 0:
                ranges += ["-L", f"{start},{start}"]
        if ranges:
            commits += _BLAMED_LINE.findall(
                _git(git_dir, "blame", "--porcelain", *ranges, parent, "--", path)
            )
    return commits


def unreleased(git_dir: Path, parent: str, sha: str, source_files: Sequence[str]) -> Unreleased | None:
    """How many of the lines `sha` changes in its source files are newer than the last release before it; None when
    no release precedes it or nothing could be blamed."""
    release = last_release(git_dir, parent)
    if release is None:
        return None
    blamed = changed_lines_blamed(git_dir, parent, sha, source_files)
    released: dict[str, bool] = {}
    for commit in set(blamed):
        check = ["git", "-C", str(git_dir), "merge-base", "--is-ancestor", commit, release.sha]
        released[commit] = subprocess.run(check, capture_output=True, timeout=60).returncode == 0
    newer = sum(not released[c] for c in blamed)
    return Unreleased(release, newer, len(blamed)) if blamed else None


def tests_at_release(git_dir: Path, release: Release, fix: str, test_globs: Sequence[str]) -> str:
    """The fix's tests on the release's code: every test file (by `test_globs`) that differs between the release
    and `fix`, as a patch on the release's tree that makes it as at `fix` (the helpers and conftest.py the fix's
    tests import with them)."""
    changed = _git(git_dir, "diff", "--name-only", "--no-renames", release.sha, fix).splitlines()
    tests = [path for path in changed if is_test_file(path, test_globs)]
    return _git(git_dir, "diff", "--binary", "--no-renames", release.sha, fix, "--", *tests) if tests else ""
