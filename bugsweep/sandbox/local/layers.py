"""Read-only layers under a sandbox: the task environment built once and reused, and snapshots of a task state.

A layer is a folder with up to two parts, `repo/` (files over the repository) and `venv/` (files of the task's
virtual environment, TASK_ENV). A sandbox stacks its layers as overlayfs lower layers, top first, over the
repository tree (`repo/`) and over the interpreter's base venv (`venv/`), with its own writable layer on top; a
layer is never written once made.

- **Base venvs** (`EnvCache.base`): an empty venv (pip included) per interpreter, made on the host with
  `uv venv --seed --relocatable` at `<env_dir>/base-<hash>/venv` and shared by every sandbox on that interpreter.
- **Environment layers** (`EnvCache.lookup` / `EnvCache.commit`): what a successful setup command added, keyed by
  `environment_key` (the repository's dependency files, the setup command, the interpreter, the installer). A setup
  that also put the repository's own code somewhere outside the repository (a non-editable `pip install .`) or
  built files into it (a compiled extension) is bound to that source tree: its layer's key adds the tree's hash.
  What an install writes into the tree without binding it: its metadata (`*.egg-info`) and the version file its
  build configuration declares (`version_files`: setuptools_scm, hatch-vcs). They go into the layer (an editable
  install's package imports its version file), which is reused only where none of them would hide a file of the
  sandbox's tree; at another commit they name the version of the commit the layer was built at, as the venv's own
  metadata does (an editable install after `git pull`). Bytecode of the repository's files (`BYTECODE`) is never
  kept in a layer; the installed packages' is (made by the setup: their files never change).
  Old layers go first when the cache outgrows `env_max_gib`, and any unused for `env_max_age_days`; a layer in use
  (a shared lock held by each sandbox on it) is never removed.
- **Snapshots** (`LocalSnapshot`): a sandbox's writable layers frozen at one moment (the task state after setup),
  under `state_dir/snap-<id>`, owned by this process and removed once released and unused.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from bugsweep.errors import ConfigError, SandboxError
from bugsweep.sandbox.base import TASK_ENV
from bugsweep.sandbox.sources import CheckoutLease, PreparedSource, default_cache_dir

log = logging.getLogger(__name__)

#: Files at the repository's root whose content decides what a setup installs.
DEPENDENCY_FILES = re.compile(
    r"^(pyproject\.toml|setup\.py|setup\.cfg|Pipfile(\.lock)?|poetry\.lock|uv\.lock|pdm\.lock|environment\.ya?ml"
    r"|(.*[-_.])?(requirements|constraints)([-_.].*)?\.(txt|in))$"
)
#: Folders at the root whose files count as dependency files too (e.g. requirements/test.txt).
DEPENDENCY_DIRS = ("requirements", "reqs", "requirements.d")
#: What a setup may leave in the repository for its layer to stay reusable at other commits: metadata and caches
#: (and the version file its build configuration declares: `version_files`).
PORTABLE_OUTPUT = re.compile(r"(^|/)([^/]+\.egg-info|\.eggs|build|\.pytest_cache)(/|$)")
#: Bytecode a setup compiled from the repository's own modules (a setup.py that imports its package). Never kept
#: in a layer: Python trusts a .pyc whose source has the same mtime and size, and another commit's checkout made
#: in the same second with a same-size change (`a - b` -> `a + b`) would run this commit's code. It stays in the
#: sandbox's own writable layer, where it is this tree's.
BYTECODE = re.compile(r"(^|/)__pycache__(/|$)|\.py[co]$")
#: The host's CA-bundle settings (not secrets), passed to installs so they trust the same TLS roots as the host;
#: only paths the sandbox sees too (its /etc is a copy of the host's /etc/ssl and /etc/pki).
TLS_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
#: Version of the layer format; part of every key so that a change here never reuses an old layer.
LAYER_FORMAT = "3"  # 3: the installed packages' bytecode is in the layer (taskenv.setup_environment)


# -------------------------------------------------------------------------------------------------------------
# Interpreters
# -------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interpreter:
    """A Python interpreter on this machine, as the task environment sees it (bound read-only at its own path)."""

    executable: str
    """Its real path."""
    version: str
    """e.g. 3.11.7"""
    base_prefix: str
    """Its installation (standard library, shared libraries), bound read-only into the sandbox when outside /usr."""

    @property
    def identity(self) -> str:
        return f"{self.executable}\0{self.version}"

    def binds(self) -> list[str]:
        args: list[str] = []
        for path in dict.fromkeys((self.base_prefix, os.path.dirname(os.path.dirname(self.executable)))):
            if path and path != "/usr" and not path.startswith("/usr/") and os.path.isdir(path):
                args += ["--ro-bind", os.path.realpath(path), path]
        return args


_interpreters: dict[str, Interpreter] = {}
_interpreters_lock = threading.Lock()


def find_interpreter(python: str | None) -> Interpreter:
    """The interpreter named `python` (a path, or a name on PATH such as python3.12); None: the one bugsweep runs
    on. Raises ConfigError when there is no such interpreter or it does not run."""
    wanted = python or getattr(sys, "_base_executable", None) or sys.executable
    path = wanted if "/" in wanted else shutil.which(wanted)
    if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise ConfigError(
            f"--python {wanted!r}: no such interpreter on this machine (give a path or a name on PATH, e.g. "
            "/usr/bin/python3 or python3.12)"
        )
    real = os.path.realpath(path)
    with _interpreters_lock:
        if real in _interpreters:
            return _interpreters[real]
    probe = "import sys, json; print(json.dumps([sys.version.split()[0], sys.base_prefix]))"
    try:
        out = subprocess.run(
            [real, "-I", "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
        )
        version, base_prefix = json.loads(out.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise ConfigError(
            f"--python {wanted!r} ({real}) does not run as a Python interpreter: {exc}"
        ) from None
    found = Interpreter(executable=real, version=version, base_prefix=os.path.abspath(base_prefix))
    with _interpreters_lock:
        _interpreters[real] = found
    return found


def tls_environment() -> dict[str, str]:
    """TLS_VARIABLES as set on the host, where they point into /etc/ssl, /etc/pki or /usr."""
    found = {}
    for name in TLS_VARIABLES:
        value = os.environ.get(name, "")
        if value.startswith(("/etc/ssl/", "/etc/pki/", "/usr/")) or value in ("/etc/ssl", "/etc/pki"):
            found[name] = value
    return found


@functools.cache
def find_uv() -> str:
    """The `uv` binary (PyPI `uv`, a dependency of bugsweep)."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise ConfigError("the local sandbox needs `uv` to make task environments: pip install uv")


# -------------------------------------------------------------------------------------------------------------
# Layers and their cache
# -------------------------------------------------------------------------------------------------------------


class Layer:
    """One read-only layer folder (`repo/`, `venv/`, `meta.json`) and this holder's lease on it."""

    def __init__(self, path: Path, *, leased: bool = True) -> None:
        self.path = path
        self._lease = CheckoutLease(path / ".lock") if leased else None
        self.complete = (path / ".complete").exists()
        """The layer holds whole trees (a snapshot where no overlay was possible): nothing below it is needed."""

    @property
    def repo(self) -> Path | None:
        return self.path / "repo" if (self.path / "repo").is_dir() else None

    @property
    def venv(self) -> Path | None:
        return self.path / "venv" if (self.path / "venv").is_dir() else None

    def meta(self) -> dict[str, object]:
        try:
            data = json.loads((self.path / "meta.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def share(self) -> Layer:
        """Another lease on the same layer (for a second sandbox on it)."""
        return Layer(self.path, leased=self._lease is not None)

    def release(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def __repr__(self) -> str:
        return f"<Layer {self.path.name}>"


def environment_key(
    interpreter: Interpreter, setup_command: str, installer: str, dependency_files: dict[str, bytes]
) -> str:
    """What determines a setup's result: the interpreter, the command, the installer, the dependency files."""
    h = hashlib.sha256()
    for part in (LAYER_FORMAT, interpreter.identity, setup_command, installer):
        h.update(part.encode() + b"\0")
    for name in sorted(dependency_files):
        h.update(name.encode() + b"\0" + hashlib.sha256(dependency_files[name]).digest())
    return h.hexdigest()[:32]


def dependency_paths(repo_dir: Path, setup_command: str) -> list[str]:
    """The repository's dependency files (relative paths): those at the root and in DEPENDENCY_DIRS that match
    DEPENDENCY_FILES, and any file the setup command names (e.g. `-r ci/test-requirements.txt`). Listed without
    following links; the caller reads them through the sandbox's own file access."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir(repo_dir):
            if DEPENDENCY_FILES.match(entry.name) and not entry.is_dir(follow_symlinks=False):
                found.add(entry.name)
            elif entry.name in DEPENDENCY_DIRS and entry.is_dir(follow_symlinks=False):
                for sub in os.scandir(entry.path):
                    if sub.is_file(follow_symlinks=False):
                        found.add(f"{entry.name}/{sub.name}")
    try:
        words = shlex.split(setup_command)
    except ValueError:
        words = setup_command.split()
    for word in words:
        word = word.split("=", 1)[-1] if word.startswith("--") else word
        parts = PurePosixPath(word).parts
        if word.startswith("/") or ".." in parts or not parts or word in found:
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(repo_dir / word).st_mode):
                found.add(str(PurePosixPath(*parts)))
    return sorted(found)


_VERSION_FILE_IN_SETUP_PY = re.compile(r"""["']?\b(?:write_to|version_file)["']?\s*[:=]\s*["']([^"']+)["']""")


def version_files(dependency_files: dict[str, bytes]) -> set[str]:
    """The files the repository's build configuration says its install writes into the tree, holding the version
    its VCS plugin read from git: setuptools_scm's `write_to` / `version_file` (pyproject.toml's
    [tool.setuptools_scm], or setup.py's `use_scm_version={...}`) and hatch-vcs's `version-file`
    ([tool.hatch.build.hooks.vcs], also per build target). Such a file changes at every commit (`1.1.dev3+g<sha>`)
    while nothing the environment holds does, so it does not bind a setup's layer to its tree."""
    found: set[str] = set()
    pyproject = dependency_files.get("pyproject.toml")
    if pyproject is not None:
        try:
            tool = tomllib.loads(pyproject.decode()).get("tool", {})
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            tool = {}
        scm = _table(tool, "setuptools_scm")
        build = _table(_table(tool, "hatch"), "build")
        hooks = [_table(_table(build, "hooks"), "vcs")]
        hooks += [_table(_table(target, "hooks"), "vcs") for target in _table(build, "targets").values()
                  if isinstance(target, dict)]  # fmt: skip
        candidates = [
            scm.get("write_to"),
            scm.get("version_file"),
            *(hook.get("version-file") for hook in hooks),
        ]
        found.update(path for path in candidates if isinstance(path, str))
    setup_py = dependency_files.get("setup.py")
    if setup_py is not None and b"use_scm_version" in setup_py:
        found.update(_VERSION_FILE_IN_SETUP_PY.findall(setup_py.decode(errors="replace")))
    normal = (str(PurePosixPath(path)) for path in found if path and not path.startswith("/"))
    return {path for path in normal if ".." not in PurePosixPath(path).parts}


def _table(parent: object, name: str) -> dict[str, object]:
    value = parent.get(name) if isinstance(parent, dict) else None
    return value if isinstance(value, dict) else {}


class EnvCache:
    """The folder of base venvs and environment layers, shared by every sandbox on this machine."""

    def __init__(self, root: Path | None, *, max_age_days: float, max_bytes: int) -> None:
        self.root = Path(root) if root else default_cache_dir() / "environments"
        self.max_age_s = max_age_days * 86400
        self.max_bytes = max_bytes

    # -- base venvs ----------------------------------------------------------------------------------------------

    def base(self, interpreter: Interpreter) -> Layer:
        """The empty venv (pip included) for `interpreter`, made once on the host."""
        key = hashlib.sha256(f"{LAYER_FORMAT}\0base\0{interpreter.identity}".encode()).hexdigest()[:24]
        path = self.root / f"base-{key}"
        if not (path / "meta.json").exists():
            self._build_base(interpreter, path)
        layer = Layer(path)
        _touch(path)
        return layer

    def _build_base(self, interpreter: Interpreter, path: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.root / f".{path.name}.build"):
            if (path / "meta.json").exists():
                return
            staging = self.root / f".tmp-{uuid.uuid4().hex}"
            staging.mkdir()
            try:
                argv = [
                    find_uv(),
                    "venv",
                    "--quiet",
                    "--seed",
                    "--relocatable",
                    "--python",
                    interpreter.executable,
                ]
                env = {"PATH": "/usr/bin:/bin", "HOME": str(self.root), "UV_CACHE_DIR": str(self.download_cache),
                       "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", "UV_LINK_MODE": "copy",
                       **tls_environment()}  # fmt: skip
                done = subprocess.run(
                    [*argv, str(staging / "venv")], capture_output=True, text=True, timeout=600, env=env
                )
                if done.returncode != 0:
                    raise SandboxError(
                        f"could not make a venv from {interpreter.executable}: {done.stderr.strip()[-800:]}"
                    )
                _write_meta(staging, {"kind": "base", "python": interpreter.version,
                                      "interpreter": interpreter.executable, "created": time.time()})  # fmt: skip
                staging.rename(path)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise

    @property
    def download_cache(self) -> Path:
        """uv's and pip's download cache, shared by every setup (bound into the sandbox for setup commands only)."""
        return self.root / "downloads"

    # -- environment layers ----------------------------------------------------------------------------------

    def lookup(
        self, key: str, tree: str | None = None, *, fits: Callable[[Layer], bool] = lambda layer: True
    ) -> Layer | None:
        """The finished layer for `key` (or, for a setup bound to its source tree, `key` at `tree`) that `fits`
        the sandbox asking."""
        for name in (key, f"{key}-{tree}" if tree else None):
            if name and (self.root / name / "meta.json").exists():
                try:
                    layer = Layer(self.root / name)
                except OSError:  # evicted meanwhile
                    continue
                if (self.root / name / "meta.json").exists() and fits(layer):
                    _touch(self.root / name)
                    return layer
                layer.release()
        return None

    def is_bound(self, key: str) -> bool:
        """True when the setup of `key` was found to depend on the source tree (look up `key` with the tree)."""
        return (self.root / f"{key}.bound").exists()

    def staging(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f".tmp-{uuid.uuid4().hex}"
        path.mkdir()
        return path

    def commit(self, staging: Path, key: str, tree: str | None, meta: dict[str, object]) -> Layer:
        """Publish `staging` as the layer for `key` (at `tree` when bound to it) and return a lease on it. When
        another process published the same key first, its layer is used and ours discarded."""
        name = f"{key}-{tree}" if tree else key
        if tree:
            (self.root / f"{key}.bound").touch()
        _write_meta(staging, {**meta, "key": name, "created": time.time(), "bytes": _size(staging)})
        (staging / ".lock").touch()
        try:
            staging.rename(self.root / name)
        except OSError:  # published meanwhile by another sandbox with the same key
            shutil.rmtree(staging, ignore_errors=True)
        layer = Layer(self.root / name)
        _touch(self.root / name)
        self.evict()
        return layer

    def layers(self) -> list[dict[str, object]]:
        """Every finished layer: name, kind, bytes, last use."""
        found = []
        with contextlib.suppress(OSError):
            for entry in sorted(self.root.iterdir()):
                meta_file = entry / "meta.json"
                if entry.name.startswith(".") or not meta_file.exists():
                    continue
                with contextlib.suppress(OSError, ValueError):
                    meta = json.loads(meta_file.read_text())
                    found.append({"name": entry.name, "kind": meta.get("kind", "setup"),
                                  "bytes": int(meta.get("bytes", 0)), "used": _last_used(entry)})  # fmt: skip
        return found

    def evict(self) -> list[str]:
        """Remove layers unused for max_age, then the least recently used while the cache is over max_bytes;
        never one a sandbox holds. The names removed."""
        now = time.time()
        layers = sorted(self.layers(), key=lambda entry: float(entry["used"]))  # type: ignore[arg-type]
        total = sum(int(entry["bytes"]) for entry in layers)  # type: ignore[call-overload]
        removed = []
        for entry in layers:
            old = now - float(entry["used"]) > self.max_age_s  # type: ignore[arg-type]
            if not old and total <= self.max_bytes:
                continue
            if self._remove_if_unused(self.root / str(entry["name"])):
                removed.append(str(entry["name"]))
                total -= int(entry["bytes"])  # type: ignore[call-overload]
        for leftover in self.root.glob(".tmp-*"):  # staging of a process that died (older than a day)
            with contextlib.suppress(OSError):
                if now - leftover.stat().st_mtime > 86400:
                    shutil.rmtree(leftover, ignore_errors=True)
        return removed

    def _remove_if_unused(self, path: Path) -> bool:
        try:
            fh = open(path / ".lock", "a")  # noqa: SIM115 - closed below
        except OSError:
            return False
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # a sandbox uses it
            doomed = path.with_name(f".tmp-evicted-{uuid.uuid4().hex}")
            path.rename(doomed)  # out of sight at once: no lookup can find it from here on
        shutil.rmtree(doomed, ignore_errors=True)
        log.info("evicted task environment %s", path.name)
        return True


# -------------------------------------------------------------------------------------------------------------
# Snapshots
# -------------------------------------------------------------------------------------------------------------


@dataclass
class LocalSnapshot:
    """A sandbox's writable layers frozen (see the module docstring); `create_from` stacks new sandboxes on it."""

    id: str
    layer: Layer
    below: list[Layer]
    """The layers it was stacked on, top first (each leased for as long as the snapshot lives)."""
    source: PreparedSource
    interpreter: Interpreter
    disk_mib: int | None = None
    """The disk quota of the sandbox it was taken from (a fresh sandbox on it gets the same)."""
    _users: int = 0
    _released: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def stack(self) -> list[Layer]:
        return [self.layer, *self.below]

    def acquire(self) -> None:
        with self._lock:
            if self._released:
                raise SandboxError(f"snapshot {self.id} was released")
            self._users += 1

    def drop(self) -> None:
        with self._lock:
            self._users -= 1
            gone = self._released and self._users <= 0
        if gone:
            self._remove()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
            gone = self._users <= 0
        if gone:
            self._remove()

    def _remove(self) -> None:
        for layer in self.stack:
            layer.release()
        if self.source.lease is not None:
            self.source.lease.release()
        shutil.rmtree(self.layer.path, ignore_errors=True)


# -------------------------------------------------------------------------------------------------------------
# Small helpers
# -------------------------------------------------------------------------------------------------------------


def _write_meta(path: Path, meta: dict[str, object]) -> None:
    (path / "meta.json").write_text(json.dumps(meta, indent=1))


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        (path / ".used").touch()


def _last_used(path: Path) -> float:
    for name in (".used", "meta.json"):
        with contextlib.suppress(OSError):
            return (path / name).stat().st_mtime
    return 0.0


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


__all__ = [
    "TASK_ENV", "EnvCache", "Interpreter", "Layer", "LocalSnapshot", "dependency_paths", "environment_key",
    "find_interpreter", "find_uv", "version_files",
]  # fmt: skip
