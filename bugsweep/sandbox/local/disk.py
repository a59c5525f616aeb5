"""A disk quota for a local sandbox: its writable layers on a size-limited ext4 file system of their own.

Everything a sandbox can write (the overlay's upper layer under /workspace/repo, the rest of /workspace, which
is $HOME, and /tmp) lives on one ext4 file system in a sparse image file beside the sandbox's folder
(`<folder>.disk`), attached to a loop device and mounted on the folder itself, so every part of the folder is
inside the quota; its commands' output is not (capture.py: it reaches the caller when the disk is full). The kernel
enforces the size: a write past it fails inside with ENOSPC, "No space left on device", and the host's disk loses
at most the image's size (plus a little ext4 metadata). Deleting inside frees room inside; the image's blocks on
the host go back when the sandbox is released.

Why not tmpfs: a tmpfs's pages are memory, charged to the sandbox's memory cgroup and never evicted without
swap, so a test suite's build output would count against its memory limit and 16 sandboxes' quotas against the
worker's RAM (bench/README.md has the figures).

Creation is a copy of a pre-formatted template (made once per process and size by `mkfs.ext4`; the copy
moves only the few MB of metadata that are not holes), one LOOP_CONFIGURE ioctl with autoclear (the loop
device detaches itself at the last unmount, so nothing is left attached even when a process dies between
the steps) and one mount(2): about 10 ms at load 2. Needs root and a loop device; elsewhere `create` returns None
and the sandbox writes to the host's disk without a quota (a warning says so).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import shutil
import struct
import subprocess
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
MS_NOSUID, MS_NODEV, _MS_NOATIME = 2, 4, 1024  # MS_NOSUID, MS_NODEV: also the overlays' (workspace.py)
_MNT_DETACH = 2
#: The file system's own needs (inode tables, directories, bitmaps) on top of the quota, as an upper bound for
#: what an image can take of the host's disk: the ext4 overhead of a small file system is a few percent.
METADATA_SLACK = 0.05
#: At most this much free (or this share of the size) counts as full: the model is told to make room.
_FULL_BYTES = 4 * 1024 * 1024
_FULL_SHARE = 0.01
#: Where the template's copy of the sandbox's /etc lies in every file system made from it.
TEMPLATE_ETC = "etc"

_libc = ctypes.CDLL(None, use_errno=True)
_template_lock = threading.Lock()
_templates: dict[tuple[Path, int, tuple[str, ...]], Path] = {}
_warned = False


def image_path(folder: Path) -> Path:
    """Where the image of the file system mounted on `folder` lies."""
    return folder.with_name(folder.name + ".disk")


class WritableDisk:
    """One sandbox's size-limited file system, mounted on `mountpoint` (the sandbox's folder)."""

    def __init__(self, image: Path, mountpoint: Path, size_bytes: int) -> None:
        self.image = image
        self.mountpoint = mountpoint
        self.size_bytes = size_bytes
        self.peak_bytes = 0

    @classmethod
    def create(
        cls,
        folder: Path,
        size_bytes: int,
        templates: Path,
        etc_dir: Path | None = None,
        skeleton: Sequence[str] = (),
    ) -> WritableDisk | None:
        """A new file system of `size_bytes` mounted on the empty folder `folder` (image: `image_path(folder)`),
        or None (with a warning, once per process) where this host cannot make one. `templates` is a folder of
        this process for the pre-formatted images; they carry a copy of `etc_dir` as `etc/` (the sandbox binds
        that one, so no host path shows in its mountinfo) and the empty folders `skeleton` (one template per
        size and skeleton). Release with `empty_and_unmount(folder)` and delete the image
        (workspace.remove_root does both)."""
        image, mountpoint = image_path(folder), folder
        try:
            template = _template(templates, size_bytes, etc_dir, skeleton)
        except (OSError, subprocess.SubprocessError) as exc:
            _warn(f"no template image ({exc})")
            return None
        try:
            _on_loop_device(template, image, lambda loop: _mount(loop, mountpoint))
        except OSError as exc:
            if exc.errno in (errno.EPERM, errno.EACCES, errno.ENODEV, errno.ENOENT, errno.ENXIO):
                _warn(str(exc))
                return None
            raise
        disk = cls(image, mountpoint, size_bytes)
        disk.sample()
        return disk

    def used_bytes(self) -> int:
        st = os.statvfs(self.mountpoint)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def sample(self) -> bool:
        """Record the current use in `peak_bytes`; True when the file system is (nearly) full."""
        try:
            st = os.statvfs(self.mountpoint)
        except OSError:
            return False
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        self.peak_bytes = max(self.peak_bytes, used)
        free = st.f_bavail * st.f_frsize
        return free <= max(_FULL_BYTES, int(st.f_blocks * st.f_frsize * _FULL_SHARE))


def empty_and_unmount(folder: Path) -> None:
    """Delete what is in the file system mounted on `folder`, then unmount it (its loop device detaches itself).
    Deleting first drops the files' dirty pages: unmounting a full file system would otherwise write them all
    to an image that is deleted next. `etc/` stays: it came with the template and the sandbox only reads it
    (bound read-only), so it has nothing to write back, and deleting its ~700 entries took most of a release."""
    for entry in os.scandir(folder):
        if entry.name == TEMPLATE_ETC and entry.is_dir(follow_symlinks=False):
            continue
        if entry.is_dir(follow_symlinks=False) and not os.path.ismount(entry.path):
            shutil.rmtree(entry.path, ignore_errors=True)
        elif not entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    umount(folder)


_templates_dirs: dict[Path, Path] = {}


def templates_dir(state_dir: Path, owner_meta: Callable[[Path], None]) -> Path:
    """This process's folder of template images in `state_dir` (made once; `owner_meta` marks it for the
    stale-sandbox sweep; removed at exit)."""
    with _template_lock:
        path = _templates_dirs.get(state_dir)
        if path is None or not path.is_dir():
            path = state_dir / f"disk-templates-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            path.mkdir(parents=True)
            owner_meta(path)
            atexit.register(shutil.rmtree, path, True)
            _templates_dirs[state_dir] = path
        return path


def umount(target: Path) -> None:
    """Unmount `target`; lazily when busy. Not mounted is fine."""
    if _libc.umount2(os.fsencode(target), 0) == 0:
        return
    code = ctypes.get_errno()
    if code == errno.EINVAL:  # not mounted
        return
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"umount {target}: {os.strerror(code)}")


def _template(folder: Path, size_bytes: int, etc_dir: Path | None, skeleton: Sequence[str]) -> Path:
    key = (folder, size_bytes, tuple(skeleton))
    with _template_lock:
        path = _templates.get(key)
        if path is not None and path.exists():
            return path
        mkfs = shutil.which("mkfs.ext4") or shutil.which("mkfs.ext4", path="/usr/sbin:/sbin")
        if mkfs is None:
            raise OSError(errno.ENOENT, "mkfs.ext4 is not installed (Debian: e2fsprogs)")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"ext4-{size_bytes}-{len(_templates)}.img"
        partial = folder / f".{path.name}.{uuid.uuid4().hex[:8]}"
        with open(partial, "wb") as fh:
            fh.truncate(size_bytes)
        content = folder / f".root-{uuid.uuid4().hex[:8]}"  # what the new file system starts with (mkfs -d)
        content.mkdir()
        if etc_dir is not None:
            shutil.copytree(
                etc_dir, content / TEMPLATE_ETC, symlinks=True, ignore=shutil.ignore_patterns(".owner.json")
            )
        for name in skeleton:
            (content / name).mkdir(parents=True, exist_ok=True)
        # No journal (a sandbox's files do not outlive it, so there is nothing to recover after a crash), no
        # reserved blocks (all of the quota is the sandbox's), inode tables initialised lazily and never zeroed
        # afterwards (mount option noinit_itable): formatting writes a few MB whatever the size.
        proc = subprocess.run(
            [mkfs, "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard",
             "-L", "bugsweep", "-d", str(content), str(partial)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        shutil.rmtree(content)
        if proc.returncode != 0:
            partial.unlink()
            raise OSError(errno.EIO, f"mkfs.ext4 failed: {proc.stderr.strip()}")
        partial.rename(path)
        _templates[key] = path
        return path


def _copy_sparse(src: Path, dst: Path) -> None:
    """Copy only the data extents of `src` (the rest stays a hole)."""
    with open(src, "rb") as s, open(dst, "xb") as d:
        size = os.fstat(s.fileno()).st_size
        offset = 0
        while offset < size:
            try:
                data = os.lseek(s.fileno(), offset, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data after offset
                    break
                raise
            hole = os.lseek(s.fileno(), data, os.SEEK_HOLE)
            copied = data
            while copied < hole:
                n = os.copy_file_range(s.fileno(), d.fileno(), hole - copied, copied, copied)
                if n == 0:
                    break
                copied += n
            offset = hole
        d.truncate(size)


def _attach(image: Path) -> int:
    """Attach `image` to a free loop device with autoclear; the device's open fd."""
    fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(64):  # another process may take the free device between the two calls: try the next
            ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
            try:
                number = fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)
            finally:
                os.close(ctl)
            loop = os.open(f"/dev/loop{number}", os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(loop, _LOOP_CONFIGURE, _loop_config(fd))
            except OSError as exc:
                os.close(loop)
                if exc.errno == errno.EBUSY:
                    continue
                raise
            return loop
        raise OSError(errno.EBUSY, "no free loop device")
    finally:
        os.close(fd)


def _loop_config(fd: int) -> bytes:
    # struct loop_config { __u32 fd; __u32 block_size; struct loop_info64 info; __u64 __reserved[8]; }
    info = struct.pack(
        "=QQQQQIIII64s64s32sQQ", 0, 0, 0, 0, 0, 0, 0, 0, _LO_FLAGS_AUTOCLEAR, b"", b"", b"", 0, 0
    )
    return struct.pack("=II", fd, 0) + info + bytes(64)


def _on_loop_device(template: Path, image: Path, mount: Callable[[int], _T]) -> _T:
    """Copy `template` to `image`, attach it to a loop device and mount it with `mount(loop fd)`; the image is
    deleted when any step fails. With autoclear, the mount then holds the device: the unmount frees it."""
    try:
        _copy_sparse(template, image)
        loop = _attach(image)
        try:
            return mount(loop)
        finally:
            os.close(loop)
    except BaseException:
        with contextlib.suppress(OSError):
            image.unlink()
        raise


def _device(loop: int) -> bytes:
    """The path of the loop device open as `loop`."""
    return os.fsencode(os.readlink(f"/proc/self/fd/{loop}"))


def _mount(loop: int, target: Path) -> None:
    device = _device(loop)
    flags = ctypes.c_ulong(MS_NOSUID | MS_NODEV | _MS_NOATIME)
    if _libc.mount(device, os.fsencode(target), b"ext4", flags, b"noinit_itable") != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {device.decode()} on {target}: {os.strerror(code)}")


def _warn(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "sandbox disk quota: cannot make a size-limited file system here (%s); sandboxes write to the host's "
            "disk without a quota (needs root, loop devices and mkfs.ext4)",
            reason,
        )
