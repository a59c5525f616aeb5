"""The sandbox interface every backend satisfies (local bubblewrap, Runtime microVMs, ...).

A sandbox holds one repository at `workdir` (/workspace/repo) for the whole task, runs commands in it, reads and
writes files, and is always released. Commands run with a clean environment: nothing of the host's environment
(and never the model's API key) is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Self, runtime_checkable

#: How much of each output stream a caller gets back unless it asks for the whole log.
OUTPUT_LIMIT_BYTES = 64 * 1024


@dataclass
class ExecResult:
    """The outcome of one command. A timeout is a result, not an exception."""

    exit_code: int | None
    """None when the command timed out or was killed."""
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    """True when the head of stdout or stderr was dropped (only the tail is kept)."""
    duration_s: float = 0.0
    out_of_memory: bool = False
    disk_full: bool = False
    """True when the sandbox's disk quota was (nearly) used up while the command ran: writes fail with
    "No space left on device" until files are deleted."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout then stderr, as a person reading a terminal would want them."""
        if self.stdout and self.stderr:
            return self.stdout.rstrip("\n") + "\n" + self.stderr
        return self.stdout or self.stderr


@dataclass
class RepoSource:
    """Where the repository comes from: a local path or a git URL, optionally at a ref."""

    repo: str
    ref: str | None = None


@runtime_checkable
class SandboxFiles(Protocol):
    """File access inside the sandbox. Paths are absolute sandbox paths (e.g. /workspace/repo/setup.py)."""

    def read_text(self, path: str) -> str: ...

    def write(self, path: str, data: str | bytes) -> None: ...

    def exists(self, path: str) -> bool: ...


@runtime_checkable
class Sandbox(Protocol):
    """One task's sandbox. Also a context manager that releases it."""

    @property
    def id(self) -> str: ...

    @property
    def workdir(self) -> str: ...

    @property
    def files(self) -> SandboxFiles: ...

    def exec(
        self,
        command: str,
        *,
        timeout: float = 300.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        network: bool = False,
        full_output: bool = False,
        stdin: str | None = None,
    ) -> ExecResult:
        """Run `command` under bash in `cwd` (default: workdir).

        `full_output=False` keeps the last OUTPUT_LIMIT_BYTES of each stream (for the model);
        `full_output=True` returns everything (for the grader's test logs).
        `network=True` is only honoured where the backend allows it (the local backend uses it for setup).
        Raises SandboxGone when the sandbox no longer exists, SandboxError when the command cannot be started.
        """
        ...

    def release(self) -> None:
        """Kill every process and free every resource. Idempotent; never raises."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


@dataclass
class SandboxUsage:
    """What a sandbox consumed, for cost reports."""

    command_seconds: float = 0.0
    commands: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    """The most memory the sandbox's processes held at once (page cache of their files included); None where
    the backend does not say."""
    cpu_s: float | None = None
    """CPU seconds (user + system) of all the sandbox's commands."""
    peak_disk_bytes: int | None = None
    """The most disk the sandbox's writable layers held at once (sampled while commands run)."""
    disk_quota_bytes: int | None = None
    """The sandbox's disk quota; None without one."""


class SandboxProvider(Protocol):
    """Creates sandboxes of one backend."""

    name: str

    def create(
        self, source: RepoSource, *, labels: dict[str, str] | None = None, disk_mib: int | None = None
    ) -> Sandbox:
        """Make a sandbox with the repository at its workdir and a disk of `disk_mib` (default: the backend's
        setting). Raises SandboxError (retryable) or ConfigError."""
        ...


def tail(text: str, limit: int) -> tuple[str, bool]:
    """The last `limit` characters of `text`, and whether anything was cut."""
    if len(text) <= limit:
        return text, False
    return text[-limit:], True
