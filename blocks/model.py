"""The model endpoint as a Prefect block: where the agent's model lives, its key, and what its tokens cost."""

from __future__ import annotations

from typing import Any

from prefect.blocks.core import Block
from prefect.blocks.core import schema_extra as block_schema_extra
from pydantic import ConfigDict, Field, SecretStr

from bugsweep.runconfig import ModelFields
from bugsweep.settings import ModelSettings


def _schema_a_reference_is_not(schema: dict[str, Any], model: Any) -> None:
    """Block's own schema additions, and the model name required in the JSON schema (it always has a value).

    A saved block reaches a run as `{"$ref": {"block_document_id": ...}}`, and Prefect checks a run's parameters
    (the UI's run form before Submit, the server for a deployment's defaults) against a oneOf of the block and such
    a reference. With every field optional, the reference is a valid ModelEndpoint too, a oneOf refuses a value
    valid both ways, and a block chosen in the run form could never be submitted. Python's validation is unchanged.
    """
    block_schema_extra(schema, model)
    schema["required"] = sorted({*schema.get("required", []), "model"})


class ModelEndpoint(Block, ModelFields):
    """An OpenAI-compatible chat endpoint with tool calling (DeepSeek, Qwen, OpenRouter, vLLM, llama.cpp, ...).

    Its fields are bugsweep.runconfig.ModelFields, the ones LLM_* sets (declared once), and the key. The API key is
    stored encrypted by Prefect and never shown in the UI, the logs or a flow run's parameters: flows take the
    block's name, not the key.
    """

    model_config = ConfigDict(json_schema_extra=_schema_a_reference_is_not)

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
