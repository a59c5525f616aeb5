"""The fake Runtime API (tests.support.fake_runtime_api) as a pytest fixture, for any test that runs on the
Runtime backend (the sandbox tests, the Prefect flow tests).

`fake_runtime` starts a fresh fake server for the test and points RUNTIME_API_URL / RUNTIME_API_KEY at it, so
`RuntimeProvider()`, `get_provider("runtime")` and `bugsweep ... --sandbox runtime` in a subprocess all reach it.
Import it into a test module (`from tests.support.fake_runtime import fake_runtime`) or list this module in
`pytest_plugins`. Needs bubblewrap (the fake runs each sandbox's commands under it); skips without it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.support.fake_runtime_api import FakeRuntime


@pytest.fixture
def fake_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRuntime]:
    """A started fake Runtime API (a stand-in for withruntime.com), with RUNTIME_API_URL / RUNTIME_API_KEY set."""
    if shutil.which("bwrap") is None:
        pytest.skip("the fake Runtime runs sandbox commands under bubblewrap, which is not installed")
    with FakeRuntime() as server:
        monkeypatch.setenv("RUNTIME_API_URL", server.url)
        monkeypatch.setenv("RUNTIME_API_KEY", server.api_key)
        yield server
