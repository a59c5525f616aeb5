"""Where a sweep's tasks come from: a task file (`TaskFile`), or a branch's failing tests (`RepoBranch`).

A branch's failing tests: run the tests at the head of a branch, and each failing test file is a task. This is how a nightly sweep works on a repository without a prepared task file: whatever is red on `main`
tonight is tomorrow morning's patches. Per-test results come from the probe in pytest (bugsweep.grading.runs), so the
test command must be pytest; each task's test command is the given one with the failing file appended.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from bugsweep.errors import SandboxError, TaskError, setup_failed
from bugsweep.grading import run_tests
from bugsweep.sandbox.base import RepoSource, SandboxProvider
from bugsweep.sandbox.sources import SourceCache
from bugsweep.spec import DEFAULT_SETUP_COMMAND, DEFAULT_TEST_COMMAND, TaskSpec, parse_tasks
from bugsweep.storage import ArtifactStore, read_text
from bugsweep.swebench import DEFAULT_REPOS_FROM, SweBenchRecords, specs_beside

PROBLEM_TEMPLATE = (
    "The tests in {file} fail at the head of {branch}:\n{tests}\n\n"
    "Find the bug in the code and fix it so that these tests pass, without breaking other tests. "
    "Do not change the tests."
)


class TaskFile(BaseModel):
    """Tasks from a tasks.jsonl file (as `bugsweep mine` writes it, or SWE-bench records), on this machine or in S3."""

    kind: Literal["file"] = "file"
    path: str = Field(
        description="A path on the worker, or s3://BUCKET/KEY (read with the artifact store's keys)."
    )
    specs: str | None = Field(
        default=None,
        description="For SWE-bench records (lines without test_command): the specs file of their setup and test "
        "commands per repository and version (a path on the worker or s3://); empty: TASKS.specs.json beside the "
        "task file.",
    )
    added_within_days: float | None = Field(
        default=None,
        gt=0,
        description="Only the tasks a growing benchmark added in the last N days (their `added_at`), so that a "
        "model is judged on bugs it cannot have seen in training; empty: every task.",
    )
    repos_from: str = Field(
        default=DEFAULT_REPOS_FROM,
        description="For SWE-bench records: where their owner/name repositories come from, a base URL or a folder "
        "on the worker holding owner__name or owner/name clones.",
    )


class RepoBranch(BaseModel):
    """Tasks found by running a repository's tests at the head of a branch: each failing test file is a task."""

    kind: Literal["repo"] = "repo"
    repo: str = Field(description="A git URL, or a path on the worker.")
    branch: str = Field(default="main", description="Branch (or tag, or commit) to test.")
    test_command: str = Field(
        default=DEFAULT_TEST_COMMAND, description="The pytest command; a test file is appended."
    )
    setup_command: str | None = Field(
        default=DEFAULT_SETUP_COMMAND,
        description="Runs once before the tests, in the task's own environment: installs what they need, the "
        "test runner included (e.g. `pip install -e . pytest`). Empty: none.",
    )


def list_tasks(
    source: TaskFile | RepoBranch,
    provider: SandboxProvider,
    store: ArtifactStore | None = None,
    *,
    setup_network: bool = True,
    timeout: float = 1800.0,
) -> list[TaskSpec]:
    """The tasks `source` names. A task file in S3 is read with `store`'s credentials."""
    if isinstance(source, TaskFile):
        records = swe_bench_records(source, store, sources=getattr(provider, "sources", None))
        tasks = parse_tasks(read_text(source.path, store), source=source.path, records=records)
        if source.added_within_days is None:
            return tasks
        from bugsweep.mining.growing import added_within

        return added_within(tasks, source.added_within_days)
    return failing_test_files(
        source.repo,
        source.branch,
        source.test_command,
        provider,
        setup_command=source.setup_command,
        setup_network=setup_network,
        timeout=timeout,
    )


def swe_bench_records(
    source: TaskFile, store: ArtifactStore | None = None, sources: SourceCache | None = None
) -> SweBenchRecords:
    """How the SWE-bench records of `source` become tasks (bugsweep.swebench), each record's base_commit checked
    in a cached clone of its repository (`sources`: the local sandbox's clones; default: the configured cache)."""
    if sources is None:
        from bugsweep.settings import SandboxSettings

        cache_dir = SandboxSettings().cache_dir
        sources = SourceCache(Path(cache_dir) if cache_dir else None)
    cache = sources
    return SweBenchRecords(
        specs=source.specs or specs_beside(source.path),
        repos_from=source.repos_from,
        read=lambda location: read_text(location, store, what="specs file"),
        find_commit=lambda repo, commit: cache.resolve(RepoSource(repo, commit)),
    )


def failing_test_files(
    repo: str,
    branch: str,
    test_command: str,
    provider: SandboxProvider,
    *,
    setup_command: str | None = None,
    setup_network: bool = True,
    timeout: float = 1800.0,
) -> list[TaskSpec]:
    """One TaskSpec per test file with failing tests, pinned to the commit the branch points at now.

    Pinning matters: the task's id holds the commit, so tomorrow's sweep on a new commit makes new tasks while a
    rerun on the same commit finds tonight's grades and skips them.
    """
    sandbox = provider.create(RepoSource(repo, branch), labels={"purpose": "discover"})
    with sandbox:
        setup, _ = sandbox.setup_environment(setup_command, timeout=timeout, network=setup_network)
        if setup is not None and not setup.ok:  # None: nothing ran (no command, or an environment reused)
            raise setup_failed(setup_command, f"exited with {setup.exit_code}", setup.output)
        head = sandbox.exec("git rev-parse HEAD", timeout=60)
        if not head.ok:
            raise SandboxError(f"could not read the commit of {branch}: {head.output.strip()[-300:]}")
        commit = head.stdout.strip()
        tests = run_tests(sandbox, test_command, timeout=timeout)
    if tests.passed:
        return []
    if tests.tests is None or any(
        "::" not in t for t in tests.ids("failed", "error")
    ):  # pytest node ids only
        raise TaskError(
            f"{test_command!r} failed but reported no per-test results: finding failing test files needs pytest "
            f"(node ids from the probe in its process). Last output:\n{tests.log.strip()[-800:]}"
        )
    by_file: dict[str, list[str]] = defaultdict(list)
    for test_id in sorted(tests.ids("failed", "error")):
        by_file[test_id.split("::", 1)[0]].append(test_id)
    stem = (
        re.sub(r"[^A-Za-z0-9]+", "-", Path(repo.rstrip("/")).name.removesuffix(".git")).strip("-") or "repo"
    )
    return [
        TaskSpec(
            instance_id=f"{stem}-{re.sub(r'[^A-Za-z0-9]+', '-', file).strip('-')}-{commit[:10]}",
            repo=repo,
            base_commit=commit,
            problem_statement=PROBLEM_TEMPLATE.format(
                file=file, branch=branch, tests="\n".join(f"- {t}" for t in ids)
            ),
            test_command=f"{test_command} {shlex.quote(file)}",
            setup_command=setup_command,
            test_files=[file],
            FAIL_TO_PASS=ids,
        )
        for file, ids in sorted(by_file.items())
    ]
