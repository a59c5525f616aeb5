"""Shared fixtures. Heavier fixtures (Prefect test server, SeaweedFS, fake Runtime) live in tests/support/."""

from __future__ import annotations

from pathlib import Path

import pytest

from bugsweep.testing.repos import make_repo
from bugsweep.testing.scripted_model import ScriptedModelServer


@pytest.fixture
def buggy_repo(tmp_path: Path) -> Path:
    """A git repo whose add() subtracts; tests/test_calc.py::test_add fails."""
    return make_repo(tmp_path / "calc")


@pytest.fixture
def scripted_model():
    """Factory: scripted_model([steps...]) -> a started ScriptedModelServer (a scripted stand-in, not a model)."""
    servers: list[ScriptedModelServer] = []

    def start(steps=()):
        server = ScriptedModelServer(steps).start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.stop()
