"""`bugsweep worker`: the Prefect workers of one machine.

Two `prefect worker start` processes on the pool, supervised here (a signal to this process goes to both; when one
ends, the other is stopped and its exit code is this process's):
- the task worker, on the queue TASK_QUEUE (solve-bug runs, a sweep's tasks among them, and the nightly
  benchmark), with `--limit`: how many of them this machine runs at once (its share of a night);
- the sweep worker, on the queue SWEEP_QUEUE (the nightly sweep: a light run that waits for its tasks), with no
  limit, so that a sweep takes none of the machine's task slots all night.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

#: The work queue of the deployments that do a task's work (prefect.yaml: solve-bug, nightly-benchmark).
TASK_QUEUE = "default"
#: The work queue of the deployments that only orchestrate (prefect.yaml: nightly-sweep).
SWEEP_QUEUE = "sweeps"


def default_limit(memory_mib: int) -> int:
    """Tasks a machine runs at once unless told: half its cores (a task's tests and the agent's commands share
    them), and no more than its memory holds at `memory_mib` (a sandbox's limit) each."""
    cores = os.cpu_count() or 1
    try:
        total_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError):
        total_mib = memory_mib * cores
    return max(1, min(cores // 2, total_mib // max(memory_mib, 1)))


def worker_commands(
    pool: str, limit: int, name: str | None = None, sweeps: bool = True, extra: list[str] | None = None
) -> list[list[str]]:
    """The `prefect worker start` commands of one machine: the task worker, then (with `sweeps`) the sweep worker."""
    prefect = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool]
    tasks = [*prefect, "--work-queue", TASK_QUEUE, "--limit", str(limit), *(["--name", name] if name else [])]
    commands = [[*tasks, *(extra or [])]]
    if sweeps:
        commands.append(
            [
                *prefect,
                "--work-queue",
                SWEEP_QUEUE,
                *(["--name", f"{name}-sweeps"] if name else []),
                *(extra or []),
            ]
        )
    return commands


def _die_with_parent() -> None:
    """preexec_fn: the kernel stops the worker when `bugsweep worker` dies, however it dies (SIGKILL included)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def run_workers(commands: list[list[str]], say: Callable[[str], object] = print) -> int:
    """Start every worker, forward SIGINT/SIGTERM to them, and return the exit code of the first that ends (the
    others are stopped then)."""
    processes = []
    for command in commands:
        say(f"starting: prefect {' '.join(command[3:])}")
        sys.stdout.flush()
        processes.append(subprocess.Popen(command, preexec_fn=_die_with_parent))

    def forward(signum: int, frame: object) -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    try:
        while all(process.poll() is None for process in processes):
            time.sleep(0.5)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return next(process.returncode for process in processes if process.returncode is not None)


def absolute_local_dir(cwd: Path | None = None) -> str:
    """BUGSWEEP_STORE_LOCAL_DIR for the runs this worker starts, absolute: a process worker starts each run in a
    temporary folder of its own (the deployments hold no path), which is deleted after the run, so a relative
    folder (the default `./artifacts`) would lose a result kept after a failed upload. Relative to where the worker
    was started."""
    local = os.environ.get("BUGSWEEP_STORE_LOCAL_DIR") or "artifacts"
    return str(((cwd or Path.cwd()) / Path(local).expanduser()).resolve())
