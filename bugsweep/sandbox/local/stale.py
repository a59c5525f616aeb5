"""Stale sandboxes: what processes that died without releasing left in the state folder, and who removes it.

Each sandbox folder (and each process's /etc folder) carries its owner: the user (uid), the process (pid), the
pid's start time and the pid namespace. A folder is stale when its owner process is gone (or its pid now names a
process started later). Only the owner's user removes it, whatever folder it is in: the state folder is the
user's own by default (`default_state_dir`: $TMPDIR/bugsweep-sandboxes-UID, mode 0700), and a folder recorded as
another user's is left alone even where root could remove it. Folders of another pid namespace are left alone
too: their pids mean nothing here.

Who reaps, and when: the first sandbox a process makes (`prepare_state_dir`, once per process), every flow run
as it starts (flows/common.py), `bugsweep worker` as it starts and then every `REAP_EVERY_S` while it runs
(`Reaper`: a worker and its runs killed together are cleaned up by the next live worker of the same user within
about half a minute), and `bugsweep sandboxes cleanup` by hand.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from bugsweep.errors import SandboxError
from bugsweep.sandbox.local.common import write_text
from bugsweep.sandbox.local.limits import empty_and_remove
from bugsweep.sandbox.local.workspace import remove_root

log = logging.getLogger(__name__)

#: Seconds between two reaps of a running `bugsweep worker` (`Reaper`).
REAP_EVERY_S = 30.0
#: The state folder every user shared before it became per-user; still reaped (of this user's folders only).
LEGACY_STATE_DIR = "bugsweep-sandboxes"

_reaped: set[Path] = set()
_reap_lock = threading.Lock()


def default_state_dir() -> Path:
    """This user's own state folder: $TMPDIR/bugsweep-sandboxes-UID (one per user: no other user's process
    lists, uses or reaps it)."""
    return Path(tempfile.gettempdir()) / f"{LEGACY_STATE_DIR}-{os.getuid()}"


def _reap_stale_once(state_dir: Path) -> None:
    with _reap_lock:
        if state_dir in _reaped:
            return
        _reaped.add(state_dir)
    reap_stale(state_dir)


def reap_stale(state_dir: Path) -> list[str]:
    """Remove what this user's processes that died without releasing left in `state_dir` (their cgroups, overlay
    mounts and folders); the names removed. Sandboxes of live processes, of another user, or of another pid
    namespace are left alone. Next to the default state folder, the old shared one is swept the same way."""
    removed = _reap_folder(state_dir)
    if state_dir == default_state_dir():
        legacy = state_dir.parent / LEGACY_STATE_DIR
        with contextlib.suppress(OSError):
            if legacy.is_dir() and os.lstat(legacy).st_uid == os.getuid():
                removed += _reap_folder(legacy)
    return removed


def _reap_folder(state_dir: Path) -> list[str]:
    try:
        entries = list(state_dir.iterdir())
    except OSError:
        return []
    removed = []
    for root in entries:
        try:
            if _reap_if_stale(root):
                removed.append(root.name)
        except Exception as exc:
            log.warning("could not remove stale sandbox %s: %s", root.name, exc)
    for image in state_dir.glob(
        "local-*.disk"
    ):  # a disk image whose sandbox folder is gone (a crash mid-release)
        if not image.with_suffix("").exists() and _owned(image):
            with contextlib.suppress(FileNotFoundError):
                image.unlink()
                removed.append(image.name)
    return removed


def list_sandboxes(state_dir: Path) -> list[dict[str, object]]:
    """The local sandboxes in `state_dir`: id, owner uid and pid, whether the owner is alive, labels, creation
    time."""
    found = []
    for meta_file in sorted(state_dir.glob("local-*/meta.json")):
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads(meta_file.read_text())
            pid = int(meta.get("owner_pid", 0))
            alive = meta.get("pidns") == pidns() and start_time(pid) == meta.get("owner_start")
            found.append({"id": meta_file.parent.name, "owner_pid": pid, "owner_alive": alive,
                          "owner_uid": owner_uid(meta, meta_file.parent), "labels": meta.get("labels", {}),
                          "created": meta.get("created")})  # fmt: skip
    return found


def prepare_state_dir(state_dir: Path) -> None:
    """Make sure `state_dir` is a real folder of ours (it usually sits in the shared /tmp), then, once per
    process, remove what dead processes left there."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(state_dir)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise SandboxError(
            f"{state_dir} is not a folder owned by this user; refusing to use it for sandboxes"
        )
    _reap_stale_once(state_dir)


def write_owner_meta(path: Path, **extra: object) -> None:
    meta = {"owner_uid": os.getuid(), "owner_pid": os.getpid(), "owner_start": start_time(os.getpid()),
            "pidns": pidns(), **extra}  # fmt: skip
    write_text(path / "meta.json", json.dumps(meta))


def owner_uid(meta: dict[str, object], folder: Path) -> int | None:
    """The user a sandbox folder belongs to: as its meta.json records it, else (older folders) the folder's own
    owner; None when neither can be read."""
    recorded = meta.get("owner_uid")
    if isinstance(recorded, int):
        return recorded
    try:
        return os.lstat(folder).st_uid
    except OSError:
        return None


def _owned(path: Path) -> bool:
    try:
        return os.lstat(path).st_uid == os.getuid()
    except OSError:
        return False


def _reap_if_stale(root: Path) -> bool:
    meta = None
    for name in ("meta.json", ".owner.json"):
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads((root / name).read_text())
            break
    if meta is None or meta.get("pidns") != pidns():  # another pid namespace: its pids mean nothing here
        return False
    if owner_uid(meta, root) != os.getuid():  # another user's: theirs to remove, even where root could
        return False
    pid = int(meta.get("owner_pid", 0))
    if pid and start_time(pid) == meta.get("owner_start"):
        return False  # the owner is alive
    if meta.get("kind") in ("etc", "disk-templates", "snapshot"):  # /etc copy, disk templates, a snapshot
        shutil.rmtree(root)
        return True
    log.warning("removing sandbox %s left behind by process %s", root.name, pid)
    empty_and_remove([Path(d) for d in meta.get("cgroups", []) if Path(d).exists()])
    mounts = [Path(m) for m in meta.get("mounts", [meta.get("repo_dir", root / "ws" / "repo")])]
    remove_root(root, mounts)
    return True


def start_time(pid: int) -> str | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return fields.rsplit(")", 1)[1].split()[19]


def pidns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


class Reaper:
    """Reaps `state_dir` every `every_s` seconds in a daemon thread while a long-lived process (a worker) runs: what
    a killed run left is gone within about `every_s`, without waiting for the next process to start. `report` is
    called with the names removed and what was known of them just before (`list_sandboxes`)."""

    def __init__(
        self,
        state_dir: Path,
        every_s: float = REAP_EVERY_S,
        report: Callable[[list[str], dict[str, dict[str, object]]], None] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.every_s = every_s
        self.report = report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bugsweep-reaper", daemon=True)

    def start(self) -> Reaper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def reap(self) -> list[str]:
        known = {str(entry["id"]): entry for entry in list_sandboxes(self.state_dir)}
        removed = reap_stale(self.state_dir)
        if removed and self.report is not None:
            self.report(removed, known)
        return removed

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.reap()
            except Exception:  # never end the worker for a cleanup; the next round tries again
                log.warning("could not reap the sandboxes dead processes left", exc_info=True)
