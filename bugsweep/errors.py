"""The failures bugsweep tells apart.

Three families, because each is handled differently:
- ConfigError: the user must change something (bad arguments, missing settings, a rejected API key). Never retried.
- InfraError: the machinery failed (sandbox, network, model endpoint outage, S3). Retried by one layer only, the
  one that can tell a passing fault (docs/pipeline.md, "Who retries what"), and never graded as the model's failure.
- TaskError: the task itself cannot be run (setup failed, tests already pass, the test command cannot run). Not
  retried; reported.

An honest "not resolved" is not an error at all: it is a Grade with resolved=False.
"""

from __future__ import annotations

import re


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as an interrupt in the main thread (bugsweep.cli.exits.sigterm_as_interrupt) so that every
    `finally` runs (sandbox released, grade or report written) before the process ends; told apart from Ctrl-C in
    what is recorded and in the exit code (143, not 130)."""


class BugsweepError(Exception):
    """Base class. `kind` names the family for reports and grade.json."""

    kind = "error"


class ConfigError(BugsweepError):
    kind = "config"


class InfraError(BugsweepError):
    kind = "infra"

    def __init__(self, message: str, *, retried: int = 0) -> None:
        super().__init__(message)
        self.retried = retried
        """How many times the layer that retried this fault tried again before it gave up (0: none did). Each
        fault has one retry layer: an error that says it was retried is not retried again by a layer above."""

    @property
    def tries(self) -> int:
        return self.retried + 1


class SandboxError(InfraError):
    """A sandbox could not be created, or a command could not be started in it."""


class SandboxGone(SandboxError):
    """The sandbox vanished mid-task (deleted, crashed, out of memory at the VM level)."""


class ModelUnavailable(InfraError):
    """The model endpoint could not be reached or kept failing after retries (429, 5xx, timeouts)."""


class StorageError(InfraError):
    """The artifact store (S3 or a local folder) failed."""


class TaskError(BugsweepError):
    kind = "task"


class SetupFailed(TaskError):
    """The setup command exited non-zero."""


class SetupUnreachable(InfraError):
    """The setup command failed because the package index or the network could not be reached: an outage, not the
    task's fault (retried like any infrastructure failure)."""


#: What installers print when the network, not the task, failed them: pip (urllib3's connection errors and its
#: retry warnings), uv (reqwest's), and the resolver's own messages for an unknown or unreachable host.
_UNREACHABLE = re.compile(
    r"Failed to establish a new connection|Temporary failure in name resolution|Name or service not known"
    r"|Network is unreachable|No route to host|Connection refused|Connection reset by peer|Read timed out"
    r"|ConnectTimeoutError|NewConnectionError|ProxyError|Could not fetch URL|SSLError|error sending request for url"
    r"|dns error|tcp connect error|Failed to fetch: `|operation timed out",
    re.IGNORECASE,
)


def setup_failed(command: str | None, why: str, output: str) -> BugsweepError:
    """The error for a setup command that failed: an outage (SetupUnreachable, infra) when its output shows the
    package index or network could not be reached, else the task's own failure (SetupFailed)."""
    tail = output.strip()[-2000:]
    if _UNREACHABLE.search(output):
        return SetupUnreachable(
            f"the setup command {command!r} {why}: the package index or network could not be reached:\n{tail}"
        )
    return SetupFailed(f"the setup command {command!r} {why}:\n{tail}")


class NotARealTask(TaskError):
    """The tests already pass before the agent starts, so there is no bug to fix."""


class TestCommandCannotRun(TaskError):
    """The test command cannot run at all (program not found, pytest usage error or no test collected), so a
    failing run says nothing about a bug."""

    __test__ = False  # not a pytest class


class BadTaskFile(ConfigError):
    """A tasks.jsonl line that does not parse or does not validate."""


def failure_kind(exc: BaseException) -> str:
    """What kind of failure ended a task, for grade.json and the logs: the one place an exception is classified.

    'config', 'infra' or 'task' for bugsweep's own errors; 'infra' for a timeout (a step's backstop timeout: a hung
    sandbox or endpoint); 'cancelled' for an interrupt or a termination signal; 'crash' for anything else (a bug in
    bugsweep itself, or an unexpected exception).
    """
    if isinstance(exc, BugsweepError):
        return exc.kind
    if isinstance(exc, TimeoutError):
        return "infra"
    if not isinstance(exc, Exception):
        return "cancelled"
    return "crash"


def first_line(text: str, limit: int | None = 300) -> str:
    """The first non-blank line of a recorded reason (an error keeps its command's output below it), at most
    `limit` characters (None: whole): what a summary or a table shows of it."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if limit is None or len(line) <= limit else line[: limit - 1] + "…"


def describe(exc: BaseException) -> str:
    """The one-line reason a grade records: bugsweep's own message, or the exception's type and message."""
    return str(exc) if isinstance(exc, BugsweepError) else f"{type(exc).__name__}: {exc}"
