"""Options that several commands share, declared once. Nothing heavy is imported here: `bugsweep --help` stays fast."""

from __future__ import annotations

from typing import Any, Literal

import typer

PolicyChoice = Literal["plain", "small-model"] | None
"""The --policy choices: the names of bugsweep.settings.PolicyName, spelt out so that pydantic is not imported for
`--help` (a test checks that the two agree)."""

EMBEDDED_OR_PLAIN = "BUGSWEEP_POLICY, else 'small-model' for the embedded model and 'plain' for any other"


def policy_option(default: str) -> Any:
    """The --policy option, saying what its default is for this command."""
    return typer.Option(
        help="What the harness does for the model beyond the plain loop (bugsweep/agent/policy.py): 'plain', or "
        "'small-model' (whole-function edits tried against the tests, failed edits dropped from the history). "
        f"Default: {default}. Recorded in grade.json and every report."
    )
