"""The local sandbox under abuse, for real: a disk quota on a real loop-mounted ext4, the setup step's network through
a real slirp4netns against real listeners on the host, the seccomp filter in real bubblewrap, a real pip install
from PyPI, and a whole `bugsweep solve` run against the scripted model server (a scripted stand-in, not a model).
Every test checks that nothing is left behind: no mount, loop device, slirp4netns process or cgroup.
Needs Linux (x86-64), root, Debian bubblewrap, slirp4netns, iproute2, e2fsprogs, libseccomp2, and PyPI.
"""

from __future__ import annotations

import errno
import json
import os
import platform
import shutil
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bugsweep.agent import prompts
from bugsweep.agent.trajectory import load, messages
from bugsweep.errors import ConfigError
from bugsweep.sandbox import RepoSource
from bugsweep.sandbox.local import LocalProvider, LocalSandbox
from bugsweep.sandbox.local import seccomp as seccomp_mod
from bugsweep.sandbox.local import setup_network as network_mod
from bugsweep.sandbox.local.capture import Spool
from bugsweep.settings import SandboxSettings
from tests.support.leftovers import sandbox_leftovers
from tests.support.repos import PYTEST_SETUP
from tests.support.scripted_model import tool_call

MIB = 1024 * 1024
QUOTA_MIB = 64


@pytest.fixture
def provider(tmp_path: Path) -> LocalProvider:
    settings = SandboxSettings(memory_mib=512, max_processes=128, disk_mib=QUOTA_MIB)
    return LocalProvider(settings, cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")


@pytest.fixture
def sbx(provider: LocalProvider, buggy_repo: Path) -> Iterator[LocalSandbox]:
    sandbox = provider.create(RepoSource(str(buggy_repo)))
    yield sandbox
    sandbox.release()
    assert sandbox_leftovers(provider.state_dir, [sandbox.id]) == []


# -- the disk quota ----------------------------------------------------------------------------------------------


def test_writing_past_the_quota_fails_inside_and_the_host_keeps_its_space(sbx, provider):
    host_free = shutil.disk_usage(provider.state_dir).free
    # 1 GiB at /tmp and 1 GiB in $HOME: without a quota the host's disk would lose 2 GiB.
    result = sbx.exec(
        "dd if=/dev/zero of=/tmp/fill bs=1M count=1024 status=none; echo tmp=$?; "
        "dd if=/dev/zero of=$HOME/fill bs=1M count=1024 status=none; echo home=$?; "
        "head -c 1048576 /dev/zero > /workspace/repo/new_file; echo repo=$?",
        timeout=120,
    )
    assert "No space left on device" in result.output
    assert "tmp=1" in result.stdout and "home=1" in result.stdout and "repo=1" in result.stdout
    assert result.disk_full
    image = provider.state_dir / f"{sbx.id}.disk"
    assert image.stat().st_blocks * 512 <= QUOTA_MIB * MIB * 1.05
    # Other engineers' jobs share this disk: allow some drift, far less than the 2 GiB an unlimited sandbox takes.
    assert host_free - shutil.disk_usage(provider.state_dir).free < (QUOTA_MIB + 512) * MIB
    # The model sees what to do about it.
    text = prompts.run_result(result.exit_code, result.output, False, False, 60, False, result.disk_full)
    assert "disk is full" in text and "Delete files" in text

    # Deleting makes room again; the quota covers the repository's changes (the overlay's upper layer) too.
    assert sbx.exec("rm /tmp/fill $HOME/fill && df -k /tmp | tail -1").ok
    written = sbx.exec(f"head -c {40 * MIB} /dev/zero > /workspace/repo/big && echo ok")
    assert written.ok and not written.disk_full
    more = sbx.exec(f"head -c {40 * MIB} /dev/zero > /tmp/big")
    assert not more.ok and "No space left on device" in more.stderr
    assert sbx.usage.peak_disk_bytes is not None and sbx.usage.peak_disk_bytes > (QUOTA_MIB - 8) * MIB
    assert sbx.usage.disk_quota_bytes == QUOTA_MIB * MIB


def test_a_task_can_ask_for_its_own_quota(provider, buggy_repo):
    with provider.create(RepoSource(str(buggy_repo)), disk_mib=200) as sandbox:
        assert sandbox.exec(f"head -c {150 * MIB} /dev/zero > /tmp/f && echo ok").ok
        size_kib = int(sandbox.exec("df -k --output=size /tmp | tail -1").stdout)
        assert 180 * 1024 < size_kib <= 200 * 1024
    assert sandbox_leftovers(provider.state_dir, [sandbox.id]) == []


@pytest.mark.parametrize("head", [0, 10])
@pytest.mark.parametrize("size", [0, 5, 10, 16, 17, 18, 24, 31, 38, 100])
def test_a_spool_keeps_its_head_and_its_last_bytes(tmp_path, head, size):
    """A stream's spool holds at most head + 2 * tail bytes: the ring's two segments, read across their seams."""
    data = (b"0123456789abcdefghijklmnopqrstuvwxyz" * 3)[:size]
    spool = Spool(tmp_path, head=head, tail=7)
    reader, writer = os.pipe()
    os.write(writer, data)
    os.close(writer)
    while spool.take(reader):
        pass
    os.close(reader)
    kept, cut = spool.read()
    assert os.fstat(spool.file.fileno()).st_size <= head + 2 * 7
    if size <= head + 7:
        assert (kept, cut) == (data, False)
    elif head:
        line = f"\n[... bugsweep: {size - head - 7} bytes of output cut here ...]\n".encode()
        assert (kept, cut) == (data[:head] + line + data[-7:], True)
    else:
        assert (kept, cut) == (data[-7:], True)
    spool.close()


def test_endless_output_ends_without_filling_the_quota_or_the_host(sbx, provider):
    host_free = shutil.disk_usage(provider.state_dir).free
    result = sbx.exec("yes 'endless output' ", timeout=60)
    # `yes` stops when its output is closed after a gigabyte (its output no longer goes on the sandbox's disk).
    assert result.exit_code == 141 and not result.timed_out and result.too_much_output
    assert not result.disk_full
    # the tail of the output, whole lines but the first and the last (the output is closed at a byte count, which
    # can fall inside a line: seen once, the tail ended "...endless output\ne")
    assert result.truncated and set(result.stdout.splitlines()[1:-1]) == {"endless output"}
    assert len(result.stdout) <= 64 * 1024
    assert sbx.usage.peak_disk_bytes is not None and sbx.usage.peak_disk_bytes < QUOTA_MIB * MIB // 2
    # A caller that wants the whole output gets its head and its tail, never a gigabyte.
    full = sbx.exec("yes 'endless output' ", timeout=60, full_output=True)
    assert full.exit_code == 141 and full.truncated and "bytes of output cut here" in full.stdout
    assert 64 * MIB < len(full.stdout) < 65 * MIB
    assert host_free - shutil.disk_usage(provider.state_dir).free < 512 * MIB, "the spool files are bounded"
    text = prompts.run_result(result.exit_code, result.output, True, False, 60, False, False, True)
    assert "output was closed" in text
    assert sbx.exec("echo fine").stdout == "fine\n"


def test_a_command_that_fills_the_disk_keeps_its_output_and_a_later_one_runs_whole(sbx):
    """Command output used to be spooled on the sandbox's own disk: the command that filled it lost its last lines
    and its exit code (SIGPIPE: 141), and so did every later command that printed more than a few lines."""
    fill = "cat /dev/zero > /tmp/fill; seq 1 300000; echo filled; exit 3"
    filled = sbx.exec(fill, timeout=120)
    assert filled.exit_code == 3 and filled.stdout.endswith("300000\nfilled\n")
    assert filled.disk_full and "No space left on device" in filled.stderr
    later = sbx.exec("seq 1 300000; echo later", timeout=60)
    assert later.exit_code == 0 and later.stdout.endswith("300000\nlater\n") and later.disk_full
    # A write that needs room fails and leaves the file as it was (it used to be emptied: truncated first).
    before = sbx.files.read_text("calc.py")
    with pytest.raises(OSError) as failed:
        sbx.files.write("calc.py", before + "#" * (1024 * 1024))
    assert failed.value.errno == errno.ENOSPC
    assert sbx.files.read_text("calc.py") == before
    with pytest.raises(OSError) as inside:  # written by a command inside: a path outside /workspace and /tmp
        sbx.files.write("/opt/venv/big", "x" * MIB)
    assert inside.value.errno == errno.ENOSPC
    sbx.files.write("calc.py", before.replace("a - b", "a + b"))  # in place: no new blocks needed
    assert "a + b" in sbx.files.read_text("calc.py")


# -- the setup network -------------------------------------------------------------------------------------------


class _Greeter(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"hello from the host\n")


@pytest.fixture
def host_server() -> Iterator[int]:
    """A listener on all the host's addresses (its loopback included)."""
    server = socketserver.ThreadingTCPServer(("0.0.0.0", 0), _Greeter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _host_addresses() -> list[str]:
    return [str(net.network_address) for net in network_mod.host_networks() if net.prefixlen == 32]


def _probe(targets: list[str], port: int) -> str:
    return (
        "for h in " + " ".join(targets) + "; do "
        f'if timeout 5 bash -c "exec 3<>/dev/tcp/$h/{port} && cat <&3"; then echo REACHED $h; '
        "else echo blocked $h; fi; done"
    )


def test_the_setup_step_reaches_the_package_registry_but_not_the_host(sbx, host_server):
    plan = network_mod.NetworkPlan.for_host()
    gateway = str(plan.subnet.network_address + 2)  # slirp4netns's gateway: the host, unless told otherwise
    local = ["127.0.0.1", *_host_addresses()]
    setup = sbx.exec(_probe([*local, gateway], host_server), network=True, timeout=60)
    assert "hello from the host" not in setup.stdout
    assert "REACHED" not in setup.stdout
    assert setup.stdout.count("blocked") == len(local) + 1
    # On the host itself the listener answers on each of its own addresses: the probe can tell. (Only the
    # host's own addresses: the gateway address means another machine out here.)
    here = subprocess.run(
        ["bash", "-c", _probe(local, host_server)], capture_output=True, text=True, timeout=60
    )
    assert here.stdout.count("REACHED") == len(local), here.stdout

    routes = sbx.exec("ip route", network=True).stdout
    for blocked in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", *_host_addresses()):
        assert f"prohibit {blocked}" in routes

    installed = sbx.exec(
        "pip install --no-cache-dir --no-deps --index-url https://pypi.org/simple six==1.16.0 "
        "&& python -c 'import six; print(six.__version__)'",
        network=True,
        timeout=300,
    )
    assert installed.ok, installed.output
    assert "1.16.0" in installed.stdout
    # The agent's commands stay offline.
    offline = sbx.exec("getent hosts pypi.org || echo no-dns; tail -n +3 /proc/net/dev | cut -d: -f1")
    assert "no-dns" in offline.stdout and offline.stdout.split()[-1] == "lo"


def test_without_slirp4netns_only_a_setup_command_fails_and_it_names_the_fix(sbx, monkeypatch):
    """Stand-in: slirp4netns is made to look uninstalled. Never a fallback to the host's network."""
    real_which = shutil.which
    monkeypatch.setattr(
        network_mod.shutil,
        "which",
        lambda name, **k: None if name == "slirp4netns" else real_which(name, **k),
    )
    network_mod._plan_for.cache_clear()
    try:
        assert sbx.exec("echo offline").ok
        with pytest.raises(ConfigError, match="apt-get install slirp4netns"):
            sbx.exec("true", network=True)
    finally:
        network_mod._plan_for.cache_clear()


def test_an_allowed_private_range_gets_a_route_instead_of_a_block():
    host = [
        network_mod.ipaddress.IPv4Network("192.168.7.2/32"),
        network_mod.ipaddress.IPv4Network("192.168.7.0/24"),
    ]
    blocked = network_mod.blocked_routes(host, allow=["192.168.7.0/24"])
    assert network_mod.ipaddress.IPv4Network("192.168.7.0/24") not in blocked
    assert (
        network_mod.ipaddress.IPv4Network("192.168.0.0/16") in blocked
    )  # the rest of the range stays blocked
    assert network_mod.choose_subnet([network_mod.ipaddress.IPv4Network("10.0.2.0/24")]) != (
        network_mod.ipaddress.IPv4Network("10.0.2.0/24")
    )


def test_a_setup_network_leaves_shared_mounts_of_every_sandbox_mounted(provider, buggy_repo):
    """Where mounts are shared (systemd's default for /), so are a sandbox's disk and overlays. slirp4netns, which
    gives a setup command its network, makes its own mount namespace with only / private, then detaches the host's
    tree: run from this namespace, that detach would reach their peers here and unmount them (a sweep's task then
    fails with "its workspace is gone", or finds no Python). The setup network must leave them mounted."""
    with provider.create(RepoSource(str(buggy_repo))) as sbx:
        subprocess.run(["mount", "--make-rshared", str(sbx._res.root)], check=True)
        mounts = [sbx._res.repo_dir, sbx._res.env.target]
        assert all(os.path.ismount(m) for m in mounts)
        with provider.create(RepoSource(str(buggy_repo))) as other:
            assert other.exec("true", network=True).ok
        assert sbx.exec("true", network=True).ok  # its own setup command too
        assert [m for m in mounts if not os.path.ismount(m)] == []
        assert sbx.exec("ls calc.py && python3 -c 'print(1)'").stdout == "calc.py\n1\n"
    assert sandbox_leftovers(provider.state_dir, []) == []


# -- the seccomp filter and the host's paths ----------------------------------------------------------------------

# x86-64 numbers; each call succeeds for an unprivileged process without the filter (checked on the host below).
_PROBE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    rc = libc.syscall(ctypes.c_long(nr), *map(ctypes.c_long, args))
    return "ok" if rc >= 0 else os.strerror(ctypes.get_errno())
print("keyctl", call(250, 0, -3, 0))          # KEYCTL_GET_KEYRING_ID of the session keyring
pid = os.fork()
if pid == 0:
    print("ptrace", call(101, 0, 0, 0, 0), flush=True)  # PTRACE_TRACEME
    os._exit(0)
os.waitpid(pid, 0)
print("unshare", call(272, 0x400))            # unshare(CLONE_FILES): no namespace, no privilege needed
print("clone3", call(435, 0, 0))
print("getpid", call(39))
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the probe uses x86-64 system call numbers")
def test_the_seccomp_filter_blocks_what_a_test_suite_never_needs(sbx):
    host = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    assert "keyctl ok" in host.stdout and "ptrace ok" in host.stdout and "unshare ok" in host.stdout

    inside = sbx.exec(f"python3 -c '{_PROBE}'")
    assert inside.ok, inside.output
    for name in ("keyctl", "ptrace", "unshare"):
        assert f"{name} Operation not permitted" in inside.stdout
    assert "clone3 Function not implemented" in inside.stdout  # so the C library falls back to clone
    assert "getpid ok" in inside.stdout
    assert "Seccomp:\t2" in sbx.exec("cat /proc/self/status").stdout
    assert "Seccomp:\t2" in sbx.exec("cat /proc/self/status", network=True).stdout
    # What test suites do still works: threads, subprocesses, git, mount listings.
    normal = sbx.exec(
        'python3 -c \'import threading, subprocess; t = threading.Thread(target=print, args=("thread",)); '
        't.start(); t.join(); print(subprocess.run(["git", "status", "--short"]).returncode)\' && mount | head -1'
    )
    assert normal.ok, normal.output
    assert "thread\n0" in normal.stdout


def test_the_filter_is_compiled_once_and_denies_each_listed_call():
    program = seccomp_mod.filter_program()
    assert program == seccomp_mod.filter_program()
    assert len(program) % 8 == 0 and len(program) > 8 * len(seccomp_mod.DENIED_SYSCALLS) // 2


def test_nothing_of_the_hosts_paths_is_readable_inside(sbx, provider, buggy_repo, tmp_path):
    seen = sbx.exec(
        "tr '\\0' ' ' < /proc/1/cmdline; echo; cat /proc/self/mountinfo /proc/1/environ /proc/self/cgroup; "
        "ls -l /proc/1/cwd /proc/1/root"
    ).stdout
    assert "bwrap --args" in seen
    for host_path in (str(provider.state_dir), str(buggy_repo), str(tmp_path), "bugsweep-sandboxes"):
        assert host_path not in seen
    setup_seen = sbx.exec("cat /proc/self/mountinfo; tr '\\0' ' ' < /proc/1/cmdline", network=True).stdout
    assert str(tmp_path) not in setup_seen
    # A command's own descriptors: its output and input used to be files of the host's spool folder, and
    # `ls -l /proc/self/fd` named them (/tmp/.../state/local-ID/spool/#12 (deleted)). Its stdin is a pipe too, so
    # that once read it is gone: the sandbox's init holds it as well (/proc/1/fd/0), and a file could be read again.
    fds = sbx.exec(
        "ls -l /proc/self/fd/ /proc/$$/fd/ >&2; cat > /dev/null; head -c 10 /proc/1/fd/0 >&2", stdin="input"
    )
    assert fds.ok and "pipe:[" in fds.stderr and "memfd" not in fds.stderr and "input" not in fds.stderr
    for host_path in (str(provider.state_dir), str(tmp_path), "spool", "bugsweep-sandboxes"):
        assert host_path not in fds.stderr


# -- a whole run ----------------------------------------------------------------------------------------------


def test_a_run_that_fills_its_disk_is_still_graded_with_its_resource_use(
    buggy_repo, tmp_path, scripted_model
):
    """The model fills the disk, is told so, cleans up, fixes the bug: the run resolves, and grade.json says how
    much memory, CPU and disk it took."""
    server = scripted_model(
        [
            tool_call("run", command="dd if=/dev/zero of=/tmp/fill bs=1M count=500"),
            tool_call("run", command="rm /tmp/fill"),
            tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b"),
            tool_call("finish", summary="fixed add()"),
        ]
    )
    out, state = tmp_path / "out", tmp_path / "state"
    env = {
        **os.environ,
        "LLM_BASE_URL": server.base_url,
        "LLM_MODEL": "scripted",
        "LLM_API_KEY": "sk-test",
        "BUGSWEEP_SANDBOX_DISK_MIB": str(QUOTA_MIB),
        "BUGSWEEP_SANDBOX_STATE_DIR": str(state),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "bugsweep", "solve", "--repo", str(buggy_repo), "--task", "add() is wrong",
         "--test-command", "python -m pytest -q", "--setup-command", PYTEST_SETUP, "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    grade = json.loads((out / "grade.json").read_text())
    assert grade["resolved"]
    assert grade["disk_quota_mib"] == QUOTA_MIB
    assert QUOTA_MIB * 0.8 < grade["peak_disk_mib"] <= QUOTA_MIB
    assert grade["peak_memory_mib"] > 1 and grade["cpu_s"] > 0
    told = json.dumps(json.loads((out / "trajectory.json").read_text()))
    assert "disk is full" in told
    assert sandbox_leftovers(state, []) == []
    assert str(state) not in Path("/proc/mounts").read_text(), (
        "the process's /etc tmpfs went with the process"
    )
    assert sorted(p.name for p in state.iterdir()) == [], "its /etc copy and template images too"


def test_a_run_on_a_full_disk_answers_every_tool_and_ends_graded(buggy_repo, tmp_path, scripted_model):
    """The model fills the disk and leaves it full: each tool still answers it (with the disk-full text), nothing
    raises out of the loop, and the run ends graded. The model is the scripted server (a stand-in, not a model)."""
    grown = "return a + b\n" + "    # a long comment\n" * 60_000  # needs new blocks: about 1 MiB
    server = scripted_model(
        [
            tool_call("run", command="cat /dev/zero > /tmp/fill; seq 1 200000; echo filled-the-disk; exit 3"),
            tool_call("run", command="seq 1 200000; echo still-here"),
            tool_call("read_file", path="calc.py"),
            tool_call("edit_file", path="calc.py", old="return a - b", new=grown),
            tool_call("edit_file", path="notes.txt", old="", new="x" * (1024 * 1024)),
            # The same edit's `old` still matches: the failed edit left calc.py as it was. This one fits in place.
            tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b"),
            tool_call("finish", summary="fixed add() with the disk still full"),
        ]
    )
    out, state = tmp_path / "out", tmp_path / "state"
    env = {
        **os.environ,
        "LLM_BASE_URL": server.base_url,
        "LLM_MODEL": "scripted",
        "LLM_API_KEY": "sk-test",
        "BUGSWEEP_SANDBOX_DISK_MIB": str(QUOTA_MIB),
        "BUGSWEEP_SANDBOX_STATE_DIR": str(state),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "bugsweep", "solve", "--repo", str(buggy_repo), "--task", "add() is wrong",
         "--test-command", "python -m pytest -q", "--setup-command", PYTEST_SETUP, "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answers = [m["content"] for m in messages(load(out / "trajectory.json")) if m["role"] == "tool"]
    filled, later, read, edited, created, fixed, _ = answers
    assert filled.startswith("Exit code: 3\n") and "200000\nfilled-the-disk\n" in filled
    assert "disk is full" in filled
    assert later.startswith("Exit code: 0\n") and later.rstrip().endswith("still-here")
    assert "return a - b" in read and "disk is full" in read
    for refused in (edited, created):
        assert refused.startswith("Error:") and "disk is full" in refused and "Delete files" in refused
    assert "notes.txt" not in (out / "patch.diff").read_text(), "no empty file is left by a refused create"
    assert "disk is full" in fixed and "Error" not in fixed
    grade = json.loads((out / "grade.json").read_text())
    assert grade["resolved"] and grade.get("error") is None and grade.get("failure_kind") is None
    assert grade["peak_disk_mib"] > QUOTA_MIB * 0.8
    assert sandbox_leftovers(state, []) == []


def test_libseccomp_missing_is_a_config_error_naming_the_fix(monkeypatch):
    monkeypatch.setattr(seccomp_mod, "_program", None)
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import fails as if not installed
    with pytest.raises(Exception, match="libseccomp"):
        seccomp_mod.filter_program()
