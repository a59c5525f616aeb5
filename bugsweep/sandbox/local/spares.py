"""Spare disks: sandbox folders whose size-limited file system (disk.py) is made, formatted and mounted ahead of
time, so that `LocalProvider.create()` takes one instead of copying an image, attaching a loop device and mounting
it on the path to the first command (about 10 ms of the ~17 ms of a create at load 2; bench/README.md).

A spare is exactly what a new sandbox's folder would be before its first use: `state_dir/local-<id>` with a fresh
file system from the process's template, never used by any sandbox before (a spare is taken once; a released
sandbox's disk is destroyed, never recycled). The sandbox that takes it keeps its id. After a sandbox's
first command (not during it: made then, a spare slowed that command by ~8 ms) a background thread makes spares
until `count` of that size are ready (`SandboxSettings.spare_disks`; only the
last size and state folder asked for keep spares); while there is none, create() makes its disk itself.

Nothing is left behind: each spare carries an owner `meta.json` (kind "spare") like a sandbox's, so the
stale-sandbox sweep (stale.py, `bugsweep sandboxes --reap`, `bugsweep worker`) removes the spares of a process that
died; the spares of a process that exits normally are unmounted and deleted at exit (`release`), after the filling
thread (not a daemon) has finished its current spare.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bugsweep.sandbox.local.disk import WritableDisk
from bugsweep.sandbox.local.stale import write_owner_meta
from bugsweep.sandbox.local.workspace import remove_root

log = logging.getLogger(__name__)

#: The `kind` in a spare's meta.json (a sandbox's has none; stale.list_sandboxes skips spares).
KIND = "spare"


@dataclass
class _Pool:
    ready: list[WritableDisk] = field(default_factory=list)
    filler: threading.Thread | None = None
    closed: bool = False
    """Set by `release`: the filling thread stops after its current spare (and releases it)."""


_lock = threading.Lock()
_pools: dict[tuple[Path, int], _Pool] = {}
_owner = os.getpid()
_exiting = False


def take(state_dir: Path, size_bytes: int) -> WritableDisk | None:
    """A ready spare of `size_bytes` in `state_dir` (its folder is `disk.mountpoint`), or None."""
    with _lock:
        pool = _pools.get((state_dir, size_bytes))
        return pool.ready.pop(0) if pool is not None and pool.ready else None


def ready(state_dir: Path) -> list[Path]:
    """The folders of the spares ready in `state_dir`."""
    with _lock:
        return [
            disk.mountpoint
            for (where, _), pool in _pools.items()
            if where == state_dir
            for disk in pool.ready
        ]


def refill(
    state_dir: Path,
    size_bytes: int,
    count: int,
    templates: Path,
    etc_dir: Path,
    skeleton: Sequence[str],
) -> None:
    """Make spares of `size_bytes` in a background thread until `count` are ready (no-op while one is running).
    Spares of another size or state folder go: only the last one asked for is kept ready."""
    if count <= 0:
        return
    key = (state_dir, size_bytes)
    with _lock:
        if _exiting:
            return
        retired: list[WritableDisk] = []
        for other in [k for k in _pools if k != key]:
            old = _pools.pop(other)
            old.closed = True  # its filling thread, if any, removes what it was making
            retired += old.ready
            old.ready = []
        if retired:
            threading.Thread(
                target=_destroy_all, args=(retired,), name="bugsweep-spare-disks-retired"
            ).start()
        pool = _pools.setdefault(key, _Pool())
        if pool.closed or len(pool.ready) >= count or (pool.filler is not None and pool.filler.is_alive()):
            return
        pool.filler = threading.Thread(
            target=_fill, args=(key, pool, count, templates, etc_dir, skeleton), name="bugsweep-spare-disks"
        )
        pool.filler.start()


def release(state_dir: Path | None = None) -> None:
    """Unmount and delete the ready spares (of `state_dir`, or all of this process's, and then no more are made),
    after the filling thread has finished. Never raises. Runs at exit."""
    global _exiting
    if os.getpid() != _owner:  # a forked child's copy of the list: the spares are its parent's
        return
    with _lock:
        _exiting = _exiting or state_dir is None  # at exit: no new spares from here on
        pools = [(key, pool) for key, pool in _pools.items() if state_dir is None or key[0] == state_dir]
        for key, pool in pools:
            pool.closed = True
            del _pools[key]
    for _, pool in pools:
        if pool.filler is not None and pool.filler is not threading.current_thread():
            pool.filler.join()
        for disk in pool.ready:
            _destroy(disk)
        pool.ready.clear()


atexit.register(release)


def make(
    state_dir: Path, size_bytes: int, templates: Path, etc_dir: Path, skeleton: Sequence[str]
) -> WritableDisk | None:
    """One spare now: a new sandbox folder in `state_dir` with its file system mounted (None where this host
    cannot make one; disk.py has warned)."""
    root = state_dir / f"local-{uuid.uuid4().hex[:12]}"
    root.mkdir()
    try:
        disk = WritableDisk.create(root, size_bytes, templates, etc_dir=etc_dir, skeleton=skeleton)
        if disk is None:
            root.rmdir()
            return None
        write_owner_meta(root, kind=KIND, created=time.time(), mounts=[])
    except BaseException:
        remove_root(root, [])
        raise
    return disk


def _fill(
    key: tuple[Path, int],
    pool: _Pool,
    count: int,
    templates: Path,
    etc_dir: Path,
    skeleton: Sequence[str],
) -> None:
    state_dir, size_bytes = key
    while True:
        with _lock:
            if pool.closed or len(pool.ready) >= count:
                return
        try:
            disk = make(state_dir, size_bytes, templates, etc_dir, skeleton)
        except Exception as exc:  # the next create() makes its own disk and reports what is wrong
            log.warning("could not make a spare sandbox disk in %s: %s", state_dir, exc)
            return
        if disk is None:
            return
        with _lock:
            if not pool.closed:
                pool.ready.append(disk)
                continue
        _destroy(disk)  # released meanwhile
        return


def _destroy_all(disks: list[WritableDisk]) -> None:
    for disk in disks:
        _destroy(disk)


def _destroy(disk: WritableDisk) -> None:
    try:
        remove_root(disk.mountpoint, [])
    except Exception as exc:  # the stale-sandbox sweep of a later process removes it
        log.warning("could not remove the spare sandbox disk %s: %s", disk.mountpoint, exc)
