"""Limits: a per-sandbox cgroup (v1 `memory` + `pids` controllers, or v2 `memory.max` + `pids.max`), else rlimits.

The same cgroups measure what the sandbox used (`peak_memory_bytes`, `cpu_seconds`; on cgroup v1 a `cpuacct`
group is joined for the CPU time). The memory limit makes the kernel OOM-kill the biggest process (exit 137, `out_of_memory=True`), the process limit
makes fork() fail inside (a fork bomb stalls, the host is unharmed). Every command starts inside the cgroups, so
every process it forks is counted: each joins them before bwrap starts (`Limits.wrapper`). Where no cgroup can be created (non-root,
undelegated cgroup v2), `prlimit` sets RLIMIT_AS and RLIMIT_NPROC instead: weaker (RLIMIT_NPROC does not bind
root), and a warning says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from pathlib import Path

from bugsweep.errors import SandboxError
from bugsweep.sandbox.local.common import write_text

log = logging.getLogger(__name__)

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_ATTACH_SCRIPT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do '
    'echo $$ > "$1" 2>/dev/null || { echo "bugsweep: cannot join cgroup $1" >&2; exit 125; }; '
    'shift; n=$((n-1)); done; exec "$@"'
)
ATTACH_FAILED = b"bugsweep: cannot join cgroup"


class Limits:
    """The per-sandbox cgroups that hold every process of the sandbox's commands."""

    _warned = False

    def __init__(
        self, dirs: list[Path], procs_files: list[Path], oom_file: Path | None, rlimit_prefix: list[str]
    ):
        self.dirs = dirs
        self.procs_files = procs_files
        self.oom_file = oom_file
        self.rlimit_prefix = rlimit_prefix
        #: Where the peak memory (bytes) and the CPU time are read: v1 memory.max_usage_in_bytes and
        #: cpuacct.usage (ns), v2 memory.peak and cpu.stat's usage_usec.
        self.peak_file: Path | None = None
        self.cpu_file: Path | None = None
        self._memory_file: Path | None = None
        self._memsw_file: Path | None = None
        """v1 with swap accounting only: memory + swap, set to the same limit (no swap then)."""
        self._pids_file: Path | None = None

    @classmethod
    def create(cls, name: str, memory_bytes: int, max_pids: int) -> Limits:
        """The cgroups `bugsweep-NAME` with these limits, or rlimits where no cgroup can be made."""
        made: list[Path] = []
        try:
            v1_mem, v1_pids = _cgroup_v1_parent("memory"), _cgroup_v1_parent("pids")
            if v1_mem is not None and v1_pids is not None:
                mem, pids = v1_mem / f"bugsweep-{name}", v1_pids / f"bugsweep-{name}"
                for d in (mem, pids):
                    d.mkdir()
                    made.append(d)
                procs = [mem / "cgroup.procs", pids / "cgroup.procs"]
                v1_cpu = _cgroup_v1_parent("cpuacct")
                cpu = v1_cpu / f"bugsweep-{name}" if v1_cpu is not None else None
                if cpu is not None:
                    cpu.mkdir()
                    made.append(cpu)
                    procs.append(cpu / "cgroup.procs")
                limits = cls(made, procs, mem / "memory.oom_control", [])
                limits.peak_file = mem / "memory.max_usage_in_bytes"
                limits.cpu_file = cpu / "cpuacct.usage" if cpu is not None else None
                limits._memory_file = mem / "memory.limit_in_bytes"
                limits._memsw_file = mem / "memory.memsw.limit_in_bytes"
                limits._pids_file = pids / "pids.max"
                limits.apply(memory_bytes, max_pids)
                return limits
            v2 = _cgroup_v2_parent()
            if v2 is not None:
                d = v2 / f"bugsweep-{name}"
                d.mkdir()
                made.append(d)
                with contextlib.suppress(OSError):
                    write_text(d / "memory.swap.max", "0")
                limits = cls(made, [d / "cgroup.procs"], d / "memory.events", [])
                limits.peak_file = d / "memory.peak" if (d / "memory.peak").exists() else None  # Linux 5.19+
                limits.cpu_file = d / "cpu.stat"
                limits._memory_file = d / "memory.max"
                limits._pids_file = d / "pids.max"
                limits.apply(memory_bytes, max_pids)
                return limits
        except OSError as exc:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
            reason = str(exc)
        else:
            reason = "no writable cgroup v1 memory+pids or delegated cgroup v2 hierarchy"
        if not cls._warned:
            cls._warned = True
            log.warning(
                "sandbox limits: cannot create a cgroup (%s); falling back to prlimit RLIMIT_AS/RLIMIT_NPROC, "
                "which does not stop fork bombs when running as root",
                reason,
            )
        prlimit = shutil.which("prlimit")
        prefix = [prlimit, f"--as={memory_bytes}", f"--nproc={max_pids}", "--"] if prlimit else []
        return cls([], [], None, prefix)

    def apply(self, memory_bytes: int, max_pids: int) -> None:
        """Set the cgroups' memory and process limits. Raises OSError."""
        if self._memory_file is not None:
            write_text(self._memory_file, str(memory_bytes))
            if self._memsw_file is not None:
                with contextlib.suppress(OSError):  # only with swap accounting
                    write_text(self._memsw_file, str(memory_bytes))
        if self._pids_file is not None:
            write_text(self._pids_file, str(max_pids))

    def wrapper(self) -> list[str]:
        """The argv prefix that puts a command into the cgroups before bwrap starts (so every process it forks
        is counted), or sets the rlimits."""
        if not self.procs_files:
            return list(self.rlimit_prefix)
        return [
            "/bin/sh",
            "-c",
            _ATTACH_SCRIPT,
            "sh",
            str(len(self.procs_files)),
            *map(str, self.procs_files),
        ]

    def oom_kills(self) -> int:
        if self.oom_file is None:
            return 0
        try:
            for line in self.oom_file.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def peak_memory_bytes(self) -> int | None:
        """The most memory the sandbox's processes held at once so far (None without a cgroup)."""
        if self.peak_file is None:
            return None
        try:
            return int(self.peak_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) of every process of the sandbox so far (None without a cgroup)."""
        if self.cpu_file is None:
            return None
        try:
            text = self.cpu_file.read_text()
        except OSError:
            return None
        if self.cpu_file.name == "cpuacct.usage":
            return int(text.strip()) / 1e9
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        return None

    def destroy(self) -> None:
        empty_and_remove(self.dirs)


def empty_and_remove(dirs: list[Path]) -> None:
    deadline = time.monotonic() + 10
    for d in dirs:
        kill_file = d / "cgroup.kill"
        if kill_file.exists():
            with contextlib.suppress(OSError):
                write_text(kill_file, "1")
    while True:
        pids: set[int] = set()
        for d in dirs:
            with contextlib.suppress(OSError):
                pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        remaining = []
        for d in dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                remaining.append(d)
        if not remaining:
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"cgroups still busy: {', '.join(map(str, remaining))}")
        dirs = remaining
        time.sleep(0.02)


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path for a v1 controller, or for v2 when `controller` is ''."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (controller and controller in controllers.split(",")) or (not controller and controllers == ""):
            return path
    return None


def _cgroup_v1_parent(controller: str) -> Path | None:
    mount = _CGROUP_ROOT / controller
    path = _own_cgroup(controller)
    if path is None or not (mount / "cgroup.procs").exists():
        return None
    parent = mount / path.lstrip("/")
    return parent if parent.is_dir() and os.access(parent, os.W_OK) else None


def _cgroup_v2_parent() -> Path | None:
    """Where to make the sandbox's cgroup on a unified (v2) hierarchy: our own cgroup when its children get the
    memory and pids controllers, else the hierarchy's root (on systemd hosts the root delegates both, and the
    rule against processes in inner cgroups does not apply to it)."""
    if not (_CGROUP_ROOT / "cgroup.controllers").exists():
        return None
    own = _own_cgroup("")
    candidates = [_CGROUP_ROOT / own.lstrip("/")] if own else []
    candidates.append(_CGROUP_ROOT)
    for parent in candidates:
        try:
            enabled = (parent / "cgroup.subtree_control").read_text().split()
        except OSError:
            continue
        if {"memory", "pids"} <= set(enabled) and os.access(parent, os.W_OK):
            return parent
    return None
