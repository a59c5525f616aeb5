"""Precision and recall of whole mining runs (the screen, then the sandbox), against the hand labels.

`bench/screen.py` measures the screen alone, on every candidate of a window. What a team gets is less: the tasks
`bugsweep mine` keeps, after the sandbox has also run each candidate's tests at the task state and the fix commit
(a refactor or a lint pass rarely has a test that fails before it). This reads the reports of such runs
(<out>.mining.json, one per repository, over a window of bench/screen_labels_outside.tsv) and scores the kept tasks
against that set's labels:

- precision: labelled fixes among the kept tasks (borderline ones counted apart, as in screen.py), and with the
  borderline ones counted as not fixes (as issue 37's outside check counted its 0.74) or as fixes;
- recall: labelled fixes kept, among the window's labelled fixes;
- where the labelled fixes that were not kept went (the screen, or which sandbox reason), and the same for the
  not-fixes.

Usage: python bench/kept.py SET REPORT.mining.json [REPORT.mining.json ...] [--show] [--without-older-python]
The report's repository is matched to the labels by its folder name (OWNER+NAME, as the `fetch` tool names them).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from screen import NOT_FIX, load_sets


def labels_of(set_name: str) -> dict[str, dict[str, str]]:
    """Labels by repo (OWNER/NAME): sha[:10] -> fix / not-fix / borderline (screen.py's reading of the file)."""
    labels, _ = load_sets({set_name})
    return {
        repo: {sha: "not-fix" if label in NOT_FIX else label for sha, (label, _why) in by_sha.items()}
        for repo, by_sha in labels.items()
    }


def repo_of(report: dict, known: dict[str, dict[str, str]]) -> str:
    """The labels' OWNER/NAME of a report's repository path (.../OWNER+NAME/repo)."""
    for part in Path(report["repo"]).parts:
        if part.replace("+", "/", 1) in known:
            return part.replace("+", "/", 1)
    raise SystemExit(f"no labels of this set for {report['repo']}")


def counts(report: dict, labels: dict[str, str], older: bool = True) -> Counter[str]:
    """The kept tasks by label, the window's labelled fixes ("fixes"), and the kept tasks on an older Python by
    label ("older fix", ...). `older` False: as the run would have been without --older-python (the tasks kept
    on an older interpreter rejected: the first validation, on the running Python, is the same)."""
    on_older = report.get("older_python", {})
    taken = [k for k in report["kept"] if older or k["commit"] not in on_older]
    kept = Counter(labels.get(k["commit"][:10], "unlabelled") for k in taken)
    kept.update(
        f"older {labels.get(k['commit'][:10], 'unlabelled')}" for k in taken if k["commit"] in on_older
    )
    kept["fixes"] = sum(1 for label in labels.values() if label == "fix")
    return kept


def figures(kept: Counter[str]) -> dict[str, object]:
    """Precision three ways (borderline apart, as not fixes, as fixes) and recall, from `counts`."""
    fix, clear, borderline = kept["fix"], kept["fix"] + kept["not-fix"], kept["borderline"]

    def ratio(part: int, whole: int) -> float | None:
        return round(part / whole, 3) if whole else None

    return {
        "kept": clear + borderline + kept["unlabelled"],
        "fixes kept": f"{fix}/{kept['fixes']}",
        "not-fixes kept": kept["not-fix"],
        "borderline kept": borderline,
        "unlabelled kept": kept["unlabelled"],
        "kept on an older Python (fix, not-fix, borderline)": (
            f"{kept['older fix']}, {kept['older not-fix']}, {kept['older borderline']}"
        ),
        "precision": ratio(fix, clear),
        "precision, borderline as not fixes": ratio(fix, clear + borderline),
        "precision, borderline as fixes": ratio(fix + borderline, clear + borderline),
        "recall": ratio(fix, kept["fixes"]),
    }


def lost(report: dict, labels: dict[str, str]) -> dict[str, dict[str, int]]:
    """The labelled fixes and not-fixes that were not kept, by reason (the screen's or the sandbox's)."""
    reasons: dict[str, Counter[str]] = {"fix": Counter(), "not-fix": Counter()}
    for r in report["rejected"]:
        label = labels.get(r["commit"][:10])
        if label in reasons:
            reasons[label][r["reason"]] += 1
    return {
        "fixes not kept, by reason": dict(reasons["fix"].most_common()),
        "not-fixes not kept, by reason": dict(reasons["not-fix"].most_common()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("set", help="the label set the runs' windows are from (held-out-10, ...)")
    parser.add_argument("reports", nargs="+", type=Path, help="<out>.mining.json of each run")
    parser.add_argument(
        "--show", action="store_true", help="print every kept task that is not a labelled fix"
    )
    parser.add_argument(
        "--without-older-python",
        action="store_true",
        help="score the runs as they would have been with --no-older-python (tasks kept on an older Python left out)",
    )
    args = parser.parse_args()
    labels = labels_of(args.set)
    out: dict[str, object] = {}
    totals: Counter[str] = Counter()
    for path in args.reports:
        report = json.loads(path.read_text())
        repo = repo_of(report, labels)
        kept = counts(report, labels[repo], older=not args.without_older_python)
        totals.update(kept)
        out[repo] = figures(kept) | lost(report, labels[repo])
        if args.show:
            for k in report["kept"]:
                label = labels[repo].get(k["commit"][:10], "unlabelled")
                if label != "fix":
                    print(
                        f"  {repo} {k['commit'][:10]} [{label}] {k['subject'][:70]}\n      screen: {k['screen_reason']}"
                    )
    out["all"] = figures(totals)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
