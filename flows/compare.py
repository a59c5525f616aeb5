"""Compare models on one task set: every model x task x run in its own sandbox, at once, within a limit.

The flow reads like its steps: solve every (model, task, run) concurrently, collect the grades, build the report,
write it (markdown, JSON, HTML) and publish the per-model table as a Prefect artifact. The work is
`bugsweep.pipeline.solve_task`, exactly as `bugsweep solve` runs it; the report is `bugsweep.report`.

API keys never travel as flow parameters (Prefect stores parameters): a model names the environment variable that
holds its key, and the key is read inside the task, on the machine that runs it.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, SecretStr

from bugsweep.errors import ConfigError, InfraError
from bugsweep.report import (
    ComparisonReport,
    RunRecord,
    artifact_table,
    build_report,
    render_markdown,
    write_report,
)
from bugsweep.settings import AgentSettings, ModelSettings
from bugsweep.spec import TaskSpec, load_tasks


class ModelEntry(BaseModel):
    """One model in a comparison: a display name, its endpoint, and the env var holding its API key."""

    name: str
    base_url: str
    key_env: str | None = None
    """Environment variable with the API key; unset: no key (fine for self-hosted endpoints)."""
    model: str | None = None
    """Model id sent to the endpoint; unset: `name`."""
    price_prompt_per_mtok: float = 0.0
    price_completion_per_mtok: float = 0.0

    @classmethod
    def parse(cls, text: str) -> ModelEntry:
        """`NAME=BASE_URL[,KEY_ENV]`, e.g. `deepseek-chat=https://api.deepseek.com/v1,DEEPSEEK_API_KEY`."""
        name, sep, rest = text.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise ConfigError(f"--model {text!r}: expected NAME=BASE_URL[,KEY_ENV]")
        base_url, _, key_env_text = rest.partition(",")
        if not re.match(r"^https?://", base_url.strip()):
            raise ConfigError(f"--model {text!r}: {base_url!r} is not an http(s) URL")
        key_env = key_env_text.strip() or None
        if key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_env):
            raise ConfigError(f"--model {text!r}: {key_env!r} is not an environment variable name")
        return cls(name=name.strip(), base_url=base_url.strip(), key_env=key_env)

    def settings(self) -> ModelSettings:
        """ModelSettings for this model, with the key read from its env var now (never stored, never logged)."""
        key = ""
        if self.key_env:
            key = os.environ.get(self.key_env, "")
            if not key:
                raise ConfigError(f"model {self.name!r}: environment variable {self.key_env} is not set")
        return ModelSettings(
            base_url=self.base_url,
            model=self.model or self.name,
            api_key=SecretStr(key),
            price_prompt_per_mtok=self.price_prompt_per_mtok,
            price_completion_per_mtok=self.price_completion_per_mtok,
        )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def run_dir(out_dir: Path, model: str, instance_id: str, run: int) -> Path:
    return out_dir / "runs" / _slug(model) / _slug(instance_id) / f"run-{run}"


def _retry_infra_only(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a run only when the machinery failed (sandbox, endpoint outage), never the model's own failure."""
    try:
        state.result()
    except InfraError:
        return True
    except Exception:
        return False
    return False


@task(
    name="solve-run",
    task_run_name="{model.name}/{spec.instance_id}/run-{run}",
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=_retry_infra_only,
    cache_policy=NO_CACHE,
)
def solve_run(
    spec: TaskSpec, model: ModelEntry, run: int, out_dir: str, sandbox: str, agent: dict[str, Any]
) -> RunRecord:
    """One model on one task, once, in its own sandbox (pipeline.solve_task), graded as everywhere else."""
    from bugsweep.pipeline import solve_task
    from bugsweep.sandbox import get_provider

    folder = run_dir(Path(out_dir), model.name, spec.instance_id, run)
    grade = solve_task(
        spec,
        provider=get_provider(sandbox),
        model_settings=model.settings(),
        agent_settings=AgentSettings(**agent),
        out_dir=folder,
        labels={"purpose": "compare", "model": _slug(model.name), "task": spec.instance_id, "run": str(run)},
    )
    return RunRecord.from_grade(grade, model=model.name, run=run)


def _record_of_failed_run(
    spec: TaskSpec, model: ModelEntry, run: int, out_dir: Path, exc: BaseException
) -> RunRecord:
    """A run that raised: solve_task wrote grade.json with the error and its kind before raising; use it."""
    from bugsweep.errors import failure_kind
    from bugsweep.pipeline import load_grade

    path = run_dir(out_dir, model.name, spec.instance_id, run) / "grade.json"
    if path.exists():
        return RunRecord.from_grade(load_grade(path), model=model.name, run=run)
    return RunRecord(
        model=model.name,
        instance_id=spec.instance_id,
        run=run,
        error=f"{type(exc).__name__}: {exc}",
        failure_kind=failure_kind(exc),
    )


@flow(name="compare-models", log_prints=True)
def compare_models(
    tasks: list[TaskSpec],
    models: list[ModelEntry],
    runs: int = 3,
    out_dir: str = "compare-out",
    sandbox: str = "local",
    agent: dict[str, Any] | None = None,
) -> ComparisonReport:
    """Run every model on every task `runs` times, concurrently, and write the comparison report."""
    logger = get_run_logger()
    if not tasks or not models:
        raise ConfigError("a comparison needs at least one task and one model")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ConfigError(f"model names must be unique: {names}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    jobs: list[tuple[TaskSpec, ModelEntry, int, PrefectFuture[RunRecord]]] = []
    for r in range(runs):
        for spec in tasks:
            for m in models:
                future = solve_run.submit(spec, m, r, str(out), sandbox, agent or {})
                jobs.append((spec, m, r, future))
    logger.info(
        "%d runs submitted (%d models x %d tasks x %d runs)", len(jobs), len(models), len(tasks), runs
    )

    records: list[RunRecord] = []
    for spec, m, r, future in jobs:
        try:
            records.append(future.result())
        except Exception as exc:
            records.append(_record_of_failed_run(spec, m, r, out, exc))
            logger.warning("%s on %s run %d could not be run: %s", m.name, spec.instance_id, r, exc)
    wall_s = time.monotonic() - started

    # Order records model-major so the report lists models as given and tasks in file order.
    order = {(m.name, t.instance_id): (i, j) for i, m in enumerate(models) for j, t in enumerate(tasks)}
    records.sort(key=lambda rec: (*order[(rec.model, rec.instance_id)], rec.run))
    report = build_report(records, wall_s=wall_s)
    paths = write_report(report, out)
    create_table_artifact(
        key="model-comparison",
        table=artifact_table(report),
        description=f"Resolve rate per model over {len(tasks)} tasks x {runs} runs (95% Wilson interval)",
    )
    create_markdown_artifact(key="model-comparison-report", markdown=render_markdown(report))
    logger.info("report written to %s", ", ".join(str(p) for p in paths.values()))
    return report


def compare(
    tasks_path: str | Path,
    models: list[ModelEntry],
    *,
    runs: int = 3,
    concurrency: int = 4,
    out_dir: str | Path = "compare-out",
    sandbox: str = "local",
    agent: dict[str, Any] | None = None,
) -> ComparisonReport:
    """Load a tasks.jsonl and run the comparison flow with at most `concurrency` runs at once."""
    tasks = load_tasks(tasks_path)
    runner: ThreadPoolTaskRunner[Any] = ThreadPoolTaskRunner(max_workers=max(1, concurrency))
    limited = compare_models.with_options(task_runner=runner)  # type: ignore[arg-type]
    return limited(tasks=tasks, models=models, runs=runs, out_dir=str(out_dir), sandbox=sandbox, agent=agent)
