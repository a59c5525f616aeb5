"""A benchmark that grows every night: the fixes a team's repositories received since the last night, mined and
appended to one task file in the artifact store.

Each night, for each configured repository, the commits between the head mined last time and the branch's head now
are mined (`mine`, newest first, validated as always); new tasks are appended to the benchmark file with the time
they were added (`added_at`). What earlier nights kept is never rewritten: the file's earlier bytes stay as they
were, a fix commit already in the file is not added again, and the heads mined so far are kept beside it
(`BENCHMARK.state.json`), written after the file, so a night that dies in between only mines its range again.
A comparison or sweep can then take only the tasks added in the last N days (`TaskFile.added_within_days`), so a
model is judged on bugs it cannot have seen in training.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from bugsweep.errors import ConfigError
from bugsweep.mining.history import is_ancestor, local_clone, repo_name, resolve_commit
from bugsweep.mining.miner import mine
from bugsweep.mining.records import ProgressCallback
from bugsweep.sandbox.base import SandboxProvider
from bugsweep.spec import TaskSpec, parse_tasks
from bugsweep.storage import ArtifactStore

log = logging.getLogger(__name__)


class BenchmarkRepo(BaseModel):
    """A repository whose new fixes join the benchmark every night."""

    repo: str = Field(description="A git URL, or a path on the worker.")
    branch: str = Field(default="HEAD", description="The branch whose new commits are mined (default: HEAD).")
    setup_command: str | None = Field(
        default=None,
        description="Installs what the tests need in the task's environment (e.g. `pip install -e . pytest`); "
        "empty: detected from the repository's layout.",
    )
    test_command: str | None = Field(
        default=None,
        description="Runs the changed test files (`{test_files}` is replaced by them); empty: pytest on them.",
    )
    first_since: str = Field(
        default="3 months ago",
        description="The first night only: how far back to mine (ISO 8601 date or an age such as '6 months ago').",
    )
    max_candidates: int = Field(
        default=200, ge=1, description="At most this many commits are looked at a night."
    )
    limit: int = Field(default=20, ge=1, description="At most this many new tasks a night.")


class RepoGrowth(BaseModel):
    """What one night added for one repository."""

    repo: str
    head: str
    """The commit mined up to (the next night starts after it)."""
    since_head: str | None
    """Where this night started (the previous night's head), None on the first night."""
    candidates: int = 0
    added: list[str] = Field(default_factory=list)
    """Instance ids of the tasks appended."""
    already_there: list[str] = Field(default_factory=list)
    """Fix commits found again that the benchmark already holds (not added twice)."""
    stopped: str | None = None


def state_key(benchmark_key: str) -> str:
    return f"{benchmark_key}.state.json"


def read_benchmark(store: ArtifactStore, key: str) -> tuple[bytes, list[TaskSpec]]:
    """The benchmark file's bytes as they are (b"" when there is none yet) and its tasks."""
    try:
        data = store.get_bytes(key)
    except FileNotFoundError:
        return b"", []
    return data, parse_tasks(data.decode("utf-8"), source=store.uri(key))


def read_state(store: ArtifactStore, key: str) -> dict[str, dict[str, str]]:
    """The heads mined so far, by repository: {repo: {"head": sha, "mined_at": iso}}."""
    try:
        return dict(json.loads(store.get_bytes(state_key(key))).get("repos") or {})
    except FileNotFoundError:
        return {}


def grow_benchmark(
    store: ArtifactStore,
    key: str,
    repos: list[BenchmarkRepo],
    provider: SandboxProvider,
    *,
    runs: int = 3,
    test_timeout: float = 900.0,
    now: datetime | None = None,
    on_progress: ProgressCallback | None = None,
) -> list[RepoGrowth]:
    """Mine each repository's commits since the last night and append the new tasks to the benchmark `key`.

    The file is rewritten once, at the end, as its earlier bytes followed by the new lines; then the state. A
    repository whose mining stops (its test command not found, say) adds what it kept before the stop, and the
    error is in its RepoGrowth; the others go on.
    """
    if not repos:
        raise ConfigError("no repositories to mine: give at least one (repo, branch, commands)")
    added_at = (now or datetime.now(UTC)).isoformat(timespec="seconds")
    earlier, tasks = read_benchmark(store, key)
    state = read_state(store, key)
    known = {t.fix_commit or "" for t in tasks if t.fix_commit}
    ids = {t.instance_id for t in tasks}
    new: list[TaskSpec] = []
    grown: list[RepoGrowth] = []
    for source in repos:
        name = repo_name(source.repo)
        git_dir = local_clone(source.repo)
        head = resolve_commit(git_dir, source.branch)
        previous = (state.get(name) or {}).get("head")
        if previous and not is_ancestor(git_dir, previous, head):
            log.warning("%s: %s is no longer in %s's history (rewritten?): mining from its date", name, previous,
                        source.branch)  # fmt: skip
            previous = None
        growth = RepoGrowth(repo=name, head=head, since_head=previous)
        grown.append(growth)
        if previous == head:
            continue
        try:
            result = mine(
                source.repo,
                provider=provider,
                branch=head,
                exclude=previous,
                since=None if previous else source.first_since,
                max_candidates=source.max_candidates,
                limit=source.limit,
                setup_command=source.setup_command,
                test_command=source.test_command,
                runs=runs,
                test_timeout=test_timeout,
                on_progress=on_progress,
                mined=[t.fix_commit for t in tasks if t.fix_commit and t.repo == source.repo],
            )
        except Exception as exc:  # one repository's failure is reported, the others go on
            growth.stopped = str(exc) or type(exc).__name__
            continue
        growth.candidates = result.total
        for task in reversed(result.tasks):  # oldest first, so the file reads in the order the fixes landed
            if task.fix_commit in known or task.instance_id in ids:
                growth.already_there.append(task.fix_commit or task.instance_id)
                continue
            task.added_at = added_at
            known.add(task.fix_commit or "")
            ids.add(task.instance_id)
            new.append(task)
            growth.added.append(task.instance_id)
        if result.stopped:
            growth.stopped = result.stopped
            continue
        state[name] = {"head": head, "mined_at": added_at}
    if new:
        lines = "".join(t.model_dump_json(exclude_none=True) + "\n" for t in new).encode("utf-8")
        separator = b"" if not earlier or earlier.endswith(b"\n") else b"\n"
        store.put_bytes(key, earlier + separator + lines)
    store.put_bytes(state_key(key), json.dumps({"repos": state}, indent=2, sort_keys=True).encode("utf-8"))
    return grown


def added_within(tasks: list[TaskSpec], days: float, now: datetime | None = None) -> list[TaskSpec]:
    """The tasks added to a growing benchmark in the last `days` days (tasks without `added_at` are left out)."""
    cutoff = (now or datetime.now(UTC)).timestamp() - days * 86400
    return [t for t in tasks if t.added_at and datetime.fromisoformat(t.added_at).timestamp() >= cutoff]
