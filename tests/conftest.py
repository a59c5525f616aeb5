"""Shared fixtures. Heavier fixtures (Prefect test server, SeaweedFS, fake Runtime) live in tests/support/."""

from __future__ import annotations

import os
from collections import Counter
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
#: per file, 2026-12-06, quiet machine, 13 min 14 s in all). The processes take their work in collection order, so
#: the longest go first: started last (xdist's default order is by number of tests), one of them ends the suite
#: minutes after the other processes are done. Files not listed come after these (by group, then name). Refresh when
#: a file grows or shrinks.
LONGEST_FILES_S = {
    "test_deploy.py": 437, "test_flows.py": 205, "test_sandbox_runtime.py": 201, "test_first_night.py": 186,
    "test_mining.py": 147, "test_blocks.py": 114, "test_cleanroom.py": 113, "test_runconfig.py": 97,
    "test_cli_solve.py": 80, "test_embedded_model.py": 69, "test_agent_loop.py": 58, "test_mirror.py": 41,
    "test_review.py": 40, "test_grading.py": 38, "test_attempts.py": 37, "test_env_reuse.py": 36, "test_grow.py": 36,
    "test_sandbox_local.py": 35, "test_mining_limits.py": 34, "test_branches.py": 33, "test_compare.py": 31,
}  # fmt: skip

#: Files that run in one process because they use the same session server (`--dist loadgroup`; any other file is a
#: group of its own, so its module fixtures are made once). The suite is bound by CPU on two cores, and a Prefect
#: server costs ~14 s of CPU to start (more under load): one `prefect server start` for the two deployment files
#: (test_blocks cleans up what it saves, and test_deploy removes its blocks, for the other), and two test harnesses
#: for the seven files whose flows report to one, instead of one of each in every process that runs such a file.
#: Two harnesses, not one: the seven files in one process made the longest chain of the run (~10 minutes under load).
#: pytest-xdist adds `@GROUP` to each test's id in what it prints: leave it out to run that one test.
SHARED_SERVER = {
    "test_deploy.py": "prefect-server", "test_blocks.py": "prefect-server",
    **dict.fromkeys(("test_flows.py", "test_grow.py", "test_swebench.py", "test_compare.py"), "prefect-harness"),
    **dict.fromkeys(("test_runconfig.py", "test_review.py", "test_branches.py"), "prefect-harness-2"),
}  # fmt: skip


def _group(path: Path) -> str:
    """The group of a test file: its shared server's, else its own."""
    return SHARED_SERVER.get(path.name, path.stem)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each file in its group (SHARED_SERVER, else its own), the longest groups first (LONGEST_FILES_S summed), the
    longest files first within a group; the order of the tests within a file is kept."""
    group_s: Counter[str] = Counter()
    for path in {item.path for item in items}:
        group_s[_group(path)] += LONGEST_FILES_S.get(path.name, 0)
    items.sort(
        key=lambda item: (
            -group_s[_group(item.path)],
            _group(item.path),
            -LONGEST_FILES_S.get(item.path.name, 0),
            item.path.name,
        )
    )
    # the marker is xdist's, unknown without it (--strict-markers)
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            item.add_marker(pytest.mark.xdist_group(_group(item.path)))


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
