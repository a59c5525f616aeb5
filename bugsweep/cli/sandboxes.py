"""`bugsweep sandboxes ...`: find and delete sandboxes a crashed run left behind.

Sandboxes are always released at the end of a task; these commands are for when the process itself died (a killed
worker, a lost machine). Every bugsweep sandbox carries the label bugsweep=1, and cleanup only ever matches those.
"""

from __future__ import annotations

from typing import Annotated

import typer

sandboxes_app = typer.Typer(
    help="Sandboxes left behind by crashed runs: list them and delete them by label.",
    no_args_is_help=True,
)

LabelOption = Annotated[
    list[str] | None,
    typer.Option(
        "--label", "-l", help="KEY=VALUE to match (repeatable; all must match), e.g. sweep=nightly."
    ),
]
BackendOption = Annotated[str, typer.Option(help="Sandbox backend: 'runtime' (cloud) or 'local'.")]


def register(app: typer.Typer) -> None:
    """Add the `sandboxes` group to the main app."""
    app.add_typer(sandboxes_app, name="sandboxes")


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def parse_labels(items: list[str] | None) -> dict[str, str]:
    """["sweep=a", "task=b"] -> {"sweep": "a", "task": "b"}; a malformed item is a usage error."""
    labels: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            _fail(f"--label takes KEY=VALUE, not {item!r}")
        labels[key.strip()] = value.strip()
    return labels


@sandboxes_app.command("cleanup")
def cleanup(
    label: LabelOption = None,
    backend: BackendOption = "runtime",
    all_: Annotated[
        bool, typer.Option("--all", help="With no --label: delete every bugsweep sandbox of the account.")
    ] = False,
) -> None:
    """Delete the bugsweep sandboxes whose labels all match (only those labelled bugsweep=1, never others).

    Example: bugsweep sandboxes cleanup --label sweep=nightly-2026-11-30
    """
    from bugsweep.errors import BugsweepError

    labels = parse_labels(label)
    if backend == "local":
        # Local sandboxes die with the process that made them; what a killed process left (mounts, cgroups,
        # folders) is reaped here. Sandboxes of live processes are never touched, whatever their labels.
        from bugsweep.sandbox.local import LocalProvider
        from bugsweep.settings import SandboxSettings

        removed = LocalProvider(SandboxSettings()).reap_stale()
        for name in removed:
            typer.echo(f"removed {name}")
        typer.echo(f"{len(removed)} left-over local sandboxes removed")
        return
    if not labels and not all_:
        _fail("give at least one --label KEY=VALUE, or --all to delete every bugsweep sandbox")
    if backend != "runtime":
        _fail(f"unknown backend {backend!r}: choose 'runtime' or 'local'")
    from bugsweep.sandbox.runtime import RuntimeProvider

    provider = RuntimeProvider()
    try:
        report = provider.cleanup(labels)
    except BugsweepError as exc:
        _fail(str(exc), 1)
        return
    finally:
        provider.close()
    for sandbox_id in report.deleted:
        typer.echo(f"deleted {sandbox_id}")
    for sandbox_id, why in report.failed:
        typer.secho(f"failed {sandbox_id}: {why}", fg=typer.colors.RED, err=True)
    typer.echo(f"{len(report.deleted)} deleted, {len(report.failed)} failed")
    if report.failed:
        raise typer.Exit(1)


@sandboxes_app.command("list")
def list_(
    label: LabelOption = None,
    backend: BackendOption = "runtime",
) -> None:
    """List the live bugsweep sandboxes whose labels all match: id, state, labels."""
    from bugsweep.errors import BugsweepError

    if backend == "local":
        from bugsweep.sandbox.local import LocalProvider
        from bugsweep.settings import SandboxSettings

        wanted = parse_labels(label)
        for entry in LocalProvider(SandboxSettings()).sandboxes():
            have = entry.get("labels") or {}
            if isinstance(have, dict) and all(have.get(k) == v for k, v in wanted.items()):
                tags = ",".join(f"{k}={v}" for k, v in sorted(have.items()))
                alive = "running" if entry.get("owner_alive") else "left over"
                typer.echo(f"{entry.get('id')}\towner pid {entry.get('owner_pid', '?')} ({alive})\t{tags}")
        return
    if backend != "runtime":
        _fail(f"unknown backend {backend!r}: choose 'runtime' or 'local'")
    from bugsweep.sandbox.runtime import RuntimeProvider

    provider = RuntimeProvider()
    try:
        found = provider.list(parse_labels(label))
    except BugsweepError as exc:
        _fail(str(exc), 1)
        return
    finally:
        provider.close()
    for info in found:
        labels = ",".join(f"{k}={v}" for k, v in sorted((info.get("labels") or {}).items()))
        typer.echo(f"{info['id']}\t{info.get('state', '')}\t{labels}")
    if not found:
        typer.echo("no matching sandboxes")
