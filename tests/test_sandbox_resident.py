"""The sandbox's resident (bugsweep/sandbox/local/resident.py), for real: a process in a spare sandbox's namespaces
that forks the sandbox's commands there instead of one bubblewrap per command. Real sandboxes (bubblewrap, cgroups,
loop-mounted quotas, overlays mounted after the resident started), real processes. Needs Linux, root, bubblewrap,
e2fsprogs.

What a user relies on: a command gives the same result and the same isolation as when it was a bubblewrap of its
own, its processes still end with it, a command cannot use or harm the resident to reach past its sandbox (at
worst it costs itself a timeout and later commands their speed), and nothing of it outlives the sandbox.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from bugsweep.sandbox import RepoSource
from bugsweep.sandbox.local import LocalProvider, LocalSandbox, spares
from bugsweep.settings import SandboxSettings
from tests.support.leftovers import processes_in_cgroups, sandbox_leftovers
from tests.test_sandbox_spawner import COMMANDS, exec_results


@pytest.fixture
def provider(tmp_path: Path) -> LocalProvider:
    settings = SandboxSettings(memory_mib=256, max_processes=64, disk_mib=64)
    return LocalProvider(settings, cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")


def with_resident(provider: LocalProvider, repo: Path, **kwargs: object) -> LocalSandbox:
    """A sandbox made from a spare, hence with a resident (spares are made after a sandbox's first command)."""
    with provider.create(RepoSource(str(repo))) as first:
        assert first.exec("true").ok
        deadline = time.monotonic() + 60
        while not spares.ready(provider.state_dir) and time.monotonic() < deadline:
            time.sleep(0.02)
    sandbox = provider.create(RepoSource(str(repo)), **kwargs)  # type: ignore[arg-type]
    return sandbox


def pid1(sandbox: LocalSandbox) -> str:
    """What runs as the sandbox's init for this command: the resident's bubblewrap, or the command's own."""
    return sandbox.exec("tr '\\0' ' ' < /proc/1/cmdline").stdout


#: Beside the spawner's: what the command is and may do (identity, privileges, filter, network, mounts, limits).
ISOLATION = [
    ("env | sort; id; hostname; pwd; umask", None, 30),
    ("grep -E '^(Uid|Gid|Groups|NoNewPrivs|Seccomp|Seccomp_filters|CapInh|CapPrm|CapEff|CapBnd|CapAmb):' "
     "/proc/self/status", None, 30),
    ("cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' '; ulimit -u", None, 30),
    # what is mounted where, the top mount of each mount point (mount ids and propagation peer groups are numbers
    # that differ from one namespace to the next; the resident's overlays arrive later, over its empty binds)
    ("awk '{ m[$5] = $4 \" \" $5 \" \" $6 \" \" $NF } END { for (k in m) print m[k] }' /proc/self/mountinfo "
     "| sort", None, 30),
    ("ls /workspace/repo; echo patched > /workspace/repo/new.txt; cat /workspace/repo/new.txt; rm /workspace/repo/new.txt",
     None, 30),
    ("cd /nonexistent", None, 30),
    ("unshare -U true; echo unshare=$?; python3 -c 'import os; os.setsid()' 2>&1 | tail -1", None, 30),
]  # fmt: skip


def test_a_command_gives_the_same_result_through_the_resident_as_in_its_own_bubblewrap(provider, buggy_repo):
    with with_resident(provider, buggy_repo) as sbx:
        resident = sbx._res.resident
        assert resident is not None and resident.alive, "a sandbox made from a spare has a resident"
        assert "-I -S -" in pid1(sbx)  # the command was forked by the resident (python -I -S - CTL)
        # the timeout last: it ends the resident (its whole namespace goes), and later commands start the old way
        commands = [*ISOLATION, *sorted(COMMANDS, key=lambda c: c[2] < 30)]
        through = exec_results(sbx, commands)
        assert not resident.alive  # ended by the timed-out command
        assert "/bin/bash" in pid1(sbx)  # each command its own bubblewrap again
        direct = exec_results(sbx, commands)
    for (command, *got), (_, *want) in zip(through, direct, strict=True):
        if command.endswith("echo $$"):  # the differences allowed: the shell is not pid 2 of its namespace
            assert got[1].splitlines()[:-1] == want[1].splitlines()[:-1] and got[1].split()[-1] != "2"
            got[1] = want[1]
        assert got == want, command
    assert sandbox_leftovers(provider.state_dir, [sbx.id]) == []


def test_a_missing_cwd_is_an_error_the_model_can_read(provider, buggy_repo):
    with with_resident(provider, buggy_repo) as sbx:
        r = sbx.exec("true", cwd="/nonexistent")
        assert r.exit_code == 1 and "/nonexistent: No such file or directory" in r.stderr
        assert sbx._res.resident is not None and sbx._res.resident.alive
        assert sbx.exec("echo still here").stdout == "still here\n"


def test_processes_end_with_their_command(provider, buggy_repo):
    with with_resident(provider, buggy_repo) as sbx:
        started = sbx.exec(
            "sleep 301 & setsid sleep 302 & (sleep 303 &) & nohup sleep 304 >/dev/null 2>&1 & "
            "for i in $(seq 20); do sleep 305 & done; echo started"
        )
        assert started.exit_code == 0 and started.stdout == "started\n"
        left = sbx.exec("ps -eo args | grep -c '^sleep 30' || true").stdout.strip()
        assert left == "0"
        assert not [p for p in processes_in_cgroups(sbx.id) if "sleep" in _cmdline(p)]
        assert sbx._res.resident is not None and sbx._res.resident.alive


def test_a_timeout_ends_every_process_and_later_commands_still_run(provider, buggy_repo):
    with with_resident(provider, buggy_repo) as sbx:
        r = sbx.exec("sleep 306 & sleep 307", timeout=1)
        assert r.timed_out and r.exit_code is None
        assert not [p for p in processes_in_cgroups(sbx.id) if "sleep" in _cmdline(p)]
        assert sbx.exec("echo ok").stdout == "ok\n"
        assert "calc.py" in sbx.exec("ls").stdout
    assert sandbox_leftovers(provider.state_dir, [sbx.id]) == []


def test_a_command_cannot_reach_or_hold_the_resident(provider, buggy_repo):
    with with_resident(provider, buggy_repo) as sbx:
        # its parent is the resident: not dumpable, so its descriptors (the control socket), memory and environment
        # are closed to the command; ptrace is denied by the filter
        peek = sbx.exec("ls /proc/$PPID/fd; cat /proc/$PPID/environ; head -c1 /proc/$PPID/mem; echo done")
        assert "Permission denied" in peek.stderr and "socket:" not in peek.stdout
        # a command that stops the resident only costs itself a timeout, and runs once (the resident says it
        # started the command before it starts it: never a command run again in a bubblewrap of its own)
        stopped = sbx.exec("echo ran >> /tmp/runs; kill -STOP $PPID; echo stopped", timeout=3)
        assert stopped.timed_out
        assert sbx.exec("echo after; cat /tmp/runs").stdout == "after\nran\n"
    with with_resident(provider, buggy_repo) as sbx:
        # one that kills every process it can (the resident too) ends itself, once, and the next command still runs
        killed = sbx.exec("echo ran >> /tmp/runs; kill -9 -1; sleep 5")
        assert killed.exit_code == 137 and not killed.timed_out
        assert sbx.exec("echo after; cat /tmp/runs").stdout == "after\nran\n"
    assert sandbox_leftovers(provider.state_dir, []) == []


def test_a_sandbox_of_another_interpreter_does_not_take_the_spares_resident(provider, buggy_repo):
    other = "/usr/bin/python3"
    if not os.path.exists(other) or os.path.realpath(other) == os.path.realpath(_bugsweep_python()):
        pytest.skip("needs a second Python interpreter")
    with with_resident(provider, buggy_repo, python=other) as sbx:
        assert sbx._res.resident is None  # started with the other interpreter's binds: stopped
        assert "/bin/bash" in pid1(sbx)
        version = sbx.exec("python -c 'import sys; print(sys.executable, sys.version_info[:2])'").stdout
        assert version.startswith("/opt/venv/bin/python")
    assert sandbox_leftovers(provider.state_dir, [sbx.id]) == []


def _bugsweep_python() -> str:
    import sys

    return getattr(sys, "_base_executable", sys.executable)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def test_the_resident_goes_with_its_sandbox(provider, buggy_repo):
    sbx = with_resident(provider, buggy_repo)
    assert sbx.exec("true").ok
    inside = processes_in_cgroups(sbx.id)
    assert any("-I -S -" in _cmdline(p) for p in inside)
    sbx.release()
    assert processes_in_cgroups(sbx.id) == []
    assert sandbox_leftovers(provider.state_dir, [sbx.id]) == []
    assert subprocess.run(["pgrep", "-f", f"bugsweep-{sbx.id}"], capture_output=True).returncode == 1


def test_the_limits_hold_for_commands_the_resident_starts(provider, buggy_repo):
    with with_resident(provider, buggy_repo) as sbx:
        assert sbx._res.resident is not None and sbx._res.resident.alive
        hog = sbx.exec("python3 -c 'x = bytearray(1 << 30); print(len(x))'")  # over the 256 MiB limit
        assert hog.out_of_memory and hog.exit_code == 137
        assert sbx.exec("echo after the hog").stdout == "after the hog\n"
        fork = sbx.exec("for i in $(seq 200); do sleep 600 & done; wait", timeout=5)  # 64 processes at most
        assert "fork" in fork.stderr.lower() or fork.timed_out
        assert not [p for p in processes_in_cgroups(sbx.id) if "sleep" in _cmdline(p)]
        full = sbx.exec(
            "dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1; rm -f /tmp/big"
        )  # the 64 MiB quota
        assert full.disk_full and "No space left on device" in full.stdout
        assert sbx.exec("echo still here").stdout == "still here\n"
    assert sandbox_leftovers(provider.state_dir, [sbx.id]) == []


def test_the_resident_sees_the_layers_rearranged_by_a_snapshot(provider, buggy_repo):
    """A snapshot unmounts the sandbox's overlays and mounts them again on a new layer: on the host, after the
    resident started; its namespace gets both by propagation, and a sandbox made from the snapshot sees it too."""
    with with_resident(provider, buggy_repo) as sbx:
        assert sbx._res.resident is not None
        assert sbx.exec("echo one > one.txt && echo env > /opt/venv/marker").ok
        snapshot = sbx.snapshot()
        try:
            assert sbx._res.resident.alive
            assert sbx.exec("cat one.txt /opt/venv/marker && echo two > two.txt").stdout == "one\nenv\n"
            assert sbx.files.read_text("two.txt") == "two\n"
            assert "-I -S -" in pid1(sbx)
            with provider.create_from(snapshot) as fresh:
                assert fresh.exec("cat one.txt /opt/venv/marker; ls two.txt 2>&1").stdout.startswith(
                    "one\nenv\n"
                )
                assert "No such file" in fresh.exec("ls two.txt 2>&1").stdout
        finally:
            snapshot.release()
    assert sandbox_leftovers(provider.state_dir, []) == []


def test_a_setup_network_leaves_every_sandbox_s_overlays_mounted(provider, buggy_repo):
    """A spare's disk is a shared mount (so the overlays under it reach the resident). slirp4netns, which gives a
    setup command its network, makes its own mount namespace with only / private, then detaches the host's tree:
    run from this namespace, that detach unmounted the overlays of every sandbox made from a spare (a sweep's
    task then failed with "its workspace is gone", or found no Python). The setup network must leave them."""
    with with_resident(provider, buggy_repo) as sbx:
        assert sbx._res.resident is not None
        mounts = [sbx._res.repo_dir, sbx._res.env.target]
        assert all(os.path.ismount(m) for m in mounts)
        with provider.create(RepoSource(str(buggy_repo))) as other:
            assert other.exec("true", network=True).ok
        assert sbx.exec("true", network=True).ok  # its own setup command too
        assert [m for m in mounts if not os.path.ismount(m)] == []
        assert sbx.exec("ls calc.py && python3 -c 'print(1)'").stdout == "calc.py\n1\n"
    assert sandbox_leftovers(provider.state_dir, []) == []
