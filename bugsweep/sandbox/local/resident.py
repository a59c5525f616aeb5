"""A process resident in a sandbox's namespaces that starts its commands, so that a command costs a fork and an exec
instead of a bubblewrap.

Every command used to be one `bwrap ... bash -c COMMAND`: new user, pid, ipc, uts, cgroup and network namespaces, a
root of binds, /proc, /dev and the seccomp filter, ~10 ms here before bash even starts (bench/README.md). The
resident is one such bubblewrap, started with a spare disk ahead of time (spares.py) with exactly the options every
command of the sandbox would get (`--unshare-net` included), whose program (`_resident_main.py`, standard library
only) forks each command inside: same namespaces, same filter, same cgroups, same root. What changes per command
(argv, environment, cwd, the three standard descriptors) comes in its request.

What each command still gets as before:
- its processes end with it: the resident is their subreaper and, once the command's own process has ended, kills
  every other process of the sandbox (`kill(-1)`, which a fork loop cannot outrun) and reaps them before it
  reports the exit code; a timeout or a release kills the resident's whole pid namespace, as it killed a command's;
- its exit code as bubblewrap reported it (128+N for a signal);
- no way to reach bugsweep: the control socket is not inherited, requests come only from bugsweep's end, and the
  resident is not dumpable (no command can read or write its memory; ptrace is denied by the filter anyway).

The repository's and the task environment's overlays are mounted on the host after the resident started (create()
knows the task only then); they reach its mount namespace by propagation: the spare's disk is a shared mount
(spares.py), so the sandbox's binds of it are slaves that receive every mount made under it, and every unmount.

Commands that need other bubblewrap options start the old way: a setup command (its network namespace with
slirp4netns, the download cache), a command while another one runs, and every command of a sandbox whose resident
is gone (killed with a timed-out command, or its options differ from the sandbox's: another interpreter), and every
command of a sandbox made without a spare: a process's first sandbox (a spare is made after a sandbox's first
command), so the agent of a one-task `bugsweep solve` runs its commands the old way and only its regrade's sandbox
has a resident, where a sweep's later tasks all have one. The resident only makes commands start sooner; it never
decides what they may do.
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bugsweep.sandbox.local import seccomp
from bugsweep.sandbox.local.bwrap import command_argv, isolation_args, options_fd, pip_shims
from bugsweep.sandbox.local.layers import Interpreter
from bugsweep.sandbox.local.process import KILLED, Command
from bugsweep.sandbox.local.spawner import Spawner

log = logging.getLogger(__name__)

MAIN = Path(__file__).with_name("_resident_main.py")
#: How long a resident may take to start (a cold Python in the sandbox), and to answer a request.
READY_TIMEOUT_S = 20.0
ANSWER_TIMEOUT_S = 10.0
#: The resident's own environment (each command brings its own in its request): nothing of bugsweep's.
RESIDENT_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
MAX_REQUEST = 1 << 20


@dataclass(frozen=True)
class ResidentPlan:
    """What a spare's resident is started with: the sandbox options of an interpreter, as `command_argv` makes
    them for a sandbox whose folder is `root`. A sandbox only adopts a resident started with its own options."""

    bwrap: str
    interpreter: Interpreter
    uv: str

    def head(self, root: Path) -> list[str]:
        etc_dir = root / "etc"
        return command_argv(
            self.bwrap, etc_dir=etc_dir, root=root, wrapper=[], interpreter=self.interpreter.binds(),
            uv=self.uv, shims=pip_shims(etc_dir),
        )  # fmt: skip


class Resident:
    """bugsweep's end of one sandbox's resident."""

    def __init__(self, head: list[str], cmd: Command, ctl: socket.socket) -> None:
        self.head = head
        """The bubblewrap options it runs under (bwrap first), to compare with the sandbox's."""
        self._cmd = cmd
        self._ctl: socket.socket | None = ctl
        self._busy = threading.Lock()
        self._lock = threading.Lock()

    @classmethod
    def start(cls, spawner: Spawner, head: list[str], python: str) -> Resident | None:
        """Start a resident through the sandbox's spawner (so it is in the cgroups from birth) with the options
        `head` and the interpreter `python` (bound by those options). None when it cannot start (logged)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not spawner.ready():
            if time.monotonic() > deadline:
                log.warning("a sandbox's spawner did not start: no resident")
                return None
            time.sleep(0.005)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info_r, info_w = os.pipe()
        mine = [info_w]
        try:
            program = os.memfd_create("bugsweep-resident", os.MFD_CLOEXEC)
            mine.append(program)
            os.write(program, MAIN.read_bytes())
            os.lseek(program, 0, os.SEEK_SET)
            quiet = [os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC) for _ in range(2)]
            mine += quiet
            mine.append(filter_fd := seccomp.filter_fd())
            mine.append(
                args_fd := options_fd([*head[1:], *isolation_args(info_w, filter_fd), "--chdir", "/"])
            )
            ctl_fd = theirs.fileno()
            argv = [head[0], "--args", str(args_fd), python, "-I", "-S", "-", str(ctl_fd)]
            fds = {
                program: 0,
                quiet[0]: 1,
                quiet[1]: 2,
                **{fd: fd for fd in (ctl_fd, info_w, filter_fd, args_fd)},
            }
            spawned = spawner.spawn(argv, RESIDENT_ENV, fds)
        except OSError as exc:
            log.warning("could not start a sandbox's resident: %s", exc)
            spawned = None
        finally:
            for fd in mine:
                os.close(fd)
            theirs.close()
        try:
            if spawned is None:
                ours.close()
                return None
            cmd = Command(spawned)
            cmd.read_info(info_r, READY_TIMEOUT_S)
            said = _receive(ours, deadline)
        finally:
            os.close(info_r)
        if cmd.init_pid is None or said != b"ready":
            log.warning("a sandbox's resident did not start (%r): commands start the slower way", said)
            cmd.kill()
            cmd.close()
            ours.close()
            return None
        return cls(head, cmd, ours)

    @property
    def alive(self) -> bool:
        return self._ctl is not None

    def run(
        self, argv: list[str], env: dict[str, str], cwd: str, stdio: tuple[int, int, int]
    ) -> ResidentCommand | None:
        """Start `argv` with `env` in `cwd`, the descriptors `stdio` as its 0, 1 and 2. None when the resident is
        gone or busy, or did not answer (then it is killed): the caller starts the command the old way."""
        if not self._busy.acquire(blocking=False):
            return None
        started: ResidentCommand | None = None
        try:
            started = self._send(json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode(), stdio)
        except BaseException:
            self.kill()
            raise
        finally:
            if started is None:
                self._busy.release()
        return started

    def _send(self, request: bytes, stdio: tuple[int, int, int]) -> ResidentCommand | None:
        """Send one request; the started command, or None: the resident is gone or the request too big (it is
        left as it is), or it could not be sent or was not answered (the resident is killed). The resident says
        b"started" before it starts the command, so None means the command did not run: the caller may start it
        the old way."""
        ctl = self._ctl
        if ctl is None or len(request) > MAX_REQUEST:
            return None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            try:
                ctl.sendmsg(
                    [request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _fds([theirs.fileno(), *stdio]))]
                )
            finally:
                theirs.close()
            said = _receive(mine, time.monotonic() + ANSWER_TIMEOUT_S)
            if not said:
                # No answer in time: the resident goes (its whole namespace, waited for) before the command may
                # start the old way, and is asked once more: a b"started" sent meanwhile means the command may have
                # run, so it ends as killed, never runs twice.
                self.kill()
                said = _receive(mine, time.monotonic())
            if said == b"started":
                return ResidentCommand(self, mine)
            log.warning("a sandbox's resident did not start a command (%r): it is stopped", said)
        except OSError as exc:
            log.warning("a sandbox's resident is gone (%s): commands start the slower way", exc)
        except BaseException:
            mine.close()
            raise
        mine.close()
        self.kill()
        return None

    def kill(self) -> None:
        """End the resident and the sandbox's pid namespace with it (every process it started), and wait until
        they are gone. Idempotent."""
        with self._lock:
            ctl, self._ctl = self._ctl, None
        if ctl is not None:
            ctl.close()
            self._cmd.kill()

    def stop(self) -> None:
        self.kill()
        self._cmd.close()

    def _done(self) -> None:
        self._busy.release()


class ResidentCommand:
    """A command the resident started, with the interface of process.Command that run_command uses."""

    def __init__(self, resident: Resident, reply: socket.socket) -> None:
        self._resident = resident
        self._reply = reply
        self.returncode: int | None = None
        self.started = True
        self._lock = threading.Lock()
        self._closed = False

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the command and every process it left to end; True when they did."""
        if self.returncode is not None:
            return True
        readable, _, _ = select.select([self._reply], [], [], max(timeout, 0.0))
        if not readable:
            return False
        try:
            said = self._reply.recv(64)
        except OSError:
            said = b""
        if said.startswith(b"exit "):
            self.returncode = int(said[5:])
        else:  # the resident died (its pid namespace with it: the OOM killer, a release, a command that killed it)
            self._resident.kill()
            self.returncode = KILLED
        return True

    def kill(self) -> None:
        """A timeout or a release: the resident's whole pid namespace goes (later commands start the old way)."""
        self._resident.kill()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._reply.close()
        self._resident._done()


def _receive(sock: socket.socket, deadline: float) -> bytes:
    readable, _, _ = select.select([sock], [], [], max(deadline - time.monotonic(), 0.0))
    if not readable:
        return b""
    with contextlib.suppress(OSError):
        return sock.recv(64)
    return b""


def _fds(fds: list[int]) -> bytes:
    return array.array("i", fds).tobytes()
