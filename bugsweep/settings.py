"""Settings, read from the environment (and a .env file) with pydantic-settings.

The model comes from the seed's three variables LLM_BASE_URL, LLM_MODEL and LLM_API_KEY. When LLM_BASE_URL is unset,
bugsweep starts the embedded open model (see bugsweep.embedded). Every field here is documented: the settings are
the documentation.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

#: The agent policies (bugsweep/agent/policy.py) a run can be under.
PolicyName = Literal["plain", "small-model"]

#: Test files, in .gitignore syntax (see bugsweep/testfiles.py): the issue's defaults plus tests/ folders at any depth.
DEFAULT_TEST_GLOBS = ["tests/**", "**/tests/**", "test_*.py", "*_test.py", "conftest.py"]


class ModelSettings(BaseSettings):
    """Which OpenAI-compatible endpoint the agent talks to, and what its tokens cost."""

    model_config = SettingsConfigDict(env_prefix="LLM_", env_file=".env", extra="ignore")

    base_url: str | None = None
    """OpenAI-compatible base URL, e.g. https://api.deepseek.com/v1. Unset: the embedded model is started."""
    model: str = "qwen2.5-coder-1.5b-instruct"
    """Model name sent with every request."""
    api_key: SecretStr = SecretStr("")
    """API key. Never logged, never written to a trajectory, never put into a sandbox."""
    price_prompt_per_mtok: float = Field(default=0.0, ge=0)
    """USD per million prompt tokens (0 for self-hosted models)."""
    price_completion_per_mtok: float = Field(default=0.0, ge=0)
    """USD per million completion tokens."""
    price_cached_prompt_per_mtok: float | None = Field(default=None, ge=0)
    """USD per million cached prompt tokens; unset: same as prompt tokens."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Seconds to wait for one reply (small local models on 2 cores are slow)."""
    max_retries: int = Field(default=6, ge=0)
    """Retries for 429, 5xx, timeouts and dropped connections (with backoff, honouring Retry-After)."""
    max_tokens_per_reply: int = Field(default=1024, ge=1)
    """Cap on completion tokens per reply, so a rambling model cannot stall a turn."""
    temperature: float = Field(default=0.0, ge=0)
    """Sampling temperature."""

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


class AgentSettings(BaseSettings):
    """Limits and knobs of the agent loop."""

    model_config = SettingsConfigDict(env_prefix="BUGSWEEP_", env_file=".env", extra="ignore")

    max_turns: int = Field(default=40, ge=1)
    """Model replies before the run stops with stop_reason 'max_turns'."""
    max_total_tokens: int | None = Field(default=None, ge=1)
    """Prompt plus completion tokens over the whole run; unset: no limit."""
    max_cost_usd: float | None = Field(default=None, ge=0)
    """Cost over the whole run, from the model's prices; unset: no limit."""
    max_wall_s: float | None = Field(default=3600.0, gt=0)
    """Wall-clock seconds for the agent loop."""
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
    policy: PolicyName | None = None
    """What the harness does for the model beyond the plain loop (bugsweep/agent/policy.py): 'plain' (nothing) or
    'small-model' (whole-function edits tried against the tests, failed edits dropped from the history: the help
    the embedded 1.5B model needs). Unset: 'small-model' when bugsweep runs its embedded model, 'plain' for every
    other endpoint. Recorded in grade.json, the trajectory and every report."""
    rewrite_samples: int = Field(default=3, ge=0)
    """Under 'small-model': when the answer to a request for a whole function leaves the task's tests failing, the
    same request is asked again this many times at temperature 0.8, and the first version the tests pass with is
    kept (each sample is a turn; 0: none). Recorded with the settings in the trajectory."""


class SandboxSettings(BaseSettings):
    """Which sandbox backend runs the commands, and its limits."""

    model_config = SettingsConfigDict(env_prefix="BUGSWEEP_SANDBOX_", env_file=".env", extra="ignore")

    backend: str = "local"
    """'local' (bubblewrap + overlayfs, the default) or 'runtime' (Runtime cloud microVMs)."""
    memory_mib: int = Field(default=4096, ge=64)
    """Memory limit of a sandbox."""
    max_processes: int = Field(default=512, ge=1)
    """Process limit inside a sandbox (stops fork bombs)."""
    setup_network: bool = True
    """Whether the setup command may reach the network (e.g. pip install). Agent commands never may on 'local'.
    On 'local' it reaches the internet through slirp4netns, never the host's loopback or private networks."""
    setup_network_allow: list[str] = []
    """'local': private address ranges (CIDR) the setup command may reach anyway, e.g. a package mirror on the
    company network; everything else private, and the host itself, stays unreachable."""
    disk_mib: int = 8192
    """'local': disk quota of a sandbox (its repository changes, $HOME and /tmp together); a write past it fails
    inside with 'No space left on device'. A task's own `disk_mib` overrides it. 0: no quota."""
    spare_disks: int = Field(default=1, ge=0)
    """'local': how many sandbox disks (of the last quota asked for) to keep made and mounted ahead of time, so
    that creating a sandbox only takes one (each holds a few MB of the host's disk until used; released at exit).
    0: each sandbox makes its disk when it is created."""
    resident: bool = True
    """'local': start a process in each spare sandbox's namespaces that forks its commands there (a command then
    costs a fork and an exec, not a bubblewrap of its own; bugsweep/sandbox/local/resident.py). False: every
    command is a bubblewrap of its own."""
    workdir: str = "/workspace/repo"
    """Where the repository lives inside the sandbox."""
    cache_dir: str | None = None
    """'local': where clones of git URLs and checkouts of refs are kept and reused; unset: ~/.cache/bugsweep."""
    state_dir: str | None = None
    """'local': where each sandbox's overlay layers, /workspace and /tmp live; unset: $TMPDIR/bugsweep-sandboxes."""
    env_dir: str | None = None
    """'local': where finished task environments (setup layers) and the shared download cache are kept and reused;
    unset: ~/.cache/bugsweep/environments."""
    env_max_gib: float = 20.0
    """'local': the least recently used task environments are removed beyond this size."""
    env_max_age_days: float = 14.0
    """'local': task environments unused this long are removed."""
    installer: Literal["uv", "pip"] = "uv"
    """How `pip install` in a setup command runs: 'uv' as `uv pip install` (the same packages, much faster; an
    install uv cannot do falls back to pip), 'pip' as written. Recorded in grade.json's `environment`."""
