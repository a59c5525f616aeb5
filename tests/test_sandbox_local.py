"""The local sandbox, for real: real bubblewrap, real overlayfs mounts, real cgroups, real git, a real TCP server on
the host. Stand-ins are named where used (a fake `bwrap` that fails like one without namespaces; a forced overlay
failure). Needs Linux, root and Debian `bubblewrap`.
"""

from __future__ import annotations

import contextlib
import os
import socketserver
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from bugsweep.errors import ConfigError, SandboxGone
from bugsweep.sandbox import RepoSource, Sandbox, get_provider
from bugsweep.sandbox.base import OUTPUT_LIMIT_BYTES
from bugsweep.sandbox.local import LocalProvider, LocalSandbox
from bugsweep.sandbox.local import files as files_mod
from bugsweep.sandbox.local import stale as stale_mod
from bugsweep.sandbox.local import workspace as workspace_mod
from bugsweep.settings import SandboxSettings
from tests.support.leftovers import as_user, other_user, processes_in_cgroups
from tests.support.repos import commit_all, git, make_repo, make_wheel, write_files

PROJECT_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture
def provider(tmp_path: Path) -> LocalProvider:
    settings = SandboxSettings(memory_mib=256, max_processes=64)
    return LocalProvider(settings, cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")


#: What the tests in these sandboxes need: pytest, from the task's own environment (the first run builds the layer,
#: every later one reuses it).
PYTEST_SETUP = "pip install pytest"


@pytest.fixture
def sbx(provider: LocalProvider, buggy_repo: Path) -> Iterator[LocalSandbox]:
    with provider.create(RepoSource(str(buggy_repo))) as sandbox:
        result, _ = sandbox.setup_environment(PYTEST_SETUP)
        assert result is None or result.ok, result.output
        yield sandbox


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = (
                Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except OSError:
            continue
        if marker in cmdline and int(entry) != os.getpid():
            found.append(int(entry))
    return found


def processes_in_cgroup_of(sandbox) -> list[int]:
    return processes_in_cgroups(sandbox.id)


def host_process_count() -> int:
    return sum(1 for entry in os.listdir("/proc") if entry.isdigit())


def mounts() -> str:
    return Path("/proc/mounts").read_text()


# ---------------------------------------------------------------------------------------------------------------


def test_get_provider_returns_a_local_provider_whose_sandboxes_satisfy_the_protocol(tmp_path, buggy_repo):
    provider = get_provider(
        "local", SandboxSettings(cache_dir=str(tmp_path / "cache"), state_dir=str(tmp_path / "s"))
    )
    assert provider.name == "local"
    with provider.create(RepoSource(str(buggy_repo)), labels={"task": "t1"}) as sandbox:
        assert isinstance(sandbox, Sandbox)
        assert sandbox.workdir == "/workspace/repo"
        assert sandbox.id


def test_a_command_runs_in_the_repo(sbx):
    result = sbx.exec("pwd; cat calc.py; git log --oneline")
    assert result.ok, result.output
    assert result.stdout.startswith("/workspace/repo\n")
    assert "return a - b" in result.stdout
    assert "initial" in result.stdout


def test_changes_persist_inside_but_the_host_checkout_is_untouched(sbx, buggy_repo):
    assert sbx.exec("sed -i 's/a - b/a + b/' calc.py && echo scratch > /tmp/note").ok
    later = sbx.exec("cat calc.py; cat /tmp/note; git status --porcelain; git diff --stat")
    assert "return a + b" in later.stdout
    assert "scratch" in later.stdout
    assert " M calc.py" in later.stdout
    assert sbx.exec("python -m pytest -q").ok  # the task environment's pytest, on the fixed code

    assert "return a - b" in (buggy_repo / "calc.py").read_text()
    assert git(buggy_repo, "status", "--porcelain") == ""


def test_stdin_env_and_cwd_are_honoured(sbx):
    result = sbx.exec('cat; echo "[$FOO]"; pwd', stdin="from stdin\n", env={"FOO": "bar"}, cwd="/tmp")
    assert result.stdout == "from stdin\n[bar]\n/tmp\n"
    assert sbx.exec("exit 3").exit_code == 3


def test_a_command_longer_than_the_kernel_allows_for_one_argument_still_runs(sbx):
    body = "x" * 300_000
    result = sbx.exec(f"cat > big.txt <<'EOF'\n{body}\nEOF\nwc -c < big.txt; echo $PWD")
    assert result.stdout.split() == ["300001", "/workspace/repo"]
    assert sbx.exec("ls -A /tmp").stdout == ""  # the script file is gone


def test_files_read_write_exists(sbx):
    sbx.files.write("/workspace/repo/pkg/sub/new.py", "x = 1\n")
    assert sbx.files.exists("/workspace/repo/pkg/sub/new.py")
    assert sbx.files.read_text("/workspace/repo/pkg/sub/new.py") == "x = 1\n"
    assert sbx.exec("cat pkg/sub/new.py").stdout == "x = 1\n"
    assert sbx.files.read_text("calc.py").startswith("def add")  # relative: to the workdir
    sbx.files.write("/tmp/bytes.bin", b"\x00\x01")
    assert sbx.exec("od -An -tx1 /tmp/bytes.bin").stdout.split() == ["00", "01"]
    assert not sbx.files.exists("/workspace/repo/nope.py")
    with pytest.raises(FileNotFoundError):
        sbx.files.read_text("/workspace/repo/nope.py")
    with pytest.raises(IsADirectoryError):
        sbx.files.read_text("/workspace/repo/tests")
    # outside the writable areas: done inside the sandbox, so it sees what a command sees
    assert sbx.files.exists("/usr/bin/git")
    with pytest.raises(PermissionError):
        sbx.files.write("/usr/evil.txt", "no")
    assert not Path("/usr/evil.txt").exists()


def test_files_refuse_fifos_and_huge_files_instead_of_hanging_or_filling_memory(sbx, monkeypatch):
    assert sbx.exec("mkfifo /workspace/repo/pipe /tmp/pipe && ln -s /tmp/pipe /workspace/repo/tmp_pipe").ok
    for path in ("/workspace/repo/pipe", "/workspace/repo/tmp_pipe", "/tmp/pipe"):
        with pytest.raises(OSError, match="not a regular file"):
            sbx.files.read_text(path)
        with pytest.raises(OSError, match="not a regular file"):
            sbx.files.write(path, "x")
    monkeypatch.setattr(files_mod, "MAX_READ_BYTES", 1000)
    assert sbx.exec("head -c 5000 /dev/zero > big.bin && ln -s /usr/../workspace/repo/big.bin big_link").ok
    for path in ("/workspace/repo/big.bin", "/workspace/repo/big_link"):
        with pytest.raises(OSError, match="at most 1000 bytes"):
            sbx.files.read_text(path)


def test_host_folders_and_home_are_not_visible(sbx, tmp_path):
    marker = tmp_path / "host-secret.txt"
    marker.write_text("host only")
    hidden = [str(PROJECT_DIR), str(marker), str(Path.home()), "/home", "/work"]
    with contextlib.suppress(OSError):
        hidden += [f"/root/{name}" for name in os.listdir("/root") if name != ".pyenv"]
    for path in hidden:
        result = sbx.exec(f"ls -A {path} 2>&1; cat {path} 2>&1")
        assert "host only" not in result.stdout
        if path not in ("/root", Path.home()) and not sys.prefix.startswith(path):
            assert "No such file or directory" in result.stdout, (path, result.stdout)
    assert sbx.exec("ls -A /root").stdout.split() in ([], [".pyenv"])
    python_tops = {
        dest.split("/")[1] for dest in sbx.interpreter.binds()[2::3]
    }  # the interpreter's own install
    own = {"dev", "etc", "opt", "proc", "tmp", "usr", "var", "workspace"}
    links = {d for d in ("bin", "lib", "lib32", "lib64", "libx32", "sbin") if os.path.lexists(f"/{d}")}
    assert set(sbx.exec("ls /").stdout.split()) == own | links | python_tops
    assert sbx.exec("cat /etc/shadow").exit_code != 0


def test_the_model_key_in_the_host_environment_is_not_in_the_sandbox(sbx, monkeypatch):
    monkeypatch.setenv("LLM_API_KEY", "sk-test-very-secret-4242")
    result = sbx.exec(
        "env; cat /proc/1/environ; cat /proc/self/environ; cat /proc/[0-9]*/environ", full_output=True
    )
    assert "sk-test-very-secret-4242" not in result.output
    assert "LLM_API_KEY" not in result.output
    assert "HOME=/workspace" in result.stdout


class _Greeter(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"hello from the host\n")


@pytest.fixture
def host_server() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Greeter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_no_network_unless_the_setup_step_asks(sbx, host_server):
    connect = (
        "python -c \"import socket; s = socket.create_connection(('127.0.0.1', PORT), timeout=5); "
        'print(s.recv(100).decode())"'
    ).replace("PORT", str(host_server))
    offline = sbx.exec(connect)
    assert offline.exit_code != 0
    assert "hello from the host" not in offline.output
    assert "Connection refused" in offline.stderr
    interfaces = sbx.exec("tail -n +3 /proc/net/dev | cut -d: -f1").stdout.split()
    assert interfaces == ["lo"]
    # The setup step's network reaches the internet but not the host: tests/test_sandbox_limits.py


def test_setup_network_setting_off_keeps_the_network_closed(tmp_path, buggy_repo, host_server):
    provider = LocalProvider(
        SandboxSettings(setup_network=False), cache_dir=tmp_path / "c", state_dir=tmp_path / "s"
    )
    with provider.create(RepoSource(str(buggy_repo))) as sandbox:
        result = sandbox.exec(
            f"exec 3<>/dev/tcp/127.0.0.1/{host_server} && cat <&3", network=True, timeout=10
        )
        assert result.exit_code != 0
        assert "hello from the host" not in result.stdout


def test_files_cannot_escape_through_dotdot_or_symlinks(sbx, tmp_path):
    host_dir = tmp_path / "hostdir"
    host_dir.mkdir()
    (host_dir / "secret.txt").write_text("host only")
    assert sbx.exec(
        f"ln -s /etc/shadow shadow && ln -s {PROJECT_DIR} project && ln -s {host_dir} hostdir "
        "&& ln -s ../../.. up && ln -s /workspace/repo/calc.py inside"
    ).ok
    for path in (
        "/workspace/repo/shadow",
        "/workspace/repo/project/ARCHITECTURE.md",
        "/workspace/repo/hostdir/secret.txt",
        f"/workspace/repo/up{host_dir}/secret.txt",
        f"/workspace/repo/../../..{host_dir}/secret.txt",
        "/workspace/repo/../../etc/shadow",
    ):
        with pytest.raises(FileNotFoundError):
            sbx.files.read_text(path)
        assert not sbx.files.exists(path)
    assert sbx.files.read_text("/workspace/repo/inside").startswith("def add")  # a link within the sandbox

    for path in (
        "/workspace/repo/hostdir/pwned.txt",
        f"/workspace/repo/../../..{host_dir}/pwned.txt",
        f"/workspace/repo/up{host_dir}/pwned.txt",
    ):
        with contextlib.suppress(
            OSError
        ):  # failing is fine (a dangling link inside); reaching the host is not
            sbx.files.write(path, "x")
    assert sorted(os.listdir(host_dir)) == ["secret.txt"]
    assert (host_dir / "secret.txt").read_text() == "host only"


def test_a_fork_bomb_is_contained(sbx):
    # without a cgroup the process limit is an rlimit, which does not bind root: do not bomb the host then
    assert sbx._res.limits.procs_files, "no cgroup could be made: the process limit is not enforced here"
    before = host_process_count()
    result = sbx.exec("bomb() { bomb | bomb & }; bomb; sleep 4", timeout=8)
    assert "Resource temporarily unavailable" in result.stderr  # fork() failed at the process limit
    events = [d / "pids.events" for d in sbx._res.limits.dirs if (d / "pids.events").exists()]
    assert events and int(events[0].read_text().split()[1]) > 0  # the kernel counted refused forks
    assert processes_in_cgroup_of(sbx) == []
    assert host_process_count() < before + 200  # unchecked, a bomb makes thousands
    assert sbx.exec("echo still usable").stdout == "still usable\n"


def test_a_command_that_never_ends_times_out_and_leaves_no_process(sbx):
    result = sbx.exec("sleep 1000.123 & sleep 1000.124", timeout=2)
    assert result.timed_out
    assert result.exit_code is None
    assert not result.ok
    assert processes_with("1000.12") == []
    assert processes_in_cgroup_of(sbx) == []


def test_background_processes_end_with_their_command(sbx):
    result = sbx.exec("sleep 1000.126 >/dev/null 2>&1 & echo started")
    assert result.stdout == "started\n"
    assert processes_with("1000.126") == []


def test_huge_output_keeps_the_tail_without_holding_it_in_memory(sbx):
    tracemalloc.start()
    try:
        result = sbx.exec("head -c 50000000 /dev/zero | tr '\\0' x; echo; echo END; echo err >&2")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.ok
    assert result.truncated
    assert len(result.stdout.encode()) <= OUTPUT_LIMIT_BYTES
    assert result.stdout.endswith("x\nEND\n")
    assert result.stderr == "err\n"
    assert peak < 4 * 1024 * 1024

    full = sbx.exec("head -c 2000000 /dev/zero | tr '\\0' y", full_output=True)
    assert not full.truncated
    assert full.stdout == "y" * 2_000_000


def test_the_memory_limit_kills_a_big_allocation(sbx):
    result = sbx.exec("python -c \"x = b'a' * (512 * 1024 * 1024); print('allocated')\"", timeout=60)
    assert result.exit_code == 137
    assert result.out_of_memory
    assert "allocated" not in result.stdout
    assert sbx.exec("echo fine").ok


def test_release_kills_running_commands_unmounts_and_removes_everything(sbx, provider):
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(sbx.exec("sleep 1000.125", timeout=600))
        except SandboxGone as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 20
    while not processes_with("1000.125") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with("1000.125")
    root = provider.state_dir / sbx.id
    assert str(root) in mounts()

    sbx.release()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert isinstance(outcome[0], SandboxGone)
    assert processes_with("1000.125") == []
    assert processes_in_cgroup_of(sbx) == []
    assert str(root) not in mounts()
    assert not root.exists()
    assert not any(sbx.id in line for line in Path("/proc/self/cgroup").read_text().splitlines())
    assert not list(Path("/sys/fs/cgroup").glob(f"*/**/bugsweep-{sbx.id}"))

    sbx.release()  # idempotent
    with pytest.raises(SandboxGone):
        sbx.exec("true")
    with pytest.raises(SandboxGone):
        sbx.files.read_text("/workspace/repo/calc.py")


def test_a_vanished_workspace_is_sandbox_gone(sbx, provider):
    workspace_mod.umount(provider.state_dir / sbx.id / "ws" / "repo")
    with pytest.raises(SandboxGone):
        sbx.exec("true")


def test_sandboxes_of_a_dead_process_are_cleaned_up(provider, buggy_repo, monkeypatch):
    sandbox = provider.create(RepoSource(str(buggy_repo)))
    root = provider.state_dir / sandbox.id
    meta = root / "meta.json"
    listed = {entry["id"]: entry for entry in provider.sandboxes()}
    assert listed[sandbox.id]["owner_alive"] is True
    meta.write_text(meta.read_text().replace(f'"owner_pid": {os.getpid()}', '"owner_pid": 999999999'))
    assert {entry["id"]: entry for entry in provider.sandboxes()}[sandbox.id]["owner_alive"] is False
    monkeypatch.setattr(stale_mod, "_reaped", set())
    provider.create(RepoSource(str(buggy_repo))).release()  # the next create sweeps
    assert not root.exists()
    assert str(root) not in mounts()
    sandbox.release()  # never raises, even though its resources are already gone


def test_missing_bubblewrap_is_a_config_error_naming_the_fix(provider, buggy_repo, monkeypatch, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(ConfigError, match="apt-get install bubblewrap"):
        provider.create(RepoSource(str(buggy_repo)))


def test_bubblewrap_without_namespaces_is_a_config_error(provider, buggy_repo, monkeypatch, tmp_path):
    """Stand-in: a `bwrap` script that fails the way bubblewrap does where user namespaces are forbidden."""
    fake_bin = tmp_path / "fake-bin"
    fake_bin.mkdir()
    fake = fake_bin / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    with pytest.raises(ConfigError, match="namespace"):
        provider.create(RepoSource(str(buggy_repo)))
    assert not provider.state_dir.exists() or not any(provider.state_dir.iterdir())


def test_a_git_url_source_is_cloned_once_and_reused(provider, tmp_path):
    origin = make_repo(tmp_path / "origin")
    url = f"file://{origin}"
    with provider.create(RepoSource(url)) as first:
        assert "return a - b" in first.exec("cat calc.py").stdout
        assert first.exec("git remote get-url origin").stdout.strip() == url
        assert first.exec("git status --porcelain").stdout == ""
    with provider.create(RepoSource(url)) as second:
        assert second.exec("git log --oneline | wc -l").stdout.strip() == "1"
    assert len(list((provider.sources.root / "mirrors").iterdir())) == 1
    assert len(list((provider.sources.root / "checkouts").iterdir())) == 1


def test_a_ref_source_checks_out_that_commit_without_touching_the_checkout(provider, buggy_repo):
    first = git(buggy_repo, "rev-parse", "HEAD")
    write_files(buggy_repo, {"calc.py": "def add(a, b):\n    return a + b\n"})
    commit_all(buggy_repo, "fix")
    (buggy_repo / "calc.py").write_text("uncommitted\n")

    with provider.create(RepoSource(str(buggy_repo), ref=first)) as sandbox:
        assert sandbox.exec("git rev-parse HEAD").stdout.strip() == first
        assert "return a - b" in sandbox.files.read_text("/workspace/repo/calc.py")
        assert sandbox.exec("git status --porcelain").stdout == ""
    with provider.create(RepoSource(str(buggy_repo), ref="main")) as sandbox:
        assert "return a + b" in sandbox.files.read_text("/workspace/repo/calc.py")
    with provider.create(RepoSource(str(buggy_repo))) as sandbox:  # no ref: the working tree as it is
        assert sandbox.files.read_text("/workspace/repo/calc.py") == "uncommitted\n"
    assert (buggy_repo / "calc.py").read_text() == "uncommitted\n"
    assert git(buggy_repo, "log", "--oneline").count("\n") == 1
    with pytest.raises(ConfigError, match="not found"):
        provider.create(RepoSource(str(buggy_repo), ref="no-such-branch"))


def test_a_plain_folder_becomes_a_git_repo_inside_only(provider, tmp_path):
    folder = tmp_path / "plain"
    write_files(folder, {"app.py": "print('hi')\n"})
    with provider.create(RepoSource(str(folder))) as sandbox:
        assert sandbox.exec("git status --porcelain").stdout == ""
        assert (
            sandbox.exec("echo \"print('bye')\" > app.py && git diff --stat")
            .stdout.strip()
            .startswith("app.py")
        )
    assert not (folder / ".git").exists()
    assert (folder / "app.py").read_text() == "print('hi')\n"


def test_pip_install_goes_to_the_task_environment_not_the_host_python(sbx, tmp_path):
    """`pip install` installs into the task environment (/opt/venv, first on PATH); the package is importable by
    later commands. Offline (a local wheel), as the grader runs."""
    wheel = make_wheel(tmp_path, "sbxpkg", "WHERE = 'sandbox'\n")
    sbx.files.write(f"/tmp/{wheel.name}", wheel.read_bytes())
    install = sbx.exec(f"pip install --no-index /tmp/{wheel.name} 2>&1", timeout=240)
    assert install.ok, install.output
    imported = sbx.exec("cd /tmp && python -c 'import sbxpkg; print(sbxpkg.__file__, sbxpkg.WHERE)'")
    assert imported.stdout.startswith("/opt/venv/lib/python"), imported.output
    assert imported.stdout.strip().endswith("sbxpkg.py sandbox")
    assert not list(Path(sys.prefix).glob("lib/python*/site-packages/sbxpkg*"))
    assert sbx.exec("git status --porcelain").stdout == ""  # nothing of it lands in the repository


def test_a_host_venv_running_bugsweep_is_not_seen_by_the_task_environment(tmp_path, buggy_repo):
    """bugsweep run from a real venv (in a child process): the task environment is made from that venv's base
    interpreter, pip installs into it, and the host venv's own packages are not importable inside."""
    venv = tmp_path / "hostvenv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True
    )
    (next(venv.glob("lib/python*/site-packages")) / "hostonly.py").write_text("WHERE = 'host venv'\n")
    wheel = make_wheel(tmp_path, "sbxpkg", "WHERE = 'sandbox'\n")
    script = f"""
from pathlib import Path
from bugsweep.sandbox.base import RepoSource
from bugsweep.sandbox.local import LocalProvider
p = LocalProvider(cache_dir=Path({str(tmp_path / "cache")!r}), state_dir=Path({str(tmp_path / "state")!r}))
with p.create(RepoSource({str(buggy_repo)!r})) as s:
    s.files.write("/tmp/{wheel.name}", Path({str(wheel)!r}).read_bytes())
    print(s.exec("pip install --no-index /tmp/{wheel.name} >/dev/null 2>&1 && cd /tmp && "
                 "python -c 'import sbxpkg; print(sbxpkg.__file__)'; python -c 'import hostonly' 2>&1 | tail -1").output)
"""
    env = dict(os.environ, PYTHONPATH=str(PROJECT_DIR))
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "/opt/venv/lib/python{}.{}/site-packages/sbxpkg.py".format(*sys.version_info[:2]),
        "ModuleNotFoundError:", "No", "module", "named", "'hostonly'",
    ]  # fmt: skip
    assert not list(venv.glob("lib/python*/site-packages/sbxpkg*"))


def test_overlay_failure_falls_back_to_a_copy(provider, buggy_repo, monkeypatch, caplog):
    """Stand-in: the overlay mount is made to fail, as it would on a filesystem without overlayfs support."""
    monkeypatch.setattr(workspace_mod, "mount_overlay", lambda *a: False)
    with provider.create(RepoSource(str(buggy_repo))) as sandbox:
        assert sandbox.exec("sed -i 's/a - b/a + b/' calc.py && git diff --stat").ok
        assert "overlay" not in sandbox.exec("grep ' /workspace/repo ' /proc/self/mountinfo").stdout
    assert "return a - b" in (buggy_repo / "calc.py").read_text()


def test_bad_workdir_is_a_config_error(tmp_path, buggy_repo):
    provider = LocalProvider(
        SandboxSettings(workdir="/etc"), cache_dir=tmp_path / "c", state_dir=tmp_path / "s"
    )
    with pytest.raises(ConfigError, match="/workspace"):
        provider.create(RepoSource(str(buggy_repo)))


def test_commands_run_without_capabilities_or_nested_user_namespaces(sbx):
    status = sbx.exec("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status").stdout.split()
    assert status == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1"]
    nested = sbx.exec("unshare -U true")
    assert nested.exit_code != 0  # bubblewrap 0.8+ --disable-userns


def test_host_python_is_read_only_inside(sbx):
    result = sbx.exec(f"touch {sys.prefix}/evil 2>&1; touch /usr/evil 2>&1")
    assert result.stdout.count("Read-only file system") == 2
    assert not Path(sys.prefix, "evil").exists()


def test_a_process_that_exits_without_release_leaves_nothing_behind(tmp_path, buggy_repo):
    """A real child Python process creates a sandbox, starts a command in the background of another thread and
    exits without calling release(): the finaliser must kill, unmount and delete."""
    state = tmp_path / "state"
    script = f"""
import threading, time
from pathlib import Path
from bugsweep.sandbox.base import RepoSource
from bugsweep.sandbox.local import LocalProvider
p = LocalProvider(cache_dir=Path({str(tmp_path / "cache")!r}), state_dir=Path({str(state)!r}))
s = p.create(RepoSource({str(buggy_repo)!r}))
threading.Thread(target=lambda: s.exec("sleep 1000.127", timeout=600), daemon=True).start()
time.sleep(1)
print(s.id, flush=True)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    sandbox_id = out.stdout.strip()
    assert sandbox_id.startswith("local-")
    assert processes_with("1000.127") == []
    assert str(state) not in mounts()
    assert list(state.iterdir()) == []


def test_a_checkout_owned_by_another_user_is_writable_inside(provider, buggy_repo):
    """Root running on a user's checkout: the tree is copied (owned by us) so edits work, and stays untouched."""
    subprocess.run(["chown", "-R", "1001:1001", str(buggy_repo)], check=True)
    with provider.create(RepoSource(str(buggy_repo))) as sandbox:
        result = sandbox.exec("echo '# note' >> calc.py && echo x > tests/new.txt && git status --porcelain")
        assert result.ok, result.output
        assert " M calc.py" in result.stdout
    assert "# note" not in (buggy_repo / "calc.py").read_text()
    assert not (buggy_repo / "tests" / "new.txt").exists()
    assert (buggy_repo / "calc.py").stat().st_uid == 1001


def test_old_checkouts_are_evicted_but_never_while_a_sandbox_uses_one(provider, buggy_repo):
    shas = [git(buggy_repo, "rev-parse", "HEAD")]
    for n in (1, 2):
        write_files(buggy_repo, {"calc.py": f"def add(a, b):\n    return a + b + {n}\n"})
        shas.append(commit_all(buggy_repo, f"change {n}"))
    provider.sources.max_checkouts = 1
    checkouts = provider.sources.root / "checkouts"

    first = provider.create(RepoSource(str(buggy_repo), ref=shas[0]))
    with provider.create(RepoSource(str(buggy_repo), ref=shas[1])):
        assert {p.name for p in checkouts.iterdir()} == {shas[0], shas[1]}  # the first is in use
        assert "return a - b" in first.files.read_text("calc.py")
    first.release()
    with provider.create(RepoSource(str(buggy_repo), ref=shas[2])) as third:
        assert {p.name for p in checkouts.iterdir()} == {shas[2]}
        assert "+ 2" in third.files.read_text("calc.py")
    with provider.create(RepoSource(str(buggy_repo), ref=shas[0])) as again:  # rebuilt on demand
        assert "return a - b" in again.files.read_text("calc.py")


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(), reason="needs root and setpriv"
)
def test_a_killed_process_leftovers_are_removed_by_its_user_and_never_by_another(tmp_path, buggy_repo):
    """A process making a sandbox is SIGKILLed while a command runs in it: its mounts, cgroups and folder stay.
    Another user's `bugsweep sandboxes cleanup` (here with the powers to unmount and delete them, pointed at the
    folder, and by default) leaves them alone: they are recorded as this user's. This user's next bugsweep
    process removes them, and its command's processes are gone with the killed process."""
    state = tmp_path / "state"
    script = f"""
import threading, time
from pathlib import Path
from bugsweep.sandbox.base import RepoSource
from bugsweep.sandbox.local import LocalProvider
p = LocalProvider(cache_dir=Path({str(tmp_path / "cache")!r}), state_dir=Path({str(state)!r}))
s = p.create(RepoSource({str(buggy_repo)!r}))
threading.Thread(target=lambda: s.exec("sleep 1000.321", timeout=600), daemon=True).start()
time.sleep(1)
print(s.id, flush=True)
time.sleep(600)
"""
    killed = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    sandbox_id = (killed.stdout.readline() if killed.stdout else "").strip()
    assert sandbox_id.startswith("local-"), sandbox_id
    os.kill(killed.pid, 9)
    killed.wait(timeout=30)
    root = state / sandbox_id
    cgroups = json_of(root / "meta.json")["cgroups"]
    assert str(root) in mounts() and cgroups and all(Path(c).exists() for c in cgroups)
    deadline = time.monotonic() + 10
    while processes_with("1000.321") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with("1000.321") == [], "the command died with the process that ran it"

    uid, gid = other_user(tmp_path / "other-home")
    env = {
        **os.environ,
        "HOME": str(tmp_path / "other-home"),
        "PYTHONPATH": str(Path(__file__).parent.parent),
    }
    cleanup = [sys.executable, "-m", "bugsweep", "sandboxes", "cleanup"]
    for extra in ({"BUGSWEEP_SANDBOX_STATE_DIR": str(state)}, {}):
        other = subprocess.run(
            [*as_user(uid, gid), *cleanup], env={**env, **extra}, capture_output=True, text=True
        )
        assert other.returncode == 0, other.stderr
        assert "0 left-over local sandbox(es) removed" in other.stdout, other.stdout + other.stderr
        assert str(root) in mounts() and root.is_dir() and all(Path(c).exists() for c in cgroups)
    assert f"bugsweep-sandboxes-{uid}" in other.stdout, "by default, another user looks in its own folder"

    mine = subprocess.run(cleanup, env={**env, "HOME": os.environ.get("HOME", "/root"),
                                        "BUGSWEEP_SANDBOX_STATE_DIR": str(state)}, capture_output=True, text=True)  # fmt: skip
    assert mine.returncode == 0, mine.stderr
    assert f"removed {sandbox_id} (left by process {killed.pid}" in mine.stdout, mine.stdout
    assert str(root) not in mounts() and not root.exists() and not any(Path(c).exists() for c in cgroups)


def json_of(path: Path) -> dict:
    import json

    return dict(json.loads(path.read_text()))
