"""Deployment end to end, as a team runs it (the deployed project: tests/support/deployed.py), on one deployed
project and four workers on three machines:
- a night: two sweeps at once (the nightly deployed with its task file, then 7 tasks) spread over the workers while a
  worker and a sweep are killed and the model server stops for 30 s, the endpoint's limit held over both; the
  reviewer's morning in a browser after it;
- then a run from the UI's form on a worker, the run form filled in a browser, and a sweep on workers cancelled from
  the UI.
Real parts: Prefect server and workers, the local sandbox, SeaweedFS, SIGKILL, another user's `bugsweep sandboxes
cleanup`, Chromium; stand-in: the scripted model server (1 s an answer).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field as default
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from bugsweep.spec import TaskSpec, dump_tasks
from tests.support.deployed import (
    CHROMIUM,
    ENDPOINT_LIMIT,
    HELD,
    HOLD,
    HOLD_CHANGED,
    RELEASED,
    Deployed,
    calc_task,
    cgroups_of,
    deploy_project,
    pid_of,
    processes_of,
    release,
    sandbox_leftovers,
    sandboxes_in,
    task_of,
)
from tests.support.repos import make_repo

pytest_plugins = ["tests.support.prefect_server", "tests.support.seaweed"]
#: The night takes 5-8 minutes on a loaded 2-core machine, within its first test (the fixtures run there).
pytestmark = [pytest.mark.prefect, pytest.mark.s3, pytest.mark.timeout(900)]

#: Worker -> machine. Each runs `bugsweep worker --limit 2`; only the first takes sweeps. The third machine runs two
#: workers, so a worker killed there leaves a live one of the same user on its machine.
WORKERS = {
    "worker-1": "machine-1",
    "worker-2": "machine-2",
    "worker-3a": "machine-3",
    "worker-3b": "machine-3",
}
#: Tasks of the night's first sweep: the four workers' slots (4 x --limit 2) but the one the nightly's task takes
#: first, so that each worker is needed for night-a's first wave (every worker takes a share: asserted) and no task
#: of it waits for a slot. Each task more costs a whole task's run (a Prefect flow run process, its sandbox and
#: tests) and tests nothing more (the suite is bound by CPU).
NIGHT_A = 7


@pytest.fixture(scope="module")
def deployed(
    prefect_api, seaweed, tmp_path_factory: pytest.TempPathFactory, nightly_file: Path
) -> Iterator[Deployed]:
    """Blocks created and deployments deployed through the CLI, and the workers of three machines on the pool."""
    with deploy_project(
        prefect_api, seaweed, tmp_path_factory, WORKERS, nightly_tasks=nightly_file
    ) as result:
        yield result


@pytest.fixture(scope="module")
def nightly_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The team's nightly task file, given to `bugsweep deploy --tasks` (the first night's step): one task."""
    folder = tmp_path_factory.mktemp("team")
    problem = "[nightly] (calc-nightly) tests/test_calc.py::test_add fails: add() returns the wrong result."
    dump_tasks([calc_task(make_repo(folder / "calc"), "calc-nightly", problem)], folder / "nightly.jsonl")
    return folder / "nightly.jsonl"


@pytest.fixture(scope="module")
def nightly(night: Night) -> dict[str, Any]:
    """`bugsweep deploy --tasks FILE` (the first night's step), then a run of the nightly as its schedule makes it
    (no parameters), its task run taken by a worker (run during the night, as its second sweep): what `deploy`
    printed, the file, the run."""
    return {"out": night.nightly_out, "tasks_file": night.nightly_file, "run": night.sweeps["nightly"]}


def test_the_nightly_deployed_with_a_tasks_file_is_resumed_and_a_worker_runs_it(
    deployed: Deployed, nightly: dict[str, Any]
) -> None:
    """`bugsweep deploy --tasks FILE`: the nightly is deployed active, its task file put into the artifact store
    (S3: a sweep on any machine reads it), and a run of it as the schedule makes it completes on the workers, with
    the task's grade in S3 and a final message that says what the night did."""
    out, tasks_file, run = nightly["out"], nightly["tasks_file"], nightly["run"]
    assert "deployed sweep/nightly-sweep" in out and "nightly-sweep with its schedule PAUSED" not in out
    in_store = f"s3://{deployed.store.bucket}/runs/task-files/nightly.jsonl"
    assert f"its tasks: {in_store}" in out
    assert deployed.store.get_bytes("task-files/nightly.jsonl") == tasks_file.read_bytes()
    nightly_deployment = deployed.api("GET", "/deployments/name/sweep/nightly-sweep")
    assert nightly_deployment["paused"] is False
    assert nightly_deployment["parameters"]["source"] == {"kind": "file", "path": in_store}
    assert nightly_deployment["parameters"]["run_on"] == "workers"
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
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
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
                for attempt in range(
                    3
                ):  # under load the tab's list can come up without the card: load it again
                    page.goto(f"{base}/runs/flow-run/{nightly['run']['id']}")
                    page.locator("li.p-tab#artifacts").click()
                    try:
                        page.get_by_text(key, exact=True).click(
                            timeout=30_000
                        )  # the artifact's card: its page
                        break
                    except PlaywrightTimeout:
                        if attempt == 2:
                            raise
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


# -- a night on three machines --------------------------------------------------------------------------------


@dataclass
class Night:
    """What the night did: its sweeps' runs, the killed worker's runs and sandboxes, what the model saw."""

    sweeps: dict[str, dict[str, Any]] = default(default_factory=dict)
    """Sweep name -> its flow run, once finished."""
    tasks: dict[str, list[str]] = default(default_factory=dict)
    """Sweep name -> its task ids."""
    killed_runs: list[str] = default(default_factory=list)
    """The solve-bug runs the killed worker was running."""
    killed_tasks: set[str] = default(default_factory=set)
    killed_sandboxes: list[Path] = default(default_factory=list)
    killed_cgroups: dict[Path, list[str]] = default(default_factory=dict)
    killed_at: float = 0.0
    reaped_within_s: float | None = None
    other_user_out: str = ""
    outage: tuple[float, float] = (0.0, 0.0)
    """When the model server was stopped and started again (monotonic)."""
    nightly_out: str = ""
    """What `bugsweep deploy --tasks FILE` printed."""
    nightly_file: Path | None = None
    lost_pending: dict[str, Any] = default(default_factory=dict)
    """A solve-bug run a worker took and lost before its process started, once finished."""


def night_task(repo: Path, sweep: str, i: int) -> TaskSpec:
    """A task of the night, its text naming its sweep and itself (what the model server sees of each request)."""
    problem = f"[{sweep}] ({sweep}-{i}) tests/test_calc.py::test_add fails: add() returns the wrong result."
    return calc_task(repo, f"{sweep}-{i}", problem)


@pytest.fixture(scope="module")
def night(deployed: Deployed, nightly_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Night:
    """Two sweeps at once on workers, as the UI or a schedule starts them: NIGHT_A tasks, and the nightly (one task)
    after `bugsweep deploy --tasks FILE`, run as its schedule runs it (no parameters); every task a solve-bug
    run, spread over the machines' workers. Mid-night, worker-3a is killed with SIGKILL with everything it runs
    (a worker lost with its runs), the first sweep's own process is killed, and the model server stops for 30 s."""
    from tests.support.leftovers import as_user, other_user

    tmp = tmp_path_factory.mktemp("night")
    repo = make_repo(tmp / "calc")
    record = Night(tasks={"night-a": [f"night-a-{i}" for i in range(NIGHT_A)], "nightly": ["calc-nightly"]})
    record.nightly_file, record.nightly_out = nightly_file, deployed.deploy_out
    dump_tasks([night_task(repo, "night-a", i) for i in range(NIGHT_A)], tmp / "night-a.jsonl")
    # The nightly first, its one task made before night-a's: night-a's tasks fill every slot of the four workers,
    # and a nightly task queued behind them asked only after the kill and the outage (seen in CI with 8 tasks made
    # at once with the nightly's: the two sweeps never asking at once, and once not at all 5 minutes after the kill).
    ids = {"nightly": deployed.run_deployment("sweep/nightly-sweep", {})}
    deadline = time.monotonic() + 300
    while not deployed.runs_tagged("sweep:nightly"):
        assert time.monotonic() < deadline, "the nightly made no task run in 5 minutes"
        time.sleep(0.5)
    # A run a worker took and was lost with before the run's process started (seen once when worker-3a was killed
    # just after taking one): Pending, as a worker sets a run it takes, with no process behind it. Made now, for an
    # hour from now so that no worker takes it, and set Pending as the model's 30 s outage begins, so that its two
    # minutes end after it: a process started in the outage finds nothing answering at its first check of the
    # endpoint and fails (seen when it was set Pending before the night, its two minutes ending in the outage).
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    lost = deployed.run_deployment(
        "solve-bug/solve-bug",
        {
            "repo": str(repo),
            "problem": "[lost] (lost-pending) add() returns the wrong result.",
            "sweep": "lost",
        },
        state={"type": "SCHEDULED", "state_details": {"scheduled_time": later}},
    )
    HOLD.update(record.tasks["night-a"])
    ids["night-a"] = deployed.run_deployment(
        "sweep/nightly-sweep",
        {
            "source": {"kind": "file", "path": str(tmp / "night-a.jsonl")},
            "name": "night-a",
            "run_on": "workers",
        },
    )

    # Mid-night: once a task of the first sweep running on worker-3a waits for its last answer. Every task of
    # night-a is held there (HOLD), and those held on another worker are let go as they are seen (`release`).
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with HOLD_CHANGED:
            waiting = HELD - RELEASED
        running = [r for r in deployed.runs_tagged("sweep:night-a") if r["state"]["type"] == "RUNNING"]
        on_3a_pids = set(processes_of("worker-3a"))
        on_3a = [r for r in running if pid_of(r) in on_3a_pids]
        if {r["parameters"]["task"]["instance_id"] for r in on_3a} & waiting:
            break
        release(*(r["parameters"]["task"]["instance_id"] for r in running if pid_of(r) and r not in on_3a))
        time.sleep(0.5)
    else:
        ran = {
            w: sum(r["id"] in deployed.worker_log(w) for r in deployed.runs_tagged("sweep:night-a"))
            for w in WORKERS
        }
        states = [r["state"]["type"] for r in deployed.runs_tagged("sweep:night-a")]
        raise AssertionError(
            f"worker-3a never ran a task of night-a: runs {states}, by worker {ran}, the model asked "
            f"{len(deployed.model.requests)} time(s); worker-3a's log ends:\n{deployed.worker_log('worker-3a')[-3000:]}"
        )
    machine = deployed.machines["machine-3"]
    doomed = set(processes_of("worker-3a"))
    sweep_pid = pid_of(deployed.api("GET", f"/flow_runs/{ids['night-a']}"))
    assert sweep_pid and sweep_pid not in doomed, "the sweep runs on worker-1"
    # All at once, as a machine lost: frozen first, so that worker-3a's Prefect worker cannot see its flow runs die
    # and report them Crashed itself (seen once when a run's process was killed before its worker): the heartbeat
    # automation is what must notice. What is killed is read while they are frozen: a run of worker-3a that
    # finished since it was seen running is not one of them.
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        if sig == signal.SIGKILL:
            live = [deployed.api("GET", f"/flow_runs/{r['id']}") for r in on_3a]
            live = [r for r in live if r["state"]["type"] == "RUNNING"]
            record.killed_runs = [r["id"] for r in live]
            record.killed_tasks = {r["parameters"]["task"]["instance_id"] for r in live}
            record.killed_sandboxes = sandboxes_in(machine.state_dir, doomed)
            record.killed_cgroups = cgroups_of(record.killed_sandboxes)
        for pid in (*doomed, sweep_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    record.killed_at = time.monotonic()
    release(killed=True)  # the held requests answer now, the killed runs' to connections nobody reads
    # another user's bugsweep, with the powers to unmount and delete them, pointed at the machine's folder while the
    # killed runs' sandboxes are still there
    uid, gid = other_user(tmp / "other-home")
    record.other_user_out = subprocess.run(
        [*as_user(uid, gid), sys.executable, "-m", "bugsweep", "sandboxes", "cleanup"],
        env={**os.environ, "HOME": str(tmp / "other-home"), "BUGSWEEP_SANDBOX_STATE_DIR": str(machine.state_dir)},
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip

    def watch_reaping() -> None:  # when the live worker of the same user has removed them (up to 2 minutes)
        while sandbox_leftovers(record.killed_sandboxes, record.killed_cgroups):
            if time.monotonic() - record.killed_at > 120:
                return
            time.sleep(0.5)
        record.reaped_within_s = time.monotonic() - record.killed_at

    reaping = threading.Thread(target=watch_reaping, daemon=True)
    reaping.start()
    # The model server stops just after a live run's request came in (the killed runs' last ones have ended by
    # then), so that request is cut off mid-answer. On a loaded machine the next request can be a minute away (the
    # live runs are between turns, the next ones in their setup): wait for it.
    deadline, before = time.monotonic() + 180, deployed.model.in_flight
    while (now := deployed.model.in_flight) <= before:
        assert time.monotonic() < deadline, "no run asked the model in the 3 minutes after the kill"
        before = now
        time.sleep(0.02)
    stopped_at = time.monotonic()  # that request is in flight now: it takes the server's 1 s to answer
    deployed.model.stop()
    deployed.api("POST", f"/flow_runs/{lost}/set_state", json={"state": {"type": "PENDING"}, "force": True})
    time.sleep(30)
    deployed.model.start()  # on its port again, after 30 s
    record.outage = (stopped_at, time.monotonic())
    reaping.join()

    for sweep, flow_run_id in ids.items():
        record.sweeps[sweep] = deployed.wait(flow_run_id, timeout_s=600, through_rerun=True)
    record.lost_pending = deployed.wait(lost, timeout_s=300, through_rerun=True)
    return record


def test_a_night_on_three_machines_grades_every_task_exactly_once_spread_over_the_workers(
    deployed: Deployed, night: Night
) -> None:
    for sweep, tasks in night.tasks.items():
        run = night.sweeps[sweep]
        assert run["state"]["type"] == "COMPLETED", run["state"]
        assert run["state"]["message"].startswith(
            f"sweep {sweep} COMPLETED: {len(tasks)} task(s) graded: {len(tasks)} resolved"
        )
        children = deployed.runs_tagged(f"sweep:{sweep}")
        assert sorted(c["parameters"]["task"]["instance_id"] for c in children) == sorted(tasks), (
            "one run a task"
        )
        assert all(c["state"]["type"] == "COMPLETED" for c in children)
        for task in tasks:  # one grade a task, made by its one run
            grades = [k for k in deployed.store.list(f"{sweep}/{task}/") if k.endswith("/grade.json")]
            assert len(grades) == 1, grades
            (child,) = [c for c in children if c["parameters"]["task"]["instance_id"] == task]
            written = json.loads(deployed.store.get_bytes(grades[0].replace("grade.json", "run.json")))
            assert written["flow_run_id"] == child["id"]
    ran_by = {
        w: sum(c["id"] in deployed.worker_log(w) for c in deployed.runs_tagged("sweep:night-a"))
        for w in WORKERS
    }
    assert all(ran_by.values()), f"every worker took a share of the night: {ran_by}"


def test_the_model_endpoints_limit_holds_over_two_sweeps_at_once(deployed: Deployed, night: Night) -> None:
    """Every request took a slot of the endpoint's global concurrency limit (made by the runs, sized by the model
    block's max_concurrent_requests): the model never answered more than that many at once, across both sweeps
    on every machine, while both sweeps were asking."""
    from bugsweep.agent.endpoint import endpoint_name
    from bugsweep.settings import ModelSettings

    name = endpoint_name(ModelSettings(base_url=deployed.model.base_url, model="scripted-model"))
    limit = deployed.api("GET", f"/v2/concurrency_limits/{name}")
    assert limit["limit"] == ENDPOINT_LIMIT and limit["slot_decay_per_second"] == 0
    assert 2 <= deployed.model.most_in_flight <= ENDPOINT_LIMIT, deployed.model.most_in_flight
    spans = deployed.model.spans
    a = [(start, end) for start, end, text in spans if "[night-a]" in text]
    b = [(start, end) for start, end, text in spans if "[nightly]" in text]
    assert any(sa < eb and sb < ea for sa, ea in a for sb, eb in b), (
        "the two sweeps asked at the same time: night-a "
        f"{min(a, default=None)}..{max(a, default=None)}, nightly {min(b, default=None)}..{max(b, default=None)}, "
        f"the model server stopped {night.outage}"
    )


def test_a_model_server_stopped_for_30_s_mid_night_is_waited_for_and_no_task_fails(
    deployed: Deployed, night: Night
) -> None:
    """The server stops (every connection dropped) while a live run's request is being answered, and listens again
    30 s later: that run's request is asked again after the restart (an outage waited for, not a configuration
    error), and every task of both sweeps is graded resolved, none failed."""
    stopped, back = night.outage
    assert back - stopped >= 30
    spans = deployed.model.spans
    # the requests the stop cut off that began after the kill: a killed run's own began before it, and its rerun's
    # are a live run's (on a loaded machine the rerun of a killed task can be the one asking at the stop)
    cut = {task_of(text) for start, end, text in spans if night.killed_at < start < stopped < end}
    asked_after = {task_of(text) for start, _, text in spans if start > back}
    assert cut & asked_after, (
        f"a run cut off by the stop asked again after it: cut {cut}, after {asked_after}"
    )
    for sweep in night.tasks:
        for key in deployed.store.list(f"{sweep}/"):
            if key.endswith("/grade.json"):
                grade = json.loads(deployed.store.get_bytes(key))
                assert grade["resolved"] and not grade["error"], grade


def test_a_worker_killed_mid_night_its_runs_finish_on_the_others_and_nothing_is_left(
    deployed: Deployed, night: Night
) -> None:
    """SIGKILL of worker-3a and every process it ran (its Prefect workers, its flow runs): the crash automation
    marks its runs Crashed once their heartbeats stop, the rerun automation schedules them again as the same flow
    runs, and the other workers run and grade them. Another user's bugsweep (with the powers to unmount and
    delete them) leaves the killed runs' sandboxes alone; the live worker of the same user on that machine
    (worker-3b: its reaper, or a run it started) removes their mounts, cgroups and folders within a minute, without
    a new worker starting."""
    assert night.killed_runs and night.killed_sandboxes
    assert "0 left-over local sandbox(es) removed" in night.other_user_out, night.other_user_out
    assert night.reaped_within_s is not None and night.reaped_within_s < 60, "reaped within a minute"
    removed = " ".join(deployed.worker_log("worker-3b").split())
    # by worker-3b's reaper or by a run it started meanwhile, which reaps the machine's leftovers as it makes its
    # sandbox: both log "removing sandbox NAME left behind by process PID" (bugsweep.sandbox.local.stale)
    reaped = re.findall(r"removing sandbox (local-\w+) left behind by process", removed)
    names = " ".join(reaped)
    assert any(d.name in names for d in night.killed_sandboxes), "by the live worker of the same user"
    for run_id in night.killed_runs:
        run = deployed.api("GET", f"/flow_runs/{run_id}")
        states = deployed.api("GET", "/flow_run_states/", params={"flow_run_id": run_id})
        assert run["state"]["type"] == "COMPLETED" and run["run_count"] == 2, "run once more, as the same run"
        seen = [(st["type"], st["name"], (st["message"] or "")[:160]) for st in states]
        assert any(st["type"] == "CRASHED" and "no heartbeat" in (st["message"] or "") for st in states), seen
        assert any(st["name"] == "AwaitingRetry" for st in states)
        assert any(run_id in deployed.worker_log(w) for w in WORKERS if w != "worker-3a"), (
            "finished elsewhere"
        )
    assert processes_of("worker-3a") == []
    deadline = time.monotonic() + 30  # the last runs' processes release their sandboxes as they exit
    while any(sandboxes_in(m.state_dir) for m in deployed.machines.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [d for m in deployed.machines.values() for d in sandboxes_in(m.state_dir)] == []
    mounts = Path("/proc/mounts").read_text()
    assert not [m for m in deployed.machines.values() if f"{m.state_dir}/" in mounts], "no mount left"


def test_a_run_lost_before_its_process_started_is_marked_crashed_and_run_again(
    deployed: Deployed, night: Night
) -> None:
    """A run left Pending by a worker lost just after taking it (no process, so no heartbeat ever) is marked Crashed
    by the pending automation of `bugsweep deploy`, run again by the rerun automation, and graded."""
    run = night.lost_pending
    assert run["state"]["type"] == "COMPLETED", run["state"]
    states = deployed.api("GET", "/flow_run_states/", params={"flow_run_id": run["id"]})
    seen = [(st["type"], st["name"], (st["message"] or "")[:120]) for st in states]
    assert any(st["type"] == "CRASHED" and "never started" in (st["message"] or "") for st in states), seen
    assert any(st["name"] == "AwaitingRetry" for st in states), seen
    (grade,) = [k for k in deployed.store.list("lost/") if k.endswith("/grade.json")]
    assert '"resolved": true' in deployed.store.get_bytes(grade).decode()


def test_a_sweep_killed_mid_night_is_run_again_and_collects_its_runs_instead_of_starting_them_twice(
    deployed: Deployed, night: Night
) -> None:
    run = night.sweeps["night-a"]
    assert run["run_count"] == 2, "the same flow run, run again by the rerun automation"
    states = deployed.api("GET", "/flow_run_states/", params={"flow_run_id": run["id"]})
    assert any(st["type"] == "CRASHED" for st in states)
    children = deployed.runs_tagged("sweep:night-a")
    assert len(children) == len(night.tasks["night-a"]), "no task started twice"


# -- after the night: the UI's run form and a cancelled sweep ---------------------------------------------------


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
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
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
            # person still on the form presses Submit again (after a 503, or when nothing happened for 30 s); on a
            # loaded machine the page can re-render the button for longer than a click waits ("element is not
            # stable", "detached from the DOM": seen twice under CI load), and the person presses it again too
            submit = page.get_by_role("button", name="Submit")
            clicks, clicked_at, deadline = 0, 0.0, time.monotonic() + 240
            while not run_id and time.monotonic() < deadline:
                again = any(" 503 " in c for c in failed_calls) or time.monotonic() - clicked_at > 30
                if clicks < 6 and again and submit.is_visible():
                    failed_calls.clear()
                    clicks, clicked_at = clicks + 1, time.monotonic()
                    try:
                        submit.click(timeout=10_000)
                    except PlaywrightTimeout:
                        clicked_at = 0.0  # not pressed: pressed again at the next turn
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
