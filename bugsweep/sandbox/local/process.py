"""Running one command: `bash -c COMMAND` as a process tree that ends as a whole, with output spooled through pipes
to unlinked files on the host, outside the sandbox's disk quota (never into memory; capture.py).

A command is one `bwrap ... bash -c COMMAND` of its own, with its own pid namespace: killing the namespace's init
kills the whole process tree at once. That is how a timeout ends a command, and why background processes
(`server &`) end with the command that started them. A caller gets the last OUTPUT_LIMIT_BYTES of each stream
(`truncated=True` when more was written), or with `full_output=True` also its first FULL_OUTPUT_HEAD_BYTES:
everything but endless output.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bugsweep.errors import SandboxError, SandboxGone
from bugsweep.sandbox.base import OUTPUT_LIMIT_BYTES
from bugsweep.sandbox.local import seccomp
from bugsweep.sandbox.local.bwrap import isolation_args, options_fd
from bugsweep.sandbox.local.capture import Capture, stdin_pipe
from bugsweep.sandbox.local.common import decode, short
from bugsweep.sandbox.local.limits import ATTACH_FAILED
from bugsweep.sandbox.local.setup_network import NetworkPlan, SetupNetwork

if TYPE_CHECKING:
    from bugsweep.sandbox.local.resources import Resources

#: Longer commands are passed to bash as a script file (Linux caps one argument at 128 KiB).
MAX_ARG_BYTES = 64 * 1024
#: How often a running command's disk use is sampled for the sandbox's peak.
DISK_SAMPLE_S = 0.25
_ENOSPC = b"No space left on device"
#: What `full_output` keeps of the start of each stream: files.read_bytes reads files of up to 64 MiB so.
FULL_OUTPUT_HEAD_BYTES = 64 * 1024 * 1024

#: Where bubblewrap's options descriptor goes (`--args N`, seen inside as /proc/1/cmdline): one number for all.
ARGS_FD = 900
_SPAWN_LOCK = threading.Lock()

#: The exit code of a command whose sandbox was killed under it (bubblewrap's for SIGKILL).
KILLED = 128 + signal.SIGKILL

_CHILD_PID = re.compile(rb'"child-pid":\s*(\d+)\s*[,}\n]')


@dataclass
class RawResult:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool
    duration_s: float
    out_of_memory: bool
    disk_full: bool = False
    too_much_output: bool = False


class Command:
    """One running `bwrap ... bash -c COMMAND`.

    `proc` is the outer bwrap; `init_pid` (from bwrap's --info-fd) is the init, pid 1, of the command's pid
    namespace. When the init dies the kernel kills every process in the namespace, and the init only finishes
    dying once they are all gone: so waiting for the init is how we know nothing of a command is left, and
    killing it is how a whole process tree is stopped at once, background processes and fork bombs included.
    The outer bwrap may exit a moment before the init does; both are waited for. Pidfds make the waits exact
    (Popen.wait(timeout) polls with sleeps that add milliseconds to every short command)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.init_pid: int | None = None
        self._init_fd: int | None = None
        self._fd_lock = threading.Lock()  # release() may kill while the exec thread closes

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @property
    def started(self) -> bool:
        """bubblewrap got as far as starting the command (it said its init's pid)."""
        return self.init_pid is not None

    def read_info(self, info_fd: int, timeout: float) -> None:
        """Read the init's pid from bwrap's --info-fd (JSON, written in several pieces)."""
        deadline = time.monotonic() + max(timeout, 0.0)
        data = b""
        while True:
            ready, _, _ = select.select([info_fd], [], [], max(deadline - time.monotonic(), 0.0))
            chunk = os.read(info_fd, 65536) if ready else b""
            if not chunk:
                return  # bwrap ended (or hung) before it said
            data += chunk
            found = _CHILD_PID.search(data)
            if found:
                break
        self.init_pid = int(found.group(1))
        with contextlib.suppress(OSError):
            self._init_fd = os.pidfd_open(self.init_pid)

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the command and its whole namespace to end; True when they did."""
        deadline = time.monotonic() + max(timeout, 0.0)
        if not wait_pid(self.proc, deadline):
            return False
        if self._init_fd is not None:
            ready, _, _ = select.select([self._init_fd], [], [], max(deadline - time.monotonic(), 0.0) + 5.0)
            if not ready:
                self._kill_init()
        return True

    def kill(self) -> None:
        with self._fd_lock:
            self._kill_locked()

    def _kill_locked(self) -> None:
        if self.proc.poll() is None and self.init_pid is None:
            for child in children(self.proc.pid):  # bwrap has not reported its init yet
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        self._kill_init()
        if not wait_pid(self.proc, time.monotonic() + 5):
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()  # --die-with-parent then kills the init
            self.proc.wait(timeout=30)
        if self._init_fd is not None:
            select.select([self._init_fd], [], [], 10.0)

    def _kill_init(self) -> None:
        if self._init_fd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._init_fd, signal.SIGKILL)

    def close(self) -> None:
        with self._fd_lock:
            if self._init_fd is not None:
                os.close(self._init_fd)
                self._init_fd = None


def wait_pid(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Wait for `proc` until `deadline` (time.monotonic()); True when it exited."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # already reaped, or no pidfd support
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        ready, _, _ = select.select([pidfd], [], [], max(deadline - time.monotonic(), 0.0))
    finally:
        os.close(pidfd)
    if not ready:
        return proc.poll() is not None
    proc.wait()
    return True


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return []


@contextlib.contextmanager
def _stdin(data: bytes | None) -> Iterator[int]:
    if data is None:
        yield subprocess.DEVNULL
        return
    with stdin_pipe(data) as fd:
        yield fd


def run_command(
    res: Resources,
    sandbox_id: str,
    argv_head: list[str],
    command: str,
    *,
    cwd: str,
    environ: dict[str, str],
    network: NetworkPlan | None,
    extra: list[str],
    timeout: float,
    full_output: bool,
    stdin: bytes | None,
    bwrap_at: int = 0,
) -> RawResult:
    """Run `command` under bash in `cwd` with `argv_head` (see bwrap.command_argv; bwrap itself at index
    `bwrap_at`, after the limits' wrapper) and the `extra` bwrap options, tracked by `res` so that a release kills it. The command runs under
    the seccomp filter, and with the setup network when `network` is given (else with none). Raises SandboxGone
    when the sandbox is released meanwhile, SandboxError when bwrap cannot start the command."""
    oom_before = res.limits.oom_kills() if res.limits else 0
    disk_full = False
    with contextlib.ExitStack() as stack:
        try:
            head = FULL_OUTPUT_HEAD_BYTES if full_output else 0
            capture = Capture(res.spool_dir, head=head, tail=OUTPUT_LIMIT_BYTES)
            stack.callback(capture.close)
            stdin_fh = stack.enter_context(_stdin(stdin))
        except OSError:
            res.check_alive(sandbox_id)  # released meanwhile: SandboxGone
            raise
        if len(command.encode()) <= MAX_ARG_BYTES:
            bash = ["/bin/bash", "-c", command]
        else:  # the kernel refuses a single argument over 128 KiB (a big heredoc): run it from a file
            script = res.root / "tmp" / f".bugsweep-command-{uuid.uuid4().hex}.sh"
            stack.callback(script.unlink, missing_ok=True)
            script.write_text(command)  # on a full disk: OSError ENOSPC, and no half script is left
            bash = ["/bin/bash", f"/tmp/{script.name}"]
        start = time.monotonic()
        cmd, info_r, block_w = _start_bwrap(
            stack, argv_head, bash, cwd=cwd, environ=environ, network=network, extra=extra, bwrap_at=bwrap_at,
            stdin=stdin_fh, output=capture.writers,
        )  # fmt: skip
        capture.started()
        setup_net: SetupNetwork | None = None
        try:
            if not res.track(cmd):
                cmd.kill()
                raise SandboxGone(f"sandbox {sandbox_id} was released")
            cmd.read_info(info_r, timeout)
            if network is not None and block_w is not None:
                if cmd.init_pid is not None:
                    try:
                        setup_net = network.start(cmd.init_pid)
                    except SandboxError as exc:
                        cmd.kill()
                        capture.finish()
                        said = decode(capture.err.read()[0][-2000:]).strip()
                        raise SandboxError(
                            f"{exc}" + (f"; bubblewrap said: {said}" if said else "")
                        ) from None
                with contextlib.suppress(OSError):  # bwrap is gone already: its error is reported below
                    os.write(block_w, b"1")
            deadline = start + timeout
            while True:  # in slices, so that the disk's peak is seen while the command writes
                done = cmd.wait(min(DISK_SAMPLE_S, deadline - time.monotonic()))
                disk_full = res.sample_disk() or disk_full
                if done or time.monotonic() >= deadline:
                    break
            timed_out = not done
            if timed_out:
                cmd.kill()
        except BaseException:  # e.g. KeyboardInterrupt: the command must not outlive its caller
            cmd.kill()
            raise
        finally:
            if setup_net is not None:
                setup_net.stop()
            cmd.close()
            res.untrack(cmd)
        duration = time.monotonic() - start
        if res.released:
            raise SandboxGone(f"sandbox {sandbox_id} was released while `{short(command)}` was running")
        capture.finish()
        if capture.failure is not None:
            raise SandboxError(
                f"could not keep the output of `{short(command)}` on the host: {capture.failure}"
            )
        stdout, cut_out = capture.out.read()
        stderr, cut_err = capture.err.read()
        # A file filled and deleted between two samples leaves only the error message behind.
        if res.disk is not None and (_ENOSPC in stdout or _ENOSPC in stderr):
            disk_full = True

    if cmd.returncode == 125 and ATTACH_FAILED in stderr:
        res.check_alive(sandbox_id)
        raise SandboxError(f"sandbox {sandbox_id}: {decode(stderr).strip()}")
    if not cmd.started and not timed_out:  # bwrap never got as far as starting the command
        res.check_alive(sandbox_id)
        raise SandboxError(f"bubblewrap could not start the command: {decode(stderr[-2000:]).strip()}")
    return RawResult(
        exit_code=None if timed_out else cmd.returncode,
        stdout=stdout,
        stderr=stderr,
        timed_out=timed_out,
        truncated=cut_out or cut_err,
        duration_s=duration,
        out_of_memory=bool(res.limits and res.limits.oom_kills() > oom_before),
        disk_full=disk_full,
        too_much_output=capture.too_much,
    )


def _start_bwrap(
    stack: contextlib.ExitStack,
    argv_head: list[str],
    bash: list[str],
    *,
    cwd: str,
    environ: dict[str, str],
    network: NetworkPlan | None,
    extra: list[str],
    bwrap_at: int,
    stdin: int,
    output: tuple[int, int],
) -> tuple[Command, int, int | None]:
    """Start `bash` as one `bwrap` of its own: the command, the read end of bwrap's --info-fd, and the write end
    of its --block-fd when the command gets the setup network."""
    info_r, info_w = os.pipe()
    stack.callback(os.close, info_r)
    child_fds = [info_w]  # ours to close once bwrap has them
    try:
        filter_fd = seccomp.filter_fd()
        child_fds.append(filter_fd)
        options = [*argv_head[bwrap_at + 1 :], *extra, *isolation_args(info_w, filter_fd)]
        block_w: int | None = None
        if network is not None:  # bwrap waits on --block-fd until the namespace has its network
            block_r, block_w = os.pipe()
            child_fds.append(block_r)
            stack.callback(_close_quietly, block_w)
            resolv = network.resolv_conf_fd()
            child_fds.append(resolv)
            options += ["--block-fd", str(block_r), "--ro-bind-data", str(resolv), "/etc/resolv.conf"]
        options += ["--chdir", cwd]
        memfd = options_fd(options)
    except BaseException:
        for fd in child_fds:
            os.close(fd)
        raise
    # The options' descriptor at one number for every command (the lowest free from ARGS_FD, taken and given back
    # under a lock): the sandbox's /proc/1/cmdline is then the same in any two sandboxes that run the same command,
    # as the mirror pair's two runs must be (bugsweep.grading.mirror).
    with _SPAWN_LOCK:
        try:
            args_fd = fcntl.fcntl(memfd, fcntl.F_DUPFD_CLOEXEC, ARGS_FD)
        finally:
            os.close(memfd)
        child_fds.append(args_fd)
        argv = [*argv_head[: bwrap_at + 1], "--args", str(args_fd), *bash]
        try:
            proc = _start(argv, stdin, output, environ, child_fds)
        finally:
            for fd in child_fds:
                os.close(fd)
    return Command(proc), info_r, block_w


def _start(
    argv: list[str],
    stdin: int,
    output: tuple[int, int],
    environ: dict[str, str],
    child_fds: list[int],
) -> subprocess.Popen[bytes]:
    """Start the command: `Limits.wrapper() + bwrap ...` (the wrapper puts it into the sandbox's cgroups)."""
    try:
        return subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=output[0],
            stderr=output[1],
            env=environ,
            close_fds=True,
            pass_fds=tuple(child_fds),
            cwd="/",
        )
    except OSError as exc:
        raise SandboxError(f"could not start bubblewrap: {exc}") from exc


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
