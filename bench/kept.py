"""Precision and recall of whole mining runs (the screen, then the sandbox), against the hand labels.

`bench/screen.py` measures the screen alone, on every candidate of a window. What a team gets is less: the tasks
`bugsweep mine` keeps, after the sandbox has also run each candidate's tests at the task state and the fix commit
(a refactor or a lint pass rarely has a test that fails before it). This reads the reports of such runs
(<out>.mining.json, one per repository, over a window of bench/screen_labels_outside.tsv) and scores the kept tasks
against that set's labels:

- precision: labelled fixes among the kept tasks (borderline ones counted apart, as in screen.py), and with the
  borderline ones counted as not fixes (as issue 37's outside check counted its 0.74);
- recall: labelled fixes kept, among the window's labelled fixes;
- where the labelled fixes that were not kept went (the screen, or which sandbox reason), and the same for the
  not-fixes.

Usage: python bench/kept.py SET REPORT.mining.json [REPORT.mining.json ...]
The report's repository is matched to the labels by its folder name (OWNER+NAME, as the `fetch` tool names them).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

BENCH = Path(__file__).resolve().parent
NOT_FIX = {"not-fix", "feature", "other"}


def labels_of(set_name: str) -> dict[str, dict[str, str]]:
    """Labels by repo (OWNER/NAME): sha[:10] -> fix / not-fix / borderline."""
    labels: dict[str, dict[str, str]] = {}
    for line in (BENCH / "screen_labels_outside.tsv").read_text().splitlines():
        if line and not line.startswith("#"):
            name, repo, sha, label, *_ = line.split("\t")
            if name == set_name:
                labels.setdefault(repo, {})[sha] = "not-fix" if label in NOT_FIX else label
    return labels


def repo_of(report: dict, known: dict[str, dict[str, str]]) -> str:
    """The labels' OWNER/NAME of a report's repository path (.../OWNER+NAME/repo)."""
    for part in Path(report["repo"]).parts:
        if part.replace("+", "/", 1) in known:
            return part.replace("+", "/", 1)
    raise SystemExit(f"no labels of this set for {report['repo']}")


def score(report: dict, labels: dict[str, str]) -> dict[str, object]:
    kept = Counter(labels.get(k["commit"][:10], "unlabelled") for k in report["kept"])
    lost: dict[str, Counter[str]] = {"fix": Counter(), "not-fix": Counter()}
    for r in report["rejected"]:
        label = labels.get(r["commit"][:10])
        if label in lost:
            lost[label][r["reason"]] += 1
    fixes = sum(1 for label in labels.values() if label == "fix")
    clear = kept["fix"] + kept["not-fix"]
    return {
        "kept": sum(kept.values()),
        "fixes kept": f"{kept['fix']}/{fixes}",
        "not-fixes kept": kept["not-fix"],
        "borderline kept": kept["borderline"],
        "unlabelled kept": kept["unlabelled"],
        "precision": round(kept["fix"] / clear, 3) if clear else None,
        "precision, borderline as not fixes": round(kept["fix"] / (clear + kept["borderline"]), 3)
        if clear
        else None,
        "recall": round(kept["fix"] / fixes, 3) if fixes else None,
        "fixes not kept, by reason": dict(lost["fix"].most_common()),
        "not-fixes not kept, by reason": dict(lost["not-fix"].most_common()),
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
    args = parser.parse_args()
    labels = labels_of(args.set)
    out: dict[str, object] = {}
    totals: Counter[str] = Counter()
    for path in args.reports:
        report = json.loads(path.read_text())
        repo = repo_of(report, labels)
        out[repo] = figures = score(report, labels[repo])
        fixes_kept, fixes = str(figures["fixes kept"]).split("/")
        totals.update(
            {
                "fix": int(fixes_kept),
                "fixes": int(fixes),
                "not-fix": int(str(figures["not-fixes kept"])),
                "borderline": int(str(figures["borderline kept"])),
            }
        )
        if args.show:
            for k in report["kept"]:
                label = labels[repo].get(k["commit"][:10], "unlabelled")
                if label != "fix":
                    print(
                        f"  {repo} {k['commit'][:10]} [{label}] {k['subject'][:70]}\n      screen: {k['screen_reason']}"
                    )
    clear = totals["fix"] + totals["not-fix"]
    out["all"] = {
        "fixes kept": f"{totals['fix']}/{totals['fixes']}",
        "not-fixes kept": totals["not-fix"],
        "borderline kept": totals["borderline"],
        "precision": round(totals["fix"] / clear, 3) if clear else None,
        "precision, borderline as not fixes": (
            round(totals["fix"] / (clear + totals["borderline"]), 3) if clear else None
        ),
        "recall": round(totals["fix"] / totals["fixes"], 3) if totals["fixes"] else None,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
