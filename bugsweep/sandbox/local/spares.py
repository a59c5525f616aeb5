"""Spare disks: sandbox folders whose size-limited file system (disk.py) is made, formatted and mounted ahead of
time, so that `LocalProvider.create()` takes one instead of copying an image, attaching a loop device and mounting
it on the path to the first command (about 10 ms of the ~17 ms of a create at load 2; bench/README.md).

A spare is exactly what a new sandbox's folder would be before its first use: `state_dir/local-<id>` with a fresh
file system from the process's template, never used by any sandbox before (a spare is taken once; a released
sandbox's disk is destroyed, never recycled). The sandbox that takes it keeps its id. After a sandbox's
first command (not during it: made then, a spare slowed that command by ~8 ms) a background thread makes spares
until `count` of that size are ready (`SandboxSettings.spare_disks`; only the
last size and state folder asked for keep spares); while there is none, create() makes its disk itself. Once the
process has had no live sandbox for IDLE_S (1 s), its spares go too.

Nothing is left behind: each spare carries an owner `meta.json` (kind "spare") like a sandbox's, so the
stale-sandbox sweep (stale.py, `bugsweep sandboxes --reap`, `bugsweep worker`) removes the spares of a process that
died; the spares of a process that exits normally are unmounted and deleted at exit (`release`), once the worker
thread has finished the spare it is making.
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
    key: tuple[Path, int]
    """(state_dir, size_bytes)"""
    count: int
    recipe: tuple[Path, Path, tuple[str, ...]]
    """What `make` needs besides the key: the templates folder, the /etc to copy, the skeleton."""
    ready: list[WritableDisk] = field(default_factory=list)
    busy: bool = False
    """The worker is making a spare for this pool now."""
    closed: bool = False
    """Set by `release`: what the worker was making for it is removed."""
    failed: bool = False
    """A spare could not be made here: no more tries in this process (create() reports the reason)."""


_lock = threading.Lock()
_changed = threading.Condition(_lock)
_pools: dict[tuple[Path, int], _Pool] = {}
_retired: list[WritableDisk] = []
_worker: threading.Thread | None = None
_owner = os.getpid()
_exiting = False
#: Sandboxes of this process alive now (`hold` / `let_go`), and since when there is none.
_live = 0
_idle_since: float | None = None
#: Spares go this long after the last sandbox of the process went: a process that is then killed (its run is over,
#: e.g. a flow run's process stopped after it reported) leaves none behind, and a next create soon after still
#: finds one.
IDLE_S = 1.0


def hold() -> None:
    """A sandbox of this process was created."""
    global _live, _idle_since
    with _lock:
        _live += 1
        _idle_since = None


def let_go() -> None:
    """A sandbox of this process was released."""
    global _live, _idle_since
    with _lock:
        _live = max(_live - 1, 0)
        if _live == 0:
            _idle_since = time.monotonic()
            _changed.notify_all()


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
    """Have spares of `size_bytes` made in the background until `count` are ready. Returns at once: one
    long-lived worker thread per process makes them (starting a thread per call cost the caller ~1 ms).
    Spares of another size or state folder go: only the last one asked for is kept ready."""
    global _worker
    if count <= 0:
        return
    key = (state_dir, size_bytes)
    with _lock:
        if _exiting:
            return
        for other in [k for k in _pools if k != key]:
            old = _pools.pop(other)
            old.closed = True
            _retired.extend(old.ready)
            old.ready = []
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = _Pool(key, count, (templates, etc_dir, tuple(skeleton)))
        pool.count = count
        if _worker is None:
            # A daemon: it must not hold up the interpreter's exit; `release` (at exit) waits for its current spare.
            _worker = threading.Thread(target=_work, name="bugsweep-spare-disks", daemon=True)
            _worker.start()
        _changed.notify_all()


def release(state_dir: Path | None = None) -> None:
    """Unmount and delete the ready spares (of `state_dir`, or all of this process's, and then no more are made),
    once the worker has finished the spare it is making. Never raises. Runs at exit."""
    global _exiting
    if os.getpid() != _owner:  # a forked child's copy of the list: the spares are its parent's
        return
    with _lock:
        _exiting = _exiting or state_dir is None  # at exit: no new spares from here on
        pools = [(key, pool) for key, pool in _pools.items() if state_dir is None or key[0] == state_dir]
        for key, pool in pools:
            pool.closed = True
            del _pools[key]
        while any(pool.busy for _, pool in pools) or (state_dir is None and _retired):
            _changed.wait(1.0)
        gone = [disk for _, pool in pools for disk in pool.ready]
        for _, pool in pools:
            pool.ready = []
    for disk in gone:
        _destroy(disk)


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


def _work() -> None:
    """The worker: removes retired spares, then makes spares for every pool that has fewer than it wants; once the
    process has had no sandbox for IDLE_S, it retires every spare."""
    while True:
        with _lock:
            _retire_when_idle()
            job = _next_job()
            while not _retired and job is None:
                _changed.wait(None if _idle_since is None or not _pools else IDLE_S / 4)
                _retire_when_idle()
                job = _next_job()
            retired = (
                _retired[0] if _retired else None
            )  # taken off the list once gone: `release` waits for that
            if retired is None and job is not None:
                job.busy = True
        if retired is not None:
            _destroy(retired)
            with _lock:
                _retired.remove(retired)
                _changed.notify_all()
        elif job is not None:
            _make_for(job)


def _make_for(pool: _Pool) -> None:
    (state_dir, size_bytes), (templates, etc_dir, skeleton) = pool.key, pool.recipe
    made: WritableDisk | None = None
    try:
        made = make(state_dir, size_bytes, templates, etc_dir, skeleton)
        pool.failed = made is None
    except Exception as exc:  # the next create() makes its own disk and reports what is wrong
        log.warning("could not make a spare sandbox disk in %s: %s", state_dir, exc)
        pool.failed = True
    with _lock:
        if made is not None and not pool.closed:
            pool.ready.append(made)
            made = None
    if made is not None:
        _destroy(made)  # released meanwhile
    with _lock:
        pool.busy = False  # only now: `release` waits for this
        _changed.notify_all()


def _retire_when_idle() -> None:
    """(with the lock held)"""
    if _idle_since is None or time.monotonic() - _idle_since < IDLE_S or not _pools:
        return
    for key in list(_pools):  # a later refill() starts a new pool
        pool = _pools.pop(key)
        pool.closed = True
        _retired.extend(pool.ready)
        pool.ready = []


def _next_job() -> _Pool | None:
    for pool in _pools.values():
        if not pool.closed and not pool.failed and len(pool.ready) < pool.count:
            return pool
    return None


def _destroy(disk: WritableDisk) -> None:
    try:
        remove_root(disk.mountpoint, [])
    except Exception as exc:  # the stale-sandbox sweep of a later process removes it
        log.warning("could not remove the spare sandbox disk %s: %s", disk.mountpoint, exc)
