"""Deployment end to end, as a user runs it (the deployed project: tests/support/deployed.py): a run from the UI's
form on a worker, the run form filled in a browser, and a sweep on workers cancelled from the UI. The night on
three machines is tests/test_night.py (a file of its own, so the two run side by side in the suite).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bugsweep.spec import TaskSpec, dump_tasks
from tests.support.deployed import (
    CHROMIUM,
    Deployed,
    calc_task,
    cgroups_of,
    deploy_project,
    pid_of,
    processes_of,
    sandbox_leftovers,
    sandboxes_in,
)
from tests.support.repos import make_repo

pytest_plugins = ["tests.support.prefect_server", "tests.support.seaweed"]
pytestmark = [pytest.mark.prefect, pytest.mark.s3]

#: Worker -> machine: one takes sweeps and runs, the other runs only.
WORKERS = {"worker-1": "machine-1", "worker-2": "machine-2"}


@pytest.fixture(scope="module")
def deployed(prefect_api, seaweed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    """Blocks created and deployments deployed through the CLI, and two machines' workers on the pool."""
    with deploy_project(prefect_api, seaweed, tmp_path_factory, WORKERS) as result:
        yield result


def test_a_run_from_the_ui_form_is_run_by_a_worker_and_its_patch_lands_in_s3(
    deployed: Deployed, tmp_path: Path
) -> None:
    """The solve-bug form asks for what a one-off fix needs, with help text on every field and titles in words,
    and offers the saved blocks to choose from; a run made from those fields (the UI's Custom run) is run by a
    worker and its patch lands in S3, in the bucket of the S3Bucket block `bugsweep blocks create` saved."""
    schema = deployed.api("GET", "/deployments/name/solve-bug/solve-bug")["parameter_openapi_schema"]
    fields = schema["properties"]
    assert list(fields)[:4] == ["repo", "problem", "test_command", "setup_command"]
    assert fields["test_command"]["default"] == "python -m pytest -q"
    assert all(f.get("description") for f in fields.values()), "every field has help text"
    assert fields["repo"]["title"] == "Repository" and fields["problem"]["title"] == "What is wrong"
    assert fields["limits"]["title"] == "Agent limits"
    # Blocks are chosen from a list of saved blocks, not typed: the fields reference the block types.
    definitions = schema["definitions"]
    for field, block_type in (("store", "s3-bucket"), ("model", "bugsweep-model-endpoint")):
        (ref,) = [choice["$ref"] for choice in fields[field]["anyOf"] if "$ref" in choice]
        assert definitions[ref.rsplit("/", 1)[1]]["block_type_slug"] == block_type
    store_block = deployed.api("GET", "/block_types/slug/s3-bucket/block_documents/name/bugsweep-artifacts")
    repo = make_repo(tmp_path / "calc")
    problem = f"tests/test_calc.py::test_add fails: add() returns the wrong result ({uuid.uuid4().hex[:6]})."
    instance_id = TaskSpec(
        repo=str(repo), problem_statement=problem, test_command="python -m pytest -q"
    ).instance_id

    run_id = deployed.run_deployment(
        "solve-bug/solve-bug",
        {  # the store picked from the list: the UI sends a reference to the block document
            "repo": str(repo), "problem": problem, "sweep": "from-ui",
            "store": {"$ref": {"block_document_id": store_block["id"]}},
        },
    )  # fmt: skip
    run = deployed.wait(run_id)

    assert run["state"]["type"] == "COMPLETED", run["state"]
    folder = deployed.run_folder(f"from-ui/{instance_id}/scripted-model")
    patch = deployed.store.get_bytes(f"{folder}/patch.diff").decode()
    assert "+    return a + b" in patch
    grade = deployed.store.get_bytes(f"{folder}/grade.json").decode()
    assert '"resolved": true' in grade
    assert any(run_id in deployed.worker_log(w) for w in deployed.workers)


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
)
def test_a_person_fills_in_the_run_form_in_a_browser_and_the_run_completes(
    deployed: Deployed, tmp_path: Path
) -> None:
    """The solve-bug run form in headless Chromium, as a person sees it: the repository and the text are required,
    typed text fields (no "(Optional)", no choice of str or None), every field has a title and help, the model
    endpoint and the S3 bucket are block pickers shown directly with the saved blocks chosen, and no image on the page
    is broken but the third-party blocks' own logos (prefect-aws's, from a CDN this machine cannot reach; bugsweep's
    blocks carry none). A person types the two required fields, leaves
    the rest, presses Submit; the run completes on a worker with the saved blocks."""
    from playwright.sync_api import sync_playwright

    base = deployed.server.api_url.removesuffix("/api")
    repo = make_repo(tmp_path / "calc")
    problem = f"tests/test_calc.py::test_add fails: add() returns the wrong result ({uuid.uuid4().hex[:6]})."
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            failed_calls: list[str] = []  # what the page's own API calls got, when it was not a success
            page.on(
                "response",
                lambda r: (
                    failed_calls.append(f"{r.request.method} {r.url} {r.status} {r.text()[:300]}")
                    if r.status >= 400 and "/api/" in r.url
                    else None
                ),
            )
            page.goto(f"{base}/deployments/deployment/{deployed.deployment_id('solve-bug/solve-bug')}/run")
            page.locator("span.schema-form-property__label", has_text="What is wrong").wait_for(
                timeout=60_000
            )
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(tmp_path / "form.png"), full_page=True)

            def field(title: str) -> Any:
                label = page.locator(
                    "span.schema-form-property__label", has_text=re.compile(f"^{re.escape(title)}$")
                )
                return page.locator("div.schema-form-property", has=label).first

            labels = page.locator("span.schema-form-property__label").all_inner_texts()
            assert "Repository" in labels and "What is wrong" in labels, labels  # required: no "(Optional)"
            assert "Commit, branch or tag (Optional)" in labels and "Model endpoint (Optional)" in labels, (
                labels
            )
            for title in (
                "Repository",
                "What is wrong",
                "Commit, branch or tag (Optional)",
                "Folder (Optional)",
            ):
                assert "any-of" not in (field(title).get_attribute("class") or ""), (
                    f"{title}: types to choose"
                )
            assert field("Repository").locator("textarea").count() == 1
            # the block pickers are shown directly, the saved blocks already chosen (deploy made them the defaults)
            for title, saved in (
                ("Model endpoint (Optional)", "bugsweep-model"),
                ("Artifact store (S3 bucket) (Optional)", "bugsweep-artifacts"),
            ):
                picker = field(title).locator(".block-document-input")
                assert picker.is_visible(), f"{title}: no block picker shown"
                assert picker.locator(".p-select-button__value").inner_text().strip() == saved, (
                    picker.inner_text()
                )
            top_level = page.locator("div.schema-form-properties").first.locator(
                ":scope > div.schema-form-property"
            )
            for i in range(top_level.count()):  # a title in words and help under every field
                assert (
                    top_level.nth(i).locator(".schema-form-property__description").first.inner_text().strip()
                )
            assert not any("_" in label for label in labels), labels
            broken = page.evaluate(
                "[...document.images].filter(i => i.complete && i.naturalWidth === 0).map(i => i.src)"
            )
            assert all("cdn.sanity.io" in src for src in broken), broken

            field("Repository").locator("textarea").fill(str(repo))
            field("What is wrong").locator("textarea").fill(problem)
            run_id = ""
            # a busy SQLite server can answer 503 for a moment, and a click can come before the form is ready: a
            # person still on the form presses Submit again (after a 503, or when nothing happened for 30 s)
            submit = page.get_by_role("button", name="Submit")
            clicks, clicked_at, deadline = 0, 0.0, time.monotonic() + 240
            while not run_id and time.monotonic() < deadline:
                again = any(" 503 " in c for c in failed_calls) or time.monotonic() - clicked_at > 30
                if clicks < 6 and again and submit.is_visible():
                    failed_calls.clear()
                    submit.click(timeout=10_000)
                    clicks, clicked_at = clicks + 1, time.monotonic()
                made = deployed.api("POST", "/flow_runs/filter", json={
                    "deployments": {"id": {"any_": [deployed.deployment_id("solve-bug/solve-bug")]}},
                    "sort": "EXPECTED_START_TIME_DESC", "limit": 50,  # the module's other tests made many runs
                })  # fmt: skip
                run_id = next((r["id"] for r in made if r["parameters"].get("problem") == problem), "")
                time.sleep(1)
            if not run_id:
                page.screenshot(path=str(tmp_path / "submitted.png"), full_page=True)
            assert run_id, (
                f"no run made by the form ({failed_calls}); after Submit: {tmp_path / 'submitted.png'}"
            )
        finally:
            browser.close()

    assert (tmp_path / "form.png").stat().st_size > 50_000, "a screenshot of the whole form"
    run = deployed.wait(run_id)
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert run["parameters"]["repo"] == str(repo) and run["parameters"]["problem"] == problem
    # the chosen blocks travel as references: the run's parameters (shown in plain text) hold no key
    model_block = deployed.api(
        "POST", "/block_documents/filter", json={"block_documents": {"name": {"any_": ["bugsweep-model"]}}}
    )
    assert run["parameters"]["model"] == {"$ref": {"block_document_id": model_block[0]["id"]}}
    assert "sk-deploy-secret" not in json.dumps(run["parameters"])


def test_cancelling_a_sweep_cancels_its_task_run_and_releases_its_sandbox(
    deployed: Deployed, tmp_path: Path
) -> None:
    """Cancel a sweep on workers from the UI (the API call its Cancel button makes) while its task's agent runs a
    command in its sandbox: Prefect cancels the sweep's runs (they are its subflows), and the cancelled run's
    sandbox is released."""
    tasks_file = tmp_path / "cancel.jsonl"
    dump_tasks(
        [calc_task(make_repo(tmp_path / "calc"), "calc-cancel", "STALL-ME: add() subtracts")], tasks_file
    )
    sweep_id = deployed.run_deployment(
        "sweep/nightly-sweep",
        {"source": {"kind": "file", "path": str(tasks_file)}, "name": "cancel-sweep", "run_on": "workers"},
    )

    def stalled() -> bool:  # the agent asked for the sleep and got no answer since: it sleeps in its sandbox
        return any("STALL-ME" in json.dumps(r["messages"][:2]) for r in list(deployed.model.requests))

    deadline = time.monotonic() + 180
    while not stalled() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stalled(), f"the task's agent started; worker logs in {deployed.server.logs}"
    (child,) = deployed.runs_tagged("sweep:cancel-sweep")
    assert child["state"]["type"] == "RUNNING" and child["parent_task_run_id"], "a subflow of the sweep"
    machine = deployed.machines[
        next(m for w, m in deployed.worker_machines.items() if pid_of(child) in processes_of(w))
    ]
    sandboxes = sandboxes_in(machine.state_dir, {pid_of(child)})
    assert sandboxes and sandbox_leftovers(sandboxes), "the run holds a mounted sandbox"
    cgroups = cgroups_of(sandboxes)

    deployed.api(
        "POST", f"/flow_runs/{sweep_id}/set_state", json={"state": {"type": "CANCELLING"}, "force": True}
    )

    assert deployed.wait(sweep_id, timeout_s=120)["state"]["type"] == "CANCELLED"
    assert deployed.wait(child["id"], timeout_s=120)["state"]["type"] == "CANCELLED"
    deadline = (
        time.monotonic() + 20
    )  # the state is set as the run's process ends: allow its cleanup to finish
    while sandbox_leftovers(sandboxes, cgroups) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sandbox_leftovers(sandboxes, cgroups) == []
