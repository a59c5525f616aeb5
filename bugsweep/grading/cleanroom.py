"""The clean room: the agent's change is read from outside its sandbox and graded in a fresh one.

Nothing the agent can write decides how its change is read. The repository tree is walked from the host
(`read_tree`): directories are opened one at a time relative to their parent with O_NOFOLLOW, symbolic links are
recorded as links and never followed, FIFOs, sockets and devices are left out, and every regular file is hashed as
a git blob in this process. No git runs inside the sandbox and none of the repository's `.git`, `.gitignore`,
`.gitattributes`, hooks or configuration is read. What is never part of a fix is never read at all
(`IGNORED_NAMES`, `IGNORED_SUFFIXES`: `.git`, bytecode caches, build metadata, virtual environments); a fresh
sandbox holds the task state's copy of those.

The task state is read once after setup (`Snapshot`), the agent's tree once after it stops; the difference is the
change (`Change`). Unchanged files are recognised by their stat data (device, inode, size, mtime, ctime: ctime
cannot be set by a process, so a rewritten file always shows) and are not read again, except when they changed
within two seconds of the first snapshot. Even a change hidden from the walk could not help the agent: what the
walk does not see is never written into the fresh sandbox, so it is lost, never graded.

`render_patch` writes the change as a `git diff` through a private object store (a bare repository in a host
temporary folder, no configuration, no attributes, no hooks, blobs written by this module), and `apply_changes`
writes a change into another tree from the host, the same careful way.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

#: Folder and file names never part of a fix: version control, bytecode and tool caches, build metadata (a pytest
#: plugin can be registered through an `*.egg-info/entry_points.txt`), installed packages and environments.
IGNORED_NAMES = frozenset(
    {
        ".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", ".tox", ".nox",
        ".eggs", "site-packages", "dist-packages", "node_modules",
    }
)  # fmt: skip
IGNORED_SUFFIXES = (".pyc", ".pyo", ".egg-info", ".dist-info")

#: Git modes.
FILE, EXECUTABLE, SYMLINK = 0o100644, 0o100755, 0o120000

#: Limits on what the agent can make the host read: beyond them the change is refused (the model's failure).
MAX_ENTRIES = 200_000
MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_READ_BYTES = 4 * 1024 * 1024 * 1024
"""Bytes one walk reads (files whose stat data did not change are not read again)."""
#: A file whose ctime is this close to the previous snapshot's start is read again (like git's racy-clean check).
_RACY_NS = 2_000_000_000


class ChangeRefused(Exception):
    """The agent left the repository in a state its change cannot be read or applied from (too many files, a file
    too big, a path that cannot be written). Graded as the model's unresolved attempt, never as an infra error."""


@dataclass(frozen=True)
class Entry:
    """One file of a tree: its git mode and blob id, and the stat data that lets a later walk skip reading it."""

    mode: int
    oid: str
    key: tuple[int, ...] = ()


@dataclass
class Snapshot:
    """A repository tree as read from outside: repository-relative path -> Entry."""

    entries: dict[str, Entry]
    started_ns: int
    read_bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    """Paths left out because they are neither files, folders nor links (FIFOs, sockets, devices)."""


@dataclass(frozen=True)
class Change:
    path: str
    old: Entry | None
    new: Entry | None

    @property
    def status(self) -> str:
        return "added" if self.old is None else "deleted" if self.new is None else "modified"


def host_repo_dir(sandbox: object) -> Path | None:
    """Where the sandbox's repository is on this host (the local backend), or None (a remote backend)."""
    path = getattr(sandbox, "host_repo_dir", None)
    if path is None:
        resources = getattr(sandbox, "_res", None)  # the local backend before it said so in public
        path = getattr(resources, "repo_dir", None)
    return Path(path) if path is not None else None


def is_ignored(path: str) -> bool:
    """True when `path` (repository-relative) is never part of a fix."""
    return any(part in IGNORED_NAMES or part.endswith(IGNORED_SUFFIXES) for part in path.split("/"))


# -- reading a tree from the host -------------------------------------------------------------------------------


def read_tree(root: Path, previous: Snapshot | None = None) -> Snapshot:
    """Walk `root` (a host folder holding the repository) without following any link. Raises ChangeRefused when
    the tree exceeds MAX_ENTRIES or holds a file over MAX_FILE_BYTES."""
    started = time.time_ns()
    snapshot = Snapshot(entries={}, started_ns=started)
    reuse = previous.entries if previous is not None else {}
    racy_after = (previous.started_ns - _RACY_NS) if previous is not None else 0
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _walk(fd, "", snapshot, reuse, racy_after)
    finally:
        os.close(fd)
    return snapshot


def _walk(dirfd: int, prefix: str, out: Snapshot, reuse: dict[str, Entry], racy_after: int) -> None:
    try:
        with os.scandir(dirfd) as it:
            items = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise ChangeRefused(f"the folder {prefix or '.'!r} cannot be read: {exc.strerror}") from None
    for item in items:
        rel = prefix + item.name
        if item.name in IGNORED_NAMES or item.name.endswith(IGNORED_SUFFIXES):
            continue
        st = item.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(
                    item.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd
                )
            except OSError as exc:
                raise ChangeRefused(f"the folder {rel!r} cannot be read: {exc.strerror}") from None
            try:
                _walk(sub, rel + "/", out, reuse, racy_after)
            finally:
                os.close(sub)
            continue
        if len(out.entries) >= MAX_ENTRIES:
            raise ChangeRefused(f"the repository holds more than {MAX_ENTRIES} files")
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(item.name, dir_fd=dirfd)
            out.entries[rel] = Entry(SYMLINK, blob_id(os.fsencode(target)), key)
        elif stat.S_ISREG(st.st_mode):
            mode = EXECUTABLE if st.st_mode & 0o100 else FILE
            known = reuse.get(rel)
            if known is not None and known.key == key and st.st_ctime_ns < racy_after:
                out.entries[rel] = Entry(mode, known.oid, key)
            else:
                out.read_bytes += st.st_size
                if out.read_bytes > MAX_READ_BYTES:
                    raise ChangeRefused(
                        f"the repository holds more than {MAX_READ_BYTES} bytes of changed files"
                    )
                out.entries[rel] = Entry(mode, _hash_file(dirfd, item.name, rel), key)
        else:
            out.skipped.append(rel)


def _hash_file(dirfd: int, name: str, rel: str) -> str:
    fd = _open_regular(dirfd, name, rel)
    try:
        size = os.fstat(fd).st_size
        if size > MAX_FILE_BYTES:
            raise ChangeRefused(f"{rel!r} is {size} bytes; a fix may hold files up to {MAX_FILE_BYTES} bytes")
        digest = hashlib.sha1(b"blob %d\0" % size)
        read = 0
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
            read += len(chunk)
        if read != size:
            raise ChangeRefused(f"{rel!r} changed while it was read")
        return digest.hexdigest()
    finally:
        os.close(fd)


def _open_regular(dirfd: int, name: str, rel: str) -> int:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError as exc:
        raise ChangeRefused(f"{rel!r} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ChangeRefused(f"{rel!r} is not a regular file")
    return fd


@contextlib.contextmanager
def _parent_fd(root: Path, rel: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """An fd of the folder holding `rel` inside `root` (each component opened with O_NOFOLLOW), and the name."""
    *parents, name = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in parents:
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                nfd = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                nfd = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = nfd
        yield fd, name
    finally:
        os.close(fd)


def read_entry(root: Path, rel: str, entry: Entry, *, check: bool = True) -> bytes:
    """The bytes of `rel` (a file's content or a link's target), checked against the blob id read before (with
    `check=False`, whatever is there; b"" when nothing is)."""
    try:
        with _parent_fd(root, rel) as (dirfd, name):
            if entry.mode == SYMLINK:
                data = os.fsencode(os.readlink(name, dir_fd=dirfd))
            else:
                fd = _open_regular(dirfd, name, rel)
                with os.fdopen(fd, "rb") as fh:
                    data = fh.read(MAX_FILE_BYTES + 1)
    except (OSError, ChangeRefused) as exc:
        if not check:
            return b""
        raise ChangeRefused(f"{rel!r} cannot be read: {exc}") from None
    if check and blob_id(data) != entry.oid:
        raise ChangeRefused(f"{rel!r} changed after the repository was read")
    return data


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def diff(before: Snapshot, after: Snapshot) -> list[Change]:
    """Every path whose mode or content differs, sorted by path."""
    changes = []
    for path in sorted(before.entries.keys() | after.entries.keys()):
        old, new = before.entries.get(path), after.entries.get(path)
        if old is None or new is None or (old.mode, old.oid) != (new.mode, new.oid):
            changes.append(Change(path, old, new))
    return changes


# -- writing a change into another tree -------------------------------------------------------------------------


def apply_changes(root: Path, changes: Iterable[Change], contents: dict[str, bytes]) -> None:
    """Write `changes` into the tree at `root` (host side, no link followed): deletions first, then files and links
    with their modes. `contents` maps each added or modified path to its bytes. Raises ChangeRefused when a path
    cannot be written (e.g. a file stands where the change needs a folder)."""
    changes = list(changes)
    for change in sorted(changes, key=lambda c: c.path.count("/"), reverse=True):
        if change.old is not None:
            _remove(root, change.path)
    for change in changes:
        if change.new is None:
            continue
        data = contents[change.path]
        try:
            with _parent_fd(root, change.path, create=True) as (dirfd, name):
                _remove_at(dirfd, name)
                if change.new.mode == SYMLINK:
                    os.symlink(os.fsdecode(data), name, dir_fd=dirfd)
                    continue
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(name, flags, 0o644, dir_fd=dirfd)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    os.fchmod(fh.fileno(), 0o755 if change.new.mode == EXECUTABLE else 0o644)
        except OSError as exc:
            raise ChangeRefused(
                f"{change.path!r} cannot be written into the task state: {exc.strerror}"
            ) from None


def _remove(root: Path, rel: str) -> None:
    try:
        with _parent_fd(root, rel) as (dirfd, name):
            _remove_at(dirfd, name)
    except (FileNotFoundError, NotADirectoryError):
        pass


def _remove_at(dirfd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dirfd)
    else:
        os.unlink(name, dir_fd=dirfd)


# -- one interface for both: a tree on this host, or a remote sandbox's tree through its files API ------------------


class TreeAccess(Protocol):
    """How the grader reads and writes one sandbox's repository without running anything in it."""

    def read_tree(self, previous: Snapshot | None = None) -> Snapshot: ...

    def read(self, rel: str, entry: Entry, *, check: bool = True) -> bytes: ...

    def apply(self, changes: list[Change], contents: dict[str, bytes]) -> None: ...


@dataclass
class HostTree:
    """A repository folder on this host (the local backend's overlay), walked and written without following links."""

    root: Path

    def read_tree(self, previous: Snapshot | None = None) -> Snapshot:
        return read_tree(self.root, previous)

    def read(self, rel: str, entry: Entry, *, check: bool = True) -> bytes:
        return read_entry(self.root, rel, entry, check=check)

    def apply(self, changes: list[Change], contents: dict[str, bytes]) -> None:
        apply_changes(self.root, changes, contents)


class FilesApiTree:
    """A remote sandbox's repository (Runtime), read and written through the backend's files API, never through a
    command that runs inside. A file whose size, mtime and mode are those of the previous walk is not read again:
    the API gives no ctime, so an agent can hide a rewrite behind a restored mtime, but a hidden change is one the
    fresh sandbox never gets, so it can only be lost, never graded (patch.diff is what was graded). Symbolic links
    cannot be read back through the API: the task state's links are recorded by their type and size, and a link the
    agent adds or changes is refused."""

    def __init__(self, sandbox: Any) -> None:
        self.files = sandbox.sdk.files
        self.workdir = str(sandbox.workdir).rstrip("/")

    def read_tree(self, previous: Snapshot | None = None) -> Snapshot:
        snapshot = Snapshot(entries={}, started_ns=time.time_ns())
        listing = self.files.list(self.workdir, depth=64, hidden=True, limit=MAX_ENTRIES + 1)
        listing = listing.get("data", listing) if isinstance(listing, dict) else listing
        for item in sorted(listing, key=lambda e: e["path"]):
            rel = item["path"][len(self.workdir) + 1 :]
            if not rel or is_ignored(rel) or item.get("type") == "directory":
                continue
            if len(snapshot.entries) >= MAX_ENTRIES:
                raise ChangeRefused(f"the repository holds more than {MAX_ENTRIES} files")
            info = self.files.stat(item["path"])
            if info.get("type") == "symlink":
                snapshot.entries[rel] = Entry(
                    SYMLINK, blob_id(b"unreadable link of %d bytes" % info.get("size", 0))
                )
                continue
            if info.get("type") not in (None, "file"):
                snapshot.skipped.append(rel)
                continue
            mode = EXECUTABLE if int(str(info.get("mode", "644")), 8) & 0o100 else FILE
            key = (int(info.get("size", -1)), int(float(info.get("mtime", -1)) * 1e9), mode)
            known = previous.entries.get(rel) if previous is not None else None
            if known is not None and known.key == key and key[0] >= 0 and key[1] >= 0:
                snapshot.entries[rel] = Entry(mode, known.oid, key)
                continue
            snapshot.entries[rel] = Entry(mode, blob_id(self._get(item["path"], rel)), key)
        return snapshot

    def _get(self, path: str, rel: str) -> bytes:
        data = bytes(self.files.read(path))
        if len(data) > MAX_FILE_BYTES:
            raise ChangeRefused(
                f"{rel!r} is {len(data)} bytes; a fix may hold files up to {MAX_FILE_BYTES} bytes"
            )
        return data

    def read(self, rel: str, entry: Entry, *, check: bool = True) -> bytes:
        if entry.mode == SYMLINK:
            if check:
                raise ChangeRefused(
                    f"{rel!r} is a symbolic link, which cannot be read back from this sandbox"
                )
            return b""
        try:
            data = self._get(f"{self.workdir}/{rel}", rel)
        except Exception as exc:
            if not check:
                return b""
            raise ChangeRefused(f"{rel!r} cannot be read: {exc}") from None
        if check and blob_id(data) != entry.oid:
            raise ChangeRefused(f"{rel!r} changed after the repository was read")
        return data

    def apply(self, changes: list[Change], contents: dict[str, bytes]) -> None:
        for change in sorted(changes, key=lambda c: c.path.count("/"), reverse=True):
            if change.old is not None:
                self.files.remove(f"{self.workdir}/{change.path}", recursive=True)
        for change in changes:
            if change.new is None:
                continue
            if change.new.mode == SYMLINK:
                raise ChangeRefused(
                    f"{change.path!r} is a symbolic link, which cannot be written into this sandbox"
                )
            mode = 0o755 if change.new.mode == EXECUTABLE else 0o644
            try:
                self.files.write(f"{self.workdir}/{change.path}", contents[change.path], mode=mode)
            except Exception as exc:
                raise ChangeRefused(f"{change.path!r} cannot be written into the task state: {exc}") from None


def tree_access(sandbox: object) -> TreeAccess | None:
    """How to read the sandbox's repository from outside: on this host, through a files API, or None."""
    root = host_repo_dir(sandbox)
    if root is not None:
        return HostTree(root)
    if getattr(getattr(sandbox, "sdk", None), "files", None) is not None:
        return FilesApiTree(sandbox)
    return None


# -- a private git, for patch.diff ------------------------------------------------------------------------------


class PrivateGit:
    """A bare repository in a host temporary folder, used only to print diffs: no work tree, no configuration
    (system and global off, HOME empty), no attributes, no hooks; this module writes the objects itself."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="bugsweep-grader-"))
        git = shutil.which("git", path="/usr/bin:/bin:/usr/local/bin")
        if git is None:
            raise FileNotFoundError("git is not installed on this machine (apt-get install git)")
        self._git = git
        (self.path / "objects").mkdir()
        (self.path / "refs").mkdir()
        (self.path / "HEAD").write_text("ref: refs/heads/main\n")
        (self.path / "config").write_text("[core]\n\trepositoryformatversion = 0\n\tbare = true\n")

    def __enter__(self) -> PrivateGit:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def run(self, *args: str, stdin: bytes | None = None, index: str | None = None) -> bytes:
        env = {
            "PATH": "/usr/bin:/bin", "HOME": str(self.path), "LC_ALL": "C", "GIT_DIR": str(self.path),
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_ATTR_NOSYSTEM": "1",
            "GIT_NO_REPLACE_OBJECTS": "1", "GIT_TERMINAL_PROMPT": "0",
        }  # fmt: skip
        if index:
            env["GIT_INDEX_FILE"] = str(self.path / index)
        proc = subprocess.run(
            [self._git, "-c", "core.hooksPath=/dev/null", *args], input=stdin, env=env, capture_output=True
        )
        if proc.returncode != 0:
            raise OSError(errno.EIO, f"git {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
        return proc.stdout

    def write_blob(self, data: bytes) -> str:
        raw = b"blob %d\0" % len(data) + data
        oid = hashlib.sha1(raw).hexdigest()
        folder = self.path / "objects" / oid[:2]
        folder.mkdir(exist_ok=True)
        target = folder / oid[2:]
        if not target.exists():
            target.write_bytes(zlib.compress(raw, 1))
        return oid

    def write_tree(self, entries: dict[str, tuple[int, str]], name: str) -> str:
        """A tree object of `entries` (path -> (mode, blob id)); nested folders made by git's own index."""
        lines = b"".join(
            b"%o %s\t%s\0" % (mode, oid.encode(), os.fsencode(p)) for p, (mode, oid) in entries.items()
        )
        self.run("update-index", "-z", "--add", "--index-info", stdin=lines, index=name)
        return self.run("write-tree", index=name).decode().strip()


def render_patch(changes: list[Change], old: dict[str, bytes], new: dict[str, bytes]) -> str:
    """`changes` as a `git diff` (binary files included, applies with `git apply`), from the bytes given."""
    if not changes:
        return ""
    with PrivateGit() as store:
        before: dict[str, tuple[int, str]] = {}
        after: dict[str, tuple[int, str]] = {}
        for change in changes:
            if change.old is not None:
                before[change.path] = (change.old.mode, store.write_blob(old[change.path]))
            if change.new is not None:
                after[change.path] = (change.new.mode, store.write_blob(new[change.path]))
        a = store.write_tree(before, "index-before")
        b = store.write_tree(after, "index-after")
        out = store.run(
            "diff-tree", "-r", "-p", "--binary", "--full-index", "--no-renames", "--no-textconv", "--no-ext-diff",
            "--no-color", a, b,
        )  # fmt: skip
    return out.decode("utf-8", errors="replace")
