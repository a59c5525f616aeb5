"""Can the history tell a fix of code no release had from a fix of released code? (issue 37)

For every labelled candidate of the given sets (bench/screen_labels_outside.tsv) that today's screen passes with its
rule `own unreleased work` off (`unreleased_fixes`, which is built on the first reading below), the lines its commit
changes in its source files are blamed at its parent (bugsweep.mining.releases.blame_commit), and two readings of
them are counted against the labels:
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
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from screen import NOT_FIX, load_sets, passes  # noqa: E402

from bugsweep.mining import Screened, scan_history, screen  # noqa: E402
from bugsweep.mining.history import _git  # noqa: E402
from bugsweep.mining.releases import blame_commit, last_release, newer_share  # noqa: E402


def readings(repo: Path, screened: Screened, share: float, days: float) -> tuple[str, bool]:
    """('no release' | 'after release' | 'released', young) for one screened commit."""
    commit = screened.commit
    parent = commit.parents[0]
    lines = blame_commit(repo, commit, screened.source_files)
    if not lines:
        return "nothing blamed", False
    when_text, author = _git(repo, "log", "-1", "--format=%ct%n<%ae>", commit.sha).split()
    when = int(when_text)
    young = (
        sum(when - line.time < days * 86400 and line.mail == author for line in lines) / len(lines) >= share
    )
    release = last_release(repo, parent)
    if release is None:
        return "no release", young
    newer = newer_share(repo, release[1], parent, lines)
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
            screened = screen(commit, repo=git_dir, unreleased_fixes=True)  # the other rules
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
