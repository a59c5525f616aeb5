"""`bugsweep mine`: tasks from a repository's git history.

It writes the same tasks.jsonl that `bugsweep sweep` and `bugsweep compare` run (schema: docs/tasks-jsonl.md).
Exit codes: 0 done, 1 mining found no task, 2 could not run (bad arguments, unreachable repository, ...).
"""

from __future__ import annotations

import functools
import signal
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bugsweep.cli.options import print_table

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


def register(app: typer.Typer) -> None:
    """Add `mine` to the main app."""
    app.command("mine")(mine_command)


def mine_command(
    repo: Annotated[
        str, typer.Argument(help="Local path (checkout or bare) or git URL of the repository to mine.")
    ],
    limit: Annotated[int, typer.Option(help="Stop after this many validated tasks.")] = 10,
    since: Annotated[
        str | None,
        typer.Option(
            help="Only commits after this date: 2024-01-31, 2024-01-31T12:00, or an age (6 months ago)."
        ),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Only commits before this date (same forms as --since).")
    ] = None,
    branch: Annotated[
        str | None, typer.Option(help="Branch or ref to walk back from (default: HEAD).")
    ] = None,
    test_command: Annotated[
        str | None,
        typer.Option(
            help="Test command for every task (default: python -m pytest -q <changed test modules>). "
            "'{test_files}' in it is replaced by the changed test modules."
        ),
    ] = None,
    setup_command: Annotated[
        str | None,
        typer.Option(help="Setup command (default: detected, e.g. 'pip install -e .'); '' for none."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Where to write the tasks (JSON Lines).")] = Path("tasks.jsonl"),
    runs: Annotated[
        int, typer.Option(help="Test runs before and after the fix; tests that change outcome are flaky.")
    ] = 3,
    max_candidates: Annotated[
        int | None, typer.Option(help="Look at no more than this many commits (default: the whole history).")
    ] = None,
    sandbox: Annotated[
        str, typer.Option(help="Sandbox backend for validation: 'local' or 'runtime'.")
    ] = "local",
    name: Annotated[
        str | None, typer.Option(help="Prefix of the instance ids (default: the repository's name).")
    ] = None,
    concurrency: Annotated[
        int, typer.Option(help="Candidates validated at once, each in its own sandboxes.")
    ] = 1,
    merges: Annotated[
        bool,
        typer.Option(
            "--merges",
            help="Take merged pull requests instead of single commits: each merge commit of the branch with its "
            "whole change, the PR title as the task (for projects whose PRs split the fix and its test).",
        ),
    ] = False,
    out_format: Annotated[
        str,
        typer.Option(
            "--format",
            help="'bugsweep' (the task file of docs/tasks-jsonl.md) or 'swe-bench': SWE-bench records, with their "
            "setup and test commands in <out>.specs.json beside them (sweep them back with --specs).",
        ),
    ] = "bugsweep",
    slug: Annotated[
        str | None,
        typer.Option(
            help="With --format swe-bench: the records' repo, OWNER/NAME (default: from the URL, a folder named "
            "owner__name, or the folder's parent and name)."
        ),
    ] = None,
) -> None:
    """Find bug-fix commits with tests in REPO's history and turn them into validated tasks.

    A candidate is a commit (newest first, no merges) that changes a test module and a source file and whose message
    reads like a fix (fix, bug, error, regression, crash, "closes #12" in the subject, ...; a feat:, refactor:,
    chore: ... subject only if it says fix). Its task starts at the parent commit with the commit's test files copied
    in; it is kept when the changed tests fail there and pass at the commit, in every one of --runs runs. Flaky
    tests are reported and left out of the task's test command. Ctrl-C or a test command that is not found stops
    the run and still writes the report (<out>.mining.json). Exit codes: 0 tasks found, 1 none, 2 could not run.
    """
    from bugsweep.errors import BugsweepError
    from bugsweep.mining import CommandNotFound, MiningEvent, MiningResult, mine, parse_date
    from bugsweep.sandbox import get_provider
    from bugsweep.spec import dump_tasks
    from bugsweep.swebench import dump_records, specs_beside

    if limit < 1 or runs < 1 or concurrency < 1:
        _fail("--limit, --runs and --concurrency must be at least 1")
    if out_format not in ("bugsweep", "swe-bench"):
        _fail(f"--format {out_format!r}: choose 'bugsweep' or 'swe-bench'")
    if slug is not None and out_format != "swe-bench":
        _fail("--slug names the repository of SWE-bench records: give it with --format swe-bench")
    write = dump_tasks
    if out_format == "swe-bench":
        try:
            write = functools.partial(dump_records, slug=swebench_slug(slug, repo))
        except BugsweepError as exc:
            _fail(str(exc))
    try:
        for option, value in (("--since", since), ("--until", until)):
            if value is not None:
                parse_date(value, option)
    except BugsweepError as exc:
        _fail(str(exc))
    report_path = out.with_name(out.stem + ".mining.json")
    signal.signal(
        signal.SIGTERM, _interrupt
    )  # `kill` ends the run as Ctrl-C does: report written, sandboxes freed
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # progress lines show up at once through a pipe or `tee`

    def show(event: MiningEvent) -> None:
        sha, subject = event.commit[:10], escape(event.subject[:70])
        where = f"[dim][{event.done}/{event.total}][/] "
        if event.kind == "validate":
            console.print(f"{where}[cyan]validate[/] {sha} {subject}  [dim]({escape(event.message)})[/]")
        elif event.kind == "kept":
            console.print(f"{where}[green bold]kept[/]     {sha} {subject}  [dim]{escape(event.message)}[/]")
        elif event.kind == "rejected":
            console.print(f"{where}[dim]skip     {sha} {subject}: {escape(event.message)}[/]")

    console.print(
        f"[bold]mining[/] {escape(repo)} for up to {limit} task(s), {runs} run(s) per state "
        "[dim](\\[decided/commits in range])[/]"
    )
    result: MiningResult | None = None
    try:
        result = mine(
            repo,
            provider=get_provider(sandbox),
            limit=limit,
            since=since,
            until=until,
            branch=branch,
            test_command=test_command,
            setup_command=setup_command,
            runs=runs,
            max_candidates=max_candidates,
            out=out,
            report=report_path,
            on_progress=show,
            task_prefix=name,
            merges=merges,
            concurrency=concurrency,
            write=write,
        )
    except CommandNotFound as exc:
        _fail(f"{exc}\nmining stopped; what was done is in {report_path}")
    except BugsweepError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        err.print(
            f"[red]interrupted[/]: tasks kept so far are in {out if out.exists() else '(none kept)'}; "
            f"every commit decided, and the unfinished ones, in {report_path}"
        )
        raise typer.Exit(130) from None

    minutes = max(result.elapsed_s / 60, 1e-9)
    console.print(
        f"\n[bold]{len(result.tasks)} task(s)[/] from {result.scanned} commits scanned, {result.validated} validated, "
        f"in {result.elapsed_s:.0f} s ({result.scanned / minutes:.0f} commits/min, "
        f"{result.validated / minutes:.1f} validations/min)"
    )
    table = Table("rejected because", "commits", box=None)
    for reason, count in result.reasons().items():
        table.add_row(reason, str(count))
    if result.rejected:
        print_table(console, table)
    for sha, tests in result.flaky_tests.items():
        console.print(f"[yellow]flaky[/] at {sha[:10]}: {escape(', '.join(tests[:5]))}")
    written = f"{out}" if result.tasks else "(none written)"
    if result.tasks and out_format == "swe-bench":
        written += f" (SWE-bench records; their commands: {specs_beside(str(out))})"
    console.print(f"tasks: {written}; every candidate and why: {report_path}")
    raise typer.Exit(0 if result.tasks else 1)


def swebench_slug(slug: str | None, repo: str) -> str:
    """The records' `repo`: --slug as given (checked), or made from REPO."""
    from bugsweep.errors import ConfigError
    from bugsweep.swebench import is_slug, slug_of

    if slug is None:
        return slug_of(repo)
    if not is_slug(slug):
        raise ConfigError(f"--slug {slug!r}: expected OWNER/NAME")
    return slug


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _fail(message: str) -> NoReturn:
    err.print(f"[red bold]error[/]: {escape(message)}")
    raise typer.Exit(2)
