"""What a Runtime microVM holds for a task: the repository, and the task environment with the same contract as the
local backend's (bugsweep.sandbox.base), built in the microVM.

`put_repo` puts the repository at the workdir (cloned inside for a git URL, else uploaded as one archive).

`make_task_env` makes an empty venv at TASK_ENV when the sandbox is created (no pip: `setup_environment` adds it
when a setup runs), and every later command gets it first on PATH. Runtime keeps no layers: every sandbox runs
its setup again. `snapshot` packs the repository and the venv into one archive held on this machine, and
`unpack` puts it into a new microVM, so a fresh sandbox for the regrade installs nothing.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bugsweep.errors import ConfigError, SandboxError
from bugsweep.sandbox.base import TASK_ENV, Environment, ExecResult, RepoSource
from bugsweep.sandbox.sources import checkout_archive, is_git_url, redact_url

if TYPE_CHECKING:
    from bugsweep.sandbox.runtime import RuntimeSandbox

#: PATH inside the microVM, after the task environment's bin.
_VM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Prints the interpreter's version, then every installed distribution as name==version (no pip needed).
_LIST_PACKAGES = (
    "import importlib.metadata as m, platform; print(platform.python_version()); "
    "print(*sorted({f\"{d.metadata['Name'].lower().replace('_', '-')}=={d.version}\" for d in m.distributions() "
    "if d.metadata['Name']}), sep='\\n')"
)


@dataclass
class RuntimeSnapshot:
    """A Runtime sandbox's repository and task environment, as an archive held on this machine."""

    id: str
    archive: bytes = field(repr=False)
    python: str = "python3"
    disk_mib: int | None = None

    def release(self) -> None:
        self.archive = b""


def make_task_env(sbx: RuntimeSandbox, python: str | None) -> None:
    """The empty venv at TASK_ENV (no pip yet: the setup adds it when it installs), first on PATH from now on."""
    sbx.python = python or "python3"
    made = sbx.exec(f"{shlex.quote(sbx.python)} -m venv --without-pip {TASK_ENV}", cwd="/", timeout=300)
    if not made.ok:
        raise ConfigError(
            f"--python {sbx.python!r}: could not make a venv with it in the Runtime sandbox: "
            f"{made.output.strip()[-500:]}"
        )
    sbx.task_env = {"PATH": f"{TASK_ENV}/bin:{_VM_PATH}", "VIRTUAL_ENV": TASK_ENV}


def setup_environment(
    sbx: RuntimeSandbox, command: str | None, *, timeout: float = 1800.0, network: bool = True
) -> tuple[ExecResult | None, Environment]:
    """Run the setup in the task environment (built in the microVM every time: Runtime keeps no layers)."""
    result = None
    if command:
        pip = sbx.exec(
            f"[ -x {TASK_ENV}/bin/pip ] || python -m ensurepip --default-pip >/dev/null", timeout=600
        )
        if not pip.ok:
            raise SandboxError(f"could not put pip into the task environment: {pip.output.strip()[-500:]}")
        result = sbx.exec(command, timeout=timeout, network=network, full_output=True)
    listed = sbx.exec(f"python -I -c {shlex.quote(_LIST_PACKAGES)}", timeout=120)
    if not listed.ok:
        raise SandboxError(f"could not list the task environment: {listed.output.strip()[-500:]}")
    version, *packages = listed.stdout.split()
    return result, Environment(python=version, setup_command=command, packages=packages, installer="pip")


def snapshot(sbx: RuntimeSandbox) -> RuntimeSnapshot:
    """The repository and the task environment as one archive, kept on this machine (a new microVM gets them
    unpacked: nothing is installed again)."""
    path = f"{sbx.workdir.rstrip('/')}/../.bugsweep-snapshot.tar.gz"
    packed = sbx.exec(
        f"tar -C / -czf {path} {sbx.workdir.lstrip('/')} {TASK_ENV.lstrip('/')}", cwd="/", timeout=900
    )
    if not packed.ok:
        raise SandboxError(f"could not pack the task state: {packed.output.strip()[-500:]}")
    from bugsweep.sandbox.runtime import classified

    with classified("download the task state", sbx.id):
        data = sbx.sdk.files.read(path)
    sbx.exec(f"rm -f {path}", cwd="/", timeout=60)
    return RuntimeSnapshot(id=f"snap-{sbx.id}", archive=bytes(data), python=sbx.python)


def unpack(sbx: RuntimeSandbox, snapshot: RuntimeSnapshot) -> None:
    path = "/workspace/.bugsweep-snapshot.tar.gz"
    from bugsweep.sandbox.runtime import classified

    with classified("upload the task state", sbx.id):
        sbx.sdk.files.write(path, snapshot.archive)
    done = sbx.exec(f"tar -C / -xzf {path} && rm -f {path}", cwd="/", timeout=900)
    if not done.ok:
        raise SandboxError(f"could not unpack the task state: {done.output.strip()[-500:]}")
    sbx.python = snapshot.python
    sbx.task_env = {"PATH": f"{TASK_ENV}/bin:{_VM_PATH}", "VIRTUAL_ENV": TASK_ENV}


def put_repo(sbx: RuntimeSandbox, source: RepoSource) -> None:
    """The repository at workdir: for a git URL, cloned inside the sandbox and `source.ref` checked out; for
    a local folder, uploaded with its .git (at `source.ref` if given, resolved on this machine)."""
    repo = source.repo
    if is_git_url(repo):
        shown = redact_url(repo)
        cloned = sbx.exec(
            f"git clone --quiet -- {shlex.quote(repo)} {shlex.quote(sbx.workdir)}",
            cwd="/",
            network=True,
            timeout=sbx.clone_timeout,
        )
        if not cloned.ok:
            output = cloned.output.replace(repo, shown).strip()[-500:]
            message = f"git clone {shown} failed in Runtime sandbox {sbx.id}: {output}"
            if re.search(
                r"not found|does not exist|Authentication failed|could not read Username", output, re.I
            ):
                raise ConfigError(message)
            raise SandboxError(message)
        if shown != repo:  # credentials in the URL must not stay where the model can read them
            sbx.exec(f"git remote set-url origin {shlex.quote(shown)}", timeout=60)
        if source.ref:
            _checkout(sbx, source.ref, shown)
        return
    # A local folder: the same tree the local backend uses (the working tree as it is, or a cached
    # checkout of the ref, made on this machine), uploaded as one archive.
    prepared = sbx.sources.prepare(source)
    data = checkout_archive(prepared.path)
    from bugsweep.sandbox.runtime import classified

    with classified(f"upload {prepared.path}", sbx.id):
        sbx.sdk.files.mkdir(sbx.workdir)
        sbx.sdk.files.unarchive(sbx.workdir, data)
    if not prepared.has_git:
        made = sbx.exec(
            "git init -q -b main && git add -A && git -c user.name=bugsweep -c user.email=bugsweep@localhost "
            "commit -q --no-verify --allow-empty -m 'bugsweep: the files as given'",
            timeout=300,
        )
        if not made.ok:
            raise SandboxError(f"could not make {sbx.workdir} a git repository: {made.output.strip()[-500:]}")


def _checkout(sbx: RuntimeSandbox, ref: str, repo: str) -> None:
    checkout = sbx.exec(
        f"git -c advice.detachedHead=false checkout -q -f --detach {shlex.quote(ref)} && git clean -q -fd",
        timeout=300,
    )
    if not checkout.ok:
        raise ConfigError(f"ref {ref!r} not found in {repo}: {checkout.output.strip()[-500:]}")
