"""`bugsweep sandboxes ...`: find and delete sandboxes a crashed run left behind.

Sandboxes are always released at the end of a task; these commands are for when the process itself died (a killed
worker, a lost machine). Every bugsweep sandbox carries the label bugsweep=1, and cleanup only ever matches those.
"""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer

sandboxes_app = typer.Typer(
    rich_markup_mode=None,
    help="Sandboxes left behind by crashed runs: list them and delete them by label.",
    no_args_is_help=True,
)

LabelOption = Annotated[
    list[str] | None,
    typer.Option(
        "--label", "-l", help="KEY=VALUE to match (repeatable; all must match), e.g. sweep=nightly."
    ),
]
BackendOption = Annotated[
    str | None,
    typer.Option(
        help="Sandbox backend: 'local' or 'runtime' (default: BUGSWEEP_SANDBOX_BACKEND, else local)."
    ),
]


def configured_backend(backend: str | None) -> str:
    """The backend asked for, or the configured one (BUGSWEEP_SANDBOX_BACKEND; local unless set otherwise)."""
    from bugsweep.settings import SandboxSettings

    chosen = backend or SandboxSettings().backend
    if chosen not in ("local", "runtime"):
        _fail(f"unknown backend {chosen!r}: choose 'local' or 'runtime'")
    return chosen


def register(app: typer.Typer) -> None:
    """Add the `sandboxes` group to the main app."""
    app.add_typer(sandboxes_app, name="sandboxes")


def _fail(message: str, code: int = 2) -> NoReturn:
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
    backend: BackendOption = None,
    all_: Annotated[
        bool, typer.Option("--all", help="With no --label: delete every bugsweep sandbox of the account.")
    ] = False,
) -> None:
    """Delete the bugsweep sandboxes whose labels all match (only those labelled bugsweep=1, never others).

    Example: bugsweep sandboxes cleanup --label sweep=nightly-2026-11-30
    """
    from bugsweep.errors import BugsweepError

    labels = parse_labels(label)
    if configured_backend(backend) == "local":
        cleanup_local()
        return
    if not labels and not all_:
        _fail("give at least one --label KEY=VALUE, or --all to delete every bugsweep sandbox")
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


def cleanup_local() -> None:
    """Remove what this user's killed processes left on this machine (overlay mounts, cgroups, folders), saying
    what.

    Local sandboxes die with the process that made them, so only those whose owner is gone are removed; sandboxes
    of live processes, and another user's, are never touched, whatever their labels.
    """
    from bugsweep.sandbox.local import LocalProvider
    from bugsweep.settings import SandboxSettings

    provider = LocalProvider(SandboxSettings())
    known = {str(entry.get("id")): entry for entry in provider.sandboxes()}
    removed = provider.reap_stale()
    say_removed(removed, known)
    typer.echo(f"{len(removed)} left-over local sandbox(es) removed from {provider.state_dir}")


def say_removed(removed: list[str], known: dict[str, dict[str, object]]) -> None:
    """One line per sandbox removed: whose it was and what went."""
    for name in removed:
        if name not in known:
            typer.echo(f"removed {name} (a folder a dead process left)")
            continue
        entry = known[name]
        have = entry.get("labels") or {}
        tags = ",".join(f"{k}={v}" for k, v in sorted(have.items())) if isinstance(have, dict) else ""
        owner = (
            f"left by process {entry['owner_pid']}" if entry.get("owner_pid") else "left by a dead process"
        )
        typer.echo(f"removed {name} ({owner}{'; ' + tags if tags else ''}): its mount, cgroups and folder")


@sandboxes_app.command("list")
def list_(
    label: LabelOption = None,
    backend: BackendOption = None,
) -> None:
    """List the bugsweep sandboxes whose labels all match: id, state (local: owner running or left over), labels."""
    from bugsweep.errors import BugsweepError

    if configured_backend(backend) == "local":
        from bugsweep.sandbox.local import LocalProvider
        from bugsweep.settings import SandboxSettings

        wanted = parse_labels(label)
        local = LocalProvider(SandboxSettings())
        layers = local.env_cache.layers()
        size = sum(int(str(entry["bytes"])) for entry in layers) / 2**20
        typer.echo(f"task environments: {local.env_cache.root} ({len(layers)} layers, {size:.0f} MiB)")
        for entry in local.sandboxes():
            have = entry.get("labels") or {}
            if isinstance(have, dict) and all(have.get(k) == v for k, v in wanted.items()):
                tags = ",".join(f"{k}={v}" for k, v in sorted(have.items()))
                alive = "running" if entry.get("owner_alive") else "left over"
                typer.echo(f"{entry.get('id')}\towner pid {entry.get('owner_pid', '?')} ({alive})\t{tags}")
        return
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
