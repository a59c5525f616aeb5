"""SWE-bench records in and out (bugsweep.swebench): read as tasks, mined tasks written as them, and a sweep's
predictions.jsonl in the official harness's format.

Real parts: real git repositories (tests.support.repos) in a local mirror folder, real `git`, the real local sandbox
running real pytest (mining's validation and the sweep), a real Prefect API server (prefect_test_harness) for the
`bugsweep sweep` command, a real SeaweedFS S3 server as the artifact store. Stand-in: the model is the scripted
OpenAI-compatible server, which fixes the bug with one edit_file call.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from bugsweep.cli import app
from bugsweep.spec import load_tasks
from tests.support.repos import BUGGY_CALC, commit_all, git, make_repo, write_files
from tests.support.scripted_model import tool_call

if TYPE_CHECKING:
    from tests.support.seaweed import SeaweedServer

pytest_plugins = ["tests.support.prefect_server", "tests.support.seaweed"]

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")

FIXED_CALC = BUGGY_CALC["calc.py"].replace("a - b", "a + b")
NEW_TEST = "\n\ndef test_add_negative():\n    assert add(-2, -3) == -5\n"


def mirror_with_fix(mirror: Path) -> tuple[Path, str]:
    """`mirror/acme__calc`: the buggy calculator, then a commit fixing add() with a new test. Returns (repo, fix)."""
    repo = make_repo(mirror / "acme__calc")
    write_files(
        repo, {"calc.py": FIXED_CALC, "tests/test_calc.py": BUGGY_CALC["tests/test_calc.py"] + NEW_TEST}
    )
    return repo, commit_all(repo, "Fix add() returning the difference")


def published_record(repo: Path, fix: str, **fields: Any) -> dict[str, Any]:
    """A record as SWE-bench publishes it: owner/name, test ids as JSON strings, no commands."""
    parent = git(repo, "rev-parse", f"{fix}^")
    return {
        "repo": "acme/calc",
        "instance_id": "acme__calc-1",
        "base_commit": parent,
        "patch": git(repo, "diff", parent, fix, "--", "calc.py") + "\n",
        "test_patch": git(repo, "diff", parent, fix, "--", "tests") + "\n",
        "problem_statement": "add() returns the difference of its arguments.",
        "hints_text": "Look at calc.py.",
        "created_at": "2026-01-01T00:00:00Z",
        "version": "1.0",
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add", "tests/test_calc.py::test_add_negative"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_mul"]),
        "environment_setup_commit": parent,
        **fields,
    }


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


SPECS = {
    "acme/calc": {
        "1.0": {"setup_command": "pip install pytest", "test_command": "python -m pytest -q {test_files}"}
    }
}


def test_a_published_record_becomes_a_task(tmp_path: Path) -> None:
    """What a sweep would run: the clone in the mirror folder, the commands of its version with the test_patch's
    test modules, the test ids decoded, the gold patch kept; a list where SWE-bench has a JSON string works too."""
    repo, fix = mirror_with_fix(tmp_path / "mirror")
    record = published_record(repo, fix)
    tasks = write_jsonl(tmp_path / "swe.jsonl", [record, {**published_record(repo, fix), "instance_id": "acme__calc-2",
                        "FAIL_TO_PASS": ["tests/test_calc.py::test_add"], "PASS_TO_PASS": []}])  # fmt: skip
    (tmp_path / "swe.specs.json").write_text(json.dumps(SPECS))  # the specs file's conventional place

    first, second = load_tasks(tasks, repos_from=str(tmp_path / "mirror"))

    assert first.repo == str(repo) and first.base_commit == record["base_commit"]
    assert first.test_command == "python -m pytest -q tests/test_calc.py"
    assert first.setup_command == "pip install pytest"
    assert first.FAIL_TO_PASS == ["tests/test_calc.py::test_add", "tests/test_calc.py::test_add_negative"]
    assert first.PASS_TO_PASS == ["tests/test_calc.py::test_mul"]
    assert first.patch == record["patch"] and first.test_patch == record["test_patch"]
    assert first.test_files == ["tests/test_calc.py"], "the test_patch's files are protected"
    assert second.FAIL_TO_PASS == ["tests/test_calc.py::test_add"] and second.PASS_TO_PASS == []

    # by default the repository is cloned from GitHub, as the official harness does; a "*" version holds for any
    specs = tmp_path / "other-specs.json"
    specs.write_text(json.dumps({"acme/calc": {"*": {"test_command": "pytest -rA"}}}))
    (task, _) = load_tasks(tasks, specs=specs)
    assert task.repo == "https://github.com/acme/calc" and task.test_command == "pytest -rA"
    assert task.setup_command is None


@pytest.mark.parametrize(
    ("change", "specs", "expected"),
    [
        (
            {"FAIL_TO_PASS": "tests/test_calc.py::test_add"},
            SPECS,
            "swe.jsonl:2: FAIL_TO_PASS: not a JSON list of test ids",
        ),
        (
            {"PASS_TO_PASS": json.dumps({"a": 1})},
            SPECS,
            "swe.jsonl:2: PASS_TO_PASS: not a JSON list of test ids",
        ),
        ({"repo": "acme/other"}, SPECS, "swe.jsonl:2: repo: no commands for acme/other in specs"),
        (
            {"version": "2.0"},
            SPECS,
            "swe.jsonl:2: version: no test_command for repo acme/calc version '2.0' in specs",
        ),
        (
            {"repo": "ghost/calc"},
            {**SPECS, "ghost/calc": SPECS["acme/calc"]},
            "swe.jsonl:2: repo: no clone of ghost/calc in",
        ),
        (
            {},
            None,
            "swe.jsonl:1: test_command: none, so it is read as a SWE-bench record, and its specs file is missing",
        ),
        ({}, {"acme/calc": {"1.0": {"setup": "x"}}}, "acme/calc 1.0 test_command: Field required"),
        ({"base_commit": None}, SPECS, "swe.jsonl:2: base_commit: missing"),
        ({"base_commit": ""}, SPECS, "swe.jsonl:2: base_commit: missing"),
        (
            {"base_commit": "0123456789abcdef0123456789abcdef01234567"},
            SPECS,
            "swe.jsonl:2: base_commit: 0123456789abcdef0123456789abcdef01234567 is not a commit of ",
        ),
    ],
    ids=[
        "ftp-not-json",
        "ptp-not-a-list",
        "unknown-repo",
        "unknown-version",
        "no-clone",
        "no-specs",
        "bad-specs",
        "no-base-commit",
        "empty-base-commit",
        "base-commit-not-in-repo",
    ],
)
def test_a_record_that_cannot_be_used_stops_the_sweep_with_one_line(
    tmp_path: Path, change: dict[str, Any], specs: dict[str, Any] | None, expected: str
) -> None:
    """`bugsweep sweep` on a task file whose second record is bad: exit 2 and one line naming the line and the
    field, before any Prefect server starts or any task runs (nothing half-loaded: the good first record is not
    run either)."""
    repo, fix = mirror_with_fix(tmp_path / "mirror")
    good = published_record(repo, fix, instance_id="acme__calc-good")
    tasks = write_jsonl(tmp_path / "swe.jsonl", [good, published_record(repo, fix) | change])
    command = ["sweep", "--tasks", str(tasks), "--repos-from", str(tmp_path / "mirror")]
    if specs is not None:
        (tmp_path / "specs.json").write_text(json.dumps(specs))
        command += ["--specs", str(tmp_path / "specs.json")]

    result = CliRunner().invoke(
        app, command, env={"BUGSWEEP_STORE_URL": str(tmp_path / "store"), "COLUMNS": "80"}
    )

    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert expected in lines[0], lines[0]
    assert not (tmp_path / "store").exists(), "nothing ran, nothing was stored"

    # `bugsweep compare` reads task files the same way
    compare = ["compare", *command[1:], "--model", "m=http://127.0.0.1:9/v1", "--runs", "1"]
    result = CliRunner().invoke(app, compare, env={"BUGSWEEP_STORE_URL": str(tmp_path / "store")})
    assert result.exit_code == 2 and expected in result.output, result.output
    assert not (tmp_path / "store").exists()


def test_tasks_written_as_records_read_back_with_their_own_commands(tmp_path: Path) -> None:
    """Built tasks -> SWE-bench records and specs -> tasks again: each distinct command is a version of its own
    (a mined task's flaky tests are deselected in its command only), and every field a sweep uses comes back."""
    from bugsweep.spec import TaskSpec
    from bugsweep.swebench import dump_records

    repo, fix = mirror_with_fix(tmp_path / "mirror")
    record = published_record(repo, fix)
    common = {"repo": str(repo), "base_commit": record["base_commit"], "problem_statement": "Fix add()",
              "setup_command": "pip install pytest", "test_patch": record["test_patch"], "patch": record["patch"],
              "test_files": ["tests/test_calc.py"], "created_at": "2026-01-01T00:00:00+00:00",
              "FAIL_TO_PASS": ["tests/test_calc.py::test_add"], "PASS_TO_PASS": ["tests/test_calc.py::test_mul"]}  # fmt: skip
    built = [
        TaskSpec(instance_id="calc-a", test_command="python -m pytest -q tests/test_calc.py", **common),
        TaskSpec(instance_id="calc-b", test_command="python -m pytest -q tests/test_calc.py", **common),
        TaskSpec(
            instance_id="calc-flaky",
            test_command="python -m pytest -q tests/test_calc.py --deselect tests/test_calc.py::test_mul",
            **common,
        ),
    ]
    out = tmp_path / "exported.jsonl"

    dump_records(built, out, slug="acme/calc")

    assert [json.loads(line)["version"] for line in out.read_text().splitlines()] == ["0", "0", "1"]
    specs = json.loads((tmp_path / "exported.specs.json").read_text())["acme/calc"]
    assert (
        specs["1"]["test_command"]
        == "python -m pytest -q {test_files} --deselect tests/test_calc.py::test_mul"
    )
    read_back = load_tasks(out, repos_from=str(tmp_path / "mirror"))
    fields = {"instance_id", "base_commit", "problem_statement", "test_command", "setup_command", "test_patch",
              "patch", "test_files", "FAIL_TO_PASS", "PASS_TO_PASS", "created_at"}  # fmt: skip
    assert [t.model_dump(include=fields) for t in read_back] == [t.model_dump(include=fields) for t in built]


def fixer(body: dict[str, Any]) -> dict[str, Any]:
    """The scripted model's turn: fix add() with one edit, then finish."""
    if any(m.get("role") == "tool" for m in body["messages"]):
        return tool_call("finish", summary="add() now adds")
    return tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")


@needs_bwrap
def test_mined_tasks_round_trip_as_swe_bench_records_and_the_sweep_writes_predictions(
    prefect_harness: None,
    seaweed: SeaweedServer,
    scripted_model,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """mine --format swe-bench -> records and specs -> `bugsweep sweep` from the local mirror folder ->
    predictions.jsonl in the local folder and in the S3 store, model_patch exactly each run's patch.diff; a rerun
    (graded before, read from the store) writes the same predictions."""
    from blocks import ModelEndpoint
    from tests.support.seaweed import ACCESS_KEY, SECRET_KEY

    repo, fix = mirror_with_fix(tmp_path / "mirror")
    tasks = tmp_path / "mined.jsonl"
    mined = CliRunner().invoke(
        app, ["mine", str(repo), "--format", "swe-bench", "--runs", "1", "--limit", "1", "--out", str(tasks)]
    )
    assert mined.exit_code == 0, mined.output
    (record,) = [json.loads(line) for line in tasks.read_text().splitlines()]
    parent = git(repo, "rev-parse", f"{fix}^")
    assert (
        record["repo"] == "acme/calc"
        and record["base_commit"] == parent == record["environment_setup_commit"]
    )
    assert json.loads(record["FAIL_TO_PASS"]) == [
        "tests/test_calc.py::test_add",
        "tests/test_calc.py::test_add_negative",
    ]
    assert json.loads(record["PASS_TO_PASS"]) == ["tests/test_calc.py::test_mul"]
    assert (record["screen_rule"], record["screen_reason"]) == (
        "fix word in the subject",
        "the subject says 'Fix'",
    )
    assert record["patch"] == git(repo, "diff", parent, fix, "--", "calc.py") + "\n", (
        "the fix without its tests"
    )
    assert (
        record["test_patch"].startswith("diff --git a/tests/test_calc.py")
        and "calc.py b/calc.py" not in record["test_patch"]
    )
    assert record["version"] == "0" and record["problem_statement"] == "Fix add() returning the difference"
    specs = json.loads((tmp_path / "mined.specs.json").read_text())
    assert specs["acme/calc"]["0"]["test_command"] == "python -m pytest -q {test_files}"

    server = scripted_model([fixer] * 2)
    ModelEndpoint(base_url=server.base_url, model="scripted-model", api_key=SecretStr("sk-test")).save(
        "swebench-model", overwrite=True
    )
    store = seaweed.new_store(prefix="runs")
    monkeypatch.setenv("BUGSWEEP_STORE_URL", f"s3://{store.bucket}/runs")
    monkeypatch.setenv("BUGSWEEP_STORE_ENDPOINT_URL", seaweed.endpoint_url)
    monkeypatch.setenv("BUGSWEEP_STORE_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("BUGSWEEP_STORE_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("BUGSWEEP_STORE_LOCAL_DIR", str(tmp_path / "local"))
    sweep = ["sweep", "--tasks", str(tasks), "--repos-from", str(tmp_path / "mirror"),
             "--model-block", "swebench-model", "--max-turns", "4"]  # fmt: skip

    result = CliRunner().invoke(app, sweep)

    assert result.exit_code == 0, result.output
    assert "1 of 1 resolved" in result.output
    (patch_key,) = [k for k in store.list("mined/") if k.endswith("/patch.diff")]
    patch = store.get_bytes(patch_key).decode()
    assert "-    return a - b\n+    return a + b" in patch
    local = tmp_path / "local" / "mined" / "predictions.jsonl"
    expected = {
        "instance_id": record["instance_id"],
        "model_name_or_path": "scripted-model",
        "model_patch": patch,
    }
    assert [json.loads(line) for line in local.read_text().splitlines()] == [expected]
    assert store.get_bytes("mined/predictions.jsonl") == local.read_bytes()
    assert (tmp_path / "local" / patch_key).read_text() == patch
    assert not any("diff --git a/calc.py" in json.dumps(r) for r in server.requests), (
        "the gold patch is never shown"
    )

    # graded before: skipped, its patch read from the store (the local folder is gone), the same predictions
    shutil.rmtree(tmp_path / "local")
    again = CliRunner().invoke(app, sweep)
    assert again.exit_code == 0, again.output
    assert len(server.requests) == 2, "the agent did not run again"
    assert [json.loads(line) for line in local.read_text().splitlines()] == [expected]
