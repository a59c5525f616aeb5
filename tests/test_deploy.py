"""Deployment end to end, as a user runs it: server, blocks, deploy, runs from the UI's API, process workers:
one run, a sweep shared by two workers, and a run cancelled mid-task.

Real parts: `prefect server start` (SQLite, its own PREFECT_HOME), `bugsweep blocks create` and `bugsweep deploy`
run as commands, two `prefect worker start` process workers running the flows in their own processes, the
local sandbox, a SeaweedFS S3 server. The run is created with `POST /api/deployments/{id}/create_flow_run`,
the call the UI's Run button makes. Stand-in: the scripted model server (real HTTP) in place of a model.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bugsweep.spec import TaskSpec, dump_tasks
from tests.support.repos import PYTEST_SETUP, make_repo
from tests.support.scripted_model import ScriptedModelServer, tool_call

pytest_plugins = ["tests.support.prefect_server", "tests.support.seaweed"]
pytestmark = [pytest.mark.prefect, pytest.mark.s3]

PROJECT = Path(__file__).resolve().parent.parent
POOL = "bugsweep-test"
#: The shortest heartbeat Prefect allows: the crash automation then marks a silent run Crashed after 90 s.
HEARTBEAT_S = 30
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


#: Set once the KILL-ME run's processes are killed: its rerun is then answered like any other task.
KILLED = {"rerun": False}


def fixer(body: dict[str, Any]) -> dict[str, Any]:
    """Fix on the first turn, finish on the next; works for any number of tasks at once.

    A task whose text says CANCEL-ME (or KILL-ME, until it was killed) instead runs a command, then stalls the next
    reply, so the run is mid-task when the test cancels (or kills) it."""
    cancel_me = "CANCEL-ME" in json.dumps(body["messages"][:2])
    kill_me = "KILL-ME" in json.dumps(body["messages"][:2]) and not KILLED["rerun"]
    answered = any(m.get("role") == "tool" for m in body["messages"])
    if kill_me:  # stalls long enough for the test to kill the worker and see the run marked Crashed
        return (
            {"sleep": 300, **tool_call("finish", summary="too late")}
            if answered
            else tool_call("run", command="true")
        )
    if cancel_me:
        if answered:
            return {"sleep": 45, **tool_call("finish", summary="too late")}
        return tool_call("run", command="python -m pytest -q || true")
    if answered:
        return tool_call("finish", summary="add() now adds")
    return tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")


class Deployed:
    """The deployed project: the server, the S3 store the runs write to, and helpers for the REST API."""

    def __init__(self, server: Any, store: Any, model: ScriptedModelServer, workers: list[str]) -> None:
        self.server, self.store, self.model, self.workers = server, store, model, workers

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """One REST call (a 503 for a moment is tried again: PrefectServer.request)."""
        response = self.server.request(method, path, **kwargs)
        response.raise_for_status()
        return response.json()

    def deployment_id(self, name: str) -> str:
        return str(self.api("GET", f"/deployments/name/{name}")["id"])

    def run_deployment(self, name: str, parameters: dict[str, Any]) -> str:
        """What the UI's Run button does (with a custom parameter form)."""
        url = f"/deployments/{self.deployment_id(name)}/create_flow_run"
        return str(self.api("POST", url, json={"parameters": parameters})["id"])

    def wait(self, flow_run_id: str, timeout_s: float = 240, through_rerun: bool = False) -> dict[str, Any]:
        """The run once it is final (`through_rerun`: a first crash is not, the rerun automation runs it again)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.api("GET", f"/flow_runs/{flow_run_id}")
            crashed_once = run["state"] and run["state"]["type"] == "CRASHED" and run["run_count"] < 2
            if run["state"] and run["state"]["type"] in FINAL and not (through_rerun and crashed_once):
                return dict(run)
            time.sleep(1)
        raise AssertionError(
            f"flow run {flow_run_id} not finished after {timeout_s} s; worker logs in {self.server.logs}"
        )

    def worker_log(self, name: str) -> str:
        return (self.server.logs / f"{name}.log").read_text(errors="replace")

    def run_folder(self, prefix: str) -> str:
        """The one run folder under SWEEP/TASK/MODEL: SWEEP/TASK/MODEL/CONFIG (the configuration's digest)."""
        (grade,) = [k for k in self.store.list(prefix) if k.endswith("/grade.json")]
        return grade.rsplit("/", 1)[0]


@pytest.fixture(scope="module")
def deployed(prefect_api, seaweed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    """Blocks created and deployments deployed through the CLI, and two process workers on the pool."""
    model = ScriptedModelServer([fixer] * 200).start()
    store = seaweed.new_store(prefix="runs")
    env = {
        "LLM_BASE_URL": model.base_url,
        "LLM_MODEL": "scripted-model",
        "LLM_API_KEY": "sk-deploy-secret",
        "BUGSWEEP_STORE_URL": f"s3://{store.bucket}/runs",
        "BUGSWEEP_STORE_LOCAL_DIR": str(tmp_path_factory.mktemp("local-artifacts")),
        "AWS_ENDPOINT_URL": seaweed.endpoint_url,
        "AWS_ACCESS_KEY_ID": "bugsweep-test",
        "AWS_SECRET_ACCESS_KEY": "bugsweep-test-secret",
        "BUGSWEEP_RETRY_DELAYS_S": "0.5,1",
    }
    bugsweep = [sys.executable, "-m", "bugsweep"]
    try:
        created = prefect_api.run([*bugsweep, "blocks", "create"], cwd=PROJECT, **env)
        assert "sk-deploy-secret" not in created and "bugsweep-test-secret" not in created
        assert "bugsweep-model" in created and "bugsweep-artifacts" in created
        deploy = [*bugsweep, "deploy", "--pool", POOL, "--heartbeat-s", str(HEARTBEAT_S)]
        deployed_out = " ".join(prefect_api.run(deploy, cwd=PROJECT, **env).split())
        assert "solve-bug/solve-bug" in deployed_out and "sweep/nightly-sweep" in deployed_out
        # The project has no tasks.jsonl: the nightly schedule would fail every night, so it is deployed paused.
        assert not (PROJECT / "tasks.jsonl").exists()
        assert (
            f"sweep/nightly-sweep with its schedule PAUSED: its task source '{PROJECT / 'tasks.jsonl'}' does not "
            "exist on this machine" in deployed_out
        )
        assert (
            "grow-benchmark/nightly-benchmark with its schedule PAUSED: its parameters name no repository"
            in deployed_out
        )
        nightly = prefect_api.request("GET", "/deployments/name/sweep/nightly-sweep").json()
        assert nightly["paused"] is True
        solve_bug = prefect_api.request("GET", "/deployments/name/solve-bug/solve-bug").json()
        assert solve_bug["paused"] is False
        assert (
            "the run forms offer the saved blocks bugsweep-model, bugsweep-artifacts, already chosen"
            in deployed_out
        )
        assert set(solve_bug["parameters"]) >= {"model", "store"}, solve_bug["parameters"]
        assert "sk-deploy-secret" not in json.dumps(solve_bug) + json.dumps(nightly)
        assert solve_bug["job_variables"]["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == str(HEARTBEAT_S)
        workers = ["worker-a", "worker-b"]
        for name in workers:
            prefect_api.spawn(
                name,
                [
                    sys.executable,
                    "-m",
                    "prefect",
                    "worker",
                    "start",
                    "--pool",
                    POOL,
                    "--name",
                    name,
                    "--limit",
                    "2",
                ],
                cwd=tmp_path_factory.mktemp(name),
                PREFECT_WORKER_QUERY_SECONDS="1",
                PREFECT_WORKER_PREFETCH_SECONDS="0",
                # the worker's own settings (the store's bucket and keys come from the blocks)
                **{k: v for k, v in env.items() if k.startswith(("BUGSWEEP_RETRY", "BUGSWEEP_STORE_LOCAL"))},
            )
        yield Deployed(prefect_api, store, model, workers)
    finally:
        for proc in prefect_api.processes[
            1:
        ]:  # the workers (and the flow runs they started); the server stays
            prefect_api.stop_process(proc)
        del prefect_api.processes[1:]
        model.stop()


def calc_task(repo: Path, instance_id: str) -> TaskSpec:
    return TaskSpec(
        instance_id=instance_id,
        repo=str(repo),
        problem_statement="tests/test_calc.py::test_add fails: add() returns the wrong result. Fix the code.",
        test_command="python -m pytest -q",
        setup_command=PYTEST_SETUP,
    )


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


CHROMIUM = Path("/usr/bin/chromium")  # Debian's, driven by Playwright (no browser download)


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


@pytest.fixture(scope="module")
def nightly(deployed: Deployed, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`bugsweep deploy --tasks FILE` (the first night's step), then a run of the nightly as its schedule makes it
    (no parameters), taken by a worker that runs in another folder: what `deploy` printed, the file, the run."""
    tmp_path = tmp_path_factory.mktemp("nightly")
    repo = make_repo(tmp_path / "calc")
    tasks_file = tmp_path / "team" / "nightly.jsonl"
    tasks_file.parent.mkdir()
    dump_tasks([calc_task(repo, "calc-nightly")], tasks_file)
    bugsweep = [sys.executable, "-m", "bugsweep", "deploy", "--pool", POOL, "--heartbeat-s", str(HEARTBEAT_S)]
    out = " ".join(deployed.server.run([*bugsweep, "--tasks", str(tasks_file)], cwd=PROJECT).split())
    run = deployed.wait(deployed.run_deployment("sweep/nightly-sweep", {}))
    return {"out": out, "tasks_file": tasks_file, "run": run}


def test_the_nightly_deployed_with_a_tasks_file_is_resumed_and_a_worker_runs_it(
    deployed: Deployed, nightly: dict[str, Any]
) -> None:
    """`bugsweep deploy --tasks FILE`: the nightly is deployed active, with the file's absolute path as its source,
    and a run of it as the schedule makes it completes on a worker, with the task's grade in S3 and a final
    message that says what the night did."""
    out, tasks_file, run = nightly["out"], nightly["tasks_file"], nightly["run"]
    assert "deployed sweep/nightly-sweep" in out and "nightly-sweep with its schedule PAUSED" not in out
    nightly_deployment = deployed.api("GET", "/deployments/name/sweep/nightly-sweep")
    assert nightly_deployment["paused"] is False
    assert nightly_deployment["parameters"]["source"] == {"kind": "file", "path": str(tasks_file)}
    fields = nightly_deployment["parameter_openapi_schema"]["properties"]
    untitled = [
        n
        for n, f in fields.items()
        if not f.get("description") or f.get("title", n) == n or "_" in f.get("title", "")
    ]
    assert untitled == [], f"the sweep form shows raw names or no help for {untitled}"
    assert "sk-deploy-secret" not in json.dumps(nightly_deployment), (
        "no block's fields (a key) in a deployment"
    )
    solve_bug = deployed.api("GET", "/deployments/name/solve-bug/solve-bug")
    assert "sk-deploy-secret" not in json.dumps(solve_bug) and "bugsweep-test-secret" not in json.dumps(
        solve_bug
    )
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert run["state"]["message"] == (
        "sweep nightly COMPLETED: 1 task(s) graded: 1 resolved, 0 not resolved, 0 held for review, 0 could not run"
    )
    assert (
        '"resolved": true'
        in deployed.store.get_bytes(
            f"{deployed.run_folder('nightly/calc-nightly/scripted-model')}/grade.json"
        ).decode()
    )


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
)
def test_a_reviewer_opens_the_patch_and_the_review_page_from_the_run_page_on_a_private_bucket(
    deployed: Deployed, nightly: dict[str, Any], tmp_path: Path
) -> None:
    """The morning in Chromium: the bucket is private (an anonymous GET is refused), yet from the nightly run's
    page in the Prefect UI (its Artifacts tab, an artifact, its link) the patch opens as the diff and the review
    page as the page, each link saying until when it opens."""
    from playwright.sync_api import sync_playwright

    folder = deployed.run_folder("nightly/calc-nightly/scripted-model")
    patch = deployed.store.get_bytes(f"{folder}/patch.diff").decode()
    endpoint = deployed.store.client.meta.endpoint_url
    for key in (f"{folder}/patch.diff", "nightly/review.html"):
        assert httpx.get(f"{endpoint}/{deployed.store.bucket}/runs/{key}").status_code == 403, (
            "a private bucket"
        )
    base = deployed.server.api_url.removesuffix("/api")
    digest = folder.rsplit("/", 1)[1]
    wanted = {
        f"patch-nightly-calc-nightly-scripted-model-{digest}": "+    return a + b",
        "sweep-nightly-review": "",
    }
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            for key, expected in wanted.items():
                page.goto(f"{base}/runs/flow-run/{nightly['run']['id']}")
                page.locator("li.p-tab#artifacts").click()
                page.get_by_text(key, exact=True).click(timeout=60_000)  # the artifact's card: its own page
                link = page.locator("a.markdown-renderer__link").first
                link.wait_for(timeout=60_000)
                assert "opens until" in link.inner_text(), link.inner_text()
                with page.context.expect_page() as opened:  # the UI opens links in a new tab
                    link.click()
                tab = opened.value
                tab.wait_for_load_state()
                if expected:  # the patch: the diff as text, exactly what the store holds
                    assert tab.locator("body").inner_text().strip() == patch.strip()
                else:  # the review page: the page itself, listing the night's task with its verdict
                    row = tab.locator("#index tbody tr", has_text="calc-nightly")
                    assert row.locator("td.verdict").inner_text() == "resolved"
                tab.screenshot(path=str(tmp_path / f"{key}.png"))
                tab.close()
        finally:
            browser.close()


def test_a_sweep_fans_out_to_both_workers_and_collects_every_grade(
    deployed: Deployed, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "calc")
    ids = [f"calc-fan-{i}" for i in range(4)]
    tasks_file = tmp_path / "fanout.jsonl"
    dump_tasks([calc_task(repo, i) for i in ids], tasks_file)

    sweep_id = deployed.run_deployment(
        "sweep/nightly-sweep",
        {
            "source": {"kind": "file", "path": str(tasks_file)},
            "name": "fanout",
            "run_on": "workers",
            "concurrency": 4,
        },
    )
    sweep_run = deployed.wait(sweep_id, timeout_s=420)

    assert sweep_run["state"]["type"] == "COMPLETED", sweep_run["state"]
    children = deployed.api(
        "POST", "/flow_runs/filter", json={"flow_runs": {"tags": {"all_": ["sweep:fanout"]}}}
    )
    assert sorted(c["parameters"]["task"]["instance_id"] for c in children) == ids
    assert all(c["state"]["type"] == "COMPLETED" for c in children)
    ran_by = {w: [c["id"] for c in children if c["id"] in deployed.worker_log(w)] for w in deployed.workers}
    assert all(ran_by.values()), f"both workers take a share of the sweep: {ran_by}"
    for task_id in ids:
        assert deployed.store.exists(f"{deployed.run_folder(f'fanout/{task_id}/scripted-model')}/patch.diff")
    table = deployed.api(
        "POST", "/artifacts/filter", json={"artifacts": {"key": {"any_": ["sweep-fanout-table"]}}}
    )
    assert table, "the sweep publishes its table"
    rows = table[0]["data"]
    assert all(re.search(rf"{task_id}.*?true", str(rows), re.IGNORECASE) for task_id in ids), (
        "every grade collected, resolved"
    )


def sandboxes_of(pid: int, state_dir: Path | None = None) -> list[Path]:
    """The local sandboxes a process made (their meta.json names the owner process)."""
    from bugsweep.sandbox.local.stale import default_state_dir

    root = state_dir or default_state_dir()
    found = []
    for meta in root.glob("local-*/meta.json"):
        try:
            data = json.loads(meta.read_text())
            if data.get("owner_pid") == pid:
                found.append(meta.parent)
        except (OSError, ValueError):
            continue
    return found


def sandbox_leftovers(sandbox_dirs: list[Path]) -> list[str]:
    """Mounts, processes and cgroups of these local sandboxes still on the machine."""
    mounts = Path("/proc/mounts").read_text()
    found = [f"mount {d}" for d in sandbox_dirs if str(d) in mounts]
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace") if proc.name.isdigit() else ""
        except OSError:
            continue
        found += [f"process {proc.name}" for d in sandbox_dirs if d.name in cmdline]
    for d in sandbox_dirs:
        meta = d / "meta.json"
        cgroups = json.loads(meta.read_text()).get("cgroups", []) if meta.exists() else []
        found += [f"cgroup {c}" for c in cgroups if Path(c).exists()]
    return found


def start_stalling_run(
    deployed: Deployed, repo: Path, marker: str, state_dir: Path | None = None
) -> tuple[str, int, list[Path]]:
    """A solve-bug run whose agent ran a command and now waits for the model (the fixer stalls on `marker`):
    its id, its flow-run process and the sandboxes that process holds."""
    task = TaskSpec(instance_id=f"calc-{marker.lower()}", repo=str(repo), problem_statement=marker,
                    test_command="python -m pytest -q", setup_command=PYTEST_SETUP)  # fmt: skip
    run_id = deployed.run_deployment(
        "solve-bug/solve-bug",
        {
            "repo": task.repo,
            "problem": task.problem_statement,
            "task": task.model_dump(mode="json"),
            "sweep": marker,
        },
    )

    def stalled() -> bool:  # the second model request has come: the agent ran a command and now waits
        return any(marker in json.dumps(r["messages"][:2]) and any(m.get("role") == "tool" for m in r["messages"])
                   for r in list(deployed.model.requests))  # fmt: skip

    deadline = time.monotonic() + 180
    while not stalled() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert stalled(), f"the run reached the agent loop; worker logs in {deployed.server.logs}"
    run = deployed.api("GET", f"/flow_runs/{run_id}")
    pid = int(str(run["infrastructure_pid"]).rsplit(":", 1)[-1])
    sandboxes = sandboxes_of(pid, state_dir)
    assert sandboxes and sandbox_leftovers(sandboxes), "the run holds a mounted sandbox"
    return run_id, pid, sandboxes


def test_cancelling_a_run_from_the_ui_releases_its_sandbox(deployed: Deployed, tmp_path: Path) -> None:
    """Cancel from the UI (the API call its Cancel button makes) while the agent waits for the model."""
    run_id, _, sandboxes = start_stalling_run(deployed, make_repo(tmp_path / "calc"), "CANCEL-ME")

    deployed.api(
        "POST", f"/flow_runs/{run_id}/set_state", json={"state": {"type": "CANCELLING"}, "force": True}
    )
    run = deployed.wait(run_id, timeout_s=120)

    assert run["state"]["type"] == "CANCELLED"
    deadline = (
        time.monotonic() + 20
    )  # the state is set as the run's process ends: allow its cleanup to finish
    while sandbox_leftovers(sandboxes) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sandbox_leftovers(sandboxes) == []


def test_cancelling_a_sweep_on_workers_cancels_its_task_runs(deployed: Deployed, tmp_path: Path) -> None:
    """Without the sweep passing the cancellation on, its solve-bug runs would finish (COMPLETED) 45 s later."""
    repo = make_repo(tmp_path / "calc")
    ids = ["calc-cancel-sweep-0", "calc-cancel-sweep-1"]
    tasks_file = tmp_path / "cancel.jsonl"
    specs = [TaskSpec(instance_id=i, repo=str(repo), problem_statement="CANCEL-ME", test_command="python -m pytest -q",
                      setup_command=PYTEST_SETUP)
             for i in ids]  # fmt: skip
    dump_tasks(specs, tasks_file)
    sweep_id = deployed.run_deployment(
        "sweep/nightly-sweep",
        {"source": {"kind": "file", "path": str(tasks_file)}, "name": "cancel-sweep", "run_on": "workers"},
    )

    def children() -> list[dict[str, Any]]:
        return list(
            deployed.api(
                "POST", "/flow_runs/filter", json={"flow_runs": {"tags": {"all_": ["sweep:cancel-sweep"]}}}
            )
        )

    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and not (
        len(children()) == 2 and all(c["state"]["type"] == "RUNNING" for c in children())
    ):
        time.sleep(1)
    assert [c["state"]["type"] for c in children()] == ["RUNNING", "RUNNING"]

    deployed.api(
        "POST", f"/flow_runs/{sweep_id}/set_state", json={"state": {"type": "CANCELLING"}, "force": True}
    )

    assert deployed.wait(sweep_id, timeout_s=120)["state"]["type"] == "CANCELLED"
    assert [deployed.wait(c["id"], timeout_s=120)["state"]["type"] for c in children()] == [
        "CANCELLED",
        "CANCELLED",
    ]


# Last in the module: it stops the module's workers.
def test_a_worker_killed_with_its_run_mid_solve_is_cleaned_up_by_a_live_worker_of_its_user_and_rerun(
    deployed: Deployed, tmp_path: Path
) -> None:
    """SIGKILL a worker and its flow-run process while the agent waits for the model (an OOM kill, a lost node).
    Another user's bugsweep (with the powers to unmount and delete them, pointed at the folder) leaves the run's
    sandbox alone; the live `bugsweep worker` of the same user on the machine removes its mounts, cgroups and
    folder within a minute, without a new process starting. Nothing in the dead process can report: the crash
    automation `bugsweep deploy` shipped marks the run Crashed once its heartbeats stop, the rerun automation
    schedules it again, and the live worker runs it and grades the task."""
    import contextlib
    import os
    import signal

    from tests.support.leftovers import as_user, other_user

    for proc in deployed.server.processes[
        1:
    ]:  # the module's workers step aside: the doomed worker takes the run
        deployed.server.stop_process(proc)
    bugsweep_worker = [sys.executable, "-m", "bugsweep", "worker", "--pool", POOL, "--"]
    # A state folder of their own: other processes' sandboxes in the shared one would sweep ours when they start.
    state_dir = tmp_path / "sandboxes"
    fast_polling = {
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_WORKER_PREFETCH_SECONDS": "0",
        "BUGSWEEP_SANDBOX_STATE_DIR": str(state_dir),
        "BUGSWEEP_STORE_LOCAL_DIR": str(tmp_path / "local-artifacts"),
    }
    doomed = deployed.server.spawn(
        "worker-doomed", [*bugsweep_worker, "--name", "worker-doomed"], cwd=tmp_path, **fast_polling
    )
    run_id, flow_run_pid, sandboxes = start_stalling_run(
        deployed, make_repo(tmp_path / "calc"), "KILL-ME", state_dir
    )
    # a second worker of the same user on the machine, started once the doomed one holds the run
    deployed.server.spawn(
        "worker-live", [*bugsweep_worker, "--name", "worker-live"], cwd=tmp_path, **fast_polling
    )
    deadline = time.monotonic() + 120
    while "starting: prefect worker start" not in deployed.worker_log("worker-live"):
        assert time.monotonic() < deadline, deployed.worker_log("worker-live")[-2000:]
        time.sleep(0.5)

    with contextlib.suppress(ProcessLookupError):
        os.killpg(doomed.pid, signal.SIGKILL)  # the worker, and the flow-run process if it shares its group
    with contextlib.suppress(ProcessLookupError):
        os.kill(flow_run_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    doomed.wait(timeout=30)
    KILLED["rerun"] = True  # the rerun's agent gets the fix
    assert sandbox_leftovers(sandboxes), "the killed run's sandbox is left behind"

    uid, gid = other_user(tmp_path / "other-home")
    other = subprocess.run(
        [*as_user(uid, gid), sys.executable, "-m", "bugsweep", "sandboxes", "cleanup"],
        env={**os.environ, "HOME": str(tmp_path / "other-home"), "BUGSWEEP_SANDBOX_STATE_DIR": str(state_dir)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert other.returncode == 0 and "0 left-over local sandbox(es) removed" in other.stdout, other
    removed_line = f"removed {sandboxes[0].name} (left by process {flow_run_pid}"
    assert sandbox_leftovers(sandboxes) or removed_line in " ".join(
        deployed.worker_log("worker-live").split()
    ), "another user's process left them (unless the live worker had removed them already)"

    def said_removed() -> bool:  # the worker says what it removed once it has removed it
        return removed_line in " ".join(deployed.worker_log("worker-live").split())

    while (sandbox_leftovers(sandboxes) or not said_removed()) and time.monotonic() - killed_at < 60:
        time.sleep(0.5)
    assert sandbox_leftovers(sandboxes) == [] and not any(d.exists() for d in sandboxes), (
        f"still there a minute after the kill; worker logs in {deployed.server.logs}"
    )
    assert said_removed(), "by the live worker of the same user"

    def states() -> list[dict[str, Any]]:
        return list(deployed.api("GET", "/flow_run_states/", params={"flow_run_id": run_id}))

    deadline = time.monotonic() + HEARTBEAT_S * 3 + 150
    while not any(st["type"] == "CRASHED" for st in states()) and time.monotonic() < deadline:
        time.sleep(1)
    (crashed,) = [st for st in states() if st["type"] == "CRASHED"]
    assert "no heartbeat" in crashed["message"]
    # Crashed until the rerun automation schedules it again: not yet final
    run = deployed.wait(run_id, timeout_s=240, through_rerun=True)
    assert run["state"]["type"] == "COMPLETED", run["state"]
    assert run["run_count"] == 2, "run once more, as the same flow run"
    assert any(st["name"] == "AwaitingRetry" for st in states())
    grade = json.loads(
        deployed.store.get_bytes(f"{deployed.run_folder('KILL-ME/calc-kill-me/scripted-model')}/grade.json")
    )
    assert grade["resolved"] is True
    # nothing of the killed process is left on the machine, and the rerun's process leaves nothing once it has exited
    deadline = time.monotonic() + 60
    while f"{state_dir}/" in Path("/proc/mounts").read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert f"{state_dir}/" not in Path("/proc/mounts").read_text()
