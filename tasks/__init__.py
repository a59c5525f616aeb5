"""Prefect tasks over the core: the steps of one bug-fix task (see tasks/steps.py).

Importing this package does nothing else: the flows call `quiet_thread_timeout_warnings()` when they start.
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


def quiet_thread_timeout_warnings() -> None:
    """Install `QuietThreadTimeoutWarning` on Prefect's task-run logger, once per process (a flow calls it first)."""
    logger = logging.getLogger(TASK_RUNS_LOGGER)
    if not any(isinstance(f, QuietThreadTimeoutWarning) for f in logger.filters):
        logger.addFilter(QuietThreadTimeoutWarning())
