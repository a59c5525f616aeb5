"""Prefect tasks over the core: the steps of one bug-fix task (see tasks/steps.py)."""

from __future__ import annotations

import logging


class _QuietThreadTimeoutWarning(logging.Filter):
    """Drop Prefect's per-run warning that a task timeout cannot interrupt a blocking call in a worker thread.

    Sweeps run their tasks in threads, so Prefect would log it for every step of every task. The timeouts are
    a backstop: the core's own limits (command timeouts, the agent's wall clock) end a blocking call first, and
    the Prefect timeout then takes effect, which is the behaviour we want.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "running in a worker thread" not in record.getMessage()


logging.getLogger("prefect.task_runs").addFilter(_QuietThreadTimeoutWarning())
