"""The `grow-benchmark` flow: every night, the fixes each configured repository received since the last night,
mined, validated and appended to the team's benchmark file in the artifact store (bugsweep.mining.growing)."""

from __future__ import annotations

from typing import Annotated

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect_aws import S3Bucket
from pydantic import Field

from bugsweep.mining.growing import BenchmarkRepo, RepoGrowth, grow_benchmark
from bugsweep.mining.records import MiningEvent
from flows.common import (
    RELEASE_SANDBOXES_HOOKS,
    SandboxName,
    form_field,
    load_sandboxes,
    load_store,
    sandbox_field,
    store_field,
)
from tasks.publish import artifact_key

#: Where the benchmark lives in the artifact store unless a run says otherwise.
DEFAULT_BENCHMARK = "benchmark/tasks.jsonl"


@flow(name="grow-benchmark", log_prints=True, **RELEASE_SANDBOXES_HOOKS)
def grow(
    repos: list[BenchmarkRepo] = form_field(
        ...,
        "Repositories",
        "Each repository (a git URL or a path on the worker) whose new fixes join the benchmark: its branch and, "
        "when they cannot be detected, its setup and test commands.",
    ),
    benchmark: str = form_field(
        DEFAULT_BENCHMARK,
        "Benchmark file",
        "The task file's key in the artifact store; new tasks are appended, earlier ones never rewritten.",
    ),
    store: S3Bucket | None = store_field(),
    sandbox: SandboxName | None = sandbox_field(),
    runs: Annotated[int, Field(ge=1, le=10)] = form_field(
        3,
        "Runs per candidate",
        "Test runs before and after each fix (a test that differs between runs is flaky).",
    ),
) -> list[RepoGrowth]:
    """Mine each repository's commits since the last run and append the new validated tasks to the benchmark.

    A repository that cannot be mined (not found, its test command missing) is reported and the others go on; the
    run then ends Failed, naming it. Compare or sweep the tasks added lately with `added_within_days`.
    """
    logger = get_run_logger()
    artifacts, _ = load_store(store)
    provider = load_sandboxes(sandbox)

    def progress(event: MiningEvent) -> None:
        if event.kind in ("kept", "rejected", "validate"):
            logger.info("%s %s %s: %s", event.kind, event.commit[:10], event.subject[:60], event.message)

    grown = grow_benchmark(artifacts, benchmark, repos, provider, runs=runs, on_progress=progress)
    lines = [f"# Benchmark `{artifacts.uri(benchmark)}`", "", "| repository | from | to | added | stopped |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for g in grown:
        lines.append(
            f"| {g.repo} | {(g.since_head or 'first night')[:10]} | {g.head[:10]} | {len(g.added)} | "
            f"{g.stopped or ''} |"
        )
    create_markdown_artifact("\n".join(lines) + "\n", key=artifact_key("benchmark", benchmark))
    added = sum(len(g.added) for g in grown)
    logger.info("%d new task(s) in %s", added, artifacts.uri(benchmark))
    stopped = [g for g in grown if g.stopped]
    if stopped:
        raise RuntimeError(
            "could not mine "
            + "; ".join(f"{g.repo}: {g.stopped}" for g in stopped)
            + f" ({added} new task(s) from the others were added)"
        )
    return grown
