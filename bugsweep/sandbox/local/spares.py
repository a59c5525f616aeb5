"""Spare disks: sandbox folders whose size-limited file system (disk.py) is made ahead of time, so that
`LocalProvider.create()` takes it instead of copying an image, attaching a loop device and mounting it on the path to
the first command (about 10 ms of the ~17 ms of a create at load 2; bench/README.md), together with its cgroups, a
spawner in them (spawner.py) and a resident in its namespaces (resident.py).

A spare is exactly what a new sandbox's folder would be before its first use: `state_dir/local-<id>` and a fresh
file system from the process's template, never used by any sandbox before (a spare is taken once; a released
sandbox's disk is destroyed, never recycled). The sandbox that takes it keeps its id. With a resident (the
default, `SandboxSettings.resident`) the file system is mounted on its folder as a shared mount, because the
resident's bubblewrap binds it and the overlays create() mounts under it must reach the resident's namespace;
without one, it is a detached mount held by a file descriptor of this process (mounted nowhere) until taken: if
the process dies, the kernel drops it and its loop device, whatever killed the process. After a sandbox's
first command (not during it: made then, a spare slowed that command by ~8 ms) a background thread makes spares
until `count` of that size are ready (`SandboxSettings.spare_disks`; only the
last size and state folder asked for keep spares); while there is none, create() makes its disk itself.

Nothing is left behind: a spare's folder carries an owner `meta.json` (kind "spare") like a sandbox's, so the
stale-sandbox sweep (stale.py, `bugsweep sandboxes --reap`, `bugsweep worker`) unmounts and deletes what a dead
process's spare leaves (its spawner and resident went with the process: the spawner's socket ended, and the
resident's bubblewrap dies with its parent); the spares of a process that exits normally
are deleted at exit (`release`), once the worker thread has finished the spare it is making.
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

from bugsweep.sandbox.local.disk import DetachedDisk, WritableDisk, make_shared
from bugsweep.sandbox.local.limits import Limits
from bugsweep.sandbox.local.resident import Resident, ResidentPlan
from bugsweep.sandbox.local.spawner import Spawner
from bugsweep.sandbox.local.stale import write_owner_meta
from bugsweep.sandbox.local.workspace import remove_root

log = logging.getLogger(__name__)

#: The `kind` in a spare's meta.json (a sandbox's has none; stale.list_sandboxes skips spares).
KIND = "spare"


@dataclass
class Spare:
    """A spare sandbox folder: its file system, and its cgroups (no limits set yet) with a spawner already in them
    (spawner.py), where this host has cgroups."""

    disk: DetachedDisk
    limits: Limits | None = None
    spawner: Spawner | None = None
    resident: Resident | None = None
    """The process that will start the sandbox's commands (resident.py): the disk is then mounted already."""
    attached: WritableDisk | None = None

    @property
    def root(self) -> Path:
        return self.disk.disk.mountpoint


@dataclass
class Taken:
    """A spare as a new sandbox gets it: the file system mounted on its folder."""

    disk: WritableDisk
    limits: Limits | None
    spawner: Spawner | None
    resident: Resident | None


@dataclass
class _Pool:
    key: tuple[Path, int]
    """(state_dir, size_bytes)"""
    count: int
    recipe: tuple[Path, Path, tuple[str, ...], ResidentPlan | None]
    """What `make` needs besides the key: the templates folder, the /etc to copy, the skeleton, the resident's
    options."""
    ready: list[Spare] = field(default_factory=list)
    busy: bool = False
    """The worker is making a spare for this pool now."""
    closed: bool = False
    """Set by `release`: what the worker was making for it is removed."""
    failed: bool = False
    """A spare could not be made here: no more tries in this process (create() reports the reason)."""


_lock = threading.Lock()
_changed = threading.Condition(_lock)
_pools: dict[tuple[Path, int], _Pool] = {}
_retired: list[Spare] = []
_worker: threading.Thread | None = None
_owner = os.getpid()
_exiting = False


def take(state_dir: Path, size_bytes: int) -> Taken | None:
    """A ready spare of `size_bytes` in `state_dir`, now mounted on its folder (`disk.mountpoint`), or None."""
    with _lock:
        pool = _pools.get((state_dir, size_bytes))
        spare = pool.ready.pop(0) if pool is not None and pool.ready else None
    if spare is None:
        return None
    try:
        disk = spare.attached or spare.disk.attach()
        return Taken(disk, spare.limits, spare.spawner, spare.resident)
    except OSError as exc:
        log.warning("could not mount the spare sandbox disk %s: %s", spare.root, exc)
        _destroy(spare)
        return None


def ready(state_dir: Path) -> list[Path]:
    """The folders of the spares ready in `state_dir`."""
    with _lock:
        return [
            spare.root for (where, _), pool in _pools.items() if where == state_dir for spare in pool.ready
        ]


def refill(
    state_dir: Path,
    size_bytes: int,
    count: int,
    templates: Path,
    etc_dir: Path,
    skeleton: Sequence[str],
    resident: ResidentPlan | None = None,
) -> None:
    """Have spares of `size_bytes` made in the background until `count` are ready, each with a resident started
    with `resident`'s options (the last sandbox's) where given. Returns at once: one
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
        recipe = (templates, etc_dir, tuple(skeleton), resident)
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = _Pool(key, count, recipe)
        pool.count = count
        pool.recipe = recipe
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
    state_dir: Path,
    size_bytes: int,
    templates: Path,
    etc_dir: Path,
    skeleton: Sequence[str],
    resident: ResidentPlan | None = None,
) -> Spare:
    """One spare now: a new sandbox folder in `state_dir` (with its owner meta.json, kind "spare"), a file system
    for it, and its cgroups with a spawner in them; with `resident`, the file system is mounted on the folder (a
    shared mount) and a resident started in them (resident.py), else it is not mounted yet. Raises OSError where
    this host cannot make the folder or the file system (without cgroups, the sandbox makes its own limits)."""
    root = state_dir / f"local-{uuid.uuid4().hex[:12]}"
    root.mkdir()
    created = time.time()
    spare: Spare | None = None
    try:
        write_owner_meta(root, kind=KIND, created=created, mounts=[])
        spare = Spare(WritableDisk.create_detached(root, size_bytes, templates, etc_dir, skeleton))
        limits = Limits.create(root.name, None, None)
        if limits.procs_files:
            spare.limits = limits
            owner = {"kind": KIND, "created": created, "mounts": [], "cgroups": [str(d) for d in limits.dirs]}
            write_owner_meta(root, **owner)
            spare.spawner = Spawner.start(limits.wrapper())
            if resident is not None and spare.spawner is not None:
                # on the disk too: mounted on the folder, the disk hides the folder's own meta.json
                write_owner_meta(spare.disk.inside, **owner)
                _start_resident(spare, resident)
        return spare
    except BaseException:
        if spare is not None:
            _destroy(spare)
        else:
            remove_root(root, [])
        raise


def _start_resident(spare: Spare, plan: ResidentPlan) -> None:
    """Mount the spare's disk (shared, so that the overlays mounted under it at create() reach the resident's
    namespace) and start its resident. A resident that cannot start leaves a spare without one."""
    assert spare.spawner is not None
    spare.attached = spare.disk.attach()  # from here on a killed process leaves a mount: stale.py unmounts it
    make_shared(spare.root)
    spare.resident = Resident.start(spare.spawner, plan.head(spare.root), plan.interpreter.executable)


def _work() -> None:
    """The worker: removes retired spares, then makes spares for every pool that has fewer than it wants."""
    while True:
        with _lock:
            job = _next_job()
            while not _retired and job is None:
                _changed.wait()
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
    (state_dir, size_bytes), (templates, etc_dir, skeleton, resident) = pool.key, pool.recipe
    made: Spare | None = None
    try:
        made = make(state_dir, size_bytes, templates, etc_dir, skeleton, resident)
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


def _next_job() -> _Pool | None:
    for pool in _pools.values():
        if not pool.closed and not pool.failed and len(pool.ready) < pool.count:
            return pool
    return None


def _destroy(spare: Spare) -> None:
    try:
        if spare.resident is not None:
            spare.resident.stop()
        if spare.spawner is not None:
            spare.spawner.stop()
        if spare.limits is not None:
            spare.limits.destroy()
        spare.disk.drop()
        remove_root(spare.root, [])
    except Exception as exc:  # the stale-sandbox sweep of a later process removes it
        log.warning("could not remove the spare sandbox %s: %s", spare.root, exc)
