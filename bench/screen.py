"""Precision and recall of the mining screen (`bugsweep.mining.screening.screen`), old against new, no sandbox.

The screen decides, from git alone, which commits are worth a sandbox. This runs two versions of it over the same
commit windows of four public projects and compares their decisions with hand labels (bench/screen_labels.tsv):
- old: the screen as it was at `--before` (words only), loaded from this repository's git history;
- new: the screen of the working tree, given the repository, so it also reads the change (bugsweep/mining/change.py).
Only commits that change a runnable test and a source file are counted: both screens reject the rest the same way.
Precision = labelled fixes among the commits passed; recall = fixes passed among all labelled fixes. Borderline
commits are left out of both (and shown). The 15 real bug fixes of bench/real_bugs.jsonl are screened as well.

Usage: python bench/screen.py [--mirror /work/.mirror] [--before 0a464eb] [--show]
Needs: bare clones at MIRROR/OWNER+NAME/repo (see bench/README.md) of the repositories named in the labels.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bugsweep.mining import Commit, Rejection, RejectReason, scan_history, screen  # noqa: E402

#: The windows measured: repository -> (since, until), commit dates, no merges.
WINDOWS = {
    "pallets/click": ("2025-11-01", "2026-09-01"),
    "tkem/cachetools": ("2019-01-01", "2026-09-01"),
    "jazzband/prettytable": ("2023-01-01", "2026-09-01"),
    "pytoolz/toolz": ("2019-01-01", "2026-09-01"),
}
FILE_CHECKS = {RejectReason.NO_TEST_CHANGE, RejectReason.NO_SOURCE_CHANGE, RejectReason.NO_PARENT}


def old_screen(rev: str) -> types.ModuleType:
    """bugsweep/mining/screening.py as it was at `rev`, as a module."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:bugsweep/mining/screening.py"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    module = types.ModuleType("screening_before")
    exec(compile(source, f"screening.py@{rev}", "exec"), module.__dict__)
    return module


def load_labels() -> dict[str, dict[str, tuple[str, str]]]:
    labels: dict[str, dict[str, tuple[str, str]]] = {}
    for line in (ROOT / "bench" / "screen_labels.tsv").read_text().splitlines():
        if line and not line.startswith("#"):
            repo, sha, label, subject = line.split("\t", 3)
            labels.setdefault(repo, {})[sha] = (label, subject)
    return labels


def passes(result: object) -> bool:
    return not isinstance(result, Rejection)


def commit_of(git_dir: Path, sha: str) -> Commit:
    return next(scan_history(git_dir, shas=[sha]))


def figures(rows: list[tuple[str, bool]]) -> dict[str, object]:
    """rows: (label, passed). Precision and recall over fix / feature / other, borderline apart."""
    passed = Counter(label for label, ok in rows if ok)
    total = Counter(label for label, _ in rows)
    clear_passed = passed["fix"] + passed["feature"] + passed["other"]
    return {
        "passed": dict(passed),
        "precision": round(passed["fix"] / clear_passed, 3) if clear_passed else None,
        "recall": round(passed["fix"] / total["fix"], 3) if total["fix"] else None,
        "fixes": total["fix"],
        "not_fixes": total["feature"] + total["other"],
        "borderline_passed": f"{passed['borderline']}/{total['borderline']}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mirror", default="/work/.mirror")
    parser.add_argument(
        "--before", default="0a464eb", help="commit of this repository holding the old screen"
    )
    parser.add_argument("--show", action="store_true", help="print every commit whose decision changed")
    args = parser.parse_args()
    before = old_screen(args.before)
    labels = load_labels()
    rows: dict[str, list[tuple[str, str, bool, bool]]] = {}
    for repo, (since, until) in WINDOWS.items():
        git_dir = Path(args.mirror) / repo.replace("/", "+") / "repo"
        scanned = 0
        for commit in scan_history(git_dir, since=since, until=until):
            scanned += 1
            old = before.screen(commit)
            if isinstance(old, Rejection) and old.reason in FILE_CHECKS:
                continue
            new = screen(commit, repo=git_dir)
            label, _ = labels[repo].get(commit.sha[:10], ("unlabelled", ""))
            rows.setdefault(repo, []).append((commit.sha[:10], label, passes(old), passes(new)))
            if args.show and passes(old) != passes(new):
                why = new.detail if isinstance(new, Rejection) else new.why_fix
                print(f"  {repo} {commit.sha[:10]} [{label}] old={passes(old)} new={passes(new)}: "
                      f"{commit.subject[:60]} -- {why}")  # fmt: skip
        print(
            f"{repo} {since}..{until}: {scanned} commits, {len(rows.get(repo, []))} change a test and a source"
        )
    all_rows = [r for repo_rows in rows.values() for r in repo_rows]
    if unlabelled := [
        f"{repo} {sha}" for repo, rs in rows.items() for sha, label, *_ in rs if label == "unlabelled"
    ]:
        print("unlabelled:", ", ".join(unlabelled))
    report = {
        "per_repo": {
            repo: {
                "old": figures([(lab, o) for _, lab, o, _ in rs]),
                "new": figures([(lab, n) for _, lab, _, n in rs]),
            }
            for repo, rs in rows.items()
        },
        "all": {
            "old": figures([(lab, o) for _, lab, o, _ in all_rows]),
            "new": figures([(lab, n) for _, lab, _, n in all_rows]),
        },
    }
    corpus = []
    for line in (ROOT / "bench" / "real_bugs.jsonl").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            task = json.loads(line)
            name = task["repo"].removeprefix("https://github.com/")
            git_dir = Path(args.mirror) / name.replace("/", "+") / "repo"
            commit = commit_of(git_dir, task["fix_commit"])
            new = screen(commit, repo=git_dir)
            why = new.detail if isinstance(new, Rejection) else new.why_fix
            corpus.append((task["instance_id"], passes(before.screen(commit)), passes(new), why))
    report["real_bugs"] = {
        "tasks": len(corpus),
        "old_passed": sum(o for _, o, _, _ in corpus),
        "new_passed": sum(n for _, _, n, _ in corpus),
        "new_rejected": {i: r for i, _, n, r in corpus if not n},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
