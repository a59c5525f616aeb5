"""`bugsweep deploy` and `bugsweep worker`: the pipeline put onto machines (deployments, work pool, automations;
the workers that take its runs). docs/pipeline.md walks through both, and through adding a second machine.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from bugsweep.cli.pipeline import _fail, console

#: How often `bugsweep worker` asks the server for new runs (Prefect's default is 10 s).
WORKER_QUERY_S = 2


# -- deploy -------------------------------------------------------------------------------------------------------


def deploy_command(
    pool: Annotated[str, typer.Option(help="Work pool to create (if missing) and deploy onto.")] = "bugsweep",
    pool_type: Annotated[
        str, typer.Option(help="Work pool type when it is created: process, docker, kubernetes, ...")
    ] = "process",
    heartbeat_s: Annotated[
        int,
        typer.Option(
            min=30,
            help="Seconds between a flow run's heartbeats (30 is Prefect's shortest); a run silent for two of them "
            "is marked Crashed, and a crashed solve-bug run or sweep is run again.",
        ),
    ] = 30,
    tasks: Annotated[
        str | None,
        typer.Option(
            help="The nightly sweep's tasks file: a file on this machine (put into the artifact store's "
            "task-files/ when that is S3, so a sweep on any machine reads it; else recorded as an absolute path) or "
            "s3://BUCKET/KEY; default: prefect.yaml's `source`."
        ),
    ] = None,
) -> None:
    """Create the work pool, deploy what prefect.yaml lists (solve-bug, nightly-sweep, nightly-benchmark), and the
    crash automations.

    Run it in the project folder (the one holding prefect.yaml); the deployments record no path of it: a worker
    on any machine with the same bugsweep installed runs them. Needs a running Prefect server (PREFECT_API_URL).
    `nightly-sweep` is deployed with its schedule paused, and says why, when its task source does not exist. A run
    whose heartbeats stop is marked Crashed, and a crashed solve-bug run or sweep is run once more. Then start
    `bugsweep worker --pool POOL` on every machine that should take runs, and trigger runs from the UI.
    """
    if not os.environ.get("PREFECT_API_URL"):
        _fail(
            "set PREFECT_API_URL to your Prefect server (e.g. http://127.0.0.1:4200/api after `prefect server start`)"
        )
    from bugsweep.errors import BugsweepError
    from deployments import deploy, worker_command

    try:
        result = deploy(pool=pool, pool_type=pool_type, heartbeat_s=heartbeat_s, nightly_tasks=tasks)
    except BugsweepError as exc:
        _fail(str(exc))
    console.print(f"work pool [bold]{result.pool}[/] {'created' if result.pool_created else 'already there'}")
    for name in result.deployments:
        if name in result.paused:
            console.print(
                f"deployed [bold]{name}[/] [yellow]with its schedule PAUSED[/]: {result.paused[name]}"
            )
        else:
            console.print(f"deployed [bold]{name}[/]")
        if name in result.task_sources:
            console.print(f"  its tasks: {result.task_sources[name]}", soft_wrap=True)
    if result.chosen_blocks:
        console.print(
            f"the run forms offer the saved blocks {', '.join(result.chosen_blocks)}, already chosen"
        )
    else:
        console.print(
            "no saved blocks to choose in the run forms (`bugsweep blocks create`, then deploy again); runs use "
            "the worker's environment"
        )
    console.print(f"automation [bold]{result.automation}[/] (heartbeats every {heartbeat_s} s)")
    console.print(f"automation [bold]{result.pending_automation}[/]")
    console.print(f"automation [bold]{result.rerun_automation}[/]")
    console.print(
        f"next: start a worker with `{worker_command(result.pool)}`, then run a deployment from the UI"
    )


def worker_command(
    pool: Annotated[str, typer.Option(help="Work pool to take runs from.")] = "bugsweep",
    limit: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Tasks this machine runs at once (solve-bug runs, a sweep's tasks among them, and the nightly "
            "benchmark); default: half its cores, and no more than its memory holds at BUGSWEEP_SANDBOX_MEMORY_MIB "
            "each.",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="The worker's name in the UI (its sweep worker: NAME-sweeps).")
    ] = None,
    sweeps: Annotated[
        bool,
        typer.Option(
            help="Also take sweeps (their own queue, `sweeps`), with a worker of their own that takes no slot of "
            "--limit: a sweep only waits for its tasks."
        ),
    ] = True,
    extra: Annotated[
        list[str] | None, typer.Argument(help="More options for `prefect worker start` (after --).")
    ] = None,
) -> None:
    """This machine's Prefect workers on the pool: one for tasks (at most --limit at once), one for sweeps.

    Removes the sandboxes this user's dead processes left on this machine first, and again every 30 s while it
    runs: a worker killed with its flow runs (out of memory, a lost node) leaves their local sandboxes behind
    (overlay mounts, cgroups, folders); a live worker of the same user on the machine removes them within about
    30 s, and a new one as it starts. Another user's sandboxes are never touched. The workers look for new runs
    every 2 s (PREFECT_WORKER_QUERY_SECONDS, Prefect's default 10 s), so a run started from the UI starts sooner
    (bench/README.md). Runs keep their results (BUGSWEEP_STORE_LOCAL_DIR, default ./artifacts) in the folder
    the worker was started in. Start one on every machine that should take runs: the saved blocks are all the
    machines share (docs/pipeline.md, "Scale out").
    """
    from bugsweep.cli.sandboxes import cleanup_local, say_removed
    from bugsweep.sandbox.local import LocalProvider
    from bugsweep.settings import SandboxSettings
    from deployments.worker import absolute_local_dir, default_limit, run_workers, worker_commands

    cleanup_local()

    def report(removed: list[str], known: dict[str, dict[str, object]]) -> None:
        say_removed(removed, known)
        sys.stdout.flush()

    settings = SandboxSettings()
    LocalProvider(settings).reaper(report=report).start()
    os.environ.setdefault("PREFECT_WORKER_QUERY_SECONDS", str(WORKER_QUERY_S))
    os.environ["BUGSWEEP_STORE_LOCAL_DIR"] = absolute_local_dir()
    tasks_at_once = limit or default_limit(settings.memory_mib)
    commands = worker_commands(pool, tasks_at_once, name=name, sweeps=sweeps, extra=extra)
    console.print(
        f"{tasks_at_once} task(s) at once on this machine; results kept in {os.environ['BUGSWEEP_STORE_LOCAL_DIR']}",
        soft_wrap=True,
    )
    raise typer.Exit(run_workers(commands, say=lambda line: console.print(line, soft_wrap=True)))
