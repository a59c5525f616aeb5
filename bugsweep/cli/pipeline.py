"""`bugsweep sweep` and `bugsweep upload`: the Prefect pipeline from the command line (`bugsweep deploy` and
`bugsweep worker` are in deploy.py, `bugsweep blocks` in blocks.py).

These talk to the Prefect server at PREFECT_API_URL; with none set, `sweep` (and `compare`) start a temporary one
for the command (about 30 s; its log goes to a file, not the terminal): `prefect server start` keeps one running.
docs/pipeline.md walks through server, blocks, deployments and workers.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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
from bugsweep.spec import DEFAULT_SETUP_COMMAND, DEFAULT_TEST_COMMAND

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def register(app: typer.Typer) -> None:
    """Add `sweep`, `deploy`, `upload`, `worker` and the `blocks` group to the main app."""
    from bugsweep.cli.blocks import blocks_app
    from bugsweep.cli.deploy import deploy_command, worker_command

    app.command("sweep")(sweep_command)
    app.command("deploy")(deploy_command)
    app.command("upload")(upload_command)
    app.command("worker", context_settings={"allow_extra_args": True})(worker_command)
    app.add_typer(blocks_app, name="blocks")


def _fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)  # one line, whatever the terminal's width
    raise typer.Exit(code)


def _hint_server() -> None:
    if not os.environ.get("PREFECT_API_URL"):
        err.print(
            "[dim]PREFECT_API_URL is not set: a temporary Prefect server is started for this command (~30 s). "
            "Run `prefect server start` and set PREFECT_API_URL=http://127.0.0.1:4200/api to keep the runs.[/]"
        )


#: Seconds to wait for a temporary Prefect server to answer (it takes 20-35 s on a loaded machine).
SERVER_START_TIMEOUT_S = 180.0


@contextlib.contextmanager
def prefect_server() -> Iterator[None]:
    """The Prefect server a command's flow runs report to: the configured one (PREFECT_API_URL), or a temporary one.

    The temporary server is started here rather than by Prefect, so that its output (telemetry errors, the
    tracebacks of its services being cancelled at shutdown) goes to a log file instead of the terminal of a run
    that succeeded, and so that it is stopped and waited for before the command returns.
    """
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if get_current_settings().api.url:
        yield
        return
    _hint_server()
    folder = Path(tempfile.mkdtemp(prefix="bugsweep-prefect-server-"))
    log_path = folder / "server.log"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1"}
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = (
        "false"  # it reports to the internet, and logs errors without one
    )
    command = [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app",
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "error", "--lifespan", "on"]  # fmt: skip
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_until_healthy(server, url, log_path)
        os.environ["PREFECT_API_URL"] = url  # for any process the command starts
        with temporary_settings({PREFECT_API_URL: url}):
            try:
                yield
            finally:
                _send_what_is_queued()
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _send_what_is_queued() -> None:
    """Send the logs and events still queued for the server before it stops (else: 'Error logging to API')."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        with contextlib.suppress(Exception):  # best effort: the command's own work is done
            worker.drain_all(timeout=10)


def _wait_until_healthy(server: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    import httpx

    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            _fail(f"the temporary Prefect server exited with code {server.returncode}; its log: {log_path}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    _fail(
        f"the temporary Prefect server did not answer in {SERVER_START_TIMEOUT_S:.0f} s; its log: {log_path}"
    )


# -- sweep --------------------------------------------------------------------------------------------------------


@with_limit_options("Per task.")
def sweep_command(
    tasks: Annotated[
        str | None,
        typer.Option(
            help="A tasks.jsonl file (local path or s3://BUCKET/KEY); it may hold SWE-bench records."
        ),
    ] = None,
    specs: SpecsOption = None,
    repos_from: ReposFromOption = "https://github.com",
    added_within_days: AddedWithinOption = None,
    repo: Annotated[
        str | None,
        typer.Option(help="Instead of --tasks: a repository whose failing test files become tasks."),
    ] = None,
    branch: Annotated[str, typer.Option(help="With --repo: the branch to test.")] = "main",
    test_command: Annotated[
        str, typer.Option(help="With --repo: the pytest command.")
    ] = DEFAULT_TEST_COMMAND,
    setup_command: Annotated[
        str,
        typer.Option(
            help="With --repo: runs once before the tests, in the task's own environment: installs what they "
            "need, the test runner included (e.g. 'pip install -e . pytest'); '' for none."
        ),
    ] = DEFAULT_SETUP_COMMAND,
    name: Annotated[
        str | None, typer.Option(help="Sweep name (the S3 folder); default: the task file's or repo's name.")
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option(
            min=1,
            help="Tasks at once in this process (with --on-workers, the workers' limits decide instead).",
        ),
    ] = 4,
    sandbox: Annotated[
        str | None,
        typer.Option(help=f"Sandbox backend: 'local' (bubblewrap) or 'runtime'. {BACKEND_UNSET}"),
    ] = None,
    model_block: Annotated[
        str | None,
        typer.Option(
            help="Name of a model endpoint block (default: bugsweep-model if it exists, else LLM_*)."
        ),
    ] = None,
    store_block: Annotated[
        str | None,
        typer.Option(
            help="Name of an S3 bucket block (default: bugsweep-artifacts if it exists, else BUGSWEEP_STORE_URL, "
            "else ./artifacts)."
        ),
    ] = None,
    on_workers: Annotated[
        bool,
        typer.Option(
            help="Run each task as a run of the solve-bug deployment, all created at once and taken by the pool's "
            "workers on any machine as their limits allow; Ctrl-C leaves them running (they store their grades)."
        ),
    ] = False,
    redo_graded: Annotated[
        bool,
        typer.Option(
            "--redo-graded",
            "--redo",
            help="Run tasks again even if already graded under this configuration, e.g. after a bad night (other "
            "configurations' grades are kept).",
        ),
    ] = False,
    keep_graded_by_other_code: Annotated[
        bool,
        typer.Option(
            help="Keep the grades another bugsweep (before an upgrade: another code digest) made under an otherwise "
            "identical configuration, instead of running those tasks again; the sweep's summary says so. Without "
            "it they run again and both grades are kept."
        ),
    ] = False,
    push_branches: Annotated[
        bool,
        typer.Option(
            help="Push each resolved fix (with the task's test patch) on its base commit as branch "
            "PREFIX/SWEEP/TASK; nothing is pushed for an unresolved task. Where to: --branches-block."
        ),
    ] = False,
    branches_block: Annotated[
        str | None,
        typer.Option(
            help="Name of a git branches block (push URL, prefix, author, a Secret block with the token); "
            "default: bugsweep-branches if it exists, else BUGSWEEP_BRANCH_* (push URL default: the task's "
            "repository when it is a URL)."
        ),
    ] = None,
    escalate_to_block: Annotated[
        list[str] | None,
        typer.Option(
            help="Name of a model endpoint block tried after the model, once per block, in order: each (with its "
            "--attempts) only on a task the ones before did not resolve (a cheaper model first)."
        ),
    ] = None,
    *,
    limits: AgentChoices,
) -> None:
    """Run many tasks at once, each graded and uploaded; tasks already graded under this configuration are skipped.

    Exit code 0 when every task ran (resolved or not), 2 when any could not be run or stored (the sweep is FAILED),
    or when the task file has a bad line (one line naming it and the field).

    Tasks come from a task file (as `bugsweep mine` writes it), or from a repository and branch: its tests are
    run, and each failing test file becomes a task. Results go to the artifact store, under
    SWEEP/TASK/MODEL/CONFIG/, CONFIG being the digest of the run's configuration (model, policy, limits, sandbox,
    environment, bugsweep's version and code): a sweep under another configuration runs the tasks again and keeps
    both; after an upgrade of bugsweep, it says how many were graded by another bugsweep and runs them again
    (--keep-graded-by-other-code keeps those grades instead). Options left unset come from BUGSWEEP_* and LLM_*
    (or the blocks), else the defaults, as for `bugsweep solve`.
    The sweep's folder gets predictions.jsonl, SWE-bench's predictions file (instance_id, model_name_or_path,
    model_patch: each task's patch.diff), in the store and in the local folder runs are written to.
    With --push-branches, a fix that could not be pushed leaves its grade as it is and fails the sweep (exit 2).
    """
    if (tasks is None) == (repo is None):
        _fail("give exactly one of --tasks FILE and --repo REPO")
    if sandbox not in (None, "local", "runtime"):
        _fail(f"--sandbox must be 'local' or 'runtime', not {sandbox!r}")
    if on_workers and not os.environ.get("PREFECT_API_URL"):
        _fail("--on-workers needs the Prefect server the workers use: set PREFECT_API_URL")

    from bugsweep.discover import RepoBranch, TaskFile
    from bugsweep.errors import BugsweepError
    from flows.sweep import SweepFailed, sweep

    source: TaskFile | RepoBranch
    if tasks is not None:
        try:
            source = task_file(tasks, specs, repos_from, added_within_days)
        except BugsweepError as exc:
            _fail(str(exc))
    else:
        assert repo is not None
        source = RepoBranch(
            repo=repo, branch=branch, test_command=test_command, setup_command=setup_command or None
        )
    try:
        with prefect_server():
            model, store = _named_blocks(model_block, store_block)
            branches = _named_branches_block(branches_block)
            escalate_to = [_named_blocks(block, None)[0] for block in escalate_to_block or []]
            state: Any = sweep(  # sandbox: checked above; with return_state, the final State
                source=source,
                name=name or "",
                model=model,
                sandbox=sandbox,
                store=store,
                limits=limits,
                concurrency=concurrency,
                run_on="workers" if on_workers else "this-process",
                redo_graded=redo_graded,
                keep_graded_by_other_code=keep_graded_by_other_code,
                push_branches=push_branches,
                branches=branches,
                escalate_to=escalate_to,
                return_state=True,
            )
            outcome = state.result(raise_on_failure=False)
    except BugsweepError as exc:
        _fail(str(exc))
    if isinstance(outcome, SweepFailed):
        _print_grades(outcome.grades)
        _fail(state.message or str(outcome))
    if isinstance(outcome, BaseException):  # the sweep could not run: its one line (a crash: the traceback)
        raise outcome
    _print_grades(outcome)
    console.print(state.message or f"sweep COMPLETED: all {len(outcome)} task(s) graded", soft_wrap=True)


def _named_blocks(model_block: str | None, store_block: str | None) -> tuple[Any, Any]:
    """The model endpoint and S3 bucket blocks named on the command line (None where none was named)."""
    from prefect_aws import S3Bucket

    from blocks import ModelEndpoint
    from flows.common import load_block

    model = load_block(ModelEndpoint, model_block, default_name="") if model_block else None
    store = load_block(S3Bucket, store_block, default_name="") if store_block else None
    return model, store


def _named_branches_block(name: str | None) -> Any:
    """The git branches block named on the command line (None when none was named)."""
    if not name:
        return None
    from blocks import GitBranches
    from flows.common import load_block

    return load_block(GitBranches, name, default_name="")


def _cell(grade: Any) -> str:
    if grade.resolved:
        at = f" (attempt {grade.kept_attempt})" if len(grade.attempts) > 1 else ""
        return ("yes (exit code only)" if str(grade.evidence).startswith("exit code") else "yes") + at
    return "held" if grade.held_for_review else "no"


def _print_grades(grades: list[Any]) -> None:
    from bugsweep.errors import first_line
    from bugsweep.runconfig import describe_config

    table = Table(title="sweep")
    columns = (
        "task",
        "model",
        "policy",
        "config",
        "resolved",
        "turns",
        "tokens",
        "cost (USD)",
        "time (s)",
        "note",
    )
    for column in columns:
        table.add_column(column, overflow="fold")  # whole names even in a narrow log file, never "setup-…"
    for g in grades:
        note = f"could not run ({g.failure_kind})" if g.error else ""
        table.add_row(
            g.instance_id, g.model, g.policy or "-", g.config_digest or "-", _cell(g),
            str(g.turns), str(g.prompt_tokens + g.completion_tokens), f"{g.cost_usd:.4f}", f"{g.wall_s:.1f}", note,
        )  # fmt: skip
    print_table(console, table)
    for g in grades:
        if g.error:
            console.print(
                f"could not be run: {g.instance_id} ({g.failure_kind}): {first_line(g.error, None)}",
                soft_wrap=True,
            )
    held = ", ".join(g.instance_id for g in grades if g.held_for_review)
    console.print(f"{sum(g.resolved for g in grades)} of {len(grades)} resolved")
    if held:
        console.print(f"held for review (tests pass, suspicious signals; counted as not resolved): {held}")
    bare = ", ".join(g.instance_id for g in grades if g.resolved and str(g.evidence).startswith("exit code"))
    if bare:
        console.print(f"resolved on the exit code alone (no per-test evidence, no mirror run): {bare}")
    policies = sorted({g.policy for g in grades if g.policy})
    if policies:
        console.print(f"agent policy: {', '.join(policies)}")
    for described in sorted({describe_config(g) for g in grades if g.config_digest}):
        console.print(f"configuration {described}", soft_wrap=True)


# -- upload -------------------------------------------------------------------------------------------------------


def upload_command(
    run_dir: Annotated[
        Path,
        typer.Argument(
            help="A run folder kept after its upload failed, or a folder holding many (the store's local folder)."
        ),
    ],
    store_block: Annotated[
        str | None,
        typer.Option(
            help="Name of the S3 bucket block to upload to (needs PREFECT_API_URL); default: the "
            "bugsweep-artifacts block when PREFECT_API_URL is set and it exists, else BUGSWEEP_STORE_URL."
        ),
    ] = None,
) -> None:
    """Upload the graded runs whose upload failed (each kept with an upload-pending.json marker) to the artifact
    store, under the keys they were meant for, grade.json last. Uploading twice is harmless.

    A sweep does this by itself as it starts, and a solve-bug run of the same task does it instead of running the
    agent again; this command is for doing it now, by hand. With a Prefect server (PREFECT_API_URL), it also makes
    the patch artifacts the run would have made, and turns the run that ended Failed for its upload Completed.
    """
    from bugsweep.errors import BugsweepError
    from bugsweep.upload import pending_runs, upload_pending

    folders = pending_runs(run_dir.expanduser().resolve())
    if not folders:
        console.print(f"nothing to upload: no run folder under {run_dir} waits for an upload", soft_wrap=True)
        return
    try:
        store = _configured_store(store_block)
    except BugsweepError as exc:
        _fail(str(exc))
    failed = 0
    for folder in folders:
        try:
            _check_destination(folder, store.location)
            result = upload_pending(store, folder)
        except BugsweepError as exc:
            failed += 1
            err.print(f"[red]not uploaded[/] {folder}: {exc}", soft_wrap=True)
            continue
        console.print(
            f"uploaded {folder} -> {result.location}/{result.key} ({len(result.uris)} files)", soft_wrap=True
        )
        if os.environ.get("PREFECT_API_URL"):
            # the artifacts the run would have made, and the run that made the grade turned Completed
            from tasks.publish import after_late_upload

            completed = after_late_upload(store, result.key, folder, by="`bugsweep upload`")
            if completed:
                console.print(f"flow run {completed} is Completed now: its grade reached the store")
    if failed:
        _fail(
            f"{failed} of {len(folders)} run folder(s) could not be uploaded; they are kept for another try"
        )


def _configured_store(store_block: str | None) -> Any:
    from bugsweep.storage import StoreSettings, open_store

    if store_block or os.environ.get("PREFECT_API_URL"):
        from prefect_aws import S3Bucket

        from blocks import STORE_BLOCK, bucket_store
        from flows.common import load_block

        block = load_block(S3Bucket, store_block or STORE_BLOCK, STORE_BLOCK)
        if block is not None:
            return bucket_store(block)
    return open_store(StoreSettings())


def _check_destination(folder: Path, location: str) -> None:
    """Refuse to put a run where it was not meant to go (another bucket, or a local folder by mistake)."""
    import json

    from bugsweep.errors import ConfigError
    from bugsweep.upload import PENDING_FILE

    meant = json.loads((folder / PENDING_FILE).read_text(encoding="utf-8")).get("store")
    if meant and meant.rstrip("/") != location.rstrip("/"):
        raise ConfigError(
            f"it belongs in {meant}, but the configured store is {location}: set BUGSWEEP_STORE_URL (and its "
            "credentials) or pass --store-block"
        )
