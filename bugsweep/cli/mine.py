"""`bugsweep mine`: tasks from a repository's git history.

It writes the same tasks.jsonl that `bugsweep sweep` and `bugsweep compare` run (schema: docs/tasks-jsonl.md).
Exit codes: 0 done, 1 mining found no task, 2 could not run (bad arguments, unreachable repository, a test command
that cannot run anywhere, ...), 130 after Ctrl-C, 143 after SIGTERM.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bugsweep.cli.exits import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, sigterm_as_interrupt
from bugsweep.cli.options import print_table
from bugsweep.runconfig import BACKEND_UNSET, AgentLimits

if TYPE_CHECKING:
    from bugsweep.mining import MiningResult

#: `--per-test-timeout-s` defaults to the graded runs' setting of the same name (one declaration).
_PER_TEST = AgentLimits.model_fields["per_test_timeout_s"]

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # one line stays one line


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
        str | None,
        typer.Option(help=f"Sandbox backend for validation: 'local' or 'runtime'. {BACKEND_UNSET}"),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Prefix of the instance ids (default: the repository's name).")
    ] = None,
    concurrency: Annotated[
        int, typer.Option(help="Candidates validated at once, each in its own sandboxes.")
    ] = 1,
    per_test_timeout_s: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds one test (its setup, call and teardown) may take in a validation run, as in grading "
            "(per_test_timeout_s): a test still running then is stopped and fails, and the rest of the run goes "
            "on, so a test that hangs at the task state and passes at the fix is FAIL_TO_PASS (a fix of an endless "
            "loop is a task); one that catches the stop each time is ended with its process once it has gone on "
            "as long again (at most 10 s), and the rest run again without it. A run that reaches its own timeout "
            "(900 s) after tests ran on to this limit goes on without them, up to three timeouts in all. 0: no "
            "per-test limit, only the whole run's timeout.",
        ),
    ] = _PER_TEST.default,
    merges: Annotated[
        bool,
        typer.Option(
            "--merges",
            help="Take merged pull requests instead of single commits: each merge commit of the branch with its "
            "whole change, the PR title as the task (for projects whose PRs split the fix and its test).",
        ),
    ] = False,
    older_python: Annotated[
        bool,
        typer.Option(
            "--older-python/--no-older-python",
            help="A commit older than the Python bugsweep runs on (the newest Python its classifiers or tox "
            "environments name is older; naming none, it predates that Python's release) whose environment failed "
            "(setup failed, its tests could not run or failed at the commit) is validated again on an older "
            "interpreter of this machine (python3.X on PATH, pyenv's, uv's; 3.8 and newer): the newest that the "
            "commit names. One whose package requires a newer Python (requires-python, python_requires) is "
            "validated again on the oldest newer interpreter it allows. Kept there, its task names that interpreter "
            "('python'). Failing there too (or with none to try), it is validated once more there (or on the running "
            "Python) with only the releases the package index had at its time (UV_EXCLUDE_NEWER in its setup). "
            "Local sandbox only.",
        ),
    ] = True,
    unreleased_fixes: Annotated[
        bool,
        typer.Option(
            "--unreleased-fixes/--no-unreleased-fixes",
            help="Also take commits that mend work since the last release (more than half of the lines they "
            "change came after the newest version tag before them). By default they are no fix: 'own unreleased "
            "work' when their author wrote at least half of those lines (iterations on work in progress, whose "
            "behaviour no user of a release met), 'others' unreleased work' otherwise (as often a fix of a "
            "regression or of an unreleased feature as of a bug the release had). Recorded in the report "
            "(unreleased_fixes).",
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
    reads like a fix by its words and its whole change (docs/tasks-jsonl.md, "Screening"; a feat:, refactor:,
    chore: ... subject only if it says fix; not one mending work since the last release tag, unless
    --unreleased-fixes; one change made by two commits, a fix backported to a branch merged back, is one
    candidate: the commit on the branch's own line). Its task starts at the parent commit with the commit's test files copied
    in; it is kept when the changed tests fail there and pass at the commit, in every one of --runs runs. Flaky
    tests, and tests that fail at both states, are reported and left out of the task's test command. Each kept
    task says why the screen took it for a fix (screen_rule, screen_reason), in its line here and in the files. Each validated candidate's line says whether its
    task environments were built (the setup ran) or reused; the summary counts both.

    The task file is written at the end (empty when nothing was kept; a run stopped before it kept a task leaves
    it as it was), and the report (<out>.mining.json) however the run ends. A test command that cannot run for any candidate (its program not found, or `python -m`
    of a module the setup did not install) stops the run at the first candidate, with exit code 2.
    Exit codes: 0 tasks found, 1 none, 2 could not run, 130 Ctrl-C, 143 SIGTERM.
    """
    from bugsweep.errors import BugsweepError
    from bugsweep.mining import CommandNotFound, MiningEvent, MiningResult, mine, parse_date
    from bugsweep.runbuilder import sandbox_provider
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
    if not out.parent.is_dir():
        _fail(f"--out {out}: the folder {out.parent} does not exist")
    report_path = out.with_name(out.stem + ".mining.json")
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # progress lines show up at once through a pipe or `tee`

    def show(event: MiningEvent) -> None:
        sha, subject = event.commit[:10], escape(event.subject[:70])
        where = f"[dim][{event.done}/{event.total}][/] "
        envs = f" [dim](environment {escape(event.environments)})[/]" if event.environments else ""
        if event.kind == "validate":
            console.print(f"{where}[cyan]validate[/] {sha} {subject}  [dim]({escape(event.message)})[/]")
        elif event.kind == "kept":
            console.print(
                f"{where}[green bold]kept[/]     {sha} {subject}  [dim]{escape(event.message)}[/]{envs}"
            )
        elif event.kind == "rejected":
            console.print(f"{where}[dim]skip     {sha} {subject}: {escape(event.message)}[/]{envs}")

    console.print(
        f"[bold]mining[/] {escape(repo)} for up to {limit} task(s), {runs} run(s) per state "
        "[dim](\\[decided/commits in range])[/]"
    )
    result = MiningResult(repo=repo)  # filled in as the run goes: what it wrote is known however it ends
    try:
        with sigterm_as_interrupt():  # `kill` stops the run as Ctrl-C does: files written, sandboxes freed
            result = mine(
                repo,
                provider=sandbox_provider(sandbox),
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
                per_test_timeout=per_test_timeout_s or None,
                older_python=older_python,
                unreleased_fixes=unreleased_fixes,
                result=result,
                write=write,
            )
    except CommandNotFound as exc:
        _fail(f"{exc}. Mining stopped there: {_written(result, out)}")
    except BugsweepError as exc:
        _fail(str(exc))
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        err.print(
            f"[red]{'terminated (SIGTERM)' if terminated else 'interrupted (Ctrl-C)'}[/]: "
            f"{escape(_written(result, out))}"
        )
        raise typer.Exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED) from None

    minutes = max(result.elapsed_s / 60, 1e-9)
    console.print(
        f"\n[bold]{len(result.tasks)} task(s)[/] from {result.scanned} commits scanned, {result.validated} validated, "
        f"in {result.elapsed_s:.0f} s ({result.scanned / minutes:.0f} commits/min, "
        f"{result.validated / minutes:.1f} validations/min); task environments: "
        f"{result.environments_built} built, {result.environments_reused} reused"
        + (f"; {len(result.older_python)} kept on an older Python" if result.older_python else "")
    )
    table = Table("rejected because", "commits", box=None)
    for reason, count in result.reasons().items():
        table.add_row(reason, str(count))
    if result.rejected:
        print_table(console, table)
    for sha, tests in result.flaky_tests.items():
        console.print(f"[yellow]flaky[/] at {sha[:10]}: {escape(', '.join(tests[:5]))}")
    for sha, tests in result.out_of_memory.items():
        console.print(
            f"[yellow]stopped at the per-test memory bound[/] at {sha[:10]} (failed there): {escape(', '.join(tests[:5]))}"
        )
    for sha, tests in result.failing_in_both.items():
        more = f" and {len(tests) - 5} more" if len(tests) > 5 else ""
        console.print(
            f"[yellow]failing in both states[/] at {sha[:10]} (left out of the task, deselected): "
            f"{escape(', '.join(tests[:5]))}{more}"
        )
    written = f"{out} ({len(result.tasks)})"
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


def _written(result: MiningResult, out: Path) -> str:
    """What a stopped run left behind, naming as written only the files it wrote."""
    if result.tasks_file:
        said = [f"{len(result.tasks)} task(s) kept so far are in {result.tasks_file}"]
    else:
        said = [f"no task was kept, and {out} was not written"]
    if result.report_file:
        said.append(f"every commit decided, and the unfinished ones, in {result.report_file}")
    return "; ".join(said)


def _fail(message: str) -> NoReturn:
    err.print(f"[red bold]error[/]: {escape(message)}")
    raise typer.Exit(2)
