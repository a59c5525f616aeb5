"""Turn a RepoSource (local path or git URL, optionally at a ref) into a directory tree on this host.

The local sandbox uses the tree as the read-only lower layer of its overlay; another backend may upload it. The
user's checkout is never written to:
- a local path without a ref is used as it is (working tree, uncommitted changes included);
- a ref (local path or URL) becomes a cached checkout of that commit, built once under `cache_dir/checkouts/<sha>`
  and reused by every later sandbox (checkouts are keyed by commit, so two tasks at one commit share one tree);
  beyond `max_checkouts` the least recently used are deleted, never one that a sandbox holds a lease on;
- a git URL is cloned once into a bare mirror under `cache_dir/mirrors/`, fetched again only when the ref is not a
  commit already there, and checked out from the mirror as above.
Builds are guarded by file locks and finished with an atomic rename, so concurrent tasks never see half a checkout.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bugsweep.errors import ConfigError, SandboxError
from bugsweep.sandbox.base import RepoSource

log = logging.getLogger(__name__)

#: Seconds a clone or fetch may take before the source counts as unreachable.
GIT_NETWORK_TIMEOUT_S = 900.0

_SCP_LIKE = re.compile(r"^[\w.-]+@[\w.-]+:")
_FULL_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


@dataclass(frozen=True)
class PreparedSource:
    """A directory holding the repository's files, and what is known about it."""

    path: Path
    """The tree to use; must be treated as read-only."""
    has_git: bool
    """True when `path/.git` is a self-contained git directory (so `git diff` works on a copy of the tree)."""
    commit: str | None
    """The checked-out commit when a ref was asked for (or a URL was cloned), else None."""
    lease: CheckoutLease | None = field(default=None, compare=False, repr=False)
    """For a cached checkout: keeps it from being evicted until released (or garbage-collected)."""


class CheckoutLease:
    """A shared lock on one cached checkout: eviction takes the exclusive lock, so it never removes a tree that a
    sandbox is still using (e.g. as its overlay's lower layer)."""

    def __init__(self, lock_path: Path) -> None:
        self.lock_path = lock_path
        self._fh: IO[str] | None = open(lock_path, "a")  # noqa: SIM115 - held for the sandbox's lifetime
        fcntl.flock(self._fh, fcntl.LOCK_SH)

    def share(self) -> CheckoutLease:
        """Another lease on the same tree (e.g. for a snapshot that outlives the sandbox)."""
        return CheckoutLease(self.lock_path)

    def release(self) -> None:
        """Idempotent."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def is_git_url(repo: str) -> bool:
    """True for URLs (`https://`, `ssh://`, `file://`, ...) and scp-like `user@host:path`; False for local paths."""
    return "://" in repo or bool(_SCP_LIKE.match(repo))


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/bugsweep, else ~/.cache/bugsweep."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bugsweep"


def redact_url(url: str) -> str:
    """The URL without any user:password part, safe to log or to store where a model can read it."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


class SourceCache:
    """Prepares RepoSources on this host, caching clones and checkouts under `root`."""

    def __init__(self, root: Path | None = None, *, max_checkouts: int = 32) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.max_checkouts = max_checkouts
        """Checkouts kept (least recently used go first; one in use by a sandbox is never removed)."""

    def prepare(self, source: RepoSource) -> PreparedSource:
        """The tree for `source`. Raises ConfigError for a missing path or an unknown ref, SandboxError when a
        clone or fetch fails (it may be transient)."""
        if is_git_url(source.repo):
            mirror = self._mirror(source.repo)
            sha = self._resolve_in_mirror(mirror, source.repo, source.ref or "HEAD")
            return self._checkout(mirror, sha, origin=redact_url(source.repo))

        path = Path(source.repo).expanduser().resolve()
        if not path.is_dir():
            raise ConfigError(f"repository path {source.repo!r} is not a directory")
        if source.ref is None:
            dotgit = path / ".git"
            if dotgit.is_file():
                log.warning(
                    "%s is a git worktree or submodule (.git is a file); the sandbox gets its files in a new git "
                    "repository, without history. Pass --ref to get a full clone instead.",
                    path,
                )
            return PreparedSource(path, dotgit.is_dir(), None)
        try:
            sha = _git(path, "rev-parse", "--verify", "--quiet", f"{source.ref}^{{commit}}")
        except subprocess.CalledProcessError:
            raise ConfigError(f"ref {source.ref!r} not found in the git repository at {path}") from None
        return self._checkout(path, sha, origin=None)

    def resolve(self, source: RepoSource) -> str:
        """The commit `source.ref` names (fetched into the cached mirror for a URL, as `prepare` would), without a
        checkout: a task's commit checked before any run. Raises ConfigError when the repository has no such
        commit or no such folder, SandboxError when a clone or fetch fails."""
        ref = source.ref or "HEAD"
        if is_git_url(source.repo):
            return self._resolve_in_mirror(self._mirror(source.repo), source.repo, ref)
        path = Path(source.repo).expanduser().resolve()
        if not path.is_dir():
            raise ConfigError(f"repository path {source.repo!r} is not a directory")
        sha = _try_rev_parse(path, ref)
        if sha is None:
            raise ConfigError(f"ref {ref!r} not found in the git repository at {path}")
        return sha

    # -- internals -------------------------------------------------------------------------------------------

    def _mirror(self, url: str) -> Path:
        key = hashlib.sha256(url.encode()).hexdigest()[:24]
        mirror = self.root / "mirrors" / f"{key}.git"
        if mirror.is_dir():
            return mirror
        with self._lock(f"mirror-{key}"):
            if mirror.is_dir():
                return mirror
            mirror.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=mirror.parent))
            try:
                _git(
                    None,
                    "clone",
                    "--quiet",
                    "--mirror",
                    url,
                    str(tmp / "m.git"),
                    timeout=GIT_NETWORK_TIMEOUT_S,
                )
            except subprocess.CalledProcessError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                detail = _stderr_tail(exc).replace(url, redact_url(url))
                raise SandboxError(f"could not clone {redact_url(url)}: {detail}") from None
            except subprocess.TimeoutExpired:
                shutil.rmtree(tmp, ignore_errors=True)
                raise SandboxError(
                    f"cloning {redact_url(url)} took over {GIT_NETWORK_TIMEOUT_S:.0f} s"
                ) from None
            os.rename(tmp / "m.git", mirror)
            shutil.rmtree(tmp, ignore_errors=True)
            return mirror

    def _resolve_in_mirror(self, mirror: Path, url: str, ref: str) -> str:
        """Resolve `ref` to a commit, fetching first unless it is a full sha already present."""
        if _FULL_SHA.match(ref):
            sha = _try_rev_parse(mirror, ref)
            if sha:
                return sha
        with self._lock(f"mirror-{mirror.stem}"):
            try:
                _git(mirror, "fetch", "--quiet", "--prune", "origin", timeout=GIT_NETWORK_TIMEOUT_S)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                log.warning("fetching %s failed, using the cached mirror: %s", redact_url(url), exc)
            sha = _try_rev_parse(mirror, ref)
            if sha:
                return sha
            try:  # a commit no branch points at: servers that allow it hand it out by name
                _git(mirror, "fetch", "--quiet", "origin", ref, timeout=GIT_NETWORK_TIMEOUT_S)
                sha = _try_rev_parse(mirror, "FETCH_HEAD")
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                sha = None
        if not sha:
            raise ConfigError(f"ref {ref!r} not found in {redact_url(url)}")
        return sha

    def _checkout(self, repo: Path, sha: str, *, origin: str | None) -> PreparedSource:
        target = self.root / "checkouts" / sha
        (self.root / "locks").mkdir(parents=True, exist_ok=True)
        lock = self.root / "locks" / f"inuse-{sha}.lock"
        lease = CheckoutLease(lock)  # taken before looking: an eviction in progress finishes first
        try:
            self._build_checkout(repo, sha, target, origin=origin)
            os.utime(
                lock
            )  # eviction goes by last use (not by the tree's mtime: it may be a mounted lower layer)
        except BaseException:
            lease.release()
            raise
        return PreparedSource(target, True, sha, lease)

    def _build_checkout(self, repo: Path, sha: str, target: Path, *, origin: str | None) -> None:
        if target.is_dir():
            return
        with self._lock(f"checkout-{sha}"):
            if target.is_dir():
                return
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}-", dir=target.parent))
            work = tmp / "tree"
            try:
                _git(None, "clone", "--quiet", "--no-checkout", str(repo), str(work))
                _git(work, "-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", sha)
                if origin is not None:
                    _git(work, "remote", "set-url", "origin", origin)
                else:  # the host path means nothing inside a sandbox
                    _git(work, "remote", "remove", "origin")
            except subprocess.CalledProcessError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                raise SandboxError(f"could not check out {sha} from {repo}: {_stderr_tail(exc)}") from None
            os.rename(work, target)
            shutil.rmtree(tmp, ignore_errors=True)
            log.info("cached checkout of %s at %s", sha, target)
        self._evict(keep=target)

    def _evict(self, keep: Path) -> None:
        """Remove the least recently used checkouts beyond `max_checkouts`, skipping any that a lease holds."""
        try:
            checkouts = [p for p in (self.root / "checkouts").iterdir() if not p.name.startswith(".")]
        except OSError:
            return

        def last_used(checkout: Path) -> float:
            try:
                return (self.root / "locks" / f"inuse-{checkout.name}.lock").stat().st_mtime
            except OSError:
                return 0.0

        checkouts.sort(key=last_used, reverse=True)
        for old in checkouts[self.max_checkouts :]:
            if old == keep:
                continue
            with open(self.root / "locks" / f"inuse-{old.name}.lock", "a") as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a sandbox is using it
                doomed = old.with_name(f".evict-{old.name}-{os.getpid()}")
                try:
                    os.rename(old, doomed)
                except OSError:
                    continue
                shutil.rmtree(doomed, ignore_errors=True)
                log.info("evicted cached checkout %s", old.name)

    @contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{name}.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _git(cwd: Path | None, *args: str, timeout: float = 300.0) -> str:
    """Run host git. The user's own environment is kept on purpose (credentials for private URLs live there);
    prompts are turned off so a missing credential fails instead of hanging."""
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="true", LC_ALL="C")
    out = subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True, timeout=timeout
    )
    return out.stdout.strip()


def _try_rev_parse(repo: Path, ref: str) -> str | None:
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}") or None
    except subprocess.CalledProcessError:
        return None


def _stderr_tail(exc: subprocess.CalledProcessError) -> str:
    text = (exc.stderr or "").strip()
    return text[-500:] if text else f"git exited with {exc.returncode}"


def checkout_archive(path: Path) -> bytes:
    """The tree as tar.gz: a self-contained .git plus every file git does not ignore (tracked or not), so a working
    tree's uncommitted state travels too, but not its virtualenvs and build folders. A folder that is not a git
    repository travels whole; a worktree's .git file (a pointer to elsewhere on this machine) stays behind."""
    buffer = io.BytesIO()
    # gzip level 6: most of level 9's size for far less CPU on a large repository
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as archive:
        dotgit = path / ".git"
        if not dotgit.exists():
            archive.add(path, arcname=".")
        else:
            listed = subprocess.run(
                ["git", "-C", str(path), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                capture_output=True,
                check=True,
            ).stdout.decode("utf-8", "surrogateescape")
            if dotgit.is_dir():
                archive.add(dotgit, arcname=".git")
            for rel in sorted({p for p in listed.split("\0") if p and p != ".git"}):
                full = path / rel
                if full.exists() or full.is_symlink():
                    archive.add(full, arcname=rel, recursive=False)
    return buffer.getvalue()
