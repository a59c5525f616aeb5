"""The resident of one sandbox (see resident.py for why it exists and the protocol). Standard library only: it runs
inside the sandbox, under its namespaces, seccomp filter and cgroups, as `python -I -S - CTL_FD` with this file on
its standard input, and starts the sandbox's commands from there.

On its control socket (AF_UNIX, SOCK_SEQPACKET) it says b"ready" once, then reads one request per message: a JSON
object {"argv": [...], "env": {...}, "cwd": "..."} with four descriptors attached: a reply socket and the command's
stdin, stdout and stderr. It answers on the reply socket b"started" before it starts the command (so nothing the
command does can come first), later b"exit CODE" (128+N when the command was killed by signal N, as bubblewrap
reports it), and only once every process the command left (background processes, daemons in their own sessions) is
killed and reaped: the sandbox's processes end with their command, as they do when each command has its own pid
namespace. One command at a time (bugsweep sends the next request only after b"exit"). When the control socket ends
it exits, and the sandbox's pid namespace ends with it.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys

MAX_REQUEST = 1 << 20
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


def main(ctl_fd: int) -> None:
    ctl = socket.socket(fileno=ctl_fd)
    ctl.set_inheritable(False)  # no command may hold it and ask for commands of its own
    libc = ctypes.CDLL(None, use_errno=True)
    # Every process a command leaves is reparented here (not to bubblewrap's init), so this process can wait until
    # they are all gone; and no command can read or write this process's memory through /proc.
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    ctl.send(b"ready")
    while True:
        try:
            data, ancdata, _, _ = ctl.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(4 * 4), socket.MSG_CMSG_CLOEXEC)
        except OSError:
            data, ancdata = b"", []
        fds = _received_fds(ancdata)
        if not data:
            return
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        reply = socket.socket(fileno=fds[0])
        try:
            _run(data, reply, fds[1:])
        finally:
            reply.close()


def _received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """_spawner_main.received_fds again: this program runs from its standard input inside the sandbox, where no
    module of bugsweep can be imported."""
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return list(fds)


def _run(data: bytes, reply: socket.socket, stdio: list[int]) -> None:
    try:
        request = json.loads(data)
        argv, env, cwd = list(request["argv"]), dict(request["env"]), str(request["cwd"])
    except (ValueError, KeyError, TypeError) as exc:
        for fd in stdio:
            os.close(fd)
        with contextlib.suppress(OSError):
            reply.send(f"error {exc}".encode())
        return
    # b"started" before the command exists: said after, a command that kills or stops this process at once (it is
    # the command's parent) came first, and bugsweep, without an answer, ran it again the old way. Unsaid (bugsweep
    # stopped waiting), the command does not start.
    try:
        reply.send(b"started")
    except OSError:
        for fd in stdio:
            os.close(fd)
        return
    pid = _spawn(argv, env, cwd, stdio)
    for fd in stdio:
        os.close(fd)  # the command's pipes end when its processes are gone, not when this one goes
    if pid is None:
        with contextlib.suppress(OSError):
            reply.send(b"exit 1")
        return
    status = _reap(pid)
    # What the command left behind: every other process of the sandbox (the kernel spares init and this one).
    # kill(-1) holds the task list while it signals, so a fork loop cannot outrun it.
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    _reap(None)
    code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.waitstatus_to_exitcode(status)
    with contextlib.suppress(OSError):
        reply.send(b"exit %d" % code)


def _reap(pid: int | None) -> int:
    """Reap this process's children until `pid` ends (its wait status), or, with None, until none is left; 0 when
    none is left first."""
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue
        if pid is not None and done == pid:
            return status


def _spawn(argv: list[str], env: dict[str, str], cwd: str, stdio: list[int]) -> int | None:
    """Start the command in its own session, `stdio` as its 0, 1 and 2, in `cwd`; its pid, or None when it could
    not start (said on its stderr). posix_spawn, not fork: it shares this process's memory until the exec, so it
    costs no copy of the page tables. The cwd is this process's for that moment."""
    try:
        os.chdir(cwd)
    except OSError as exc:
        os.write(stdio[2], f"bugsweep: cannot change to {cwd}: {exc.strerror}\n".encode())
        return None
    try:
        return os.posix_spawn(
            argv[0], argv, env,
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(stdio)],
            setsid=True,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # as subprocess.Popen(restore_signals=True)
        )  # fmt: skip
    except OSError as exc:
        os.write(stdio[2], f"bugsweep: cannot start {argv[0]}: {exc}\n".encode())
        return None
    finally:
        os.chdir("/")  # holds nothing of the workspace between commands (the host unmounts under it)


if __name__ == "__main__":
    main(int(sys.argv[1]))
