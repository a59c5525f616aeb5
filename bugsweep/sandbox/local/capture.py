"""A command's output: pipes for its stdout and stderr, drained by one thread into spool files on the sandbox's disk.

Why pipes: a file that the host opens shows its host path inside the sandbox (`ls -l /proc/self/fd` gave
`/tmp/bugsweep-sandboxes/state/local-.../spool/#12 (deleted)`), and the sandbox must see none of the host's paths;
a pipe shows `pipe:[N]`, a memfd (stdin) `/memfd:bugsweep-stdin (deleted)`. The spool files stay on the sandbox's
disk, inside its quota, so endless output still ends at the quota: the pipe is then closed, the command's next write
fails as a write to a full disk would (EPIPE, or SIGPIPE at its default), and the result says the disk was full.
The data moves with splice(2), in the kernel, never through Python's memory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

_CHUNK = 1 << 20
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class Capture:
    """The two pipes of one command and the spool files they drain into.

    Use: `writers` go to the command (stdout, stderr); `started()` once it runs (our copies of the write ends are
    closed, so the pipes end when the command's whole process tree has); `finish()` after it ended; `close()`.
    """

    def __init__(self, spool: Path) -> None:
        with contextlib.ExitStack() as undo:  # an error half-way (the sandbox released) leaves nothing open
            self.out: IO[bytes] = undo.enter_context(tempfile.TemporaryFile(dir=spool))
            self.err: IO[bytes] = undo.enter_context(tempfile.TemporaryFile(dir=spool))
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            undo.callback(os.close, out_r)
            undo.callback(os.close, out_w)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            undo.pop_all()
        self.disk_full = False
        """Whether a spool file hit the disk's quota (its pipe was closed then)."""
        self.writers = (out_w, err_w)
        self._readers = {out_r: self.out, err_r: self.err}
        self._open_writers = [out_w, err_w]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="bugsweep-output", daemon=True)

    def started(self) -> None:
        """The command has its own copies of the write ends: close ours and start draining."""
        self._close_writers()
        self._thread.start()

    def finish(self, timeout: float = 10.0) -> None:
        """Wait until both pipes ended (every process that held them is gone); after `timeout` s stop anyway."""
        self._close_writers()
        if self._thread.ident is None:
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()

    def close(self) -> None:
        self.finish()
        for fd in list(self._readers):
            self._drop(fd)
        self.out.close()
        self.err.close()

    def _close_writers(self) -> None:
        while self._open_writers:
            with contextlib.suppress(OSError):
                os.close(self._open_writers.pop())

    def _drop(self, fd: int) -> None:
        if self._readers.pop(fd, None) is not None:
            os.close(fd)

    def _pump(self) -> None:
        poller = select.poll()
        for fd in self._readers:
            poller.register(fd, select.POLLIN)
        while self._readers and not self._stop.is_set():
            for fd, _ in poller.poll(200):
                sink = self._readers.get(fd)
                if sink is None:
                    continue
                try:
                    moved = _move(fd, sink.fileno())
                except OSError as exc:
                    self.disk_full = self.disk_full or exc.errno in _FULL
                    moved = 0  # closing the pipe makes the command's next write fail, as a full disk would
                if moved == 0:
                    poller.unregister(fd)
                    self._drop(fd)


def _move(pipe: int, file: int) -> int:
    """Move what the pipe holds (up to _CHUNK bytes) to the end of the file; 0 at the pipe's end."""
    try:
        return os.splice(pipe, file, _CHUNK)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS):
            raise
    data = os.read(pipe, _CHUNK)
    view = memoryview(data)
    while view:
        view = view[os.write(file, view) :]
    return len(data)


@contextlib.contextmanager
def stdin_file(data: bytes) -> Iterator[IO[bytes]]:
    """A command's stdin: `data` in a memfd (no host path, unlike a file in the spool)."""
    fd = os.memfd_create("bugsweep-stdin", os.MFD_CLOEXEC)
    with os.fdopen(fd, "w+b") as fh:
        fh.write(data)
        fh.flush()
        fh.seek(0)
        yield fh
