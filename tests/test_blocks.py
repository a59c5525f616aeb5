"""`bugsweep blocks create` as a team runs it on its first night: the real command against a real Prefect server
(`prefect server start`) and a real SeaweedFS S3 server. Stand-in: the scripted model server (real HTTP, GET
/models lists what it serves) in place of a model endpoint.

Every failed check is one line, exit code 2, and nothing saved; an existing block is never replaced unless asked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.scripted_model import ScriptedModelServer

pytest_plugins = ["tests.support.prefect_server", "tests.support.seaweed"]
pytestmark = [pytest.mark.prefect, pytest.mark.s3]

PROJECT = Path(__file__).resolve().parent.parent
SLUGS = ("bugsweep-model-endpoint/bugsweep-model", "s3-bucket/bugsweep-artifacts", "aws-credentials/bugsweep-artifacts",
         "bugsweep-local-sandbox/bugsweep-local")  # fmt: skip


@pytest.fixture
def create(prefect_api, seaweed, tmp_path: Path) -> Iterator:
    """Runs `bugsweep blocks create` with a model endpoint and an S3 store; removes what it saved afterwards (the
    Prefect server is shared with test_deploy, whose first step is the same command)."""
    from tests.support.seaweed import ACCESS_KEY, SECRET_KEY

    model = ScriptedModelServer([], served=["team-model"]).start()

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        bucket = env.pop("bucket", "no-bucket")
        settings = {
            "LLM_BASE_URL": model.base_url, "LLM_MODEL": "team-model", "LLM_API_KEY": "sk-first-night",
            "BUGSWEEP_STORE_URL": f"s3://{bucket}/runs", "AWS_ENDPOINT_URL": seaweed.endpoint_url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "BUGSWEEP_STORE_LOCAL_DIR": str(tmp_path / "local"), "COLUMNS": "200",
        }  # fmt: skip
        environment = prefect_api.env(**{**settings, **env})
        command = [sys.executable, "-m", "bugsweep", "blocks", "create", *args]
        done = subprocess.run(
            command, cwd=PROJECT, env=environment, capture_output=True, text=True, timeout=120,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert (
            "sk-first-night" not in done.stdout + done.stderr and SECRET_KEY not in done.stdout + done.stderr
        )
        return done

    try:
        yield run
    finally:
        model.stop()
        for slug in SLUGS:
            if (document := saved_block(prefect_api, slug)) is not None:
                prefect_api.request("DELETE", f"/block_documents/{document['id']}").raise_for_status()


def saved_block(prefect_api, slug: str) -> dict | None:
    """The block document saved as `slug` (TYPE/NAME), as the server holds it (the UI's Blocks page); None when
    there is none. Read through the server's REST API: a process importing Prefect per look costs seconds."""
    block_type, name = slug.split("/")
    answer = prefect_api.request("GET", f"/block_types/slug/{block_type}/block_documents/name/{name}")
    if answer.status_code == 404:
        return None
    answer.raise_for_status()
    return answer.json()


def saved_model_url(prefect_api) -> str | None:
    document = saved_block(prefect_api, SLUGS[0])
    return None if document is None else document["data"]["base_url"]


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip() and "PREFECT_API_URL" not in line]
    assert len(lines) == 1 and lines[0].startswith("error:"), done.stderr
    assert "Nothing was saved" in lines[0] and "Traceback" not in done.stderr
    return lines[0]


def test_blocks_create_checks_the_model_and_the_bucket_and_never_replaces_a_block_unasked(
    create, prefect_api, seaweed
) -> None:
    from tests.support.seaweed import free_ports

    dead = f"http://127.0.0.1:{free_ports(1)[0]}/v1"
    line = one_error_line(create(LLM_BASE_URL=dead))
    assert f"nothing answers at the model endpoint {dead}" in line

    line = one_error_line(create(LLM_MODEL="team-modle"))
    assert "does not serve model 'team-modle'" in line and "team-model" in line

    dead_s3 = f"http://127.0.0.1:{free_ports(1)[0]}"
    line = one_error_line(create(AWS_ENDPOINT_URL=dead_s3))
    assert f"nothing answers at the S3 endpoint {dead_s3}" in line

    bucket = f"night-{uuid.uuid4().hex[:10]}"
    line = one_error_line(create(bucket=bucket))
    assert f"the S3 bucket '{bucket}' does not exist" in line and "--create-bucket" in line
    assert not seaweed.store(bucket).check_bucket() and saved_model_url(prefect_api) is None

    made = create("--create-bucket", bucket=bucket)

    assert made.returncode == 0, made.stdout + made.stderr
    assert f"S3 bucket {bucket}" in made.stdout and "made" in made.stdout
    assert "bugsweep-model" in made.stdout and "bugsweep-artifacts" in made.stdout
    assert seaweed.store(bucket).check_bucket()
    first_url = saved_model_url(prefect_api)
    assert first_url is not None and first_url.startswith("http://127.0.0.1:")

    line = one_error_line(create(bucket=bucket, LLM_BASE_URL="http://127.0.0.1:9/v1"))
    assert "exist already" in line and "model-endpoint/bugsweep-model" in line and "--overwrite" in line
    assert saved_model_url(prefect_api) == first_url, "the existing block is untouched"

    again = create("--overwrite", bucket=bucket)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"S3 bucket {bucket} at {seaweed.endpoint_url}: exists" in again.stdout


@pytest.mark.parametrize("flow_name", ["solve_bug", "sweep"])
def test_a_saved_block_chosen_in_a_run_form_passes_the_forms_own_check(flow_name: str) -> None:
    """The run form sends a chosen block as {"$ref": {"block_document_id": ...}} and Prefect checks it against the
    deployment's schema (the UI before Submit, the server for a deployment's defaults) with its own validation:
    every block-typed parameter of the deployed flows must accept such a reference. A block whose fields all have
    defaults used to accept it twice over (as the block and as a reference), which Prefect's oneOf refuses: the
    form could not be submitted with a block chosen. Prefect's own functions, no server needed."""
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import preprocess_schema, validate

    from flows.solve_bug import solve_bug
    from flows.sweep import sweep

    flow = {"solve_bug": solve_bug, "sweep": sweep}[flow_name]
    schema = parameter_schema(flow.fn).model_dump_for_openapi()
    blocks = {
        name: prop for name, prop in schema["properties"].items()
        if any("block_type_slug" in schema["definitions"].get(ref.get("$ref", "").rsplit("/", 1)[-1], {})
               for ref in prop.get("anyOf", [prop]))
    }  # fmt: skip
    assert {"model", "store", "branches"} <= set(blocks), sorted(blocks)
    reference = {"$ref": {"block_document_id": str(uuid.uuid4())}}
    required = {"repo": "/src/app", "problem": "add() is wrong"} if flow_name == "solve_bug" else {
        "source": {"kind": "file", "path": "/src/tasks.jsonl"}
    }  # fmt: skip
    for name in blocks:
        # the UI drops additionalProperties from the schema it sends: check without them too
        ui_schema = json.loads(json.dumps(schema).replace('"additionalProperties": true', '"x": 0'))
        for form in (schema, ui_schema):
            errors = validate({**required, name: reference}, preprocess_schema(form), preprocess=False)
            assert not errors, f"{name}: {[e.message[:200] for e in errors]}"
