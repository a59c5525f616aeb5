"""The Prefect task layer (tasks/) does no work at import: no logger changed, no environment read.

Real parts: a fresh Python process importing the flows and tasks exactly as a Prefect worker does. No server is
needed: nothing here runs a flow.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bugsweep.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

#: Imports every module of tasks/ and flows/, recording which environment variables the project's own code reads
#: (libraries copy the whole environment at import: not counted) and the Prefect task-run logger's filters after.
IMPORT_AND_REPORT = """
import json, logging, os, sys

read = []

class Recording(type(os.environ)):
    def __getitem__(self, key):
        frame = sys._getframe(1)
        while frame and frame.f_code.co_filename.startswith("<frozen"):  # os.environ.get, Mapping.items
            frame = frame.f_back
        if frame and frame.f_code.co_filename.startswith(ROOT):  # the project's code, not a library's
            read.append(f"{key} by {frame.f_code.co_filename}:{frame.f_lineno}")
        return super().__getitem__(key)

os.environ.__class__ = Recording
import tasks, tasks.steps, flows.common, flows.solve_bug, flows.sweep, flows.compare
print(json.dumps({"read": read, "filters": [type(f).__name__ for f in logging.getLogger("prefect.task_runs").filters]}))
"""


def test_importing_the_tasks_and_flows_changes_no_logger_and_reads_no_environment() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BUGSWEEP_RETRY_DELAYS_S": "not,seconds"}
    done = subprocess.run(
        [sys.executable, "-c", f"ROOT = {str(ROOT)!r}\n{IMPORT_AND_REPORT}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"read": [], "filters": []}


def test_a_flow_start_quiets_prefects_logs_once() -> None:
    """The thread-timeout warning is dropped; a step's expected failure (a BugsweepError) is logged in one line,
    without its traceback; a crash keeps its traceback."""
    import sys

    from bugsweep.errors import StorageError
    from tasks import (
        TASK_RUNS_LOGGER,
        ExpectedFailureInOneLine,
        QuietThreadTimeoutWarning,
        quiet_prefect_logs,
    )

    kinds = (QuietThreadTimeoutWarning, ExpectedFailureInOneLine)
    logger = logging.getLogger(TASK_RUNS_LOGGER)
    # A flow run earlier in this process (another test) may have installed them already: start without them.
    installed = [f for f in logger.filters if isinstance(f, kinds)]
    for f in installed:
        logger.removeFilter(f)
    before = list(logger.filters)

    def record(message: str, exc: BaseException | None = None) -> logging.LogRecord:
        info = (type(exc), exc, exc.__traceback__) if exc else None
        return logging.LogRecord(TASK_RUNS_LOGGER, logging.WARNING, __file__, 1, message, None, info)

    def raised(exc: BaseException) -> BaseException:
        try:
            raise exc
        except BaseException:
            return sys.exc_info()[1]  # type: ignore[return-value]

    try:
        quiet_prefect_logs()
        quiet_prefect_logs()
        added = [f for f in logger.filters if f not in before]
        assert sorted(type(f).__name__ for f in added) == sorted(k.__name__ for k in kinds)
        warning = record("timeout cannot interrupt a blocking call: task is running in a worker thread")
        assert not logger.filter(warning) and logger.filter(record("step failed"))
        expected = record("Task run failed with exception", raised(StorageError("S3 refused")))
        assert logger.filter(expected) and expected.exc_info is None
        crash = record("Task run failed with exception", raised(KeyError("a bug")))
        assert logger.filter(crash) and crash.exc_info is not None
    finally:
        for f in list(logger.filters):
            if f not in before:
                logger.removeFilter(f)
        for f in installed:
            logger.addFilter(f)


@pytest.mark.parametrize("value", ["not,seconds", "", "10,-1"])
def test_bad_retry_delays_are_a_config_error_when_a_step_runs(monkeypatch, value: str) -> None:
    from tasks.steps import retry_delays_s

    monkeypatch.setenv("BUGSWEEP_RETRY_DELAYS_S", value)
    with pytest.raises(ConfigError, match="BUGSWEEP_RETRY_DELAYS_S"):
        retry_delays_s()
    monkeypatch.setenv("BUGSWEEP_RETRY_DELAYS_S", "0.5,2")
    assert retry_delays_s() == [0.5, 2.0]


def test_a_fault_a_lower_layer_retried_is_not_retried_by_a_step_and_solve_and_upload_never_retry() -> None:
    """Who retries what (docs/pipeline.md): the model client retries an endpoint outage inside the turn and the
    store retries an S3 fault, so the solve and upload steps never retry; a step retries only an infrastructure
    failure no layer below retried."""
    from bugsweep.errors import ModelUnavailable, SandboxError, SetupFailed, StorageError
    from tasks.steps import STEP_OPTIONS, list_tasks, not_retried_below, upload

    assert STEP_OPTIONS["solve"]["retries"] == 0, "a retried solve starts the agent over and pays again"
    assert upload.retries == 0, "the store's tries are the one layer of an S3 fault"
    assert STEP_OPTIONS["setup"]["retries"] == 2 and list_tasks.retries == 2
    assert STEP_OPTIONS["baseline"]["retries"] == STEP_OPTIONS["regrade"]["retries"] == 1
    assert not_retried_below(SandboxError("could not start the sandbox"))
    assert not not_retried_below(StorageError("S3 put failed after 8 tries", retried=7))
    assert not not_retried_below(ModelUnavailable("kept failing after 7 attempts", retried=6))
    assert not not_retried_below(SetupFailed("the setup command exited with 1"))
    assert not not_retried_below(None)
    # a git server that failed a push is retried by the push-branch step; a refused token is not
    from bugsweep.branches import BranchFailed
    from bugsweep.errors import ConfigError
    from tasks.steps import push_branch, retry_on_infra

    assert push_branch.retries == 2 and push_branch.retry_condition_fn is retry_on_infra
    assert not_retried_below(BranchFailed("could not push bugsweep/n/t: connection refused"))
    assert not not_retried_below(ConfigError("the git server refused the push (Authentication failed)"))


def test_each_steps_backstop_timeout_is_the_cores_limit_plus_a_margin_and_solve_has_the_runs_own() -> None:
    """The timeouts docs/pipeline.md quotes ("Who retries what"): the core's own limit plus TIMEOUT_MARGIN_S; the
    solve step's is the run's wall-clock limit, and a run without one has none, as on the command line."""
    from bugsweep.pipeline import STEP_TIMEOUT_S
    from bugsweep.settings import AgentSettings
    from tasks.steps import TIMEOUT_MARGIN_S, PrefectSteps

    steps = PrefectSteps(AgentSettings(max_wall_s=900))
    assert steps.options("solve")["timeout_seconds"] == 900 + TIMEOUT_MARGIN_S
    assert steps.options("setup")["timeout_seconds"] == 2 * STEP_TIMEOUT_S + TIMEOUT_MARGIN_S
    assert steps.options("baseline")["timeout_seconds"] == STEP_TIMEOUT_S + TIMEOUT_MARGIN_S
    assert steps.options("regrade")["timeout_seconds"] == STEP_TIMEOUT_S + TIMEOUT_MARGIN_S
    assert PrefectSteps(AgentSettings(max_wall_s=None)).options("solve")["timeout_seconds"] is None
