"""The sandbox interface every backend satisfies (local bubblewrap, Runtime microVMs, ...).

A sandbox holds one repository at `workdir` (/workspace/repo) for the whole task, runs commands in it, reads and
writes files, and is always released. Commands run with a clean environment: nothing of the host's environment
(and never the model's API key) is passed in.

The task's own environment. Every sandbox has a Python virtual environment at TASK_ENV (/opt/venv), first on PATH,
made from the interpreter given to `create(python=...)` (default: the one bugsweep runs on). It sees that
interpreter's standard library and what the setup installs, never bugsweep's own packages. `setup_environment`
runs the task's setup command in it; a backend that keeps layers (local) reuses a finished setup whose key matches
(the repository's dependency files, the setup command, the interpreter, the installer) instead of running it again.

Task state as a read-only layer, and a fresh sandbox on it (for the clean-room regrade):

    snapshot = sandbox.snapshot()            # the repository (.git included) and TASK_ENV as they are now
    ...                                      # the agent works in `sandbox`, on top of the snapshot
    fresh = provider.create_from(snapshot)   # a new sandbox: that repository and environment, a clean $HOME and
    ...                                      # /tmp, nothing the agent wrote; no setup runs again
    fresh.release(); snapshot.release()     # a snapshot also goes with the sandbox it was taken from, but
                                             # lives on while a sandbox made from it does

On the local backend a snapshot costs milliseconds (the writable layers become read-only overlay layers; nothing
is copied), and `LocalSandbox.repo_layers()` gives the host paths of what the agent wrote since the last snapshot
(`upper`) and of the read-only layers below it, for reading the change from outside the sandbox.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Protocol, Self, runtime_checkable

#: How much of each output stream a caller gets back unless it asks for the whole log.
OUTPUT_LIMIT_BYTES = 64 * 1024
#: The task's virtual environment inside every sandbox (first on PATH; VIRTUAL_ENV points at it).
TASK_ENV = "/opt/venv"
#: The file in a run folder that lists the task environment's installed packages (`name==version`, one a line).
PACKAGES_FILE = "environment.txt"


@dataclass
class ExecResult:
    """The outcome of one command. A timeout is a result, not an exception."""

    exit_code: int | None
    """None when the command timed out or was killed."""
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    """True when part of stdout or stderr was dropped: its head (only the tail is kept), or with `full_output` the
    middle of endless output."""
    duration_s: float = 0.0
    out_of_memory: bool = False
    disk_full: bool = False
    """True when the sandbox's disk quota was (nearly) used up while the command ran: writes fail with
    "No space left on device" until files are deleted."""
    too_much_output: bool = False
    """True when the command wrote so much output (a gigabyte on one stream, on the local backend) that its output
    was closed: its next write failed (EPIPE, or SIGPIPE at its default, exit code 141)."""

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


@dataclass
class Environment:
    """The task's environment after the setup step: what grade.json records as `environment`."""

    python: str
    """The interpreter's version, e.g. "3.11.7"."""
    setup_command: str | None = None
    packages: list[str] = field(default_factory=list)
    """Every installed distribution as `name==version`, sorted (written to the run folder as PACKAGES_FILE)."""
    installer: str = "pip"
    """'uv': `pip install` in the setup command ran as `uv pip install`; 'pip': as written."""
    key: str = ""
    """The layer key ('' where the backend keeps no layers)."""
    reused: bool = False
    """True when a finished setup was reused: the setup command did not run in this sandbox."""

    @property
    def packages_sha256(self) -> str:
        return hashlib.sha256("".join(f"{line}\n" for line in self.packages).encode()).hexdigest()

    def record(self) -> dict[str, object]:
        """The `environment` entry of grade.json."""
        return {
            "python": self.python,
            "setup_command": self.setup_command,
            "packages_sha256": self.packages_sha256,
            "packages_file": PACKAGES_FILE,
            "installer": self.installer,
            "layer": self.key or None,
            "reused": self.reused,
        }

    def packages_text(self) -> str:
        return "".join(f"{line}\n" for line in self.packages)


class SandboxSnapshot(Protocol):
    """A sandbox's repository and task environment frozen at one moment, read-only, for `create_from`."""

    @property
    def id(self) -> str: ...

    def release(self) -> None:
        """Free it once no sandbox uses it any more. Idempotent; never raises."""
        ...


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
        `full_output=True` returns everything (for the grader's test logs; the local backend keeps the first 64 MiB
        and the last OUTPUT_LIMIT_BYTES of each stream, so only endless output is cut).
        `network=True` is only honoured where the backend allows it (the local backend uses it for setup).
        Raises SandboxGone when the sandbox no longer exists, SandboxError when the command cannot be started.
        """
        ...

    def setup_environment(
        self, command: str | None, *, timeout: float = 1800.0, network: bool = True
    ) -> tuple[ExecResult | None, Environment]:
        """Make the task's environment: run `command` (the setup, with the network when `network` and the settings
        allow) in the workdir with TASK_ENV first on PATH, or reuse a finished setup with the same key. Returns the
        setup's result (None when nothing ran: no command, or a reused layer; the caller checks `.ok`) and the
        environment as it is afterwards."""
        ...

    def snapshot(self) -> SandboxSnapshot:
        """Freeze the repository and TASK_ENV as they are now (not $HOME, not /tmp) into a read-only snapshot; the
        sandbox goes on on top of it. See the module docstring."""
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
        self,
        source: RepoSource,
        *,
        labels: dict[str, str] | None = None,
        disk_mib: int | None = None,
        python: str | None = None,
    ) -> Sandbox:
        """Make a sandbox with the repository at its workdir, a disk of `disk_mib` (default: the backend's
        setting), and an empty task environment from the interpreter `python` (a path or a name on PATH; default:
        the one bugsweep runs on). Raises SandboxError (retryable) or ConfigError (e.g. no such interpreter)."""
        ...

    def create_from(self, snapshot: SandboxSnapshot, *, labels: dict[str, str] | None = None) -> Sandbox:
        """A fresh sandbox holding `snapshot`'s repository and task environment, with a clean $HOME and /tmp."""
        ...


def tail(text: str, limit: int) -> tuple[str, bool]:
    """The last `limit` characters of `text`, and whether anything was cut."""
    if len(text) <= limit:
        return text, False
    return text[-limit:], True
