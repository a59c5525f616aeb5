"""A command's output: pipes for its stdout and stderr, drained by one thread into spool files on the host, outside
the sandbox's disk quota.

Why pipes: a file that the host opens shows its host path inside the sandbox (`ls -l /proc/self/fd` gave
`/tmp/bugsweep-sandboxes/state/local-.../spool/#12 (deleted)`), and the sandbox must see none of the host's paths;
a pipe shows `pipe:[N]` (stdout, stderr, and stdin: `stdin_pipe`).

Why outside the quota: the spool files used to be on the sandbox's own disk. A command that filled the disk then lost
its own last lines and exit status (the spool's write failed, its pipe was closed, the command died of SIGPIPE: exit
141), and so did every later command while the disk stayed full, a plain `echo` included. Now the spool files are
unlinked files (O_TMPFILE) in the host folder the caller names (the sandboxes' state folder), and the sandbox's disk
only says whether it was full (process.py samples it).

What is kept is bounded, so endless output fills neither the host's disk nor its memory: each stream keeps its first
`head` bytes and its last `tail` bytes (a ring of two `tail`-byte segments after the head, in the same file), so a
spool file never holds more than head + 2 * tail bytes. A stream that goes on past MAX_STREAM_BYTES is closed: the
command's next write fails (EPIPE, or SIGPIPE at its default), so endless output ends after a second or so instead
of keeping a host core busy until its timeout. The data moves with splice(2), in the kernel, never through Python's
memory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

_CHUNK = 1 << 20
#: A stream that writes more than this is closed (its command's next write to it fails): no test suite prints
#: a gigabyte, and `yes` reaches it in about a second.
MAX_STREAM_BYTES = 1 << 30


class Spool:
    """One stream's output in an unlinked host file: its first `head` bytes, then a ring of two segments of `tail`
    bytes each, which always holds the last `tail` bytes (or all there were)."""

    def __init__(self, folder: Path, head: int, tail: int) -> None:
        # Unlinked at once (O_TMPFILE where the file system has it): nothing is left in the folder.
        self.file: IO[bytes] = tempfile.TemporaryFile(dir=folder)  # noqa: SIM115 (closed by close())
        self.head, self.tail = head, tail
        self.written = 0
        """How many bytes the command wrote to the stream (kept or not)."""

    def take(self, pipe: int) -> int:
        """Move what the pipe holds into the file, up to the end of the current segment; 0 at the pipe's end."""
        offset, room = self._place()
        moved = _move(pipe, self.file.fileno(), min(room, _CHUNK), offset)
        self.written += moved
        return moved

    def _place(self) -> tuple[int, int]:
        """Where the next byte goes in the file, and how many more fit there before its part of the file ends."""
        if self.written < self.head:
            return self.written, self.head - self.written
        segment, at = divmod(self.written - self.head, self.tail)
        return self.head + (segment % 2) * self.tail + at, self.tail - at

    def read(self) -> tuple[bytes, bool]:
        """All the output when it fit in head + tail; else its head and its last `tail` bytes with a line between
        that says how much was cut, and True."""
        after_head = self.written - self.head
        if after_head <= self.tail:
            return os.pread(self.file.fileno(), self.written, 0), False
        segment, at = divmod(after_head, self.tail)
        current = self.head + (segment % 2) * self.tail
        previous = self.head + ((segment - 1) % 2) * self.tail
        fd = self.file.fileno()
        last = os.pread(fd, self.tail - at, previous + at) + os.pread(fd, at, current)
        skip = 0  # don't start inside a UTF-8 character
        while skip < 3 and skip < len(last) and 0x80 <= last[skip] < 0xC0:
            skip += 1
        if not self.head:
            return last[skip:], True
        cut = f"\n[... bugsweep: {after_head - self.tail + skip} bytes of output cut here ...]\n".encode()
        return os.pread(fd, self.head, 0) + cut + last[skip:], True

    def close(self) -> None:
        self.file.close()


class Capture:
    """The two pipes of one command and the spools they drain into (`head` and `tail`: what each keeps, see Spool).

    Use: `writers` go to the command (stdout, stderr); `started()` once it runs (our copies of the write ends are
    closed, so the pipes end when the command's whole process tree has); `finish()` after it ended; `close()`.
    """

    def __init__(self, folder: Path, *, head: int, tail: int) -> None:
        with contextlib.ExitStack() as undo:  # an error half-way leaves nothing open
            self.out = Spool(folder, head, tail)
            undo.callback(self.out.close)
            self.err = Spool(folder, head, tail)
            undo.callback(self.err.close)
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            undo.callback(os.close, out_r)
            undo.callback(os.close, out_w)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            undo.pop_all()
        self.too_much = False
        """Whether a stream passed MAX_STREAM_BYTES (its pipe was closed then)."""
        self.failure: OSError | None = None
        """Why output could not be kept on the host (its disk full, say): the pipe was closed then."""
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
                spool = self._readers.get(fd)
                if spool is None:
                    continue
                try:
                    moved = spool.take(fd)
                except OSError as exc:
                    self.failure = self.failure or exc
                    moved = 0
                if spool.written > MAX_STREAM_BYTES:
                    self.too_much, moved = True, 0
                if moved == 0:  # closing the pipe makes the command's next write to it fail
                    poller.unregister(fd)
                    self._drop(fd)


def _move(pipe: int, file: int, count: int, offset: int) -> int:
    """Move up to `count` bytes of what the pipe holds into the file at `offset`; 0 at the pipe's end."""
    try:
        return os.splice(pipe, file, count, offset_dst=offset)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS):
            raise
    data = os.read(pipe, count)
    view = memoryview(data)
    while view:
        written = os.pwrite(file, view, offset)
        view, offset = view[written:], offset + written
    return len(data)


@contextlib.contextmanager
def stdin_pipe(data: bytes) -> Iterator[int]:
    """A command's stdin: the read end of a pipe that holds `data` (what does not fit is fed by a thread). No host
    path, unlike a file in the spool; and once read, it is gone: not a file that another process of the sandbox could
    open again and read from its start (the sandbox's init holds its stdin too: `/proc/1/fd/0` inside; the mirror
    run's instruction must be readable once only, bugsweep.grading.harness)."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):  # grow the pipe for bigger data (1 MiB is the default ceiling)
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, min(max(len(data), 4096), 1 << 20))
    view = memoryview(data)
    os.set_blocking(write_end, False)
    try:
        written = os.write(write_end, view) if view else 0
    except BlockingIOError:
        written = 0
    rest = view[written:]
    if rest:
        threading.Thread(target=_feed, args=(write_end, rest), daemon=True, name="bugsweep-stdin").start()
    else:
        os.close(write_end)
    try:
        yield read_end
    finally:
        os.close(read_end)


def _feed(fd: int, rest: memoryview) -> None:
    """Write the rest of a command's stdin, then close it; a command that stops reading ends it (EPIPE)."""
    try:
        os.set_blocking(fd, True)
        while rest:
            rest = rest[os.write(fd, rest) :]
    except OSError:
        pass
    finally:
        os.close(fd)
