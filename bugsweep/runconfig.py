"""What makes a run: everything that can change a verdict, declared once, written into every grade, and the key
its results are found again by.

The pieces a user sets are declared here once, and every front end is made from them or holds them:
- `AgentLimits`: the agent's budget and policy for a run, and the per-test time limit of its grading, each with its
  default. `AgentSettings` (BUGSWEEP_*) extends it. `AgentChoices` is made from it: the same fields, each unset
  (None) unless a user gave it; the command line's options (`--max-turns`, `--policy`, ...; bugsweep/cli/options.py),
  the flows' `limits` parameter and a comparison entry's `limits` are AgentChoices, so an option or form field left
  empty never hides BUGSWEEP_* behind a default.
- `ModelFields`: the model endpoint. `ModelSettings` (LLM_*), the `ModelEndpoint` block and compare's model entries
  extend it, each adding its key in its own way (a secret, a secret, the name of a variable).
- `SandboxLimits`: the sandbox's limits. `SandboxSettings` (BUGSWEEP_SANDBOX_*) and the `LocalSandbox` block
  extend it; `RuntimeFields`, a Runtime microVM's settings: `RuntimeSettings` (BUGSWEEP_RUNTIME_*) and the
  `RuntimeSandbox` block extend it.

A run's settings are made from these in one place, `bugsweep.runbuilder.build_run`, in one order: what the user
gave (an option, a form field, a comparison entry) over a saved block over the environment over the default here.

`RunConfig` is what a run was made of: the model (never its key) and those it escalates to, the policy, the agent's limits, the sandbox
backend and its limits, the task environment, bugsweep's version and its code (`code_digest`: a hash of the
package's files). Its `digest` (a short hash of its canonical JSON) names it: grade.json holds both, results are
stored under SWEEP/TASK/MODEL/CONFIG, so a rerun under the same configuration finds its grades and one under
another (another bugsweep included) runs and keeps both. Only pydantic is imported here, so the command line can
build its options from these models and `bugsweep --help` stays fast.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, create_model

if TYPE_CHECKING:
    from bugsweep.sandbox.base import SandboxProvider
    from bugsweep.settings import AgentSettings, ModelSettings

#: The agent policies (bugsweep/agent/policy.py) a run can be under. The one list of their names: the command
#: line's choices, the flows' form and the policy registry are checked against it.
PolicyName = Literal["plain", "small-model"]
POLICY_NAMES: tuple[str, ...] = get_args(PolicyName)
#: The policy of a run that names none, on any endpoint but the embedded model (whose configuration names its own).
DEFAULT_POLICY: PolicyName = "plain"

#: The most attempts a run may make at a task per model (AgentLimits.attempts).
MAX_ATTEMPTS = 20

#: Field docstrings become their descriptions: the help of a command-line option and of a field in the UI's forms.
DOCUMENTED = ConfigDict(use_attribute_docstrings=True)
#: The prefix of the agent's settings in the environment (bugsweep.settings.AgentSettings): BUGSWEEP_MAX_TURNS, ...
AGENT_ENV_PREFIX = "BUGSWEEP_"


class AgentLimits(BaseModel):
    """The agent's budget and policy for a run, and how long one test may take when its work is graded: what a
    user chooses per run, in every front end."""

    model_config = DOCUMENTED

    max_turns: int = Field(default=40, ge=1, title="Turns")
    """Model replies before the run stops with stop_reason 'max_turns'."""
    max_total_tokens: int | None = Field(default=None, ge=1, title="Tokens")
    """Prompt plus completion tokens over the whole run; unset: no limit."""
    max_cost_usd: float | None = Field(default=None, ge=0, title="Cost (USD)")
    """Token cost in USD over the whole run, from the model's prices; unset: no limit."""
    max_wall_s: float | None = Field(default=3600.0, gt=0, title="Time (seconds)")
    """Wall-clock seconds for the agent loop; unset: no limit."""
    per_test_timeout_s: float | None = Field(default=60.0, gt=0, title="Per-test time limit (seconds)")
    """Seconds one test (its setup, call and teardown) may take in a graded test run, before and after the change
    (pytest and unittest): a test still running then is stopped and counts as failed, and the rest of the run goes
    on. Unset: no per-test limit, only the whole run's timeout."""
    policy: PolicyName | None = Field(default=None, title="Agent policy")
    """What the harness does for the model beyond the plain loop (bugsweep/agent/policy.py): 'plain' (nothing) or
    'small-model' (whole-function edits tried against the tests, failed edits dropped from the history). Unset:
    'small-model' for the embedded model and 'plain' for any other endpoint. Recorded in grade.json, the trajectory
    and every report."""
    attempts: int = Field(default=1, ge=1, le=MAX_ATTEMPTS, title="Attempts")
    """Independent attempts at a task by each model (the run's, then each it escalates to), each in its own sandbox
    made from the task state after setup, with its own trajectory, graded by the clean room; the first one the
    clean room resolves ends the task (one held for review does not). The limits above hold for each attempt;
    grade.json records every attempt, and its turns, tokens, cost and time are their sum."""
    retry_temperature: float = Field(default=0.7, ge=0, title="Temperature of later attempts")
    """Sampling temperature of a model's attempts after its first (the first keeps the model's own temperature),
    so that a later attempt need not repeat an earlier one."""


def unset_means(
    name: str, declared: type[BaseModel] | None = None, env_prefix: str = AGENT_ENV_PREFIX
) -> str:
    """What a field of `declared` (default AgentLimits) left empty in an option or a form becomes: the one sentence
    every front end's help says (e.g. "Empty: BUGSWEEP_MAX_TURNS where set, else 40.")."""
    default = (declared or AgentLimits).model_fields[name].default
    return f"Empty: {env_prefix}{name.upper()} where set, else {'unset' if default is None else default}."


def choices_of(declared: type[BaseModel], name: str, env_prefix: str) -> type[BaseModel]:
    """`declared` with every field unset (None) unless given: the same types, bounds and titles, and help that says
    what an empty field becomes (the variable `env_prefix` + its name, else its default)."""
    fields: dict[str, Any] = {}
    for field_name, info in declared.model_fields.items():
        kind: Any = Optional[info.annotation]  # noqa: UP045  # `|` cannot join a type held in a variable for mypy
        if info.metadata:
            kind = Annotated[kind, *info.metadata]
        help_text = (
            f"{' '.join((info.description or '').split())} {unset_means(field_name, declared, env_prefix)}"
        )
        fields[field_name] = (kind, Field(default=None, title=info.title, description=help_text))
    return create_model(
        name,
        __module__=__name__,
        __config__=DOCUMENTED,
        __doc__=f"{declared.__doc__} Each field left empty: the environment, else the default.",
        **fields,
    )


if TYPE_CHECKING:
    #: For mypy: AgentLimits' fields, each of which may be None at run time.
    AgentChoices = AgentLimits
else:
    #: The agent limits and policy a user chose for a run (an option, a form field, a comparison entry): AgentLimits'
    #: fields, each None unless given. bugsweep.runbuilder fills what is None from BUGSWEEP_*, else the default.
    AgentChoices = choices_of(AgentLimits, "AgentChoices", AGENT_ENV_PREFIX)


def chosen(choices: BaseModel | None, fields: Any = None) -> dict[str, Any]:
    """The fields a user gave (not None), of `fields` (default: all)."""
    if choices is None:
        return {}
    return {k: v for k, v in choices.model_dump(include=fields).items() if v is not None}


def merge_choices(base: AgentChoices | None, over: AgentChoices | None) -> AgentChoices:
    """`over`'s choices over `base`'s (a comparison entry's limits over the comparison's): what neither gave stays
    unset. The one way entries are merged, from the command line and from the flow alike."""
    return AgentChoices(**{**chosen(base), **chosen(over)})


class ModelFields(BaseModel):
    """An OpenAI-compatible endpoint and what its tokens cost; without the key, which each holder keeps its own way."""

    model_config = DOCUMENTED

    base_url: str | None = None
    """OpenAI-compatible base URL, e.g. https://api.deepseek.com/v1. Empty: the embedded model is started."""
    model: str = "qwen2.5-coder-1.5b-instruct"
    """Model name sent with every request."""
    price_prompt_per_mtok: float = Field(default=0.0, ge=0)
    """USD per million prompt tokens (0 for self-hosted models)."""
    price_completion_per_mtok: float = Field(default=0.0, ge=0)
    """USD per million completion tokens."""
    price_cached_prompt_per_mtok: float | None = Field(default=None, ge=0)
    """USD per million cached prompt tokens; empty: the prompt price."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Seconds to wait for one reply (small local models on 2 cores are slow)."""
    max_retries: int = Field(default=6, ge=0)
    """Retries for 429, 5xx, timeouts and dropped connections (with backoff, honouring Retry-After)."""
    max_tokens_per_reply: int = Field(default=1024, ge=1)
    """Cap on completion tokens per reply, so a rambling model cannot stall a turn."""
    temperature: float = Field(default=0.0, ge=0)
    """Sampling temperature."""
    max_concurrent_requests: int = Field(default=8, ge=0)
    """Requests the endpoint may hold at once, shared by every run that uses it on any machine (sweeps, comparisons,
    runs from the UI): a Prefect global concurrency limit named after the endpoint, made or resized to this size by
    the first run that finds it missing or different. Without Prefect (`bugsweep solve`), within the one process.
    The embedded model: its server's slots. 0: no limit."""
    max_requests_per_minute: int = Field(default=0, ge=0)
    """Requests per minute the provider allows, shared the same way (a Prefect rate limit: a global concurrency
    limit whose slots decay); 0: none."""
    outage_wait_s: float = Field(default=300.0, ge=0)
    """How long a request waits, retrying with backoff, for an endpoint that answered before and now refuses
    connections (a server restarting): then the run fails as an outage (infra). An endpoint that never answered is
    a wrong address: a configuration failure at once."""


#: The prefix of the model endpoint's settings in the environment (bugsweep.settings.ModelSettings): LLM_MODEL, ...
MODEL_ENV_PREFIX = "LLM_"

if TYPE_CHECKING:
    #: For mypy: ModelFields' fields, each of which may be None at run time.
    ModelChoices = ModelFields
else:
    #: An endpoint's settings as a user gives them (a comparison's entry): ModelFields' fields, each None unless
    #: given; bugsweep.runbuilder fills what is None from LLM_*, else the default.
    ModelChoices = choices_of(ModelFields, "ModelChoices", MODEL_ENV_PREFIX)


class SandboxLimits(BaseModel):
    """A sandbox's limits: what a task's commands may use."""

    model_config = DOCUMENTED

    memory_mib: int = Field(default=4096, ge=64)
    """Memory limit of a sandbox."""
    max_processes: int = Field(default=512, ge=1)
    """Process limit inside a sandbox (stops fork bombs)."""
    setup_network: bool = True
    """Whether the setup command may reach the network (e.g. pip install). Agent commands never may on 'local'.
    On 'local' it reaches the internet through slirp4netns, never the host's loopback or private networks."""
    disk_mib: int = 8192
    """'local': disk quota of a sandbox (its repository changes, $HOME and /tmp together); a write past it fails
    inside with 'No space left on device'. A task's own `disk_mib` overrides it. 0: no quota."""
    installer: Literal["uv", "pip"] = "uv"
    """How `pip install` in a setup command runs: 'uv' as `uv pip install` (the same packages, much faster; an
    install uv cannot do falls back to pip), 'pip' as written. Recorded in grade.json's `environment`."""


class RuntimeFields(BaseModel):
    """A Runtime microVM's settings (bugsweep/sandbox/runtime.py), without the key and the API's address."""

    model_config = DOCUMENTED

    vcpu: int = 2
    """vCPUs per sandbox."""
    memory_mib: int | None = None
    """Memory per sandbox; unset: the sandbox limit `memory_mib` (BUGSWEEP_SANDBOX_MEMORY_MIB)."""
    disk_mib: int | None = None
    """Disk per sandbox; unset: Runtime's default."""
    timeout_seconds: int = 7200
    """Lifetime limit (60..86400). A sandbox still alive then (a crashed run) is deleted by Runtime itself."""
    image: str | None = None
    """Image (id, name, name:tag); unset: Runtime's default image. It needs bash and git (git clone, the
    grader's diffs); one with the project's dependencies installed saves the setup step's time."""
    isolate_network: bool = True
    """Agent commands run with the sandbox's internet off; only setup and `git clone` (network=True) get it,
    switched on around that one command. False: internet on for the sandbox's whole life."""
    max_cost_usd: float | None = None
    """Runtime's own spending cap per sandbox (max_cost_micros); unset: none."""
    price_per_vcpu_hour: float = 0.025
    """USD per vCPU-hour of CPU used (Runtime's published price)."""
    price_per_gib_hour: float = 0.0075
    """USD per GiB-hour of memory held (Runtime's published price)."""
    max_retries: int = 4
    """The SDK's retries of 429 / 5xx / dropped connections, each with the same Idempotency-Key."""
    request_timeout_s: float = 300.0
    """The SDK's per-call timeout (commands get their own timeout plus a minute)."""
    wait_for_capacity_s: float = 120.0
    """How long a create waits out 'no capacity' / quota refusals before it fails (as infra, retryable)."""
    clone_timeout_s: float = 600.0
    """Timeout of `git clone` inside the sandbox for a repository given as a URL."""


#: What a sandbox backend option or form field left empty means, in every front end's help.
BACKEND_UNSET = "Empty: BUGSWEEP_SANDBOX_BACKEND where set, else local."


def resolve_policy(chosen: str | None, *, embedded: bool) -> PolicyName:
    """The policy a run is under: the one chosen, else the embedded model's own (its configuration names it), else
    `plain`. It never depends on a model's name. The one place the default is decided."""
    if chosen is not None:
        if chosen not in POLICY_NAMES:
            from bugsweep.errors import ConfigError

            raise ConfigError(f"unknown policy {chosen!r}: choose one of {', '.join(POLICY_NAMES)}")
        return chosen  # type: ignore[return-value]  # checked against the Literal's names just above
    if embedded:
        from bugsweep.embedded import DEFAULT_MODEL

        return DEFAULT_MODEL.policy
    return DEFAULT_POLICY


# -- what a run was made of -----------------------------------------------------------------------------------


class ModelConfig(BaseModel):
    """The model as far as it can change a verdict (never its key; not its timeout or retries): every ModelFields
    field but MODEL_FIELDS_NOT_IN_CONFIG, so that a field added there is in the configuration unless declared not
    to change a verdict."""

    model_config = ConfigDict(extra="allow")

    base_url: str | None
    """None: the embedded model (its address changes with every start; its name and bugsweep's version pin it)."""
    model: str
    temperature: float
    max_tokens_per_reply: int
    reasoning: Literal["sent back"] = "sent back"
    """A reasoning model's reasoning text (DeepSeek's reasoning_content) goes back with its message."""
    prices: dict[str, float | None] | None = None
    """USD per million prompt, completion and cached prompt tokens, only under a cost limit (`max_cost_usd`), where
    they decide when the run stops; None without one."""

    @classmethod
    def of(cls, model: ModelFields, agent: AgentLimits) -> ModelConfig:
        """What of `model` can change a verdict under `agent`'s limits (its prices only under a cost limit)."""
        return cls(
            **model.model_dump(
                include=set(ModelFields.model_fields) - MODEL_FIELDS_NOT_IN_CONFIG - PRICE_FIELDS
            ),
            prices=None if agent.max_cost_usd is None else model.model_dump(include=PRICE_FIELDS),
        )


#: A model's prices: part of a run's configuration only under a cost limit.
PRICE_FIELDS = {"price_prompt_per_mtok", "price_completion_per_mtok", "price_cached_prompt_per_mtok"}
#: ModelFields that never change a verdict (how long a reply may take to come, how often a request is retried, how
#: many requests the endpoint takes at once and how long a run waits out its outage):
#: left out of a run's configuration. Every other field of ModelFields is in it (prices under a cost limit).
MODEL_FIELDS_NOT_IN_CONFIG = {
    "request_timeout_s", "max_retries", "max_concurrent_requests", "max_requests_per_minute", "outage_wait_s",
}  # fmt: skip
#: What names the code in a configuration.
CODE_FIELDS = {"bugsweep_version", "bugsweep_code"}
#: RuntimeFields that never change a verdict (the VM's lifetime cap, the spending cap, prices, the SDK's retries
#: and waits, the clone's timeout): left out of a run's configuration. Every other one is in it.
RUNTIME_FIELDS_NOT_IN_CONFIG = {
    "timeout_seconds", "max_cost_usd", "price_per_vcpu_hour", "price_per_gib_hour", "max_retries",
    "request_timeout_s", "wait_for_capacity_s", "clone_timeout_s",
}  # fmt: skip
#: What of a Runtime microVM can change a verdict.
RUNTIME_FIELDS = set(RuntimeFields.model_fields) - RUNTIME_FIELDS_NOT_IN_CONFIG


class SandboxConfig(SandboxLimits):
    """The sandbox backend and its limits."""

    backend: str
    workdir: str
    """Where the repository lives inside the sandbox (the model reads it in every prompt)."""
    runtime: dict[str, Any] | None = None
    """'runtime': the microVM's size, image and network (bugsweep.sandbox.runtime.RuntimeSettings; not its key)."""


class EnvironmentConfig(BaseModel):
    """The task environment a task without its own interpreter gets."""

    python: str
    """The interpreter bugsweep runs on (a task's own `python`, in task.json, overrides it)."""


#: Never part of bugsweep's code: what Python writes beside it as it imports it.
_CACHES = ("__pycache__",)
_CACHE_SUFFIXES = (".pyc", ".pyo")


@functools.cache
def code_digest() -> str:
    """16 hex digits naming bugsweep's code: a hash of every file of the installed package (its .py files and its
    package data: the probe, the templates, the demo project), computed once per process. A checkout installed
    editable and a wheel of the same tree give the same digest; one changed byte gives another."""
    return package_digest(Path(__file__).resolve().parent)


def package_digest(package: Path) -> str:
    """The digest of the files under `package` a wheel of it holds: all but Python's caches, and in a source
    checkout (a pyproject.toml beside the package) what its .gitignore leaves out of a wheel."""
    root = package.parent
    ignored: Any = None
    if (root / "pyproject.toml").is_file() and (root / ".gitignore").is_file():
        import pathspec

        ignored = pathspec.GitIgnoreSpec.from_lines(
            (root / ".gitignore").read_text(encoding="utf-8").splitlines()
        )
    files: list[tuple[str, Path]] = []
    for folder, dirs, names in os.walk(package):
        dirs[:] = [d for d in dirs if d not in _CACHES]
        for name in names:
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            if name.endswith(_CACHE_SUFFIXES) or (ignored is not None and ignored.match_file(rel)):
                continue
            files.append((rel, path))
    whole = hashlib.sha256()
    for rel, path in sorted(files):
        whole.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return whole.hexdigest()[:16]


class RunConfig(BaseModel):
    """Everything that can change a verdict, and nothing secret. Written into grade.json with its digest."""

    model: ModelConfig
    escalate_to: list[ModelConfig] = Field(default_factory=list)
    """The model endpoints tried after `model`, in order, each (with its `attempts`) only when the ones before it
    did not resolve the task: a cheaper model first, a stronger one for what it could not fix. Empty: `model`
    alone."""
    policy: PolicyName
    agent: dict[str, Any]
    """Every agent setting but the policy (bugsweep.settings.AgentSettings): limits, tool output sizes, protected
    files, rewrite samples."""
    sandbox: SandboxConfig
    environment: EnvironmentConfig
    bugsweep_version: str
    bugsweep_code: str
    """The code that made the grade (`code_digest`): another bugsweep, or one changed file, is another
    configuration, whatever its version number says."""

    @classmethod
    def of(
        cls,
        model: ModelSettings,
        agent: AgentSettings,
        provider: SandboxProvider,
        escalate_to: Sequence[ModelSettings] = (),
    ) -> RunConfig:
        """The configuration of a run with these settings and sandboxes; `model` as configured (base_url None for
        the embedded model, before its address is known), `agent.policy` resolved (`resolve_policy`);
        `escalate_to`: the endpoints tried after `model`, in order."""
        from bugsweep import __version__
        from bugsweep.settings import SandboxSettings

        if agent.policy is None:
            raise ValueError("resolve the policy (runconfig.resolve_policy) before making a RunConfig")
        sandbox = getattr(provider, "settings", None) or SandboxSettings()
        runtime = getattr(provider, "runtime_settings", None)
        limits = sandbox.model_dump(include=set(SandboxLimits.model_fields))
        return cls(
            model=ModelConfig.of(model, agent),
            escalate_to=[ModelConfig.of(later, agent) for later in escalate_to],
            policy=agent.policy,
            agent=agent.model_dump(mode="json", exclude={"policy"}),
            sandbox=SandboxConfig(
                backend=provider.name,
                workdir=sandbox.workdir,
                runtime=runtime.model_dump(include=RUNTIME_FIELDS) if runtime is not None else None,
                **limits,
            ),
            environment=EnvironmentConfig(
                python=f"{platform.python_implementation()} {platform.python_version()}"
            ),
            bugsweep_version=__version__,
            bugsweep_code=code_digest(),
        )

    def without_code(self) -> dict[str, Any]:
        """This configuration as JSON with the code left out: two that are equal here differ only in the bugsweep
        that made them (a grade made before an upgrade)."""
        return self.model_dump(mode="json", exclude=CODE_FIELDS)

    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        """12 hex digits of the SHA-256 of the canonical JSON: the same settings give the same digest anywhere."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:12]


def describe_config(grade: Any) -> str:
    """One line for summaries: a grade's configuration digest, and what most often differs between two."""
    config = grade.config or {}
    model, agent = config.get("model", {}), config.get("agent", {})
    attempts = agent.get("attempts") or 1
    later = [str(m.get("model")) for m in config.get("escalate_to") or []]
    return (
        f"{grade.config_digest}: {model.get('model', grade.model)}, policy {config.get('policy', grade.policy)}, "
        f"{agent.get('max_turns')} turns, temperature {model.get('temperature')}"
        + (
            f", {attempts} attempts (then temperature {agent.get('retry_temperature')})"
            if attempts > 1
            else ""
        )
        + (f", then {', then '.join(later)}" if later else "")
    )
