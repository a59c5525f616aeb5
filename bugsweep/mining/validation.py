"""Validating a candidate: its tests run in sandboxes prepared exactly as a sweep prepares a task."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bugsweep.errors import BugsweepError, ConfigError, SetupFailed
from bugsweep.grading.runs import TestRun, missing_module, run_tests, why_cannot_run
from bugsweep.mining.building import (
    USES_2TO3_REFUSED,
    adapted_setup,
    dated_setup,
    project_extras,
    unavailable_pins,
)
from bugsweep.mining.extras import extras_providing, with_extras
from bugsweep.mining.interpreters import newer_python, older_python
from bugsweep.mining.records import Commit, RejectReason
from bugsweep.mining.verdict import (
    Verdict,
    _all_ids,
    _is_collection_error,
    _outcomes,
    _stable,
    allow_warnings,
    deselect,
    disable_plugins,
    ignore,
    judge,
    pytest_warnings_as_errors,
    refused_plugins,
    setup_cfg_refused,
    without_ini,
)
from bugsweep.sandbox.base import Sandbox, SandboxProvider
from bugsweep.spec import TaskSpec


class CommandNotFound(ConfigError):
    """The test or setup command cannot run at all: the shell did not find it or cannot run it (exit 127 or 126),
    or the module its `python -m` names is not in the task's environment (a test runner the setup did not install,
    a misspelt name). Every candidate would fail the same way, so mining stops at the first one instead of
    rejecting the history one candidate at a time."""


class Stopper:
    """The sandboxes of the validations in flight, so that a stopped run (Ctrl-C, a missing command) releases them
    at once instead of waiting for their tests to finish. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sandboxes: dict[int, Sandbox] = {}
        self.stopped = False

    def track(self, sandbox: Sandbox) -> None:
        with self._lock:
            if not self.stopped:
                self._sandboxes[id(sandbox)] = sandbox
                return
        sandbox.release()
        raise MiningStopped("mining was stopped")

    def untrack(self, sandbox: Sandbox) -> None:
        with self._lock:
            self._sandboxes.pop(id(sandbox), None)

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            sandboxes, self._sandboxes = list(self._sandboxes.values()), {}
        for sandbox in sandboxes:
            sandbox.release()  # never raises; the command running in it returns with SandboxGone


class CannotRun(BugsweepError):
    """The tests of one candidate test nothing (no module, pytest usage error, no test collected)."""


class MiningStopped(BugsweepError):
    """A validation cut short because the run was stopped; its candidate is reported as unfinished, not judged."""


def _run_state(
    spec: TaskSpec,
    provider: SandboxProvider,
    runs: int,
    *,
    keep_going: Callable[[list[TestRun]], bool],
    timeout: float,
    setup_timeout: float,
    per_test_timeout: float | None = None,
    stopper: Stopper | None = None,
    environments: list[str] | None = None,
) -> list[TestRun]:
    """Prepare a sandbox exactly as a sweep would (pipeline.prepare + setup), then run the tests up to `runs` times.
    How its task environment came about ('built', 'reused', 'no setup') is appended to `environments`."""
    from bugsweep.pipeline import prepare, setup

    prepared = prepare(spec, provider, labels={"purpose": "mining", "task": spec.instance_id})
    try:
        if stopper is not None:
            stopper.track(prepared.sandbox)
        try:
            setup(prepared, timeout=setup_timeout)
        except SetupFailed as exc:
            first = str(exc).splitlines()[0]
            if "exited with 127" in first or "exited with 126" in first:
                code = "127: not found" if "127" in first else "126: cannot be executed"
                raise CommandNotFound(
                    f"the setup command {spec.setup_command!r} cannot run in the sandbox (exit {code}): "
                    f"{_last_line(prepared.setup_log)}; give --setup-command"
                ) from None
            raise
        if environments is not None and prepared.environment is not None:
            env = prepared.environment
            environments.append("no setup" if not spec.setup_command else "reused" if env.reused else "built")
        results: list[TestRun] = []
        for _ in range(runs):
            run = run_tests(
                prepared.sandbox, spec.test_command, timeout=timeout, per_test_timeout=per_test_timeout
            )
            why = why_cannot_run(run)
            if run.exit_code in (126, 127):
                raise CommandNotFound(
                    f"the test command {spec.test_command!r} cannot run in the sandbox: {why}: "
                    f"{_last_line(run.log)}; give --test-command (and --setup-command to install it)"
                )
            module = missing_module(run)
            if module is not None:
                made_by = (
                    f"setup command {spec.setup_command!r}" if spec.setup_command else "no setup command"
                )
                raise CommandNotFound(
                    f"the test command {spec.test_command!r} cannot run in the sandbox: the task's environment has "
                    f"no module {module} ({made_by}): install it with --setup-command, or give --test-command"
                )
            if why:
                raise CannotRun(f"{why}: {_last_line(run.log)}")
            results.append(run)
            if not keep_going(results):
                break
        if stopper is not None and stopper.stopped:
            raise MiningStopped("mining was stopped")
        return results
    finally:
        if stopper is not None:
            stopper.untrack(prepared.sandbox)
        prepared.sandbox.release()


_INTERRUPTED = re.compile(r"^!+ Interrupted: \d+ errors? during collection !+$", re.M)
_CHANGED = re.compile(r"^diff --git a/(\S+) b/", re.M)


def uncollectable(runs: Sequence[TestRun], spec: TaskSpec) -> list[str]:
    """The test modules other than the commit's own test files whose collection errors stopped pytest before any
    test ran, in every run (pytest stops a session at collection errors): none where a run ran a test. (A module of
    the commit's own that fails to collect at the task state, importing a name the fix adds, is a failing test.)"""
    own = set(_CHANGED.findall(spec.test_patch or ""))
    modules: set[str] = set()
    for run in runs:
        if run.runner != "pytest" or run.tests is None or not _INTERRUPTED.search(run.log[-4096:]):
            return []
        if not run.tests or not all(_is_collection_error(t) for t in run.tests):
            return []
        modules |= {t.partition("::")[0] for t in run.tests}
    return sorted(modules - own)


#: The installers' error lines (pip's "ERROR: ...", uv's "error: ..." and those it opens with a cross mark, U+00D7),
#: and what they point to on the next line ("╰─> typed-ast").
_INSTALL_ERROR = re.compile(r"^\s*(ERROR:|error:|\u00d7)\s*(.+)$")
_POINTED = re.compile(r"^\s*(╰─[>▶]|├─[>▶])\s*(.+)$")


def setup_error(output: str) -> str:
    """What a failed setup says went wrong: the last error line of its installer, with the line it points to
    ("ERROR: Failed to build installable wheels for some pyproject.toml based projects: typed-ast"), else its
    last line (a bare "╰─> typed-ast" or "hint: See above for details." said little)."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if found := _INSTALL_ERROR.match(lines[i]):
            said = f"{found[1]} {found[2].strip()}" if found[1].endswith(":") else found[2].strip()
            pointed = _POINTED.match(lines[i + 1]) if i + 1 < len(lines) else None
            return (f"{said.rstrip(':')}: {pointed[2].strip()}" if pointed else said)[:300]
    return lines[-1][:300] if lines else "no output"


def _last_line(log: str) -> str:
    lines = [line.strip() for line in log.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def validate(
    spec: TaskSpec,
    provider: SandboxProvider,
    *,
    runs: int = 3,
    timeout: float = 900.0,
    setup_timeout: float = 1800.0,
    per_test_timeout: float | None = None,
    stopper: Stopper | None = None,
) -> Verdict:
    """Run the tests `runs` times at the task state and, if some fail there, `runs` times at the fix commit.

    `timeout` bounds each whole test run, `per_test_timeout` each test in it (a test still running then fails, and
    the run goes on: a fix of an endless loop is a task). The verdict says how each state's task environment came
    about (`environments`). Raises CommandNotFound when the test or setup command cannot run at all (exit 127,
    or `python -m` of a module the environment lacks), and MiningStopped when `stopper` was stopped meanwhile (the
    verdict would be about a killed sandbox, not about the commit).
    """
    environments: list[str] = []
    verdict = _validate(spec, provider, runs, timeout, setup_timeout, per_test_timeout, stopper, environments)
    verdict.environments = environments
    return verdict


#: Rejections that the environment of the commit's time can undo (another Python, the releases of its date): its
#: environment could not be made, or its tests not imported, on the running Python with today's releases.
ENVIRONMENT_FAILURES = (
    RejectReason.SETUP_FAILED,
    RejectReason.TESTS_CANNOT_RUN,
    RejectReason.TESTS_FAIL_AT_FIX,
)


def validate_on_its_python(
    spec: TaskSpec,
    provider: SandboxProvider,
    commit: Commit,
    *,
    repo: Path,
    older: bool = True,
    **options: Any,
) -> Verdict:
    """`validate`, and for a commit whose environment failed on the running Python (setup failed, the tests could
    not run or failed at the fix), `validate` again: with the project's extras that install a module its tests
    could not import (bugsweep.mining.extras), then (`older`) in the environment of its time: on its Python (the
    older interpreter of this machine that `older_python` picks for a commit older than the running Python, else
    the newer one `newer_python` picks for a commit whose package requires a newer Python), then, failing there
    too, on that Python (or the running one where there is none) with only the releases of the commit's time
    (`dated_setup`). The first of them whose environment works decides (a commit whose tests pass at its parent
    once its extras are installed is no task), and kept there, the verdict names it (`extras`, `python`,
    `dated`). Other Pythons and dates only with the local sandbox (a Runtime sandbox's interpreters and installer
    are the image's)."""
    command, setup = spec.test_command, spec.setup_command  # as given: `validate` may add to both
    verdict = validate(spec, provider, **options)
    if verdict.reason not in ENVIRONMENT_FAILURES:
        return verdict
    attempts: list[tuple[str | None, str | None, str]] = []  # (Python, setup, the commit's time or "")
    extras = extras_providing(project_extras(repo, commit.sha), verdict.missing_modules) if setup else []
    if setup and extras:
        setup = with_extras(setup, extras)
        attempts.append((spec.python, setup, ""))
    if older and not spec.python and provider.name == "local":
        python = older_python(repo, commit.sha, commit.date) or newer_python(repo, commit.sha)
        attempts += [(python, setup, "")] if python else []
        attempts += [(python, dated_setup(setup, commit.date), commit.date)] if setup else []
    for python, setup_command, dated in attempts:
        update = {"python": python, "test_command": command, "setup_command": setup_command}
        try:
            again = validate(spec.model_copy(update=update), provider, **options)
        except CommandNotFound as exc:  # its commands do not run there: the first verdict stands
            again = Verdict(RejectReason.TESTS_CANNOT_RUN, str(exc))
        where = f"on {python or 'this Python'}" + (f" with the releases of {dated[:10]}" if dated else "")
        where += f" with the extras {', '.join(extras)}" if extras else ""
        if again.reason not in ENVIRONMENT_FAILURES:  # its environment worked there: that verdict decides
            again.python = python if python != spec.python else None
            again.dated, again.extras = dated, extras
            again.environments = [*verdict.environments, *again.environments]
            if again.reason is not None:
                first = f"{verdict.reason.value}: {verdict.detail[:200]}" if verdict.reason else ""
                again.detail = f"{where}: {again.detail} (before that: {first})"
            return again
        verdict.detail += f" (and {where}: {again.reason.value}: {again.detail[:200]})"
        verdict.environments += again.environments
    return verdict


def task_commands(spec: TaskSpec, verdict: Verdict) -> tuple[str | None, str]:
    """The task's setup and test commands, changed as the runs that kept it changed them (the verdict's extras,
    releases of its date, relaxed pins, plugins not loaded, modules ignored, tests deselected, ...)."""
    setup, command = spec.setup_command, spec.test_command
    if setup and verdict.extras:
        setup = with_extras(setup, verdict.extras)
    if setup and verdict.dated:
        setup = dated_setup(setup, verdict.dated)
    if setup:
        setup = adapted_setup(setup, verdict.build_constraints, verdict.relaxed)
    if verdict.disabled_plugins:
        command = disable_plugins(command, verdict.disabled_plugins)
    if verdict.no_ini:
        command = without_ini(command)
    if verdict.allowed_warnings:
        command = allow_warnings(command, verdict.allowed_warnings)
    if verdict.ignored:
        command = ignore(command, verdict.ignored)
    if verdict.deselect:
        command = deselect(command, verdict.deselect)
    return setup, command


def _validate(
    spec: TaskSpec,
    provider: SandboxProvider,
    runs: int,
    timeout: float,
    setup_timeout: float,
    per_test_timeout: float | None,
    stopper: Stopper | None,
    environments: list[str],
) -> Verdict:
    if not spec.test_command:
        return Verdict(RejectReason.NO_TEST_COMMAND, "no test command detected; give --test-command")

    def still_failing(results: list[TestRun]) -> bool:
        # Stop early once nothing can become a FAIL_TO_PASS test (everything passed at least once).
        if results[-1].timed_out:
            return False
        if results[-1].tests is None:
            return not results[-1].passed
        runs = [_outcomes(r) for r in results]
        stable, _ = _stable(runs, _all_ids(runs))
        return any(s == "fail" for s in stable.values())

    def state(spec: TaskSpec, keep_going: Callable[[list[TestRun]], bool]) -> list[TestRun]:
        return _run_state(
            spec,
            provider,
            runs,
            keep_going=keep_going,
            timeout=timeout,
            setup_timeout=setup_timeout,
            per_test_timeout=per_test_timeout,
            stopper=stopper,
            environments=environments,
        )

    setup, relaxed, constraints = spec.setup_command, list[str](), list[str]()

    def noted(verdict: Verdict) -> Verdict:
        """The verdict with what the runs below changed in the task's commands (the task does the same)."""
        verdict.ignored, verdict.allowed_warnings, verdict.relaxed = ignored, warned, relaxed
        verdict.build_constraints = constraints
        verdict.disabled_plugins, verdict.no_ini = refused, no_ini
        return verdict

    try:
        while True:
            try:
                before = state(spec, still_failing)
                break
            except SetupFailed as exc:
                # a pin the package index does not have (never published, or none for this Python): relaxed to
                # the nearest releases it has (bugsweep.mining.building.relax_pins), and the setup runs again
                more = [pin for pin in unavailable_pins(str(exc)) if pin not in relaxed]
                # a package it builds asks for 2to3, which setuptools 58 removed: built with an older one
                old_build = USES_2TO3_REFUSED in str(exc) and "setuptools<58" not in constraints
                if not setup or not (more or old_build) or len(relaxed) >= 5:
                    raise
                relaxed += more
                constraints += ["setuptools<58"] if old_build else []
                spec.setup_command = adapted_setup(setup, constraints, relaxed)
        if refused := refused_plugins(before):
            # a plugin the setup installed that today's pytest will not load stopped every run at start-up: it is
            # not loaded, and the runs start again
            spec.test_command = disable_plugins(spec.test_command, refused)
            before = state(spec, still_failing)
        if no_ini := setup_cfg_refused(before):
            # a configuration today's pytest will not read (a `[pytest]` section in setup.cfg) stopped every run at
            # start-up: the command reads none, and the runs start again
            spec.test_command = without_ini(spec.test_command)
            before = state(spec, still_failing)
        if warned := pytest_warnings_as_errors(before):
            # the project's `filterwarnings = error` made a warning of today's pytest a collection error (a mark
            # it never registered): ignored, and the runs start again
            spec.test_command = allow_warnings(spec.test_command, warned)
            before = state(spec, still_failing)
        if ignored := uncollectable(before, spec):
            # other modules that do not import at the task state stopped pytest before any test ran (a whole-suite
            # command at an old commit): the task's command leaves them out, as it leaves out tests failing in
            # both states, and the runs start again
            spec.test_command = ignore(spec.test_command, ignored)
            before = state(spec, still_failing)
        verdict = noted(judge(before, []))
        if not still_failing(before) or verdict.reason == RejectReason.TIMED_OUT:
            return verdict
        at_fix = spec.model_copy(update={"base_commit": spec.fix_commit, "test_patch": None})
        after = state(at_fix, lambda r: not r[-1].timed_out)
        return noted(judge(before, after, unrelated=ignored))
    except (CommandNotFound, MiningStopped):
        raise
    except CannotRun as exc:
        return Verdict(RejectReason.TESTS_CANNOT_RUN, str(exc))
    except BugsweepError as exc:
        if stopper is not None and stopper.stopped:
            raise MiningStopped("mining was stopped") from exc
        if isinstance(exc, SetupFailed):
            return Verdict(RejectReason.SETUP_FAILED, setup_error(str(exc)))
        text = str(exc)
        if "does not apply" in text:
            return Verdict(RejectReason.PATCH_DOES_NOT_APPLY, text[:300])
        if exc.kind == "infra":
            return Verdict(RejectReason.SANDBOX_ERROR, text[:300])
        raise
