"""Settings, read from the environment (and a .env file) with pydantic-settings.

The model comes from the seed's three variables LLM_BASE_URL, LLM_MODEL and LLM_API_KEY. When LLM_BASE_URL is unset,
bugsweep starts the embedded open model (see bugsweep.embedded). Every field here is documented: the settings are
the documentation.
What a user sets per run is declared once in bugsweep/runconfig.py and extended here with what comes from the
environment (the key, where the sandboxes keep their state, ...).
"""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from bugsweep.branches import BranchFields
from bugsweep.runconfig import (
    AGENT_ENV_PREFIX,
    MODEL_ENV_PREFIX,
    AgentLimits,
    ModelFields,
    PolicyName,
    SandboxLimits,
)

__all__ = ["AgentSettings", "BranchSettings", "ModelSettings", "PolicyName", "SandboxSettings"]

#: Test files, in .gitignore syntax (see bugsweep/grading/testfiles.py): the issue's defaults plus tests/ folders at any depth.
DEFAULT_TEST_GLOBS = ["tests/**", "**/tests/**", "test_*.py", "*_test.py", "conftest.py"]


class ModelSettings(BaseSettings, ModelFields):
    """Which OpenAI-compatible endpoint the agent talks to, and what its tokens cost (bugsweep.runconfig.ModelFields),
    with its key."""

    model_config = SettingsConfigDict(env_prefix=MODEL_ENV_PREFIX, env_file=".env", extra="ignore")

    api_key: SecretStr = SecretStr("")
    """API key. Never logged, never written to a trajectory, never put into a sandbox."""

    def cost_usd(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        cached_price = (
            self.price_prompt_per_mtok
            if self.price_cached_prompt_per_mtok is None
            else self.price_cached_prompt_per_mtok
        )
        uncached = max(prompt_tokens - cached_tokens, 0)
        return (
            uncached * self.price_prompt_per_mtok
            + cached_tokens * cached_price
            + completion_tokens * self.price_completion_per_mtok
        ) / 1e6

    @classmethod
    def of_endpoint(cls, endpoint: ModelFields, api_key: SecretStr | None = None) -> ModelSettings:
        """The settings of an endpoint declared elsewhere (a block, a comparison's entry), with its key."""
        return cls(
            **endpoint.model_dump(include=set(ModelFields.model_fields)), api_key=api_key or SecretStr("")
        )


class AgentSettings(BaseSettings, AgentLimits):
    """Limits and knobs of the agent loop: the per-run limits and policy (bugsweep.runconfig.AgentLimits), and the
    rest."""

    model_config = SettingsConfigDict(env_prefix=AGENT_ENV_PREFIX, env_file=".env", extra="ignore")

    command_timeout_s: float = Field(default=300.0, gt=0)
    """Timeout of one `run` tool call."""
    output_tail_chars: int = Field(default=6000, ge=100)
    """How much of a command's output the model sees (the last N characters)."""
    read_file_max_chars: int = Field(default=20000, ge=100)
    """How much of a file `read_file` returns."""
    protected_globs: list[str] = Field(default_factory=lambda: list(DEFAULT_TEST_GLOBS))
    """Files `edit_file` refuses to change (test files): the model must fix the code, not the test."""
    max_consecutive_format_errors: int = Field(default=5, ge=1)
    """Replies in a row without a usable tool call before the run stops with 'format_errors'."""
    rewrite_samples: int = Field(default=3, ge=0)
    """Under 'small-model': when the answer to a request for a whole function leaves the task's tests failing, the
    same request is asked again this many times at temperature 0.8, and the first version the tests pass with is
    kept (each sample is a turn; 0: none). Recorded with the settings in the trajectory."""


class SandboxSettings(BaseSettings, SandboxLimits):
    """Which sandbox backend runs the commands, its limits (bugsweep.runconfig.SandboxLimits), and where it keeps
    its state."""

    model_config = SettingsConfigDict(env_prefix="BUGSWEEP_SANDBOX_", env_file=".env", extra="ignore")

    backend: str = "local"
    """'local' (bubblewrap + overlayfs, the default) or 'runtime' (Runtime cloud microVMs)."""
    setup_network_allow: list[str] = []
    """'local': private address ranges (CIDR) the setup command may reach anyway, e.g. a package mirror on the
    company network; everything else private, and the host itself, stays unreachable."""
    workdir: str = "/workspace/repo"
    """Where the repository lives inside the sandbox."""
    cache_dir: str | None = None
    """'local': where clones of git URLs and checkouts of refs are kept and reused; unset: ~/.cache/bugsweep."""
    state_dir: str | None = None
    """'local': where each sandbox's overlay layers, /workspace and /tmp live; unset: this user's own
    $TMPDIR/bugsweep-sandboxes-UID (a sandbox a killed process left is removed only by a process of its user)."""
    env_dir: str | None = None
    """'local': where finished task environments (setup layers) and the shared download cache are kept and reused;
    unset: ~/.cache/bugsweep/environments."""
    env_max_gib: float = 20.0
    """'local': the least recently used task environments are removed beyond this size."""
    env_max_age_days: float = 14.0
    """'local': task environments unused this long are removed."""


class BranchSettings(BaseSettings, BranchFields):
    """Where resolved fixes are pushed as branches (bugsweep.branches.BranchFields: BUGSWEEP_BRANCH_PUSH_URL,
    _PREFIX, _USERNAME, _AUTHOR), with the token. Not part of a run's configuration: a branch is made from a grade
    and never changes one."""

    model_config = SettingsConfigDict(env_prefix="BUGSWEEP_BRANCH_", env_file=".env", extra="ignore")

    token: SecretStr = SecretStr("")
    """Token for pushing over HTTP(S), sent as a header to the push URL's server only; empty: none (git's own
    credentials, e.g. an SSH key, are used). Never logged, never written to a run folder or artifact."""
