"""The spawner process of one sandbox (see spawner.py for why it exists and the protocol). Standard library only:
it runs as `python -I -S _spawner_main.py CTL_FD`, started inside the sandbox's cgroups, and forks the sandbox's
commands from there so that they start in those cgroups without being moved into them.

On its control socket (AF_UNIX, SOCK_SEQPACKET) it says b"ready" once, then reads one request per message:
a JSON object {"argv": [...], "env": {...}, "targets": [fd numbers]} with file descriptors attached, the first a
reply socket, the others the command's, to be given the numbers in "targets" (0, 1, 2 and what its options name).
It answers on the reply socket b"pid N" with a pidfd of the command attached (or b"error ..."), later
b"exit CODE" (negative: killed by that signal). When the control socket ends (bugsweep released the sandbox, or
its process died, however it died), the spawner kills every command it started and exits.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import sys

MAX_FDS = 32
MAX_REQUEST = 1 << 20


def main(ctl_fd: int) -> None:
    ctl = socket.socket(fileno=ctl_fd)
    # Inherited (pass_fds), so inheritable: left so, every command, and the code the sandbox runs, would hold it
    # and could ask this process, outside the sandbox, to start anything.
    ctl.set_inheritable(False)
    # The OOM killer takes the sandbox's commands, never this process.
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as fh:
        fh.write("-1000")
    ctl.send(b"ready")
    poller = select.poll()
    poller.register(ctl, select.POLLIN)
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, reply socket)
    while True:
        for fd, _ in poller.poll():
            if fd != ctl.fileno():
                pid, reply = running.pop(fd)
                poller.unregister(fd)
                _, status = os.waitpid(pid, 0)
                os.close(fd)
                with contextlib.suppress(OSError):  # the caller may have stopped waiting
                    reply.send(b"exit %d" % os.waitstatus_to_exitcode(status))
                reply.close()
                continue
            try:
                data, ancdata, _, _ = ctl.recvmsg(
                    MAX_REQUEST, socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
                )
            except OSError:
                data, ancdata = b"", []
            fds = received_fds(ancdata)
            if not data:
                for fd in fds:
                    os.close(fd)
                _stop(running)
                return
            started = _start(data, fds)
            if started is not None:
                pidfd, pid, reply = started
                running[pidfd] = (pid, reply)
                poller.register(pidfd, select.POLLIN)


def received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors an SCM_RIGHTS message brought (spawner.py reads its replies with this too)."""
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return list(fds)


def _start(data: bytes, fds: list[int]) -> tuple[int, int, socket.socket] | None:
    """Start one command; returns (its pidfd, its pid, the reply socket), or None when it could not start."""
    if not fds:
        return None
    reply = socket.socket(fileno=fds[0])
    ours = fds[1:]
    high: list[int] = []
    try:
        request = json.loads(data)
        targets = [int(t) for t in request["targets"]]
        if len(targets) != len(ours):
            raise ValueError("one target per descriptor")
        # Above every target first, so that one dup2 never overwrites a descriptor a later one still needs.
        base = max([*targets, 2]) + 1
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, base) for fd in ours]
        pid = os.posix_spawn(
            request["argv"][0],
            request["argv"],
            request["env"],
            file_actions=[
                (os.POSIX_SPAWN_DUP2, fd, target) for fd, target in zip(high, targets, strict=True)
            ],
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # as subprocess.Popen(restore_signals=True)
        )
        pidfd = os.pidfd_open(pid)
    except Exception as exc:
        with contextlib.suppress(OSError):
            reply.send(f"error {exc}".encode())
        reply.close()
        return None
    finally:
        for fd in ours + high:
            os.close(fd)
    with contextlib.suppress(OSError):
        reply.sendmsg([b"pid %d" % pid], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))])
    return pidfd, pid, reply


def _stop(running: dict[int, tuple[int, socket.socket]]) -> None:
    for pidfd, (pid, reply) in running.items():
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        os.close(pidfd)
        reply.close()


if __name__ == "__main__":
    main(int(sys.argv[1]))
