"""Precision and recall of the mining screen (`bugsweep.mining.screening.screen`), old against new, no sandbox.

The screen decides, from git alone, which commits are worth a sandbox. This runs two versions of it over the same
commit windows of public projects and compares their decisions with hand labels:
- bench/screen_labels_outside.tsv (issue 37): a TUNING set (the histories the screen may be tuned on) and a
  HELD-OUT set (never looked at while the screen changed), windows and labels written before the screen changed;
  labels fix / not-fix / borderline;
- bench/screen_labels.tsv (issue 27): the four projects the screen was first written on, set "issue-27" here
  (labels fix / feature / other / borderline; feature and other count as not-fix).
Old: the screen as it was at `--before` (screening.py and change.py of that commit, loaded from this repository's
git history); new: the screen of the working tree. Both are given the repository (so both read the change, where
the old one could). Only commits that change a runnable test and a source file are counted: the rest are rejected
the same way by both. Precision = labelled fixes among the commits passed; recall = fixes passed among all labelled
fixes. Borderline commits are left out of both (and counted apart). The 15 real bug fixes of bench/real_bugs.jsonl
are screened as well.

Usage: python bench/screen.py [--mirror /work/.mirror] [--before bfd0b0f] [--sets tuning,held-out] [--show]
    [--errors] [--by-rule]
Needs: bare clones at MIRROR/OWNER+NAME/repo of the repositories named in the labels (the `fetch` tool).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import subprocess
import sys
import types
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bugsweep.mining import Commit, Rejection, RejectReason, scan_history, screen  # noqa: E402

BENCH = ROOT / "bench"
#: The windows of bench/screen_labels.tsv (issue 27), which holds no window lines of its own.
ISSUE_27_WINDOWS = {
    "pallets/click": ("2025-11-01", "2026-09-01"),
    "tkem/cachetools": ("2019-01-01", "2026-09-01"),
    "jazzband/prettytable": ("2023-01-01", "2026-09-01"),
    "pytoolz/toolz": ("2019-01-01", "2026-09-01"),
}
FILE_CHECKS = {
    str(r) for r in (RejectReason.NO_TEST_CHANGE, RejectReason.NO_SOURCE_CHANGE, RejectReason.NO_PARENT)
}
NOT_FIX = {"not-fix", "feature", "other"}


def _source_at(rev: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True, check=True
    ).stdout


#: The screen's modules, each loaded only after those it imports (records.py too: the fields of its Screened and
#: Rejection change with the screen).
SCREEN_MODULES = ("records", "files", "cases", "change", "shapes", "releases", "screening")


def old_screen(rev: str) -> types.ModuleType:
    """bugsweep/mining/screening.py as it was at `rev`, with the modules of the screen it imports (records.py,
    change.py, cases.py, shapes.py, releases.py) as they were at `rev` too, where that commit had them: the working
    tree's may have changed since (a helper's signature, a field of Screened)."""
    # Modules that moved since `rev` are found under their old names (issue 32 moved testfiles into grading).
    sys.modules.setdefault("bugsweep.testfiles", importlib.import_module("bugsweep.grading.testfiles"))
    names = [f"bugsweep.mining.{name}" for name in SCREEN_MODULES]
    saved = {name: sys.modules.get(name) for name in names}
    module = types.ModuleType("screening_before")
    try:
        for name in SCREEN_MODULES:
            try:
                source = _source_at(rev, f"bugsweep/mining/{name}.py")
            except subprocess.CalledProcessError:
                continue  # not there yet at `rev`
            loaded = module if name == "screening" else types.ModuleType(f"{name}_before")
            sys.modules[loaded.__name__] = loaded  # dataclasses look their module up by name
            exec(compile(source, f"{name}.py@{rev}", "exec"), loaded.__dict__)
            sys.modules[f"bugsweep.mining.{name}"] = loaded
    finally:
        for name, was in saved.items():
            if was is not None:
                sys.modules[name] = was
            else:
                sys.modules.pop(name, None)
    return module


def load_sets(wanted: set[str]) -> tuple[dict[str, dict[str, tuple[str, str]]], dict[tuple[str, str], list]]:
    """(labels by repo: sha -> (label, why), windows by (set, repo): [since, until])."""
    labels: dict[str, dict[str, tuple[str, str]]] = {}
    windows: dict[tuple[str, str], list[str]] = {}
    for line in (BENCH / "screen_labels_outside.tsv").read_text().splitlines():
        if line.startswith("# window\t"):
            _, name, repo, since, until = line.split("\t")
            if name in wanted:
                windows[(name, repo)] = [since, until]
        elif line and not line.startswith("#"):
            name, repo, sha, label, why, _ = line.split("\t", 5)
            if name in wanted:
                labels.setdefault(repo, {})[sha] = (label, why)
    if "issue-27" in wanted:
        for line in (BENCH / "screen_labels.tsv").read_text().splitlines():
            if line and not line.startswith("#"):
                repo, sha, label, _subject = line.split("\t", 3)
                labels.setdefault(repo, {})[sha] = (label, "")
        for repo, window in ISSUE_27_WINDOWS.items():
            windows[("issue-27", repo)] = list(window)
    return labels, windows


def rejected(result: object) -> bool:
    """Whether `result` is a Rejection, of this screen's records.py or of the old screen's (`old_screen`)."""
    return type(result).__name__ == Rejection.__name__


def passes(result: object) -> bool:
    return not rejected(result)


def why(result: object) -> str:
    return getattr(result, "detail", "") if rejected(result) else getattr(result, "why_fix", "")


def figures(rows: list[tuple[str, bool]]) -> dict[str, object]:
    """rows: (label, passed). Precision and recall over fix / not-fix, borderline apart."""
    passed = Counter("not-fix" if label in NOT_FIX else label for label, ok in rows if ok)
    total = Counter("not-fix" if label in NOT_FIX else label for label, _ in rows)
    clear_passed = passed["fix"] + passed["not-fix"]
    return {
        "fixes passed": f"{passed['fix']}/{total['fix']}",
        "not-fixes passed": f"{passed['not-fix']}/{total['not-fix']}",
        "precision": round(passed["fix"] / clear_passed, 3) if clear_passed else None,
        "recall": round(passed["fix"] / total["fix"], 3) if total["fix"] else None,
        "borderline passed": f"{passed['borderline']}/{total['borderline']}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mirror", default="/work/.mirror")
    parser.add_argument(
        "--before", default="bfd0b0f", help="commit of this repository holding the old screen"
    )
    parser.add_argument("--sets", default="tuning,held-out,issue-27", help="label sets to measure")
    parser.add_argument("--show", action="store_true", help="print every commit whose decision changed")
    parser.add_argument("--errors", action="store_true", help="print every commit the new screen gets wrong")
    parser.add_argument(
        "--by-rule",
        action="store_true",
        help="count the new screen's passed commits by the rule that passed them",
    )
    args = parser.parse_args()
    before = old_screen(args.before)
    old_reads_change = "repo" in inspect.signature(before.screen).parameters
    labels, windows = load_sets(set(args.sets.split(",")))
    rows: dict[tuple[str, str], list[tuple[str, str, bool, bool]]] = {}
    by_rule: dict[str, Counter[str]] = {}
    for (name, repo), (since, until) in windows.items():
        git_dir = Path(args.mirror) / repo.replace("/", "+") / "repo"
        scanned = 0
        for commit in scan_history(git_dir, since=since, until=until):
            scanned += 1
            old = before.screen(commit, repo=git_dir) if old_reads_change else before.screen(commit)
            if rejected(old) and str(getattr(old, "reason", "")) in FILE_CHECKS:
                continue
            new = screen(commit, repo=git_dir)
            label, reason = labels.get(repo, {}).get(commit.sha[:10], ("unlabelled", ""))
            rows.setdefault((name, repo), []).append((commit.sha[:10], label, passes(old), passes(new)))
            if passes(new):
                by_rule.setdefault(getattr(new, "rule", ""), Counter())[
                    "not-fix" if label in NOT_FIX else label
                ] += 1
            shown = args.show and passes(old) != passes(new)
            wrong = args.errors and label != "borderline" and passes(new) != (label == "fix")
            if shown or wrong:
                print(f"  {repo} {commit.sha[:10]} [{label}] old={passes(old)} new={passes(new)}: "
                      f"{commit.subject[:70]}\n      label: {reason}\n      new:   {why(new)}"
                      + (f"\n      old:   {why(old)}" if shown else ""))  # fmt: skip
        print(
            f"{name} {repo} {since}..{until}: {scanned} commits, {len(rows.get((name, repo), []))} candidates"
        )
    if unlabelled := [
        f"{repo} {sha}" for (_, repo), rs in rows.items() for sha, lab, *_ in rs if lab == "unlabelled"
    ]:
        print("unlabelled:", ", ".join(unlabelled))
    report: dict[str, object] = {}
    for name in dict.fromkeys(n for n, _ in rows):
        set_rows = [r for (n, _), rs in rows.items() if n == name for r in rs]
        report[name] = {
            "old": figures([(lab, o) for _, lab, o, _ in set_rows]),
            "new": figures([(lab, n) for _, lab, _, n in set_rows]),
            "per repo": {
                repo: {
                    "old": figures([(lab, o) for _, lab, o, _ in rs]),
                    "new": figures([(lab, n) for _, lab, _, n in rs]),
                }
                for (n, repo), rs in rows.items()
                if n == name
            },
        }
    corpus = []
    for line in (BENCH / "real_bugs.jsonl").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            task = json.loads(line)
            name = task["repo"].removeprefix("https://github.com/")
            git_dir = Path(args.mirror) / name.replace("/", "+") / "repo"
            if not git_dir.exists():
                continue
            commit: Commit = next(scan_history(git_dir, shas=[task["fix_commit"]]))
            new = screen(commit, repo=git_dir)
            old = before.screen(commit, repo=git_dir) if old_reads_change else before.screen(commit)
            corpus.append((task["instance_id"], passes(old), passes(new), why(new)))
    report["real_bugs"] = {
        "tasks": len(corpus),
        "old_passed": sum(o for _, o, _, _ in corpus),
        "new_passed": sum(n for _, _, n, _ in corpus),
        "new_rejected": {i: r for i, _, n, r in corpus if not n},
    }
    if args.by_rule:
        report["passed by rule (new)"] = {
            rule: dict(counted)
            | {"precision": figures([(label, True) for label in counted.elements()])["precision"]}
            for rule, counted in sorted(by_rule.items(), key=lambda item: -item[1].total())
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
