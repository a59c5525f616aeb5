"""Several attempts at one task, and a cheaper model first: which attempts a run makes, what grade.json records of
each, and which one the run keeps.

A run makes up to `attempts` (bugsweep.runconfig.AgentLimits) independent attempts with its model, then as many
with each model it escalates to (`RunConfig.escalate_to`), in order; a model's first attempt is at its own
temperature, its later ones at `retry_temperature`. Each attempt is an agent run in its own sandbox made from the
task state after setup, graded by the clean room (`Cascade` makes them, for bugsweep.pipeline.solve_task, with the
pipeline's steps; an attempt's steps carry its number: `step_name`); the first attempt the clean room resolves ends
the task. An attempt held for review, or not resolved, is never kept: the next one runs.

The grade keeps every attempt (`Grade.attempts`, records of this module's `AttemptRecord`) and which one it keeps
(`Grade.kept_attempt`). Its verdict is the kept attempt's, or the last attempt's when none was resolved; its turns,
tokens, cost and the agent's time are the sum over the attempts (`combine`). A run of more than one attempt keeps
each attempt's files in the run folder under `attempts/N/` (trajectory.json, patch.diff, tests_after.log,
tests_mirror.log) and the kept (else the last) attempt's at the folder's top, where the tools and the store expect
them.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from bugsweep.errors import InfraError, describe, failure_kind

if TYPE_CHECKING:
    from bugsweep.agent.types import AgentEvent, AgentProgress, AgentResult
    from bugsweep.grading import Grade, TestRun
    from bugsweep.pipeline import PreparedTask, StepRunner
    from bugsweep.runconfig import RunConfig
    from bugsweep.sandbox.base import Sandbox
    from bugsweep.settings import AgentSettings, ModelSettings

#: Where a run of more than one attempt keeps each attempt's files: ATTEMPTS_DIR/N/ in the run folder.
ATTEMPTS_DIR = "attempts"
#: The files of one attempt, copied to the run folder's top for the attempt the run keeps (else the last).
ATTEMPT_FILES = ("trajectory.json", "patch.diff", "tests_after.log", "tests_mirror.log")
#: Between a step's kind and its attempt's number in a step's name ('solve-attempt-2': `step_name`).
ATTEMPT_STEP = "-attempt-"


class AttemptRecord(BaseModel):
    """One attempt at a task, as grade.json records it (`Grade.attempts`)."""

    attempt: int
    """Its number, from 1, over the whole cascade (a second model's first attempt follows the first model's last)."""
    model: str
    """The model it asked."""
    endpoint: int = 1
    """Which model of the run's cascade that is: 1 the run's model, 2 the first it escalates to, ..."""
    temperature: float
    """The sampling temperature of its requests: its model's own for a model's first attempt, `retry_temperature`
    for the later ones."""
    verdict: str
    """'resolved', 'held for review', 'not resolved' or 'could not run' (bugsweep.grading.verdict_word)."""
    resolved: bool = False
    held_for_review: bool = False
    reason: str | None = None
    """Why the clean room did not resolve it (None when it did)."""
    stop_reason: str | None = None
    summary: str | None = None
    """The model's finish summary (recorded, never trusted)."""
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    """Token cost, from its model's prices."""
    sandbox_cost_usd: float | None = None
    """Its sandbox's cost where the backend bills (Runtime)."""
    agent_wall_s: float = 0.0
    wall_s: float = 0.0
    """Its whole time: its sandbox, the agent, its regrade."""
    error: str | None = None
    """Why it did not finish (an interrupt, an outage that outlasted the retries, ...); the task's grade says it too."""
    failure_kind: str | None = None
    folder: str | None = None
    """Where its files are in the run folder (attempts/N); None in a run of one attempt, whose files are at the
    folder's top."""


@dataclass
class PlannedAttempt:
    """One attempt a run may make: its number, which model of the cascade, and that model's settings at the
    attempt's temperature."""

    attempt: int
    endpoint: int
    model: ModelSettings

    @property
    def temperature(self) -> float:
        return self.model.temperature


def plan_attempts(models: Sequence[ModelSettings], agent: AgentSettings) -> list[PlannedAttempt]:
    """Every attempt a run may make, in order: `agent.attempts` per model of `models` (the run's model, then those
    it escalates to), a model's first at its own temperature and the rest at `agent.retry_temperature`."""
    plan: list[PlannedAttempt] = []
    for endpoint, model in enumerate(models, 1):
        for k in range(agent.attempts):
            settings = model if k == 0 else model.model_copy(update={"temperature": agent.retry_temperature})
            plan.append(PlannedAttempt(attempt=len(plan) + 1, endpoint=endpoint, model=settings))
    return plan


@dataclass
class AttemptOutcome:
    """A finished attempt: its plan, its own grade (the clean room's), what the run folder keeps of it."""

    planned: PlannedAttempt
    grade: Grade
    after: TestRun | None
    patch: str
    wall_s: float
    folder: str | None = None
    mirror: TestRun | None = None
    """The regrade's mirror run (bugsweep.grading.mirror), where it ran."""

    def record(self) -> AttemptRecord:
        from bugsweep.grading import verdict_word

        g = self.grade
        return AttemptRecord(
            attempt=self.planned.attempt, model=self.planned.model.model, endpoint=self.planned.endpoint,
            temperature=self.planned.temperature, verdict=verdict_word(g), resolved=g.resolved,
            held_for_review=g.held_for_review, reason=g.reason, stop_reason=g.stop_reason, summary=g.summary,
            turns=g.turns, prompt_tokens=g.prompt_tokens, completion_tokens=g.completion_tokens,
            cached_tokens=g.cached_tokens, cost_usd=g.cost_usd, sandbox_cost_usd=g.sandbox_cost_usd,
            agent_wall_s=g.agent_wall_s, wall_s=round(self.wall_s, 3), folder=self.folder,
        )  # fmt: skip


def cut_short(
    planned: PlannedAttempt,
    progress: AgentProgress,
    exc: BaseException,
    *,
    started: float,
    folder: str | None,
) -> AttemptRecord:
    """The record of an attempt that did not finish (an interrupt, a crash, an outage): what it had used."""
    used = progress.grade_fields()
    return AttemptRecord(
        attempt=planned.attempt, model=planned.model.model, endpoint=planned.endpoint,
        temperature=planned.temperature, verdict="could not run",
        turns=used.get("turns", 0), prompt_tokens=used.get("prompt_tokens", 0),
        completion_tokens=used.get("completion_tokens", 0), cached_tokens=used.get("cached_tokens", 0),
        cost_usd=used.get("cost_usd", 0.0), agent_wall_s=used.get("agent_wall_s", 0.0),
        wall_s=round(time.monotonic() - started, 3), error=describe(exc), failure_kind=failure_kind(exc),
        folder=folder,
    )  # fmt: skip


def totals(records: Sequence[AttemptRecord]) -> dict[str, Any]:
    """The grade's turns, tokens, cost and the agent's time: the sum over `records`."""
    sandbox = [r.sandbox_cost_usd for r in records if r.sandbox_cost_usd is not None]
    return {
        "turns": sum(r.turns for r in records),
        "prompt_tokens": sum(r.prompt_tokens for r in records),
        "completion_tokens": sum(r.completion_tokens for r in records),
        "cached_tokens": sum(r.cached_tokens for r in records),
        "cost_usd": sum(r.cost_usd for r in records),
        "sandbox_cost_usd": sum(sandbox) if sandbox else None,
        "agent_wall_s": sum(r.agent_wall_s for r in records),
    }


def kept(outcomes: Sequence[AttemptOutcome]) -> AttemptOutcome | None:
    """The attempt a run keeps: the one the clean room resolved (the last made, as a resolved one ends the run)."""
    return next((o for o in outcomes if o.grade.resolved), None)


def combine(outcomes: Sequence[AttemptOutcome], *, model: str) -> Grade:
    """The task's grade from its attempts: the kept attempt's verdict, else (none resolved) the last attempt's;
    every attempt's record; turns, tokens, cost and the agent's time summed; resources the most any attempt's
    sandboxes held (memory, disk) and the CPU seconds they used together. `model`: the run's model (what its
    results are filed under)."""
    chosen = kept(outcomes) or outcomes[-1]
    records = [o.record() for o in outcomes]
    grades = [o.grade for o in outcomes]

    def peak(name: str) -> float | None:
        values = [getattr(g, name) for g in grades if getattr(g, name) is not None]
        return max(values) if values else None

    cpu = [g.cpu_s for g in grades if g.cpu_s is not None]
    keep = kept(outcomes)
    return chosen.grade.model_copy(
        update={
            **totals(records),
            "model": model,
            "attempts": records,
            "kept_attempt": keep.planned.attempt if keep else None,
            "peak_memory_mib": peak("peak_memory_mib"),
            "peak_disk_mib": peak("peak_disk_mib"),
            "disk_quota_mib": peak("disk_quota_mib"),
            "cpu_s": round(sum(cpu), 2) if cpu else None,
        }
    )


def attempt_folder(out_dir: Path, attempt: int) -> Path:
    return out_dir / ATTEMPTS_DIR / str(attempt)


def promote(out_dir: Path, folder: str | None) -> None:
    """Copy an attempt's files (ATTEMPT_FILES it has) to the run folder's top, replacing what is there."""
    if folder is None:
        return
    source = out_dir / folder
    for name in ATTEMPT_FILES:
        target = out_dir / name
        if (source / name).is_file():
            shutil.copyfile(source / name, target)
        else:
            target.unlink(missing_ok=True)


def planned(config: dict[str, Any] | None) -> int:
    """How many attempts a run's configuration (grade.json's `config`) allows: `attempts` per model of its
    cascade; 1 for a configuration from before attempts."""
    config = config or {}
    agent = config.get("agent") or {}
    return int(agent.get("attempts") or 1) * (1 + len(config.get("escalate_to") or []))


def resolved_at(grade: Grade) -> str:
    """For a grade whose run allowed more than one attempt, the words a reader looks for: 'resolved at attempt 2
    of 3' (with the model, in a cascade), or 'not resolved in 3 attempts'; '' for a run of one attempt."""
    allowed = planned(grade.config)
    if allowed < 2 or not grade.attempts:
        return ""
    if grade.kept_attempt is not None:
        record = next((r for r in grade.attempts if r.attempt == grade.kept_attempt), None)
        cascade = len({r.endpoint for r in grade.attempts}) > 1 or bool(
            (grade.config or {}).get("escalate_to")
        )
        model = f" ({record.model})" if cascade and record is not None else ""
        return f"resolved at attempt {grade.kept_attempt} of {allowed}{model}"
    made = len(grade.attempts)
    return f"not resolved in {made} attempt{'' if made == 1 else 's'}" + (
        f" (of {allowed})" if made < allowed else ""
    )


# -- making the attempts (for bugsweep.pipeline.solve_task) --------------------------------------------------------


@dataclass(frozen=True)
class AttemptSteps:
    """What the pipeline hands the attempts: its steps `solve` and `regrade` (bugsweep.pipeline.solve_from_task_state
    and regrade), the `runner` that runs every step, and the run's callbacks and configuration. This module is below
    the pipeline (the grade's model imports it), so it is given them rather than importing them."""

    solve: Callable[..., AgentResult]
    regrade: Callable[..., tuple[Grade, TestRun | None, str]]
    runner: StepRunner
    step: Callable[[str, dict[str, Any]], None]
    on_event: Callable[[AgentEvent], None] | None
    on_sandbox: Callable[[Sandbox], None] | None
    config: RunConfig | None


@dataclass
class Cascade:
    """One run's attempts (bugsweep.pipeline.solve_task holds it): the plan, made in order until the clean room
    resolves one; the attempts made and the one under way; what the grade records of them, also when the run is cut
    short. The pipeline's steps an attempt runs are handed to `run`: this module is below the pipeline (the grade's
    model imports it)."""

    plan: list[PlannedAttempt]
    out_dir: Path
    """The run folder (in a run of more than one attempt, each attempt's files go to its attempts/N/)."""
    made: list[AttemptOutcome] = field(default_factory=list)
    progress: AgentProgress | None = None
    """What the agent used in the attempt under way (else the last), kept up to date by the loop."""
    current: tuple[PlannedAttempt, float, str | None] | None = None
    """The attempt under way: its plan, when it started, its folder."""

    @classmethod
    def start(cls, models: Sequence[ModelSettings], agent: AgentSettings, out_dir: Path) -> Cascade:
        """The attempts a run of `models` (its model, then those it escalates to) may make (`plan_attempts`), in a
        run folder cleared of an earlier run's attempts: a folder's attempts are its own run's."""
        shutil.rmtree(out_dir / ATTEMPTS_DIR, ignore_errors=True)
        return cls(plan=plan_attempts(models, agent), out_dir=out_dir)

    def run(
        self, prepared: PreparedTask, before: TestRun, agent_settings: AgentSettings, steps: AttemptSteps
    ) -> None:
        """Make the planned attempts in order until the clean room resolves one, with the pipeline's `steps`."""
        from bugsweep.agent.types import AgentProgress  # here: it loads the model client

        many = len(self.plan) > 1
        for planned in self.plan:
            folder = f"{ATTEMPTS_DIR}/{planned.attempt}" if many else None
            self.progress = AgentProgress()
            self.current = (planned, time.monotonic(), folder)
            self.made.append(
                run_attempt(
                    planned, prepared, before, agent_settings, steps, progress=self.progress,
                    out_dir=self.out_dir / folder if folder else self.out_dir, folder=folder, many=many,
                )
            )  # fmt: skip
            self.current = None
            if self.made[-1].grade.resolved:
                break

    def result(self, *, model: str) -> tuple[Grade, AttemptOutcome]:
        """The task's grade from the attempts made (`combine`; `model`: the run's model), and the attempt whose
        files the run folder's top now holds: the kept one, else the last."""
        chosen = kept(self.made) or self.made[-1]
        promote(self.out_dir, chosen.folder)
        return combine(self.made, model=model), chosen

    def cut_short_grade(self, failed: Grade, exc: BaseException) -> Grade:
        """`failed`, the grade of a run cut short (Ctrl-C, SIGTERM, a crash), with what its attempts used: the
        finished ones, and the one under way as the loop kept it reachable (its files at the folder's top)."""
        records = [o.record() for o in self.made]
        if self.current is not None and self.progress is not None:
            planned, started, folder = self.current
            records.append(cut_short(planned, self.progress, exc, started=started, folder=folder))
            promote(self.out_dir, folder)
        if not records:
            return failed
        used = self.progress.grade_fields() if self.progress is not None else {}
        return failed.model_copy(update={**used, **totals(records), "attempts": records})


def run_attempt(
    planned: PlannedAttempt,
    prepared: PreparedTask,
    before: TestRun,
    agent_settings: AgentSettings,
    steps: AttemptSteps,
    *,
    progress: AgentProgress,
    out_dir: Path,
    folder: str | None,
    many: bool,
) -> AttemptOutcome:
    """One attempt: its sandbox (the setup's own for the first, a new one from the task state after setup for the
    others, released here), the agent ('solve'), the clean room's grade ('regrade'); in a run of more than one
    attempt its files go to `out_dir` (attempts/N) and its steps carry its number."""
    started = time.monotonic()
    number = planned.attempt if many else None
    step, runner = steps.step, steps.runner
    if many:
        step(
            "attempt",
            {"attempt": planned.attempt, "model": planned.model.model, "temperature": planned.temperature},
        )
    own = planned.attempt > 1
    task = (
        runner(step_name("sandbox", number), attempt_sandbox, prepared, planned.attempt) if own else prepared
    )
    try:
        if own and steps.on_sandbox is not None:
            steps.on_sandbox(task.sandbox)
        step("agent", {"model": planned.model.model, "failing": sorted(before.ids("failed", "error"))})
        agent_result = runner(
            step_name("solve", number), steps.solve, task, planned.model, agent_settings, steps.on_event,
            out_dir, progress=progress, config=steps.config, attempt=number,
        )  # fmt: skip
        step("regrade", {"stop_reason": agent_result.stop_reason})
        verdict, after, patch = runner(
            step_name("regrade", number), steps.regrade, task, before, agent_result, model_name=planned.model.model,
            agent_settings=agent_settings,
        )  # fmt: skip
    finally:
        if own:
            task.sandbox.release()
    if many:
        # imported here: the run folder's module imports the grade's model, which imports this one
        from bugsweep.rundir import write_attempt_dir

        write_attempt_dir(out_dir, patch=patch, after=after, mirror=task.mirror_run)
    return AttemptOutcome(
        planned=planned,
        grade=verdict,
        after=after,
        patch=patch,
        wall_s=time.monotonic() - started,
        folder=folder,
        mirror=task.mirror_run,
    )


def attempt_sandbox(prepared: PreparedTask, attempt: int) -> PreparedTask:
    """The 'sandbox' step of an attempt after the first: a new sandbox made from the task state after setup (the
    read-only `task_layer`: the repository and the task environment; a clean $HOME and /tmp), holding the task
    as the first attempt's did. Nothing of an earlier attempt is in it. The caller releases it."""
    if prepared.provider is None or prepared.task_layer is None:
        raise InfraError(
            "the task state after setup was not kept, so no sandbox can be made for another attempt"
        )
    sandbox = prepared.provider.create_from(
        prepared.task_layer, labels={**prepared.labels, "role": "attempt", "attempt": str(attempt)}
    )
    return dataclasses.replace(prepared, sandbox=sandbox, started=time.monotonic(), mirror_run=None)


def step_name(kind: str, attempt: int | None) -> str:
    """The name a step runner gets: the step's kind ('setup', 'baseline', 'sandbox', 'solve', 'regrade'), with the
    attempt's number in a run of more than one ('solve-attempt-2')."""
    return kind if attempt is None else f"{kind}{ATTEMPT_STEP}{attempt}"


def step_kind(name: str) -> str:
    """The kind of a step from its name (`step_name`)."""
    return name.split(ATTEMPT_STEP, 1)[0]
