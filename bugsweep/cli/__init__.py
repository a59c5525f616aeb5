"""The `bugsweep` command line. Each command group lives in its own module and registers itself here.

Heavy imports (prefect, openai, boto3) happen inside the commands, so `bugsweep --help` stays fast.
"""

from __future__ import annotations

import typer

from bugsweep.cli import compare, mine, model, pipeline, sandboxes, solve

app = typer.Typer(
    name="bugsweep",
    help="A coding agent for open models that fixes real bugs in a sandbox and grades its own work.\n\n"
    "The model comes from LLM_BASE_URL, LLM_MODEL and LLM_API_KEY (any OpenAI-compatible endpoint with tools); "
    "with no LLM_BASE_URL the embedded open model is started on this machine.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for _module in (solve, model, sandboxes, pipeline, mine, compare):
    _module.register(app)


def main() -> None:
    app()
