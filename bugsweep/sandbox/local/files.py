"""Host-side file access to a sandbox: `LocalFiles` (the Sandbox protocol's `files`).

Paths under /workspace and /tmp are read and written from the host through openat2(RESOLVE_BENEATH), so nothing a
sandboxed process puts there (a `..`, a symlink out, a FIFO) can make the host touch a file outside those folders.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shlex
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from bugsweep.sandbox.local.common import WORKSPACE, decode
from bugsweep.sandbox.local.process import RawResult

if TYPE_CHECKING:
    from bugsweep.sandbox.local import LocalSandbox

#: files.read_text/read_bytes refuse bigger files, so a sandboxed process cannot make the host read 100 GB.
MAX_READ_BYTES = 64 * 1024 * 1024


# openat2(2) keeps host-side file access inside a folder (no `..`, no absolute or magic symlinks out of it).
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class LocalFiles:
    """File access by absolute sandbox path (a relative path is taken relative to the workdir).

    Paths under /workspace and /tmp are read and written from the host through openat2(RESOLVE_BENEATH), which
    refuses `..` and symlinks that would leave those folders. Anything else (other paths, a `..`, a symlink
    pointing elsewhere) is done by a command inside the sandbox, so it sees exactly what a command would see:
    a link to /etc/shadow or to a host project folder finds nothing, because neither exists in there.
    Text is decoded as UTF-8 with replacement characters for bytes that are not.
    """

    def __init__(self, sandbox: LocalSandbox) -> None:
        self._sbx = sandbox

    def read_text(self, path: str) -> str:
        return decode(self.read_bytes(path))

    def read_bytes(self, path: str) -> bytes:
        self._sbx._res.check_alive(self._sbx.id)
        located = self._locate(path)
        if located is not None:
            with contextlib.suppress(_Fallback), _named(path):
                fd = open_regular(*located, os.O_RDONLY)
                with os.fdopen(fd, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    if size > MAX_READ_BYTES:
                        raise _too_big(path, size)
                    return fh.read(MAX_READ_BYTES + 1)
        q = shlex.quote(self._absolute(path))
        raw = self._sbx._run(
            f"if [ -d {q} ]; then exit 21; fi; if [ -e {q} ] && [ ! -f {q} ]; then exit 28; fi; "
            f"if [ -f {q} ] && [ $(stat -L -c %s -- {q}) -gt {MAX_READ_BYTES} ]; then exit 27; fi; "
            f"exec head -c {MAX_READ_BYTES + 1} -- {q}",
            timeout=120,
            full_output=True,
        )
        if raw.exit_code == 0 and len(raw.stdout) <= MAX_READ_BYTES:
            return raw.stdout
        if raw.exit_code in (0, 27):
            raise _too_big(path, None)
        raise _os_error(raw, path)

    def write(self, path: str, data: str | bytes) -> None:
        """Write the file, creating missing parent folders. On a full disk (OSError ENOSPC or EDQUOT) an existing
        file under /workspace or /tmp is left as it was (replace_contents); a new one may be left empty."""
        self._sbx._res.check_alive(self._sbx.id)
        payload = data.encode() if isinstance(data, str) else data
        located = self._locate(path)
        if located is not None:
            with contextlib.suppress(_Fallback), _named(path):
                fd = open_regular(*located, os.O_WRONLY | os.O_CREAT, make_parents=True)
                try:
                    replace_contents(fd, payload)
                finally:
                    os.close(fd)
                return
        q = shlex.quote(self._absolute(path))
        raw = self._sbx._run(
            f'if [ -e {q} ] && [ ! -f {q} ]; then exit 28; fi; mkdir -p -- "$(dirname -- {q})" && cat > {q}',
            timeout=120,
            full_output=True,
            stdin=payload,
        )
        if raw.exit_code != 0:
            raise _os_error(raw, path)

    def exists(self, path: str) -> bool:
        self._sbx._res.check_alive(self._sbx.id)
        located = self._locate(path)
        if located is not None:
            try:
                os.close(_open_beneath(*located, os.O_PATH))
                return True
            except (FileNotFoundError, NotADirectoryError):
                return False
            except _Fallback:
                pass
        raw = self._sbx._run(f"test -e {shlex.quote(self._absolute(path))}", timeout=60)
        return raw.exit_code == 0

    def _absolute(self, path: str) -> str:
        return path if path.startswith("/") else f"{self._sbx.workdir}/{path}"

    def _locate(self, path: str) -> tuple[Path, str] | None:
        """(host folder, path relative to it) for paths in the writable areas, else None."""
        parts = [p for p in self._absolute(path).split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            return None
        root = self._sbx._res.root
        areas = {WORKSPACE.strip("/"): root / "ws", "tmp": root / "tmp"}
        if parts[0] not in areas:
            return None
        return areas[parts[0]], "/".join(parts[1:]) or "."


@contextlib.contextmanager
def _named(path: str) -> Iterator[None]:
    """Errors from the host-side walk name the sandbox path the caller gave, not the host-relative one."""
    try:
        yield
    except OSError as exc:
        if exc.errno is None or exc.filename == path:
            raise
        raise type(exc)(exc.errno, exc.strerror, path) from None


class _Fallback(Exception):
    """The host-side path walk would leave its folder: do the operation inside the sandbox instead."""


def _openat2(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_long(dirfd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        code = ctypes.get_errno()
        if code in (errno.EXDEV, errno.ELOOP, errno.ENOSYS, errno.EPERM, errno.EAGAIN, errno.E2BIG):
            raise _Fallback(path)
        raise OSError(code, os.strerror(code), path)
    return int(fd)


def _open_beneath(root: Path, rel: str, flags: int, *, make_parents: bool = False) -> int:
    """Open `root/rel` without leaving `root` (openat2 RESOLVE_BENEATH), optionally creating parent folders one
    at a time (each mkdirat relative to an already checked folder, so a symlinked parent cannot redirect it)."""
    dirfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if make_parents and "/" in rel:
            *parents, rel = rel.split("/")
            for name in parents:
                try:
                    nfd = _openat2(dirfd, name, os.O_PATH | os.O_DIRECTORY)
                except FileNotFoundError:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, dir_fd=dirfd)
                    nfd = _openat2(dirfd, name, os.O_PATH | os.O_DIRECTORY)
                os.close(dirfd)
                dirfd = nfd
        return _openat2(dirfd, rel, flags, 0o644 if flags & os.O_CREAT else 0)
    finally:
        os.close(dirfd)


def open_regular(root: Path, rel: str, flags: int, *, make_parents: bool = False) -> int:
    """Like _open_beneath, for a regular file only: a FIFO or socket that a sandboxed process put in the way is
    refused at once (the open is non-blocking), instead of hanging the host."""
    try:
        fd = _open_beneath(root, rel, flags | os.O_NONBLOCK, make_parents=make_parents)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO without a reader, or a socket
            raise _not_regular(rel) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", rel)
        raise _not_regular(rel)
    os.set_blocking(fd, True)
    return fd


def replace_contents(fd: int, payload: bytes) -> None:
    """Make the open file hold `payload`, or, when the disk is full, leave it as it was.

    Truncating first (O_TRUNC) and then failing to write left an edited file empty on a full disk. Here the part that
    makes the file longer is written first, past its end: it is the only part that needs new blocks, and when it
    fails it is cut off again. The rest then overwrites the file's own blocks in place, which needs no new ones."""
    size = os.fstat(fd).st_size
    if len(payload) > size:
        try:
            _write_at(fd, payload[size:], size)
        except OSError:
            os.ftruncate(fd, size)
            raise
    _write_at(fd, payload[:size], 0)
    os.ftruncate(fd, len(payload))


def _write_at(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _not_regular(path: str) -> OSError:
    return OSError(errno.EINVAL, "not a regular file", path)


def _too_big(path: str, size: int | None) -> OSError:
    what = f"{size} bytes" if size is not None else "too large"
    return OSError(errno.EFBIG, f"file is {what}; files.read_* returns at most {MAX_READ_BYTES} bytes", path)


def _os_error(raw: RawResult, path: str) -> OSError:
    message = decode(raw.stderr).strip()
    if raw.exit_code == 28:
        return _not_regular(path)
    if raw.exit_code == 21 or "Is a directory" in message:
        return IsADirectoryError(errno.EISDIR, "Is a directory", path)
    if "No such file" in message:
        return FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    if "File exists" in message:
        return FileExistsError(errno.EEXIST, message, path)
    if "Not a directory" in message:
        return NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
    if "No space left on device" in message:
        return OSError(errno.ENOSPC, message, path)
    if "Permission denied" in message or "Read-only file system" in message:
        return PermissionError(errno.EACCES, message or "Permission denied", path)
    return OSError(errno.EIO, message or f"exit code {raw.exit_code}", path)
