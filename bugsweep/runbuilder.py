"""The one way to build a run: `build_run` makes the settings a task runs with, and the configuration (its digest)
they make, for every front end: `bugsweep solve` and `demo`, `bugsweep sweep` and `compare` (through their flows),
and the flows `solve-bug`, `sweep` and `compare-models` however they are started (the UI, a schedule, the API, a
sweep fanning out to workers). The sandboxes of `bugsweep mine` and the `grow-benchmark` flow come from
`sandbox_provider`, the same way.

Every setting comes from the first of these that has it:
1. what the user gave for this run: a command-line option, a field of a flow's run form or a parameter of its
   deployment, a comparison's entry (its limits over the comparison's: `runconfig.merge_choices`);
2. a saved block: the model endpoint, the local or Runtime sandbox (the flows load them; `bugsweep solve` and
   `demo` run without Prefect and read none);
3. the environment of the process that builds the run (LLM_*, BUGSWEEP_*, BUGSWEEP_SANDBOX_*, BUGSWEEP_RUNTIME_*):
   for a run of a deployment, the worker's;
4. the default declared with the setting (bugsweep/runconfig.py, bugsweep/settings.py).
A field a user left empty is unset (None), never its default, so it never hides the environment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bugsweep.errors import ConfigError
from bugsweep.runconfig import AgentChoices, RunConfig, SandboxLimits, chosen, resolve_policy
from bugsweep.settings import AgentSettings, ModelSettings, SandboxSettings

if TYPE_CHECKING:
    from bugsweep.sandbox.base import SandboxProvider
    from bugsweep.sandbox.runtime import RuntimeSettings


@dataclass
class Run:
    """What a run is made of: the model (with its key), the agent's settings (the policy resolved), the sandboxes,
    and the configuration they make (`config.digest` keys its results); `escalate_to`: the endpoints (with their
    keys) tried after `model`, in order, each only on what the ones before did not resolve."""

    model: ModelSettings
    agent: AgentSettings
    provider: SandboxProvider
    config: RunConfig
    escalate_to: list[ModelSettings] = field(default_factory=list)

    @property
    def setup_network(self) -> bool:
        """Whether a task's setup command may reach the network (the sandbox settings')."""
        settings = getattr(self.provider, "settings", None) or SandboxSettings()
        return bool(settings.setup_network)


def backend_of(chosen: str | None) -> str:
    """The sandbox backend a run uses: the one chosen, else BUGSWEEP_SANDBOX_BACKEND, else local."""
    return chosen or SandboxSettings().backend


def sandbox_provider(
    backend: str | None = None,
    *,
    saved_limits: Mapping[str, Any] | None = None,
    saved_runtime: RuntimeSettings | None = None,
) -> SandboxProvider:
    """The sandboxes of a run: `backend` as chosen (else BUGSWEEP_SANDBOX_BACKEND, else local), with a saved
    block's sandbox limits over BUGSWEEP_SANDBOX_* (`saved_limits`: SandboxLimits fields) and a saved
    RuntimeSandbox block's settings instead of BUGSWEEP_RUNTIME_*."""
    from bugsweep.sandbox import get_provider

    saved = {k: v for k, v in (saved_limits or {}).items() if k in SandboxLimits.model_fields}
    settings = SandboxSettings(backend=backend_of(backend), **saved)
    return get_provider(settings.backend, settings, runtime_settings=saved_runtime)


def build_run(
    choices: AgentChoices | None = None,
    *,
    endpoint: ModelSettings | None = None,
    provider: SandboxProvider | None = None,
    backend: str | None = None,
    escalate_to: Sequence[ModelSettings] = (),
) -> Run:
    """A run's settings and configuration. `choices`: the limits and policy the user gave (what is None comes from
    BUGSWEEP_*, else the default); `endpoint`: a saved model endpoint block's or a comparison entry's settings
    (else LLM_*; no LLM_BASE_URL: the embedded model); `provider`: sandboxes made by `sandbox_provider` (else
    made here for `backend`); `escalate_to`: the endpoints tried after it, in order (a cheaper model first), each
    with its base URL (the embedded model can only come first). The policy is the run's, the same for every model
    of the cascade. A bad BUGSWEEP_* or LLM_* value raises pydantic's ValidationError."""
    model = endpoint if endpoint is not None else ModelSettings()
    later = list(escalate_to)
    if any(not m.base_url for m in later):
        raise ConfigError(
            "a model to escalate to needs its base URL: only the first model of a cascade can be the embedded one"
        )
    agent = AgentSettings(**chosen(choices))
    agent.policy = resolve_policy(agent.policy, embedded=not model.base_url)
    provider = provider if provider is not None else sandbox_provider(backend)
    config = RunConfig.of(model, agent, provider, escalate_to=later)
    return Run(model=model, agent=agent, provider=provider, config=config, escalate_to=later)
