"""The bubblewrap command line: which namespaces, which read-only binds make the sandbox's root, its /etc.

Each command is one `bwrap ... /bin/bash -c COMMAND` (see `command_argv`) with
- a root made only of read-only binds: /usr (and the /bin, /lib* links), an allow-list of /etc entries that git,
  Python, bash and pip need, a generated /etc/passwd and /etc/group, then the root is remounted read-only;
- `/workspace` writable (HOME and the repository's parent), a private `/tmp`, its own /proc and a minimal /dev;
- the task environment at TASK_ENV (/opt/venv; its interpreter's installation bound read-only at its own path; no
  other Python of the host, and no site-packages but the venv's on its sys.path), and `uv` plus the `pip` shims under /opt/bugsweep;
- new user (uid 1000, no capabilities, no_new_privs, no nested user namespaces with bubblewrap 0.8+), pid, ipc,
  uts, cgroup and network namespaces (the caller adds `--unshare-net`, the seccomp filter, and the setup network
  for a setup command; it passes all options through `options_fd`, so /proc/1/cmdline inside shows no host path);
- `--die-with-parent` and `--new-session`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import threading
import uuid
from pathlib import Path

from bugsweep.errors import ConfigError
from bugsweep.sandbox.base import TASK_ENV
from bugsweep.sandbox.local.common import SANDBOX_UID, SANDBOX_USER, WORKSPACE, write_text
from bugsweep.sandbox.local.stale import write_owner_meta

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


def find_bwrap() -> str:
    """The path of a working `bwrap`. Raises ConfigError naming the fix when it is missing or cannot make
    namespaces here. The namespace check runs once per process."""
    search = os.environ.get("PATH")
    bwrap = _found.get(search)  # the search of PATH took ~0.5 ms of every create()
    if bwrap is None or not os.access(bwrap, os.X_OK):
        bwrap = _found[search] = shutil.which("bwrap")
    if bwrap is None:
        raise ConfigError(
            f"the local sandbox needs bubblewrap (`bwrap`), which is not on PATH: {INSTALL_HINT}"
        )
    if bwrap not in _bwrap_hardening:
        with _bwrap_lock:
            if bwrap not in _bwrap_hardening:
                _bwrap_hardening[bwrap] = _probe_bwrap(bwrap)
    return bwrap


#: PATH -> where bwrap was found on it.
_found: dict[str | None, str | None] = {}
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
        *namespace_args(bwrap, hardening),
        "--unshare-net",
        *system_binds(),
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


def namespace_args(bwrap: str, hardening: list[str] | None = None) -> list[str]:
    return [
        "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
        "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session",
        *(_bwrap_hardening.get(bwrap, []) if hardening is None else hardening),
    ]  # fmt: skip


def system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


_etc_dirs: dict[Path, Path] = {}
_etc_lock = threading.Lock()


def system_etc(state_dir: Path) -> Path:
    """The sandbox's /etc: a copy of the ETC_ALLOW entries (without any `private` folder, where TLS keys live)
    plus a generated passwd, group and hostname. Made once per process and bound as one mount, because ~30
    separate binds of host files doubled the start time of every command. With a disk quota, the sandbox binds
    the copy of this folder that its disk image carries (disk.py), so no host path shows in its mountinfo."""
    with _etc_lock:
        path = _etc_dirs.get(state_dir)
        if path is not None and path.is_dir():
            return path
        path = state_dir / f"etc-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        write_owner_meta(path, kind="etc")
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
        write_text(path / "passwd", passwd())
        write_text(path / "group", f"root:x:0:\n{SANDBOX_USER}:x:{SANDBOX_UID}:\nnogroup:x:65534:\n")
        write_text(path / "hostname", "sandbox\n")
        (path / "meta.json").rename(
            path / ".owner.json"
        )  # only now complete; and not visible as /etc/meta.json
        atexit.register(shutil.rmtree, path, True)
        _etc_dirs[state_dir] = path
        return path


#: Where the sandbox finds bugsweep's tools: uv, the `pip` shims of installer=uv, the shared download cache.
TOOLS = "/opt/bugsweep"

#: installer=uv: `pip install ...` in a setup command runs as `uv pip install ...` into the task environment (much
#: faster); anything else, and an install uv cannot do, goes to the venv's own pip.
PIP_SHIM = f"""#!/bin/sh
if [ "$1" = install ]; then
  shift
  {TOOLS}/bin/uv pip install --python {TASK_ENV}/bin/python "$@" && exit 0
  echo "bugsweep: uv pip install failed; trying pip install" >&2
  exec {TASK_ENV}/bin/python -m pip install "$@"
fi
exec {TASK_ENV}/bin/python -m pip "$@"
"""


def pip_shims(etc_dir: Path) -> Path:
    """A folder of `pip`, `pip3`, `pip3.X` shims (PIP_SHIM) beside the sandbox's /etc (on its tmpfs, so the bind
    names no host path), made once per process."""
    path = etc_dir / "bugsweep-shims"
    with _etc_lock:
        if not path.is_dir():
            staging = etc_dir / f".shims-{uuid.uuid4().hex[:8]}"
            staging.mkdir()
            for name in ("pip", "pip3", *(f"pip3.{minor}" for minor in range(6, 20))):
                write_text(staging / name, PIP_SHIM)
                (staging / name).chmod(0o755)
            staging.rename(path)
        return path


def passwd() -> str:
    return (
        "root:x:0:0:root:/root:/bin/bash\n"
        f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_UID}:{SANDBOX_USER}:{WORKSPACE}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )


def command_argv(
    bwrap: str, *, etc_dir: Path, root: Path, wrapper: list[str], interpreter: list[str], uv: str, shims: Path
) -> list[str]:
    """The argv of every command of the sandbox whose folder is `root`, up to (not including) the per-command
    options (`--info-fd`, `--unshare-net`, the setup's download cache, `--chdir`, the command). `wrapper` goes
    first (the limits); `interpreter` binds the task environment's interpreter."""
    return [
        *wrapper,
        bwrap,
        *namespace_args(bwrap),
        "--hostname", "sandbox",
        *system_binds(),
        "--ro-bind", str(etc_dir), "/etc",
        "--proc", "/proc",
        "--dev", "/dev",
        "--bind", str(root / "tmp"), "/tmp",
        "--dir", "/var", "--symlink", "/tmp", "/var/tmp",
        "--bind", str(root / "ws"), WORKSPACE,
        "--bind", str(root / "env"), TASK_ENV,
        "--ro-bind", uv, f"{TOOLS}/bin/uv",
        "--ro-bind", str(shims), f"{TOOLS}/shims",
        "--dir", f"{TOOLS}/cache",
        *interpreter,  # last: an interpreter under /tmp must not be hidden by the private /tmp
        "--remount-ro", "/",
    ]  # fmt: skip


def isolation_args(info_fd: int, filter_fd: int) -> list[str]:
    """What every command gets on top of command_argv: bubblewrap says its init's pid on `info_fd`, no network (a
    setup command's comes later, into this namespace) and the seccomp filter read from `filter_fd` (seccomp.filter_fd)."""
    return ["--info-fd", str(info_fd), "--unshare-net", "--seccomp", str(filter_fd)]


def options_fd(options: list[str]) -> int:
    """A new file descriptor holding `options` NUL-separated, for `bwrap --args FD`: bubblewrap reads its options
    from there instead of its command line, so the sandbox's /proc/1/cmdline (bubblewrap is pid 1 inside) shows
    `bwrap --args N COMMAND` and none of the host paths the options name. The caller closes it."""
    fd = os.memfd_create("bugsweep-bwrap-args", os.MFD_CLOEXEC)
    try:
        os.write(fd, b"".join(os.fsencode(option) + b"\0" for option in options))
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def setup_args(download_cache: Path) -> list[str]:
    """What a setup command gets on top of command_argv: the shared download cache, writable."""
    download_cache.mkdir(parents=True, exist_ok=True)
    return ["--bind", str(download_cache), f"{TOOLS}/cache"]
