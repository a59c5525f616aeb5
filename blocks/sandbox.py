"""Sandbox providers as Prefect blocks: the local bubblewrap sandbox and Runtime microVMs (key as a secret).

Each holds the fields of a declaration in bugsweep/runconfig.py (`SandboxLimits`, `RuntimeFields`), the ones the
environment sets (BUGSWEEP_SANDBOX_*, BUGSWEEP_RUNTIME_*), with the same defaults; a run's sandboxes are made from
them by bugsweep.runbuilder.sandbox_provider, as from the environment."""

from __future__ import annotations

from copy import copy
from typing import TYPE_CHECKING, Any

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from bugsweep.runconfig import RuntimeFields, SandboxLimits

if TYPE_CHECKING:
    from bugsweep.sandbox.base import SandboxProvider
    from bugsweep.sandbox.runtime import RuntimeSettings


class LocalSandbox(Block, SandboxLimits):
    """Sandboxes on the worker's own machine: bubblewrap namespaces over a copy-on-write (overlayfs) workspace.

    Its fields are bugsweep.runconfig.SandboxLimits, the ones BUGSWEEP_SANDBOX_* sets (declared once); where the
    sandboxes keep their state stays the worker's (BUGSWEEP_SANDBOX_STATE_DIR, ...)."""

    _block_type_name = "bugsweep local sandbox"
    _description = "bugsweep's local sandbox (bubblewrap + overlayfs) and its limits."

    def saved_limits(self) -> dict[str, Any]:
        """The sandbox limits this block holds (over BUGSWEEP_SANDBOX_*)."""
        return self.model_dump(include=set(SandboxLimits.model_fields))

    def provider(self) -> SandboxProvider:
        from bugsweep.runbuilder import sandbox_provider

        return sandbox_provider("local", saved_limits=self.saved_limits())


class RuntimeSandbox(Block, RuntimeFields):
    """Sandboxes as Runtime (withruntime.com) Firecracker microVMs; the API key is stored encrypted.

    Its fields are bugsweep.runconfig.RuntimeFields, the ones BUGSWEEP_RUNTIME_* sets (declared once), the key, the
    API's address, and whether setup commands reach the network (SandboxLimits' `setup_network`)."""

    _block_type_name = "bugsweep runtime sandbox"
    _description = (
        "Runtime cloud sandboxes for bugsweep: API key, size, disk, network, lifetime and spending cap."
    )

    api_key: SecretStr = Field(description="Runtime API key.")
    api_url: str | None = Field(default=None, description="API origin; empty: https://api.withruntime.com.")
    setup_network: bool = copy(SandboxLimits.model_fields["setup_network"])  # type: ignore[assignment]  # its declaration

    def saved_limits(self) -> dict[str, Any]:
        """The sandbox limits this block holds (over BUGSWEEP_SANDBOX_*)."""
        return {"setup_network": self.setup_network}

    def runtime_settings(self) -> RuntimeSettings:
        """The Runtime settings this block holds, with its key (instead of BUGSWEEP_RUNTIME_* and RUNTIME_API_*)."""
        from bugsweep.sandbox.runtime import RuntimeSettings

        return RuntimeSettings(
            api_key=self.api_key,
            api_url=self.api_url,
            **self.model_dump(include=set(RuntimeFields.model_fields)),
        )

    @classmethod
    def from_settings(cls, settings: RuntimeSettings, setup_network: bool) -> RuntimeSandbox:
        """A block holding the same settings as `settings` (e.g. read from BUGSWEEP_RUNTIME_* and RUNTIME_API_KEY)."""
        return cls(
            **settings.model_dump(include={*RuntimeFields.model_fields, "api_key", "api_url"}),
            setup_network=setup_network,
        )

    def provider(self) -> SandboxProvider:
        from bugsweep.runbuilder import sandbox_provider

        return sandbox_provider(
            "runtime", saved_limits=self.saved_limits(), saved_runtime=self.runtime_settings()
        )
