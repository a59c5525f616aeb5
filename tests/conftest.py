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

#: Seconds each of the longest test files took in a whole-suite run (`--durations=0`, setup + call + teardown summed
#: per file, 2026-12-04, loaded machine). A file runs whole in one process (`--dist loadfile`) and the processes take
#: files in collection order, so the longest go first: started last (xdist's default order is by number of tests,
#: which put test_deploy, test_blocks and test_first_night at the end), one of them ends the suite minutes after the
#: other processes are done. Files not listed keep their order after these. Refresh when a file grows or shrinks.
LONGEST_FILES_S = {
    "test_deploy.py": 650, "test_first_night.py": 266, "test_flows.py": 218, "test_sandbox_runtime.py": 213,
    "test_blocks.py": 201, "test_cleanroom.py": 199, "test_cli_solve.py": 181, "test_agent_loop.py": 157,
    "test_sandbox_local.py": 113, "test_env_reuse.py": 99, "test_review.py": 93, "test_runconfig.py": 75,
    "test_mining_limits.py": 63, "test_mining.py": 59, "test_branches.py": 57, "test_embedded_model.py": 56,
}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest test files first (LONGEST_FILES_S); the order of the tests within a file is kept."""
    items.sort(key=lambda item: -LONGEST_FILES_S.get(item.path.name, 0))


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
