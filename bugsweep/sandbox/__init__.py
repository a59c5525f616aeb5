"""Sandbox backends. `get_provider(name)` returns one by name: 'local' (default) or 'runtime'."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bugsweep.errors import ConfigError
from bugsweep.sandbox.base import ExecResult, RepoSource, Sandbox, SandboxFiles, SandboxProvider
from bugsweep.settings import SandboxSettings

if TYPE_CHECKING:
    from bugsweep.sandbox.runtime import RuntimeSettings

__all__ = ["ExecResult", "RepoSource", "Sandbox", "SandboxFiles", "SandboxProvider", "get_provider"]


def get_provider(
    name: str | None = None,
    settings: SandboxSettings | None = None,
    runtime_settings: RuntimeSettings | None = None,
) -> SandboxProvider:
    """The provider of backend `name` (else settings.backend) with these settings (else BUGSWEEP_SANDBOX_*, and for
    Runtime BUGSWEEP_RUNTIME_*). A run's sandboxes come through bugsweep.runbuilder.sandbox_provider."""
    settings = settings or SandboxSettings()
    name = name or settings.backend
    if name == "local":
        from bugsweep.sandbox.local import LocalProvider

        return LocalProvider(settings)
    if name == "runtime":
        from bugsweep.sandbox.runtime import RuntimeProvider

        return RuntimeProvider(settings, runtime_settings)
    raise ConfigError(f"unknown sandbox backend {name!r}: choose 'local' or 'runtime'")
