"""What released local sandboxes must not leave on the machine, for the tests and the soak benchmark."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

#: Children of this process that belong to a sandbox (its network helper, its bubblewrap, a shell it ran).
SANDBOX_PROCESSES = ("slirp4netns", "bwrap", "sh")


def loop_devices(state_dir: Path, settle_s: float = 3.0) -> list[str]:
    """Loop devices backed by an image under `state_dir` (a sandbox's disk, not the state file system's own). A
    device set to clear itself on its last close is detached by the kernel just after the unmount returns: one
    still listed is looked at again for up to `settle_s` before it counts as left behind."""
    deadline = time.monotonic() + settle_s
    while True:
        found = []
        for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
            try:
                if f"{state_dir}/" in backing.read_text():
                    found.append(f"loop device {backing.parent.parent.name}")
            except OSError:
                pass
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


def sandbox_leftovers(state_dir: Path, sandbox_ids: list[str]) -> list[str]:
    """Mounts, loop devices, child processes, cgroups and folders of the sandboxes under `state_dir`; empty when
    every one of them was released."""
    found = []
    if f"{state_dir}/local-" in Path("/proc/mounts").read_text():
        found.append("sandbox mounts")
    found += loop_devices(state_dir)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or parent_pid(entry) != os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        exe = os.fsdecode(cmdline.split(b"\0")[0])
        if Path(exe).name in SANDBOX_PROCESSES:
            found.append(f"process {entry} ({exe})")
    cgroups = [d for sid in sandbox_ids for d in Path("/sys/fs/cgroup").glob(f"*/**/bugsweep-{sid}")]
    found += [f"cgroup {d}" for d in cgroups]
    found += [f"{p.name} in the state folder" for p in state_dir.glob("local-*")]
    return found


def parent_pid(pid: int | str) -> int:
    """The parent of process `pid`; -1 once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def processes_in_cgroups(sandbox_id: str) -> list[int]:
    """The processes in the cgroups of sandbox `sandbox_id` (`bugsweep-ID`)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if f"bugsweep-{sandbox_id}" in Path(f"/proc/{entry}/cgroup").read_text():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def other_user(home: Path) -> tuple[int, int]:
    """Another user of this machine: `bugsweep-other`, made with useradd when it can be (else a bare uid, which
    is what the reaper compares), with `home` as a home it owns."""
    import pwd
    import shutil

    try:
        pwd.getpwnam("bugsweep-other")
    except KeyError:
        if shutil.which(
            "useradd"
        ):  # a concurrent test session may make it first: then this one fails, harmless
            subprocess.run(["useradd", "--system", "--no-create-home", "bugsweep-other"], capture_output=True)
    try:
        entry = pwd.getpwnam("bugsweep-other")
        uid, gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        uid = gid = 4242
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, uid, gid)
    return uid, gid


#: What a user with root's powers over files and mounts has (so that only the reaper's own check can stop it).
POWERS = "+sys_admin,+dac_override,+dac_read_search,+fowner,+kill"


def as_user(uid: int, gid: int) -> list[str]:
    """The command prefix that runs a command as that user, with the powers to unmount and delete another user's
    sandboxes (setpriv, util-linux): what stops it must be bugsweep's own check of the owner."""
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", f"--inh-caps={POWERS}",
            f"--ambient-caps={POWERS}", "--"]  # fmt: skip
