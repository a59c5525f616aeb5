"""The local sandbox: Linux namespaces through bubblewrap, and an overlayfs copy-on-write workspace.

`LocalProvider.create(source)` makes a sandbox in a few milliseconds on any repository size:
1. the repository tree comes from `bugsweep.sandbox.sources` (the working tree as it is, or a cached checkout of a
   ref) and becomes the read-only lower layer of an overlay in the sandbox's folder under `state_dir`
   (`workspace.py`: the user's checkout is never written to; a copy where overlayfs cannot be mounted), and the
   task environment a second overlay at /opt/venv (`layers.py`, `taskenv.py`);
2. a per-sandbox cgroup sets the memory and process limits (`limits.py`; prlimit where no cgroup can be made);
3. every `exec` then runs `/bin/bash -c COMMAND` as one bubblewrap of its own, in the cgroups (`bwrap.py`: a root
   of read-only binds, new user/pid/ipc/uts/cgroup/net namespaces, a clean environment), its whole process tree
   ending with it (`process.py`); files in /workspace and /tmp persist across commands, processes do not;
4. `files` reads and writes the workspace from the host without following anything out of it (`files.py`);
5. `release()` kills every running command, removes the cgroups, unmounts the overlay and deletes the folder
   (`resources.py`); a weakref finaliser runs it at interpreter exit, and what a process killed outright left
   behind is swept by the next `create()` (`stale.py`).

The environment of every command: PATH, HOME (/workspace), LANG, TERM and a few PIP_* settings, plus the `env`
argument: nothing of the host's environment, the model's API key least of all. `network=True` (the setup step)
gets the internet through slirp4netns, never the host's loopback or private networks (`setup_network.py`), when
`settings.setup_network` allows it; every other command sees only `lo`. Every command runs under the seccomp
filter (`seccomp.py`), and everything a sandbox writes is on its own size-limited file system (`disk.py`).

The task environment is a venv at /opt/venv (TASK_ENV), first on PATH, made from the chosen interpreter: a second
overlay over that interpreter's base venv and the environment layers of finished setups (`layers.py`, built and
reused by `taskenv.py`). `snapshot()` freezes the writable layers as one more read-only layer and
`LocalProvider.create_from(snapshot)` stacks a fresh sandbox on it (bugsweep.sandbox.base describes the contract).

Needs: Linux, `bwrap` (Debian `bubblewrap`), root for overlayfs and cgroups (else the fallbacks above).
"""

from __future__ import annotations

import logging
import os
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bugsweep.sandbox.base import TASK_ENV, Environment, ExecResult, RepoSource, SandboxSnapshot, SandboxUsage
from bugsweep.sandbox.local import seccomp, stale, taskenv, workspace
from bugsweep.sandbox.local.bwrap import command_argv, find_bwrap, pip_shims, setup_args, system_etc
from bugsweep.sandbox.local.common import SANDBOX_UID, SANDBOX_USER, WORKSPACE, decode, write_text
from bugsweep.sandbox.local.disk import WritableDisk, templates_dir
from bugsweep.sandbox.local.files import MAX_READ_BYTES, LocalFiles
from bugsweep.sandbox.local.layers import (
    EnvCache,
    Interpreter,
    Layer,
    LocalSnapshot,
    find_interpreter,
    find_uv,
    tls_environment,
)
from bugsweep.sandbox.local.limits import Limits
from bugsweep.sandbox.local.process import RawResult, run_command
from bugsweep.sandbox.local.resources import Resources
from bugsweep.sandbox.local.setup_network import NetworkPlan
from bugsweep.sandbox.local.stale import list_sandboxes, reap_stale
from bugsweep.sandbox.sources import PreparedSource, SourceCache
from bugsweep.settings import SandboxSettings

__all__ = [
    "MAX_READ_BYTES", "SANDBOX_UID", "WORKSPACE", "LocalFiles", "LocalProvider", "LocalSandbox",
    "find_bwrap", "list_sandboxes", "reap_stale",
]  # fmt: skip

log = logging.getLogger(__name__)

MIB = 1024 * 1024


@dataclass
class RepoLayers:
    """Where the repository's layers are on the host (see LocalSandbox.repo_layers)."""

    upper: Path | None
    lowers: list[Path]


class LocalProvider:
    """Creates bubblewrap + overlayfs sandboxes on this machine."""

    name = "local"

    def __init__(
        self,
        settings: SandboxSettings | None = None,
        *,
        cache_dir: Path | None = None,
        state_dir: Path | None = None,
    ) -> None:
        """`cache_dir` holds clones and ref checkouts (default: settings.cache_dir, else ~/.cache/bugsweep);
        `state_dir` holds each sandbox's overlay layers, /workspace and /tmp (default: settings.state_dir, else
        this user's own $TMPDIR/bugsweep-sandboxes-UID)."""
        self.settings = settings or SandboxSettings()
        cache_dir = cache_dir or (Path(self.settings.cache_dir) if self.settings.cache_dir else None)
        state_dir = state_dir or (Path(self.settings.state_dir) if self.settings.state_dir else None)
        self.sources = SourceCache(cache_dir)
        self.state_dir = state_dir or stale.default_state_dir()
        self.env_cache = EnvCache(
            Path(self.settings.env_dir) if self.settings.env_dir else None,
            max_age_days=self.settings.env_max_age_days,
            max_bytes=int(self.settings.env_max_gib * 2**30),
        )

    def create(
        self,
        source: RepoSource,
        *,
        labels: dict[str, str] | None = None,
        disk_mib: int | None = None,
        python: str | None = None,
    ) -> LocalSandbox:
        """A new sandbox with `source` at the workdir, a disk quota of `disk_mib` (default: settings.disk_mib) and
        an empty task environment from `python`. Raises ConfigError when bubblewrap (or what the setup network and
        the seccomp filter need) is missing or cannot create namespaces (never runs anything unisolated) or there is
        no such interpreter, SandboxError when the workspace cannot be made."""
        bwrap_path = find_bwrap()
        workdir = workspace.check_workdir(self.settings.workdir)
        interpreter = find_interpreter(python)
        seccomp.filter_program()  # a missing libseccomp is a ConfigError now, not at the first command
        stale.prepare_state_dir(self.state_dir)
        base = self.env_cache.base(interpreter)
        prepared = self.sources.prepare(source)
        disk_mib = disk_mib or self.settings.disk_mib
        sandbox = LocalSandbox(
            bwrap=bwrap_path, settings=self.settings, workdir=workdir, prepared=prepared,
            state_dir=self.state_dir, interpreter=interpreter, env_cache=self.env_cache, layers=[base],
            labels=labels, disk_mib=disk_mib,
        )  # fmt: skip
        return sandbox

    def create_from(self, snapshot: SandboxSnapshot, *, labels: dict[str, str] | None = None) -> LocalSandbox:
        """A fresh sandbox on `snapshot` (its repository and task environment; a clean $HOME and /tmp)."""
        if not isinstance(snapshot, LocalSnapshot):
            raise TypeError(f"a local sandbox cannot be made from {snapshot!r}")
        bwrap_path = find_bwrap()
        seccomp.filter_program()  # a missing libseccomp is a ConfigError now, not at the first command
        snapshot.acquire()
        disk_mib = snapshot.disk_mib or self.settings.disk_mib
        try:
            sandbox = LocalSandbox(
                bwrap=bwrap_path, settings=self.settings, workdir=workspace.check_workdir(self.settings.workdir),
                prepared=snapshot.source, state_dir=self.state_dir, interpreter=snapshot.interpreter,
                env_cache=self.env_cache, layers=[layer.share() for layer in snapshot.stack], labels=labels,
                snapshot=snapshot, disk_mib=disk_mib,
            )  # fmt: skip
        except BaseException:
            snapshot.drop()
            raise
        return sandbox

    def sandboxes(self) -> list[dict[str, object]]:
        """The sandboxes in this provider's state_dir (any process's): id, owner, labels, creation time."""
        return list_sandboxes(self.state_dir)

    def reap_stale(self) -> list[str]:
        """Remove sandboxes this user's processes left behind when they died without releasing them; their ids."""
        return reap_stale(self.state_dir)

    def reaper(
        self, report: Callable[[list[str], dict[str, dict[str, object]]], None] | None = None
    ) -> stale.Reaper:
        """A reaper of this provider's state folder for a long-lived process (`bugsweep worker`): started, it reaps
        every stale.REAP_EVERY_S seconds, calling `report` with what it removed."""
        return stale.Reaper(self.state_dir, report=report)


def _templates_meta(path: Path) -> None:
    stale.write_owner_meta(path, kind="disk-templates")


class LocalSandbox:
    """One task's sandbox on this machine. See the package docstring for what is isolated and how."""

    def __init__(
        self,
        *,
        bwrap: str,
        settings: SandboxSettings,
        workdir: str,
        prepared: PreparedSource,
        state_dir: Path,
        interpreter: Interpreter,
        env_cache: EnvCache,
        layers: list[Layer],
        labels: dict[str, str] | None = None,
        snapshot: LocalSnapshot | None = None,
        disk_mib: int | None = None,
    ) -> None:
        self._disk_mib = disk_mib
        self._etc_dir = system_etc(state_dir)
        self._templates = templates_dir(state_dir, _templates_meta)
        #: The folders every disk starts with (in its template): allocating the first inodes of a fresh file
        #: system reads its bitmaps through the loop device, ~1.5 ms for the first mkdir.
        self._skeleton = (*workspace.SUBDIRS, f"ws/{os.path.relpath(workdir, WORKSPACE)}")
        pip_shims(self._etc_dir)  # before a disk template copies this folder, so that every disk has them
        self.id = f"local-{uuid.uuid4().hex[:12]}"
        self.state_dir = state_dir
        self.interpreter = interpreter
        self.env_cache = env_cache
        self.workdir = workdir
        self.labels = dict(labels or {})
        self.usage = SandboxUsage()
        self.files = LocalFiles(self)
        self.settings = settings
        self.source = prepared
        root = state_dir / self.id
        self._res = Resources(root=root, repo_dir=root / "ws" / os.path.relpath(workdir, WORKSPACE))
        self._res.lease = prepared.lease if snapshot is None else prepared.lease and prepared.lease.share()
        self._res.labels = self.labels
        self._res.layers = layers
        self._res.snapshot = snapshot
        self._finalizer = weakref.finalize(self, self._res.cleanup)
        try:
            self._setup(bwrap, prepared)
        except BaseException:
            self._finalizer()
            raise

    def _setup(self, bwrap_path: str, prepared: PreparedSource) -> None:
        res = self._res
        res.root.mkdir()
        if self._disk_mib:  # everything the sandbox writes goes on its own size-limited file system
            res.disk = WritableDisk.create(
                res.root,
                self._disk_mib * MIB,
                self._templates,
                etc_dir=self._etc_dir,
                skeleton=self._skeleton,
            )
        if res.disk is not None:
            self.usage.disk_quota_bytes = res.disk.size_bytes
            self.usage.peak_disk_bytes = res.disk.peak_bytes
        for sub in workspace.SUBDIRS:  # on a disk, its template has them already
            (res.root / sub).mkdir(parents=True, exist_ok=True)
        res.repo_dir.mkdir(parents=True, exist_ok=True)
        res.write_meta()  # from here on, a crash leaves a folder that stale.py can sweep
        owner = prepared.path.stat().st_uid
        if owner != os.geteuid():
            # The sandbox user is this process's uid; files of another owner would be read-only inside (no
            # capabilities there), so such a tree is copied and the copy owned by us.
            log.info(
                "%s belongs to uid %d, not %d: copying it into the sandbox",
                prepared.path,
                owner,
                os.geteuid(),
            )
        res.repo.mount(self.lowers("repo"), copy_only=owner != os.geteuid(), keep_owner=owner == os.geteuid())
        res.env.mount(self.lowers("venv"))
        if not prepared.has_git and res.snapshot is None:
            workspace.git_init(res.repo_dir, res.root)
        write_text(res.root / "ws" / ".gitconfig", workspace.GITCONFIG)
        res.limits = Limits.create(self.id, self.settings.memory_mib * MIB, self.settings.max_processes)
        res.write_meta()  # with the cgroups
        self._base_env = {
            "PATH": f"{TASK_ENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "VIRTUAL_ENV": TASK_ENV, "HOME": WORKSPACE, "USER": SANDBOX_USER, "LOGNAME": SANDBOX_USER,
            "SHELL": "/bin/bash", "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": "/tmp",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
        }  # fmt: skip
        wrapper = res.limits.wrapper()
        self._bwrap_at = len(wrapper)
        etc_dir = (
            res.root / "etc" if res.disk is not None else self._etc_dir
        )  # the disk's copy shows no host path
        self._argv_head = command_argv(
            bwrap_path, etc_dir=etc_dir, root=res.root, wrapper=wrapper,
            interpreter=self.interpreter.binds(), uv=find_uv(), shims=pip_shims(etc_dir),
        )  # fmt: skip

    def lowers(self, part: str) -> list[Path]:
        """The read-only folders under the repository ('repo') or the task environment ('venv'), top first."""
        found: list[Path] = []
        for layer in self._res.layers:
            path = layer.repo if part == "repo" else layer.venv
            if path is not None:
                found.append(path)
            if layer.complete:
                return found
        return [*found, self.source.path] if part == "repo" else found

    def source_lease(self) -> PreparedSource:
        """The source again, with its own lease (for a snapshot that may outlive this sandbox)."""
        lease = self.source.lease.share() if self.source.lease is not None else None
        return PreparedSource(self.source.path, self.source.has_git, self.source.commit, lease)

    def repo_layers(self) -> RepoLayers:
        """Host paths of the repository's writable layer (what changed since the last snapshot or setup) and of
        the read-only layers under it, top first; `upper` is None where no overlay is used (a copy)."""
        res = self._res
        return RepoLayers(upper=res.repo.upper if res.repo.mounted else None, lowers=self.lowers("repo"))

    # -- the task environment --------------------------------------------------------------------------------

    def setup_environment(
        self, command: str | None, *, timeout: float = 1800.0, network: bool = True
    ) -> tuple[ExecResult | None, Environment]:
        """See the Sandbox protocol and taskenv.py."""
        return taskenv.setup_environment(self, command, timeout=timeout, network=network)

    def snapshot(self) -> LocalSnapshot:
        """See the Sandbox protocol and taskenv.py."""
        return taskenv.take_snapshot(self)

    # -- commands --------------------------------------------------------------------------------------------

    def exec(
        self,
        command: str,
        *,
        timeout: float = 300.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        network: bool = False,
        full_output: bool = False,
        stdin: str | None = None,
        setup: bool = False,
    ) -> ExecResult:
        """Run `command` under bash in `cwd` (default: workdir); see the Sandbox protocol.

        `network=True` gives this command the setup network (the internet, not the host: setup_network.py) when
        `settings.setup_network` allows it; `setup=True` also binds the shared download cache (only the setup
        step's commands get it)."""
        raw = self._run(
            command,
            timeout=timeout,
            cwd=cwd,
            env=env,
            network=network,
            full_output=full_output,
            stdin=stdin.encode() if stdin is not None else None,
            setup=setup,
        )
        return ExecResult(
            exit_code=raw.exit_code,
            stdout=decode(raw.stdout),
            stderr=decode(raw.stderr),
            timed_out=raw.timed_out,
            truncated=raw.truncated,
            duration_s=raw.duration_s,
            out_of_memory=raw.out_of_memory,
            disk_full=raw.disk_full,
            too_much_output=raw.too_much_output,
        )

    def _run(
        self,
        command: str,
        *,
        timeout: float,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        network: bool = False,
        full_output: bool = False,
        stdin: bytes | None = None,
        setup: bool = False,
    ) -> RawResult:
        self._res.check_alive(self.id)
        environ = dict(self._base_env)
        if network:  # installs trust the host's TLS roots (where the host names them: not secrets)
            environ.update(tls_environment())
        for key, value in (env or {}).items():
            if not key or "=" in key or "\0" in key or "\0" in value:
                raise ValueError(f"bad environment variable {key!r}")
            environ[key] = value
        if cwd and not cwd.startswith("/"):
            cwd = f"{self.workdir}/{cwd}"
        raw = run_command(
            self._res,
            self.id,
            self._argv_head,
            command,
            cwd=cwd or self.workdir,
            environ=environ,
            # made at the first setup command: a missing slirp4netns is a ConfigError only for tasks that need it
            network=NetworkPlan.for_host(self.settings.setup_network_allow)
            if network and self.settings.setup_network
            else None,
            extra=setup_args(self.env_cache.download_cache) if setup else [],
            timeout=timeout,
            full_output=full_output,
            stdin=stdin,
            bwrap_at=self._bwrap_at,
        )
        self.usage.commands += 1
        self.usage.command_seconds += raw.duration_s
        self._note_usage()
        return raw

    def _note_usage(self) -> None:
        """Peak memory and CPU time from the cgroups, peak disk from the quota's samples (read after every
        command: the cgroups are gone after release)."""
        res = self._res
        if res.limits is not None:
            self.usage.peak_memory_bytes = res.limits.peak_memory_bytes()
            self.usage.cpu_s = res.limits.cpu_seconds()
        if res.disk is not None:
            self.usage.peak_disk_bytes = res.disk.peak_bytes

    def release(self) -> None:
        """Kill every process, remove the cgroups, unmount the overlay, delete the folder. Idempotent; never raises."""
        try:
            self._finalizer()
        except Exception:  # the finaliser logs its own failures; this is the last guard of "never raises"
            log.exception("releasing sandbox %s failed", self.id)

    @property
    def released(self) -> bool:
        return self._res.released

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<LocalSandbox {self.id} workdir={self.workdir}>"
