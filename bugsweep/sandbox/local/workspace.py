"""The sandbox's workspace on the host: the repository as an overlayfs copy-on-write layer (or a copy), git for
plain folders, and the writable venv for hosts that run bugsweep from a venv.

The repository tree (from `bugsweep.sandbox.sources`) is the read-only lower layer of an overlayfs whose upper layer
lives in the sandbox's folder under `state_dir`, so making a workspace costs a few milliseconds on any repository
size and the user's checkout is never written to. Where overlayfs cannot be mounted (not root, an unsupported
filesystem), the tree is copied instead (`cp -a --reflink=auto`) and a warning is logged. A tree owned by another
uid (root working on a user's checkout) is copied too, owned by us: inside, the sandbox user is this process's uid
without capabilities, so it could not write another user's files. A tree without its own `.git` directory gets
`git init` plus one commit inside the overlay, so `git diff` works.

The sandbox's folder: `upper/` and `work/` (the overlay's), `ws/` (/workspace; the repository is mounted at
`ws/repo`), `tmp/` (/tmp), `spool/` (command output), `meta.json` (owner, for stale-sandbox sweeping). With a disk
quota (`disk.py`) the folder itself is the mount point of the sandbox's size-limited file system, whose image
lies beside it (`<folder>.disk`), so all of these are inside the quota.

The overlay is mounted with its layers named as `/proc/self/fd/N` of the mounting process, so its options in the
sandbox's /proc/self/mountinfo name no host path.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from bugsweep.errors import ConfigError, SandboxError
from bugsweep.sandbox.local import disk
from bugsweep.sandbox.local.common import WORKSPACE, write_text
from bugsweep.sandbox.sources import PreparedSource

log = logging.getLogger(__name__)

_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)

#: The sandbox folder's parts, made before anything is mounted.
SUBDIRS = ("upper", "work", "ws", "tmp", "spool")

GITCONFIG = (
    "[user]\n\tname = bugsweep\n\temail = bugsweep@localhost\n"
    "[safe]\n\tdirectory = *\n[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n"
)


def populate(prepared: PreparedSource, root: Path, repo_dir: Path) -> bool:
    """Put the repository at `repo_dir` (an overlay on `prepared.path`, else a copy) and $HOME's git config in
    `root/ws`; True when an overlay was mounted (release must unmount it)."""
    mounted = False
    owner = prepared.path.stat().st_uid
    if owner != os.geteuid():
        # The sandbox user is this process's uid; files of another owner would be read-only inside (no
        # capabilities there), so such a tree is copied and the copy owned by us.
        log.info(
            "%s belongs to uid %d, not %d: copying it into the sandbox", prepared.path, owner, os.geteuid()
        )
        copy_tree(prepared.path, repo_dir, keep_owner=False)
    else:
        mounted = mount_overlay(prepared.path, root, repo_dir)
        if not mounted:
            copy_tree(prepared.path, repo_dir)
    if not prepared.has_git:
        git_init(repo_dir, root)
    write_text(root / "ws" / ".gitconfig", GITCONFIG)
    return mounted


def check_workdir(workdir: str) -> str:
    normal = os.path.normpath(workdir)
    if not workdir.startswith(WORKSPACE + "/") or normal != workdir or normal == WORKSPACE:
        raise ConfigError(
            f"the local sandbox keeps the repository under {WORKSPACE}/; workdir {workdir!r} is not a plain path "
            f"there (set BUGSWEEP_SANDBOX_WORKDIR to e.g. {WORKSPACE}/repo)"
        )
    return workdir


def mount_overlay(lower: Path, root: Path, target: Path) -> bool:
    """Mount lower + root/upper at target. False (with a warning) when overlayfs is not available here."""
    layers = [
        os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        for path in (lower, root / "upper", root / "work")
    ]
    try:  # short, comma-free names that show no host path (the kernel resolves them at mount time)
        lower_fd, upper_fd, work_fd = (f"/proc/self/fd/{fd}" for fd in layers)
        options = f"lowerdir={lower_fd},upperdir={upper_fd},workdir={work_fd}"
        rc = _libc.mount(b"overlay", os.fsencode(target), b"overlay", ctypes.c_ulong(0), os.fsencode(options))
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


def umount(target: Path) -> None:
    if _libc.umount2(os.fsencode(target), 0) == 0:
        return
    code = ctypes.get_errno()
    if code == errno.EINVAL:  # not mounted
        return
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"umount {target}: {os.strerror(code)}")


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


def remove_root(root: Path, repo_dir: Path, mounted: bool) -> None:
    if mounted or os.path.ismount(repo_dir):
        umount(repo_dir)
    if os.path.ismount(repo_dir):  # never delete through a mount
        raise SandboxError(f"{repo_dir} is still mounted; leaving {root} in place")
    if os.path.ismount(root):  # the disk quota's file system
        disk.empty_and_unmount(root)
    if root.exists():
        shutil.rmtree(root)
    with contextlib.suppress(FileNotFoundError):
        disk.image_path(root).unlink()


def layer_venv(venv: Path) -> None:
    """A writable venv at /workspace/.venv on top of the host's (read-only) venv, for hosts that run bugsweep
    from a venv: there pip cannot fall back to the user scheme (venvs switch user site-packages off), so
    `pip install` would fail. This venv sees the base interpreter's packages (include-system-site-packages) and
    the host venv's (a .pth file), and pip installs into it. Nothing runs: a few files and symlinks."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base_python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    (venv / "bin").mkdir(parents=True)
    site = venv / "lib" / f"python{version}" / "site-packages"
    site.mkdir(parents=True)
    write_text(
        venv / "pyvenv.cfg",
        f"home = {os.path.dirname(base_python)}\ninclude-system-site-packages = true\n"
        f"version = {'.'.join(map(str, sys.version_info[:3]))}\n",
    )
    for name in ("python", "python3", f"python{version}"):
        (venv / "bin" / name).symlink_to(base_python)
    host_sites = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    write_text(site / "_bugsweep_host_venv.pth", "".join(f"{path}\n" for path in host_sites))
    for name in ("pip", "pip3", f"pip{version}"):
        script = venv / "bin" / name
        write_text(script, f'#!/bin/sh\nexec {WORKSPACE}/.venv/bin/python -m pip "$@"\n')
        script.chmod(0o755)
