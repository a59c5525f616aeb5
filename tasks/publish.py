"""What a graded run shows in the Prefect UI, and a late upload that turns its run green.

- The patch: a link artifact to the stored object (a lasting address with no key in it, unlike a presigned URL),
  and the diff itself, bounded, in a markdown artifact, so a reviewer sees the fix without S3 access.
- A sweep's review page (bugsweep review): stored beside its runs as SWEEP/review.html, and linked.
- A run whose upload failed ends Failed with its grade kept on the worker. Once that grade reaches the store (a
  rerun of the task, a sweep as it starts, or `bugsweep upload`), the same artifacts are made, and the run that
  made the grade is set Completed with a message saying when and where its grade went.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from uuid import UUID

from prefect.artifacts import create_link_artifact, create_markdown_artifact

from bugsweep.errors import BugsweepError
from bugsweep.grading import Grade, verdict_word
from bugsweep.storage import GRADE_FILE, ArtifactStore, key_part

log = logging.getLogger(__name__)

#: The most of a patch the markdown artifact shows (the whole patch is in the store).
PATCH_SHOWN_CHARS = 30_000
#: The run folder's record of the flow run that made it (flows.solve_bug.write_run_record).
RUN_FILE = "run.json"


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower())).strip("-")[:200]


def patch_markdown(verdict: Grade, patch: str, where: str) -> str:
    """The diff as a reviewer reads it in the UI: what it fixed, where the whole patch is, and the diff (bounded)."""
    shown = patch[:PATCH_SHOWN_CHARS]
    cut = len(patch) - len(shown)
    fence = "````" if "```" in shown else "```"
    lines = [
        f"# Patch for `{verdict.instance_id}` by `{verdict.model}`: {verdict_word(verdict)}",
        "",
        f"Failing before: {', '.join(f'`{t}`' for t in verdict.FAIL_TO_PASS[:10]) or '-'}. "
        f"Turns {verdict.turns}, {verdict.prompt_tokens + verdict.completion_tokens:,} tokens, "
        f"${verdict.cost_usd:.4f}. Stored at `{where}`.",
        "",
        f"{fence}diff",
        shown.rstrip("\n"),
        fence,
    ]
    if cut:
        lines += ["", f"*({cut:,} more characters not shown: the whole patch is at `{where}`.)*"]
    return "\n".join(lines) + "\n"


def publish_patch(store: ArtifactStore, key: str, verdict: Grade, local_dir: Path) -> None:
    """The link to the stored patch and the diff itself, as artifacts of the current flow run (or, outside one,
    of none: they are still listed under their keys)."""
    patch_file = local_dir / "patch.diff"
    if not patch_file.is_file():
        return
    where = store.uri(f"{key}/patch.diff")
    status = verdict_word(verdict)
    create_link_artifact(
        link=store.link(f"{key}/patch.diff"),
        link_text=where,
        key=artifact_key("patch", key),
        description=f"Patch for {verdict.instance_id} by {verdict.model} ({status}).",
    )
    create_markdown_artifact(
        patch_markdown(verdict, patch_file.read_text(encoding="utf-8", errors="replace"), where),
        key=artifact_key("diff", key),
        description=f"The diff of {verdict.instance_id} by {verdict.model} ({status}).",
    )


def publish_review(store: ArtifactStore, sweep: str) -> str | None:
    """The sweep's review page (every run in its folder of the store, this run's and earlier ones'), stored as
    SWEEP/review.html and linked by an artifact; returns its link. Best effort: the grades are stored either way,
    so a page that cannot be made or stored is logged and the sweep goes on (None)."""
    from bugsweep.review import store_review

    try:
        key = store_review(store, key_part(sweep))
    except BugsweepError as exc:
        log.error("no review page for sweep %s: %s", sweep, exc)
        return None
    except (
        Exception
    ):  # a bug in making the page: its traceback in the log; the sweep's state stays the grades'
        log.exception("no review page for sweep %s: making it failed", sweep)
        return None
    link = store.link(key)
    create_link_artifact(
        link=link,
        link_text=store.uri(key),
        key=artifact_key("sweep", sweep, "review"),
        description=f"Review page of sweep {sweep}: every task's verdict, evidence, diff and timeline (one HTML file).",
    )
    return link


def made_by(local_dir: Path) -> str | None:
    """The id of the flow run that wrote this run folder, if it recorded one."""
    try:
        return json.loads((local_dir / RUN_FILE).read_text(encoding="utf-8")).get("flow_run_id") or None
    except (OSError, ValueError, AttributeError):
        return None


def complete_late(flow_run_id: str, where: str, by: str) -> bool:
    """Set a flow run that ended Failed only because its upload failed to Completed, now that its grade is at
    `where`. Returns whether its state changed (a run in any other state is left alone)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Completed

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(flow_run_id))
        if run.state is None or not run.state.is_failed():
            return False
        message = f"graded; its upload had failed, and {by} uploaded its grade to {where}"
        client.set_flow_run_state(run.id, Completed(message=message), force=True)
    log.info("flow run %s: %s", flow_run_id, message)
    return True


def after_late_upload(store: ArtifactStore, key: str, local_dir: Path, by: str) -> str | None:
    """A kept run folder was just uploaded under `key`: make the artifacts its run would have made, and turn that
    run Completed when its grade is a real grade. Returns the id of the run turned Completed, if one was. Needs a
    Prefect server (PREFECT_API_URL, or a flow run's own); without one, nothing is done."""
    if not os.environ.get("PREFECT_API_URL"):
        from prefect.context import FlowRunContext

        if FlowRunContext.get() is None:
            return None
    try:
        verdict = Grade.model_validate_json((local_dir / GRADE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    publish_patch(store, key, verdict, local_dir)
    run_id = made_by(local_dir)
    if verdict.error or run_id is None:
        return None
    return run_id if complete_late(run_id, store.uri(key), by) else None
