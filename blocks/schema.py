"""The JSON schema of a block whose fields all have defaults, made so that a reference to a saved block is not
also a valid block itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect.blocks.core import schema_extra as block_schema_extra


def reference_is_not_a_block(field: str) -> Callable[[dict[str, Any], Any], None]:
    """Block's own schema additions, and `field` (one that always has a value) required in the JSON schema.

    A saved block reaches a run as `{"$ref": {"block_document_id": ...}}`, and Prefect checks a run's parameters
    (the UI's run form before Submit, the server for a deployment's defaults) against a oneOf of the block and such
    a reference. With every field optional, the reference is a valid block too, a oneOf refuses a value valid both
    ways, and a block chosen in the run form could never be submitted. Python's validation is unchanged.
    """

    def extra(schema: dict[str, Any], model: Any) -> None:
        block_schema_extra(schema, model)
        schema["required"] = sorted({*schema.get("required", []), field})

    return extra
