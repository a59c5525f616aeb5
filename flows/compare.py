"""The `compare-models` flow: every model x task x run in its own sandbox, at once (within a limit), then a report.

The flow reads like its steps: load the tasks (the same task file `sweep` takes), run every (model, task, run) as
the sweep runs a task (`flows.solve_bug.solve_one_task`: setup, baseline, solve, regrade, upload, each step with
its own retries for infrastructure failures), collect the grades, and write the comparison report
(`bugsweep.report`: markdown, JSON and one self-contained HTML page) next to the runs, with a table artifact.

API keys never travel as flow parameters (Prefect stores and shows parameters): each model names the environment
variable that holds its key, and the key is read inside the flow run, on the machine that runs it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect_aws import S3Bucket
from pydantic import Field

from bugsweep.discover import TaskFile
from bugsweep.endpoints import NAMED, EndpointEntry
from bugsweep.errors import BugsweepError, ConfigError, StorageError
from bugsweep.report import (
    ComparisonReport,
    RunRecord,
    artifact_table,
    build_report,
    render_markdown,
    same_attempts,
    write_report,
)
from bugsweep.runbuilder import build_run
from bugsweep.runconfig import ModelFields, merge_choices
from bugsweep.spec import TaskSpec
from flows.common import (
    RELEASE_SANDBOXES_HOOKS,
    AgentChoices,
    RunSetup,
    SandboxName,
    current_flow_run_id,
    failed_state,
    load_sandboxes,
    load_store,
    run_labels,
)
from flows.solve_bug import Job, solve_many
from flows.sweep import TaskSource
from tasks import quiet_prefect_logs, steps
from tasks.limits import use_prefect_limits
from tasks.publish import artifact_key

#: Report files, written next to the runs and uploaded with them.
REPORT_FILES = ("report.md", "report.json", "report.html")


class ModelEntry(EndpointEntry):  # an endpoint named in words (bugsweep.endpoints), with its own limits
    """One entry of a comparison: a display name, an endpoint (bugsweep.runconfig.ModelFields: URL, model id,
    temperature, reply limit, prices, ...), the env var holding its API key, and its own agent limits or policy.

    Its settings are a run's like any other (bugsweep.runbuilder): what the entry gives, then the environment
    (LLM_TEMPERATURE, LLM_MAX_TOKENS_PER_REPLY, LLM_PRICE_*, ...; never LLM_BASE_URL, LLM_MODEL or LLM_API_KEY: an
    entry always names its endpoint, model and key), then the default; its `limits` are merged over the
    comparison's (runconfig.merge_choices), then BUGSWEEP_*, then the default, from the command line and from the
    flow alike. Two entries may be two configurations of one model (another policy, 20 vs 40 turns, another
    temperature): each is stored and reported under its own name and configuration digest."""

    limits: AgentChoices | None = None
    """This entry's own agent limits and policy, over the comparison's `limits` (a field left empty: the
    comparison's); unset: the comparison's, the same for every entry."""

    def set(self, field: str, value: str) -> None:
        """Set one of the entry's endpoint fields or agent limits by name, from text (`--model-set`)."""
        if field in AgentChoices.model_fields:
            self.limits = merge_choices(self.limits, AgentChoices.model_validate({field: value}))
        elif field in ModelFields.model_fields and field not in NAMED:
            self.set_endpoint(field, value)
        else:
            known = sorted({*AgentChoices.model_fields, *ModelFields.model_fields} - set(NAMED))
            raise ConfigError(
                f"{field!r} is not a setting of a model entry: choose one of {', '.join(known)}"
            )


def run_setups(
    models: list[ModelEntry], limits: AgentChoices | None, provider: Any, store: Any, local_dir: Path,
    flow_run_id: str | None,
) -> list[tuple[ModelEntry, RunSetup]]:  # fmt: skip
    """Per entry: its RunSetup (the shared sandboxes and store, its own endpoint, its limits merged over the
    comparison's), built as every run is (bugsweep.runbuilder.build_run). Runs are stored as
    NAME/TASK/ENTRY/CONFIG/run-N."""
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ConfigError(f"model names must be unique: {names}")
    return [
        (m, RunSetup.of(build_run(merge_choices(limits, m.limits), endpoint=m.settings(), provider=provider),
                        store, local_dir, run_labels(flow_run_id)))
        for m in models
    ]  # fmt: skip


@flow(
    name="compare-models",
    log_prints=True,
    **RELEASE_SANDBOXES_HOOKS,
)
def compare_models(
    source: TaskSource,
    models: list[ModelEntry],
    runs: Annotated[int, Field(ge=1, le=100)] = 3,
    name: str | None = None,
    sandbox: SandboxName | None = None,
    store: S3Bucket | None = None,
    limits: AgentChoices = AgentChoices(),
    concurrency: Annotated[int, Field(ge=1, le=256)] = 4,
    report_dir: str | None = None,
) -> Any:  # the ComparisonReport; a bad task file, a model that refuses: a Failed state, its error raised to a caller
    """Run every model on every task `runs` times, `concurrency` at once, and report resolve rates side by side.

    Each run is graded as in a sweep; a run that cannot be run (setup failed, an outage that outlasted the
    retries) is listed in the report and left out of the rates. The report goes to `report_dir` (default: the
    comparison's folder next to the runs) and to the artifact store under NAME/.
    """
    quiet_prefect_logs()
    use_prefect_limits()
    logger = get_run_logger()
    try:  # an outcome bugsweep expects (a bad task file, a model or store that refuses): one line, no traceback
        if not models:
            raise ConfigError("a comparison needs at least one task and one model")
        artifacts, local_dir = load_store(store)
        setups = run_setups(
            models, limits, load_sandboxes(sandbox), artifacts, local_dir, current_flow_run_id()
        )
        # pass@3 is never set beside pass@1: one attempts setting for every entry, refused before anything runs
        same_attempts({entry.name: run.agent.attempts for entry, run in setups})
        base = setups[0][1]
        name = name or default_name(source)
        list_tasks = steps.list_tasks.with_options(retry_delay_seconds=steps.retry_delays_s())
        specs = list_tasks(source, base.provider, base.store, setup_network=base.setup_network)
        if not specs:
            raise ConfigError("a comparison needs at least one task and one model")
    except BugsweepError as exc:
        return failed_state(exc)
    logger.info(
        "%d runs: %d model(s) x %d task(s) x %d run(s), %d at once",
        len(models) * len(specs) * runs, len(models), len(specs), runs, concurrency,
    )  # fmt: skip

    started = time.monotonic()
    records = run_all(specs, setups, name, runs, concurrency)
    wall_s = time.monotonic() - started

    report = build_report(records, wall_s=wall_s)
    out = Path(report_dir) if report_dir else base.local_dir / name
    report.name, report.report_dir = name, str(out.resolve())
    paths = write_report(report, out)
    publish(report, paths, base, name, len(specs), runs)
    return report


def default_name(source: Any) -> str:
    stem = Path(source.path).stem if isinstance(source, TaskFile) else Path(source.repo.rstrip("/")).name
    return "compare-" + (re.sub(r"[^A-Za-z0-9._-]+", "-", stem) or "tasks")


def run_all(
    specs: list[TaskSpec], setups: list[tuple[ModelEntry, RunSetup]], name: str, runs: int, concurrency: int
) -> list[RunRecord]:
    """Every (run, task, entry), `concurrency` at once (`solve_many`, as the sweep runs its tasks)."""
    jobs = [
        (r, entry, Job(spec, run, name, r, name=entry.name))
        for r in range(runs)
        for spec in specs
        for entry, run in setups
    ]
    outcomes = solve_many([job for _, _, job in jobs], concurrency)
    records = [
        RunRecord.from_grade(
            outcome.grade,
            model=entry.name,
            run=r,
            policy=job.run.config.policy,
            config=job.run.config.digest,
            max_attempts=job.run.agent.attempts,
        )
        for (r, entry, job), outcome in zip(jobs, outcomes, strict=True)
    ]
    # Model-major order: the report lists models as given and tasks in file order.
    model_order = {entry.name: i for i, (entry, _) in enumerate(setups)}
    task_order = {spec.instance_id: i for i, spec in enumerate(specs)}
    records.sort(key=lambda rec: (model_order[rec.model], task_order[rec.instance_id], rec.run))
    return records


def publish(
    report: ComparisonReport, paths: dict[str, Path], base: RunSetup, name: str, tasks: int, runs: int
) -> None:
    """The report to the artifact store (best effort: it is on disk either way) and as Prefect artifacts."""
    logger = get_run_logger()
    for path in paths.values():
        try:
            base.store.put_file(f"{name}/{path.name}", path)
        except StorageError as exc:
            logger.error("could not upload %s (it stays at %s): %s", path.name, path, exc)
    create_table_artifact(
        key=artifact_key(name),
        table=artifact_table(report),
        description=f"Resolve rate per model over {tasks} task(s) x {runs} run(s), with 95% Wilson intervals.",
    )
    create_markdown_artifact(key=artifact_key(name, "report"), markdown=render_markdown(report))
    logger.info("report: %s", ", ".join(str(p) for p in paths.values()))


def compare(
    tasks_path: str | Path | TaskFile,
    models: list[ModelEntry],
    *,
    runs: int = 3,
    concurrency: int = 4,
    report_dir: str | Path | None = None,
    name: str | None = None,
    sandbox: SandboxName | None = None,
    limits: AgentChoices | None = None,
) -> ComparisonReport:
    """Run the flow on a tasks.jsonl (a local path or s3://..., or a TaskFile saying where its SWE-bench records'
    commands and repositories come from): what `bugsweep compare` calls."""
    if isinstance(tasks_path, TaskFile):
        source = tasks_path
    else:
        path = str(tasks_path) if str(tasks_path).startswith("s3://") else str(Path(tasks_path).resolve())
        source = TaskFile(path=path)
    report: Any = compare_models(  # the report (a Failed state raises its error here)
        source=source,
        models=models,
        runs=runs,
        name=name,
        sandbox=sandbox,
        limits=limits or AgentChoices(),
        concurrency=concurrency,
        report_dir=str(report_dir) if report_dir else None,
    )
    return report
