"""The sandbox's spawner (bugsweep/sandbox/local/spawner.py), for real: a process already in the sandbox's cgroups
that starts its commands there. Real sandboxes (bubblewrap, cgroups, loop-mounted quotas), real child processes
killed with SIGKILL. Needs Linux, root, bubblewrap, e2fsprogs.

What a user relies on: a command gives the same result whether the spawner started it or not, its processes are
held by the sandbox's limits, a spawner that dies costs nothing but speed, and nothing of it outlives its sandbox
or its process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bugsweep.sandbox import RepoSource
from bugsweep.sandbox.local import LocalProvider, LocalSandbox, reap_stale
from bugsweep.settings import SandboxSettings
from tests.support.leftovers import parent_pid, processes_in_cgroups, sandbox_leftovers

PROJECT_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture
def provider(tmp_path: Path) -> LocalProvider:
    settings = SandboxSettings(memory_mib=256, max_processes=64, disk_mib=64)
    return LocalProvider(settings, cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")


def with_ready_spawner(sandbox: LocalSandbox) -> LocalSandbox:
    spawner = sandbox._res.spawner
    assert spawner is not None, "this host has cgroups: every sandbox has a spawner"
    deadline = time.monotonic() + 30
    while not spawner.ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert spawner.ready()
    return sandbox


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


#: (command, stdin, timeout): exit codes, both streams, stdin, a broken pipe, a kill by signal, a timeout.
COMMANDS = [
    ("exit 3", None, 30),
    ("echo out; echo err >&2; printf 'no newline'", None, 30),
    ('cat; echo " and $(pwd) $HOME"', "from stdin", 30),
    ('yes | head -n 2; echo "yes ended with ${PIPESTATUS[0]}"', None, 30),  # 141: SIGPIPE at its default
    ("kill -9 $$", None, 30),
    ("ulimit -n; trap -p; echo $$", None, 30),
    ("sleep 10", None, 1),
    ("printf 'h\\u00e9llo \\u2713 '; echo 'd\u00e9j\u00e0 \u2713'", None, 30),  # not ASCII, both ways
    # the shell's descriptors, listed into a file: through a pipe, the shell may still hold the pipe's ends
    ("ls -l /proc/$$/fd > /tmp/fds; sed 's/.* \\([0-9]* ->\\)/\\1/; s/pipe:.*/pipe/' /tmp/fds", None, 30),
]


def exec_results(
    sbx: LocalSandbox, commands: list[tuple[str, str | None, float]]
) -> list[tuple[object, ...]]:
    """Each of `commands` run in `sbx`, as (command, exit code, stdout, stderr, timed out, out of memory)."""
    out = []
    for command, stdin, timeout in commands:
        r = sbx.exec(command, stdin=stdin, timeout=timeout)
        out.append((command, r.exit_code, r.stdout, r.stderr, r.timed_out, r.out_of_memory))
    return out


def test_a_command_gives_the_same_result_through_the_spawner_as_without(provider, buggy_repo):
    with with_ready_spawner(provider.create(RepoSource(str(buggy_repo)))) as sbx:
        spawner = sbx._res.spawner
        through = exec_results(sbx, COMMANDS)
        sbx._res.spawner = None  # each command joins the cgroups itself, as before the spawner
        try:
            direct = exec_results(sbx, COMMANDS)
        finally:
            sbx._res.spawner = spawner
    assert through == direct
    assert through[3][2] == "y\ny\nyes ended with 141\n"
    assert through[6][4]  # the timeout
    # Nothing of the spawner's reaches a command: its control socket would let the sandbox start anything outside.
    assert "socket:" not in through[8][2] and "0 -> /dev/null\n1 -> pipe\n2 -> pipe" in through[8][2]
    assert through[7][2] == "h\u00e9llo \u2713 d\u00e9j\u00e0 \u2713\n"
    assert sandbox_leftovers(provider.state_dir, [sbx.id]) == []


def test_commands_start_inside_the_cgroups_and_the_limits_hold(provider, buggy_repo, monkeypatch):
    monkeypatch.setenv("LLM_API_KEY", "sk-spawner-test-secret")
    with with_ready_spawner(provider.create(RepoSource(str(buggy_repo)))) as sbx:
        spawner = sbx._res.spawner
        assert spawner is not None
        # the spawner, outside the sandbox but in its cgroups, does not hold bugsweep's environment
        assert b"sk-spawner-test-secret" not in Path(f"/proc/{spawner.proc.pid}/environ").read_bytes()
        # the spawner itself is in the sandbox's cgroups (memory, pids, cpuacct)
        assert cgroup_of(spawner.proc.pid).count(f"bugsweep-{sbx.id}") == len(sbx._res.limits.dirs)
        running = threading.Thread(target=sbx.exec, args=("sleep 3",))
        running.start()
        try:
            deadline = time.monotonic() + 10
            bwraps: list[int] = []
            while not bwraps and time.monotonic() < deadline:
                bwraps = [
                    int(p) for p in os.listdir("/proc")
                    if p.isdigit() and Path(f"/proc/{p}/comm").exists() and _comm(p) == "bwrap"
                    and parent_pid(p) == spawner.proc.pid
                ]  # fmt: skip
                time.sleep(0.02)
            assert bwraps, "the command's bubblewrap is a child of the spawner"
            assert cgroup_of(bwraps[0]).count(f"bugsweep-{sbx.id}") == len(sbx._res.limits.dirs)
        finally:
            running.join()
        hog = sbx.exec("python -c \"x = b'a' * (512 * 1024 * 1024); print('allocated')\"", timeout=60)
        assert hog.exit_code == 137 and hog.out_of_memory  # the 256 MiB limit, as without the spawner
        bomb = sbx.exec("bomb() { bomb | bomb & }; bomb; sleep 3", timeout=8)
        assert "Resource temporarily unavailable" in bomb.stderr  # the 64-process limit
        assert spawner.proc.poll() is None  # the OOM kill and the bomb took the commands, not the spawner
        assert sbx.exec("echo fine").stdout == "fine\n"


def _state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_a_dead_spawner_costs_only_speed(provider, buggy_repo):
    with with_ready_spawner(provider.create(RepoSource(str(buggy_repo)))) as sbx:
        spawner = sbx._res.spawner
        assert spawner is not None
        running: list[object] = []
        thread = threading.Thread(
            target=lambda: running.append(sbx.exec("sleep 30; echo not killed", timeout=60))
        )
        thread.start()
        time.sleep(1)
        os.kill(spawner.proc.pid, signal.SIGKILL)
        thread.join(timeout=30)
        assert not thread.is_alive()
        [killed] = running
        assert killed.exit_code == -signal.SIGKILL  # it went with the spawner
        assert "not killed" not in killed.stdout
        result = sbx.exec("echo still runs; exit 4")
        assert (result.exit_code, result.stdout) == (4, "still runs\n")  # started the slower way
        assert not spawner.ready()
    assert sandbox_leftovers(provider.state_dir, [sbx.id]) == []


CHILD = """
import sys, threading, time
from pathlib import Path
from bugsweep.sandbox.base import RepoSource
from bugsweep.sandbox.local import LocalProvider
from bugsweep.settings import SandboxSettings
state, cache, repo, quota = sys.argv[1:5]
p = LocalProvider(SandboxSettings(disk_mib=int(quota)), cache_dir=Path(cache), state_dir=Path(state))
s = p.create(RepoSource(repo))
while not s._res.spawner.ready():
    time.sleep(0.01)
threading.Thread(target=s.exec, args=("sleep 600",), daemon=True).start()
time.sleep(1)
print(s.id, s._res.spawner.proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("quota_mib", [0, 64], ids=["spawner made with the sandbox", "spawner of a spare"])
def test_the_spawner_and_its_commands_go_when_its_process_is_killed(tmp_path, buggy_repo, quota_mib):
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(state), str(tmp_path / "cache"), str(buggy_repo), str(quota_mib)],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(PROJECT_DIR)),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        sandbox_id, spawner_pid = proc.stdout.readline().split()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    deadline = time.monotonic() + 10
    while processes_in_cgroups(sandbox_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (
        processes_in_cgroups(sandbox_id) == []
    )  # the spawner saw its control socket end and took `sleep 600` with it
    assert _state(spawner_pid) in ("gone", "Z")  # (a zombie until whoever adopted it reaps it)
    assert sandbox_id in reap_stale(state)
    assert sandbox_leftovers(state, [sandbox_id]) == []


def test_commands_run_at_once_through_one_spawner(provider, buggy_repo):
    with with_ready_spawner(provider.create(RepoSource(str(buggy_repo)))) as sbx:
        results: dict[int, object] = {}

        def run(i: int) -> None:  # each says when it started, then waits until all four have
            results[i] = sbx.exec(
                f"touch /tmp/started-{i}; for _ in $(seq 300); do [ $(ls /tmp/started-* | wc -l) = 4 ] && break; "
                f"sleep 0.1; done; ls /tmp/started-* | wc -l; exit {i}",
                timeout=60,
            )

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
        assert sorted(results) == [0, 1, 2, 3]
        # every command saw all four started: they ran at once, none waited for another to end
        assert all((r.exit_code, r.stdout) == (i, "4\n") for i, r in results.items())
        assert sbx._res.spawner is not None and sbx._res.spawner.ready()
