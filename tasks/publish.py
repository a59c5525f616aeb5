"""What a graded run shows in the Prefect UI, and a late upload that turns its run green.

Every link put into an artifact opens for a person who can see the Prefect UI, the bucket private or not: a
presigned GET (bugsweep.storage.S3Store.link), whose expiry the artifact states (BUGSWEEP_STORE_LINK_DAYS, 7 days
by default, the longest SigV4 allows). A store with no such link (a folder on the worker) gets no link: the
artifact names the path, and the content that fits is in the artifact itself.
- The patch: a link artifact to the stored object, and the diff itself, bounded, in a markdown artifact, so a
  reviewer sees the fix without opening anything.
- A sweep's review page (bugsweep review): stored beside its runs as SWEEP/review.html, and linked.
- A run whose upload failed ends Failed with its grade kept on the worker. Once that grade reaches the store (a
  rerun of the task, a sweep as it starts, or `bugsweep upload`), the same artifacts are made, and the run that
  made the grade is set Completed with a message saying when and where its grade went.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from prefect.artifacts import create_link_artifact, create_markdown_artifact

from bugsweep.grading import Grade, verdict_word
from bugsweep.storage import GRADE_FILE, ArtifactStore, Link, key_part
from bugsweep.sweep.task import made_by

log = logging.getLogger(__name__)

#: The most of a patch the markdown artifact shows (the whole patch is in the store).
PATCH_SHOWN_CHARS = 30_000


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower())).strip("-")[:200]


def _tests(ids: list[str], limit: int = 10) -> str:
    shown = ", ".join(f"`{t}`" for t in ids[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def tests_line(verdict: Grade) -> str:
    """What the grade says of the tests, in one line: those that failed before (fixed, or still failing), and
    those the change broke."""
    before = verdict.FAIL_TO_PASS + verdict.FAIL_TO_FAIL
    if before:
        parts = [f"Failing before: {_tests(before)}."]
    elif verdict.failed_before:
        parts = ["Failing before: yes (no per-test results)."]
    else:
        parts = ["Failing before: none."]
    if verdict.FAIL_TO_PASS and verdict.FAIL_TO_FAIL:
        parts.append(f"Fixed: {_tests(verdict.FAIL_TO_PASS)}; still failing: {_tests(verdict.FAIL_TO_FAIL)}.")
    elif verdict.FAIL_TO_FAIL:
        parts.append("Still failing after: all of them.")
    elif verdict.FAIL_TO_PASS:
        parts.append("Passing after: all of them.")
    broken = verdict.PASS_TO_FAIL + verdict.PASS_TO_MISSING
    if broken:
        parts.append(f"Broken by the change: {_tests(broken)}.")
    return " ".join(parts)


def patch_markdown(verdict: Grade, patch: str, where: str, link: Link | None = None) -> str:
    """The diff as a reviewer reads it in the UI: what it fixed, where the whole patch is, and the diff (bounded)."""
    shown = patch[:PATCH_SHOWN_CHARS]
    cut = len(patch) - len(shown)
    fence = "````" if "```" in shown else "```"
    whole = f"[the whole patch]({link.url}) ({link.until()})" if link else f"`{where}`"
    lines = [
        f"# Patch for `{verdict.instance_id}` by `{verdict.model}`: {verdict_word(verdict)}",
        "",
        f"{tests_line(verdict)} Turns {verdict.turns}, "
        f"{verdict.prompt_tokens + verdict.completion_tokens:,} tokens, ${verdict.cost_usd:.4f}. Stored at "
        f"`{where}`" + (f": {whole}." if link else "."),
        "",
        f"{fence}diff",
        shown.rstrip("\n"),
        fence,
    ]
    if cut:
        lines += ["", f"*({cut:,} more characters not shown: {whole}.)*"]
    return "\n".join(lines) + "\n"


def publish_patch(store: ArtifactStore, key: str, verdict: Grade, local_dir: Path) -> None:
    """The link to the stored patch (when the store has links) and the diff itself, as artifacts of the current
    flow run (or, outside one, of none: they are still listed under their keys)."""
    patch_file = local_dir / "patch.diff"
    if patch_file.is_file():
        publish_patch_text(store, key, verdict, patch_file.read_text(encoding="utf-8", errors="replace"))


def publish_stored_patch(store: ArtifactStore, key: str, verdict: Grade) -> None:
    """The same artifacts for a run folder already in the store (a task a worker ran: the sweep shows it too)."""
    try:
        patch = store.get_bytes(f"{key}/patch.diff").decode("utf-8", errors="replace")
    except FileNotFoundError:
        return
    publish_patch_text(store, key, verdict, patch)


def publish_patch_text(store: ArtifactStore, key: str, verdict: Grade, patch: str) -> None:
    where = store.uri(f"{key}/patch.diff")
    link = store.link(f"{key}/patch.diff")
    status = verdict_word(verdict)
    if link is not None:
        create_link_artifact(
            link=link.url,
            link_text=f"{where} ({link.until()})",
            key=artifact_key("patch", key),
            description=f"Patch for {verdict.instance_id} by {verdict.model} ({status}). The link "
            f"{link.until()} (BUGSWEEP_STORE_LINK_DAYS); the object stays at {where}.",
        )
    create_markdown_artifact(
        patch_markdown(verdict, patch, where, link),
        key=artifact_key("diff", key),
        description=f"The diff of {verdict.instance_id} by {verdict.model} ({status}).",
    )


@dataclass(frozen=True)
class ReviewPage:
    """Where a sweep's review page was stored, and the link that opens it (None for a folder store)."""

    uri: str
    link: Link | None

    def markdown(self) -> str:
        """The page in a sentence of a summary."""
        if self.link is None:
            return f"Review page: `{self.uri}` (on the machine that ran the sweep)."
        return f"[Review page]({self.link.url}) ({self.link.until()}; stored at `{self.uri}`)."


def publish_review(store: ArtifactStore, sweep: str) -> ReviewPage:
    """The sweep's review page (every run in its folder of the store, this run's and earlier ones'), stored as
    SWEEP/review.html and linked by an artifact (when the store has links). Raises what stopped it: the flow
    reports a page that could not be made on the run itself (a failed step, and its final state's message)."""
    from bugsweep.review import store_review

    key = store_review(store, key_part(sweep))
    page = ReviewPage(uri=store.uri(key), link=store.link(key))
    if page.link is not None:
        create_link_artifact(
            link=page.link.url,
            link_text=f"{page.uri} ({page.link.until()})",
            key=artifact_key("sweep", sweep, "review"),
            description=f"Review page of sweep {sweep}: every task's verdict, evidence, diff and timeline (one HTML "
            f"file). The link {page.link.until()} (BUGSWEEP_STORE_LINK_DAYS); after that, `bugsweep review "
            f"{store.uri(key_part(sweep))} -o review.html` makes it again.",
        )
    return page


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
