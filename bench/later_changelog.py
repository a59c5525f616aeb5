"""What does a project's changelog say, later, about the issue a commit names? (issue 37)

For every labelled candidate of the given sets (bench/screen_labels_outside.tsv), the issue and pull-request numbers
its message names (#N, gh-N) are looked up in the project's changelog files at its newest commit (CHANGES, HISTORY,
NEWS, ... as bugsweep.mining.changelog names them; fragment folders left out): every line naming such a number, read
with the same rules as a commit's own changelog lines (the heading it sits under, its first word). The candidates are
counted against their labels by what the changelog says: a feature only, a fix only, something else (no kind,
several kinds, a removal), the number not listed, no number in the message, no changelog file. The labels only: the
screen is not run.

Usage: python bench/later_changelog.py --sets held-out-10,...,held-out-24 [--mirror /work/.mirror] [--show]
Needs: bare clones at MIRROR/OWNER+NAME/repo of the labelled repositories (the `fetch` tool).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bugsweep.mining.changelog import (  # noqa: E402
    ENTRY_KIND,
    FRAGMENT_DIRS,
    _kinds,
    _section_kinds,
    is_changelog,
)

REFERENCE = re.compile(r"(?:#|gh-)(\d+)\b", re.IGNORECASE)
LISTED = re.compile(r"(?:#|gh-|issue |pull/|issues/)(\d+)\b", re.IGNORECASE)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, errors="replace"
    ).stdout


def changelog_references(repo: Path) -> tuple[bool, dict[str, set[str]]]:
    """(whether the project has a changelog file at HEAD, issue number -> the kinds its lines there say)."""
    files = [
        path
        for path in git(repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines()
        if is_changelog(path) and PurePosixPath(path).parent.name.lower() not in FRAGMENT_DIRS
    ]
    kinds: dict[str, set[str]] = defaultdict(set)
    for path in files:
        lines = git(repo, "show", f"HEAD:{path}").splitlines()
        sections = _section_kinds(lines, list(range(1, len(lines) + 1)))
        for number, line in enumerate(lines, 1):
            for issue in LISTED.findall(line):
                kinds[issue] |= (sections.get(number, set()) | _kinds(ENTRY_KIND.match(line))) or {"none"}
    return bool(files), kinds


def category(message: str, has_changelog: bool, kinds: dict[str, set[str]]) -> str:
    if not has_changelog:
        return "no changelog file"
    numbers = set(REFERENCE.findall(message))
    if not numbers:
        return "no number in the message"
    said = set().union(*(kinds.get(n, set()) for n in numbers))
    if not said:
        return "the number not listed"
    if said in ({"feature"}, {"fix"}):
        return f"a {said.pop()} only"
    return "listed, with no kind, several kinds or a removal"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sets", required=True, help="label sets, comma-separated")
    parser.add_argument("--mirror", default="/work/.mirror")
    parser.add_argument(
        "--show", action="store_true", help="print the candidates the changelog calls a feature or a fix"
    )
    args = parser.parse_args()
    wanted = set(args.sets.split(","))
    rows = []
    for line in (ROOT / "bench" / "screen_labels_outside.tsv").read_text().splitlines():
        if line and not line.startswith("#"):
            name, repo, sha, label, *_ = line.split("\t")
            if name in wanted:
                rows.append((repo, sha, label))
    counts: Counter[tuple[str, str]] = Counter()
    read: dict[str, tuple[Path, bool, dict[str, set[str]]]] = {}
    for repo, sha, label in rows:
        if repo not in read:
            git_dir = Path(args.mirror) / repo.replace("/", "+") / "repo"
            read[repo] = (git_dir, *changelog_references(git_dir))
        git_dir, has_changelog, kinds = read[repo]
        message = git(git_dir, "log", "-1", "--format=%B", sha)
        said = category(message, has_changelog, kinds)
        counts[(said, label)] += 1
        if args.show and said in ("a feature only", "a fix only"):
            subject = message.splitlines()[0] if message else ""
            print(f"  [{label}] {said}: {repo} {sha} {subject[:80]}")
    print(f"{len(rows)} labelled candidates of {', '.join(sorted(wanted))}")
    print(f"{'what the later changelog says':50} {'fix':>5} {'not-fix':>8} {'borderline':>11}")
    for said in dict.fromkeys(c for c, _ in sorted(counts)):
        print(
            f"{said:50} {counts[(said, 'fix')]:5} {counts[(said, 'not-fix')]:8} "
            f"{counts[(said, 'borderline')]:11}"
        )


if __name__ == "__main__":
    main()
