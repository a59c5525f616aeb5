"""Sandbox providers as Prefect blocks: the local bubblewrap sandbox and Runtime microVMs (key as a secret)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from bugsweep.runconfig import SandboxLimits
from bugsweep.settings import SandboxSettings

if TYPE_CHECKING:
    from bugsweep.sandbox.base import SandboxProvider


class LocalSandbox(Block, SandboxLimits):
    """Sandboxes on the worker's own machine: bubblewrap namespaces over a copy-on-write (overlayfs) workspace.

    Its fields are bugsweep.runconfig.SandboxLimits, the ones BUGSWEEP_SANDBOX_* sets (declared once); where the
    sandboxes keep their state stays the worker's (BUGSWEEP_SANDBOX_STATE_DIR, ...)."""

    _block_type_name = "bugsweep local sandbox"
    _description = "bugsweep's local sandbox (bubblewrap + overlayfs) and its limits."

    def sandbox_settings(self) -> SandboxSettings:
        return SandboxSettings(backend="local", **self.model_dump(include=set(SandboxLimits.model_fields)))

    def provider(self) -> SandboxProvider:
        from bugsweep.sandbox.local import LocalProvider

        return LocalProvider(self.sandbox_settings())


class RuntimeSandbox(Block):
    """Sandboxes as Runtime (withruntime.com) Firecracker microVMs; the API key is stored encrypted."""

    _block_type_name = "bugsweep runtime sandbox"
    _description = "Runtime cloud sandboxes for bugsweep: API key, size, lifetime and spending cap."

    api_key: SecretStr = Field(description="Runtime API key.")
    api_url: str | None = Field(default=None, description="API origin; empty: https://api.withruntime.com.")
    vcpu: int = Field(default=2, description="vCPUs per sandbox.")
    memory_mib: int = Field(default=4096, description="Memory per sandbox.")
    timeout_seconds: int = Field(
        default=7200, description="Lifetime limit; a leftover sandbox is deleted then."
    )
    image: str | None = Field(
        default=None, description="Image; empty: Runtime's default (git, bash, Python)."
    )
    max_cost_usd: float | None = Field(default=None, description="Runtime's own spending cap per sandbox.")
    setup_network: bool = Field(default=True, description="Whether the setup command may reach the network.")

    def provider(self) -> SandboxProvider:
        from bugsweep.sandbox.runtime import RuntimeProvider, RuntimeSettings

        runtime_settings = RuntimeSettings(
            api_key=self.api_key,
            api_url=self.api_url,
            **self.model_dump(include={"vcpu", "memory_mib", "timeout_seconds", "image", "max_cost_usd"}),
        )
        sandbox_settings = SandboxSettings(
            backend="runtime", memory_mib=self.memory_mib, setup_network=self.setup_network
        )
        return RuntimeProvider(sandbox_settings, runtime_settings)
