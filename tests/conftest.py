"""Shared fixtures. Heavier fixtures (Prefect test server, SeaweedFS, fake Runtime) live in tests/support/."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.repos import make_repo
from tests.support.scripted_model import ScriptedModelServer

# Prefect binds its console log handlers to whatever sys.stderr is when its logging is first set up. Under pytest that
# can be a CliRunner's temporary stream, closed once the command returns, and every later Prefect log line then fails
# with "I/O operation on closed file". The process's own stderr never closes (pytest still captures it at the fd level).
os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_STREAM", "ext://sys.__stderr__")
os.environ.setdefault("PREFECT_LOGGING_HANDLERS_DEBUG_STREAM", "ext://sys.__stderr__")


@pytest.fixture
def buggy_repo(tmp_path: Path) -> Path:
    """A git repo whose add() subtracts; tests/test_calc.py::test_add fails."""
    return make_repo(tmp_path / "calc")


@pytest.fixture
def scripted_model():
    """Factory: scripted_model([steps...]) -> a started ScriptedModelServer (a scripted stand-in, not a model)."""
    servers: list[ScriptedModelServer] = []

    def start(steps=(), **options):
        server = ScriptedModelServer(steps, **options).start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.stop()
