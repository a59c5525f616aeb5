"""What a sandbox holds on the host (its folder, overlay mount, cgroups, running commands, the checkout lease),
and how it is given back: `Resources.cleanup` kills every running command, empties and removes the cgroups,
unmounts the overlay and deletes the folder. It is kept apart from LocalSandbox so that a weakref finaliser can
hold it and run it at interpreter exit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bugsweep.errors import SandboxError, SandboxGone
from bugsweep.sandbox.local.disk import WritableDisk
from bugsweep.sandbox.local.layers import Layer, LocalSnapshot
from bugsweep.sandbox.local.limits import Limits
from bugsweep.sandbox.local.process import Command
from bugsweep.sandbox.local.stale import write_owner_meta
from bugsweep.sandbox.local.workspace import Overlay, remove_root
from bugsweep.sandbox.sources import CheckoutLease

log = logging.getLogger(__name__)


class Resources:
    """Everything to undo on release. Kept apart from LocalSandbox so a weakref finaliser can hold it."""

    def __init__(self, root: Path, repo_dir: Path) -> None:
        self.root = root
        self.repo_dir = repo_dir
        self.repo = Overlay(repo_dir, root / "upper", root / "work")
        self.env = Overlay(root / "env", root / "env-upper", root / "env-work")
        self.limits: Limits | None = None
        self.disk: WritableDisk | None = None
        self.lease: CheckoutLease | None = None
        self.layers: list[Layer] = []
        """The read-only layers under the sandbox, top first (each leased while the sandbox lives)."""
        self.snapshot: LocalSnapshot | None = None
        """The snapshot this sandbox was made from (told when the sandbox goes)."""
        self.snapshots_taken: list[LocalSnapshot] = []
        """Snapshots of this sandbox: released with it (each lives on while a sandbox made from it does)."""
        self.labels: dict[str, str] = {}
        self.created = time.time()
        self.released = False
        self._commands: set[Command] = set()
        self._lock = threading.Lock()

    def check_alive(self, sandbox_id: str) -> None:
        if self.released:
            raise SandboxGone(f"sandbox {sandbox_id} was released")
        gone = not os.path.ismount(self.repo_dir) if self.repo.mounted else not self.repo_dir.is_dir()
        if gone:
            raise SandboxGone(f"sandbox {sandbox_id}: its workspace {self.repo_dir} is gone")

    def keep_snapshot(self, snapshot: LocalSnapshot) -> bool:
        """Release `snapshot` with the sandbox; False when the sandbox was released already (by another thread)."""
        with self._lock:
            if not self.released:
                self.snapshots_taken.append(snapshot)
            return not self.released

    def track(self, cmd: Command) -> bool:
        with self._lock:
            if self.released:
                return False
            self._commands.add(cmd)
            return True

    def untrack(self, cmd: Command) -> None:
        with self._lock:
            self._commands.discard(cmd)

    @property
    def spool_dir(self) -> Path:
        """Where its commands' output is spooled (capture.py): the state folder its own folder is in, on the host's
        disk, outside its quota (the files are unlinked: nothing is left there)."""
        return self.root.parent

    def sample_disk(self) -> bool:
        """Note the disk quota's current use for its peak; True when it is (nearly) full."""
        return self.disk.sample() if self.disk is not None else False

    def check_idle(self, sandbox_id: str, what: str) -> None:
        """Layers are only rearranged between commands."""
        self.check_alive(sandbox_id)
        with self._lock:
            if self._commands:
                raise SandboxError(f"sandbox {sandbox_id}: cannot {what} while a command runs")

    def write_meta(self) -> None:
        write_owner_meta(
            self.root,
            created=self.created,
            labels=self.labels,
            repo_dir=str(self.repo_dir),
            mounts=[str(self.repo.target), str(self.env.target)],
            cgroups=[str(d) for d in self.limits.dirs] if self.limits else [],
        )

    def cleanup(self) -> None:
        """Never raises: every step logs its own failure and the next step still runs."""
        with self._lock:
            self.released = True
            commands = list(self._commands)
        for cmd in commands:
            guard("kill a command", cmd.kill)
        if self.limits is not None:
            guard("remove the cgroups", self.limits.destroy)
        guard("remove the sandbox folder", remove_root, self.root, [self.repo.target, self.env.target])
        if not os.path.ismount(self.repo_dir) and not os.path.ismount(self.env.target):  # the layers are free
            if self.lease is not None:
                self.lease.release()
            for layer in self.layers:
                layer.release()
            if self.snapshot is not None:
                guard("let go of the snapshot", self.snapshot.drop)
                self.snapshot = None
        for taken in self.snapshots_taken:
            guard("release a snapshot", taken.release)


def guard(what: str, fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except Exception as exc:
        log.warning("sandbox cleanup: could not %s: %s", what, exc)
