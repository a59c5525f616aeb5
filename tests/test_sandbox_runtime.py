"""The Runtime sandbox backend (bugsweep.sandbox.runtime) driven through the real `withruntime` SDK.

Real in every test: the SDK (its HTTP client, retries, idempotency keys, NDJSON streaming), HTTP on 127.0.0.1,
bash/git/pytest running under bubblewrap. Stand-in in every test: the Runtime API itself, which cannot be reached
from here, replaced by tests.support.fake_runtime_api.FakeRuntime (a local fake of its wire protocol). Where a
model is involved it is the scripted OpenAI-compatible server (a stand-in, not a model).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest
from typer.testing import CliRunner
from withruntime import Runtime

from bugsweep.errors import ConfigError, InfraError, SandboxError, SandboxGone
from bugsweep.sandbox.base import OUTPUT_LIMIT_BYTES, RepoSource, Sandbox
from bugsweep.sandbox.runtime import RuntimeProvider, RuntimeSettings
from bugsweep.settings import SandboxSettings
from tests.support.fake_runtime import fake_runtime  # noqa: F401 (a fixture)
from tests.support.fake_runtime_api import FakeRuntime
from tests.support.repos import commit_all, git, write_files

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the fake Runtime needs bubblewrap")


@pytest.fixture
def fake(fake_runtime: FakeRuntime) -> FakeRuntime:  # noqa: F811 (the imported fixture, requested by name)
    """The fake Runtime API, with RUNTIME_API_URL / RUNTIME_API_KEY pointing at it."""
    return fake_runtime


@pytest.fixture(scope="session")
def pytest_setup() -> str:
    """A setup command that installs pytest into the task environment offline, from wheels downloaded on this
    machine once: the fake Runtime's microVM sees the host read-only (a stand-in), and this machine's TLS roots are
    not the VM's, so the install does not reach PyPI from inside."""
    wheels = Path.home() / ".cache" / "bugsweep" / "test-wheels"
    if not list(wheels.glob("pytest-*.whl")):
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--dest", str(wheels), "pytest"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if got.returncode != 0:
            pytest.skip(
                f"could not download pytest's wheels for the fake Runtime's setup: {got.stderr[-300:]}"
            )
    return f"pip install -q --no-index --find-links {wheels} pytest"


def make_provider(fake: FakeRuntime, cache_dir: Path) -> RuntimeProvider:
    settings = RuntimeSettings(api_key=fake.api_key, api_url=fake.url)  # type: ignore[call-arg]
    return RuntimeProvider(SandboxSettings(memory_mib=2048), settings, cache_dir=cache_dir)


@pytest.fixture
def provider(fake: FakeRuntime, tmp_path: Path) -> Iterator[RuntimeProvider]:
    made = make_provider(fake, tmp_path / "cache")
    yield made
    made.close()


def test_create_exec_files_and_delete(
    fake: FakeRuntime, provider: RuntimeProvider, buggy_repo: Path, pytest_setup: str
) -> None:
    """Real SDK against the fake Runtime: the checkout (with .git, at the ref) is uploaded, labelled, sized from
    settings; commands run in /workspace/repo; files read and write; the sandbox is deleted at the end."""
    first = git(buggy_repo, "rev-parse", "HEAD")
    write_files(buggy_repo, {"calc.py": "def add(a, b):\n    return 0\n"})
    commit_all(buggy_repo, "second")
    assert provider.name == "runtime"

    with provider.create(
        RepoSource(str(buggy_repo), first), labels={"sweep": "s1", "model": "qwen/coder:7b"}
    ) as sbx:
        assert isinstance(sbx, Sandbox) and sbx.workdir == "/workspace/repo"
        record = fake.sandboxes[sbx.id].record
        assert record["labels"] == {"sweep": "s1", "model": "qwen-coder-7b", "bugsweep": "1"}
        assert (record["vcpu"], record["memoryMiB"], record["timeoutSeconds"]) == (2, 2048, 7200)
        assert record["onLeaseEnd"] == "delete"

        head = sbx.exec("pwd; git rev-parse HEAD; git status --short")
        assert head.ok and head.stdout.splitlines() == ["/workspace/repo", first]
        assert "return a - b" in sbx.files.read_text("/workspace/repo/calc.py"), "the ref was checked out"

        assert sbx.exec("python -c 'import pytest'").exit_code == 1, "the task environment starts empty"
        setup, environment = sbx.setup_environment(pytest_setup)
        assert setup is not None and setup.ok, setup and setup.output
        assert any(p.startswith("pytest==") for p in environment.packages)
        failing = sbx.exec("python -m pytest -q", timeout=120)
        assert failing.exit_code == 1 and "1 failed, 1 passed" in failing.output

        sbx.files.write("/workspace/repo/notes/new.txt", "hello\n")
        assert sbx.exec("cat notes/new.txt").stdout == "hello\n"
        assert sbx.exec("cat new.txt", cwd="notes").stdout == "hello\n"
        assert sbx.files.exists("/workspace/repo/notes/new.txt")
        assert not sbx.files.exists("/workspace/repo/missing.txt")
        with pytest.raises(FileNotFoundError):
            sbx.files.read_text("/workspace/repo/missing.txt")
        with pytest.raises(PermissionError):
            sbx.files.write("/usr/bin/not-yours", "x")
        piped = sbx.exec("tr a-z A-Z; echo oops >&2; exit 3", stdin="shout")
        assert (piped.exit_code, piped.stdout, piped.stderr) == (3, "SHOUT", "oops\n")
        assert sbx.exec("echo $FOO", env={"FOO": "bar"}).stdout == "bar\n"

    assert fake.live_sandboxes() == []
    sbx.release()  # a second release is harmless
    assert fake.statuses(f"DELETE /v1/sandboxes/{sbx.id}") == [200]


def test_a_plain_folder_becomes_a_git_repository_inside(provider: RuntimeProvider, tmp_path: Path) -> None:
    """Real SDK against the fake Runtime: a folder without .git is uploaded whole and committed inside the sandbox
    (as the local backend does), so the grader's git diff works; the folder itself is left alone."""
    folder = tmp_path / "plain"
    write_files(folder, {"app.py": "print('hi')\n", "data/x.txt": "x\n"})
    with provider.create(RepoSource(str(folder))) as sbx:
        listed = sbx.exec("git ls-files && git status --short")
        assert listed.ok and listed.stdout.split() == ["app.py", "data/x.txt"]
    assert not (folder / ".git").exists()


def test_streamed_exec_returns_the_whole_log(provider: RuntimeProvider, buggy_repo: Path) -> None:
    """Real SDK against the fake Runtime: full_output=True streams NDJSON and returns all 200 KB; the default keeps
    the last 64 KiB of each stream for the model and says so."""
    script = "import sys\nfor i in range(20000): print(f'line {i:05d}')\nprint('tail', file=sys.stderr)"
    with provider.create(RepoSource(str(buggy_repo))) as sbx:
        sbx.files.write("/workspace/repo/noisy.py", script)
        whole = sbx.exec("python noisy.py", full_output=True)
        assert whole.ok and not whole.truncated
        assert len(whole.stdout) == 20000 * 11 and whole.stdout.startswith("line 00000\n")
        assert whole.stderr == "tail\n"

        cut = sbx.exec("python noisy.py", timeout=30)
        assert cut.truncated and len(cut.stdout) == OUTPUT_LIMIT_BYTES
        assert cut.stdout.endswith("line 19999\n") and whole.stdout.endswith(cut.stdout)


def test_a_stream_cut_mid_output_still_returns_the_whole_log(
    fake: FakeRuntime, provider: RuntimeProvider, buggy_repo: Path
) -> None:
    """Real SDK against the fake Runtime, which drops the streamed exec's connection after the first output: the
    SDK follows the still-running process from its cursor (GET .../processes/{id}/output), and the grader still
    gets every line, once."""
    with provider.create(RepoSource(str(buggy_repo))) as sbx:
        fake.cut_streams(1)
        result = sbx.exec("echo first; sleep 0.5; seq 1 20000", full_output=True, timeout=60)
        assert result.ok and not result.truncated
        assert result.stdout.splitlines() == ["first", *map(str, range(1, 20001))]
        assert any(r.path.endswith("/output") for r in fake.requests), "followed from the cursor"


def test_a_capacity_refusal_is_waited_out_then_an_infra_error(
    fake: FakeRuntime, buggy_repo: Path, tmp_path: Path
) -> None:
    """Real SDK against the fake Runtime refusing creates for lack of room (429 no_capacity): the SDK waits it out
    with the same Idempotency-Key; past wait_for_capacity it is SandboxError (infra, retried later), not config."""
    settings = RuntimeSettings(api_key=fake.api_key, api_url=fake.url, wait_for_capacity_s=30)  # type: ignore[call-arg]
    provider = RuntimeProvider(SandboxSettings(), settings, cache_dir=tmp_path / "cache")
    fake.fail_next(2, status=429, code="no_capacity", match="POST /v1/sandboxes")
    with provider.create(RepoSource(str(buggy_repo))):
        creates = [r for r in fake.requests if (r.method, r.path) == ("POST", "/v1/sandboxes")]
        assert [r.status for r in creates] == [429, 429, 200]
        assert len({r.idempotency_key for r in creates}) == 1

    impatient = RuntimeSettings(api_key=fake.api_key, api_url=fake.url, wait_for_capacity_s=0)  # type: ignore[call-arg]
    fake.fail_next(1, status=429, code="no_capacity", match="POST /v1/sandboxes")
    with pytest.raises(SandboxError, match="no_capacity"):
        RuntimeProvider(SandboxSettings(), impatient).create(RepoSource(str(buggy_repo)))
    assert fake.live_sandboxes() == []


def test_one_provider_serves_tasks_in_parallel(
    fake: FakeRuntime, provider: RuntimeProvider, buggy_repo: Path
) -> None:
    """Real SDK against the fake Runtime: four sandboxes made and used at once from threads (as Prefect task runs
    do) share one client; each has its own files, and all are deleted."""

    def task(n: int) -> tuple[str, str]:
        with provider.create(RepoSource(str(buggy_repo)), labels={"task": f"t{n}"}) as sbx:
            sbx.files.write("/workspace/repo/mine.txt", f"task {n}")
            return sbx.id, sbx.exec("sleep 0.2; cat mine.txt").stdout

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(task, range(4)))
    assert [out for _, out in results] == [f"task {n}" for n in range(4)]
    assert len({sid for sid, _ in results}) == 4 and fake.live_sandboxes() == []


def test_a_sandbox_that_starts_slowly_is_waited_for(buggy_repo: Path, tmp_path: Path) -> None:
    """Real SDK against a fake Runtime whose creates answer "starting": the SDK waits server-side
    (GET ?waitFor=running) before the repository is uploaded and the first command runs."""
    with FakeRuntime(start_delay_s=0.3) as slow:
        provider = make_provider(slow, tmp_path / "cache")
        with provider.create(RepoSource(str(buggy_repo))) as sbx:
            assert sbx.exec("git rev-parse --is-inside-work-tree").stdout == "true\n"
        assert any(r.query.get("waitFor") == ["running"] for r in slow.requests)


def test_nothing_a_command_starts_outlives_it(provider: RuntimeProvider, buggy_repo: Path) -> None:
    """As on the local backend, each command has its own pid namespace (the fake's bubblewrap): a process it leaves
    in the background ends with it, so nothing of a test run can write into its output, or change a file, later
    (what the regrade's pair relies on)."""
    with provider.create(RepoSource(str(buggy_repo))) as sandbox:
        # had the command waited for its background process, or had that process outlived it, late.txt would be
        # there: it is written 1 s after the start (no bound on how long the command took, which load decides)
        first = sandbox.exec("(sleep 1; echo late > /workspace/late.txt) & echo started", timeout=30)
        assert first.ok and first.stdout.strip() == "started"
        time.sleep(4)
        assert not sandbox.files.exists("/workspace/late.txt"), (
            "the background process ended with its command"
        )


def test_a_timeout_is_a_result(provider: RuntimeProvider, buggy_repo: Path) -> None:
    """Real SDK against the fake Runtime: a command past its timeout is killed and reported, not raised."""
    with provider.create(RepoSource(str(buggy_repo))) as sbx:
        result = sbx.exec("echo started; sleep 30", timeout=1)
        assert result.timed_out and result.exit_code is None and not result.ok
        assert result.stdout == "started\n"
        assert sbx.exec("echo still usable").ok


def test_429_and_503s_are_retried_with_one_idempotency_key(
    fake: FakeRuntime, provider: RuntimeProvider, buggy_repo: Path
) -> None:
    """Real SDK retries against the fake Runtime's injected faults: a 429 then two 503s, for a create and for an
    exec; every attempt carries the same Idempotency-Key, and the work happens once."""
    fake.fail_next(1, status=429, match="POST /v1/sandboxes", retry_after="0.001", retry_after_ms=None)
    fake.fail_next(2, status=503, match="POST /v1/sandboxes")
    with provider.create(RepoSource(str(buggy_repo))) as sbx:
        creates = [r for r in fake.requests if (r.method, r.path) == ("POST", "/v1/sandboxes")]
        assert [r.status for r in creates] == [429, 503, 503, 200]
        assert len({r.idempotency_key for r in creates}) == 1 and creates[0].idempotency_key
        assert len(fake.sandboxes) == 1

        fake.fail_next(1, status=429, match=":exec")
        fake.fail_next(2, status=503, match=":exec")
        result = sbx.exec("echo once >> /workspace/count.txt; cat /workspace/count.txt", timeout=30)
        assert result.stdout == "once\n", "the command ran exactly once"
        execs = [r for r in fake.requests if r.path.endswith(":exec")][-4:]
        assert [r.status for r in execs] == [429, 503, 503, 200]
        assert len({r.idempotency_key for r in execs}) == 1


def test_503s_past_the_sdk_retries_are_infra_errors(
    fake: FakeRuntime, provider: RuntimeProvider, buggy_repo: Path
) -> None:
    """Real SDK against the fake Runtime: 503s that outlast the SDK's 4 retries become SandboxError (infra,
    retried by the task layer), not the model's failure; the sandbox itself is still fine."""
    with provider.create(RepoSource(str(buggy_repo))) as sbx:
        fake.fail_next(5, status=503, match=":exec")
        with pytest.raises(SandboxError) as raised:
            sbx.exec("true")
        assert not isinstance(raised.value, SandboxGone) and raised.value.kind == "infra"
        statuses = fake.statuses(":exec")[1:]  # after the one that made the task environment's venv
        assert statuses == [503] * 5, "one try and the SDK's 4 retries"
        assert sbx.exec("true").ok


def test_an_unreachable_api_is_an_infra_error(buggy_repo: Path) -> None:
    """Real SDK, no server at all (a closed port): the dropped connection becomes SandboxError."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = RuntimeSettings(api_key="rt_x", api_url=f"http://127.0.0.1:{port}", max_retries=1)  # type: ignore[call-arg]
    with pytest.raises(SandboxError, match="connection_error"):
        RuntimeProvider(SandboxSettings(), settings).create(RepoSource(str(buggy_repo)))


def test_a_wrong_key_is_a_config_error_naming_the_variable(fake: FakeRuntime, buggy_repo: Path) -> None:
    """Real SDK against the fake Runtime, which answers 401 to any other key: ConfigError that names
    RUNTIME_API_KEY and never shows the key."""
    provider = RuntimeProvider(
        SandboxSettings(), RuntimeSettings(api_key="rt_wrong_SECRET", api_url=fake.url)
    )  # type: ignore[call-arg]
    with pytest.raises(ConfigError) as raised:
        provider.create(RepoSource(str(buggy_repo)))
    message = str(raised.value)
    assert "RUNTIME_API_KEY" in message and "401" in message and "rt_wrong_SECRET" not in message
    assert fake.statuses("POST /v1/sandboxes") == [401], "a 401 is not retried"
    assert fake.live_sandboxes() == []


@pytest.mark.parametrize("full_output", [False, True], ids=["whole-answer", "streamed"])
def test_a_sandbox_deleted_under_a_running_command_is_gone(
    fake: FakeRuntime, provider: RuntimeProvider, buggy_repo: Path, full_output: bool
) -> None:
    """Real SDK against the fake Runtime, which deletes the sandbox while `sleep` runs: SandboxGone (infra, retried,
    never graded), for a whole answer and for a stream; release afterwards is quiet."""
    sbx = provider.create(RepoSource(str(buggy_repo)))
    fake.delete_when_running("sleep 30")
    with pytest.raises(SandboxGone) as raised:
        sbx.exec("sleep 30", full_output=full_output, timeout=60)
    assert isinstance(raised.value, InfraError) and sbx.id in str(raised.value)
    with pytest.raises(SandboxGone):
        sbx.files.read_text("/workspace/repo/calc.py")
    sbx.release()


def _listen() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server, server.getsockname()[1]


def test_network_only_for_commands_that_ask(
    fake: FakeRuntime, provider: RuntimeProvider, buggy_repo: Path
) -> None:
    """Real SDK against the fake Runtime (whose network rules really cut the command off, with a new network
    namespace): agent commands have no network; network=True (setup) switches it on for that command only."""
    listener, port = _listen()
    connect = f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('ok')\""
    with listener, provider.create(RepoSource(str(buggy_repo))) as sbx:
        assert not sbx.exec(connect).ok
        assert sbx.exec(connect, network=True).stdout == "ok\n"
        assert not sbx.exec(connect).ok, "switched off again"
        assert fake.sandboxes[sbx.id].internet is False


def test_no_command_runs_online_when_the_network_cannot_be_switched_off(
    fake: FakeRuntime, provider: RuntimeProvider, buggy_repo: Path
) -> None:
    """Real SDK against the fake Runtime, which fails the network-off call (503s past the SDK's retries): the next
    agent command first tries again and fails as infra rather than run with the internet on."""
    listener, port = _listen()
    connect = f"python -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('ok')\""
    with listener, provider.create(RepoSource(str(buggy_repo))) as sbx:
        fake.fail_next(
            10, status=503, match="/network", after=1
        )  # the switch on passes, both switch-offs fail
        assert sbx.exec(connect, network=True).stdout == "ok\n"
        assert fake.sandboxes[sbx.id].internet is True
        with pytest.raises(SandboxError):
            sbx.exec("touch /workspace/ran")
        assert not sbx.files.exists("/workspace/ran"), "the command did not run"
        assert not sbx.exec(connect).ok, "offline again once Runtime answers"
        assert fake.sandboxes[sbx.id].internet is False


def test_a_git_url_is_cloned_inside_the_sandbox(
    provider: RuntimeProvider, buggy_repo: Path, tmp_path: Path
) -> None:
    """Real SDK against the fake Runtime; real `git clone` inside the sandbox over HTTP from a local server (git's
    dumb HTTP protocol) with the network switched on for the clone only; then the ref is checked out."""
    first = git(buggy_repo, "rev-parse", "HEAD")
    write_files(buggy_repo, {"calc.py": "changed\n"})
    commit_all(buggy_repo, "second")
    served = tmp_path / "served"
    subprocess.run(["git", "clone", "-q", "--bare", str(buggy_repo), str(served / "calc.git")], check=True)
    subprocess.run(["git", "-C", str(served / "calc.git"), "update-server-info"], check=True)
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/calc.git"
        with provider.create(RepoSource(url, first)) as sbx:
            assert sbx.exec("git rev-parse HEAD").stdout.strip() == first
            assert "return a - b" in sbx.files.read_text("/workspace/repo/calc.py")
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_cost_follows_command_time_lifetime_and_prices(provider: RuntimeProvider, buggy_repo: Path) -> None:
    """Real SDK against the fake Runtime: cost_usd() = vCPUs x command seconds x vCPU-hour price + memory GiB x
    lifetime x GiB-hour price, from the durations the API measured; frozen once released."""
    with provider.create(RepoSource(str(buggy_repo))) as sbx:
        sbx.exec("sleep 0.3")
    usage = sbx.usage
    assert usage.commands == 2 and 0.3 <= usage.command_seconds < 5  # the task environment's venv, then sleep
    lifetime = usage.extra["lifetime_s"]
    expected = 2 * usage.command_seconds / 3600 * 0.025 + 2 * lifetime / 3600 * 0.0075
    assert sbx.cost_usd() == pytest.approx(expected) and usage.extra["cost_usd"] == pytest.approx(expected)
    assert sbx.usage.extra["lifetime_s"] == lifetime


def test_cleanup_by_label_from_the_command_line(
    fake: FakeRuntime, buggy_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bugsweep sandboxes cleanup --label` (typer's CliRunner, settings from RUNTIME_API_URL / RUNTIME_API_KEY)
    against the fake Runtime, the configured backend (BUGSWEEP_SANDBOX_BACKEND=runtime, no --backend): deletes the
    matching bugsweep sandboxes only, never others' sandboxes."""
    from bugsweep.cli import app

    monkeypatch.setenv("BUGSWEEP_SANDBOX_BACKEND", "runtime")

    provider = RuntimeProvider(SandboxSettings())
    leftovers = [provider.create(RepoSource(str(buggy_repo)), labels={"sweep": "nightly"}) for _ in range(2)]
    other_sweep = provider.create(RepoSource(str(buggy_repo)), labels={"sweep": "weekly"})
    not_ours = Runtime(api_key=fake.api_key, base_url=fake.url).sandboxes.create(labels={"sweep": "nightly"})

    listed = CliRunner().invoke(app, ["sandboxes", "list", "--label", "sweep=nightly"])
    assert listed.exit_code == 0 and all(s.id in listed.output for s in leftovers)
    assert not_ours.id not in listed.output

    result = CliRunner().invoke(app, ["sandboxes", "cleanup", "--label", "sweep=nightly"])
    assert result.exit_code == 0, result.output
    assert "2 deleted, 0 failed" in result.output
    assert {s.id for s in fake.live_sandboxes()} == {other_sweep.id, not_ours.id}

    refused = CliRunner().invoke(app, ["sandboxes", "cleanup"])
    assert refused.exit_code == 2 and "--label" in refused.output
    other_sweep.release()


# -- the whole agent on Runtime --------------------------------------------------------------------------------
SECRET = "sk-test-SECRET-never-in-a-sandbox"


def _solve(
    provider: RuntimeProvider, repo: Path, steps: list, scripted_model, out: Path, setup: str | None = None
):
    from bugsweep.pipeline import solve_task
    from bugsweep.settings import AgentSettings, ModelSettings
    from bugsweep.spec import TaskSpec

    server = scripted_model(steps)
    spec = TaskSpec(
        repo=str(repo),
        problem_statement="test_add fails: add() is wrong. Fix it.",
        test_command="python -m pytest -q",
        setup_command=setup,
    )
    model = ModelSettings(base_url=server.base_url, model="scripted", api_key=SECRET)  # type: ignore[arg-type]
    return solve_task(
        spec,
        provider=provider,
        model_settings=model,
        agent_settings=AgentSettings(max_turns=10),
        out_dir=out,
        labels={"task": spec.instance_id, "model": "scripted"},
    )


def test_the_agent_resolves_a_bug_in_a_runtime_sandbox(
    fake: FakeRuntime,
    provider: RuntimeProvider,
    buggy_repo: Path,
    tmp_path: Path,
    scripted_model,
    pytest_setup,
) -> None:
    """pipeline.solve_task end to end on RuntimeProvider: real SDK, real agent loop, real pytest and grading in the
    fake Runtime's sandbox; the model is the scripted server. Resolved, with a sandbox cost beside the token cost,
    the sandbox deleted, and the model's key never sent to the sandbox API."""
    from tests.support.scripted_model import tool_call

    steps = [
        tool_call("run", command="python -m pytest -q"),
        tool_call("read_file", path="calc.py"),
        tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b"),
        tool_call("run", command="python -m pytest -q"),
        tool_call("finish", summary="add() subtracted; it adds now."),
    ]
    out = tmp_path / "out"
    grade = _solve(provider, buggy_repo, steps, scripted_model, out, setup=pytest_setup)
    assert grade.resolved and grade.failed_before and grade.passes_after and grade.tests_untouched
    assert grade.FAIL_TO_PASS == ["tests/test_calc.py::test_add"]
    assert grade.mirror is not None and grade.mirror.armed and grade.mirror.subverted is None, grade.mirror
    assert grade.sandbox_cost_usd is not None and grade.sandbox_cost_usd > 0
    recorded = json.loads((out / "grade.json").read_text())
    assert recorded["sandbox_cost_usd"] == grade.sandbox_cost_usd
    environment = recorded["environment"]  # built in the microVM, recorded like the local backend's
    assert environment["setup_command"] == pytest_setup and environment["python"].count(".") == 2
    listed = (out / environment["packages_file"]).read_text()
    assert (
        "pytest==" in listed and hashlib.sha256(listed.encode()).hexdigest() == environment["packages_sha256"]
    )
    assert fake.live_sandboxes() == [], "released at the end"
    assert all(SECRET.encode() not in r.body for r in fake.requests)
    assert "return a - b" in (buggy_repo / "calc.py").read_text(), "the user's checkout is untouched"


@pytest.mark.parametrize(
    ("attack", "dropped"),
    [
        (
            "git update-index --assume-unchanged tests/test_calc.py && "
            "printf 'def test_add():\\n    pass\\n' > tests/test_calc.py",
            ["tests/test_calc.py"],
        ),
        (
            'SITE=$(python -c "import site; print(site.getusersitepackages())") && mkdir -p "$SITE" && '
            "echo 'import os; os._exit(0)' > \"$SITE/usercustomize.py\" && echo 'import os; os._exit(0)' > pytest.py",
            ["pytest.py"],
        ),
    ],
    ids=["git-blinded-test-edit", "usercustomize-and-pytest-shadow"],
)
def test_the_regrade_on_runtime_reads_the_change_through_the_files_api(
    fake: FakeRuntime,
    provider: RuntimeProvider,
    buggy_repo: Path,
    tmp_path: Path,
    scripted_model,
    attack: str,
    dropped: list[str],
    pytest_setup: str,
) -> None:
    """The Runtime half of the clean room: the change is read back through the files API (no command inside is
    trusted), protected changes are dropped, and the tests rerun in a fresh Runtime sandbox (the fake server)."""
    from tests.support.scripted_model import tool_call

    out = tmp_path / "out"
    steps = [tool_call("run", command=attack), tool_call("finish")]
    grade = _solve(provider, buggy_repo, steps, scripted_model, out, setup=pytest_setup)
    assert not grade.resolved and grade.failure_kind is None and grade.reason
    assert sorted(grade.dropped) == dropped and grade.FAIL_TO_PASS == []
    assert fake.live_sandboxes() == [], "both the agent's and the regrade's sandboxes are released"


def test_a_sandbox_that_vanishes_mid_task_is_an_infra_failure(
    fake: FakeRuntime,
    provider: RuntimeProvider,
    buggy_repo: Path,
    tmp_path: Path,
    scripted_model,
    pytest_setup,
) -> None:
    """pipeline.solve_task on RuntimeProvider, the fake Runtime deleting the sandbox under the agent's command:
    SandboxGone is raised (nothing retries it: running again in that sandbox cannot help), and grade.json says
    infra, not a model failure."""
    from tests.support.scripted_model import tool_call

    fake.delete_when_running("sleep 20")
    out = tmp_path / "out"
    with pytest.raises(SandboxGone):
        _solve(
            provider, buggy_repo, [tool_call("run", command="sleep 20")], scripted_model, out, pytest_setup
        )
    grade = json.loads((out / "grade.json").read_text())
    assert grade["failure_kind"] == "infra" and not grade["resolved"]
    assert fake.live_sandboxes() == []


def test_bugsweep_solve_runs_unchanged_on_runtime(
    fake: FakeRuntime, buggy_repo: Path, tmp_path: Path, scripted_model, pytest_setup
) -> None:
    """`bugsweep solve --sandbox runtime` as a user runs it (a subprocess; RUNTIME_API_URL / RUNTIME_API_KEY point at
    the fake Runtime; the model is the scripted server): resolved, with the sandbox cost in grade.json, and the
    Runtime key nowhere in the output."""
    from tests.support.scripted_model import tool_call

    server = scripted_model(
        [
            tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b"),
            tool_call("finish", summary="fixed add()"),
        ]
    )
    out = tmp_path / "out"
    env = {
        **os.environ,
        "RUNTIME_API_URL": fake.url,
        "RUNTIME_API_KEY": fake.api_key,
        "LLM_BASE_URL": server.base_url,
        "LLM_MODEL": "scripted",
        "LLM_API_KEY": SECRET,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    args = ["--repo", str(buggy_repo), "--task", "add() is wrong", "--test-command", "python -m pytest -q",
            "--setup-command", pytest_setup]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "bugsweep.cli", "solve", *args, "--sandbox", "runtime", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    grade = json.loads((out / "grade.json").read_text())
    assert grade["resolved"] and grade["sandbox_cost_usd"] > 0
    assert fake.api_key not in proc.stdout + proc.stderr and SECRET not in proc.stdout + proc.stderr
    assert fake.live_sandboxes() == []


def test_a_fresh_sandbox_from_a_snapshot_holds_the_task_state_and_environment(
    fake: FakeRuntime, provider: RuntimeProvider, buggy_repo: Path, pytest_setup: str
) -> None:
    """The clean-room contract on Runtime: snapshot() after setup, then create_from() gives a new microVM with the
    repository and the task environment as they were (pytest runs with no install), and nothing written later."""
    with provider.create(RepoSource(str(buggy_repo))) as sbx:
        setup, _ = sbx.setup_environment(pytest_setup)
        assert setup is not None and setup.ok
        snapshot = sbx.snapshot()
        assert sbx.exec("echo tampered > calc.py && echo agent > /workspace/note").ok
        with provider.create_from(snapshot) as fresh:
            assert fresh.id != sbx.id
            assert "return a - b" in fresh.files.read_text("/workspace/repo/calc.py")
            assert not fresh.files.exists("/workspace/note")
            tests = fresh.exec("python -m pytest -q", timeout=120)
            assert tests.exit_code == 1 and "1 failed, 1 passed" in tests.output
        snapshot.release()
    assert fake.live_sandboxes() == []
