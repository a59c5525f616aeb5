"""The sandbox's workspace on the host: the repository and the task environment as overlayfs copy-on-write
layers (or copies), and git for plain folders.

The repository tree (from `bugsweep.sandbox.sources`) is the bottom read-only layer of an overlayfs whose upper layer
lives in the sandbox's folder under `state_dir` (with the read-only layers of `layers.py` in between), so making a
workspace costs a few milliseconds on any repository size and the user's checkout is never written to. The task
environment (TASK_ENV) is a second overlay, over the interpreter's base venv. Where overlayfs cannot be mounted (not
root, an unsupported filesystem), the tree is copied instead (`cp -a --reflink=auto`) and a warning is logged. A tree owned by another
uid (root working on a user's checkout) is copied too, owned by us: inside, the sandbox user is this process's uid
without capabilities, so it could not write another user's files. A tree without its own `.git` directory gets
`git init` plus one commit inside the overlay, so `git diff` works.

The sandbox's folder: `upper/` and `work/` (the repository overlay's), `env/` with `env-upper/` and `env-work/`
(TASK_ENV), `ws/` (/workspace; the repository is mounted at `ws/repo`), `tmp/` (/tmp), `meta.json` (owner, for
stale-sandbox sweeping); its commands' output is spooled outside it (capture.py). With a disk quota (`disk.py`) the
folder itself is the mount point of the sandbox's size-limited file system, whose image lies beside it
(`<folder>.disk`), so all of these are inside the quota (the read-only layers under the overlays are not: they are
shared).

The overlays are mounted with their layers named as `/proc/self/fd/N` of the mounting process, so their options in
the sandbox's /proc/self/mountinfo name no host path.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from bugsweep.errors import ConfigError, SandboxError
from bugsweep.sandbox.local import disk
from bugsweep.sandbox.local.common import WORKSPACE
from bugsweep.sandbox.local.disk import MS_NODEV, MS_NOSUID, umount

log = logging.getLogger(__name__)

_libc = ctypes.CDLL(None, use_errno=True)

#: The sandbox folder's parts, made before anything is mounted.
SUBDIRS = ("upper", "work", "env", "env-upper", "env-work", "ws", "tmp")

GITCONFIG = (
    "[user]\n\tname = bugsweep\n\temail = bugsweep@localhost\n"
    "[safe]\n\tdirectory = *\n[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n"
)


def check_workdir(workdir: str) -> str:
    normal = os.path.normpath(workdir)
    if not workdir.startswith(WORKSPACE + "/") or normal != workdir or normal == WORKSPACE:
        raise ConfigError(
            f"the local sandbox keeps the repository under {WORKSPACE}/; workdir {workdir!r} is not a plain path "
            f"there (set BUGSWEEP_SANDBOX_WORKDIR to e.g. {WORKSPACE}/repo)"
        )
    return workdir


def copy_tree(src: Path, dest: Path, *, keep_owner: bool = True) -> None:
    argv = ["cp", "-a", "--reflink=auto"] + ([] if keep_owner else ["--no-preserve=ownership"])
    try:
        subprocess.run([*argv, f"{src}/.", str(dest)], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        raise SandboxError(f"could not copy {src} into the sandbox: {exc.stderr.strip()}") from None


def git_init(repo: Path, root: Path) -> None:
    """Make a plain folder (or a worktree whose .git is a file) a repository with one commit, inside the
    workspace only, so that `git diff` inside shows exactly what changed."""
    dotgit = repo / ".git"
    if dotgit.is_file() or dotgit.is_symlink():
        dotgit.unlink()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root), "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_NAME": "bugsweep", "GIT_AUTHOR_EMAIL": "bugsweep@localhost",
        "GIT_COMMITTER_NAME": "bugsweep", "GIT_COMMITTER_EMAIL": "bugsweep@localhost",
    }  # fmt: skip
    try:
        for args in (
            ["init", "-q", "-b", "main"],
            ["add", "-A"],
            ["commit", "-q", "--no-verify", "--allow-empty", "-m", "bugsweep: the files as given"],
        ):
            subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        raise SandboxError(f"could not make {repo} a git repository: {exc.stderr.strip()}") from None


@dataclass
class Overlay:
    """One overlay of the sandbox: read-only `lowers` (top first) under the writable `upper`, seen at `target`;
    or, where overlayfs cannot be mounted, a copy of the lowers at `target` (`mounted` False)."""

    target: Path
    upper: Path
    work: Path
    mounted: bool = False
    copied: bool = False
    """No overlay here: the lowers were copied into `target` (writes then go to the copy)."""

    def mount(self, lowers: list[Path], *, copy_only: bool = False, keep_owner: bool = True) -> None:
        """Mount the overlay; or, in copy mode, copy `lowers` into `target` (bottom first, so upper layers win:
        in copy mode a caller passes only the layers not copied yet)."""
        overlay = not self.copied and not copy_only
        if overlay and mount_overlay(lowers, self.upper, self.work, self.target):
            self.mounted = True
            return
        self.copied = True
        for lower in reversed(lowers):
            copy_tree(lower, self.target, keep_owner=keep_owner)

    def unmount(self) -> None:
        if self.mounted or os.path.ismount(self.target):
            umount(self.target)
        self.mounted = False


def mount_overlay(lowers: list[Path], upper: Path, work: Path, target: Path) -> bool:
    """Mount `lowers` (top first) + `upper` at `target`. False (with a warning) when overlayfs is not available."""
    layers = [os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for path in (*lowers, upper, work)]
    try:  # short, comma-free names that show no host path (the kernel resolves them at mount time)
        names = [f"/proc/self/fd/{fd}" for fd in layers]
        options = f"lowerdir={':'.join(names[:-2])},upperdir={names[-2]},workdir={names[-1]}"
        # nosuid, nodev: as bubblewrap's binds are
        flags = ctypes.c_ulong(MS_NOSUID | MS_NODEV)
        rc = _libc.mount(b"overlay", os.fsencode(target), b"overlay", flags, os.fsencode(options))
    finally:
        for fd in layers:
            os.close(fd)
    if rc == 0:
        return True
    code = ctypes.get_errno()
    log.warning(
        "overlayfs mount failed (%s); copying the repository instead, which is slower on large trees",
        os.strerror(code),
    )
    return False


def remove_root(root: Path, mounts: list[Path]) -> None:
    for target in mounts:
        if os.path.ismount(target):
            umount(target)
        if os.path.ismount(target):  # never delete through a mount
            raise SandboxError(f"{target} is still mounted; leaving {root} in place")
    if os.path.ismount(root):  # the disk quota's file system
        disk.empty_and_unmount(root)
    if root.exists():
        shutil.rmtree(root)
    with contextlib.suppress(FileNotFoundError):
        disk.image_path(root).unlink()


# -------------------------------------------------------------------------------------------------------------
# What a setup command left in the repository's upper layer
# -------------------------------------------------------------------------------------------------------------

Manifest = dict[str, tuple[int, int, int]]


def manifest(upper: Path) -> Manifest:
    """Every entry of an overlay's upper folder outside .git: relative path -> (mode, size, mtime_ns)."""
    found: Manifest = {}
    for dirpath, dirs, files in os.walk(upper):
        rel_dir = os.path.relpath(dirpath, upper)
        if rel_dir == ".":
            dirs[:] = [d for d in dirs if d != ".git"]
        for name in (*dirs, *files):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                found[rel] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def setup_outputs(upper: Path, before: Manifest) -> tuple[list[str], str | None]:
    """What appeared or changed in `upper` since `before`: (paths, why it cannot be moved to a layer or None).
    A deletion (a whiteout or an opaque folder) or a change to a file that was already there stays put."""
    after = manifest(upper)
    outputs = []
    for rel, (mode, size, mtime) in sorted(after.items()):
        old = before.get(rel)
        if stat.S_ISDIR(mode):
            if old is None and _opaque(upper / rel):
                return [], f"the setup replaced the folder {rel}"
            continue
        if old == (mode, size, mtime):
            continue  # there before the setup (the task's own change, e.g. a test file its test patch deletes)
        if stat.S_ISCHR(mode):
            return [], f"the setup deleted {rel}"
        if old is not None:
            return [], f"the setup changed {rel}, which the task had already changed"
        outputs.append(rel)
    return outputs, None


def move_outputs(upper: Path, outputs: list[str], dest: Path) -> None:
    """Move `outputs` from `upper` to `dest`, with their folders (same modes)."""
    for rel in outputs:
        parent = os.path.dirname(rel)
        if parent:
            made = dest / parent
            if not made.is_dir():
                made.mkdir(parents=True)
                for p in PurePosixPath(parent).parents:  # copy the folders' modes along
                    with contextlib.suppress(OSError):
                        shutil.copymode(upper / str(p), dest / str(p), follow_symlinks=False)
                shutil.copymode(upper / parent, made, follow_symlinks=False)
        shutil.move(upper / rel, dest / rel)  # a copy where the upper is on the disk quota's file system


def _opaque(path: Path) -> bool:
    for attr in ("trusted.overlay.opaque", "user.overlay.opaque"):
        with contextlib.suppress(OSError):
            if os.getxattr(path, attr, follow_symlinks=False) == b"y":
                return True
    return False


def move_tree(src: Path, dest: Path) -> None:
    """Move a folder: a rename on one file system; else (the sandbox's disk quota is a file system of its own) a
    copy that keeps special files and extended attributes (overlay whiteouts, opaque folders), then a delete."""
    try:
        os.rename(src, dest)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    dest.mkdir()
    copy_tree(src, dest)
    shutil.rmtree(src)
