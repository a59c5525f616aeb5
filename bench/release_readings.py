"""Which labelled fixes does a change to the release reading turn? (issue 37, `bugsweep/mining/releases.py`)

For every labelled candidate of the given sets (bench/screen_labels_outside.tsv) that today's screen passes with
its last gate off (`unreleased_fixes=True`: the rule `own unreleased work`), `own_work` is read twice: with
releases.py as it was at `--before` (loaded from this repository's git history) and as it is in the working tree.
Prints every commit the two readings decide differently, with its label, then the counts (old unreleased, new
unreleased, label). The rule is the screen's last gate, so these are all the decisions the change moves.

Usage: python bench/release_readings.py --before d518dc6 --sets held-out-14,held-out-15 [--mirror /work/.mirror]
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

from screen import load_sets, old_screen  # noqa: E402

from bugsweep.errors import ConfigError  # noqa: E402
from bugsweep.mining import Screened, scan_history, screen  # noqa: E402
from bugsweep.mining import releases as new  # noqa: E402
from bugsweep.mining.history import _git  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True)
    parser.add_argument("--sets", required=True)
    parser.add_argument("--mirror", type=Path, default=Path("/work/.mirror"))
    args = parser.parse_args()
    old = old_screen(args.before)  # its own_work is releases.py's of `--before`
    labels, _ = load_sets(set(args.sets.split(",")))
    counts: Counter[tuple[bool, bool, str]] = Counter()
    for repo, labelled in sorted(labels.items()):
        git_dir = args.mirror / repo.replace("/", "+") / "repo"
        if not git_dir.exists():
            print(f"no clone of {repo}: left out", flush=True)
            continue
        try:
            shas = _git(git_dir, "rev-parse", *labelled).split()
        except ConfigError:
            print(f"{repo}: a labelled commit is not in the clone: left out", flush=True)
            continue
        for commit in scan_history(git_dir, shas=shas):
            result = screen(commit, repo=git_dir, unreleased_fixes=True)
            if not isinstance(result, Screened):
                continue
            before = old.own_work(git_dir, commit, result.source_files)
            after = new.own_work(git_dir, commit, result.source_files)
            was, now = bool(before and before.unreleased), bool(after and after.unreleased)
            label = labelled[commit.sha[:10]][0]
            counts[(was, now, label)] += 1
            if was != now:
                reading = (after or before).describe() if (after or before) else ""
                print(f"  {repo} {commit.sha[:10]} [{label}] old={was} new={now}: {commit.subject[:70]} | "
                      f"{reading}", flush=True)  # fmt: skip
    print("old unreleased, new unreleased, label: commits")
    for key, count in sorted(counts.items()):
        print(*key, count, sep="\t")


if __name__ == "__main__":
    main()
