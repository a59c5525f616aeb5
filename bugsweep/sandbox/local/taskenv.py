"""The task environment of a local sandbox: the setup step (run, or a finished layer reused) and snapshots.

`setup_environment` computes the environment key (layers.environment_key), and either stacks the finished layer
under the sandbox's writable layers (nothing is installed: the log says "reused") or runs the setup command and
then moves what it added (the venv's upper layer whole, and the files it left in the repository but bytecode) into
a new layer, published atomically for every later sandbox; a layer is reused only where its repository files hide
none of the sandbox's tree. `snapshot` freezes the writable layers in the same way.
Both rearrange the overlays between two commands: unmount, move folders, mount again (milliseconds).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from bugsweep.errors import SandboxError, SandboxGone
from bugsweep.sandbox.base import Environment, ExecResult
from bugsweep.sandbox.local.files import open_regular
from bugsweep.sandbox.local.layers import (
    BYTECODE,
    PORTABLE_OUTPUT,
    Layer,
    LocalSnapshot,
    dependency_paths,
    environment_key,
    tls_environment,
    version_files,
)
from bugsweep.sandbox.local.stale import write_owner_meta
from bugsweep.sandbox.local.workspace import copy_tree, manifest, move_outputs, move_tree, setup_outputs

if TYPE_CHECKING:
    from bugsweep.sandbox.local import LocalSandbox

log = logging.getLogger(__name__)

_DIST_INFO = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+?)\.(dist-info|egg-info)$")


def setup_environment(
    sbx: LocalSandbox, command: str | None, *, timeout: float, network: bool
) -> tuple[ExecResult | None, Environment]:
    res = sbx._res
    res.check_idle(sbx.id, "set up the environment")
    installer = sbx.settings.installer
    if not command:
        return None, _environment(sbx, None, installer, key="", reused=False)
    files = _dependency_files(sbx, command)
    key = environment_key(sbx.interpreter, command, installer, files)
    cache = sbx.env_cache
    hiding: list[str] = []

    def fits(layer: Layer) -> bool:
        hidden = _hidden_files(sbx, layer)
        hiding.extend(hidden)
        return not hidden

    tree = _tree(sbx) if cache.is_bound(key) else None
    layer = cache.lookup(key, tree, fits=fits)
    if layer is None and hiding and tree is None:
        log.info("setup: the task environment %s would hide %s of this tree", key, hiding[0])
        tree = _tree(sbx)
        layer = cache.lookup(key, tree, fits=fits)
    if layer is not None:
        log.info("setup: reusing the task environment %s (no install runs): %s", layer.path.name, command)
        _restack(sbx, [layer, *res.layers])
        return None, _environment(sbx, command, installer, key=layer.path.name, reused=True)

    log.info("setup: building the task environment %s: %s", key, command)
    # The tree as a later sandbox at this commit sees it before its setup (where the layer is looked up), not as
    # this setup leaves it (an egg-info, a build/ folder, a rewritten version file).
    if tree is None and res.repo.mounted and res.env.mounted:
        with contextlib.suppress(SandboxError):  # then a layer bound to its tree is not kept
            tree = _tree(sbx)
    repo_before = manifest(res.repo.upper) if res.repo.mounted else None
    # UV_COMPILE_BYTECODE: the installed packages' bytecode is made once here and kept with them in the layer (pip
    # makes it unasked); graded runs write none, and would compile pytest and the task's dependencies every run.
    env = {"UV_CACHE_DIR": "/opt/bugsweep/cache/uv", "PIP_CACHE_DIR": "/opt/bugsweep/cache/pip",
           "UV_LINK_MODE": "copy", "UV_PYTHON_DOWNLOADS": "never", "UV_COMPILE_BYTECODE": "1", **tls_environment()}  # fmt: skip
    if installer == "uv":
        env["PATH"] = f"/opt/bugsweep/shims:{sbx._base_env['PATH']}"
    result = sbx.exec(command, timeout=timeout, env=env, network=network, full_output=True, setup=True)
    if not result.ok:
        return result, _environment(sbx, command, installer, key="", reused=False)
    packages, bound = installed_packages(res.env.target)
    name = _publish(sbx, key, tree, repo_before, bound or bool(hiding), version_files(files))
    return result, _environment(sbx, command, installer, key=name, reused=False, packages=packages)


def _publish(
    sbx: LocalSandbox,
    key: str,
    tree: str | None,
    repo_before: dict[str, tuple[int, int, int]] | None,
    bound: bool,
    declared: set[str],
) -> str:
    """Move what the setup added into a new layer and stack it under the sandbox; the layer's name, or '' when
    the result cannot be kept as a layer (the sandbox then keeps it in its own writable layers). `tree`: the
    tree's hash before the setup, the layer's when `bound` to it; `declared`: the version files the build
    configuration names (they do not bind the layer to this tree)."""
    res = sbx._res
    if repo_before is None or not res.env.mounted or not res.repo.mounted:
        log.info("setup: no overlay here, so the environment is not kept for reuse")
        return ""
    outputs, why = setup_outputs(res.repo.upper, repo_before)
    if why:
        log.info("setup: not kept for reuse: %s", why)
        return ""
    outputs = [path for path in outputs if not BYTECODE.search(path)]  # stays in the sandbox's own layer
    if any(not PORTABLE_OUTPUT.search(path) and path not in declared for path in outputs):
        bound = True  # it built files into the repository: only valid for this very tree
    if bound and not tree:
        log.info("setup: not kept for reuse: bound to a tree that could not be hashed")
        return ""
    staging = sbx.env_cache.staging()
    try:
        res.repo.unmount()
        res.env.unmount()
        (staging / "repo").mkdir()
        move_outputs(res.repo.upper, outputs, staging / "repo")
        move_tree(res.env.upper, staging / "venv")
        res.env.upper.mkdir()
        shutil.rmtree(res.env.work, ignore_errors=True)
        res.env.work.mkdir()
        meta: dict[str, object] = {"kind": "setup", "python": sbx.interpreter.version, "interpreter": sbx.interpreter.executable,
                "bound_to_tree": tree if bound else None, "repo_files": outputs}  # fmt: skip
        layer = sbx.env_cache.commit(staging, key, tree if bound else None, meta)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _mount(sbx, res.layers)
        raise
    _restack(sbx, [layer, *res.layers], mounted=False)
    return layer.path.name


def take_snapshot(sbx: LocalSandbox) -> LocalSnapshot:
    res = sbx._res
    res.check_idle(sbx.id, "take a snapshot")
    path = sbx.state_dir / f"snap-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    write_owner_meta(path, kind="snapshot")
    os.rename(path / "meta.json", path / ".owner.json")
    (path / ".lock").touch()
    copies = res.repo.copied or res.env.copied
    try:
        if (
            copies
        ):  # no overlay to freeze: copy both trees whole (.git included); the sandbox goes on as it is
            copy_tree(res.repo_dir, _mkdir(path / "repo"))
            copy_tree(res.env.target, _mkdir(path / "venv"))
            (path / ".complete").touch()
        else:
            res.repo.unmount()
            res.env.unmount()
            for overlay, part in ((res.repo, "repo"), (res.env, "venv")):
                move_tree(overlay.upper, path / part)
                overlay.upper.mkdir()
                shutil.rmtree(overlay.work, ignore_errors=True)
                overlay.work.mkdir()
        source = sbx.source_lease()
        snapshot = LocalSnapshot(
            id=path.name,
            layer=Layer(path),
            below=[] if copies else [below.share() for below in res.layers],
            source=source,
            interpreter=sbx.interpreter,
            disk_mib=sbx._disk_mib,
        )
    except BaseException:
        # The folder goes first: the sandbox may have been released meanwhile (another thread stopping the run:
        # mining's Ctrl-C or SIGTERM), and then it cannot be mounted again and nothing else knows of the folder.
        shutil.rmtree(path, ignore_errors=True)
        if not res.released:
            _mount(sbx, res.layers)
        raise
    try:
        if not copies:
            _restack(sbx, [snapshot.layer.share(), *res.layers], mounted=False)
        if not res.keep_snapshot(snapshot):  # released meanwhile: its cleanup has run, without this snapshot
            raise SandboxGone(f"sandbox {sbx.id} was released while a snapshot of it was taken")
    except BaseException:
        snapshot.release()
        raise
    return snapshot


def installed_packages(venv: Path) -> tuple[list[str], bool]:
    """The distributions installed in the venv at `venv` (`name==version`, sorted), and whether one of them was
    installed from the repository itself without being editable (its code then sits in the venv: the environment
    is only valid for this very source tree). Read from the host without following links out of the venv."""
    packages: set[str] = set()
    bound = False
    for site in sorted(venv.glob("lib/python*/site-packages")):
        if site.is_symlink():
            continue
        with contextlib.suppress(OSError):
            for entry in os.scandir(site):
                found = _DIST_INFO.match(entry.name)
                if not found or not entry.is_dir(follow_symlinks=False):
                    continue
                packages.add(f"{found['name'].replace('_', '-').lower()}=={found['version']}")
                direct = _read_small(venv, os.path.relpath(os.path.join(entry.path, "direct_url.json"), venv))
                if direct and _installed_from_workspace(direct):
                    bound = True
    return sorted(packages), bound


def _installed_from_workspace(direct_url: bytes) -> bool:
    try:
        data = json.loads(direct_url)
    except ValueError:
        return False
    if not isinstance(data, dict):
        return False
    url = str(data.get("url", ""))
    editable = bool((data.get("dir_info") or {}).get("editable"))
    return url.startswith("file:///workspace") and not editable


def _environment(
    sbx: LocalSandbox,
    command: str | None,
    installer: str,
    *,
    key: str,
    reused: bool,
    packages: list[str] | None = None,
) -> Environment:
    if packages is None:
        packages, _ = installed_packages(sbx._res.env.target)
    return Environment(
        python=sbx.interpreter.version,
        setup_command=command,
        packages=packages,
        installer=installer,
        key=key,
        reused=reused,
    )


def _dependency_files(sbx: LocalSandbox, command: str) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for rel in dependency_paths(sbx._res.repo_dir, command):
        with contextlib.suppress(OSError):
            files[rel] = sbx.files.read_bytes(f"{sbx.workdir}/{rel}")
    return files


def _hidden_files(sbx: LocalSandbox, layer: Layer) -> list[str]:
    """The files of `layer`'s repository part that this sandbox's tree has too: stacked over the tree, the layer
    would hide them (e.g. a version file that this commit tracks). None for a layer bound to this very tree: its
    files are what the setup made of them here."""
    meta = layer.meta()
    if meta.get("bound_to_tree"):
        return []
    listed = meta.get("repo_files", [])
    paths = [rel for rel in listed if isinstance(rel, str)] if isinstance(listed, list) else []
    return [rel for rel in paths if sbx.files.exists(f"{sbx.workdir}/{rel}")]


def _tree(sbx: LocalSandbox) -> str:
    """The hash of the repository's tree as it is (committed or not), for setups bound to their source."""
    done = sbx.exec(
        "git add -A . >/dev/null 2>&1 && git write-tree && git reset -q >/dev/null 2>&1", timeout=300
    )
    if not done.ok:
        raise SandboxError(f"could not hash the repository's tree: {done.output.strip()[-300:]}")
    return done.stdout.strip().splitlines()[-1][:16]


def _restack(sbx: LocalSandbox, layers: list[Layer], *, mounted: bool = True) -> None:
    """Mount the overlays again with `layers` (top first) under the writable layers."""
    res = sbx._res
    if mounted:
        res.repo.unmount()
        res.env.unmount()
    _mount(sbx, layers)


def _mount(sbx: LocalSandbox, layers: list[Layer]) -> None:
    """Mount both overlays on `layers`; in copy mode, copy in the layers that are new instead."""
    res = sbx._res
    new = [layer for layer in layers if all(layer.path != old.path for old in res.layers)]
    res.layers = layers
    for overlay, part in ((res.repo, "repo"), (res.env, "venv")):
        if overlay.copied:
            overlay.mount([p for p in (_part(layer, part) for layer in new) if p is not None])
        elif not os.path.ismount(overlay.target):
            overlay.mount(sbx.lowers(part))
    res.write_meta()


def _part(layer: Layer, part: str) -> Path | None:
    return layer.repo if part == "repo" else layer.venv


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _read_small(root: Path, rel: str) -> bytes | None:
    try:
        fd = open_regular(root, rel, os.O_RDONLY)
    except (OSError, Exception):
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read(65536)
