"""The model endpoint as a Prefect block: where the agent's model lives, its key, and what its tokens cost."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from bugsweep.settings import ModelSettings


class ModelEndpoint(Block):
    """An OpenAI-compatible chat endpoint with tool calling (DeepSeek, Qwen, OpenRouter, vLLM, llama.cpp, ...).

    The API key is stored encrypted by Prefect and never shown in the UI, the logs or a flow run's parameters:
    flows take the block's name, not the key.
    """

    _block_type_name = "bugsweep model endpoint"
    _description = (
        "An OpenAI-compatible model endpoint (base URL, model, API key, prices) for the bugsweep agent."
    )

    base_url: str = Field(description="OpenAI-compatible base URL, e.g. https://api.deepseek.com/v1.")
    model: str = Field(description="Model name sent with every request.")
    api_key: SecretStr = Field(
        default=SecretStr(""), description="API key (empty for servers that need none)."
    )
    price_prompt_per_mtok: float = Field(default=0.0, description="USD per million prompt tokens.")
    price_completion_per_mtok: float = Field(default=0.0, description="USD per million completion tokens.")
    price_cached_prompt_per_mtok: float | None = Field(
        default=None, description="USD per million cached prompt tokens; empty: the prompt price."
    )
    request_timeout_s: float = Field(default=600.0, description="Seconds to wait for one reply.")
    max_tokens_per_reply: int = Field(default=1024, description="Cap on completion tokens per reply.")
    temperature: float = Field(default=0.0, description="Sampling temperature.")

    def settings(self) -> ModelSettings:
        """The core's ModelSettings for this endpoint (what the agent loop takes)."""
        return ModelSettings(**self.model_dump(include=set(ModelSettings.model_fields)))

    @classmethod
    def from_settings(cls, settings: ModelSettings) -> ModelEndpoint:
        """A block holding the same endpoint as `settings` (e.g. read from LLM_* variables)."""
        if not settings.base_url:
            raise ValueError("the model settings have no base URL (set LLM_BASE_URL)")
        return cls(**settings.model_dump(include=set(cls.model_fields) - {"block_document_id"}))
