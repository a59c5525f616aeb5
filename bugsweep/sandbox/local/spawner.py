"""A per-sandbox process inside the sandbox's cgroups that starts its commands, so that no command has to join them.

Moving a process into a cgroup (a write to `cgroup.procs`) waits for an RCU grace period of the kernel when no
other move happened just before: measured here (cgroup v1, Linux 6.18, load ~1), 15-20 ms for the first move into
a new cgroup and ~5 ms for a move after 0.2 s of quiet, against 0.4 ms for one right after another. Every command
of an agent comes seconds after the last, so each paid that on its way to its first output: one `bwrap ... bash -c
true` took 18-21 ms joined that way against 10-11 ms forked by a process already in the cgroups (bench/README.md).
A child forked inside a cgroup is in it from the start (the kernel charges it there at fork), so the limits hold
exactly as before.

The spawner (`_spawner_main.py`, standard library only) is started by `Spawner.start` through the limits' own
join (`Limits.wrapper`), with spare disks ahead of time (spares.py) or else when the sandbox is made. Until it has
said it is ready, and if it is ever gone, commands start the old way (`spawn` returns None and the caller runs
`Limits.wrapper() + bwrap`): the spawner only makes commands start sooner, never decides whether they run. It
holds no secret and runs as the same user as bugsweep; it is outside the sandbox's namespaces (a command cannot see
it: its own pid namespace), its OOM score is -1000 (the memory limit's OOM kill takes the command, not it), and it
holds ~5 MiB of the sandbox's memory cgroup (4.7 MiB anonymous). When bugsweep lets go of it (release, or its
process dies however it dies: the control socket ends), it kills what it started and exits; bubblewrap's
--die-with-parent covers the rest.
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from bugsweep.sandbox.local._spawner_main import received_fds

log = logging.getLogger(__name__)

MAIN = Path(__file__).with_name("_spawner_main.py")
#: A request bigger than this (a huge environment) starts the old way instead.
MAX_REQUEST = 1 << 20
#: The socket buffers of a spawner's control socket (a request is one message).
SOCKET_BUFFER = 4 << 20
#: The spawner's own environment (a command's comes in its request).
SPAWNER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


class Spawner:
    """bugsweep's end of one sandbox's spawner process."""

    def __init__(self, proc: subprocess.Popen[bytes], ctl: socket.socket) -> None:
        self.proc = proc
        self._ctl: socket.socket | None = ctl
        self._ready = False
        self._lock = threading.Lock()

    @classmethod
    def start(cls, wrapper: list[str]) -> Spawner | None:
        """Start a spawner with `wrapper` (the limits' join) in front; None where it cannot start (logged)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            for sock in (ours, theirs):
                for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            proc = subprocess.Popen(
                [*wrapper, sys.executable, "-I", "-S", str(MAIN), str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), cwd="/", start_new_session=True,  # Ctrl-C is bugsweep's to handle
                env=SPAWNER_ENV,  # not bugsweep's, which holds the model's key; each command brings its own
            )  # fmt: skip
        except OSError as exc:
            ours.close()
            log.warning("could not start a sandbox's spawner (commands start the slower way): %s", exc)
            return None
        finally:
            theirs.close()
        return cls(proc, ours)

    def ready(self) -> bool:
        """True once the spawner has said it runs (never blocks)."""
        if self._ready:
            return True
        with self._lock:
            ctl = self._ctl
            if self._ready or ctl is None:
                return self._ready
            readable, _, _ = select.select([ctl], [], [], 0)
            if readable:
                try:
                    said = ctl.recv(16)
                except OSError:
                    said = b""
                if said == b"ready":
                    self._ready = True
                else:
                    self._gone()
            return self._ready

    def spawn(self, argv: list[str], env: dict[str, str], fds: dict[int, int]) -> SpawnedProcess | None:
        """Start `argv` with `env`, each of our descriptors `fds` given the number it maps to in the command
        (0, 1, 2 included), cwd "/". None when the spawner is not ready, is gone, or the request is too big: the
        caller then starts the command itself."""
        if not self.ready():
            return None
        request = json.dumps({"argv": argv, "env": env, "targets": list(fds.values())}).encode()
        if len(request) > MAX_REQUEST:
            return None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._lock:
                ctl = self._ctl
                if ctl is None:
                    return None
                try:
                    ctl.sendmsg(
                        [request],
                        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno(), *fds]))],
                    )
                except OSError as exc:
                    log.warning("a sandbox's spawner is gone (%s): commands start the slower way", exc)
                    self._gone()
                    return None
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        try:
            said, ancdata, _, _ = mine.recvmsg(256, socket.CMSG_SPACE(4), socket.MSG_CMSG_CLOEXEC)
        except BaseException:
            mine.close()
            raise
        pidfds = received_fds(ancdata)
        if not said.startswith(b"pid ") or not pidfds:
            for fd in pidfds:
                os.close(fd)
            mine.close()
            if said.startswith(b"error "):
                log.warning(
                    "a sandbox's spawner could not start a command: %s", said[6:].decode(errors="replace")
                )
            return None  # the command did not start (or the spawner died before it did): the caller starts it
        return SpawnedProcess(int(said[4:]), pidfds[0], mine)

    def stop(self) -> None:
        """Kill the spawner (it holds nothing to save; a command it started still running dies with it through
        bubblewrap's --die-with-parent) and reap it. A kill, not a request: its exit took ~9 ms of a release."""
        with self._lock:
            self._gone()
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()

    def _gone(self) -> None:
        self._ready = False
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None


class SpawnedProcess:
    """A command started by a spawner, with the part of subprocess.Popen's interface that process.py uses. Its exit
    code comes from the spawner (its parent); a pidfd makes the kill exact."""

    def __init__(self, pid: int, pidfd: int, reply: socket.socket) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd: int | None = pidfd
        self._reply = reply
        self._lock = threading.Lock()

    def wait_until(self, deadline: float) -> bool:
        """Wait until `deadline` (time.monotonic()) for the command to end; True when it did."""
        while self.returncode is None:
            remaining = deadline - time.monotonic()
            if self._reply.fileno() < 0:  # closed: nothing more can be learnt
                return False
            readable, _, _ = select.select([self._reply], [], [], max(remaining, 0.0))
            if readable:
                self._collect()
            elif remaining <= 0:
                return False
        return True

    def poll(self) -> int | None:
        self.wait_until(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self.wait_until(time.monotonic() + (timeout if timeout is not None else 1e9)):
            raise subprocess.TimeoutExpired("bwrap", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        with self._lock:
            if self._pidfd is not None and self.returncode is None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def close(self) -> None:
        with self._lock:
            self._close_pidfd()
            self._reply.close()

    def _collect(self) -> None:
        with self._lock:  # the exec thread and a release may both be waiting
            if self.returncode is not None or self._reply.fileno() < 0:
                return
            try:
                said = self._reply.recv(64, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                said = b""
            # b"": the spawner died, and bubblewrap's --die-with-parent killed the command with it
            self.returncode = int(said[5:]) if said.startswith(b"exit ") else -signal.SIGKILL
            self._close_pidfd()

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
