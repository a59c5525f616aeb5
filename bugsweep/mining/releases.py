"""Whether a fix mends work that no release had yet, read from the history (issue 37).

A commit that corrects lines written after the last release, by the same author, is an iteration on work in
progress: no user of a release met the behaviour it changes. The labels of issue 37's held-out sets call such
commits not fixes (bench/README.md, "Fixes of code no release had"), and they were the largest class of not-fixes
that `bugsweep mine` kept. The reading: blame the lines the commit changes in its source files, at its parent; it
is own unreleased work when more than half of them came from commits that the last release (the newest version tag
reachable from the parent) does not contain, and at least half were written by the commit's own author. When
others wrote most of them (`others_unreleased`), the history cannot tell a bug the release had, carried through
another author's rewrite, from one that author added since: such commits are a coin's toss (over held-out-14 to
42 the screen passed 31 fixes and 33 not-fixes of that kind), no fix either. A history with no version tag before
the commit says nothing, and neither does a commit whose changed lines cannot be blamed.

A release need not be an ancestor of the commit: a project may tag its releases on a branch it never merges back
(bottle's 0.12 and 0.13 lines, cut from master). So a line also counts as released when its commit is in the
newest version tag made before the commit that the parent does not reach. (A rewritten history leaves its tags on
the old line, where no line's commit is: croniter's, held-out-39. Finding such lines by their text was tried and
not kept: over held-out-14 to 39 the commits it alone turned back into fixes were 6 fixes, 6 not-fixes and 2
borderline.)
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from bugsweep.errors import ConfigError
from bugsweep.mining.history import _git
from bugsweep.mining.records import Commit

#: A tag naming a version: "v1.2.3", "1.4", "pyflakes-2.1.0", "rel_1_3_5" (mako), "7"; not "1.x", "2.3.x" (the
#: tags flask made in 2024 of its old maintenance branches' ends) or "sprint".
VERSION_TAG = re.compile(r"^(?!.*[._]x$)(.*\d+[._]\d+|v?\d+$)")
#: A hunk header of `git diff -U0`: where the lines the commit changes start in the old file, and how many.
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+", re.M)
#: More than this share of the changed lines newer than the last release, ...
NEWER_SHARE = 0.5
#: ... and at least this share written by the commit's own author.
OWN_SHARE = 0.5
#: Source files blamed per commit, at most.
MAX_FILES = 20


@dataclass(frozen=True)
class OwnWork:
    """What the blame found: the last release before the commit and the shares of the lines it changes."""

    release: str
    """The version tag of the last release before the commit."""
    release_commit: str
    lines: int
    newer: float
    """Share of the changed lines that came from commits after `release`."""
    own: float
    """Share of the changed lines written by the commit's own author."""

    @property
    def unreleased(self) -> bool:
        return self.newer > NEWER_SHARE and self.own >= OWN_SHARE

    @property
    def others_unreleased(self) -> bool:
        """Most of the lines came after the release, written by others: a fix of a bug the release had, or of a
        regression or an unreleased feature since, as often one as the other. Running its tests at the release
        does not tell them apart either (bench/README.md, "Others' unreleased work")."""
        return self.newer > NEWER_SHARE and self.own < OWN_SHARE

    def describe(self) -> str:
        whose = "its author's own work" if self.unreleased else "work of others"
        return (
            f"it mends {whose} that no release had: {self.newer:.0%} of the {self.lines} lines it "
            f"changes came after {self.release}, {self.own:.0%} written by its author"
        )


def _version_tags(repo: Path, *which: str) -> Iterator[tuple[str, str, int | None]]:
    """(name, commit, made at: seconds since the epoch) of the version tags `which` selects (`--merged=REV`,
    `--no-merged=REV`), newest first (by their date)."""
    refs = _git(repo, "for-each-ref", *which, "--sort=-creatordate",
                "--format=%(refname:short)%09%(objectname)%09%(*objectname)%09%(creatordate:unix)", "refs/tags")  # fmt: skip
    for line in refs.splitlines():
        name, obj, peeled, date = [*line.split("\t"), "", "", ""][:4]
        if VERSION_TAG.search(name):
            yield name, peeled or obj, int(date) if date.isdigit() else None


def last_release(repo: Path, rev: str) -> tuple[str, str] | None:
    """(name, commit) of the newest version tag (by its date) reachable from `rev`; None when there is none."""
    return next(((name, sha) for name, sha, _ in _version_tags(repo, f"--merged={rev}")), None)


def release_elsewhere(repo: Path, rev: str, when: int) -> tuple[str, str] | None:
    """(name, commit) of the newest version tag made at or before `when` (seconds since the epoch) that `rev` does
    not reach: a release cut on a branch never merged back."""
    tags = _version_tags(repo, f"--no-merged={rev}")
    return next(((name, sha) for name, sha, made in tags if made is not None and made <= when), None)


class Blamed(NamedTuple):
    """Where a line a commit changes came from."""

    sha: str
    mail: str
    """The author's e-mail, in angle brackets as git prints it."""
    name: str
    time: int
    """When the line's commit was made (committer time, seconds since the epoch)."""


def blame_changes(repo: Path, parent: str, sha: str, path: str) -> list[Blamed]:
    """Each line `sha` changes in `path`, blamed at `parent` (a pure insertion blames the line it follows)."""
    ranges: list[str] = []
    for hunk in HUNK.finditer(_git(repo, "diff", "-U0", parent, sha, "--", path)):
        start, count = int(hunk.group(1)), int(hunk.group(2) if hunk.group(2) is not None else 1)
        if start:
            ranges += ["-L", f"{start},{start + max(count, 1) - 1}"]
    if not ranges:
        return []
    lines: list[Blamed] = []
    current: dict[str, str] = {}
    for line in _git(repo, "blame", "--line-porcelain", *ranges, parent, "--", path).splitlines():
        if re.match(r"^[0-9a-f]{40} ", line):
            current = {"sha": line[:40]}
        elif line.startswith(("author-mail ", "author ", "committer-time ")):
            key, _, value = line.partition(" ")
            current[key] = value
        elif line.startswith("\t"):
            get = current.get
            lines.append(
                Blamed(
                    current["sha"], get("author-mail", ""), get("author", ""), int(get("committer-time", 0))
                )
            )
    return lines


def blame_commit(repo: Path, commit: Commit, source_files: Sequence[str]) -> list[Blamed]:
    """Each line `commit` changes in (the first MAX_FILES of) `source_files`, blamed at its first parent."""
    parent = commit.parents[0]
    return [
        line for path in source_files[:MAX_FILES] for line in blame_changes(repo, parent, commit.sha, path)
    ]


def newer_share(repo: Path, release: str, rev: str, lines: Sequence[Blamed], *also: str) -> float:
    """The share of `lines` that came from commits reachable from `rev` but not from the commit `release` (nor
    from the commits `also`: releases off `rev`'s line)."""
    after = set(_git(repo, "rev-list", f"{release}..{rev}", *(f"^{other}" for other in also)).split())
    return sum(line.sha in after for line in lines) / len(lines)


def own_work(repo: Path, commit: Commit, source_files: Sequence[str]) -> OwnWork | None:
    """The blame of the source lines `commit` changes, against the last release before it; None when the history
    cannot say (no version tag before the commit, nothing blamed, a git error)."""
    parent = commit.parents[0]
    try:
        release = last_release(repo, parent)
        if release is None:
            return None
        lines = blame_commit(repo, commit, source_files)
        if not lines:
            return None
        newer = newer_share(repo, release[1], parent, lines)
        mail, name, when = _git(repo, "log", "-1", "--format=<%ae>%n%an%n%ct", commit.sha).splitlines()[:3]
        if newer > NEWER_SHARE and (elsewhere := release_elsewhere(repo, parent, int(when))):
            newer = newer_share(repo, release[1], parent, lines, elsewhere[1])
    except (ConfigError, subprocess.SubprocessError, ValueError):
        return None
    return OwnWork(
        release=release[0],
        release_commit=release[1],
        lines=len(lines),
        newer=newer,
        own=sum(line.mail == mail or line.name == name for line in lines) / len(lines),
    )
