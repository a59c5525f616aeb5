"""Prefect tasks over the core: the steps of one bug-fix task (see tasks/steps.py).

Importing this package does nothing else: the flows call `quiet_prefect_logs()` when they start.
"""

from __future__ import annotations

import logging

#: The logger Prefect writes each task run's messages to.
TASK_RUNS_LOGGER = "prefect.task_runs"


class QuietThreadTimeoutWarning(logging.Filter):
    """Drop Prefect's per-run warning that a task timeout cannot interrupt a blocking call in a worker thread.

    Sweeps run their tasks in threads, so Prefect would log it for every step of every task. The timeouts are
    a backstop: the core's own limits (command timeouts, the agent's wall clock) end a blocking call first, and
    the Prefect timeout then takes effect, which is the behaviour we want.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "running in a worker thread" not in record.getMessage()


class ExpectedFailureInOneLine(logging.Filter):
    """Keep a step's failure to its one line when bugsweep expected it (a BugsweepError: a store or model that
    refuses, a setup that fails): Prefect logs the traceback of every task that fails for good, and a person
    reading the run (or `bugsweep sweep`'s terminal) needs the reason, not bugsweep's call stack. A crash (any
    other exception) keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from bugsweep.errors import BugsweepError

        if record.exc_info and isinstance(record.exc_info[1], BugsweepError):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_prefect_logs() -> None:
    """Install `QuietThreadTimeoutWarning` and `ExpectedFailureInOneLine` on Prefect's task-run logger, once per
    process (a flow calls it first)."""
    logger = logging.getLogger(TASK_RUNS_LOGGER)
    for kind in (QuietThreadTimeoutWarning, ExpectedFailureInOneLine):
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
