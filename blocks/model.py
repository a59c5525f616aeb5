"""The model endpoint as a Prefect block: where the agent's model lives, its key, and what its tokens cost."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import ConfigDict, Field, SecretStr

from blocks.schema import reference_is_not_a_block
from bugsweep.runconfig import ModelFields
from bugsweep.settings import ModelSettings


class ModelEndpoint(Block, ModelFields):
    """An OpenAI-compatible chat endpoint with tool calling (DeepSeek, Qwen, OpenRouter, vLLM, llama.cpp, ...).

    Its fields are bugsweep.runconfig.ModelFields, the ones LLM_* sets (declared once), and the key. The API key is
    stored encrypted by Prefect and never shown in the UI, the logs or a flow run's parameters: flows take the
    block's name, not the key.
    """

    model_config = ConfigDict(json_schema_extra=reference_is_not_a_block("model"))

    _block_type_name = "bugsweep model endpoint"
    _description = (
        "An OpenAI-compatible model endpoint (base URL, model, API key, prices) for the bugsweep agent."
    )

    api_key: SecretStr = Field(
        default=SecretStr(""), description="API key (empty for servers that need none)."
    )

    def settings(self) -> ModelSettings:
        """The core's ModelSettings for this endpoint (what the agent loop takes)."""
        return ModelSettings.of_endpoint(self, self.api_key)

    @classmethod
    def from_settings(cls, settings: ModelSettings) -> ModelEndpoint:
        """A block holding the same endpoint as `settings` (e.g. read from LLM_* variables)."""
        if not settings.base_url:
            raise ValueError("the model settings have no base URL (set LLM_BASE_URL)")
        return cls(**settings.model_dump(include={*ModelFields.model_fields, "api_key"}))
