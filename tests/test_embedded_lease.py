"""One embedded model server per machine, shared by the runs there by lease: started by the first, reused by the
others, stopped when the last lease ends (or by `bugsweep model stop`), never under a run that uses it.

Real parts: bugsweep's own server lifecycle (`ensure_embedded_model`, `start_background`, the leases, the start
lock, the server's own `stop_when_unused` watch), runs as separate processes, SIGKILL. Stand-in: the server
process is tests/support/embedded_standin.py (an HTTP server listing the model's name; the real one loads 1.1 GB
and is started once, in tests/test_embedded_model.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bugsweep.embedded import EmbeddedSettings
from bugsweep.embedded.server import _alive, live_leases, read_state, served_models
from tests.support.prefect_server import free_port

PROJECT = Path(__file__).resolve().parent.parent


class Machine:
    """One machine's embedded model state (its cache folder and port), and runs started on it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {
            **os.environ,
            "BUGSWEEP_CACHE_DIR": str(root / "cache"),
            "BUGSWEEP_MODEL_PORT": str(free_port()),
        }
        self.settings = EmbeddedSettings(cache_dir=root / "cache", port=int(self.env["BUGSWEEP_MODEL_PORT"]))
        self.runs: list[subprocess.Popen[str]] = []

    def run(self, name: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
        """Start a run that holds a lease until `finish(name)`; returns it once it has the server."""
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.embedded_standin", "run", "--until", str(self.root / name)],
            cwd=PROJECT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.runs.append(process)
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("{"):
                return process, json.loads(line)
        raise AssertionError(f"run {name} ended before it had the server (exit {process.wait()})")

    def finish(self, name: str, process: subprocess.Popen[str]) -> str:
        (self.root / name).touch()
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0, out
        return out

    def answering(self) -> bool:
        return served_models(self.settings.port) is not None

    def wait_stopped(self, pid: int, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while (_alive(pid) or self.answering()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(pid) and not self.answering(), f"the server (pid {pid}) still runs"

    def stop_all(self) -> None:
        for process in self.runs:
            if process.poll() is None:
                process.kill()
                process.wait()
        state = read_state(self.settings)
        if state is not None:
            os.kill(state.pid, signal.SIGKILL)


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    machine = Machine(tmp_path)
    yield machine
    machine.stop_all()


def test_runs_share_one_server_which_stops_when_the_last_run_ends(machine: Machine) -> None:
    first, started = machine.run("a")
    second, reused = machine.run("b")
    assert started["started"] is True and reused == {"pid": started["pid"], "started": False}, "one server"
    assert sorted(live_leases(machine.settings)) == sorted([first.pid, second.pid])

    out = machine.finish("a", first)  # the run that started it ends first: the other still uses it
    assert "Stopping" not in out
    time.sleep(2.5)  # longer than the server's own look for leases (two looks 1 s apart)
    assert machine.answering(), "never stopped under a run that uses it"

    out = machine.finish("b", second)
    assert "no run on this machine uses it any more" in out
    machine.wait_stopped(int(str(started["pid"])), within_s=10)
    assert read_state(machine.settings) is None and live_leases(machine.settings) == []


def test_runs_killed_leave_no_server_behind(machine: Machine) -> None:
    """A killed run's lease is dead (its process is gone): the last live run stops the server as it ends; and when
    every run using it was killed, the server stops itself."""
    first, started = machine.run("a")
    second, _ = machine.run("b")
    second.kill()
    second.wait()
    machine.finish("a", first)
    machine.wait_stopped(int(str(started["pid"])), within_s=10)

    alone, started = machine.run("c")
    alone.kill()
    alone.wait()
    machine.wait_stopped(int(str(started["pid"])), within_s=15)
    assert read_state(machine.settings) is None


def test_model_stop_stops_it_under_runs_and_says_how_many_used_it(machine: Machine) -> None:
    holder, started = machine.run("a")
    stop = subprocess.run(
        [sys.executable, "-m", "bugsweep", "model", "stop"], env=machine.env, capture_output=True, text=True,
        timeout=120, cwd=PROJECT,
    )  # fmt: skip
    assert stop.returncode == 0, stop.stderr
    assert f"Stopped the embedded model server (pid {started['pid']})" in stop.stdout
    assert f"1 run(s) on this machine were using it (processes {holder.pid})" in stop.stdout
    machine.wait_stopped(int(str(started["pid"])), within_s=10)
    machine.finish("a", holder)


def test_a_server_started_by_model_serve_outlives_the_runs_that_used_it(
    machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bugsweep.embedded import install
    from bugsweep.embedded import server as embedded

    monkeypatch.setattr(
        embedded, "server_command",
        lambda settings, leased: [sys.executable, "-m", "tests.support.embedded_standin", "serve"],
    )  # fmt: skip
    monkeypatch.setattr(install, "ensure_model_file", lambda *args, **kwargs: Path("/dev/null"))
    for key in ("BUGSWEEP_CACHE_DIR", "BUGSWEEP_MODEL_PORT"):
        monkeypatch.setenv(key, machine.env[key])
    monkeypatch.chdir(PROJECT)
    served = embedded.start_background(machine.settings, progress=lambda _: None)  # `bugsweep model serve`

    run, reused = machine.run("a")
    assert reused == {"pid": served.pid, "started": False}
    machine.finish("a", run)
    time.sleep(2.5)
    assert machine.answering() and _alive(served.pid), "runs until `bugsweep model stop`"
