"""The `bugsweep` command line. Each command group lives in its own module and registers itself here.

Heavy imports (prefect, openai, boto3) happen inside the commands, so `bugsweep --help` stays fast.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys

import typer

from bugsweep.cli import compare, mine, model, pipeline, review, run, sandboxes, solve

app = typer.Typer(
    rich_markup_mode=None,  # plain help: option names whole at any width, in a terminal or not
    name="bugsweep",
    help="A coding agent for open models that fixes real bugs in a sandbox and grades its own work.\n\n"
    "The model comes from LLM_BASE_URL, LLM_MODEL and LLM_API_KEY (any OpenAI-compatible endpoint with tools); "
    "with no LLM_BASE_URL the embedded open model is started on this machine.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for _module in (solve, model, sandboxes, pipeline, run, mine, compare, review):
    _module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Run a command. Whatever is not the model's failure (bad arguments or settings, bugsweep's own errors, a
    crash) ends with one line and exit code 2, never a traceback on the terminal (see exits.py). Usage errors and
    Ctrl-C are typer's: exit 2 with its message, and 130."""
    from pydantic import ValidationError

    from bugsweep.cli.exits import could_not_run, crashed, is_settings, settings_problem
    from bugsweep.errors import BugsweepError, ConfigError

    # Prefect flushes its client events as a command exits and, when that takes a moment, warns "Still processing
    # items" on a run that went well: noise, not news.
    logging.getLogger("EventsWorker").setLevel(logging.ERROR)
    # `kill -USR1 PID` prints every thread's stack to stderr and the command goes on: what a run that seems stuck
    # is waiting for
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        app(args=argv)
    except BugsweepError as exc:
        sys.exit(could_not_run(str(exc), "configuration" if isinstance(exc, ConfigError) else exc.kind))
    except ValidationError as exc:  # bad settings (LLM_*, BUGSWEEP_*); any other is a crash
        sys.exit(could_not_run(settings_problem(exc), "configuration") if is_settings(exc) else crashed(exc))
    except Exception as exc:
        sys.exit(crashed(exc))
