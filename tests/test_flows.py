"""The Prefect flows `solve-bug` and `sweep`, run in this process against a Prefect test server.

Real parts: a Prefect API server (prefect_test_harness, one per session, SQLite), Prefect blocks saved to it, the
local sandbox (bubblewrap + overlayfs) running real pytest on real git repositories, a real SeaweedFS S3 server
for the artifacts. Stand-in: the model is the scripted OpenAI-compatible HTTP server, which replays tool calls.
"""

from __future__ import annotations

import os

os.environ.setdefault("BUGSWEEP_RETRY_DELAYS_S", "0.2,0.5")  # quick retries (read when a flow runs a step)

import json
import signal
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from pydantic import SecretStr

from bugsweep.spec import TaskSpec, dump_tasks
from tests.support.repos import PYTEST_SETUP, commit_all, make_repo
from tests.support.scripted_model import ScriptedModelServer, tool_call

if TYPE_CHECKING:
    from tests.support.seaweed import SeaweedServer

pytest_plugins = ["tests.support.prefect_server", "tests.support.seaweed"]
pytestmark = [pytest.mark.prefect, pytest.mark.s3]

FIX = tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")
RUN_FILES = {
    "grade.json",
    "patch.diff",
    "trajectory.json",
    "tests_before.log",
    "tests_after.log",
    "tests_mirror.log",  # the regrade's mirror run (grade.json `mirror`)
    "task.json",
    "run.json",
    "setup.log",  # the tasks install pytest in their setup
    "environment.txt",
}


def fixer(body: dict[str, Any]) -> dict[str, Any]:
    """A scripted reply that works for any number of tasks at once: fix on the first turn, finish on the next."""
    if any(m.get("role") == "tool" for m in body["messages"]):
        return tool_call("finish", summary="add() now adds")
    return FIX


def calc_task(repo: Path, instance_id: str, **fields: Any) -> TaskSpec:
    return TaskSpec(
        instance_id=instance_id,
        repo=str(repo),
        problem_statement="tests/test_calc.py::test_add fails: add() returns the wrong result. Fix the code.",
        **{"test_command": "python -m pytest -q", "setup_command": PYTEST_SETUP, **fields},
    )


@pytest.fixture
def blocks(prefect_harness: None, seaweed: SeaweedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Factory: save a model endpoint block for a scripted server, and prefect-aws AwsCredentials + S3Bucket blocks
    on a new SeaweedFS bucket; the flows get the saved blocks as the UI's form sends them."""
    from prefect_aws import AwsCredentials, S3Bucket
    from prefect_aws.client_parameters import AwsClientParameters

    from blocks import ModelEndpoint, bucket_store
    from tests.support.seaweed import ACCESS_KEY, SECRET_KEY

    monkeypatch.setenv("BUGSWEEP_STORE_LOCAL_DIR", str(tmp_path / "local-artifacts"))

    def make(
        server: ScriptedModelServer, *, endpoint_url: str | None = None, attempts: int = 2
    ) -> dict[str, Any]:
        monkeypatch.setenv("BUGSWEEP_STORE_ATTEMPTS", str(attempts))
        suffix = uuid.uuid4().hex[:8]
        model = ModelEndpoint(
            base_url=server.base_url, model="scripted-model", api_key=SecretStr("sk-test-secret")
        )
        model.save(f"model-{suffix}")
        credentials = AwsCredentials(
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SecretStr(SECRET_KEY),
            aws_client_parameters=AwsClientParameters(endpoint_url=endpoint_url or seaweed.endpoint_url),
        )
        credentials.save(f"aws-{suffix}")
        bucket = S3Bucket(
            bucket_name=seaweed.new_store(prefix="").bucket, bucket_folder="runs", credentials=credentials
        )
        bucket.save(f"store-{suffix}")
        return {
            "model_block": f"model-{suffix}",
            "store_block": f"store-{suffix}",
            "model": ModelEndpoint.load(f"model-{suffix}"),
            "store": S3Bucket.load(f"store-{suffix}"),
            "_store": bucket_store(bucket),
        }

    return make


def whole(task: TaskSpec) -> dict[str, Any]:
    """solve-bug's parameters for a whole task, as a sweep sends them: the task, and its repository and text (the
    form's required fields)."""
    return {"repo": task.repo, "problem": task.problem_statement, "task": task}


def flow_kwargs(made: dict[str, Any], **limits: Any) -> dict[str, Any]:
    from flows.common import AgentChoices

    return {
        "model": made["model"],
        "store": made["store"],
        "limits": AgentChoices(max_turns=limits.get("max_turns", 6)),
    }


def sandbox_leftovers(sandbox_id: str, marker: str | None = None) -> list[str]:
    """Mounts and processes of one local sandbox still on this machine (empty when it was released)."""
    found = [
        f"mount: {line.strip()}"
        for line in Path("/proc/mounts").read_text().splitlines()
        if sandbox_id in line
    ]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if sandbox_id in cmdline or (marker and marker in cmdline):
            found.append(f"process {proc.name}: {cmdline[:200]}")
    return found


def step_runs(state: Any, name: str) -> list[Any]:
    """The task runs of one step (`solve`, `upload`, ...) in the flow run that ended in `state`."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        )
    return [r for r in runs if r.name == name or r.name.startswith(f"{name}-")]


# -- solve-bug ------------------------------------------------------------------------------------------------


def test_solve_bug_resolves_and_puts_the_run_folder_in_s3(blocks, scripted_model, buggy_repo: Path) -> None:
    from prefect.artifacts import Artifact
    from prefect.client.orchestration import get_client

    from flows.solve_bug import solve_bug

    server = scripted_model([FIX, tool_call("finish", summary="add() now adds")])
    made = blocks(server)
    store = made["_store"]

    state = solve_bug(
        **whole(calc_task(buggy_repo, "calc-add")), sweep="nightly", return_state=True, **flow_kwargs(made)
    )

    grade = state.result()
    assert grade.resolved and grade.failed_before and grade.passes_after and grade.tests_untouched
    assert grade.model == "scripted-model" and grade.turns == 2
    with get_client(sync_client=True) as client:  # the run's parameters, as the UI shows them
        shown = json.dumps(client.read_flow_run(state.state_details.flow_run_id).parameters)
    assert "sk-test-secret" not in shown and "bugsweep-test-secret" not in shown, shown
    run_dir = f"nightly/calc-add/scripted-model/{grade.config_digest}"  # SWEEP/TASK/MODEL/CONFIG
    keys = store.list("nightly/calc-add/scripted-model")
    assert {k.rsplit("/", 1)[1] for k in keys} == RUN_FILES
    assert all(k.startswith(f"{run_dir}/") for k in keys)
    patch = store.get_bytes(f"{run_dir}/patch.diff").decode()
    assert "-    return a - b" in patch and "+    return a + b" in patch
    stored_grade = json.loads(store.get_bytes(f"{run_dir}/grade.json"))
    assert stored_grade["resolved"] is True and stored_grade["config"]["agent"]["max_turns"] == 6
    assert "sk-test-secret" not in json.dumps(stored_grade)
    trajectory = store.get_bytes(f"{run_dir}/trajectory.json").decode()
    assert "sk-test-secret" not in trajectory
    link = Artifact.get(f"patch-nightly-calc-add-scripted-model-{grade.config_digest}")
    assert link is not None and link.type == "markdown"  # Prefect stores a link artifact as markdown
    assert f"/{store.bucket}/runs/{run_dir}/patch.diff" in str(link.data)
    # a presigned link: it opens the patch from the private bucket, without the bucket's keys, until it expires
    presigned = str(link.data).split("](")[1].split(")")[0]
    assert "bugsweep-test-secret" not in presigned and "opens until" in str(link.data)
    opened = httpx.get(presigned, timeout=10)
    assert opened.status_code == 200 and opened.text == patch
    diff = Artifact.get(f"diff-nightly-calc-add-scripted-model-{grade.config_digest}")
    assert diff is not None and "+    return a + b" in str(diff.data) and "resolved" in str(diff.data)
    assert "Failing before: `tests/test_calc.py::test_add`. Passing after: all of them." in str(diff.data)


def test_solve_bug_not_resolved_is_a_grade_not_a_failure(blocks, scripted_model, buggy_repo: Path) -> None:
    from flows.solve_bug import solve_bug

    server = scripted_model([tool_call("finish", summary="nothing to do")])
    made = blocks(server)

    state = solve_bug(**whole(calc_task(buggy_repo, "calc-give-up")), return_state=True, **flow_kwargs(made))

    assert state.is_completed()
    grade = state.result()
    assert grade.resolved is False and grade.error is None and grade.failed_before and not grade.passes_after
    assert len(server.requests) == 1, "an honest 'not resolved' must not be retried"
    assert made["_store"].exists(f"adhoc/calc-give-up/scripted-model/{grade.config_digest}/grade.json")


def test_crash_mid_task_still_releases_the_sandbox(blocks, scripted_model, buggy_repo: Path) -> None:
    """SIGTERM reaches the flow's process while the agent waits for the model (a worker being shut down)."""
    from prefect.exceptions import TerminationSignal

    from flows.common import LIVE_SANDBOXES
    from flows.solve_bug import solve_bug

    marker = f"bugsweep-crash-{uuid.uuid4().hex[:8]}"
    held: list[Any] = []

    def crash(body: dict[str, Any]) -> dict[str, Any]:
        held.extend(LIVE_SANDBOXES.held())
        assert held and sandbox_leftovers(held[0].id, marker), "the sandbox and its background process are up"
        os.kill(os.getpid(), signal.SIGTERM)
        return tool_call("finish", summary="never seen")

    server = scripted_model(
        [tool_call("run", command=f"(exec -a {marker} sleep 300) >/dev/null 2>&1 &"), crash]
    )
    made = blocks(server)

    # After its hooks, Prefect passes SIGTERM on to the handler it found, which would end pytest: catch it here.
    passed_on: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: passed_on.append(signum))
    try:
        with pytest.raises(TerminationSignal):
            solve_bug(**whole(calc_task(buggy_repo, "calc-crash")), **flow_kwargs(made))
    finally:
        signal.signal(signal.SIGTERM, previous)

    assert held, "the crash happened mid-task, with a sandbox held"
    assert passed_on == [signal.SIGTERM]
    assert held[0].released
    assert sandbox_leftovers(held[0].id, marker) == []
    assert LIVE_SANDBOXES.held() == []


def test_flow_hook_releases_sandboxes_the_run_still_holds(prefect_harness: None, buggy_repo: Path) -> None:
    """The second line of defence: a flow that fails without releasing its sandbox (no `finally`)."""
    from prefect import flow

    from bugsweep.sandbox import get_provider
    from bugsweep.sandbox.base import RepoSource
    from flows.common import LIVE_SANDBOXES, current_flow_run_id, release_sandboxes

    made: list[Any] = []

    @flow(on_failure=[release_sandboxes], on_crashed=[release_sandboxes])
    def leaky() -> None:
        sandbox = get_provider("local").create(RepoSource(str(buggy_repo)))
        made.append(sandbox)
        LIVE_SANDBOXES.add(current_flow_run_id(), sandbox)
        raise RuntimeError("a bug between creating and releasing")

    state = leaky(return_state=True)

    assert state.is_failed()
    assert made[0].released and sandbox_leftovers(made[0].id) == []


def test_s3_down_for_a_whole_run_keeps_the_grade_and_the_next_run_uploads_it_without_the_agent(
    blocks, scripted_model, buggy_repo: Path
) -> None:
    """S3 (a SeaweedFS endpoint with nothing listening) down for the whole upload retry window: the run fails saying
    where the grade is kept; with S3 back, the next run of the same task uploads that grade instead of asking the
    model again (the scripted model counts the requests), and the first run, Failed for its upload, turns
    Completed."""
    from prefect.artifacts import Artifact
    from prefect.client.orchestration import get_client

    from bugsweep.errors import StorageError
    from bugsweep.upload import PENDING_FILE
    from flows.solve_bug import solve_bug
    from tests.support.seaweed import free_ports

    server = scripted_model([FIX, tool_call("finish", summary="fixed")])
    down = blocks(
        server, endpoint_url=f"http://127.0.0.1:{free_ports(1)[0]}", attempts=1
    )  # nothing listens there
    task = calc_task(buggy_repo, "calc-outage")

    state = solve_bug(**whole(task), sweep="outage", return_state=True, **flow_kwargs(down))

    assert state.is_failed()
    with pytest.raises(StorageError) as info:
        state.result()
    assert "bugsweep upload" in str(info.value)
    (upload,) = step_runs(state, "upload")
    assert upload.run_count == 1, "the store's tries are the one retry layer: the upload step is not retried"
    logs = run_logs(state.state_details.flow_run_id)
    assert "Task run failed with exception: StorageError" in logs and "Traceback" not in logs, (
        "a store that refuses: one line in the step's log, not a traceback"
    )
    folder = Path(str(info.value).split("the artifacts are kept in ")[1].split(")")[0])
    assert {p.name for p in folder.iterdir()} == RUN_FILES | {PENDING_FILE}
    assert json.loads((folder / "grade.json").read_text())["resolved"] is True
    requests_after_first_run = len(server.requests)
    assert requests_after_first_run == 2

    back = blocks(server)  # S3 is back (a new bucket on the running SeaweedFS), same local folder
    grade = solve_bug(**whole(task), sweep="outage", **flow_kwargs(back))

    assert grade.resolved
    assert len(server.requests) == requests_after_first_run, "the agent did not run again"
    store = back["_store"]
    assert {k.rsplit("/", 1)[1] for k in store.list("outage/calc-outage/scripted-model")} == RUN_FILES
    run_dir = f"outage/calc-outage/scripted-model/{grade.config_digest}"
    assert json.loads(store.get_bytes(f"{run_dir}/grade.json"))["resolved"] is True
    assert not (folder / PENDING_FILE).exists()
    with get_client(sync_client=True) as client:  # the run that failed for its upload says it is graded now
        first = client.read_flow_run(state.state_details.flow_run_id)
    assert first.state is not None and first.state.is_completed(), first.state
    assert "uploaded its grade to" in (first.state.message or "")
    diff = Artifact.get(f"diff-outage-calc-outage-scripted-model-{grade.config_digest}")
    assert diff is not None and "+    return a + b" in str(diff.data)


def test_bugsweep_upload_puts_a_kept_run_folder_where_it_belongs(tmp_path: Path, monkeypatch) -> None:
    """`bugsweep upload DIR` on a folder of kept runs (a local folder store: no S3 needed to test the command)."""
    from typer.testing import CliRunner

    from bugsweep.cli import app
    from bugsweep.storage import LocalStore
    from bugsweep.upload import PENDING_FILE, mark_pending

    store = LocalStore(tmp_path / "store")
    kept = tmp_path / "local" / "nightly" / "calc-1" / "m"
    kept.mkdir(parents=True)
    (kept / "patch.diff").write_text("+fix\n")
    (kept / "grade.json").write_text(json.dumps({"instance_id": "calc-1", "resolved": True}))
    mark_pending(kept, "nightly/calc-1/m", store, "S3 was down")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("BUGSWEEP_STORE_URL", str(tmp_path / "store"))

    result = CliRunner().invoke(app, ["upload", str(tmp_path / "local")])

    assert result.exit_code == 0, result.output
    assert "uploaded" in result.output and "nightly/calc-1/m" in result.output
    assert sorted(store.list("nightly")) == ["nightly/calc-1/m/grade.json", "nightly/calc-1/m/patch.diff"]
    assert not (kept / PENDING_FILE).exists()
    again = CliRunner().invoke(app, ["upload", str(tmp_path / "local")])
    assert again.exit_code == 0 and "nothing to upload" in again.output


# -- sweep ------------------------------------------------------------------------------------------------------


def test_a_sweep_with_tasks_that_could_not_run_is_failed_and_says_why_and_a_rerun_skips_graded_tasks(
    blocks, scripted_model, buggy_repo: Path, tmp_path: Path
) -> None:
    """Three tasks: one honest, one whose setup fails, one whose test program is missing. The honest one is graded
    and stored; the sweep ends FAILED (not "all ran"), naming each task that could not run with its reason. A rerun
    skips the graded task and tries the other two again."""
    from prefect.artifacts import Artifact

    from bugsweep.discover import TaskFile
    from flows.sweep import SweepFailed, sweep

    server = scripted_model([fixer] * 20)
    made = blocks(server)
    tasks_file = tmp_path / "nightly.jsonl"
    dump_tasks(
        [
            calc_task(buggy_repo, "calc-a"),
            calc_task(buggy_repo, "calc-broken-setup", setup_command="echo 'no such package' >&2; exit 3"),
            calc_task(buggy_repo, "calc-no-runner", test_command="no-such-test-program -q"),
        ],
        tasks_file,
    )

    with pytest.raises(SweepFailed) as failed:
        sweep(source=TaskFile(path=str(tasks_file)), concurrency=2, **flow_kwargs(made))

    by_id = {g.instance_id: g for g in failed.value.grades}
    assert by_id["calc-a"].resolved
    assert (
        by_id["calc-broken-setup"].failure_kind == "task"
        and "exited with 3" in by_id["calc-broken-setup"].error
    )
    assert by_id["calc-no-runner"].failure_kind == "task" and "cannot run" in by_id["calc-no-runner"].error
    assert (
        "FAILED: 2 of 3 task(s) could not be run or stored (1 resolved, 0 not resolved, 0 held for review, 2 could not run)"
        in str(failed.value)
    )
    store = made["_store"]
    assert store.exists(f"nightly/calc-a/scripted-model/{by_id['calc-a'].config_digest}/grade.json")
    table = Artifact.get("sweep-nightly-table")
    assert table is not None and "calc-broken-setup" in str(table.data)
    summary = str(Artifact.get("sweep-nightly").data)  # type: ignore[union-attr]
    assert "**FAILED: 2 of 3 task(s) could not be run or stored" in summary and "all 3" not in summary
    assert "**1 of 3** tasks resolved" in summary
    reasons = summary.split("**Could not be run or stored**")[1]
    assert "calc-broken-setup (failed (task)): `the setup command" in reasons and "exited with 3" in reasons
    assert "calc-no-runner (failed (task)): `the test command 'no-such-test-program -q' cannot run" in reasons
    requests_after_first = len(server.requests)

    with pytest.raises(SweepFailed) as again:
        sweep(source=TaskFile(path=str(tasks_file)), concurrency=2, **flow_kwargs(made))

    assert len(server.requests) == requests_after_first, "graded tasks are not sent to the model again"
    assert {g.instance_id: g.resolved for g in again.value.grades} == {
        "calc-a": True,
        "calc-broken-setup": False,
        "calc-no-runner": False,
    }
    summary = str(Artifact.get("sweep-nightly").data)  # type: ignore[union-attr]
    assert "calc-a | scripted-model" in summary and "skipped (graded before)" in summary
    assert "1 task(s) already graded under this configuration were not run again (redo_graded" in summary
    assert "not run again (redo_graded" in str(again.value), "the final state says so too"


def test_sweep_from_a_branch_makes_a_task_of_each_failing_test_file(
    blocks, scripted_model, tmp_path: Path
) -> None:
    from prefect.artifacts import Artifact

    from bugsweep.discover import RepoBranch
    from flows.sweep import sweep

    repo = make_repo(tmp_path / "calc2")
    (repo / "tests" / "test_more.py").write_text(
        "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 2) == 4\n"
    )
    head = commit_all(repo, "more tests")
    server = scripted_model([fixer] * 10)
    made = blocks(server)
    # something in the sweep's folder that is no bugsweep grade: its review page cannot be made
    made["_store"].put_bytes("branch/stray/m/c0/grade.json", b"not a grade")

    state = sweep(
        source=RepoBranch(repo=str(repo), branch="main"),
        name="branch",
        return_state=True,
        **flow_kwargs(made),
    )
    grades = state.result()

    assert len(grades) == 1, "only tests/test_calc.py fails"
    (grade,) = grades
    assert grade.instance_id == f"calc2-tests-test-calc-py-{head[:10]}"
    assert grade.resolved and grade.FAIL_TO_PASS == ["tests/test_calc.py::test_add"]
    summary = str(Artifact.get("sweep-branch").data)  # type: ignore[union-attr]
    assert (
        "**COMPLETED: 1 task(s) graded: 1 resolved, 0 not resolved, 0 held for review, 0 could not run**"
        in summary
    )
    assert "Could not be run" not in summary
    # the page that could not be made is on the run itself: a failed step, a line of the summary and of the state
    assert "- No review page: " in summary and "stray/m/c0/grade.json is not a bugsweep grade" in summary
    assert state.is_completed() and "; No review page: " in (state.message or ""), state.message
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        )
    (page_step,) = [r for r in task_runs if r.name.startswith("review-page")]
    assert page_step.state is not None and page_step.state.is_failed()


# -- retries: infrastructure only ---------------------------------------------------------------------------------


class FlakyProvider:
    """The real local provider, except that its first `failures` creates raise `error` (a stand-in for a cloud
    sandbox service refusing, or a rejected key)."""

    name = "local"

    def __init__(self, error: Exception, failures: int = 1) -> None:
        from bugsweep.sandbox import get_provider

        self.real = get_provider("local")
        self.error, self.failures, self.calls = error, failures, 0

    def create(self, source: Any, *, labels: dict[str, str] | None = None) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.real.create(source, labels=labels)

    def create_from(self, snapshot: Any, *, labels: dict[str, str] | None = None) -> Any:
        self.calls += 1
        return self.real.create_from(snapshot, labels=labels)


def run_one_with(
    provider: FlakyProvider,
    server: ScriptedModelServer,
    made: dict[str, Any],
    spec: TaskSpec,
    local_dir: Path,
) -> Any:
    """`solve_one` (the per-task function other flows reuse) inside a flow, with a custom RunSetup."""
    from prefect import flow

    from bugsweep.runconfig import RunConfig
    from bugsweep.settings import AgentSettings, ModelSettings
    from bugsweep.sweep import RunSetup
    from flows.solve_bug import solve_one

    model, agent = (
        ModelSettings(base_url=server.base_url, model="scripted-model"),
        AgentSettings(max_turns=6, policy="plain"),
    )
    run = RunSetup(
        model=model,
        agent=agent,
        provider=provider,  # type: ignore[arg-type]
        store=made["_store"],
        local_dir=local_dir,
        config=RunConfig.of(model, agent, provider),  # type: ignore[arg-type]
    )

    @flow
    def one_task() -> Any:
        return solve_one(spec, run, "retries")

    return one_task()


def test_a_sandbox_outage_is_retried_and_the_task_still_graded(
    blocks, scripted_model, buggy_repo: Path, tmp_path: Path
) -> None:
    from bugsweep.errors import SandboxError

    server = scripted_model([fixer] * 4)
    made = blocks(server)
    provider = FlakyProvider(SandboxError("sandbox service busy (stand-in)"))

    outcome = run_one_with(provider, server, made, calc_task(buggy_repo, "calc-flaky-sandbox"), tmp_path)

    # the failed create, the setup step's second try, and the regrade's two fresh sandboxes (the mirror pair)
    assert provider.calls == 4, "the setup step ran again after the infrastructure failure"
    assert outcome.grade.resolved and outcome.grade.error is None


def test_a_model_url_that_refuses_connections_fails_the_run_at_once_naming_the_url(
    prefect_harness: None, blocks, scripted_model, buggy_repo: Path
) -> None:
    """A model endpoint block whose URL has nothing listening: the run fails at the endpoint check, before any
    sandbox or setup, as a config failure naming the URL; nothing tries again."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from blocks import ModelEndpoint
    from flows.solve_bug import solve_bug
    from tests.support.seaweed import free_ports

    made = blocks(scripted_model([]))
    url = f"http://127.0.0.1:{free_ports(1)[0]}/v1"
    ModelEndpoint(base_url=url, model="nowhere").save("model-refused", overwrite=True)

    state = solve_bug(
        **whole(calc_task(buggy_repo, "calc-refused")), return_state=True,
        **{**flow_kwargs(made), "model": ModelEndpoint.load("model-refused")},
    )  # fmt: skip

    assert state.is_failed()
    (key,) = [k for k in made["_store"].list("adhoc/calc-refused/nowhere") if k.endswith("/grade.json")]
    grade = json.loads(made["_store"].get_bytes(key))
    assert grade["failure_kind"] == "config" and url in grade["error"] and "after 1 attempt" in grade["error"]
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        )
    steps = [r.name for r in runs if r.name.split("-")[0] in ("setup", "baseline", "solve", "regrade")]
    assert [n for n in steps if n != "solve-one"] == [], (
        "no step ran: the endpoint was checked before the setup"
    )
    assert state.message.startswith("config failure: ") and url in state.message, state.message
    assert state.message.count("failure:") == 1, f"the kind said once: {state.message}"
    assert "Traceback" not in run_logs(state.state_details.flow_run_id), (
        "an outcome bugsweep expects: one line"
    )


def test_a_sandbox_that_cannot_be_made_is_retried_by_the_setup_step_alone_and_the_grade_says_how_often(
    blocks, scripted_model, buggy_repo: Path, tmp_path: Path
) -> None:
    """Who retries what, "a sandbox cannot be made": the setup step tries 3 times (a new sandbox each), then the
    task fails as infra, saying so; the model is never asked."""
    from bugsweep.errors import SandboxError

    server = scripted_model([fixer] * 4)
    made = blocks(server)
    provider = FlakyProvider(SandboxError("sandbox service busy (stand-in)"), failures=10)

    outcome = run_one_with(provider, server, made, calc_task(buggy_repo, "calc-no-sandbox"), tmp_path)

    assert provider.calls == 3, "the first try and the setup step's 2 retries"
    assert outcome.grade.failure_kind == "infra"
    assert "the setup step tried 3 times" in outcome.grade.error
    assert server.requests == []


def set_model_block(server: ScriptedModelServer, name: str, max_retries: int) -> Any:
    from blocks import ModelEndpoint

    ModelEndpoint(base_url=server.base_url, model="scripted-model", max_retries=max_retries).save(
        name, overwrite=True
    )
    return ModelEndpoint.load(name)


def turns_sent(server: ScriptedModelServer) -> list[int]:
    """For each request the model server received, the number of assistant turns already in its history: a turn
    paid twice would show as the same number again after a later one."""
    return [sum(m["role"] == "assistant" for m in r["messages"]) for r in server.requests]


def test_a_model_outage_is_retried_inside_the_turn_and_no_turn_is_paid_twice(
    blocks, scripted_model, buggy_repo: Path
) -> None:
    """Who retries what, "the model endpoint fails (5xx, 429, timeouts)": the model client retries the request of
    the turn it failed in; the run goes on from there. Requests: 2 turns + 2 failed tries, the first turn once."""
    from flows.solve_bug import solve_bug

    server = scripted_model([FIX, {"status": 503}, {"status": 502}, tool_call("finish", summary="fixed")])
    made = blocks(server)
    model = set_model_block(server, "model-flaky", max_retries=2)

    grade = solve_bug(
        **whole(calc_task(buggy_repo, "calc-model-blip")), **{**flow_kwargs(made), "model": model}
    )

    assert grade.resolved and grade.turns == 2
    assert turns_sent(server) == [0, 1, 1, 1], (
        "turn 1 once; turn 2's request three times (two 5xx, then a reply)"
    )


def test_a_model_outage_past_the_clients_retries_ends_the_run_without_starting_the_agent_over(
    blocks, scripted_model, buggy_repo: Path
) -> None:
    """An outage longer than the client's retries: the run fails as infra "after 3 attempts", with the turns made
    kept in grade.json; the solve step is not run again, so the turn made before the outage is never paid twice
    (the script would answer a new start with the fix again)."""
    from flows.solve_bug import solve_bug

    server = scripted_model([FIX] + [{"status": 503}] * 3 + [fixer] * 4)
    made = blocks(server)
    model = set_model_block(server, "model-down", max_retries=2)
    task = calc_task(buggy_repo, "calc-model-down")

    state = solve_bug(**whole(task), return_state=True, **{**flow_kwargs(made), "model": model})

    assert state.is_failed()
    assert turns_sent(server) == [0, 1, 1, 1], "turn 1 once, turn 2 tried 3 times, no new start"
    (solve,) = step_runs(state, "solve")
    assert solve.run_count == 1, "the solve step was not retried"
    (key,) = [k for k in made["_store"].list("adhoc/calc-model-down") if k.endswith("/grade.json")]
    grade = json.loads(made["_store"].get_bytes(key))
    assert grade["failure_kind"] == "infra" and "after 3 attempts" in grade["error"]
    assert grade["turns"] == 1, "what the agent used before the outage is kept"


def test_a_config_error_is_not_retried_and_says_what_kind_it_was(
    blocks, scripted_model, buggy_repo: Path, tmp_path: Path
) -> None:
    from bugsweep.errors import ConfigError

    server = scripted_model([fixer] * 4)
    made = blocks(server)
    provider = FlakyProvider(ConfigError("Runtime API key rejected (stand-in)"), failures=5)

    outcome = run_one_with(provider, server, made, calc_task(buggy_repo, "calc-bad-key"), tmp_path)

    assert provider.calls == 1, "a config error would fail the same way again"
    assert outcome.grade.failure_kind == "config" and "API key rejected" in outcome.grade.error
    assert server.requests == [], "the model was never called"


def test_bugsweep_sweep_command_runs_the_flow_and_a_task_that_cannot_run_fails_the_sweep(
    blocks, scripted_model, buggy_repo: Path, tmp_path: Path
) -> None:
    """One task runs, one cannot (its repository does not exist: a config failure). The other task is still graded
    and printed; the flow run ends FAILED, its summary artifact says FAILED, and the command exits 2."""
    from prefect.artifacts import Artifact
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort
    from typer.testing import CliRunner

    from bugsweep.cli import app

    server = scripted_model([fixer] * 4)
    made = blocks(server)
    tasks_file = tmp_path / "cli.jsonl"
    missing = calc_task(tmp_path / "no-such-repo", "calc-missing-repo")
    dump_tasks([calc_task(buggy_repo, "calc-cli"), missing], tasks_file)

    result = CliRunner().invoke(
        app,
        ["sweep", "--tasks", str(tasks_file), "--model-block", made["model_block"],
         "--store-block", made["store_block"], "--max-turns", "4"],
    )  # fmt: skip

    assert result.exit_code == 2, result.output
    assert "1 of 2 resolved" in result.output
    assert (
        "FAILED: 1 of 2 task(s)" in result.output and "calc-missing-repo: failed (config): " in result.output
    )
    assert "Traceback" not in result.output, "an outcome bugsweep expects: one line, no traceback"
    assert "agent policy: plain" in result.output
    assert [k for k in made["_store"].list("cli/calc-cli/scripted-model") if k.endswith("/patch.diff")]
    summary = Artifact.get("sweep-cli")
    assert summary is not None and "FAILED: 1 of 2 task(s)" in str(summary.data)
    with get_client(sync_client=True) as client:
        (last,) = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["sweep"])),
            sort=FlowRunSort.START_TIME_DESC,
            limit=1,
        )
    assert last.state is not None and last.state.is_failed()
    assert last.state.message and last.state.message.startswith("sweep cli FAILED: 1 of 2 task(s)")
    logs = run_logs(last.id)
    assert "Traceback" not in logs and "Encountered exception" not in logs, logs[-3000:]


def run_logs(flow_run_id: Any) -> str:
    """Every log line of a flow run and its task runs, as the server holds them (the UI's Logs tab)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        found = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(entry.message for entry in found)


def test_a_sweep_on_workers_without_the_deployment_says_to_deploy(
    blocks, scripted_model, tmp_path: Path
) -> None:
    from bugsweep.discover import TaskFile
    from bugsweep.errors import ConfigError
    from flows.sweep import sweep

    made = blocks(scripted_model([]))
    tasks_file = tmp_path / "t.jsonl"
    dump_tasks([calc_task(tmp_path, "calc-nowhere")], tasks_file)

    with pytest.raises(ConfigError, match="bugsweep deploy"):
        sweep(
            source=TaskFile(path=str(tasks_file)),
            run_on="workers",
            deployment="solve-bug/nope",
            **flow_kwargs(made),
        )


# -- one path ---------------------------------------------------------------------------------------------------


def test_the_flow_and_the_cli_grade_a_task_the_same_through_the_same_function(
    blocks, scripted_model, buggy_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bugsweep solve` and the solve-bug flow on one task and one script: one function runs both (the flow with
    Prefect steps, the CLI with plain calls), and their grades and patches are the same but for the clock and the resources measured."""
    from typer.testing import CliRunner

    from bugsweep import pipeline
    from bugsweep.cli import app
    from flows.solve_bug import solve_bug
    from tasks.steps import PrefectSteps

    runners: list[Any] = []
    real_solve_task = pipeline.solve_task

    def recording_solve_task(spec: TaskSpec, **kwargs: Any) -> Any:
        runners.append(kwargs.get("runner", pipeline.call_step))
        return real_solve_task(spec, **kwargs)

    monkeypatch.setattr(pipeline, "solve_task", recording_solve_task)
    script = [FIX, tool_call("finish", summary="add() now adds")]
    flow_model, cli_model = scripted_model(script), scripted_model(script)
    spec = calc_task(buggy_repo, "one-path")

    made = blocks(flow_model)
    flow_grade = solve_bug(**whole(spec), sweep="one-path", **flow_kwargs(made))
    flow_patch = (
        made["_store"]
        .get_bytes(f"one-path/one-path/scripted-model/{flow_grade.config_digest}/patch.diff")
        .decode()
    )

    monkeypatch.setenv("LLM_BASE_URL", cli_model.base_url)
    monkeypatch.setenv("LLM_MODEL", "scripted-model")
    monkeypatch.setenv("LLM_API_KEY", "sk-test-secret")
    out = tmp_path / "cli-run"
    args = ["solve", "--repo", str(buggy_repo), "--task", spec.problem_statement]
    result = CliRunner().invoke(
        app,
        [
            *args,
            "--test-command",
            spec.test_command,
            "--setup-command",
            PYTEST_SETUP,
            "--out",
            str(out),
            "--max-turns",
            "6",
        ],
    )
    assert result.exit_code == 0, result.output
    cli_grade = json.loads((out / "grade.json").read_text())

    assert len(runners) == 2 and isinstance(runners[0], PrefectSteps) and runners[1] is pipeline.call_step
    measured = {"instance_id", "wall_s", "agent_wall_s", "cpu_s", "peak_memory_mib", "peak_disk_mib"}
    # the configuration: the same settings make the same one, but for the two scripted servers' addresses
    measured |= {"config", "config_digest"}

    def but_the_address(config: dict[str, Any]) -> dict[str, Any]:
        return {**config, "model": {**config["model"], "base_url": None}}

    assert but_the_address(flow_grade.config or {}) == but_the_address(cli_grade["config"])
    assert flow_grade.resolved and cli_grade["resolved"]
    assert flow_grade.mirror is not None and flow_grade.mirror.model_dump() == cli_grade["mirror"]
    # each attempt's record: the same but for its clock
    measured.add("attempts")
    clock = {"wall_s", "agent_wall_s"}
    assert [a.model_dump(exclude=clock) for a in flow_grade.attempts] == [
        {k: v for k, v in a.items() if k not in clock} for a in cli_grade["attempts"]
    ]
    assert flow_grade.model_dump(exclude=measured) == {
        k: v for k, v in cli_grade.items() if k not in measured
    }
    assert flow_patch == (out / "patch.diff").read_text()


def test_a_run_that_crashed_twice_is_not_run_again_and_fails_before_the_agent(
    blocks, scripted_model, buggy_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rerun automation schedules a crashed solve-bug run again as the same flow run, its run count one higher
    (tests/test_deploy.py kills one for real). Its third start, after a second crash, ends Failed at once: the run
    count the server would give is set through Prefect's runtime override, the rest is a real flow run."""
    from bugsweep.errors import InfraError
    from flows.solve_bug import solve_bug

    server = scripted_model([FIX, tool_call("finish", summary="fixed")])
    made = blocks(server)
    monkeypatch.setenv("PREFECT__RUNTIME__FLOW_RUN__RUN_COUNT", "3")

    state = solve_bug(**whole(calc_task(buggy_repo, "calc-crashy")), return_state=True, **flow_kwargs(made))

    assert state.is_failed()
    with pytest.raises(InfraError, match="crashed 2 times"):
        state.result()
    assert server.requests == [], "the agent did not run"
    assert not made["_store"].list("adhoc/calc-crashy"), "nothing was stored"


def test_a_sweep_on_workers_follows_a_crashed_task_run_into_its_rerun() -> None:
    """A solve-bug run that just crashed for the first time is about to be run again (the rerun automation): the
    sweep keeps following it; after a second crash, or once the grace time passed without a rerun, it is lost."""
    from datetime import UTC, datetime, timedelta

    from prefect.client.schemas.objects import FlowRun
    from prefect.states import Completed, Crashed

    from tasks.fanout import RERUN_GRACE_S, awaiting_rerun

    def run(state: Any, run_count: int) -> FlowRun:
        return FlowRun(flow_id=uuid.uuid4(), run_count=run_count, state=state)

    assert awaiting_rerun(run(Crashed(), 1))
    assert not awaiting_rerun(run(Crashed(), 2)), "crashed again: not run a third time"
    long_ago = datetime.now(UTC) - timedelta(seconds=RERUN_GRACE_S + 1)
    assert not awaiting_rerun(run(Crashed(timestamp=long_ago), 1)), "no rerun came"
    assert not awaiting_rerun(run(Completed(), 1))


def test_bugsweep_upload_to_a_named_s3_bucket_block(blocks, scripted_model, tmp_path: Path) -> None:
    """`bugsweep upload DIR --store-block NAME` uploads a kept run folder through the saved S3Bucket block."""
    from typer.testing import CliRunner

    from bugsweep.cli import app
    from bugsweep.upload import PENDING_FILE, mark_pending

    made = blocks(scripted_model([]))
    store = made["_store"]
    kept = tmp_path / "kept" / "nightly" / "calc-9" / "m"
    kept.mkdir(parents=True)
    (kept / "patch.diff").write_text("+fix\n")
    (kept / "grade.json").write_text(json.dumps({"instance_id": "calc-9", "resolved": True}))
    mark_pending(kept, "nightly/calc-9/m", store, "S3 was down")
    missing = CliRunner().invoke(app, ["upload", str(tmp_path / "kept"), "--store-block", "no-such-block"])
    assert missing.exit_code == 2 and "no-such-block" in missing.output, missing.output
    assert (kept / PENDING_FILE).exists()

    result = CliRunner().invoke(app, ["upload", str(tmp_path / "kept"), "--store-block", made["store_block"]])

    assert result.exit_code == 0, result.output
    assert f"{store.location}/nightly/calc-9/m" in " ".join(result.output.split())
    assert sorted(store.list("nightly")) == ["nightly/calc-9/m/grade.json", "nightly/calc-9/m/patch.diff"]
    assert not (kept / PENDING_FILE).exists()
