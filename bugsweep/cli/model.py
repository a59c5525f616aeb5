"""`bugsweep model ...`: the embedded open model (serve, status, stop) and an endpoint probe (check)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from bugsweep.embedded import EmbeddedSettings

model_app = typer.Typer(
    rich_markup_mode=None,
    help="The embedded open model (Qwen2.5-Coder-1.5B-Instruct on llama.cpp, offline) and endpoint checks.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add the `model` group to the main app."""
    app.add_typer(model_app, name="model")


def _settings(
    port: int | None = None, threads: int | None = None, ctx: int | None = None
) -> EmbeddedSettings:
    from bugsweep.embedded import EmbeddedSettings

    overrides: dict[str, Any] = {"port": port, "threads": threads, "ctx": ctx}
    return EmbeddedSettings(**{key: value for key, value in overrides.items() if value is not None})


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


@model_app.command("serve")
def serve(
    port: Annotated[
        int | None, typer.Option(help="Port on 127.0.0.1 (default 8012, env BUGSWEEP_MODEL_PORT).")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: all cores).")] = None,
    ctx: Annotated[int | None, typer.Option(help="Context size in tokens (default 8192).")] = None,
    foreground: Annotated[
        bool, typer.Option(help="Run attached to this terminal instead of in the background.")
    ] = False,
) -> None:
    """Start the embedded model as an OpenAI-compatible server, installing and verifying it first if needed.

    Then point any client at it, e.g. LLM_BASE_URL=http://127.0.0.1:8012/v1 (bugsweep finds it on its own).
    """
    from bugsweep.embedded.server import is_ready, read_state, serve_foreground, start_background
    from bugsweep.errors import BugsweepError

    settings = _settings(port, threads, ctx)
    try:
        if foreground:
            serve_foreground(settings)
            return
        state = read_state(settings)
        if state is not None and is_ready(settings, state.model):
            typer.echo(f"Already running: {state.model} at {settings.base_url} (pid {state.pid}).")
            return
        state = start_background(settings)
    except BugsweepError as exc:
        _fail(str(exc))
        return
    typer.echo(f"Use it with: LLM_BASE_URL={settings.base_url} LLM_MODEL={state.model}")
    typer.echo("Stop it with: bugsweep model stop")


@model_app.command("status")
def status(
    port: Annotated[int | None, typer.Option(help="Port on 127.0.0.1 (default 8012).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
) -> None:
    """Whether the embedded model server is running, and where. Exit code 0 if it answers, 1 if not."""
    from bugsweep.embedded import DEFAULT_MODEL
    from bugsweep.embedded.server import live_leases, read_state, served_models

    settings = _settings(port)
    state = read_state(settings)
    using = live_leases(settings)
    models = served_models(settings.port)
    ready = models is not None and DEFAULT_MODEL.name in models
    info = {
        "running": state is not None or ready,
        "ready": ready,
        "base_url": settings.base_url,
        "model": DEFAULT_MODEL.name,
        "pid": state.pid if state else None,
        "threads": state.threads if state else None,
        "ctx": state.ctx if state else None,
        "uptime_s": round(__import__("time").time() - state.started_at) if state else None,
        "log": state.log_path if state else None,
        "model_file": str(settings.models_dir / DEFAULT_MODEL.file_name),
        "leased": bool(state and state.leased),
        "runs_using_it": using,
    }
    if as_json:
        typer.echo(json.dumps(info, indent=2))
    elif ready:
        owner = (
            f"pid {state.pid}, up {info['uptime_s']} s, {state.threads} threads, context {state.ctx}, "
            f"log {state.log_path}; "
            + (
                f"started for runs, stops when the last of them ends; {len(using)} use it now"
                if state.leased
                else "started by `bugsweep model serve`, runs until `bugsweep model stop`"
            )
            if state
            else "not started by bugsweep"
        )
        typer.echo(f"ready: {DEFAULT_MODEL.name} at {settings.base_url} ({owner})")
    elif state is not None:
        typer.echo(f"starting: pid {state.pid}, not answering yet (log {state.log_path})")
    elif models is not None:
        typer.echo(f"not running; port {settings.port} is used by another server ({', '.join(models)})")
    else:
        typer.echo(
            f"not running (start it with: bugsweep model serve{'' if port is None else f' --port {port}'})"
        )
    raise typer.Exit(0 if ready else 1)


@model_app.command("stop")
def stop(port: Annotated[int | None, typer.Option(help="Port on 127.0.0.1 (default 8012).")] = None) -> None:
    """Stop the embedded model server (started by `bugsweep model serve`, or by runs on this machine, which stop it
    themselves when the last of them ends), even while runs use it: they then wait for it (LLM_OUTAGE_WAIT_S) and
    fail as an outage if it does not come back."""
    from bugsweep.embedded.server import live_leases, stop_background

    settings = _settings(port)
    using = live_leases(settings)
    state = stop_background(settings)
    if state is None:
        typer.echo("No embedded model server was running.")
    else:
        typer.echo(f"Stopped the embedded model server (pid {state.pid}).")
        if using:
            typer.echo(
                f"{len(using)} run(s) on this machine were using it (processes {', '.join(map(str, using))})."
            )


@model_app.command("check")
def check(
    base_url: Annotated[
        str | None,
        typer.Option(
            help="OpenAI-compatible base URL (default: LLM_BASE_URL, else "
            "the embedded model, started if needed)."
        ),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model name (default: LLM_MODEL).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
) -> None:
    """Probe an endpoint: do tool calls come back native, as recoverable text, or not at all? And how fast?

    Exit code 0 for native, 1 for text (usable), 2 for none or an unreachable endpoint.
    """
    import contextlib

    from bugsweep.embedded.check import VERDICT_TEXT, check_endpoint
    from bugsweep.errors import BugsweepError
    from bugsweep.settings import ModelSettings

    model_settings = ModelSettings()
    url = base_url or model_settings.base_url
    name = model or model_settings.model
    try:
        with contextlib.ExitStack() as stack:
            if url is None:
                from bugsweep.embedded.server import ensure_embedded_model

                endpoint = stack.enter_context(
                    ensure_embedded_model(progress=lambda m: typer.echo(m, err=True))
                )
                url, name = endpoint.base_url, endpoint.model
            typer.echo(f"Probing {url} (model {name}) with a few tool-calling requests ...", err=True)
            result = check_endpoint(url, name, model_settings.api_key.get_secret_value())
    except BugsweepError as exc:
        _fail(str(exc))
        return
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        for reply in result.replies:
            call = f"{reply.tool}({(reply.arguments or '')[:70]})" if reply.tool else repr(reply.content[:80])
            typer.echo(f"  {reply.name:<20} {reply.outcome:<7} {call}  [{reply.wall_s:.1f} s]")
        typer.echo(
            f"tool calls: {result.verdict}: {VERDICT_TEXT[result.verdict]} "
            f"(native {result.count('native')}, text {result.count('text')}, none {result.count('none')})"
        )
        prompt = f"{result.prompt_tps:.1f}" if result.prompt_tps else "n/a"
        gen = f"{result.generation_tps:.1f}" if result.generation_tps else "n/a"
        typer.echo(f"speed: prompt {prompt} tok/s, generation {gen} tok/s ({result.speed_source})")
    raise typer.Exit({"native": 0, "text": 1, "none": 2}[result.verdict])
