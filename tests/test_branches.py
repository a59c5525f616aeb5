"""Fixes as branches (bugsweep/branches.py): each resolved task's graded change, committed on its base commit and
pushed to a real git server; nothing for an unresolved task; the token nowhere but in the request to the server.

Real parts: a git server on 127.0.0.1 (Git's own `git http-backend` behind a small HTTP server that wants a token
for pushes, tests/support/git_server.py), host git, the local sandbox running real pytest, and for the sweep a
Prefect test server with saved blocks (a Secret block holding the token) and SeaweedFS for the artifacts.
Stand-in: the model is the scripted OpenAI-compatible server (tests/support/scripted_model.py), which replays tool
calls, so which task is resolved is decided by the script.
"""

from __future__ import annotations

import os

os.environ.setdefault("BUGSWEEP_RETRY_DELAYS_S", "0.2,0.5")  # quick retries (read when a flow runs a step)

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from bugsweep.branches import BRANCH_FILE, BranchFields, branch_name, push_fix
from bugsweep.errors import ConfigError
from bugsweep.grading import Grade
from bugsweep.spec import TaskSpec, dump_tasks
from tests.support.git_server import GitHttpServer
from tests.support.repos import PYTEST_SETUP, commit_all, git, make_repo, write_files
from tests.support.scripted_model import tool_call

pytest_plugins = ["tests.support.prefect_server", "tests.support.seaweed"]

TOKEN = f"ghp-test-{uuid.uuid4().hex}"
USER = "fix-bot"
FIX = tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")
#: A task whose text holds this is given up on by the scripted model (finish at once): not resolved.
GIVE_UP = "Leave it as it is."
#: The resolved task's test_patch: a new test file that fails before the fix.
TEST_PATCH_FILES = {
    "tests/test_more.py": "from calc import add\n\n\ndef test_add_ones():\n    assert add(1, 1) == 2\n"
}


def scripted(body: dict[str, Any]) -> dict[str, Any]:
    """Fix on the first turn and finish on the next, unless the task says to give up (any number of tasks at
    once)."""
    task_text = next(m["content"] for m in body["messages"] if m.get("role") == "user")
    if GIVE_UP in task_text or any(m.get("role") == "tool" for m in body["messages"]):
        return tool_call("finish", summary="done")
    return FIX


@pytest.fixture
def git_server(tmp_path: Path) -> Iterator[GitHttpServer]:
    root = tmp_path / "served"
    root.mkdir()
    server = GitHttpServer(root, user=USER, token=TOKEN).start()
    yield server
    server.stop()


@pytest.fixture
def served_calc(tmp_path: Path, git_server: GitHttpServer) -> tuple[str, str, Path]:
    """The buggy calc repository served over HTTP: (its URL, its base commit, the local repository it came from)."""
    repo = make_repo(tmp_path / "calc")
    return git_server.bare_copy(repo, "calc.git"), git(repo, "rev-parse", "HEAD"), repo


def make_test_patch(tmp_path: Path, repo: Path) -> str:
    """The diff that adds TEST_PATCH_FILES to `repo`'s HEAD (made with git, not written by hand)."""
    work = tmp_path / "make-test-patch"
    git(tmp_path, "clone", "-q", str(repo), str(work))
    write_files(work, TEST_PATCH_FILES)
    git(work, "add", "-A")
    return git(work, "diff", "--cached") + "\n"


def clone_at(tmp_path: Path, url: str, commit: str, name: str) -> Path:
    work = tmp_path / name
    git(tmp_path, "clone", "-q", url, str(work))
    git(work, "checkout", "-q", "--detach", commit)
    return work


def assert_branch_is_the_graded_change(
    tmp_path: Path, url: str, branch: str, base: str, patches: list[str], grade: dict[str, Any]
) -> str:
    """The branch's commit: parent the base commit, the grade's summary in its message, and its tree the base with
    the task's test patch and the run's patch.diff applied (`git apply --check` first) in a clone of our own."""
    work = clone_at(tmp_path, url, base, f"check-{uuid.uuid4().hex[:6]}")
    git(work, "fetch", "-q", "origin", f"refs/heads/{branch}")
    commit = git(work, "rev-parse", "FETCH_HEAD")
    assert git(work, "rev-parse", f"{commit}^@") == base, "one parent: the base commit"
    for number, patch in enumerate(patches):
        (work.parent / f"p{number}.diff").write_text(patch)
        git(work, "apply", "--check", str(work.parent / f"p{number}.diff"))
        git(work, "apply", str(work.parent / f"p{number}.diff"))
    git(work, "add", "-A")
    assert git(work, "write-tree") == git(work, "rev-parse", f"{commit}^{{tree}}"), "the graded change, whole"
    message = git(work, "log", "-1", "--format=%B", commit)
    assert "Bugsweep-Verdict: resolved" in message
    assert f"Bugsweep-Model: {grade['model']}" in message and f"Bugsweep-Policy: {grade['policy']}" in message
    assert f"Bugsweep-Config: {grade['config_digest']}" in message
    assert grade["FAIL_TO_PASS"] and all(f"  {test}" in message for test in grade["FAIL_TO_PASS"])
    return commit


def files_under(folder: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


# -- bugsweep solve --push-branch ------------------------------------------------------------------------------


def solve(url: str, base: str, out: Path, model_url: str, *extra: str, task: str, token: str) -> Any:
    env = {**os.environ, "LLM_BASE_URL": model_url, "LLM_MODEL": "scripted", "LLM_API_KEY": "sk-none",
           "BUGSWEEP_BRANCH_TOKEN": token, "BUGSWEEP_BRANCH_USERNAME": USER, "COLUMNS": "200"}  # fmt: skip
    args = [sys.executable, "-m", "bugsweep.cli", "solve", "--repo", url, "--ref", base, "--task", task,
            "--test-command", "python -m pytest -q", "--setup-command", PYTEST_SETUP, "--out", str(out),
            "--max-turns", "4", "--push-branch", *extra]  # fmt: skip
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=400)


def test_bugsweep_solve_pushes_a_resolved_fix_and_a_refused_token_keeps_the_grade(
    tmp_path: Path, scripted_model, git_server: GitHttpServer, served_calc: tuple[str, str, Path]
) -> None:
    url, base, _ = served_calc
    model = scripted_model([scripted] * 6)
    out = tmp_path / "out"

    proc = solve(url, base, out, model.base_url, task="test_add fails: add() is wrong. Fix it.", token=TOKEN)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    grade = json.loads((out / "grade.json").read_text())
    name = f"bugsweep/adhoc/{grade['instance_id']}"
    assert set(git_server.branches("calc.git")) == {"main", name}
    commit = assert_branch_is_the_graded_change(
        tmp_path, url, name, base, [(out / "patch.diff").read_text()], grade
    )
    assert f"branch {name} ({commit[:12]} on {base[:12]}) pushed to {url}" in proc.stdout
    assert json.loads((out / BRANCH_FILE).read_text())["commit"] == commit
    # the token reached the server (as the header made from it) and nothing else
    assert TOKEN not in proc.stdout + proc.stderr + files_under(out)

    # a wrong token: the push is refused, the command says so in one line without the token, the grade stands
    wrong = f"wrong-{uuid.uuid4().hex}"
    out2 = tmp_path / "out2"
    proc = solve(url, base, out2, model.base_url, task="test_add fails: add() is wrong, again.", token=wrong)

    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "RESOLVED" in proc.stdout and "branch not pushed (config)" in proc.stderr
    assert "refused the push" in proc.stderr and wrong not in proc.stdout + proc.stderr + files_under(out2)
    assert json.loads((out2 / "grade.json").read_text())["resolved"] is True
    assert "refused the push" in json.loads((out2 / BRANCH_FILE).read_text())["error"]
    assert set(git_server.branches("calc.git")) == {"main", name}


def test_bugsweep_solve_pushes_nothing_for_an_unresolved_task(
    tmp_path: Path, scripted_model, git_server: GitHttpServer, served_calc: tuple[str, str, Path]
) -> None:
    url, base, _ = served_calc
    model = scripted_model([scripted] * 4)

    proc = solve(url, base, tmp_path / "out", model.base_url, task=f"add() is wrong. {GIVE_UP}", token=TOKEN)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert git_server.branches("calc.git") == {"main": base}
    assert not [a for a in git_server.authorizations if a], "not even asked: no push was tried"
    assert not (tmp_path / "out" / BRANCH_FILE).exists()


# -- the branch maker on its own --------------------------------------------------------------------------------


def resolved_grade(instance_id: str) -> Grade:
    """What push_fix reads of a grade (its input here, as grade.json would hold it)."""
    return Grade(instance_id=instance_id, model="m", policy="plain", config_digest="0123456789ab", resolved=True,
                 FAIL_TO_PASS=["tests/test_calc.py::test_add"], evidence="per-test results")  # fmt: skip


def test_a_branch_is_never_overwritten_and_the_same_change_again_is_found_there(
    tmp_path: Path, git_server: GitHttpServer, served_calc: tuple[str, str, Path]
) -> None:
    url, base, repo = served_calc
    spec = TaskSpec(
        instance_id="calc add", repo=url, base_commit=base, problem_statement="x", test_command="t"
    )
    settings = BranchFields(username=USER)
    work = clone_at(tmp_path, url, base, "fix")
    (work / "calc.py").write_text((work / "calc.py").read_text().replace("a - b", "a + b"))
    fix = git(work, "diff") + "\n"

    first = push_fix(
        spec, resolved_grade("calc add"), fix, sweep="night", settings=settings, token=SecretStr(TOKEN)
    )
    again = push_fix(
        spec, resolved_grade("calc add"), fix, sweep="night", settings=settings, token=SecretStr(TOKEN)
    )

    assert first.branch == "bugsweep/night/calc-add" and not first.already_there
    assert again.already_there and again.commit == first.commit
    (work / "calc.py").write_text((work / "calc.py").read_text().replace("a + b", "b + a"))
    other = git(work, "diff", base) + "\n"
    with pytest.raises(ConfigError, match="already holds another commit") as refused:
        push_fix(
            spec, resolved_grade("calc add"), other, sweep="night", settings=settings, token=SecretStr(TOKEN)
        )
    assert TOKEN not in str(refused.value)
    assert git_server.branches("calc.git")["bugsweep/night/calc-add"] == first.commit

    with pytest.raises(ValueError, match="not resolved"):
        push_fix(spec, Grade(instance_id="calc add"), fix, sweep="night", settings=settings)
    # a task on a folder goes where it is told, and only from a commit: not from uncommitted changes
    folder_task = spec.model_copy(update={"repo": str(repo), "base_commit": None})
    with pytest.raises(ConfigError, match="not a git URL"):
        push_fix(folder_task, resolved_grade("calc add"), fix, sweep="night", settings=settings)
    (repo / "notes.txt").write_text("work in progress\n")
    with pytest.raises(ConfigError, match="uncommitted changes"):
        push_fix(folder_task, resolved_grade("calc add"), fix, sweep="n2",
                 settings=settings.model_copy(update={"push_url": url}), token=SecretStr(TOKEN))  # fmt: skip
    commit_all(repo, "notes")
    pushed = push_fix(folder_task, resolved_grade("calc add"), fix, sweep="n2",
                      settings=settings.model_copy(update={"push_url": url}), token=SecretStr(TOKEN))  # fmt: skip
    assert pushed.base == git(repo, "rev-parse", "HEAD") != base


@pytest.mark.parametrize(
    ("prefix", "sweep", "task", "expected"),
    [
        ("bugsweep", "nightly", "calc-add", "bugsweep/nightly/calc-add"),
        ("fixes/bot", "my sweep", "org/repo#12:x", "fixes/bot/my-sweep/org-repo-12-x"),
        ("bugsweep", "..", "a..b.lock", "bugsweep/a.b"),
    ],
)
def test_branch_names_are_valid_refs(prefix: str, sweep: str, task: str, expected: str) -> None:
    assert branch_name(prefix, sweep, task) == expected


# -- bugsweep sweep --push-branches, through the sweep flow on a Prefect server ----------------------------------


@pytest.fixture
def saved_blocks(prefect_harness: None, seaweed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Factory: a model endpoint block for a scripted server, an S3Bucket block on a new SeaweedFS bucket, and a
    git branches block whose token is a Prefect Secret block; their names, and the store."""
    from prefect.blocks.system import Secret
    from prefect_aws import AwsCredentials, S3Bucket
    from prefect_aws.client_parameters import AwsClientParameters

    from blocks import GitBranches, ModelEndpoint, bucket_store
    from tests.support.seaweed import ACCESS_KEY, SECRET_KEY

    monkeypatch.setenv("BUGSWEEP_STORE_LOCAL_DIR", str(tmp_path / "local-artifacts"))

    def make(model_url: str) -> dict[str, Any]:
        suffix = uuid.uuid4().hex[:8]
        ModelEndpoint(base_url=model_url, model="scripted-model", api_key=SecretStr("sk-x")).save(
            f"m-{suffix}"
        )
        credentials = AwsCredentials(
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SecretStr(SECRET_KEY),
            aws_client_parameters=AwsClientParameters(endpoint_url=seaweed.endpoint_url),
        )
        credentials.save(f"aws-{suffix}")
        bucket = S3Bucket(
            bucket_name=seaweed.new_store(prefix="").bucket, bucket_folder="runs", credentials=credentials
        )
        bucket.save(f"s-{suffix}")
        Secret(value=TOKEN).save(f"git-token-{suffix}")
        GitBranches(username=USER, token=Secret.load(f"git-token-{suffix}")).save(f"b-{suffix}")
        return {"model": f"m-{suffix}", "store": f"s-{suffix}", "branches": f"b-{suffix}",
                "_store": bucket_store(bucket)}  # fmt: skip

    return make


@pytest.mark.prefect
@pytest.mark.s3
def test_a_sweep_pushes_the_resolved_fix_with_its_test_patch_and_nothing_for_the_unresolved_task(
    tmp_path: Path,
    scripted_model,
    saved_blocks,
    git_server: GitHttpServer,
    served_calc: tuple[str, str, Path],
) -> None:
    """`bugsweep sweep --push-branches --branches-block NAME` on two tasks of one served repository: the model
    fixes one (which has a test patch) and gives up on the other."""
    from prefect.artifacts import Artifact
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from typer.testing import CliRunner

    from bugsweep.cli import app

    url, base, repo = served_calc
    test_patch = make_test_patch(tmp_path, repo)
    common = {
        "repo": url,
        "base_commit": base,
        "test_command": "python -m pytest -q",
        "setup_command": PYTEST_SETUP,
    }
    fixed = TaskSpec(instance_id="calc-add", problem_statement="add() is wrong. Fix it.", test_patch=test_patch,
                     **common)  # fmt: skip
    given_up = TaskSpec(instance_id="calc-left", problem_statement=f"add() is wrong. {GIVE_UP}", **common)
    tasks_file = tmp_path / "tasks.jsonl"
    dump_tasks([fixed, given_up], tasks_file)
    made = saved_blocks(scripted_model([scripted] * 8).base_url)

    result = CliRunner().invoke(
        app,
        ["sweep", "--tasks", str(tasks_file), "--name", "night", "--model-block", made["model"],
         "--store-block", made["store"], "--push-branches", "--branches-block", made["branches"],
         "--max-turns", "4", "--concurrency", "2"],
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    assert "1 of 2 resolved" in result.output
    assert set(git_server.branches("calc.git")) == {"main", "bugsweep/night/calc-add"}, "none for calc-left"
    store = made["_store"]
    (grade_key,) = [k for k in store.list("night/calc-add/") if k.endswith("/grade.json")]
    folder = grade_key.rsplit("/", 1)[0]
    grade = json.loads(store.get_bytes(grade_key))
    assert grade["resolved"] and "tests/test_more.py::test_add_ones" in grade["FAIL_TO_PASS"]
    commit = assert_branch_is_the_graded_change(
        tmp_path, url, "bugsweep/night/calc-add", base, [test_patch, store.get_bytes(f"{folder}/patch.diff").decode()],
        grade,
    )  # fmt: skip
    assert "Includes the task's test_patch: yes" in git(
        git_server.root / "calc.git", "log", "-1", "--format=%B", commit
    )
    assert json.loads(store.get_bytes(f"{folder}/{BRANCH_FILE}"))["commit"] == commit
    assert not [k for k in store.list("night/calc-left/") if k.endswith(f"/{BRANCH_FILE}")]
    summary = Artifact.get("sweep-night")
    assert summary is not None and f"calc-add: `branch bugsweep/night/calc-add ({commit[:12]}" in str(
        summary.data
    )

    # the token: not in the output, the run folders, the stored artifacts, the flow run's parameters or logs
    assert TOKEN not in result.output
    assert TOKEN not in files_under(tmp_path / "local-artifacts")
    assert all(TOKEN.encode() not in store.get_bytes(k) for k in store.list("night/"))
    shown = ""  # logs reach the API in batches, after the flow returned: look until they are there
    with get_client(sync_client=True) as client:
        ours = [r for r in client.read_flow_runs(limit=200) if (r.parameters or {}).get("name") == "night"]
        assert ours and all(TOKEN not in json.dumps(r.parameters, default=str) for r in ours)
        deadline = time.monotonic() + 30
        while "bugsweep/night/calc-add" not in shown and time.monotonic() < deadline:
            time.sleep(0.5)
            logs = []  # the server answers at most 200 a page; a sweep's turns log more
            while len(page := client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id for r in ours])), offset=len(logs)
            )) > 0:  # fmt: skip
                logs += page
            shown = "\n".join(entry.message for entry in logs)
    assert "bugsweep/night/calc-add" in shown and TOKEN not in shown
