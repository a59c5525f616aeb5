"""Spare sandbox disks (bugsweep/sandbox/local/spares.py), for real: loop-mounted ext4 file systems made ahead of
time in real child processes and in this one, taken by real sandboxes, released at exit and reaped after a kill.
Needs Linux, root, bubblewrap, e2fsprogs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bugsweep.sandbox import RepoSource
from bugsweep.sandbox.local import LocalProvider, reap_stale, spares
from bugsweep.settings import SandboxSettings
from tests.support.leftovers import processes_in_cgroups, sandbox_leftovers

PROJECT_DIR = Path(__file__).resolve().parents[1]
QUOTA_MIB = 64


def wait_for_spares(state_dir: Path, count: int = 1) -> list[Path]:
    deadline = time.monotonic() + 60
    while len(spares.ready(state_dir)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return spares.ready(state_dir)


def on_the_machine(state_dir: Path, folder: Path) -> list[str]:
    """What of the spare `folder` is still there: its mount, its loop device, its folder, its image."""
    found = []
    if f" {folder} " in Path("/proc/mounts").read_text():  # (a spare is mounted nowhere until it is taken)
        found.append("mount")
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if backing.read_text().strip() == f"{folder}.disk":
                found.append("loop device")
        except OSError:
            pass
    found += [p.name for p in (folder, Path(f"{folder}.disk")) if p.exists()]
    return found


@pytest.fixture
def provider(tmp_path: Path) -> LocalProvider:
    settings = SandboxSettings(memory_mib=256, max_processes=64, disk_mib=QUOTA_MIB)
    return LocalProvider(settings, cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")


def test_the_next_sandbox_takes_a_fresh_spare_and_its_quota_holds(provider, buggy_repo):
    first = provider.create(RepoSource(str(buggy_repo)))
    ids = [first.id]
    try:
        assert first.exec(
            "echo from-the-first > /workspace/mark && dd if=/dev/zero of=/tmp/f bs=1M count=8"
        ).ok
        [spare] = wait_for_spares(provider.state_dir)
        # made, on a loop device, mounted on its folder: its resident (resident.py) binds it already
        assert on_the_machine(provider.state_dir, spare) == [
            "mount", "loop device", spare.name, f"{spare.name}.disk"
        ]  # fmt: skip
        assert json.loads((spare / "meta.json").read_text())["kind"] == "spare"
        assert spare.name not in {entry["id"] for entry in provider.sandboxes()}  # not a sandbox yet

        with provider.create(RepoSource(str(buggy_repo))) as second:
            ids.append(second.id)
            assert second.id == spare.name and os.path.ismount(spare)
            assert second.usage.disk_quota_bytes == QUOTA_MIB * 1024 * 1024
            fresh = second.exec("ls -A /workspace /tmp").stdout.split()
            assert "mark" not in fresh and "f" not in fresh
            assert "calc.py" in second.exec("ls").stdout
            full = second.exec(f"dd if=/dev/zero of=/tmp/big bs=1M count={QUOTA_MIB * 2} 2>&1")
            assert not full.ok and "No space left on device" in full.stdout
            assert second.usage.peak_disk_bytes > (QUOTA_MIB - 8) * 1024 * 1024
            # the next spare is made again, never a used disk
            [again] = wait_for_spares(provider.state_dir)
            assert again not in (spare, provider.state_dir / first.id)
    finally:
        first.release()
    assert sandbox_leftovers(provider.state_dir, ids) == []
    assert not list(provider.state_dir.glob("local-*.disk"))


def test_only_the_last_quota_asked_for_keeps_a_spare(provider, buggy_repo):
    with provider.create(RepoSource(str(buggy_repo))) as first:
        assert first.exec("true").ok  # spares are made after a sandbox's first command
        [spare] = wait_for_spares(provider.state_dir)
        with provider.create(RepoSource(str(buggy_repo)), disk_mib=QUOTA_MIB * 2) as second:
            assert second.id != spare.name  # not the spare of the other size
            assert second.usage.disk_quota_bytes == 2 * QUOTA_MIB * 1024 * 1024
            assert second.exec("true").ok
            [bigger] = wait_for_spares(provider.state_dir)
            deadline = time.monotonic() + 30
            while on_the_machine(provider.state_dir, spare) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert on_the_machine(provider.state_dir, spare) == []
    assert sandbox_leftovers(provider.state_dir, [first.id, second.id, bigger.name]) == []


def test_no_spares_when_turned_off(tmp_path, buggy_repo):
    settings = SandboxSettings(disk_mib=QUOTA_MIB, spare_disks=0)
    provider = LocalProvider(settings, cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")
    with provider.create(RepoSource(str(buggy_repo))) as sandbox:
        assert sandbox.exec("true").ok
        assert [p.name for p in provider.state_dir.glob("local-*") if p.is_dir()] == [sandbox.id]
    assert spares.ready(provider.state_dir) == []
    assert sandbox_leftovers(provider.state_dir, [sandbox.id]) == []


def test_without_a_resident_a_spare_is_mounted_nowhere_until_taken(tmp_path, buggy_repo):
    settings = SandboxSettings(disk_mib=QUOTA_MIB, resident=False)
    provider = LocalProvider(settings, cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")
    with provider.create(RepoSource(str(buggy_repo))) as first:
        assert first.exec("true").ok
        [spare] = wait_for_spares(provider.state_dir)
        # a detached mount held by this process: the kernel drops it with the process, however it dies
        assert on_the_machine(provider.state_dir, spare) == ["loop device", spare.name, f"{spare.name}.disk"]
        with provider.create(RepoSource(str(buggy_repo))) as second:
            assert second.id == spare.name and second._res.resident is None
            assert "/bin/bash" in second.exec("tr '\\0' ' ' < /proc/1/cmdline").stdout  # its own bubblewrap
    assert sandbox_leftovers(provider.state_dir, [first.id, second.id]) == []


def child_script(tmp_path: Path, repo: Path, then: str) -> str:
    return f"""
import os, time
from pathlib import Path
from bugsweep.sandbox.base import RepoSource
from bugsweep.sandbox.local import LocalProvider, spares
from bugsweep.settings import SandboxSettings
state = Path({str(tmp_path / "state")!r})
p = LocalProvider(SandboxSettings(disk_mib={QUOTA_MIB}), cache_dir=Path({str(tmp_path / "cache")!r}), state_dir=state)
s = p.create(RepoSource({str(repo)!r}))  # alive until the end: spares go a moment after the last sandbox
s.exec("true")
deadline = time.monotonic() + 60
while not spares.ready(state) and time.monotonic() < deadline:
    time.sleep(0.02)
[spare] = spares.ready(state)
loops = [b.read_text().strip() for b in Path("/sys/block").glob("loop*/loop/backing_file")]
print(spare, f"{{spare}}.disk" in loops, flush=True)
{then}
"""


def test_spares_are_released_when_the_process_exits(tmp_path, buggy_repo):
    state = tmp_path / "state"
    out = subprocess.run(
        [sys.executable, "-c", child_script(tmp_path, buggy_repo, "")],
        capture_output=True, text=True, timeout=180, env=dict(os.environ, PYTHONPATH=str(PROJECT_DIR)),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    folder, attached = out.stdout.split()
    assert attached == "True"  # it was there while the process ran
    assert on_the_machine(state, Path(folder)) == []
    assert sandbox_leftovers(state, []) == []


def test_spares_of_a_killed_process_are_reaped(tmp_path, buggy_repo):
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-c", child_script(tmp_path, buggy_repo, "time.sleep(600)")],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(PROJECT_DIR)),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        folder, attached = proc.stdout.readline().split()
        assert attached == "True"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    spare = Path(folder)
    # its resident and spawner went with the process; its mount, loop device, folder and image are the sweep's
    deadline = time.monotonic() + 10
    while processes_in_cgroups(spare.name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_in_cgroups(spare.name) == []
    assert on_the_machine(state, spare) == ["mount", "loop device", spare.name, f"{spare.name}.disk"]
    assert spare.name in reap_stale(state)
    assert on_the_machine(state, spare) == []
    assert sandbox_leftovers(state, []) == []
