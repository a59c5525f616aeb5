"""`bugsweep compare`: models side by side on the same tasks, through the compare-models flow.

It runs the tasks.jsonl that `bugsweep mine` writes (schema: docs/tasks-jsonl.md).
Exit codes: 0 done, 2 could not run (bad arguments, a missing key variable, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bugsweep.cli.options import (
    AddedWithinOption,
    ReposFromOption,
    SpecsOption,
    print_table,
    task_file,
    with_limit_options,
)
from bugsweep.runconfig import (
    BACKEND_UNSET,
    AgentChoices,
)  # at run time: with_limit_options reads the annotations

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


def register(app: typer.Typer) -> None:
    """Add `compare` to the main app."""
    app.command("compare")(compare_command)


@with_limit_options("Per run; the same for every model, unless --model-set or --model-policy says otherwise.")
def compare_command(
    tasks: Annotated[
        str,
        typer.Option(
            help="tasks.jsonl (from `bugsweep mine`, or by hand, or SWE-bench records); a path or s3://..."
        ),
    ],
    model: Annotated[
        list[str],
        typer.Option(
            help="NAME=BASE_URL[,KEY_ENV[,MODEL_ID]], once per model. The API key is read from the environment "
            "variable KEY_ENV, never printed; MODEL_ID (default NAME) is the model name sent to the endpoint."
        ),
    ],
    runs: Annotated[int, typer.Option(help="Runs of every model on every task.")] = 3,
    concurrency: Annotated[int, typer.Option(help="Runs (sandboxes) at once.")] = 4,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for report.md/.json/.html (default: the comparison's folder in the artifact store's local folder)."
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(help="Name of the comparison, the runs' folder (default: compare-<tasks file>)."),
    ] = None,
    price: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=PROMPT,COMPLETION: a model's USD per million prompt and completion tokens, for the cost "
            "column and --max-cost (default 0, as for a self-hosted model)."
        ),
    ] = None,
    sandbox: Annotated[
        str | None,
        typer.Option(help=f"Sandbox backend: 'local' (bubblewrap) or 'runtime'. {BACKEND_UNSET}"),
    ] = None,
    model_policy: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=POLICY: run this one model under another policy (the report then says the models ran "
            "under different harnesses)."
        ),
    ] = None,
    model_set: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME:SETTING=VALUE: one setting of this entry only, an agent limit or an endpoint setting (e.g. "
            "small:max_turns=20, hot:temperature=0.7). Two entries of one model with different settings are two "
            "configurations side by side."
        ),
    ] = None,
    specs: SpecsOption = None,
    repos_from: ReposFromOption = "https://github.com",
    added_within_days: AddedWithinOption = None,
    *,
    limits: AgentChoices,
) -> None:
    """Run every model on every task --runs times, each run in its own sandbox, and compare resolve rates.

    Runs the compare-models Prefect flow (set PREFECT_API_URL to watch it in your Prefect UI; otherwise a temporary
    Prefect server is started for the command and stopped after it, its log in a file). Every run is graded as in a sweep and stored as NAME/TASK/ENTRY/CONFIG/run-N in the
    artifact store (CONFIG: the digest of the entry's configuration) (BUGSWEEP_STORE_URL, default ./artifacts). The report (report.md, report.json and report.html,
    one self-contained page with a chart) gives each model's resolve rate with a 95% confidence interval, paired
    per-task differences between models, turns, tokens, cost and time.
    """
    from bugsweep.cli.pipeline import prefect_server
    from bugsweep.errors import BugsweepError

    if runs < 1 or concurrency < 1:
        _fail("--runs and --concurrency must be at least 1")
    if sandbox not in (None, "local", "runtime"):
        _fail(f"--sandbox {sandbox!r}: choose 'local' or 'runtime'")
    try:
        from flows.compare import ModelEntry, compare

        entries = [ModelEntry.parse(m) for m in model]
        apply_prices(entries, price or [])
        apply_settings(entries, model_policy or [], "--model-policy", "NAME=POLICY")
        apply_settings(entries, model_set or [], "--model-set", "NAME:SETTING=VALUE")
        for entry in entries:
            entry.settings()  # fails now, not thirty runs later, when a key variable is missing
        same_attempts_setting(entries, limits)  # before a Prefect server starts or anything runs
        if not tasks.startswith("s3://") and not Path(tasks).is_file():
            _fail(f"--tasks {tasks!r}: no such file")
        source = task_file(tasks, specs, repos_from, added_within_days)
        console.print(
            f"[bold]comparing[/] {', '.join(escape(e.name) for e in entries)} on {escape(tasks)}, "
            f"{runs} run(s) each, {concurrency} at once"
        )
        with prefect_server():
            report = compare(
                source,
                entries,
                runs=runs,
                concurrency=concurrency,
                report_dir=out,
                name=name,
                sandbox=sandbox,  # type: ignore[arg-type]
                limits=limits,
            )
    except BugsweepError as exc:
        _fail(str(exc))
    from bugsweep.report import policy_note, summary_rows

    header, rows = summary_rows(report)
    table = Table()
    for column in header:
        table.add_column(column, overflow="fold")  # whole digests and names in a narrow log file, never cut
    for row in rows:
        table.add_row(*(escape(c) for c in row))
    print_table(console, table)
    for p in report.pairs:
        console.print(
            f"{escape(p.a)} - {escape(p.b)}: {100 * p.mean_diff:+.0f} points per task "
            f"(95% CI {100 * p.ci_low:+.0f} to {100 * p.ci_high:+.0f}; sign test p={p.sign_test_p:.3g})"
        )
    console.print(policy_note(report))
    held = [f"{r.model} on {r.instance_id} (run {r.run})" for r in report.records if r.held_for_review]
    if held:
        console.print(
            f"held for review (the tests pass, with suspicious signals; counted as not resolved): {escape(', '.join(held))}"
        )
    if report.wall_s is not None:
        console.print(f"wall time {report.wall_s:.0f} s for runs adding up to {report.sum_run_wall_s:.0f} s")
    if report.report_dir:
        console.print(f"report: {Path(report.report_dir) / 'report.html'}")


def same_attempts_setting(entries: list[Any], limits: AgentChoices) -> None:
    """Refuse entries whose attempts differ (each entry's over the comparison's, else BUGSWEEP_ATTEMPTS, else 1):
    a run of 3 attempts is not the same trial as a run of 1 (bugsweep.report.same_attempts)."""
    from pydantic import ValidationError

    from bugsweep.report import same_attempts
    from bugsweep.runconfig import chosen, merge_choices
    from bugsweep.settings import AgentSettings

    try:
        default = AgentSettings().attempts
    except ValidationError:
        return  # a bad BUGSWEEP_* value: the run's own build says which, in one line
    same_attempts({e.name: chosen(merge_choices(limits, e.limits)).get("attempts", default) for e in entries})


def apply_prices(entries: list[Any], prices: list[str]) -> None:
    """Set each `--price NAME=PROMPT,COMPLETION` on the model entry of that name."""
    by_name = {e.name: e for e in entries}
    for text in prices:
        name, _, values = text.partition("=")
        parts = values.split(",")
        if name not in by_name or len(parts) != 2:
            _fail(f"--price {text!r}: expected NAME=PROMPT,COMPLETION for one of the --model names")
        try:
            prompt, completion = float(parts[0]), float(parts[1])
        except ValueError:
            _fail(f"--price {text!r}: prices must be numbers (USD per million tokens)")
        if prompt < 0 or completion < 0:
            _fail(f"--price {text!r}: prices must be 0 or more")
        by_name[name].price_prompt_per_mtok, by_name[name].price_completion_per_mtok = prompt, completion


def apply_settings(entries: list[Any], settings: list[str], option: str, form: str) -> None:
    """Set each `NAME:SETTING=VALUE` (or, for --model-policy, `NAME=POLICY`) on the model entry of that name
    (ModelEntry.set checks the setting and its value)."""
    from pydantic import ValidationError

    from bugsweep.errors import ConfigError

    by_name = {e.name: e for e in entries}
    for text in settings:
        if form == "NAME=POLICY":
            name, sep, value = text.partition("=")
            field = "policy"
        else:
            name, _, assignment = text.partition(":")
            field, sep, value = assignment.partition("=")
        if name not in by_name or not sep:
            _fail(f"{option} {text!r}: expected {form} for one of the --model names")
        try:
            by_name[name].set(field.strip(), value.strip())
        except (ConfigError, ValidationError) as exc:
            problem = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            _fail(f"{option} {text!r}: {problem}")


def _fail(message: str) -> NoReturn:
    err.print(f"[red bold]error[/]: {escape(message)}", soft_wrap=True)  # one line, whatever the width
    raise typer.Exit(2)
