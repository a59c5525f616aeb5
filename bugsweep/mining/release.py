"""Whether the code a change touches had shipped: each touched line of the parent blamed to the commit that wrote
it, and that commit compared with the last release tag before the change (the screen's Rule.UNRELEASED)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bugsweep.mining.records import Commit


@dataclass(frozen=True)
class Release:
    """The code a change touches, by whether it had shipped: the lines of its source files (any language) that it
    removes or rewrites, and for each place where it only adds, the line it adds after, at the parent, each blamed
    to the commit that wrote it and compared with the last release tag before the change. A fix corrects code
    that shipped; work on code written since the last release (a feature being built in small commits, a change
    of mind) is not a fix of a released bug. `tag` is None when no tag precedes the change: nothing is known."""

    tag: str | None
    touched: int = 0
    """Lines of the parent the change touches in its source files (new files touch none)."""
    unreleased: int = 0
    """Of those, the lines written after `tag` (in no release yet)."""

    @property
    def only_unreleased(self) -> bool:
        """Every line the change touches was written since the last release (and it touches some)."""
        return self.tag is not None and self.touched > 0 and self.unreleased == self.touched


#: A hunk header of `git diff -U0`: where its old lines start and how many there are.
HUNK = re.compile(r"^@@ -(?P<start>\d+)(?:,(?P<count>\d+))? \+")


def _git_out(repo: Path, *args: str) -> str | None:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, errors="replace")
    return proc.stdout if proc.returncode == 0 else None


def _touched_ranges(diff: str) -> list[tuple[int, int]]:
    """The parent's line ranges a `-U0` diff of one file touches: removed lines, or the line an addition follows
    (the first line for an addition at the top)."""
    ranges: list[tuple[int, int]] = []
    for line in diff.splitlines():
        if found := HUNK.match(line):
            start, count = int(found["start"]), int(found["count"] or "1")
            ranges.append((start, start + count - 1) if count else (max(start, 1), max(start, 1)))
    return ranges


def read_release(repo: Path, commit: Commit, source_files: Sequence[str]) -> Release | None:
    """Whether the code `commit` touches in `source_files` had shipped in the last release tagged before it
    (Release); None for a root commit."""
    if not commit.parents:
        return None
    base = commit.parents[0]
    tag = (_git_out(repo, "describe", "--tags", "--abbrev=0", base) or "").strip() or None
    if tag is None:
        return Release(tag=None)
    since = set((_git_out(repo, "rev-list", base, f"^{tag}") or "").split())
    touched = unreleased = 0
    for path in source_files:
        ranges = _touched_ranges(
            _git_out(repo, "diff", "--no-renames", "-U0", base, commit.sha, "--", path) or ""
        )
        old = _git_out(repo, "show", f"{base}:{path}")
        if old is None or not ranges:
            continue  # a new file touches nothing that shipped
        last = max(1, len(old.splitlines()))
        spans = [arg for a, b in ranges for arg in ("-L", f"{min(a, last)},{min(b, last)}")]
        blame = _git_out(repo, "blame", "--porcelain", *spans, base, "--", path) or ""
        for line in blame.splitlines():
            head = line.split(" ")
            if len(head) >= 3 and len(head[0]) == 40 and head[1].isdigit() and head[2].isdigit():
                touched += 1
                unreleased += head[0] in since
    return Release(tag=tag, touched=touched, unreleased=unreleased)
