"""The steps of one bug-fix task as Prefect tasks: setup, baseline, solve, regrade (through `PrefectSteps`, the
step runner `pipeline.solve_task` is given), upload, listing a sweep's tasks and its summary.

Each task is a thin wrapper over a plain function of the core (bugsweep.pipeline, bugsweep.upload). What Prefect
adds here, and nothing else:
- retries, only for infrastructure failures no layer below retried (a sandbox that could not be made, a command
  that could not be started in it): a model endpoint outage is retried by the model client inside the turn, an S3
  fault by the store, so `solve` and `upload` never retry (docs/pipeline.md, "Who retries what"). An honest "not
  resolved" is a Grade, not an exception, so it is never retried; neither is a TaskError (setup failed, tests
  already pass) nor a ConfigError (a rejected key), which would fail the same way;
- a timeout on each step, as a backstop over the core's own command and wall-clock limits;
- the kind of failure that ended a step, in its log (`failure_kind`: config, infra, task or crash);
- artifacts: a link to each patch and its diff (tasks/publish.py), and a summary, a table and the review page per
  sweep.

Sandboxes are passed between the steps in memory, inside a PreparedTask: nothing here is cached or persisted
(`NO_CACHE`, `persist_result=False`), because a sandbox is a live process, not a value.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prefect import Task, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from bugsweep import branches, discover
from bugsweep.attempts import resolved_at, step_kind
from bugsweep.discover import RepoBranch, TaskFile
from bugsweep.errors import ConfigError, InfraError, SandboxGone, failure_kind, first_line
from bugsweep.grading import Grade
from bugsweep.pipeline import STEP_TIMEOUT_S
from bugsweep.settings import AgentSettings, BranchSettings
from bugsweep.spec import TaskSpec
from bugsweep.storage import ArtifactStore
from bugsweep.upload import UploadResult, upload_run
from tasks.publish import ReviewPage, artifact_key, publish_patch, publish_review

if TYPE_CHECKING:
    from prefect.client.schemas.objects import TaskRun
    from prefect.states import State

    from bugsweep.agent.loop import AgentEvent
    from bugsweep.sandbox.base import SandboxProvider


def retry_delays_s() -> list[float]:
    """Seconds before the first and second retry of a step (BUGSWEEP_RETRY_DELAYS_S shortens them in tests).

    Read when a flow runs a step, never at import: `PrefectSteps` and the callers of `upload` and `list_tasks`
    pass it with `.with_options(retry_delay_seconds=...)`.
    """
    raw = os.environ.get("BUGSWEEP_RETRY_DELAYS_S", "10,60")
    try:
        delays = [float(s) for s in raw.split(",")]
    except ValueError:
        delays = []
    if not delays or any(d < 0 for d in delays):
        raise ConfigError(
            f"BUGSWEEP_RETRY_DELAYS_S={raw!r}: give seconds >= 0 separated by commas, e.g. 10,60"
        )
    return delays


#: Margin added to the core's own limits, so the core's timeout (a clear result) fires before Prefect's.
TIMEOUT_MARGIN_S = 300.0

R = TypeVar("R")


# -- when to retry, and what ended a step ---------------------------------------------------------------------


def _exception(state: State[Any]) -> BaseException | None:
    data = state.data
    if isinstance(data, BaseException):
        return data
    try:
        result = state.result(raise_on_failure=False)
    except Exception as exc:  # a failed state can raise its exception here
        return exc
    return result if isinstance(result, BaseException) else None


def not_retried_below(exc: BaseException | None) -> bool:
    """An infrastructure failure that no layer below has retried yet; never a task or config error."""
    return isinstance(exc, InfraError) and exc.retried == 0


def retry_on_infra(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Retry infrastructure failures only (a sandbox that could not be made, ...), and only those no layer below
    retried (an S3 error after the store's tries, a model outage after the client's, is not retried again)."""
    return not_retried_below(_exception(state))


def retry_on_infra_in_sandbox(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """As `retry_on_infra`, but not when the sandbox itself is gone: running again in it cannot help."""
    exc = _exception(state)
    return not_retried_below(exc) and not isinstance(exc, SandboxGone)


def log_failure_kind(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> None:
    """Record which kind of failure ended the step (config, infra, task or crash) in its log."""
    from prefect.logging.loggers import task_run_logger

    exc = _exception(state)
    task_run_logger(task_run, task).warning(
        "step %s (%s) ended by a %s failure: %s",
        task.name,
        task_run.name,
        failure_kind(exc) if exc else "crash",
        exc if exc else state.message,
    )


_STEP: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False, "on_failure": [log_failure_kind]}

#: Prefect's options for each step of `pipeline.solve_task` (the step functions themselves are the core's).
STEP_OPTIONS: dict[str, dict[str, Any]] = {
    # A retry starts over with a new sandbox: the step releases the one that failed before it ends.
    "setup": {"retries": 2, "retry_condition_fn": retry_on_infra, "timeout_seconds": 2 * STEP_TIMEOUT_S},
    "baseline": {
        "retries": 1,
        "retry_condition_fn": retry_on_infra_in_sandbox,
        "timeout_seconds": STEP_TIMEOUT_S,
    },
    # An attempt's own sandbox, made from the task state after setup (an attempt after the first): made again on
    # an infrastructure failure, as the setup's.
    "sandbox": {"retries": 2, "retry_condition_fn": retry_on_infra, "timeout_seconds": STEP_TIMEOUT_S},
    # Never retried: that would start the agent over and pay again for every turn made. A model endpoint outage is
    # retried inside the turn by the model client (LLM_MAX_RETRIES), the one layer for it. Timeout: the agent's own
    # wall-clock limit (max_wall_s) plus the margin; none when the run has none, as on the command line.
    "solve": {"retries": 0, "timeout_seconds": None},
    "regrade": {
        "retries": 1,
        "retry_condition_fn": retry_on_infra_in_sandbox,
        "timeout_seconds": STEP_TIMEOUT_S,
    },
}


class PrefectSteps:
    """The step runner of the flows: each step of `pipeline.solve_task` runs as a Prefect task of that name.

    What Prefect adds is only retries for infrastructure failures, a backstop timeout (the core's own limits plus
    a margin, so the core's clear result comes first), and the failure kind in the step's log.
    """

    def __init__(self, agent_settings: AgentSettings) -> None:
        self.agent_wall_s = agent_settings.max_wall_s
        self.retry_delays_s = retry_delays_s()

    def options(self, name: str) -> dict[str, Any]:
        """Prefect's options for step `name` (of its kind: an attempt's 'solve-attempt-2' is a 'solve'): its retries,
        and its backstop timeout (the core's own limit plus TIMEOUT_MARGIN_S; for solve the agent's wall-clock
        limit, and none when the run has none)."""
        options = dict(STEP_OPTIONS[step_kind(name)])
        limit = options["timeout_seconds"] or self.agent_wall_s
        options["timeout_seconds"] = None if limit is None else limit + TIMEOUT_MARGIN_S
        return options

    def __call__(self, name: str, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        options = self.options(name)
        tries = 0

        @functools.wraps(fn)  # Prefect binds the step's parameters by fn's signature
        def counted(*args: Any, **kwargs: Any) -> R:
            nonlocal tries
            tries += 1
            return fn(*args, **kwargs)

        # The task is named by the step's kind; an attempt's step runs under its own name ('solve-attempt-2').
        kind = step_kind(name)
        step: Task[..., R] = Task(
            counted, name=kind, task_run_name=None if name == kind else name,
            retry_delay_seconds=self.retry_delays_s, **options, **_STEP,
        )  # fmt: skip
        try:
            return step(*args, **kwargs)
        except InfraError as exc:
            # the step was this fault's retry layer: the grade says how often it tried
            if tries > 1 and exc.retried == 0:
                exc.retried = tries - 1
                exc.args = (f"{exc} (the {name} step tried {tries} times)",)
            raise


def log_event(event: AgentEvent) -> None:
    """The flows' `on_event`: one line in the solve step's log per agent event."""
    get_run_logger().info("%s", describe_event(event))


@task(name="upload", retries=0, timeout_seconds=600.0, **_STEP)
def upload(out_dir: Path, store: ArtifactStore, key: str, verdict: Grade) -> UploadResult:
    """Copy the run folder to the artifact store under SWEEP/TASK/MODEL/CONFIG, and link the patch from the
    Prefect UI (tasks/publish.py: a lasting link and the diff itself).

    Not retried: the store's own tries are the one retry layer of an S3 fault. The local run folder is only read,
    so when the store stays down after them the artifacts are still on this machine, and the StorageError says
    where (the flow keeps the folder with an upload-pending.json marker).
    """
    result = upload_run(store, out_dir, key)
    publish_patch(store, key, verdict, out_dir)
    return result


@task(
    name="push-branch",
    retries=2,
    retry_condition_fn=retry_on_infra,
    timeout_seconds=2 * branches.GIT_NETWORK_TIMEOUT_S + TIMEOUT_MARGIN_S,
    **_STEP,
)
def push_branch(
    out_dir: Path, spec: TaskSpec, verdict: Grade, sweep: str, settings: BranchSettings
) -> branches.PushedBranch:
    """Commit a resolved task's graded patch.diff (with its test patch) on its base commit and push it as a branch
    (bugsweep.branches); branch.json in the run folder says what was pushed, or why not.

    Retried like any step for an infrastructure failure (the git server or the network), never for a refused
    token or a branch that holds another commit. The token is the settings' own, handed on and never logged.
    """
    pushed = branches.push_run_folder(
        out_dir, spec, verdict, sweep=sweep, settings=settings, token=settings.token
    )
    get_run_logger().info("%s: %s", spec.instance_id, pushed.describe())
    return pushed


@task(
    name="list-tasks",
    retries=2,
    retry_condition_fn=retry_on_infra,
    timeout_seconds=2 * STEP_TIMEOUT_S + TIMEOUT_MARGIN_S,
    **_STEP,
)
def list_tasks(
    source: TaskFile | RepoBranch, provider: SandboxProvider, store: ArtifactStore, setup_network: bool = True
) -> list[TaskSpec]:
    """The sweep's tasks: read from a task file (local or s3://), or found by running a branch's tests."""
    return discover.list_tasks(source, provider, store, setup_network=setup_network, timeout=STEP_TIMEOUT_S)


@task(name="summarize", cache_policy=NO_CACHE, persist_result=False)
def summarize(
    sweep: str, rows: list[dict[str, Any]], location: str, review: ReviewPage | None = None,
    notes: list[str] | None = None,
) -> None:  # fmt: skip
    """A markdown summary and a table artifact for the sweep: task, model, resolved, turns, tokens, cost, time;
    `review`: its review page; `notes`: what else the sweep decided or could not do, one line each (tasks skipped
    as graded before, grades by another bugsweep, a review page not made)."""
    if not rows:
        extra = "".join(f"\n- {note}.\n" for note in notes or [])
        create_markdown_artifact(f"# Sweep `{sweep}`\n\nNo tasks.\n{extra}", key=artifact_key("sweep", sweep))
        return
    create_table_artifact(
        rows, key=artifact_key("sweep", sweep, "table"), description=f"Sweep {sweep}: every task."
    )
    create_markdown_artifact(
        summary_markdown(sweep, rows, location, review, notes), key=artifact_key("sweep", sweep)
    )


@task(name="review-page", cache_policy=NO_CACHE, persist_result=False, timeout_seconds=600.0)
def review_page(sweep: str, store: ArtifactStore) -> ReviewPage:
    """The sweep's review page, stored beside its runs and linked (tasks/publish.py). Fails (a failed step in the
    UI) when the page could not be made or stored; the sweep says so in its final state."""
    return publish_review(store, sweep)


# -- plain helpers ----------------------------------------------------------------------------------------------


def describe_event(event: AgentEvent) -> str:
    """One log line per agent event, like the command line's progress."""
    parts = [f"turn {event.turn}", event.kind]
    if event.tool:
        parts.append(event.tool)
    if event.short_arg:
        parts.append(event.short_arg)
    if event.exit_code is not None:
        parts.append(f"-> exit {event.exit_code}")
    if event.detail:
        parts.append(f"({event.detail})")
    parts.append(f"[{event.tokens} tokens]")
    return " ".join(parts)


#: The status of a summary row that is another configuration's grade of the task, found in the store.
OTHER_CONFIGURATION = "other configuration (graded before)"
#: The status of a summary row whose grade another bugsweep made, kept by choice (keep_graded_by_other_code).
KEPT_OTHER_CODE = "kept: graded by another bugsweep"


def summary_row(
    verdict: Grade, *, skipped: bool = False, uploaded_to: str | None = None, upload_failed: bool = False,
    reused: bool = False, other_configuration: bool = False, branch: str | None = None,
    branch_error: str | None = None, kept_other_code: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """One row of the sweep table. `ran` is False when the task has no grade (it could not be run, for any reason:
    an outage, configuration, a crash, or the task's own setup or tests), its result was not stored, or its
    resolved fix was not pushed as the branch asked for (`branch_error`; the grade stands)."""
    if other_configuration:
        status = OTHER_CONFIGURATION
    elif kept_other_code:
        status = KEPT_OTHER_CODE
    elif skipped:
        status = "skipped (graded before)"
    elif verdict.error:
        status = f"failed ({verdict.failure_kind})"
    elif upload_failed:
        status = "graded, upload failed"
    elif branch_error:
        status = "graded, branch not pushed"
    else:
        status = "graded earlier, uploaded now" if reused else "graded"
    return {
        "task": verdict.instance_id,
        "model": verdict.model,
        "policy": verdict.policy or "",
        "config": verdict.config_digest or "",
        "resolved": verdict.resolved,
        "turns": verdict.turns,
        "prompt_tokens": verdict.prompt_tokens,
        "completion_tokens": verdict.completion_tokens,
        "cost_usd": round(verdict.cost_usd, 6),
        "wall_s": round(verdict.wall_s, 1),
        "status": status,
        "ran": not verdict.error and not upload_failed and not branch_error,
        "reason": first_line(verdict.error)
        if verdict.error
        else ("upload failed" if upload_failed else first_line(branch_error) if branch_error else ""),
        "branch": branch or "",
        "artifacts": uploaded_to or "",
        "suspicious": "; ".join(verdict.suspicious[:3]),
        "held_for_review": verdict.held_for_review,
        "evidence": verdict.evidence,
        "attempts": resolved_at(verdict),
    }


def _md_code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


def counts(rows: list[dict[str, Any]]) -> str:
    """'3 resolved, 1 not resolved, 1 held for review, 2 could not run' for a sweep's own rows."""
    ran = [r for r in rows if r["ran"]]
    resolved = sum(1 for r in ran if r["resolved"])
    held = sum(1 for r in ran if not r["resolved"] and r.get("held_for_review"))
    return (
        f"{resolved} resolved, {len(ran) - resolved - held} not resolved, {held} held for review, "
        f"{len(rows) - len(ran)} could not run"
    )


def sweep_outcome(rows: list[dict[str, Any]]) -> str:
    """The sentence that says how a sweep ended, for its summary, its final state and the command line: COMPLETED
    only when every task was graded and stored; each task that was not, and why."""
    not_run = [r for r in rows if not r["ran"]]
    if not not_run:
        return f"COMPLETED: {len(rows)} task(s) graded: {counts(rows)}"
    names = "; ".join(f"{r['task']}: {r['status']}{': ' + r['reason'] if r.get('reason') else ''}"
                      for r in not_run[:5])  # fmt: skip
    more = f"; and {len(not_run) - 5} more" if len(not_run) > 5 else ""
    return f"FAILED: {len(not_run)} of {len(rows)} task(s) could not be run or stored ({counts(rows)}). {names}{more}"


def _cell(row: dict[str, Any]) -> str:
    """The resolved column: yes (on the exit code only; at which attempt, where a task had more than one), held
    for review, or no."""
    if row["resolved"]:
        at = f" ({row['attempts']})" if row.get("attempts") else ""
        return (
            "yes (exit code only)" if str(row.get("evidence") or "").startswith("exit code") else "yes"
        ) + at
    return "held for review" if row.get("held_for_review") else "no"


def summary_markdown(
    sweep: str, rows: list[dict[str, Any]], location: str, review: ReviewPage | None = None,
    notes: list[str] | None = None,
) -> str:  # fmt: skip
    """The sweep's own configuration's rows are counted; other configurations' grades of the same tasks are listed
    below them, side by side, and counted per configuration. `review`: the sweep's review page; `notes`: lines
    said under the totals (tasks skipped as graded before, grades made by another bugsweep: run again or kept by
    choice, a review page that could not be made)."""
    own = [r for r in rows if r["status"] != OTHER_CONFIGURATION]
    resolved = sum(1 for r in own if r["resolved"])
    failed = [r for r in own if r["status"].startswith("failed")]
    tokens = sum(r["prompt_tokens"] + r["completion_tokens"] for r in own)
    cost = sum(r["cost_usd"] for r in own)
    configs = sorted({(r["config"], r["policy"]) for r in own})
    lines = [
        f"# Sweep `{sweep}`",
        "",
        f"**{sweep_outcome(own)}**",
        "",
        f"**{resolved} of {len(own)}** tasks resolved; {len(failed)} could not be run; "
        f"{tokens:,} tokens; ${cost:.4f}. Configuration: "
        + (", ".join(f"`{c or '-'}` (policy {p or '-'})" for c, p in configs) or "-")
        + f". Artifacts: `{location}`."
        + (f" {review.markdown()} Every task's evidence, diff and timeline." if review else ""),
        *(["", *[f"- {note}." for note in notes]] if notes else []),
        "",
        "| task | model | policy | config | resolved | turns | tokens | cost (USD) | time (s) | status |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    flagged = [r for r in rows if r.get("suspicious")]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['model']} | {r['policy'] or '-'} | {r['config'] or '-'} | "
            f"{_cell(r)} | {r['turns']} | {r['prompt_tokens'] + r['completion_tokens']} | "
            f"{r['cost_usd']:.4f} | {r['wall_s']:.1f} | {r['status']} |"
        )
    by_config: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_config.setdefault(f"`{r['config'] or '-'}` (policy {r['policy'] or '-'})", []).append(r)
    if len(by_config) > 1:
        lines += ["", "**By configuration** (the store's grades of these tasks for this model):", ""]
        lines += [
            f"- {c}: {sum(1 for r in rs if r['resolved'])} of {len(rs)} resolved"
            for c, rs in by_config.items()
        ]
    pushed = [r for r in own if r.get("branch")]
    if pushed:
        lines += ["", "**Branches** (each resolved fix, with the task's test patch, on its base commit):", ""]
        lines += [f"- {r['task']}: {_md_code(r['branch'])}" for r in pushed]
    not_run = [r for r in own if not r["ran"]]
    if not_run:
        lines += ["", "**Could not be run or stored** (no grade: the sweep is FAILED until they are):", ""]
        lines += [f"- {r['task']} ({r['status']}): {_md_code(r.get('reason') or '-')}" for r in not_run]
    if flagged:
        lines += [
            "",
            "**Suspicious** (signals tests cannot judge: a run whose tests pass with them is held for review and "
            "counted as not resolved; read the patch):",
            "",
        ]
        lines += [f"- {r['task']} ({r['model']}): {r['suspicious']}" for r in flagged]
    return "\n".join(lines) + "\n"
