"""Stale sandboxes: what processes that died without releasing left in the state folder, swept on the next
`create()` (once per process) or by `bugsweep sandboxes`.

Each sandbox folder (and each process's /etc folder) carries its owner's pid, the pid's start time and the pid
namespace; an owner that is gone (or a reused pid with another start time) marks it stale. Folders of another pid
namespace are left alone: their pids mean nothing here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import threading
from pathlib import Path

from bugsweep.errors import SandboxError
from bugsweep.sandbox.local.common import write_text
from bugsweep.sandbox.local.limits import empty_and_remove
from bugsweep.sandbox.local.workspace import remove_root

log = logging.getLogger(__name__)

_reaped: set[Path] = set()
_reap_lock = threading.Lock()


def _reap_stale_once(state_dir: Path) -> None:
    with _reap_lock:
        if state_dir in _reaped:
            return
        _reaped.add(state_dir)
    reap_stale(state_dir)


def reap_stale(state_dir: Path) -> list[str]:
    """Remove what processes that died without releasing left in `state_dir` (their cgroups, overlay mounts and
    folders); the names removed. Sandboxes of live processes, or of another pid namespace, are left alone."""
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
        if not image.with_suffix("").exists():
            with contextlib.suppress(FileNotFoundError):
                image.unlink()
                removed.append(image.name)
    return removed


def list_sandboxes(state_dir: Path) -> list[dict[str, object]]:
    """The local sandboxes in `state_dir`: id, owner pid, whether the owner is alive, labels, creation time."""
    found = []
    for meta_file in sorted(state_dir.glob("local-*/meta.json")):
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads(meta_file.read_text())
            pid = int(meta.get("owner_pid", 0))
            alive = meta.get("pidns") == pidns() and start_time(pid) == meta.get("owner_start")
            found.append({"id": meta_file.parent.name, "owner_pid": pid, "owner_alive": alive,
                          "labels": meta.get("labels", {}), "created": meta.get("created")})  # fmt: skip
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
    meta = {"owner_pid": os.getpid(), "owner_start": start_time(os.getpid()), "pidns": pidns(), **extra}
    write_text(path / "meta.json", json.dumps(meta))


def _reap_if_stale(root: Path) -> bool:
    meta = None
    for name in ("meta.json", ".owner.json"):
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads((root / name).read_text())
            break
    if meta is None or meta.get("pidns") != pidns():  # another pid namespace: its pids mean nothing here
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
