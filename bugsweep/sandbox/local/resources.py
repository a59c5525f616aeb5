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

from bugsweep.errors import SandboxGone
from bugsweep.sandbox.local.disk import WritableDisk
from bugsweep.sandbox.local.limits import Limits
from bugsweep.sandbox.local.process import Command
from bugsweep.sandbox.local.stale import write_owner_meta
from bugsweep.sandbox.local.workspace import remove_root
from bugsweep.sandbox.sources import CheckoutLease

log = logging.getLogger(__name__)


class Resources:
    """Everything to undo on release. Kept apart from LocalSandbox so a weakref finaliser can hold it."""

    def __init__(self, root: Path, repo_dir: Path) -> None:
        self.root = root
        self.repo_dir = repo_dir
        self.mounted = False
        self.limits: Limits | None = None
        self.disk: WritableDisk | None = None
        self.lease: CheckoutLease | None = None
        self.labels: dict[str, str] = {}
        self.created = time.time()
        self.released = False
        self._commands: set[Command] = set()
        self._lock = threading.Lock()

    def check_alive(self, sandbox_id: str) -> None:
        if self.released:
            raise SandboxGone(f"sandbox {sandbox_id} was released")
        gone = not os.path.ismount(self.repo_dir) if self.mounted else not self.repo_dir.is_dir()
        if gone:
            raise SandboxGone(f"sandbox {sandbox_id}: its workspace {self.repo_dir} is gone")

    def track(self, cmd: Command) -> bool:
        with self._lock:
            if self.released:
                return False
            self._commands.add(cmd)
            return True

    def untrack(self, cmd: Command) -> None:
        with self._lock:
            self._commands.discard(cmd)

    def sample_disk(self) -> bool:
        """Note the disk quota's current use for its peak; True when it is (nearly) full."""
        return self.disk.sample() if self.disk is not None else False

    def write_meta(self) -> None:
        write_owner_meta(
            self.root,
            created=self.created,
            labels=self.labels,
            mounted=self.mounted,
            repo_dir=str(self.repo_dir),
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
        guard("remove the sandbox folder", remove_root, self.root, self.repo_dir, self.mounted)
        if self.lease is not None and not os.path.ismount(self.repo_dir):  # the lower layer is free to go
            self.lease.release()


def guard(what: str, fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except Exception as exc:
        log.warning("sandbox cleanup: could not %s: %s", what, exc)
