"""`bugsweep review`: one self-contained HTML page to review a run folder, a sweep or a comparison (bugsweep/review/)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console(highlight=False)


def register(app: typer.Typer) -> None:
    app.command("review")(review_command)


def review_command(
    location: Annotated[
        str,
        typer.Argument(
            help="A run folder (runs/<time>-<task>/), a sweep's or a comparison's folder (e.g. ./artifacts/NAME), "
            "or a sweep in S3: s3://BUCKET/PREFIX/NAME (read with BUGSWEEP_STORE_ENDPOINT_URL and the AWS_* keys).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Where to write the page; default: review.html inside the folder, or in the current folder for s3://.",
        ),
    ] = None,
) -> None:
    """Write one HTML page to review graded runs: every task with its verdict (filterable), and per task the
    evidence (tests fixed, broken, still failing), the diff, the agent's timeline (each tool call, its arguments,
    its result folded; tokens, time and cost per turn) and the configuration it ran under.

    The page is one file: no server, nothing loaded from the internet; open it in any browser, attach it, archive
    it. Every folder below LOCATION that holds a grade.json is one run. Exit code 0, or 2 when LOCATION holds no
    graded run or cannot be read.
    """
    from bugsweep.grading import verdict_label
    from bugsweep.review import write_review

    path, reviewed = write_review(location, out)
    words = [verdict_label(run.grade) for run in reviewed.runs]
    counts = ", ".join(f"{words.count(w)} {w}" for w in dict.fromkeys(words))
    console.print(
        f"wrote {path} ({len(words)} run{'s' if len(words) != 1 else ''}: {counts})", soft_wrap=True
    )
