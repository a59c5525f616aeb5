"""Walking a repository's history: a local clone, the commits in a date range, each with its changed files."""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path

from bugsweep.errors import ConfigError
from bugsweep.mining.records import Commit
from bugsweep.sandbox.sources import is_git_url


def _git(repo: Path, *args: str, timeout: float = 120, input: str | None = None) -> str:
    proc = subprocess.run(
        ["git", "-c", "core.quotepath=off", "-C", str(repo), *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        errors="replace",
    )
    if proc.returncode != 0:
        raise ConfigError(f"git {' '.join(args[:3])} failed in {repo}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def repo_name(repo: str) -> str:
    """How mined tasks name `repo`: a URL as given, a folder as its absolute path."""
    return repo if is_git_url(repo) else str(Path(repo).expanduser().resolve())


def resolve_commit(git_dir: Path, ref: str) -> str:
    """The sha `ref` (a branch, tag or commit) points at."""
    return _git(git_dir, "rev-parse", "--verify", f"{ref}^{{commit}}").strip()


def is_ancestor(git_dir: Path, old: str, new: str) -> bool:
    """Whether `old` is in `new`'s history (False too when `old` is not in the repository at all)."""
    try:
        _git(git_dir, "merge-base", "--is-ancestor", old, new)
    # unknown commit, or not an ancestor: git exits non-zero either way
    except (ConfigError, subprocess.SubprocessError):
        return False
    return True


def local_clone(repo: str, cache_dir: Path | None = None) -> Path:
    """A local git directory for `repo`: the path itself, or a bare clone of a URL kept in a cache folder."""
    if not is_git_url(repo):
        path = Path(repo).expanduser().resolve()
        if not path.exists():
            raise ConfigError(f"{repo!r} is neither a folder nor a git URL")
        _git(path, "rev-parse", "--git-dir")
        return path
    cache = cache_dir or Path.home() / ".cache" / "bugsweep" / "mirrors"
    cache.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9]+", "-", repo.rstrip("/").rsplit("/", 1)[-1]).strip("-")
    target = cache / f"{stem}-{hashlib.sha256(repo.encode()).hexdigest()[:8]}.git"
    if target.exists():
        _git(target, "fetch", "-q", "--prune", "origin", "+refs/heads/*:refs/heads/*", timeout=1800)
    else:
        proc = subprocess.run(
            ["git", "clone", "-q", "--bare", repo, str(target)], capture_output=True, text=True, timeout=1800
        )
        if proc.returncode != 0:
            raise ConfigError(f"could not clone {repo}: {proc.stderr.strip()[-500:]}")
    return target


def parse_date(value: str, option: str = "--since") -> str:
    """Check a --since/--until value and return it in a form git reads the same way.

    git reads anything as a date (an unknown word means "now", so a typo silently scans nothing); here only an
    ISO 8601 date or time (`2024-01-31`, `2024-01-31T12:00:00+02:00`) or an age (`6 months ago`, `2 weeks ago`,
    `yesterday`) is taken. Anything else raises ConfigError naming the value.
    """
    text = value.strip()
    if RELATIVE_DATE.fullmatch(text):
        return text
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"{option} {value!r} is not a date: give an ISO date (2024-01-31, 2024-01-31T12:00) "
            "or an age (6 months ago, 2 weeks ago)"
        ) from None
    return when.isoformat()


#: Ages git understands and means: "3 days ago", "1 year ago", "yesterday".
RELATIVE_DATE = re.compile(
    r"(\d+\s+(second|minute|hour|day|week|month|year)s?\s+ago|yesterday|today|now)", re.IGNORECASE
)


def list_history(
    repo: Path,
    *,
    branch: str | None = None,
    since: str | None = None,
    until: str | None = None,
    max_commits: int | None = None,
    merges: bool = False,
    exclude: str | None = None,
) -> list[str]:
    """The shas `scan_history` walks, newest first (so a run knows how many candidates it has); `exclude`: not
    those reachable from this commit (a growing benchmark's last night)."""
    args = ["rev-list", "--first-parent", "--merges"] if merges else ["rev-list", "--no-merges"]
    if since:
        args.append(f"--since={parse_date(since, '--since')}")
    if until:
        args.append(f"--until={parse_date(until, '--until')}")
    if max_commits:
        args.append(f"--max-count={max_commits}")
    args.append(branch or "HEAD")
    if exclude:
        args.append(f"^{exclude}")
    return _git(repo, *args).split()


def same_changes(
    repo: Path, shas: Sequence[str], branch: str | None = None, earlier: Sequence[str] = ()
) -> dict[str, str]:
    """The listed commits whose change another commit also makes (`git patch-id --stable`: the same diff but for
    line numbers and whitespace), each -> the one that stands for them all. A fix cherry-picked or backported to a
    maintenance branch that is merged back is in the history twice; a benchmark should have it once: an `earlier`
    commit (a task of an earlier run), else the commit on the branch's own line (`--first-parent`), else the
    oldest. `shas` newest first, as `list_history` gives them."""
    if not shas:
        return {}
    listed = set(shas)
    earlier = [sha for sha in earlier if sha not in listed]
    if earlier:  # only those this clone has
        check = _git(repo, "cat-file", "--batch-check", input="\n".join(earlier) + "\n")
        earlier = [line.split()[0] for line in check.splitlines() if line.split()[1:2] == ["commit"]]
    pipeline = "set -o pipefail; git diff-tree --stdin -p --no-renames | git patch-id --stable"
    proc = subprocess.run(
        ["bash", "-c", pipeline], cwd=repo, input="\n".join([*shas, *earlier]) + "\n", capture_output=True,
        text=True, timeout=600, errors="replace",
    )  # fmt: skip
    if proc.returncode != 0:
        raise ConfigError(f"git patch-id failed in {repo}: {proc.stderr.strip()[-500:]}")
    groups: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        if len(fields := line.split()) == 2:
            groups.setdefault(fields[0], []).append(fields[1])
    groups = {change: commits for change, commits in groups.items() if len(commits) > 1}
    if not groups:
        return {}
    main_line = set(_git(repo, "rev-list", "--first-parent", branch or "HEAD").split())
    order = {sha: i for i, sha in enumerate([*shas, *earlier])}
    mined = set(earlier)
    same = {}
    for commits in groups.values():
        first = max(commits, key=lambda sha: (sha in mined, sha in main_line, order[sha]))
        same.update({sha: first for sha in commits if sha != first and sha not in mined})
    return same


def scan_history(
    repo: Path,
    *,
    branch: str | None = None,
    since: str | None = None,
    until: str | None = None,
    max_commits: int | None = None,
    merges: bool = False,
    shas: Sequence[str] | None = None,
) -> Iterator[Commit]:
    """Commits reachable from `branch` (default HEAD), newest first, with their changed files.

    By default every commit that is not a merge. With `merges=True`, the merge commits of the branch's own line
    (`--first-parent`), each with its whole change against the first parent: a merged pull request as one
    candidate, for projects whose pull requests put the fix and its test in separate commits. `shas`, when given,
    is the list `list_history` made.
    """
    if shas is None:
        shas = list_history(
            repo, branch=branch, since=since, until=until, max_commits=max_commits, merges=merges
        )
    for sha in shas:
        meta = _git(repo, "show", "-s", "--format=%P%n%cI%n%B", sha)
        parents_line, date, message = [*meta.split("\n", 2), "", ""][:3]
        parents = parents_line.split()
        if len(parents) > 1:
            status = _git(repo, "diff", "-z", "--name-status", "--no-renames", parents[0], sha)
        else:
            status = _git(
                repo, "diff-tree", "--no-commit-id", "-r", "-z", "--name-status", "--no-renames", sha
            )
        fields = status.split("\0")
        changes = [(fields[i], fields[i + 1]) for i in range(0, len(fields) - 1, 2) if fields[i]]
        yield Commit(sha=sha, parents=parents, date=date.strip(), message=message, changes=changes)
