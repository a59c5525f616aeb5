"""A run as the flows run it: a run built by bugsweep.runbuilder with where its artifacts go."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bugsweep import runconfig

if TYPE_CHECKING:
    from bugsweep.runbuilder import Run
    from bugsweep.sandbox.base import SandboxProvider
    from bugsweep.settings import AgentSettings, BranchSettings, ModelSettings
    from bugsweep.storage import ArtifactStore


@dataclass
class RunSetup:
    """Everything a task needs besides its spec: the model, the agent's limits, where sandboxes and artifacts go,
    and the configuration they make (`config`, whose digest keys the results)."""

    model: ModelSettings
    agent: AgentSettings
    provider: SandboxProvider
    store: ArtifactStore
    local_dir: Path
    """Run folders are written here (LOCAL_DIR/SWEEP/TASK/MODEL/CONFIG) and uploaded from here."""
    config: runconfig.RunConfig
    setup_network: bool = True
    labels: dict[str, str] = field(default_factory=dict)
    """Put on every sandbox (with the task's id): the flow run, so hooks and cleanups can find them."""
    branches: BranchSettings | None = None
    """Where resolved fixes are pushed as branches (with the token); None: no branches."""
    escalate_to: list[ModelSettings] = field(default_factory=list)
    """The models (with their keys) a task escalates to, in order, each only on what the ones before did not
    resolve (`config.escalate_to` names them)."""

    @classmethod
    def of(
        cls, built: Run, store: ArtifactStore, local_dir: Path, labels: dict[str, str] | None = None,
        branches: BranchSettings | None = None,
    ) -> RunSetup:  # fmt: skip
        """A run built by bugsweep.runbuilder.build_run, with where its artifacts go and its sandboxes' labels."""
        return cls(
            model=built.model, agent=built.agent, provider=built.provider, store=store, local_dir=local_dir,
            config=built.config, setup_network=built.setup_network, labels=dict(labels or {}), branches=branches,
            escalate_to=list(built.escalate_to),
        )  # fmt: skip
