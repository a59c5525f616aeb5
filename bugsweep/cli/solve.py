"""`bugsweep solve` and `bugsweep demo`: one task, end to end, with live progress and a one-screen summary.

Exit codes: 0 resolved, 1 not resolved, 2 could not run (bad arguments or settings, model unreachable, setup failed,
tests already passing, sandbox failure, a crash in bugsweep: see exits.py), 130 after Ctrl-C, 143 after SIGTERM.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax

from bugsweep.cli.options import with_limit_options
from bugsweep.runconfig import (
    BACKEND_UNSET,
    AgentChoices,
)  # at run time: with_limit_options reads the annotations
from bugsweep.spec import DEFAULT_SETUP_COMMAND, DEFAULT_TEST_COMMAND

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentEvent

EXIT_RESOLVED, EXIT_NOT_RESOLVED, EXIT_COULD_NOT_RUN = 0, 1, 2

DEMO_TASK = "tests/test_dates.py fails on leap years. Fix the code."
DEMO_TEST_COMMAND = DEFAULT_TEST_COMMAND
#: The demo's tests run in its own environment, which gets pytest from the setup like any task's.
DEMO_SETUP_COMMAND = DEFAULT_SETUP_COMMAND

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("solve")(solve_command)
    app.command("demo")(demo_command)


@with_limit_options()
def solve_command(
    repo: Annotated[str, typer.Option(help="Local path or git URL of the repository with the bug.")],
    task: Annotated[str, typer.Option(help="What is wrong, in words, as you would tell a colleague.")],
    test_command: Annotated[
        str,
        typer.Option(
            help="Runs the tests; must fail before the fix and pass after (e.g. 'python -m pytest -q')."
        ),
    ],
    ref: Annotated[
        str | None, typer.Option(help="Commit, branch or tag to start from (default: as it is).")
    ] = None,
    setup_command: Annotated[
        str,
        typer.Option(
            help="Runs once before the tests, with network, in the task's own environment; installs what the "
            "tests need, the test runner included (e.g. 'pip install -e . pytest'); '' for none."
        ),
    ] = DEFAULT_SETUP_COMMAND,
    python: Annotated[
        str | None,
        typer.Option(
            help="Interpreter the task's environment is made from: a path or a name on PATH (default: the one "
            "bugsweep runs on)."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for grade.json, patch.diff, trajectory.json and the test logs."),
    ] = None,
    sandbox: Annotated[
        str | None,
        typer.Option(help=f"Sandbox backend: 'local' (bubblewrap) or 'runtime'. {BACKEND_UNSET}"),
    ] = None,
    push_branch: Annotated[
        bool,
        typer.Option(
            help="When resolved, commit the graded fix on the base commit and push it as branch "
            "PREFIX/adhoc/TASK (BUGSWEEP_BRANCH_PREFIX, default bugsweep) with the token in BUGSWEEP_BRANCH_TOKEN, "
            "if any; exit 2 if the push fails (the grade stands)."
        ),
    ] = False,
    push_url: Annotated[
        str | None,
        typer.Option(
            help="With --push-branch: the git repository to push to (default: BUGSWEEP_BRANCH_PUSH_URL, else "
            "--repo when it is a URL)."
        ),
    ] = None,
    escalate_to: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=BASE_URL[,KEY_ENV[,MODEL_ID]]: a model tried, with its own --attempts, only when the ones "
            "before it did not resolve the task (a cheaper model first: LLM_MODEL, then these in the order given). "
            "Its key is read from the variable KEY_ENV, never printed; MODEL_ID (default NAME) is sent to the "
            "endpoint; its other settings are LLM_*'s (its prices too: set its own with --escalate-set)."
        ),
    ] = None,
    escalate_set: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME:SETTING=VALUE: an endpoint setting of one --escalate-to model, e.g. "
            "big:price_prompt_per_mtok=0.27 or big:temperature=0.2."
        ),
    ] = None,
    *,
    limits: AgentChoices,
) -> None:
    """Fix a bug in a sandbox and grade the fix: tests must fail before, pass after, with test files untouched.

    The model is LLM_BASE_URL / LLM_MODEL / LLM_API_KEY; with no LLM_BASE_URL the embedded open model is used.
    """
    if push_url and not push_branch:
        _fail("--push-url is for --push-branch: give both")
    from bugsweep.sandbox.sources import is_git_url
    from bugsweep.spec import TaskSpec

    if not is_git_url(repo) and not Path(repo).expanduser().is_dir():
        _fail(f"--repo {repo!r} is neither a folder nor a git URL")
    repo_arg = repo if is_git_url(repo) else str(Path(repo).expanduser().resolve())
    spec = TaskSpec(
        repo=repo_arg,
        base_commit=ref,
        problem_statement=task,
        test_command=test_command,
        setup_command=setup_command or None,
        python=python,
    )
    branches = branch_settings(push_url) if push_branch else None
    later = escalation(escalate_to or [], escalate_set or [])
    raise typer.Exit(
        run_one(spec, out=out, limits=limits, backend=sandbox, branches=branches, escalate_to=later)
    )


def escalation(texts: list[str], settings: list[str]) -> list[Any]:
    """The ModelSettings of `--escalate-to` (with `--escalate-set`), keys read now; a bad one exits 2 in one line."""
    from bugsweep.endpoints import parse_endpoints
    from bugsweep.errors import ConfigError

    if settings and not texts:
        _fail("--escalate-set is for --escalate-to: give both")
    try:
        return [e.settings() for e in parse_endpoints(texts, settings, "--escalate-to", "--escalate-set")]
    except ConfigError as exc:
        _fail(str(exc))
        raise  # unreachable: _fail exits


def branch_settings(push_url: str | None) -> Any:
    """Where `--push-branch` pushes: BUGSWEEP_BRANCH_*, with --push-url over its push URL; a bad value exits 2."""
    from pydantic import ValidationError

    from bugsweep.cli.exits import settings_problem
    from bugsweep.settings import BranchSettings

    try:
        settings = BranchSettings()
    except ValidationError as exc:
        _fail(settings_problem(exc))
    return settings.model_copy(update={"push_url": push_url}) if push_url else settings


@with_limit_options()
def demo_command(
    out: Annotated[
        Path | None, typer.Option(help="Folder for the run's outputs (default: ./runs/demo-...).")
    ] = None,
    *,
    limits: AgentChoices,
) -> None:
    """Solve the bundled example: a calendar module whose leap-year rule is wrong, with a failing test.

    Runs exactly the `solve` path, on the embedded open model unless LLM_BASE_URL is set.
    """
    from bugsweep.spec import TaskSpec

    repo = materialise_demo_repo(Path(tempfile.mkdtemp(prefix="bugsweep-demo-")))
    console.print(f"[bold]demo[/]: {DEMO_TASK}  (repository copied to {repo})")
    spec = TaskSpec(
        instance_id="demo-leap-year",
        repo=str(repo),
        problem_statement=DEMO_TASK,
        test_command=DEMO_TEST_COMMAND,
        setup_command=DEMO_SETUP_COMMAND,
    )
    try:
        code = run_one(
            spec,
            out=out,
            limits=limits,
            backend="local",
            show_patch=True,
            out_prefix="demo",
        )
    finally:
        shutil.rmtree(repo, ignore_errors=True)
    raise typer.Exit(code)


def materialise_demo_repo(dest: Path) -> Path:
    """Copy the bundled demo project to `dest` and make it a git repository with one commit."""
    source = Path(__file__).resolve().parent.parent / "demo_repo"
    shutil.copytree(
        source, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache")
    )
    env = {
        "GIT_AUTHOR_NAME": "demo",
        "GIT_AUTHOR_EMAIL": "demo@localhost",
        "GIT_COMMITTER_NAME": "demo",
        "GIT_COMMITTER_EMAIL": "demo@localhost",
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(dest),
    }
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "billing-dates 0.1.0"]):
        subprocess.run(["git", *args], cwd=dest, env=env, check=True, capture_output=True)
    return dest


def run_one(
    spec: Any,
    *,
    out: Path | None,
    limits: AgentChoices,
    backend: str | None,
    show_patch: bool = False,
    out_prefix: str | None = None,
    branches: Any = None,
    escalate_to: list[Any] | None = None,
) -> int:
    """Solve one task with progress output; returns the exit code. The run is built as every front end builds it
    (bugsweep.runbuilder: the limits given over BUGSWEEP_*/LLM_* over the defaults; no blocks are read).
    With `branches` (BranchSettings), a resolved fix is pushed as a branch; a failed push exits 2. `escalate_to`:
    the models (ModelSettings) tried after LLM_MODEL, in order, on what it did not resolve."""
    from pydantic import ValidationError

    from bugsweep.cli.exits import (
        EXIT_INTERRUPTED,
        EXIT_TERMINATED,
        Terminated,
        could_not_run,
        crashed,
        settings_problem,
        sigterm_as_interrupt,
    )
    from bugsweep.errors import BugsweepError, ConfigError
    from bugsweep.pipeline import solve_task
    from bugsweep.runbuilder import build_run

    out_dir = out or default_out_dir(out_prefix or spec.instance_id)
    try:
        with sigterm_as_interrupt():
            try:
                run = build_run(limits, backend=backend, escalate_to=escalate_to or [])
            except ValidationError as exc:
                return could_not_run(settings_problem(exc), "configuration")
            config, agent_settings, provider = run.config, run.agent, run.provider
            with model_endpoint(run.model) as model_settings:
                later = "".join(f", then {m.model} at {m.base_url}" for m in run.escalate_to)
                each = " per model" if run.escalate_to else ""
                attempts = (
                    f", up to {agent_settings.attempts} attempts{each}" if agent_settings.attempts > 1 else ""
                )
                console.print(
                    f"[bold]model[/] {model_settings.model} at {model_settings.base_url}{escape(later)}{attempts}, "
                    f"policy {config.policy}, configuration {config.digest}"
                )
                printer = ProgressPrinter()
                verdict = solve_task(
                    spec,
                    provider=provider,
                    model_settings=model_settings,
                    agent_settings=agent_settings,
                    out_dir=out_dir,
                    on_event=printer.event,
                    on_step=printer.step,
                    labels={"task": spec.instance_id[:63], "model": model_settings.model[:63]},
                    config=config,
                    escalate_to=run.escalate_to,
                )
    except BugsweepError as exc:
        code = could_not_run(str(exc), "configuration" if isinstance(exc, ConfigError) else exc.kind)
        if (out_dir / "grade.json").exists():
            err.print(f"details: {out_dir}")
        return code
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, Terminated)
        saved = f"; what the agent did so far is in {out_dir}" if (out_dir / "grade.json").exists() else ""
        err.print(f"[red]{'terminated' if terminated else 'interrupted'}[/]: the sandbox was released{saved}")
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except Exception as exc:  # a bug in bugsweep: grade.json (if any) says crash; the traceback goes to a log
        return crashed(exc, out_dir if out_dir.exists() else None)
    print_summary(verdict, out_dir, show_patch=show_patch)
    if branches is not None and verdict.resolved:
        return push_branch(spec, verdict, out_dir, branches)
    return EXIT_RESOLVED if verdict.resolved else EXIT_NOT_RESOLVED


def push_branch(spec: Any, verdict: Any, out_dir: Path, settings: Any) -> int:
    """Push the resolved fix as a branch: exit 0 when it is on the remote, 2 (one line) when not."""
    from bugsweep.branches import ADHOC, push_run_folder
    from bugsweep.cli.exits import crashed, one_line
    from bugsweep.errors import BugsweepError

    try:
        pushed = push_run_folder(out_dir, spec, verdict, sweep=ADHOC, settings=settings, token=settings.token)
    except BugsweepError as exc:
        err.print(
            f"[red bold]branch not pushed[/] ({exc.kind}): {escape(one_line(str(exc)))} (the grade stands: "
            f"{out_dir}/grade.json)"
        )
        return EXIT_COULD_NOT_RUN
    except Exception as exc:  # a bug in bugsweep: traceback to a log, one line here
        return crashed(exc, out_dir)
    console.print(f"  {escape(pushed.describe())}")
    return EXIT_RESOLVED


@contextlib.contextmanager
def model_endpoint(settings: Any) -> Iterator[Any]:
    """The configured endpoint, or the embedded model (started on demand, shared by lease with the other runs on
    this machine, stopped when the last of them ends)."""
    if settings.base_url:
        yield settings
        return
    from bugsweep.embedded.server import ensure_embedded_model

    console.print("[dim]LLM_BASE_URL is not set: using the embedded open model (bugsweep model serve)[/]")
    with ensure_embedded_model(progress=lambda msg: console.print(f"[dim]{escape(msg)}[/]")) as endpoint:
        yield endpoint.serving(settings)


def default_out_dir(name: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", name)[:60]
    return Path("runs") / f"{stamp}-{safe}"


class ProgressPrinter:
    """One line per pipeline step and per tool call."""

    def step(self, name: str, info: dict[str, Any]) -> None:
        detail = ", ".join(f"{k}={v}" for k, v in info.items() if v not in (None, [], ""))
        console.print(f"[bold cyan]▸ {name}[/] [dim]{escape(detail)}[/]")

    def event(self, event: AgentEvent) -> None:
        tok = f"{event.tokens / 1000:.1f}k tok"
        head = f"  [dim]{event.elapsed_s:5.0f}s turn {event.turn:>2}[/]"
        if event.kind == "tool":
            arg = escape(event.short_arg or "")[:70]
            if event.tool == "run" and event.exit_code is not None:
                status = (
                    f"[green]exit {event.exit_code}[/]"
                    if event.exit_code == 0
                    else f"[yellow]exit {event.exit_code}[/]"
                )
            elif event.ok is False:
                status = f"[red]{escape(event.detail or 'error')[:60]}[/]"
            else:
                status = "[green]ok[/]"
            via = " [dim](from text)[/]" if event.recovered else ""
            console.print(f"{head} [bold]{event.tool or '?':<9}[/] {arg:<70} {status}{via} [dim]{tok}[/]")
        elif event.kind == "rewrite":
            arg = escape(event.short_arg or "")[:70]
            status = "[cyan]asked for the whole function[/]"
            console.print(f"{head} [bold]{event.tool or '?':<9}[/] {arg:<70} {status} [dim]{tok}[/]")
        elif event.kind in ("nudge", "error", "stop"):
            console.print(
                f"{head} [magenta]{event.kind:<9}[/] {escape(event.detail or '')[:90]} [dim]{tok}[/]"
            )


def print_summary(verdict: Any, out_dir: Path, *, show_patch: bool = False) -> None:
    def mark(ok: bool) -> str:
        return "[green]yes[/]" if ok else "[red]no[/]"

    from bugsweep.grading import verdict_label

    word = verdict_label(verdict)
    colour = {"resolved": "green", "held for review": "yellow", "resolved (exit code only)": "yellow"}.get(
        word, "red"
    )
    head = f"[bold {colour}]{word.upper()}[/]"
    from bugsweep.attempts import resolved_at

    console.print()
    at = resolved_at(verdict)
    console.print(f"{head}  {verdict.instance_id}  ({verdict.model})" + (f"  {escape(at)}" if at else ""))
    console.print(
        f"  failed before: {mark(verdict.failed_before)}   passes after: {mark(verdict.passes_after)}   "
        f"tests untouched: {mark(verdict.tests_untouched)}"
    )
    if verdict.dropped:
        dropped = ", ".join(f"{path} ({why})" for path, why in sorted(verdict.dropped.items()))
        console.print(f"  changes to the test infrastructure, dropped before grading: {escape(dropped)}")
    if verdict.reason and not verdict.resolved:
        console.print(f"  why not: {escape(verdict.reason)}")
    for signal in verdict.suspicious[:5]:
        console.print(f"  [yellow]suspicious[/]: {escape(signal)}")
    if verdict.FAIL_TO_PASS:
        console.print(
            f"  fixed tests: {len(verdict.FAIL_TO_PASS)}   still passing: {len(verdict.PASS_TO_PASS)}   "
            f"broken: {len(verdict.PASS_TO_FAIL)}"
        )
    cost = f"${verdict.cost_usd:.4f}" + (
        f" + sandbox ${verdict.sandbox_cost_usd:.4f}" if verdict.sandbox_cost_usd else ""
    )
    console.print(
        f"  stop: {verdict.stop_reason}   turns: {verdict.turns}   tokens: {verdict.prompt_tokens} prompt + "
        f"{verdict.completion_tokens} completion   cost: {cost}   time: {verdict.wall_s:.0f}s   "
        f"policy: {verdict.policy or '-'}   configuration: {verdict.config_digest or '-'}"
    )
    if verdict.summary:
        console.print(
            f"  agent's summary (not trusted for grading): [italic]{escape(verdict.summary[:300])}[/]"
        )
    patch_path = out_dir / "patch.diff"
    if show_patch and patch_path.exists() and patch_path.read_text().strip():
        console.print(Syntax(patch_path.read_text(), "diff", theme="ansi_dark"))
    for record in verdict.attempts if len(verdict.attempts) > 1 else []:
        why = (
            f": {record.reason or record.error}"
            if not record.resolved and (record.reason or record.error)
            else ""
        )
        console.print(
            f"  attempt {record.attempt}: {record.model} at temperature {record.temperature:g}, "
            f"{record.verdict}{escape(why)[:160]} ({record.turns} turn(s), ${record.cost_usd:.4f}, "
            f"{record.wall_s:.0f}s)"
        )
    shown = verdict.kept_attempt or (verdict.attempts[-1].attempt if verdict.attempts else None)
    folders = any(r.folder for r in verdict.attempts)
    kept_files = f"; attempt {shown}'s at the top, every attempt's in attempts/N/" if folders else ""
    console.print(
        f"  outputs: {out_dir}/ (grade.json, patch.diff, trajectory.json, tests_before.log, tests_after.log"
        f"{kept_files})"
    )


def _fail(message: str) -> None:
    err.print(f"[red bold]could not run[/]: {escape(message)}")
    raise typer.Exit(EXIT_COULD_NOT_RUN)
