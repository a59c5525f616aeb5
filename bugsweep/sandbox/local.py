"""The local sandbox: Linux namespaces through bubblewrap, and an overlayfs copy-on-write workspace.

How a sandbox is made (`LocalProvider.create`):
- The repository tree comes from `bugsweep.sandbox.sources` (the working tree as it is, or a cached checkout of a
  ref). It is the read-only lower layer of an overlayfs whose upper layer lives in a per-sandbox folder under
  `state_dir` (default: $TMPDIR/bugsweep-sandboxes/<id>/), so creating a sandbox costs a few milliseconds on any
  repository size and the user's checkout is never written to. Where overlayfs cannot be mounted (not root, an
  unsupported filesystem), the tree is copied instead (`cp -a --reflink=auto`) and a warning is logged. A tree
  owned by another uid (root working on a user's checkout) is copied too, owned by us: inside, the sandbox user
  is this process's uid without capabilities, so it could not write another user's files.
  A tree without its own `.git` directory gets `git init` plus one commit inside the overlay, so `git diff` works.
- Limits come from a per-sandbox cgroup (v1 `memory` + `pids` controllers, or v2 `memory.max` + `pids.max`): the
  memory limit makes the kernel OOM-kill the biggest process (exit 137, `out_of_memory=True`), the process limit
  makes fork() fail inside (a fork bomb stalls, the host is unharmed). Where no cgroup can be created (non-root,
  undelegated cgroup v2), `prlimit` sets RLIMIT_AS and RLIMIT_NPROC instead: weaker (RLIMIT_NPROC does not bind
  root), and a warning says so.

How a command runs (`LocalSandbox.exec`): each command is one `bwrap ... /bin/bash -c COMMAND` with
- a root made only of read-only binds: /usr (and the /bin, /lib* links), an allow-list of /etc entries that git,
  Python, bash and pip need, a generated /etc/passwd and /etc/group, and the host's Python installation at its own
  path (e.g. /root/.pyenv/versions/3.11.7; nothing else of /root is there), then the root is remounted read-only;
- `/workspace` writable (HOME; the repository at /workspace/repo; `pip install` defaults to the user scheme in
  /workspace/.local because the host's site-packages is read-only; when the host Python is a venv, where there
  is no user scheme, a venv at /workspace/.venv layered on it takes the installs), a private `/tmp`, its own
  /proc and a minimal /dev; /workspace and /tmp persist across the sandbox's commands;
- new user (uid 1000, no capabilities, no_new_privs, no nested user namespaces with bubblewrap 0.8+), pid, ipc,
  uts, cgroup and network namespaces; `network=True` (the setup step, e.g. `pip install`) shares the host's
  network instead (host loopback services included), everything else sees only `lo`;
- `--die-with-parent`, `--new-session`, and a clean environment (PATH, HOME, LANG, TERM and a few PIP_* settings,
  plus the `env` argument): nothing of the host's environment, the model's API key least of all.
Because each command gets its own pid namespace, killing the namespace's init kills the whole process tree at once:
that is how a timeout ends a command, and why background processes (`server &`) end with the command that started
them. Files in /workspace and /tmp persist; processes do not.

Output goes to unlinked spool files on the host, never into memory: a caller gets the last OUTPUT_LIMIT_BYTES of
each stream (`truncated=True` when more was written), or everything with `full_output=True`.

`release()` kills every running command, empties and removes the cgroups, unmounts the overlay and deletes the
folder. A weakref finaliser runs it at interpreter exit; a process killed outright leaves its folder behind, and the
next `create()` in the same pid namespace cleans up folders whose owner process is gone.

Needs: Linux, `bwrap` (Debian `bubblewrap`), root for overlayfs and cgroups (else the fallbacks above).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import json
import logging
import os
import re
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bugsweep.errors import ConfigError, SandboxError, SandboxGone
from bugsweep.sandbox.base import OUTPUT_LIMIT_BYTES, ExecResult, RepoSource, SandboxUsage
from bugsweep.sandbox.sources import CheckoutLease, PreparedSource, SourceCache
from bugsweep.settings import SandboxSettings

log = logging.getLogger(__name__)

#: The user commands run as inside the sandbox (mapped to the caller's own uid on the host).
SANDBOX_UID = 1000
SANDBOX_USER = "sandbox"
#: Writable inside; HOME, the repository's parent, and where `pip install` puts packages (the user scheme).
WORKSPACE = "/workspace"

INSTALL_HINT = (
    "install bubblewrap: `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap` (Fedora)"
)

#: /etc entries bound read-only when they exist: what bash, git, Python, pip and TLS need, nothing with secrets
#: (no shadow, no ssh keys, no pip.conf or gitconfig that may hold credentials, no /etc/environment).
ETC_ALLOW = (
    "alternatives", "bash.bashrc", "ca-certificates", "ca-certificates.conf", "crypto-policies", "debian_version",
    "gai.conf", "host.conf", "hosts", "inputrc", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "locale.alias",
    "localtime", "magic", "magic.mime", "mime.types", "networks", "nsswitch.conf", "os-release", "perl", "pki",
    "profile", "protocols", "python3", "resolv.conf", "services", "shells", "ssl", "terminfo", "timezone",
)  # fmt: skip

#: Longer commands are passed to bash as a script file (Linux caps one argument at 128 KiB).
_MAX_ARG_BYTES = 64 * 1024
#: files.read_text/read_bytes refuse bigger files, so a sandboxed process cannot make the host read 100 GB.
MAX_READ_BYTES = 64 * 1024 * 1024

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_ATTACH_SCRIPT = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do '
    'echo $$ > "$1" 2>/dev/null || { echo "bugsweep: cannot join cgroup $1" >&2; exit 125; }; '
    'shift; n=$((n-1)); done; exec "$@"'
)
_ATTACH_FAILED = b"bugsweep: cannot join cgroup"
_CHILD_PID = re.compile(rb'"child-pid":\s*(\d+)\s*[,}\n]')

# openat2(2) keeps host-side file access inside a folder (no `..`, no absolute or magic symlinks out of it).
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


# -------------------------------------------------------------------------------------------------------------
# Provider
# -------------------------------------------------------------------------------------------------------------


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
        $TMPDIR/bugsweep-sandboxes)."""
        self.settings = settings or SandboxSettings()
        cache_dir = cache_dir or (Path(self.settings.cache_dir) if self.settings.cache_dir else None)
        state_dir = state_dir or (Path(self.settings.state_dir) if self.settings.state_dir else None)
        self.sources = SourceCache(cache_dir)
        self.state_dir = state_dir or Path(tempfile.gettempdir()) / "bugsweep-sandboxes"

    def create(self, source: RepoSource, *, labels: dict[str, str] | None = None) -> LocalSandbox:
        """A new sandbox with `source` at the workdir. Raises ConfigError when bubblewrap is missing or cannot
        create namespaces (never runs anything unisolated), SandboxError when the workspace cannot be made."""
        bwrap = find_bwrap()
        workdir = _check_workdir(self.settings.workdir)
        _prepare_state_dir(self.state_dir)
        prepared = self.sources.prepare(source)
        return LocalSandbox(
            bwrap=bwrap,
            settings=self.settings,
            workdir=workdir,
            prepared=prepared,
            state_dir=self.state_dir,
            labels=labels,
        )

    def sandboxes(self) -> list[dict[str, object]]:
        """The sandboxes in this provider's state_dir (any process's): id, owner, labels, creation time."""
        return list_sandboxes(self.state_dir)

    def reap_stale(self) -> list[str]:
        """Remove sandboxes left behind by processes that died without releasing them; their ids."""
        return reap_stale(self.state_dir)


def find_bwrap() -> str:
    """The path of a working `bwrap`. Raises ConfigError naming the fix when it is missing or cannot make
    namespaces here. The namespace check runs once per process."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ConfigError(
            f"the local sandbox needs bubblewrap (`bwrap`), which is not on PATH: {INSTALL_HINT}"
        )
    if bwrap not in _bwrap_hardening:
        with _bwrap_lock:
            if bwrap not in _bwrap_hardening:
                _bwrap_hardening[bwrap] = _probe_bwrap(bwrap)
    return bwrap


#: bwrap path -> the hardening options it supports (checked once per process).
_bwrap_hardening: dict[str, list[str]] = {}
_bwrap_lock = threading.Lock()


def _probe_bwrap(bwrap: str) -> list[str]:
    """Check that bwrap can make the namespaces here; return the optional hardening it supports
    (`--disable-userns`, bubblewrap 0.8+: no nested user namespaces inside, a smaller kernel surface)."""
    try:
        usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        usage = ""
    hardening = ["--disable-userns"] if "--disable-userns" in usage else []
    argv = [
        bwrap,
        *_namespace_args(bwrap, hardening),
        "--unshare-net",
        *_system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "true",
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"bubblewrap at {bwrap} could not be run ({exc}): {INSTALL_HINT}") from None
    if proc.returncode != 0:
        raise ConfigError(
            f"bubblewrap cannot create the sandbox's namespaces here: {proc.stderr.strip() or proc.returncode}. "
            "Allow user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; on "
            "Ubuntu 24.04+ kernel.apparmor_restrict_unprivileged_userns=0), or run in a container started with "
            f"--privileged or seccomp=unconfined; {INSTALL_HINT}"
        )
    return hardening


def _check_workdir(workdir: str) -> str:
    normal = os.path.normpath(workdir)
    if not workdir.startswith(WORKSPACE + "/") or normal != workdir or normal == WORKSPACE:
        raise ConfigError(
            f"the local sandbox keeps the repository under {WORKSPACE}/; workdir {workdir!r} is not a plain path "
            f"there (set BUGSWEEP_SANDBOX_WORKDIR to e.g. {WORKSPACE}/repo)"
        )
    return workdir


# -------------------------------------------------------------------------------------------------------------
# The sandbox
# -------------------------------------------------------------------------------------------------------------


@dataclass
class _RawResult:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    truncated: bool
    duration_s: float
    out_of_memory: bool


class LocalSandbox:
    """One task's sandbox on this machine. See the module docstring for what is isolated and how."""

    def __init__(
        self,
        *,
        bwrap: str,
        settings: SandboxSettings,
        workdir: str,
        prepared: PreparedSource,
        state_dir: Path,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.id = f"local-{uuid.uuid4().hex[:12]}"
        self._etc_dir = _system_etc(state_dir)
        self.workdir = workdir
        self.labels = dict(labels or {})
        self.usage = SandboxUsage()
        self.files = LocalFiles(self)
        self.settings = settings
        self.source = prepared
        root = state_dir / self.id
        self._res = _Resources(root=root, repo_dir=root / "ws" / os.path.relpath(workdir, WORKSPACE))
        self._res.lease = prepared.lease
        self._res.labels = self.labels
        self._finalizer = weakref.finalize(self, self._res.cleanup)
        try:
            self._setup(bwrap, prepared)
        except BaseException:
            self._finalizer()
            raise

    # -- creation --------------------------------------------------------------------------------------------

    def _setup(self, bwrap: str, prepared: PreparedSource) -> None:
        res = self._res
        for sub in ("upper", "work", "ws", "tmp", "spool"):
            (res.root / sub).mkdir(parents=True)
        res.repo_dir.mkdir(parents=True)
        res.write_meta()

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
            _copy_tree(prepared.path, res.repo_dir, keep_owner=False)
        else:
            res.mounted = _mount_overlay(prepared.path, res.root, res.repo_dir)
            if not res.mounted:
                _copy_tree(prepared.path, res.repo_dir)
        if not prepared.has_git:
            _git_init(res.repo_dir, res.root)

        _write(
            res.root / "ws" / ".gitconfig",
            "[user]\n\tname = bugsweep\n\temail = bugsweep@localhost\n"
            "[safe]\n\tdirectory = *\n[init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n",
        )

        res.limits = _Limits.create(
            self.id, self.settings.memory_mib * 1024 * 1024, self.settings.max_processes
        )
        res.write_meta()

        python_bins = _python_bins()
        if sys.prefix != sys.base_prefix:  # the host Python is a venv, where pip has no user scheme
            _layer_venv(res.root / "ws" / ".venv")
            python_bins.insert(0, f"{WORKSPACE}/.venv/bin")
        self._base_env = {
            "PATH": ":".join([f"{WORKSPACE}/.local/bin", *python_bins, "/usr/local/sbin", "/usr/local/bin",
                              "/usr/sbin", "/usr/bin", "/sbin", "/bin"]),
            "HOME": WORKSPACE, "USER": SANDBOX_USER, "LOGNAME": SANDBOX_USER, "SHELL": "/bin/bash",
            "LANG": "C.UTF-8", "TERM": "dumb", "TMPDIR": "/tmp",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_BREAK_SYSTEM_PACKAGES": "1", "PIP_NO_INPUT": "1",
        }  # fmt: skip
        self._argv_head = [
            *res.limits.wrapper(),
            bwrap,
            *_namespace_args(bwrap),
            "--hostname", "sandbox",
            *_system_binds(),
            "--ro-bind", str(self._etc_dir), "/etc",
            "--proc", "/proc",
            "--dev", "/dev",
            "--bind", str(res.root / "tmp"), "/tmp",
            "--dir", "/var", "--symlink", "/tmp", "/var/tmp",
            "--bind", str(res.root / "ws"), WORKSPACE,
            *_python_binds(),  # last: a Python (or venv) under /tmp must not be hidden by the private /tmp
            "--remount-ro", "/",
        ]  # fmt: skip

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
    ) -> ExecResult:
        """Run `command` under bash in `cwd` (default: workdir); see the Sandbox protocol.

        `network=True` shares the host's network for this command when `settings.setup_network` allows it."""
        raw = self._run(
            command,
            timeout=timeout,
            cwd=cwd,
            env=env,
            network=network,
            full_output=full_output,
            stdin=stdin.encode() if stdin is not None else None,
        )
        return ExecResult(
            exit_code=raw.exit_code,
            stdout=_decode(raw.stdout),
            stderr=_decode(raw.stderr),
            timed_out=raw.timed_out,
            truncated=raw.truncated,
            duration_s=raw.duration_s,
            out_of_memory=raw.out_of_memory,
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
    ) -> _RawResult:
        res = self._res
        res.check_alive(self.id)
        environ = dict(self._base_env)
        for key, value in (env or {}).items():
            if not key or "=" in key or "\0" in key or "\0" in value:
                raise ValueError(f"bad environment variable {key!r}")
            environ[key] = value
        if cwd and not cwd.startswith("/"):
            cwd = f"{self.workdir}/{cwd}"
        oom_before = res.limits.oom_kills() if res.limits else 0
        with contextlib.ExitStack() as stack:
            try:
                out = stack.enter_context(tempfile.TemporaryFile(dir=res.root / "spool"))
                err = stack.enter_context(tempfile.TemporaryFile(dir=res.root / "spool"))
                stdin_file = stack.enter_context(_stdin_file(stdin, res.root / "spool"))
            except OSError:
                res.check_alive(self.id)  # released meanwhile: SandboxGone
                raise
            info_r, info_w = os.pipe()
            stack.callback(os.close, info_r)
            argv = [*self._argv_head, "--info-fd", str(info_w)]
            if not (network and self.settings.setup_network):
                argv.append("--unshare-net")
            if len(command.encode()) <= _MAX_ARG_BYTES:
                argv += ["--chdir", cwd or self.workdir, "/bin/bash", "-c", command]
            else:  # the kernel refuses a single argument over 128 KiB (a big heredoc): run it from a file
                script = res.root / "tmp" / f".bugsweep-command-{uuid.uuid4().hex}.sh"
                script.write_text(command)
                stack.callback(script.unlink, missing_ok=True)
                argv += ["--chdir", cwd or self.workdir, "/bin/bash", f"/tmp/{script.name}"]

            start = time.monotonic()
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=stdin_file,
                    stdout=out,
                    stderr=err,
                    env=environ,
                    close_fds=True,
                    pass_fds=(info_w,),
                    cwd="/",
                )
            except OSError as exc:
                raise SandboxError(f"could not start bubblewrap: {exc}") from exc
            finally:
                os.close(info_w)
            cmd = _Command(proc)
            try:
                if not res.track(cmd):
                    cmd.kill()
                    raise SandboxGone(f"sandbox {self.id} was released")
                cmd.read_info(info_r, timeout)
                timed_out = not cmd.wait(timeout - (time.monotonic() - start))
                if timed_out:
                    cmd.kill()
            except BaseException:  # e.g. KeyboardInterrupt: the command must not outlive its caller
                cmd.kill()
                raise
            finally:
                cmd.close()
                res.untrack(cmd)
            duration = time.monotonic() - start
            if res.released:
                raise SandboxGone(f"sandbox {self.id} was released while `{_short(command)}` was running")
            stdout, cut_out = _read_spool(out, full_output)
            stderr, cut_err = _read_spool(err, full_output)

        if proc.returncode == 125 and _ATTACH_FAILED in stderr:
            res.check_alive(self.id)
            raise SandboxError(f"sandbox {self.id}: {_decode(stderr).strip()}")
        if cmd.init_pid is None and not timed_out:  # bwrap never got as far as starting the command
            res.check_alive(self.id)
            raise SandboxError(f"bubblewrap could not start the command: {_decode(stderr[-2000:]).strip()}")
        out_of_memory = bool(res.limits and res.limits.oom_kills() > oom_before)
        self.usage.commands += 1
        self.usage.command_seconds += duration
        return _RawResult(
            exit_code=None if timed_out else proc.returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            truncated=cut_out or cut_err,
            duration_s=duration,
            out_of_memory=out_of_memory,
        )

    # -- lifetime --------------------------------------------------------------------------------------------

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


# -------------------------------------------------------------------------------------------------------------
# Files
# -------------------------------------------------------------------------------------------------------------


class LocalFiles:
    """File access by absolute sandbox path (a relative path is taken relative to the workdir).

    Paths under /workspace and /tmp are read and written from the host through openat2(RESOLVE_BENEATH), which
    refuses `..` and symlinks that would leave those folders. Anything else (other paths, a `..`, a symlink
    pointing elsewhere) is done by a command inside the sandbox, so it sees exactly what a command would see:
    a link to /etc/shadow or to a host project folder finds nothing, because neither exists in there.
    Text is decoded as UTF-8 with replacement characters for bytes that are not.
    """

    def __init__(self, sandbox: LocalSandbox) -> None:
        self._sbx = sandbox

    def read_text(self, path: str) -> str:
        return _decode(self.read_bytes(path))

    def read_bytes(self, path: str) -> bytes:
        self._sbx._res.check_alive(self._sbx.id)
        located = self._locate(path)
        if located is not None:
            with contextlib.suppress(_Fallback), _named(path):
                fd = _open_regular(*located, os.O_RDONLY)
                with os.fdopen(fd, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    if size > MAX_READ_BYTES:
                        raise _too_big(path, size)
                    return fh.read(MAX_READ_BYTES + 1)
        q = shlex.quote(self._absolute(path))
        raw = self._sbx._run(
            f"if [ -d {q} ]; then exit 21; fi; if [ -e {q} ] && [ ! -f {q} ]; then exit 28; fi; "
            f"if [ -f {q} ] && [ $(stat -L -c %s -- {q}) -gt {MAX_READ_BYTES} ]; then exit 27; fi; "
            f"exec head -c {MAX_READ_BYTES + 1} -- {q}",
            timeout=120,
            full_output=True,
        )
        if raw.exit_code == 0 and len(raw.stdout) <= MAX_READ_BYTES:
            return raw.stdout
        if raw.exit_code in (0, 27):
            raise _too_big(path, None)
        raise _os_error(raw, path)

    def write(self, path: str, data: str | bytes) -> None:
        """Write the file, creating missing parent folders."""
        self._sbx._res.check_alive(self._sbx.id)
        payload = data.encode() if isinstance(data, str) else data
        located = self._locate(path)
        if located is not None:
            with contextlib.suppress(_Fallback), _named(path):
                fd = _open_regular(*located, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, make_parents=True)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(payload)
                return
        q = shlex.quote(self._absolute(path))
        raw = self._sbx._run(
            f'if [ -e {q} ] && [ ! -f {q} ]; then exit 28; fi; mkdir -p -- "$(dirname -- {q})" && cat > {q}',
            timeout=120,
            full_output=True,
            stdin=payload,
        )
        if raw.exit_code != 0:
            raise _os_error(raw, path)

    def exists(self, path: str) -> bool:
        self._sbx._res.check_alive(self._sbx.id)
        located = self._locate(path)
        if located is not None:
            try:
                os.close(_open_beneath(*located, os.O_PATH))
                return True
            except (FileNotFoundError, NotADirectoryError):
                return False
            except _Fallback:
                pass
        raw = self._sbx._run(f"test -e {shlex.quote(self._absolute(path))}", timeout=60)
        return raw.exit_code == 0

    def _absolute(self, path: str) -> str:
        return path if path.startswith("/") else f"{self._sbx.workdir}/{path}"

    def _locate(self, path: str) -> tuple[Path, str] | None:
        """(host folder, path relative to it) for paths in the writable areas, else None."""
        parts = [p for p in self._absolute(path).split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            return None
        root = self._sbx._res.root
        areas = {WORKSPACE.strip("/"): root / "ws", "tmp": root / "tmp"}
        if parts[0] not in areas:
            return None
        return areas[parts[0]], "/".join(parts[1:]) or "."


@contextlib.contextmanager
def _named(path: str) -> Iterator[None]:
    """Errors from the host-side walk name the sandbox path the caller gave, not the host-relative one."""
    try:
        yield
    except OSError as exc:
        if exc.errno is None or exc.filename == path:
            raise
        raise type(exc)(exc.errno, exc.strerror, path) from None


class _Fallback(Exception):
    """The host-side path walk would leave its folder: do the operation inside the sandbox instead."""


def _openat2(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_long(dirfd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        code = ctypes.get_errno()
        if code in (errno.EXDEV, errno.ELOOP, errno.ENOSYS, errno.EPERM, errno.EAGAIN, errno.E2BIG):
            raise _Fallback(path)
        raise OSError(code, os.strerror(code), path)
    return int(fd)


def _open_beneath(root: Path, rel: str, flags: int, *, make_parents: bool = False) -> int:
    """Open `root/rel` without leaving `root` (openat2 RESOLVE_BENEATH), optionally creating parent folders one
    at a time (each mkdirat relative to an already checked folder, so a symlinked parent cannot redirect it)."""
    dirfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if make_parents and "/" in rel:
            *parents, rel = rel.split("/")
            for name in parents:
                try:
                    nfd = _openat2(dirfd, name, os.O_PATH | os.O_DIRECTORY)
                except FileNotFoundError:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, dir_fd=dirfd)
                    nfd = _openat2(dirfd, name, os.O_PATH | os.O_DIRECTORY)
                os.close(dirfd)
                dirfd = nfd
        return _openat2(dirfd, rel, flags, 0o644 if flags & os.O_CREAT else 0)
    finally:
        os.close(dirfd)


def _open_regular(root: Path, rel: str, flags: int, *, make_parents: bool = False) -> int:
    """Like _open_beneath, for a regular file only: a FIFO or socket that a sandboxed process put in the way is
    refused at once (the open is non-blocking), instead of hanging the host."""
    try:
        fd = _open_beneath(root, rel, flags | os.O_NONBLOCK, make_parents=make_parents)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO without a reader, or a socket
            raise _not_regular(rel) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", rel)
        raise _not_regular(rel)
    os.set_blocking(fd, True)
    return fd


def _not_regular(path: str) -> OSError:
    return OSError(errno.EINVAL, "not a regular file", path)


def _too_big(path: str, size: int | None) -> OSError:
    what = f"{size} bytes" if size is not None else "too large"
    return OSError(errno.EFBIG, f"file is {what}; files.read_* returns at most {MAX_READ_BYTES} bytes", path)


def _os_error(raw: _RawResult, path: str) -> OSError:
    message = _decode(raw.stderr).strip()
    if raw.exit_code == 28:
        return _not_regular(path)
    if raw.exit_code == 21 or "Is a directory" in message:
        return IsADirectoryError(errno.EISDIR, "Is a directory", path)
    if "No such file" in message:
        return FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    if "File exists" in message:
        return FileExistsError(errno.EEXIST, message, path)
    if "Not a directory" in message:
        return NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
    if "Permission denied" in message or "Read-only file system" in message:
        return PermissionError(errno.EACCES, message or "Permission denied", path)
    return OSError(errno.EIO, message or f"exit code {raw.exit_code}", path)


# -------------------------------------------------------------------------------------------------------------
# Resources: what a sandbox holds on the host, and how it is given back
# -------------------------------------------------------------------------------------------------------------


class _Resources:
    """Everything to undo on release. Kept apart from LocalSandbox so a weakref finaliser can hold it."""

    def __init__(self, root: Path, repo_dir: Path) -> None:
        self.root = root
        self.repo_dir = repo_dir
        self.mounted = False
        self.limits: _Limits | None = None
        self.lease: CheckoutLease | None = None
        self.labels: dict[str, str] = {}
        self.created = time.time()
        self.released = False
        self._commands: set[_Command] = set()
        self._lock = threading.Lock()

    def check_alive(self, sandbox_id: str) -> None:
        if self.released:
            raise SandboxGone(f"sandbox {sandbox_id} was released")
        gone = not os.path.ismount(self.repo_dir) if self.mounted else not self.repo_dir.is_dir()
        if gone:
            raise SandboxGone(f"sandbox {sandbox_id}: its workspace {self.repo_dir} is gone")

    def track(self, cmd: _Command) -> bool:
        with self._lock:
            if self.released:
                return False
            self._commands.add(cmd)
            return True

    def untrack(self, cmd: _Command) -> None:
        with self._lock:
            self._commands.discard(cmd)

    def write_meta(self) -> None:
        _write_owner_meta(
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
            _guard("kill a command", cmd.kill)
        if self.limits is not None:
            _guard("remove the cgroups", self.limits.destroy)
        _guard("remove the sandbox folder", _remove_root, self.root, self.repo_dir, self.mounted)
        if self.lease is not None and not os.path.ismount(self.repo_dir):  # the lower layer is free to go
            self.lease.release()


def _remove_root(root: Path, repo_dir: Path, mounted: bool) -> None:
    if mounted or os.path.ismount(repo_dir):
        _umount(repo_dir)
    if os.path.ismount(repo_dir):  # never delete through a mount
        raise SandboxError(f"{repo_dir} is still mounted; leaving {root} in place")
    if root.exists():
        shutil.rmtree(root)


def _guard(what: str, fn: Callable[..., object], *args: object) -> None:
    try:
        fn(*args)
    except Exception as exc:
        log.warning("sandbox cleanup: could not %s: %s", what, exc)


class _Command:
    """One running `bwrap ... bash -c COMMAND`.

    `proc` is the outer bwrap; `init_pid` (from bwrap's --info-fd) is the init, pid 1, of the command's pid
    namespace. When the init dies the kernel kills every process in the namespace, and the init only finishes
    dying once they are all gone: so waiting for the init is how we know nothing of a command is left, and
    killing it is how a whole process tree is stopped at once, background processes and fork bombs included.
    The outer bwrap may exit a moment before the init does; both are waited for. Pidfds make the waits exact
    (Popen.wait(timeout) polls with sleeps that add milliseconds to every short command)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.init_pid: int | None = None
        self._init_fd: int | None = None
        self._fd_lock = threading.Lock()  # release() may kill while the exec thread closes

    def read_info(self, info_fd: int, timeout: float) -> None:
        """Read the init's pid from bwrap's --info-fd (JSON, written in several pieces)."""
        deadline = time.monotonic() + max(timeout, 0.0)
        data = b""
        while True:
            ready, _, _ = select.select([info_fd], [], [], max(deadline - time.monotonic(), 0.0))
            chunk = os.read(info_fd, 65536) if ready else b""
            if not chunk:
                return  # bwrap ended (or hung) before it said
            data += chunk
            found = _CHILD_PID.search(data)
            if found:
                break
        self.init_pid = int(found.group(1))
        with contextlib.suppress(OSError):
            self._init_fd = os.pidfd_open(self.init_pid)

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the command and its whole namespace to end; True when they did."""
        deadline = time.monotonic() + max(timeout, 0.0)
        if not _wait_pid(self.proc, deadline):
            return False
        if self._init_fd is not None:
            ready, _, _ = select.select([self._init_fd], [], [], max(deadline - time.monotonic(), 0.0) + 5.0)
            if not ready:
                self._kill_init()
        return True

    def kill(self) -> None:
        with self._fd_lock:
            self._kill_locked()

    def _kill_locked(self) -> None:
        if self.proc.poll() is None and self.init_pid is None:
            for child in _children(self.proc.pid):  # bwrap has not reported its init yet
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        self._kill_init()
        if not _wait_pid(self.proc, time.monotonic() + 5):
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()  # --die-with-parent then kills the init
            self.proc.wait(timeout=30)
        if self._init_fd is not None:
            select.select([self._init_fd], [], [], 10.0)

    def _kill_init(self) -> None:
        if self._init_fd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._init_fd, signal.SIGKILL)

    def close(self) -> None:
        with self._fd_lock:
            if self._init_fd is not None:
                os.close(self._init_fd)
                self._init_fd = None


def _wait_pid(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Wait for `proc` until `deadline` (time.monotonic()); True when it exited."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # already reaped, or no pidfd support
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        ready, _, _ = select.select([pidfd], [], [], max(deadline - time.monotonic(), 0.0))
    finally:
        os.close(pidfd)
    if not ready:
        return proc.poll() is not None
    proc.wait()
    return True


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return []


# -------------------------------------------------------------------------------------------------------------
# Limits: cgroups (v1 or v2), else rlimits
# -------------------------------------------------------------------------------------------------------------


class _Limits:
    """The per-sandbox cgroups that hold every process of the sandbox's commands."""

    _warned = False

    def __init__(
        self, dirs: list[Path], procs_files: list[Path], oom_file: Path | None, rlimit_prefix: list[str]
    ):
        self.dirs = dirs
        self.procs_files = procs_files
        self.oom_file = oom_file
        self.rlimit_prefix = rlimit_prefix

    @classmethod
    def create(cls, name: str, memory_bytes: int, max_pids: int) -> _Limits:
        made: list[Path] = []
        try:
            v1_mem, v1_pids = _cgroup_v1_parent("memory"), _cgroup_v1_parent("pids")
            if v1_mem is not None and v1_pids is not None:
                mem, pids = v1_mem / f"bugsweep-{name}", v1_pids / f"bugsweep-{name}"
                for d in (mem, pids):
                    d.mkdir()
                    made.append(d)
                _write(mem / "memory.limit_in_bytes", str(memory_bytes))
                with contextlib.suppress(OSError):  # only with swap accounting; no swap then
                    _write(mem / "memory.memsw.limit_in_bytes", str(memory_bytes))
                _write(pids / "pids.max", str(max_pids))
                return cls(
                    made, [mem / "cgroup.procs", pids / "cgroup.procs"], mem / "memory.oom_control", []
                )
            v2 = _cgroup_v2_parent()
            if v2 is not None:
                d = v2 / f"bugsweep-{name}"
                d.mkdir()
                made.append(d)
                _write(d / "memory.max", str(memory_bytes))
                with contextlib.suppress(OSError):
                    _write(d / "memory.swap.max", "0")
                _write(d / "pids.max", str(max_pids))
                return cls(made, [d / "cgroup.procs"], d / "memory.events", [])
        except OSError as exc:
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
            reason = str(exc)
        else:
            reason = "no writable cgroup v1 memory+pids or delegated cgroup v2 hierarchy"
        if not cls._warned:
            cls._warned = True
            log.warning(
                "sandbox limits: cannot create a cgroup (%s); falling back to prlimit RLIMIT_AS/RLIMIT_NPROC, "
                "which does not stop fork bombs when running as root",
                reason,
            )
        prlimit = shutil.which("prlimit")
        prefix = [prlimit, f"--as={memory_bytes}", f"--nproc={max_pids}", "--"] if prlimit else []
        return cls([], [], None, prefix)

    def wrapper(self) -> list[str]:
        """The argv prefix that puts a command into the cgroups before bwrap starts (so every process it forks
        is counted), or sets the rlimits."""
        if not self.procs_files:
            return list(self.rlimit_prefix)
        return [
            "/bin/sh",
            "-c",
            _ATTACH_SCRIPT,
            "sh",
            str(len(self.procs_files)),
            *map(str, self.procs_files),
        ]

    def oom_kills(self) -> int:
        if self.oom_file is None:
            return 0
        try:
            for line in self.oom_file.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def destroy(self) -> None:
        _empty_and_remove(self.dirs)


def _empty_and_remove(dirs: list[Path]) -> None:
    deadline = time.monotonic() + 10
    for d in dirs:
        kill_file = d / "cgroup.kill"
        if kill_file.exists():
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
    while True:
        pids: set[int] = set()
        for d in dirs:
            with contextlib.suppress(OSError):
                pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        remaining = []
        for d in dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                remaining.append(d)
        if not remaining:
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"cgroups still busy: {', '.join(map(str, remaining))}")
        dirs = remaining
        time.sleep(0.02)


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path for a v1 controller, or for v2 when `controller` is ''."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (controller and controller in controllers.split(",")) or (not controller and controllers == ""):
            return path
    return None


def _cgroup_v1_parent(controller: str) -> Path | None:
    mount = _CGROUP_ROOT / controller
    path = _own_cgroup(controller)
    if path is None or not (mount / "cgroup.procs").exists():
        return None
    parent = mount / path.lstrip("/")
    return parent if parent.is_dir() and os.access(parent, os.W_OK) else None


def _cgroup_v2_parent() -> Path | None:
    """Where to make the sandbox's cgroup on a unified (v2) hierarchy: our own cgroup when its children get the
    memory and pids controllers, else the hierarchy's root (on systemd hosts the root delegates both, and the
    rule against processes in inner cgroups does not apply to it)."""
    if not (_CGROUP_ROOT / "cgroup.controllers").exists():
        return None
    own = _own_cgroup("")
    candidates = [_CGROUP_ROOT / own.lstrip("/")] if own else []
    candidates.append(_CGROUP_ROOT)
    for parent in candidates:
        try:
            enabled = (parent / "cgroup.subtree_control").read_text().split()
        except OSError:
            continue
        if {"memory", "pids"} <= set(enabled) and os.access(parent, os.W_OK):
            return parent
    return None


# -------------------------------------------------------------------------------------------------------------
# bwrap arguments
# -------------------------------------------------------------------------------------------------------------


def _namespace_args(bwrap: str, hardening: list[str] | None = None) -> list[str]:
    return [
        "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
        "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session",
        *(_bwrap_hardening.get(bwrap, []) if hardening is None else hardening),
    ]  # fmt: skip


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


_etc_dirs: dict[Path, Path] = {}
_etc_lock = threading.Lock()


def _system_etc(state_dir: Path) -> Path:
    """The sandbox's /etc: a copy of the ETC_ALLOW entries (without any `private` folder, where TLS keys live)
    plus a generated passwd, group and hostname. Made once per process and bound as one mount, because ~30
    separate binds of host files doubled the start time of every command."""
    with _etc_lock:
        path = _etc_dirs.get(state_dir)
        if path is not None and path.is_dir():
            return path
        path = state_dir / f"etc-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        _write_owner_meta(path, kind="etc")
        for name in ETC_ALLOW:
            src = Path("/etc") / name
            if not src.exists():
                continue
            if src.is_dir():
                shutil.copytree(
                    src, path / name, symlinks=True, ignore=shutil.ignore_patterns("private"),
                    ignore_dangling_symlinks=True,
                )  # fmt: skip
            else:
                shutil.copy2(src, path / name)  # a top-level link (resolv.conf -> /run/...) is followed
        _write(path / "passwd", _passwd())
        _write(path / "group", f"root:x:0:\n{SANDBOX_USER}:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
        _write(path / "hostname", "sandbox\n")
        (path / "meta.json").rename(
            path / ".owner.json"
        )  # only now complete; and not visible as /etc/meta.json
        atexit.register(shutil.rmtree, path, True)
        _etc_dirs[state_dir] = path
        return path


def _python_prefixes() -> list[str]:
    """The running Python's installation (and venv), when outside /usr: bound read-only at the same paths."""
    prefixes: list[str] = []
    for prefix in (sys.prefix, sys.base_prefix):
        for path in (os.path.abspath(prefix), os.path.realpath(prefix)):
            if not path.startswith("/usr/") and path != "/usr" and path not in prefixes:
                prefixes.append(path)
    return prefixes


def _python_binds() -> list[str]:
    args: list[str] = []
    for path in _python_prefixes():
        args += ["--ro-bind", os.path.realpath(path), path]
    return args


def _python_bins() -> list[str]:
    bins: list[str] = []
    for prefix in (sys.prefix, sys.base_prefix):
        b = os.path.join(os.path.abspath(prefix), "bin")
        if b not in bins and not b.startswith("/usr/"):
            bins.append(b)
    return bins


def _layer_venv(venv: Path) -> None:
    """A writable venv at /workspace/.venv on top of the host's (read-only) venv, for hosts that run bugsweep
    from a venv: there pip cannot fall back to the user scheme (venvs switch user site-packages off), so
    `pip install` would fail. This venv sees the base interpreter's packages (include-system-site-packages) and
    the host venv's (a .pth file), and pip installs into it. Nothing runs: a few files and symlinks."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base_python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    (venv / "bin").mkdir(parents=True)
    site = venv / "lib" / f"python{version}" / "site-packages"
    site.mkdir(parents=True)
    _write(
        venv / "pyvenv.cfg",
        f"home = {os.path.dirname(base_python)}\ninclude-system-site-packages = true\n"
        f"version = {'.'.join(map(str, sys.version_info[:3]))}\n",
    )
    for name in ("python", "python3", f"python{version}"):
        (venv / "bin" / name).symlink_to(base_python)
    host_sites = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    _write(site / "_bugsweep_host_venv.pth", "".join(f"{path}\n" for path in host_sites))
    for name in ("pip", "pip3", f"pip{version}"):
        script = venv / "bin" / name
        _write(script, f'#!/bin/sh\nexec {WORKSPACE}/.venv/bin/python -m pip "$@"\n')
        script.chmod(0o755)


def _passwd() -> str:
    return (
        "root:x:0:0:root:/root:/bin/bash\n"
        f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}:{SANDBOX_USER}:{WORKSPACE}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )


# -------------------------------------------------------------------------------------------------------------
# The workspace: overlayfs (or a copy), git init for plain folders
# -------------------------------------------------------------------------------------------------------------


def _mount_overlay(lower: Path, root: Path, target: Path) -> bool:
    """Mount lower + root/upper at target. False (with a warning) when overlayfs is not available here."""
    link = root / "lower"  # a short, comma-free name for the user's path in the mount options
    link.symlink_to(lower)
    options = f"lowerdir={link},upperdir={root / 'upper'},workdir={root / 'work'}"
    rc = _libc.mount(b"overlay", os.fsencode(target), b"overlay", ctypes.c_ulong(0), os.fsencode(options))
    if rc == 0:
        return True
    code = ctypes.get_errno()
    log.warning(
        "overlayfs mount failed (%s); copying the repository instead, which is slower on large trees",
        os.strerror(code),
    )
    return False


def _umount(target: Path) -> None:
    if _libc.umount2(os.fsencode(target), 0) == 0:
        return
    code = ctypes.get_errno()
    if code == errno.EINVAL:  # not mounted
        return
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"umount {target}: {os.strerror(code)}")


def _copy_tree(src: Path, dest: Path, *, keep_owner: bool = True) -> None:
    argv = ["cp", "-a", "--reflink=auto"] + ([] if keep_owner else ["--no-preserve=ownership"])
    try:
        subprocess.run([*argv, f"{src}/.", str(dest)], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as exc:
        raise SandboxError(f"could not copy {src} into the sandbox: {exc.stderr.strip()}") from None


def _git_init(repo: Path, root: Path) -> None:
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


# -------------------------------------------------------------------------------------------------------------
# Stale sandboxes of processes that died without releasing
# -------------------------------------------------------------------------------------------------------------

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
    return removed


def list_sandboxes(state_dir: Path) -> list[dict[str, object]]:
    """The local sandboxes in `state_dir`: id, owner pid, whether the owner is alive, labels, creation time."""
    found = []
    for meta_file in sorted(state_dir.glob("local-*/meta.json")):
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads(meta_file.read_text())
            pid = int(meta.get("owner_pid", 0))
            alive = meta.get("pidns") == _pidns() and _start_time(pid) == meta.get("owner_start")
            found.append({"id": meta_file.parent.name, "owner_pid": pid, "owner_alive": alive,
                          "labels": meta.get("labels", {}), "created": meta.get("created")})  # fmt: skip
    return found


def _prepare_state_dir(state_dir: Path) -> None:
    """Make sure `state_dir` is a real folder of ours (it usually sits in the shared /tmp), then, once per
    process, remove what dead processes left there."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(state_dir)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise SandboxError(
            f"{state_dir} is not a folder owned by this user; refusing to use it for sandboxes"
        )
    _reap_stale_once(state_dir)


def _write_owner_meta(path: Path, **extra: object) -> None:
    meta = {"owner_pid": os.getpid(), "owner_start": _start_time(os.getpid()), "pidns": _pidns(), **extra}
    _write(path / "meta.json", json.dumps(meta))


def _reap_if_stale(root: Path) -> bool:
    meta = None
    for name in ("meta.json", ".owner.json"):
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads((root / name).read_text())
            break
    if meta is None or meta.get("pidns") != _pidns():  # another pid namespace: its pids mean nothing here
        return False
    pid = int(meta.get("owner_pid", 0))
    if pid and _start_time(pid) == meta.get("owner_start"):
        return False  # the owner is alive
    if meta.get("kind") == "etc":
        shutil.rmtree(root)
        return True
    log.warning("removing sandbox %s left behind by process %s", root.name, pid)
    _empty_and_remove([Path(d) for d in meta.get("cgroups", []) if Path(d).exists()])
    repo_dir = Path(meta["repo_dir"])
    _remove_root(root, repo_dir, bool(meta.get("mounted")))
    return True


def _start_time(pid: int) -> str | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return fields.rsplit(")", 1)[1].split()[19]


def _pidns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


# -------------------------------------------------------------------------------------------------------------
# Small helpers
# -------------------------------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


@contextlib.contextmanager
def _stdin_file(data: bytes | None, spool: Path) -> Iterator[int | IO[bytes]]:
    if data is None:
        yield subprocess.DEVNULL
        return
    with tempfile.TemporaryFile(dir=spool) as fh:
        fh.write(data)
        fh.seek(0)
        yield fh


def _read_spool(fh: IO[bytes], full: bool) -> tuple[bytes, bool]:
    """The whole spool, or its last OUTPUT_LIMIT_BYTES and whether anything was cut."""
    size = os.fstat(fh.fileno()).st_size
    if full or size <= OUTPUT_LIMIT_BYTES:
        fh.seek(0)
        return fh.read(), False
    fh.seek(size - OUTPUT_LIMIT_BYTES)
    data = fh.read(OUTPUT_LIMIT_BYTES)
    skip = 0
    while skip < 3 and skip < len(data) and 0x80 <= data[skip] < 0xC0:  # don't start inside a UTF-8 character
        skip += 1
    return data[skip:], True


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _short(command: str) -> str:
    return command if len(command) <= 60 else command[:57] + "..."
