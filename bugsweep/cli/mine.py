"""Command-line commands (placeholder: filled in by the issue that owns this group)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
