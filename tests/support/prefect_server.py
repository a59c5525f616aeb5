"""Prefect for tests: one throwaway API server per test session, and a real `prefect server start` for deploy tests.

Starting Prefect's API takes 18-35 s on the 2-core machines, so each is started once per session and shared:
- `prefect_harness`: `prefect_test_harness` (a temporary SQLite database and API server in a subprocess), which
  flows called in-process report to;
- `prefect_api`: a real `prefect server start` on a free port with its own PREFECT_HOME, for tests that deploy
  from prefect.yaml and run process workers against it (see `PrefectServer`).

Offline settings (no telemetry, no analytics) and a private PREFECT_HOME are set when this module is imported,
before any flow runs, so nothing lands in ~/.prefect and cached results never outlive the throwaway database.
Register the fixtures with `pytest_plugins = ["tests.support.prefect_server"]` in a test module.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.processes import die_with_parent

#: Seconds to wait for a Prefect server to answer (18-35 s when idle; more on a loaded machine).
STARTUP_TIMEOUT_S = int(os.environ.get("BUGSWEEP_TEST_PREFECT_STARTUP_S", "120"))

_HOME = Path(tempfile.mkdtemp(prefix="bugsweep-prefect-home-"))
# The servers and workers using it are stopped by their fixtures first; the folder must not outlive the session.
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
OFFLINE_ENV = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": str(STARTUP_TIMEOUT_S),
    # SQLite on a busy 2-core machine (the suite runs in parallel): a write waits for the lock rather than
    # answering 503 after Prefect's default 10 s
    "PREFECT_SERVER_DATABASE_TIMEOUT": "60",
    "PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT": "30",
}
os.environ.setdefault("PREFECT_HOME", str(_HOME))
os.environ.update(OFFLINE_ENV)


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """Flows called in this process report to a temporary Prefect API (one per session: it takes ~30 s)."""
    from prefect.settings import PREFECT_HOME, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with (
        temporary_settings(updates={PREFECT_HOME: _HOME, PREFECT_SERVER_ANALYTICS_ENABLED: False}),
        prefect_test_harness(server_startup_timeout=STARTUP_TIMEOUT_S),
    ):
        yield


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrefectServer:
    """A real `prefect server start` (SQLite) on a free loopback port, and helpers to run Prefect commands and
    process workers against it. Everything it starts is in its own process group and is killed by `stop`."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs = home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        # Prefect's process worker makes a temporary folder for each flow run it starts (and its runner one more),
        # removed as the run ends: a worker the tests kill, or stop at the end, leaves them. In this server's
        # folder (pytest's, rotated), not in /tmp.
        self.tmp = home / "tmp"
        self.tmp.mkdir(exist_ok=True)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One REST call to the API (`path` after /api). On a loaded 2-core machine the SQLite-backed server can
        answer 503 for a moment (a database timeout, seen in CI deleting a block): try again for up to 30 s, as
        Prefect's own client and the UI do. Other answers, 404 included, are returned as they are."""
        for _ in range(15):
            response = httpx.request(method, f"{self.api_url}{path}", timeout=60, **kwargs)
            if response.status_code != 503:
                break
            time.sleep(2)
        return response

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process that talks to this server (and never to another)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(OFFLINE_ENV)
        env.update(
            PREFECT_HOME=str(self.home),
            PREFECT_API_URL=self.api_url,
            PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{self.home / 'prefect.db'}",
            PREFECT_UI_ENABLED="true",  # the browser tests open its pages
            PREFECT_LOGGING_LEVEL="INFO",
            TMPDIR=str(self.tmp),
        )
        env.update(extra)
        return env

    def spawn(
        self, name: str, args: list[str], cwd: Path | None = None, **env: str
    ) -> subprocess.Popen[bytes]:
        """Start a long-running Prefect process (server, worker); its output goes to logs/NAME.log."""
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=self.env(**env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        log.close()
        self.processes.append(proc)
        return proc

    def run(self, args: list[str], cwd: Path | None = None, timeout: float = 300, **env: str) -> str:
        """Run a Prefect command to completion; raise with its output when it fails."""
        done = subprocess.run(
            args, cwd=cwd, env=self.env(**env), capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done.stdout

    def start(self) -> PrefectServer:
        prefect = [sys.executable, "-m", "prefect"]
        self.spawn("server", [*prefect, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)])
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.processes[0].poll() is not None:
                raise RuntimeError(f"prefect server exited: {(self.logs / 'server.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.api_url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"prefect server not healthy after {STARTUP_TIMEOUT_S} s")

    def stop_process(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Workers first, the server last."""
        for proc in reversed(self.processes):
            self.stop_process(proc)
        self.processes.clear()


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """A real Prefect server (SQLite) for the session; everything started through it is killed at the end."""
    server = PrefectServer(tmp_path_factory.mktemp("prefect-server")).start()
    try:
        yield server
    finally:
        server.stop()
