"""The model comparison report: statistics over many graded runs, rendered as markdown, JSON and one HTML page.

A comparison is every model x task x run, each graded on its own. From those runs this module computes, per model,
the resolve rate with a 95% Wilson interval (it behaves at 0% and 100%, where the normal approximation gives
nonsense), and for every pair of models the paired per-task difference: tasks are the unit that varies, so two
models are compared on the same tasks (bootstrap CI over tasks, and an exact sign test over the tasks where they
differ, which is McNemar's exact test when there is one run per task).

Runs that could not be run at all (failure_kind 'infra': the endpoint or sandbox was down; 'task': setup failed or
the tests already passed; 'config': e.g. a rejected API key) are listed but left out of the rates: they say nothing
about the model. A 'crash' (a bug in bugsweep) counts as not resolved, so it can never flatter a model.

The formulas are in stats.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from itertools import combinations
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, computed_field

from bugsweep.attempts import planned
from bugsweep.errors import ConfigError
from bugsweep.stats import bootstrap_mean_ci, sign_test_p, wilson_interval

#: Failure kinds of runs that could not be run, left out of the rates.
NOT_GRADED_KINDS = frozenset({"infra", "task", "config"})


class RunRecord(BaseModel):
    """One graded run of one model on one task (the part of a Grade a comparison needs, plus the run number)."""

    model: str
    instance_id: str
    run: int = 0
    resolved: bool = False
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    wall_s: float = 0.0
    stop_reason: str | None = None
    policy: str | None = None
    """The agent policy the run was under (bugsweep/agent/policy.py)."""
    config_digest: str | None = None
    """The digest of the run's configuration (bugsweep.runconfig): what made it, in its grade.json."""
    error: str | None = None
    failure_kind: str | None = None
    """'infra', 'task' and 'config' runs are left out of rates; 'crash' counts as not resolved."""
    peak_memory_mib: float | None = None
    cpu_s: float | None = None
    peak_disk_mib: float | None = None
    suspicious: list[str] = Field(default_factory=list)
    """The grade's signals that tests cannot judge."""
    held_for_review: bool = False
    """The tests passed but `suspicious` signals hold the run for review: counted as not resolved, and listed."""
    evidence: str = ""
    """What the verdict rests on: a resolved run on 'exit code' alone (no per-test results, no mirror) is listed."""

    @property
    def exit_code_only(self) -> bool:
        return self.resolved and self.evidence.startswith("exit code")

    max_attempts: int = 1
    """The attempts its configuration allowed at the task (bugsweep.attempts); `resolved` is pass@max_attempts."""
    kept_attempt: int | None = None
    """The attempt the clean room resolved (None: none was); resolved by its first attempt is pass@1."""

    @classmethod
    def from_grade(
        cls, grade: Any, *, model: str, run: int, policy: str | None = None, config: str | None = None,
        max_attempts: int | None = None,
    ) -> RunRecord:  # fmt: skip
        """Take the fields a comparison needs from a bugsweep.grading.Grade (or anything with those attributes).
        `policy`, `config` (its digest) and `max_attempts` are the run's configuration's, for a run whose agent
        never started."""
        data = grade.model_dump() if hasattr(grade, "model_dump") else dict(vars(grade))
        fields = {k: data[k] for k in cls.model_fields if k in data and data[k] is not None}
        fields.update(model=model, run=run)
        fields.setdefault("policy", policy)
        fields.setdefault("config_digest", config)
        fields["max_attempts"] = planned(data.get("config")) if data.get("config") else max_attempts or 1
        return cls.model_validate(fields)

    @property
    def resolved_first(self) -> bool:
        """Resolved by its first attempt (pass@1)."""
        return self.resolved and self.kept_attempt in (None, 1)

    @property
    def counted(self) -> bool:
        """Whether this run says something about the model (runs that could not be run do not)."""
        return self.failure_kind not in NOT_GRADED_KINDS


# -- the report ------------------------------------------------------------------------------------------------


class ModelSummary(BaseModel):
    model: str
    runs: int
    """All runs, including those that could not be run."""
    graded: int
    """Runs that count towards the rate."""
    resolved: int
    rate: float
    ci_low: float
    ci_high: float
    not_graded: int
    mean_turns: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cost_usd: float
    mean_wall_s: float
    total_wall_s: float
    stop_reasons: dict[str, int] = Field(default_factory=dict)
    policies: list[str] = Field(default_factory=list)
    """The agent policies its runs were under (one, unless the comparison was set up otherwise)."""
    configs: list[str] = Field(default_factory=list)
    """The digests of the configurations its runs were under (bugsweep.runconfig; one per entry)."""
    exit_code_only: int = 0
    """Of `resolved`, the runs resolved on the exit code alone (no per-test evidence, no mirror run)."""
    attempts: int = 1
    """The attempts its runs allowed at a task: `resolved` and `rate` are pass@attempts."""
    resolved_first: int = 0
    """Runs resolved by their first attempt (of `graded`)."""
    pass_at_1: float = 0.0
    """`resolved_first` over `graded`: pass@1 of the same runs."""


class PairedDifference(BaseModel):
    """Model a minus model b over the tasks both have graded runs on (per-task resolve rates)."""

    a: str
    b: str
    tasks: int
    mean_diff: float
    ci_low: float
    ci_high: float
    a_better: int
    """Tasks where a's per-task resolve rate is higher."""
    b_better: int
    ties: int
    sign_test_p: float


class TaskCell(BaseModel):
    resolved: int
    graded: int
    runs: int
    rate: float | None
    mean_turns: float
    mean_wall_s: float


class TaskRow(BaseModel):
    instance_id: str
    cells: dict[str, TaskCell]


class TaskResources(BaseModel):
    """The heaviest run of one task (over all models), for sizing workers; None where no run measured it."""

    instance_id: str
    peak_memory_mib: float | None = None
    cpu_s: float | None = None
    peak_disk_mib: float | None = None


class ComparisonReport(BaseModel):
    generated_at: str
    name: str | None = None
    """The comparison's name (its runs are stored under NAME/ in the artifact store)."""
    report_dir: str | None = None
    """Where report.md, report.json and report.html were written."""
    models: list[ModelSummary]
    pairs: list[PairedDifference]
    tasks: list[TaskRow]
    resources: list[TaskResources] = Field(default_factory=list)
    """Per task, the most memory, CPU seconds and disk any of its runs used."""
    runs_per_task: int
    wall_s: float | None = None
    """Wall time of the whole comparison (all runs at once, within the concurrency limit)."""
    sum_run_wall_s: float
    """What the runs would have taken one after another."""
    records: list[RunRecord]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def policy(self) -> str | None:
        """The one policy every model ran under; None when they differ (or no run recorded one)."""
        policies = {p for s in self.models for p in s.policies}
        same = len(policies) == 1 and all(len(s.policies) == 1 for s in self.models)
        return policies.pop() if same else None


def policy_note(report: ComparisonReport) -> str:
    """One sentence on the harness: the same policy for every model, or which model ran under which."""
    if report.policy is not None:
        return f"Every model ran under the same agent policy: {report.policy}."
    each = "; ".join(f"{s.model}: {', '.join(s.policies) or 'unknown'}" for s in report.models)
    return (
        f"The models did not all run under the same agent policy ({each}): the comparison is of model and "
        "harness together."
    )


def _max(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _mean(values: Iterable[float]) -> float:
    vals = list(values)
    return statistics.fmean(vals) if vals else 0.0


class MixedAttempts(ConfigError):
    """Runs under different attempts settings in one comparison: a run of 3 attempts is not the same trial as a run
    of 1, so their rates are never set side by side."""


def same_attempts(by_model: dict[str, int]) -> int:
    """The one attempts setting of a comparison's models (name -> attempts); MixedAttempts when they differ."""
    settings = set(by_model.values())
    if len(settings) > 1:
        each = ", ".join(f"{m}: {n}" for m, n in by_model.items())
        raise MixedAttempts(
            f"a comparison compares runs with the same attempts setting, and these differ ({each}): compare them "
            "in separate comparisons, or give every model the same --attempts"
        )
    return settings.pop() if settings else 1


def build_report(records: Sequence[RunRecord], *, wall_s: float | None = None) -> ComparisonReport:
    """All the statistics of a comparison, from its graded runs. Models and tasks keep their first-seen order.
    Runs under different attempts settings are refused (MixedAttempts): pass@3 is never set beside pass@1."""
    attempts = same_attempts({r.model: r.max_attempts for r in records})
    models = list(dict.fromkeys(r.model for r in records))
    task_ids = list(dict.fromkeys(r.instance_id for r in records))
    by_cell: dict[tuple[str, str], list[RunRecord]] = {}
    for r in records:
        by_cell.setdefault((r.model, r.instance_id), []).append(r)

    summaries: list[ModelSummary] = []
    for m in models:
        mine = [r for r in records if r.model == m]
        counted = [r for r in mine if r.counted]
        k = sum(r.resolved for r in counted)
        lo, hi = wilson_interval(k, len(counted))
        reasons: dict[str, int] = {}
        for r in mine:
            key = r.stop_reason or (f"error:{r.failure_kind}" if r.failure_kind else "none")
            reasons[key] = reasons.get(key, 0) + 1
        summaries.append(
            ModelSummary(
                model=m,
                runs=len(mine),
                graded=len(counted),
                resolved=k,
                rate=k / len(counted) if counted else 0.0,
                ci_low=lo,
                ci_high=hi,
                not_graded=len(mine) - len(counted),
                mean_turns=_mean(r.turns for r in counted),
                prompt_tokens=sum(r.prompt_tokens for r in mine),
                completion_tokens=sum(r.completion_tokens for r in mine),
                cached_tokens=sum(r.cached_tokens for r in mine),
                cost_usd=sum(r.cost_usd for r in mine),
                mean_wall_s=_mean(r.wall_s for r in mine),
                total_wall_s=sum(r.wall_s for r in mine),
                stop_reasons=dict(sorted(reasons.items())),
                policies=sorted({r.policy for r in mine if r.policy}),
                configs=sorted({r.config_digest for r in mine if r.config_digest}),
                exit_code_only=sum(r.exit_code_only for r in counted),
                attempts=attempts,
                resolved_first=sum(r.resolved_first for r in counted),
                pass_at_1=sum(r.resolved_first for r in counted) / len(counted) if counted else 0.0,
            )
        )

    rows: list[TaskRow] = []
    for t in task_ids:
        cells: dict[str, TaskCell] = {}
        for m in models:
            runs = by_cell.get((m, t), [])
            counted = [r for r in runs if r.counted]
            k = sum(r.resolved for r in counted)
            cells[m] = TaskCell(
                resolved=k,
                graded=len(counted),
                runs=len(runs),
                rate=k / len(counted) if counted else None,
                mean_turns=_mean(r.turns for r in counted),
                mean_wall_s=_mean(r.wall_s for r in runs),
            )
        rows.append(TaskRow(instance_id=t, cells=cells))

    pairs: list[PairedDifference] = []
    for a, b in combinations(models, 2):
        diffs = []
        for row in rows:
            ra, rb = row.cells[a].rate, row.cells[b].rate
            if ra is not None and rb is not None:
                diffs.append(ra - rb)
        lo, hi = bootstrap_mean_ci(diffs)
        wins = sum(d > 0 for d in diffs)
        losses = sum(d < 0 for d in diffs)
        pairs.append(
            PairedDifference(
                a=a,
                b=b,
                tasks=len(diffs),
                mean_diff=_mean(diffs),
                ci_low=lo,
                ci_high=hi,
                a_better=wins,
                b_better=losses,
                ties=len(diffs) - wins - losses,
                sign_test_p=sign_test_p(wins, losses),
            )
        )

    resources = []
    for t in task_ids:
        runs = [r for r in records if r.instance_id == t]
        resources.append(
            TaskResources(
                instance_id=t,
                peak_memory_mib=_max(r.peak_memory_mib for r in runs),
                cpu_s=_max(r.cpu_s for r in runs),
                peak_disk_mib=_max(r.peak_disk_mib for r in runs),
            )
        )

    runs_per_task = max((len(v) for v in by_cell.values()), default=0)
    return ComparisonReport(
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        models=summaries,
        pairs=pairs,
        tasks=rows,
        resources=resources,
        runs_per_task=runs_per_task,
        wall_s=wall_s,
        sum_run_wall_s=sum(r.wall_s for r in records),
        records=list(records),
    )


# -- rendering -------------------------------------------------------------------------------------------------


def percent(x: float) -> str:
    return f"{100 * x:.0f}%"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def attempts_of(report: ComparisonReport) -> int:
    """The attempts every run of the comparison allowed (one setting: build_report refuses mixed ones)."""
    return max((s.attempts for s in report.models), default=1)


def summary_rows(report: ComparisonReport) -> tuple[list[str], list[list[str]]]:
    """The per-model table (shared by markdown, HTML and the Prefect artifact). With more than one attempt per
    run, the rate is pass@N, and pass@1 (the same runs' first attempts) stands beside it."""
    n = attempts_of(report)
    header = [
        "model", "resolved", "rate" if n == 1 else f"pass@{n}", "95% CI", *([] if n == 1 else ["pass@1"]),
        "mean turns", "prompt tok", "completion tok", "cached tok", "cost USD", "mean wall s", "not graded",
        "policy", "config",
    ]  # fmt: skip
    rows = [
        [
            s.model,
            f"{s.resolved}/{s.graded}"
            + (f" ({s.exit_code_only} exit code only)" if s.exit_code_only else ""),
            percent(s.rate),
            f"{percent(s.ci_low)}-{percent(s.ci_high)}",
            *([] if n == 1 else [f"{percent(s.pass_at_1)} ({s.resolved_first}/{s.graded})"]),
            f"{s.mean_turns:.1f}",
            str(s.prompt_tokens),
            str(s.completion_tokens),
            str(s.cached_tokens),
            f"{s.cost_usd:.4f}",
            f"{s.mean_wall_s:.1f}",
            str(s.not_graded),
            ", ".join(s.policies) or "-",
            ", ".join(s.configs) or "-",
        ]
        for s in report.models
    ]
    return header, rows


def pair_rows(report: ComparisonReport) -> tuple[list[str], list[list[str]]]:
    header = [
        "a - b",
        "tasks",
        "mean diff",
        "95% CI (bootstrap)",
        "a better",
        "b better",
        "ties",
        "sign test p",
    ]
    rows = [
        [
            f"{p.a} - {p.b}",
            str(p.tasks),
            f"{100 * p.mean_diff:+.0f} pts",
            f"{100 * p.ci_low:+.0f} to {100 * p.ci_high:+.0f}",
            str(p.a_better),
            str(p.b_better),
            str(p.ties),
            f"{p.sign_test_p:.3g}",
        ]
        for p in report.pairs
    ]
    return header, rows


def task_rows(report: ComparisonReport) -> tuple[list[str], list[list[str]]]:
    models = [s.model for s in report.models]
    header = ["task", *models]
    rows = []
    for row in report.tasks:
        cells = []
        for m in models:
            c = row.cells[m]
            cells.append(
                f"{c.resolved}/{c.graded}"
                + (f" (+{c.runs - c.graded} not graded)" if c.runs > c.graded else "")
            )
        rows.append([row.instance_id, *cells])
    return header, rows


def resource_rows(report: ComparisonReport) -> tuple[list[str], list[list[str]]]:
    """Per task, the heaviest run's resource use ('-' where the sandbox backend does not measure it)."""
    header = ["task", "peak memory MiB", "CPU s", "peak disk MiB"]

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.1f}"

    rows = [
        [r.instance_id, cell(r.peak_memory_mib), cell(r.cpu_s), cell(r.peak_disk_mib)]
        for r in report.resources
    ]
    return header, rows


ATTEMPTS_NOTE = (
    "Each run made up to {n} attempts at its task, stopping at the first the clean room resolved: pass@{n} is the "
    "runs resolved by any attempt, pass@1 those resolved by their first (the same runs)."
)

RESOURCE_NOTE = (
    "The heaviest run of each task over all models: the most memory its sandbox held at once (page cache "
    "included), CPU seconds of all its commands (setup, tests, agent), and the most disk its writable layers held."
)


RUN_COLUMNS = ["model", "task", "run"]
EXIT_CODE_NOTE = (
    "Counted as resolved, but the test command gave no per-test results (a runner other than pytest and unittest): "
    "the exit code decided, without the mirror run's check of the test process."
)


def render_markdown(report: ComparisonReport) -> str:
    parts = [
        "# Model comparison",
        "",
        f"{len(report.tasks)} tasks, {report.runs_per_task} run(s) per task and model, generated {report.generated_at}.",
    ]
    if report.wall_s is not None:
        parts.append(
            f"Wall time {report.wall_s:.1f} s for runs that add up to {report.sum_run_wall_s:.1f} s one after another."
        )
    parts.append(policy_note(report))
    parts += ["", "## Per model", "", _md_table(*summary_rows(report)), ""]
    parts.append(
        "Rate: resolved runs over graded runs (runs that could not be run are left out); 95% Wilson interval."
    )
    if attempts_of(report) > 1:
        parts.append(ATTEMPTS_NOTE.format(n=attempts_of(report)))
    if report.pairs:
        parts += ["", "## Paired differences (per task)", "", _md_table(*pair_rows(report)), ""]
        parts.append(
            "Per task, the difference of the two models' resolve rates; mean over tasks with a percentile "
            "bootstrap CI over tasks; exact two-sided sign test over the tasks where they differ."
        )
    parts += ["", "## Per task (resolved/graded runs)", "", _md_table(*task_rows(report)), ""]
    if report.resources:
        parts += [
            "",
            "## Resource use per task",
            "",
            _md_table(*resource_rows(report)),
            "",
            RESOURCE_NOTE,
            "",
        ]
    bare = [[r.model, r.instance_id, str(r.run)] for r in report.records if r.exit_code_only]
    if bare:
        parts += [
            "",
            "## Resolved on the exit code alone",
            "",
            EXIT_CODE_NOTE,
            "",
            _md_table(RUN_COLUMNS, bare),
            "",
        ]
    flagged = [r for r in report.records if r.suspicious]
    if flagged:
        parts += ["", "## Held for review and other suspicious runs", ""]
        parts.append(
            "Code outside the tests that patches the test framework or inspects its caller: tests cannot tell it "
            "from a fix, so a run whose tests pass with it is held for review and counted as not resolved; read "
            "their patches."
        )
        parts.append("")
        rows = [[r.model, r.instance_id, str(r.run), verdict_cell(r), r.suspicious[0]] for r in flagged]
        parts += [_md_table(["model", "task", "run", "verdict", "first signal"], rows), ""]
    return "\n".join(parts)


def render_json(report: ComparisonReport) -> str:
    return report.model_dump_json(indent=2)


def render_html(report: ComparisonReport) -> str:
    """One self-contained page (bugsweep.report_html): inline CSS and an inline SVG chart."""
    from bugsweep.report_html import render_page

    return render_page(report)


def artifact_table(report: ComparisonReport) -> list[dict[str, Any]]:
    """Rows for a Prefect table artifact: one per model."""
    header, rows = summary_rows(report)
    return [dict(zip(header, row, strict=True)) for row in rows]


def write_report(report: ComparisonReport, out_dir: str | Path) -> dict[str, Path]:
    """Write report.md, report.json and report.html into `out_dir`; returns the paths by format."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "report.md", "json": out / "report.json", "html": out / "report.html"}
    paths["markdown"].write_text(render_markdown(report), encoding="utf-8")
    paths["json"].write_text(render_json(report), encoding="utf-8")
    paths["html"].write_text(render_html(report), encoding="utf-8")
    return paths


def verdict_cell(record: RunRecord) -> str:
    if record.resolved:
        return "yes (exit code only)" if record.exit_code_only else "yes"
    return "held for review" if record.held_for_review else "no"
