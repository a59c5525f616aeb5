"""One task end to end, as plain functions: prepare -> setup -> baseline -> solve -> regrade -> write_run_dir.

`solve_task` is the only place that orders these steps, for the command line and the Prefect flows alike. It takes
a step runner: by default each step is a plain call; the Prefect layer (tasks.steps.PrefectSteps) runs each step
as a Prefect task, with its own retries, timeout and hooks. Either way the grade comes from the same code.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from bugsweep.attempts import AttemptSteps, Cascade
from bugsweep.errors import (
    InfraError,
    NotARealTask,
    SandboxGone,
    TaskError,
    TestCommandCannotRun,
    describe,
    failure_kind,
    setup_failed,
)
from bugsweep.grading import cleanroom
from bugsweep.grading.regrade import regrade_change
from bugsweep.grading.runs import TestRun, commit_task_state, run_tests, why_cannot_run
from bugsweep.grading.verdict import Grade
from bugsweep.runconfig import RunConfig
from bugsweep.rundir import write_run_dir
from bugsweep.sandbox.base import (
    Environment,
    RepoSource,
    Sandbox,
    SandboxProvider,
    SandboxSnapshot,
    SandboxUsage,
)
from bugsweep.settings import AgentSettings, ModelSettings
from bugsweep.spec import TaskSpec

#: Seconds a setup or a test run (before or after the agent) may take: the core's own limit, over which the
#: flows' steps add only a backstop (tasks.steps).
STEP_TIMEOUT_S = 1800.0

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentEvent, AgentProgress, AgentResult
    from bugsweep.agent.model import ChatModel

log = logging.getLogger(__name__)

R = TypeVar("R")


@dataclass
class PreparedTask:
    """A task whose sandbox exists and holds the repository in its task state."""

    spec: TaskSpec
    sandbox: Sandbox
    task_state: str
    """The git commit (inside the sandbox) that records exactly what the agent is given."""
    started: float = field(default_factory=time.monotonic)
    setup_log: str = ""
    provider: SandboxProvider | None = None
    """Where the sandbox came from: the regrade's fresh sandbox comes from the same provider."""
    labels: dict[str, str] = field(default_factory=dict)
    setup_network: bool = True
    snapshot: cleanroom.Snapshot | None = None
    """The task state as read from outside the sandbox (after setup): what the agent's change is measured against."""
    environment: Environment | None = None
    """The task's environment after the setup step (recorded in grade.json, listed in environment.txt)."""
    task_layer: SandboxSnapshot | None = None
    """The sandbox's task state after setup as a read-only layer (Sandbox.snapshot): the regrade's fresh sandbox is
    made on it, so nothing is installed again."""
    mirror_run: TestRun | None = None
    """The regrade's mirror run (bugsweep.grading.mirror), once it ran: its log goes beside the others."""


def prepare(
    spec: TaskSpec, provider: SandboxProvider, labels: dict[str, str] | None = None, *, record: bool = True
) -> PreparedTask:
    """Create the sandbox, apply the task's test patch, and record the task state (a git commit inside, for the
    agent's own `git diff`, and a snapshot read from outside, for the grader). `record=False` skips both (the
    regrade's fresh sandbox). Releases the sandbox on failure."""
    started = time.monotonic()
    options: dict[str, Any] = (
        {"disk_mib": spec.disk_mib} if spec.disk_mib else {}
    )  # only where set: providers
    if spec.python:  # without quotas or interpreter choice need not know them
        options["python"] = spec.python
    sandbox = provider.create(RepoSource(spec.repo, spec.base_commit), labels=labels, **options)
    try:
        if spec.test_patch:
            # Through stdin: no temp file, so no backend's file-size or path rules apply.
            applied = sandbox.exec("git apply --whitespace=nowarn -", timeout=120, stdin=spec.test_patch)
            if not applied.ok:
                raise TaskError(
                    f"the task's test_patch does not apply at {spec.base_commit}: {applied.output.strip()[-800:]}"
                )
        prepared = PreparedTask(
            spec=spec,
            sandbox=sandbox,
            task_state="",
            started=started,
            provider=provider,
            labels=dict(labels or {}),
        )
        if record:
            prepared.task_state = commit_task_state(sandbox)
            prepared.snapshot = read_task_state(sandbox)
    except BaseException:
        sandbox.release()
        raise
    return prepared


def read_task_state(
    sandbox: Sandbox, previous: cleanroom.Snapshot | None = None
) -> cleanroom.Snapshot | None:
    """The repository as read from outside the sandbox, or None where the backend gives no such access."""
    tree = cleanroom.tree_access(sandbox)
    if tree is None:
        return None
    try:
        return tree.read_tree(previous)
    except cleanroom.ChangeRefused as exc:
        raise TaskError(f"the task state cannot be read: {exc}") from None


def setup(prepared: PreparedTask, timeout: float = STEP_TIMEOUT_S, network: bool = True) -> None:
    """Build the task's environment: run the setup command (with network, if allowed) in the sandbox's task
    environment, or reuse a finished one with the same key (the sandbox backend decides; the log says which), then
    record the task state again, and keep it as a read-only layer (`task_layer`) for the regrade's fresh sandbox.

    Files the setup creates (build output, egg-info) become part of the task state, so they never show up in the
    agent's patch.
    """
    prepared.setup_network = network
    command = prepared.spec.setup_command
    result, prepared.environment = prepared.sandbox.setup_environment(
        command, timeout=timeout, network=network
    )
    if result is not None:
        prepared.setup_log = result.output
        if not result.ok:
            why = "timed out" if result.timed_out else f"exited with {result.exit_code}"
            raise setup_failed(command, why, result.output)
    elif prepared.environment.reused:
        prepared.setup_log = (
            f"$ {command}\n# not run: reused the finished task environment {prepared.environment.key} "
            "(same dependency files, setup command, interpreter and installer)\n"
        )
        log.info("setup: reused the task environment %s; no install ran", prepared.environment.key)
    if prepared.snapshot is None and not prepared.task_state:
        return  # the regrade's fresh sandbox: nothing to record
    if command:
        prepared.task_state = commit_task_state(prepared.sandbox, "bugsweep: task state after setup")
    prepared.task_layer = prepared.sandbox.snapshot()
    # read again after the snapshot: the files are the same, but their stat data (what the reader's cache keys on)
    # is that of the new mount
    prepared.snapshot = read_task_state(prepared.sandbox, prepared.snapshot)


def baseline(
    prepared: PreparedTask, timeout: float = STEP_TIMEOUT_S, per_test_timeout: float | None = None
) -> TestRun:
    """Run the tests before the agent starts. They must fail, or there is no bug to fix; and they must run, or a
    failure says nothing (TestCommandCannotRun: the program is missing, pytest found no test or was misused)."""
    before = run_tests(
        prepared.sandbox, prepared.spec.test_command, timeout=timeout, per_test_timeout=per_test_timeout
    )
    why = why_cannot_run(before)
    if why:
        tail = before.log.strip()[-1500:]
        raise TestCommandCannotRun(
            f"the test command {prepared.spec.test_command!r} cannot run: {why}. Nothing was tested, so there is "
            "no failure to fix: check --test-command (or test_command in tasks.jsonl) and that the setup command "
            f"installs what it needs.\n{tail}"
        )
    if before.passed:
        raise NotARealTask(
            f"the tests already pass before any change ({prepared.spec.test_command!r} exited 0), so there is no bug "
            "to fix: check --test-command, or point --ref at the commit that has the bug"
        )
    return before


def solve(
    prepared: PreparedTask,
    model: ChatModel,
    agent_settings: AgentSettings,
    *,
    on_event: Callable[[AgentEvent], None] | None = None,
    out_dir: Path | None = None,
    progress: AgentProgress | None = None,
    config: RunConfig | None = None,
    attempt: int | None = None,
) -> AgentResult:
    """Run the agent loop on the task in the prepared sandbox; `progress` keeps what it used if it is cut short;
    `config` is recorded in the trajectory, with the attempt's number and temperature in a run of more than one."""
    from bugsweep.agent.loop import run_agent

    meta: dict[str, Any] = (
        {"config_digest": config.digest, "config": config.model_dump(mode="json")} if config else {}
    )
    if attempt is not None:
        meta.update(attempt=attempt, temperature=model.settings.temperature)
    return run_agent(
        task=prepared.spec.problem_statement,
        sandbox=prepared.sandbox,
        model=model,
        settings=agent_settings,
        on_event=on_event,
        trajectory_path=(out_dir / "trajectory.json") if out_dir else None,
        test_command=prepared.spec.test_command,
        protected_paths=prepared.spec.test_files,
        progress=progress,
        meta=meta or None,
    )


def regrade(
    prepared: PreparedTask,
    before: TestRun,
    agent_result: AgentResult | None,
    *,
    model_name: str = "",
    agent_settings: AgentSettings | None = None,
    timeout: float = STEP_TIMEOUT_S,
) -> tuple[Grade, TestRun | None, str]:
    """Grade the agent's change in a clean room (bugsweep.grading.regrade). Returns (grade, after-run, patch.diff).

    The change is read from outside the agent's sandbox (bugsweep.grading.cleanroom): its repository tree against
    the task state's snapshot; nothing of the agent's .git, $HOME, /tmp or caches is part of it. It is graded in
    fresh sandboxes in the task state (`fresh_sandbox`): protected changes dropped, the tests run as the mirror pair
    where they can be, the verdict read from outside. A change that cannot be read or applied (too many or too big
    files, a path that cannot be written) is the model's unresolved attempt, with the reason in the grade; the
    after-run is then None. The mirror run is kept on `prepared.mirror_run` (tests_mirror.log).
    """
    settings = agent_settings or AgentSettings()
    spec = prepared.spec
    after: TestRun | None = None
    patch = ""
    measured: list[Sandbox] = [prepared.sandbox]  # whose resource use the grade records
    try:
        changes, new = read_change(prepared)
        regraded = regrade_change(
            spec,
            task_paths=frozenset(prepared.snapshot.entries if prepared.snapshot else ()),
            changes=changes,
            new=new,
            before=before,
            make_sandbox=lambda: fresh_sandbox(prepared),
            protected_globs=settings.protected_globs,
            per_test_timeout=settings.per_test_timeout_s,
            timeout=timeout,
            measured=measured,
        )
        verdict, after, patch = regraded.grade, regraded.after, regraded.patch
        prepared.mirror_run = regraded.mirror
    except cleanroom.ChangeRefused as exc:
        verdict = Grade(
            instance_id=spec.instance_id,
            failed_before=not before.passed,
            tests_untouched=False,
            reason=f"the change could not be graded: {exc}",
            evidence="none: the change could not be read or applied",
        )
    verdict.model = model_name
    if agent_result is not None:
        verdict.stop_reason = agent_result.stop_reason
        verdict.policy = agent_result.policy
        verdict.summary = agent_result.summary
        verdict.turns = agent_result.turns
        verdict.prompt_tokens = agent_result.usage.prompt_tokens
        verdict.completion_tokens = agent_result.usage.completion_tokens
        verdict.cached_tokens = agent_result.usage.cached_tokens
        verdict.cost_usd = agent_result.cost_usd
        verdict.agent_wall_s = agent_result.wall_s
    verdict.sandbox_cost_usd = sandbox_cost(prepared.sandbox)
    record_resources(verdict, *measured)
    verdict.wall_s = time.monotonic() - prepared.started
    return verdict, after, patch


def read_change(prepared: PreparedTask) -> tuple[list[cleanroom.Change], dict[str, bytes]]:
    """The agent's change, read from outside its sandbox: every changed path, and the new bytes of each path that
    is added or modified. Raises ChangeRefused (the model's failure) when the tree cannot be read."""
    tree = cleanroom.tree_access(prepared.sandbox)
    if tree is None or prepared.snapshot is None:
        raise InfraError(
            f"the {getattr(prepared.provider, 'name', '?')} sandbox gives no access to its files from outside, "
            "so its change cannot be graded"
        )
    root = cleanroom.host_repo_dir(prepared.sandbox)
    if root is not None and not root.is_dir():
        raise SandboxGone(f"sandbox {prepared.sandbox.id}: its repository {root} is gone")
    after = tree.read_tree(prepared.snapshot)
    changes = cleanroom.diff(prepared.snapshot, after)
    new = {c.path: tree.read(c.path, c.new) for c in changes if c.new}
    return changes, new


def fresh_sandbox(prepared: PreparedTask) -> Sandbox:
    """A new sandbox in the task state, for the regrade: nothing in it was written by the agent.

    It is made on the task state kept by `setup` (`task_layer`: the repository and the task environment after
    setup, read-only); without one, the task state is made again from the same source (the repository at the same
    ref, the test patch) and the setup runs again (its environment layer is reused where the backend keeps them)."""
    if prepared.provider is None:
        raise InfraError(
            "the task was prepared without a provider, so no fresh sandbox can be made for the regrade"
        )
    if prepared.task_layer is not None:  # the task state after setup, kept read-only: nothing runs again
        return prepared.provider.create_from(
            prepared.task_layer, labels={**prepared.labels, "role": "regrade"}
        )
    fresh = prepare(
        prepared.spec, prepared.provider, labels={**prepared.labels, "role": "regrade"}, record=False
    )
    try:
        if prepared.spec.setup_command:
            setup(fresh, network=prepared.setup_network)
    except BaseException:
        fresh.sandbox.release()
        raise
    return fresh.sandbox


def sandbox_cost(sandbox: Sandbox) -> float | None:
    """The sandbox's cost where its backend bills for it (Runtime); None for the local sandbox."""
    cost = getattr(sandbox, "cost_usd", None)
    try:
        return float(cost()) if callable(cost) else None
    except Exception:  # a cost estimate must never sink a grade
        log.warning("could not compute the sandbox cost", exc_info=True)
        return None


def record_resources(verdict: Grade, *sandboxes: Sandbox) -> None:
    """Put the run's resource use into the grade, where the sandboxes' backend measures it: the highest peak memory
    and peak disk of `sandboxes` (the agent's, the regrade's), their CPU seconds added up."""
    usages = [u for u in (getattr(s, "usage", None) for s in sandboxes) if isinstance(u, SandboxUsage)]
    mib = 1024 * 1024

    def peak(values: list[int | None]) -> float | None:
        present = [v for v in values if v is not None]
        return round(max(present) / mib, 1) if present else None

    cpu = [u.cpu_s for u in usages if u.cpu_s is not None]
    verdict.peak_memory_mib = peak([u.peak_memory_bytes for u in usages])
    verdict.cpu_s = round(sum(cpu), 2) if cpu else None
    verdict.peak_disk_mib = peak([u.peak_disk_bytes for u in usages])
    verdict.disk_quota_mib = peak([u.disk_quota_bytes for u in usages])


class StepRunner(Protocol):
    """Runs one named step of a task: `runner(name, fn, *args, **kwargs)` returns `fn(*args, **kwargs)`.

    The names are 'setup', 'baseline', 'solve' and 'regrade', and 'sandbox' (an attempt's own sandbox); in a run
    of more than one attempt an attempt's steps carry its number ('solve-attempt-2': bugsweep.attempts.step_name). A
    runner may retry a step after an infrastructure failure no layer below retried ('setup' and 'sandbox' make a
    new sandbox; never 'solve', which would pay again for the turns made), time it out, or record it, but never
    changes its result.
    """

    def __call__(self, name: str, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R: ...


def call_step(name: str, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """The default step runner: a plain call."""
    return fn(*args, **kwargs)


def ready_sandbox(
    spec: TaskSpec,
    provider: SandboxProvider,
    labels: dict[str, str] | None = None,
    setup_network: bool = True,
) -> PreparedTask:
    """The 'setup' step: a sandbox with the repository in its task state, after the setup command.

    The sandbox is released when anything fails, so running the step again starts over with a new one.
    """
    prepared = prepare(spec, provider, labels=labels)
    try:
        setup(prepared, network=setup_network)
    except BaseException:
        prepared.sandbox.release()
        raise
    return prepared


def reset_workspace(prepared: PreparedTask) -> None:
    """Put the repository back to the task state (a solve that runs again must not start from half an attempt)."""
    result = prepared.sandbox.exec(
        f"git reset -q --hard {prepared.task_state} && git clean -qfd", timeout=120
    )
    if not result.ok:
        raise InfraError(f"could not reset the workspace to the task state: {result.output.strip()[-500:]}")


def solve_from_task_state(
    prepared: PreparedTask,
    model_settings: ModelSettings,
    agent_settings: AgentSettings,
    on_event: Callable[[AgentEvent], None] | None = None,
    out_dir: Path | None = None,
    progress: AgentProgress | None = None,
    config: RunConfig | None = None,
    attempt: int | None = None,
) -> AgentResult:
    """The 'solve' step: the agent loop, from the task state. Never run again by a step runner (it would pay again
    for every turn made): a model endpoint outage is retried inside the turn by the model client. `attempt`: its
    number in a run of more than one."""
    from bugsweep.agent.model import ChatModel

    reset_workspace(prepared)
    model = ChatModel(model_settings)
    return solve(
        prepared, model, agent_settings, on_event=on_event, out_dir=out_dir, progress=progress, config=config,
        attempt=attempt,
    )  # fmt: skip


def failed_grade(
    spec: TaskSpec, model: str, exc: BaseException, *, failed_before: bool = False, started: float
) -> Grade:
    """The grade of a task that could not be run: why, which kind of failure it was, and how long it took."""
    return Grade(
        instance_id=spec.instance_id,
        model=model,
        failed_before=failed_before,
        error=describe(exc),
        failure_kind=failure_kind(exc),
        wall_s=time.monotonic() - started,
    )


def solve_task(
    spec: TaskSpec,
    *,
    provider: SandboxProvider,
    model_settings: ModelSettings,
    agent_settings: AgentSettings | None = None,
    out_dir: Path,
    on_event: Callable[[AgentEvent], None] | None = None,
    on_step: Callable[[str, dict[str, Any]], None] | None = None,
    on_sandbox: Callable[[Sandbox], None] | None = None,
    labels: dict[str, str] | None = None,
    setup_network: bool = True,
    runner: StepRunner = call_step,
    raise_on_failure: bool = True,
    config: RunConfig | None = None,
    escalate_to: Sequence[ModelSettings] = (),
) -> Grade:
    """Everything for one task, writing `out_dir`: the one path of a task, for the CLI and the flows.

    The setup and the baseline run once; then up to `agent_settings.attempts` attempts with `model_settings`, then
    as many with each model of `escalate_to` in order (bugsweep.attempts: a model's first attempt at its own
    temperature, the later ones at `retry_temperature`), each an agent run in its own sandbox from the task state
    after setup (the first in the setup's own sandbox), each graded by the clean room; the first attempt the clean
    room resolves ends the task. The grade records every attempt and keeps the resolved one (else none); its
    verdict is the kept attempt's, or the last attempt's.

    Returns the Grade (resolved or not). When the task cannot be run (config, infra or task error, a crash),
    grade.json is still written with `error` and `failure_kind`, and with what the attempts made so far used; then
    the exception is raised again for the caller to report, or, with `raise_on_failure=False`, that failed Grade is
    returned. An interrupt is always raised. `on_sandbox` is told of every sandbox an attempt runs in as soon as it
    exists (the flows track them for their crash hooks); every sandbox is released before this returns. `config`
    (what made the run) goes into grade.json and the trajectories.
    """
    from bugsweep.agent.model import ChatModel

    agent_settings = agent_settings or AgentSettings()
    attempts = Cascade.start([model_settings, *escalate_to], agent_settings, out_dir)
    step = on_step or (lambda name, info: None)
    started = time.monotonic()
    prepared: PreparedTask | None = None
    before: TestRun | None = None
    try:
        # The endpoints first: a wrong URL, key or model name fails in seconds, not after an install.
        for endpoint in [model_settings, *escalate_to]:
            step("model", {"model": endpoint.model, "base_url": endpoint.base_url})
            ChatModel(endpoint).check()
        step("sandbox", {"backend": getattr(provider, "name", "?")})
        if spec.setup_command:
            step("setup", {"command": spec.setup_command})
        prepared = runner("setup", ready_sandbox, spec, provider, labels, setup_network)
        if on_sandbox is not None:
            on_sandbox(prepared.sandbox)
        step("baseline", {"command": spec.test_command})
        before = runner("baseline", baseline, prepared, per_test_timeout=agent_settings.per_test_timeout_s)
        steps = AttemptSteps(
            solve=solve_from_task_state, regrade=regrade, runner=runner, step=step, on_event=on_event,
            on_sandbox=on_sandbox, config=config,
        )  # fmt: skip
        attempts.run(prepared, before, agent_settings, steps)
        verdict, chosen = attempts.result(model=model_settings.model)
        verdict.wall_s = time.monotonic() - started
        write_run_dir(
            out_dir, verdict, patch=chosen.patch, before=before, after=chosen.after, mirror=chosen.mirror,
            setup_log=prepared.setup_log, spec=spec, environment=prepared.environment, config=config,
        )  # fmt: skip
        return verdict
    except BaseException as exc:
        failed = failed_grade(
            spec, model_settings.model, exc, failed_before=before is not None, started=started
        )
        failed = attempts.cut_short_grade(failed, exc)
        if prepared is not None:
            record_resources(failed, prepared.sandbox)
        write_run_dir(
            out_dir, failed, before=before, setup_log=prepared.setup_log if prepared else None, spec=spec,
            environment=prepared.environment if prepared else None, config=config,
        )  # fmt: skip
        if raise_on_failure or not isinstance(exc, Exception):
            raise
        crash = failed.failure_kind == "crash"
        log.warning(
            "%s could not be run (%s): %s",
            spec.instance_id,
            failed.failure_kind,
            failed.error,
            exc_info=crash,
        )
        return failed
    finally:
        if prepared is not None:
            prepared.sandbox.release()
