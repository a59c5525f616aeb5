"""Can the history tell a fix of code no release had from a fix of released code? (issue 37)

For every labelled candidate of the given sets (bench/screen_labels_outside.tsv) that today's screen passes, the lines
its commit changes in its source files are blamed at its parent (a pure insertion: the line it follows), and two
readings of them are counted against the labels:
- `after release`: more than `--share` of those lines came from commits that the last release tag before the commit
  (the newest tag reachable from its parent with a version number in its name) does not contain;
- `young`: at least `--share` of them were written less than `--days` days before the commit, by its author.
Candidates with no release tag before them are counted apart. The labels call a change to code no release had yet
"not a fix" from held-out-14 on (bench/README.md); held-out-10 to 13 were labelled before that convention was
written down.

Usage: python bench/unreleased.py --sets held-out-22,held-out-23 [--share 0.5] [--days 1] [--mirror /work/.mirror]
Needs: bare clones at MIRROR/OWNER+NAME/repo of the labelled repositories (the `fetch` tool).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from screen import NOT_FIX, load_sets, passes  # noqa: E402

from bugsweep.mining import Screened, scan_history, screen  # noqa: E402
from bugsweep.mining.history import is_ancestor  # noqa: E402

VERSION_TAG = re.compile(r"\d+\.\d+|^v?\d+$")
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+", re.M)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True).stdout


def last_release(repo: Path, rev: str) -> str | None:
    """The commit of the newest version tag reachable from `rev`, by the tag's date."""
    out = git(repo, "for-each-ref", f"--merged={rev}", "--sort=-creatordate",
              "--format=%(refname:short)%09%(objectname)%09%(*objectname)", "refs/tags")  # fmt: skip
    for line in out.splitlines():
        name, obj, peeled = [*line.split("\t"), "", ""][:3]
        if VERSION_TAG.search(name):
            return peeled or obj
    return None


def blamed_lines(repo: Path, parent: str, sha: str, files: list[str]) -> list[tuple[str, str, int]]:
    """(commit, author e-mail, commit time) of each line `sha` changes in `files`, blamed at `parent`."""
    lines: list[tuple[str, str, int]] = []
    for path in files[:20]:
        ranges: list[str] = []
        for hunk in HUNK.finditer(git(repo, "diff", "-U0", parent, sha, "--", path)):
            start, count = int(hunk.group(1)), int(hunk.group(2) if hunk.group(2) is not None else 1)
            if count or start:
                ranges += ["-L", f"{start},{start + max(count, 1) - 1}"]
        if not ranges:
            continue
        current: dict[str, str] = {}
        for line in git(repo, "blame", "--line-porcelain", *ranges, parent, "--", path).splitlines():
            if re.match(r"^[0-9a-f]{40} ", line):
                current = {"sha": line[:40]}
            elif line.startswith("author-mail "):
                current["mail"] = line.removeprefix("author-mail ")
            elif line.startswith("committer-time "):
                current["time"] = line.removeprefix("committer-time ")
            elif line.startswith("\t"):
                lines.append((current["sha"], current.get("mail", ""), int(current.get("time", "0"))))
    return lines


def readings(repo: Path, screened: Screened, share: float, days: float) -> tuple[str, bool]:
    """('no release' | 'after release' | 'released', young) for one screened commit."""
    commit = screened.commit
    parent = commit.parents[0]
    lines = blamed_lines(repo, parent, commit.sha, screened.source_files)
    if not lines:
        return "nothing blamed", False
    when_text, author = git(repo, "log", "-1", "--format=%ct%n<%ae>", commit.sha).split()
    when = int(when_text)
    young = sum(when - t < days * 86400 and mail == author for _, mail, t in lines) / len(lines) >= share
    release = last_release(repo, parent)
    if release is None:
        return "no release", young
    contained = {sha: is_ancestor(repo, sha, release) for sha in {sha for sha, _, _ in lines}}
    newer = sum(not contained[sha] for sha, _, _ in lines) / len(lines)
    return ("after release" if newer > share else "released"), young


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sets", required=True)
    parser.add_argument("--share", type=float, default=0.5)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--mirror", default="/work/.mirror")
    args = parser.parse_args()
    labels, windows = load_sets(set(args.sets.split(",")))
    counts: dict[str, Counter[str]] = {}
    for (_name, repo), (since, until) in windows.items():
        git_dir = Path(args.mirror) / repo.replace("/", "+") / "repo"
        for commit in scan_history(git_dir, since=since, until=until):
            label = labels.get(repo, {}).get(commit.sha[:10], ("unlabelled", ""))[0]
            screened = screen(commit, repo=git_dir)
            if label == "unlabelled" or not passes(screened):
                continue
            assert isinstance(screened, Screened)
            kind = "not-fix" if label in NOT_FIX else label
            release, young = readings(git_dir, screened, args.share, args.days)
            for key in ("passed by the screen", release, *(["young"] if young else [])):
                counts.setdefault(key, Counter())[kind] += 1
    for key, counter in counts.items():
        print(
            f"{key:22} fix {counter['fix']:4}  not-fix {counter['not-fix']:3}  borderline {counter['borderline']:3}"
        )


if __name__ == "__main__":
    main()
