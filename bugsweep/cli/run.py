"""`bugsweep run DEPLOYMENT`: start a run of a deployment now (the UI's Run button), and with `--watch` follow it
to its end printing only what a person waits for: its state as it changes, then its final message (a sweep's:
how many tasks were resolved, not resolved, held and could not run, and why), not the run's every log line and
event (`prefect deployment run --watch` prints those: 171 lines for a night of five tasks).
"""

from __future__ import annotations

import json
import os
import time
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

#: How often `--watch` reads the run's state.
POLL_S = 2.0


def register(app: typer.Typer) -> None:
    """Add `run` to the main app."""
    app.command("run")(run_command)


def _fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[red]error:[/] {escape(message)}")
    raise typer.Exit(code)


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """["redo_graded=true", "name=nightly"] -> {"redo_graded": True, "name": "nightly"}: a value is read as JSON
    when it is JSON, else taken as text."""
    params: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _fail(f"--param takes KEY=VALUE, not {item!r}")
        try:
            params[key.strip()] = json.loads(value)
        except ValueError:
            params[key.strip()] = value
    return params


def run_command(
    deployment: Annotated[
        str, typer.Argument(help="FLOW/DEPLOYMENT, e.g. sweep/nightly-sweep or solve-bug/solve-bug.")
    ],
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            "-p",
            help="KEY=VALUE, a parameter of this run (repeatable; VALUE is read as JSON when it is JSON), e.g. "
            "--param redo_graded=true.",
        ),
    ] = None,
    watch: Annotated[
        bool, typer.Option(help="Wait for the run to end, printing its state changes and its final message.")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(min=1, help="With --watch: give up waiting after this many seconds.")
    ] = None,
) -> None:
    """Start a run of a deployment now, as the UI's Run button does; a worker of its pool takes it.

    With --watch: one line per state the run enters, then its final state and message (a sweep's counts of
    resolved, not resolved, held for review and could not run, and why a failed night failed). Exit code 0 when
    the run ends Completed, 2 when it ends otherwise or the wait times out (the run goes on), or when it cannot be
    started. Needs PREFECT_API_URL.
    """
    if not os.environ.get("PREFECT_API_URL"):
        _fail("set PREFECT_API_URL to your Prefect server (e.g. http://127.0.0.1:4200/api)")
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    try:
        flow_run: Any = run_deployment(deployment, parameters=parse_params(param), timeout=0)
    except ObjectNotFound:
        _fail(
            f"no deployment {deployment!r}: deploy it first (`bugsweep deploy`), or check its name (FLOW/NAME)"
        )
    ui = os.environ["PREFECT_API_URL"].rstrip("/").removesuffix("/api")
    console.print(f"flow run {flow_run.name} of {deployment}: {ui}/runs/flow-run/{flow_run.id}")
    if not watch:
        return
    deadline = time.monotonic() + timeout if timeout else None
    seen = None
    with get_client(sync_client=True) as client:
        while True:
            state = client.read_flow_run(flow_run.id).state
            if state is not None and state.name != seen:
                seen = state.name
                if not state.is_final():
                    console.print(state.name)
            if state is not None and state.is_final():
                break
            if deadline is not None and time.monotonic() > deadline:
                _fail(
                    f"flow run {flow_run.name} not finished after {timeout:.0f} s (it goes on; watch it in the UI)"
                )
            time.sleep(POLL_S)
    message = f": {state.message}" if state.message else ""
    console.print(f"{state.name}{escape(message)}")
    if not state.is_completed():
        raise typer.Exit(2)
