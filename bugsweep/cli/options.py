"""Options that several commands share, made from the one declaration of a run's settings (bugsweep/runconfig.py).

`with_limit_options` gives a command one option per field of `AgentLimits` (`--max-turns`, `--max-total-tokens`,
`--max-cost-usd`, `--max-wall-s`, `--per-test-timeout-s`, `--policy`), with the field's own description as its
help, so the command line offers what the flows' `limits` parameter and BUGSWEEP_* offer, and nothing is kept in
step by hand. An option not given is unset: the run takes BUGSWEEP_* where set, else the default
(bugsweep.runbuilder). Only pydantic is imported for them (not prefect, openai or boto3): `bugsweep --help` stays
fast.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any, get_args

import annotated_types
import typer
from pydantic import ValidationError

from bugsweep.runconfig import AgentChoices, AgentLimits, unset_means

#: Older spellings, still accepted.
ALIASES = {"max_cost_usd": ("--max-cost",)}


def option_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def limit_parameters(note: str) -> list[inspect.Parameter]:
    """One keyword parameter per AgentLimits field, its typer option made from the field (type, bounds, help)."""
    params = []
    for name, field in AgentLimits.model_fields.items():
        kind: Any = next((a for a in get_args(field.annotation) if a is not type(None)), field.annotation)
        low: Any = None  # typer checks the lower bounds (inclusive); pydantic the rest, below
        for rule in field.metadata:
            if isinstance(rule, annotated_types.Ge):
                low = rule.ge
            elif isinstance(rule, annotated_types.Gt) and kind is int:
                low = int(rule.gt) + 1  # type: ignore[call-overload]
        help_text = f"{' '.join((field.description or '').split())} {unset_means(name)} {note}".strip()
        option = typer.Option(option_name(name), *ALIASES.get(name, ()), help=help_text, min=low)
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[kind | None, option]
            )
        )
    return params


def with_limit_options(note: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a command taking `limits: AgentChoices`: its options become one per AgentLimits field, and the
    command gets an AgentChoices of the values given (None where an option was not given). `note` is added to each
    option's help (e.g. "Per task.")."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "limits"]
        added = limit_parameters(note)

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            given = {p.name: kwargs.pop(p.name) for p in added}
            try:
                limits = AgentChoices(**{k: v for k, v in given.items() if v is not None})
            except ValidationError as exc:
                problem = exc.errors()[0]
                raise typer.BadParameter(
                    problem["msg"], param_hint=option_name(str(problem["loc"][0]))
                ) from None
            return command(**kwargs, limits=limits)

        del wrapper.__wrapped__  # typer reads the signature below, not the command's own
        wrapper.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in [*own, *added]}
        return wrapper

    return decorate


def print_table(console: Any, table: Any) -> None:
    """A rich table whole: at a terminal, as wide as the terminal; into a file or a pipe (a log, a CI job), as wide
    as its content, so that no name, digest or path is cut or broken across lines for the reader who greps it."""
    from rich.console import Console

    stream = console.file
    if getattr(stream, "isatty", None) and stream.isatty():
        console.print(table)
    else:  # a console of its own: print(width=...) can only narrow a console, never widen it
        Console(file=stream, width=1000, highlight=False, color_system=None).print(table)


#: `--specs` of `sweep` and `compare`: where a task file's SWE-bench records get their commands.
SpecsOption = Annotated[
    str | None,
    typer.Option(
        help="For SWE-bench records (lines without test_command): the JSON file of setup and test commands per "
        "repository and version (a path or s3://; docs/tasks-jsonl.md). Default: TASKS.specs.json beside the "
        "task file."
    ),
]
#: `--repos-from` of `sweep` and `compare`: where SWE-bench records' owner/name repositories come from.
ReposFromOption = Annotated[
    str,
    typer.Option(
        help="For SWE-bench records: a base URL their owner/name repositories are cloned from, or a local folder "
        "holding owner__name or owner/name clones."
    ),
]

#: `--added-within-days` of `sweep` and `compare`: only a growing benchmark's recent tasks.
AddedWithinOption = Annotated[
    float | None,
    typer.Option(
        min=0.001,
        help="Only the tasks a growing benchmark added in the last N days (their added_at, set by the "
        "grow-benchmark flow), so that a model is judged on bugs it cannot have seen in training. Default: every "
        "task.",
    ),
]


def task_file(tasks: str, specs: str | None, repos_from: str, added_within_days: float | None = None) -> Any:
    """The `discover.TaskFile` of `--tasks`, `--specs` and `--repos-from`, local paths made absolute (a flow or
    a worker may run elsewhere). A local task file is read here, so that a bad line stops the command at once
    (BadTaskFile: one line naming the line and the field), before any Prefect server starts."""
    from pathlib import Path

    from bugsweep.discover import TaskFile, swe_bench_records
    from bugsweep.sandbox.sources import is_git_url
    from bugsweep.spec import parse_tasks
    from bugsweep.storage import read_text

    def absolute(location: str) -> str:
        return location if location.startswith("s3://") else str(Path(location).expanduser().resolve())

    local_repos = not is_git_url(repos_from)
    source = TaskFile(
        path=absolute(tasks),
        specs=absolute(specs) if specs else None,
        repos_from=absolute(repos_from) if local_repos else repos_from,
        added_within_days=added_within_days,
    )
    if not source.path.startswith("s3://"):
        parse_tasks(read_text(source.path), source=tasks, records=swe_bench_records(source))
    return source
