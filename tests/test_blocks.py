"""`bugsweep blocks create` as a team runs it on its first night: the real command against a real Prefect server
(`prefect server start`) and a real SeaweedFS S3 server. Stand-in: the scripted model server (real HTTP, GET
/models lists what it serves) in place of a model endpoint.

Every failed check is one line, exit code 2, and nothing saved; an existing block is never replaced unless asked.
"""

from __future__ import annotations

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
            subprocess.run([sys.executable, "-m", "prefect", "block", "delete", slug], env=prefect_api.env(),
                           capture_output=True, timeout=60)  # fmt: skip


def saved_model_url(prefect_api) -> str | None:
    code = (
        "from blocks import ModelEndpoint\n"
        "try:\n    print(ModelEndpoint.load('bugsweep-model').base_url)\n"
        "except ValueError:\n    print('none')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT, env=prefect_api.env(), capture_output=True,
                         text=True, timeout=60, check=True).stdout.strip()  # fmt: skip
    return None if out == "none" else out


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
