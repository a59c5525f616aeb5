"""The artifact store (bugsweep/storage.py) and run folders uploaded into it (bugsweep/upload.py).

Real parts: a real SeaweedFS S3 server (`weed mini`, started by the session fixture on free loopback ports) reached
through real boto3 over HTTP, and real folders for the local store. No stand-ins.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pydantic import SecretStr

from bugsweep.errors import ConfigError, StorageError
from bugsweep.storage import (
    LocalStore,
    S3Store,
    StoreSettings,
    open_store,
    read_text,
    run_key,
)
from bugsweep.upload import upload_run

if TYPE_CHECKING:
    from tests.support.seaweed import SeaweedServer

pytest_plugins = ["tests.support.seaweed"]

pytestmark = pytest.mark.s3


def make_run_dir(root: Path) -> Path:
    """A run folder as bugsweep writes it: patch, trajectory, grade and both test logs."""
    run = root / "run"
    run.mkdir(parents=True)
    (run / "patch.diff").write_text(
        "--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-    return a - b\n+    return a + b\n"
    )
    (run / "trajectory.json").write_text(json.dumps([{"role": "user", "content": "fix add"}]))
    (run / "grade.json").write_text(json.dumps({"instance_id": "calc-1", "resolved": True}))
    (run / "test_before.log").write_text("1 failed, 1 passed\n")
    (run / "test_after.log").write_text("2 passed\n")
    return run


def count_requests(store: S3Store) -> list[str]:
    """Every HTTP request boto3 sends for this store (retries included), by operation name."""
    sent: list[str] = []
    store.client.meta.events.register("before-send.s3.*", lambda request, **kw: sent.append(request.url))
    return sent


def test_run_key_makes_model_names_safe() -> None:
    assert run_key("nightly-2026-11-30", "calc-1", "Qwen/Qwen2.5-Coder-7B:q4", "3eaaa4195dd0") == (
        "nightly-2026-11-30/calc-1/Qwen_Qwen2.5-Coder-7B_q4/3eaaa4195dd0"
    )
    assert run_key("s", "t", "m", "c", run=2) == "s/t/m/c/run-2"
    with pytest.raises(ConfigError):
        run_key("s", "..", "m", "c")


def test_local_store_keeps_a_run_folder_under_its_key(tmp_path: Path) -> None:
    run = make_run_dir(tmp_path)
    store = open_store(StoreSettings(url=str(tmp_path / "artifacts")))
    assert isinstance(store, LocalStore)

    result = upload_run(store, run, run_key("sweep1", "calc-1", "m", "c0"))

    assert sorted(result.uris) == [
        "grade.json",
        "patch.diff",
        "test_after.log",
        "test_before.log",
        "trajectory.json",
    ]
    stored = tmp_path / "artifacts" / "sweep1" / "calc-1" / "m" / "c0"
    for name in result.uris:
        assert (stored / name).read_bytes() == (run / name).read_bytes()
    assert store.exists("sweep1/calc-1/m/c0/grade.json")
    assert not store.exists("sweep1/calc-2/m/c0/grade.json")
    assert store.list("sweep1/calc-1") == [f"sweep1/calc-1/m/c0/{n}" for n in sorted(result.uris)]
    with pytest.raises(ConfigError):
        store.put_bytes("../escape.txt", b"x")


def test_s3_objects_land_under_prefix_sweep_task_model(seaweed: SeaweedServer, tmp_path: Path) -> None:
    run = make_run_dir(tmp_path)
    store = seaweed.new_store(prefix="bugsweep/runs")

    result = upload_run(store, run, run_key("nightly", "calc-1", "qwen/coder", "c0"))

    keys = store.client.list_objects_v2(Bucket=store.bucket)["Contents"]
    assert sorted(k["Key"] for k in keys) == [
        f"bugsweep/runs/nightly/calc-1/qwen_coder/c0/{name}"
        for name in ["grade.json", "patch.diff", "test_after.log", "test_before.log", "trajectory.json"]
    ]
    for name, uri in result.uris.items():
        assert uri == f"s3://{store.bucket}/bugsweep/runs/nightly/calc-1/qwen_coder/c0/{name}"
        body = store.client.get_object(Bucket=store.bucket, Key=uri.split("/", 3)[3])["Body"].read()
        assert body == (run / name).read_bytes()
    assert store.exists("nightly/calc-1/qwen_coder/c0/grade.json")
    assert not store.exists("nightly/calc-2/qwen_coder/c0/grade.json")
    assert json.loads(store.get_bytes("nightly/calc-1/qwen_coder/c0/grade.json"))["resolved"] is True
    with pytest.raises(FileNotFoundError):
        store.get_bytes("nightly/calc-1/qwen_coder/c0/nothing.txt")


def test_s3_store_from_settings_and_a_task_file_read_from_s3(seaweed: SeaweedServer) -> None:
    from tests.support.seaweed import ACCESS_KEY, SECRET_KEY

    bucket_store = seaweed.new_store(prefix="")
    bucket_store.put_bytes(
        "sets/tasks.jsonl", b'{"repo": "/r", "problem_statement": "p", "test_command": "t"}\n'
    )
    settings = StoreSettings(
        url=f"s3://{bucket_store.bucket}/artifacts",
        endpoint_url=seaweed.endpoint_url,
        access_key_id=SecretStr(ACCESS_KEY),
        secret_access_key=SecretStr(SECRET_KEY),
    )
    store = open_store(settings)
    assert isinstance(store, S3Store)
    assert store.location == f"s3://{bucket_store.bucket}/artifacts"
    assert SECRET_KEY not in repr(store)

    text = read_text(f"s3://{bucket_store.bucket}/sets/tasks.jsonl", store)
    assert json.loads(text)["problem_statement"] == "p"
    with pytest.raises(ConfigError, match="does not exist"):
        read_text(f"s3://{bucket_store.bucket}/sets/missing.jsonl", store)


def test_a_folder_listing_holds_only_that_folder_whatever_shares_its_name(
    seaweed: SeaweedServer, tmp_path: Path
) -> None:
    """Sweeps `nightly`, `nightly-fail` and `nightly-x` side by side, in S3 (under a bucket prefix, beside a
    sibling prefix) and in a folder: each listing ends at a '/' and holds only its own keys."""
    s3 = seaweed.new_store(prefix="runs")
    sibling = seaweed.store(bucket=s3.bucket, prefix="runs-old")
    local = LocalStore(tmp_path / "artifacts")
    for store in (s3, local):
        for sweep in ("nightly", "nightly-fail", "nightly-x"):
            store.put_bytes(f"{sweep}/calc-1/m/c0/grade.json", b"{}")
    sibling.put_bytes("nightly/calc-9/m/c0/grade.json", b"{}")

    for store in (s3, local):
        assert store.list("nightly") == store.list("nightly/") == ["nightly/calc-1/m/c0/grade.json"], store
        assert store.list("nightly-x") == ["nightly-x/calc-1/m/c0/grade.json"]
        assert store.list("nightly/calc-1/m") == ["nightly/calc-1/m/c0/grade.json"]
        assert store.list("night") == [], "a folder is a whole name, not its beginning"
        assert len(store.list()) == 3, "the store's own root: not the sibling prefix runs-old/"


def test_a_link_to_a_private_bucket_opens_in_a_browser_until_it_expires(seaweed: SeaweedServer) -> None:
    """The private bucket refuses an anonymous GET; the store's link (presigned, SigV4) opens, as UTF-8 text for
    a diff and HTML for a page, and says until when: BUGSWEEP_STORE_LINK_DAYS, at most the 7 days SigV4 allows."""
    from datetime import UTC, datetime, timedelta

    import httpx

    store = seaweed.new_store(prefix="runs", link_days=2)
    store.put_bytes("nightly/calc-1/m/c0/patch.diff", "-    return a - b\n+    return a + b  # é\n".encode())
    store.put_bytes("nightly/review.html", b"<html><body>review</body></html>")
    assert httpx.get(f"{seaweed.endpoint_url}/{store.bucket}/runs/nightly/review.html").status_code == 403

    link = store.link("nightly/calc-1/m/c0/patch.diff")
    opened = httpx.get(link.url)
    assert opened.status_code == 200, opened.text
    assert opened.headers["content-type"] == "text/plain; charset=utf-8" and "a + b  # é" in opened.text
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in link.url and "X-Amz-Expires=172800" in link.url
    assert link.expires is not None
    assert abs(link.expires - (datetime.now(UTC) + timedelta(days=2))) < timedelta(minutes=1)
    assert link.until() == f"opens until {link.expires:%Y-%m-%d %H:%M} UTC"
    page = httpx.get(store.link("nightly/review.html").url)
    assert page.headers["content-type"] == "text/html; charset=utf-8" and "review" in page.text
    assert LocalStore("/tmp").link("x") is None, "a folder has no link a browser elsewhere opens"
    with pytest.raises(ValueError, match="less than or equal to 7"):
        StoreSettings(link_days=8)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("s3://Bugsweep_Runs/runs", "3-63 characters of lowercase letters"),
        ("s3://ab/runs", "3-63 characters"),
        ("s3://my..bucket/runs", "no two dots"),
        ("s3://192.168.1.10/runs", "not an IP address"),
    ],
)
def test_an_invalid_bucket_name_is_refused_for_what_it_is(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match="is not a valid S3 bucket name") as info:
        open_store(StoreSettings(url=url, endpoint_url="http://127.0.0.1:9"))
    assert why in str(info.value) and "nothing answers" not in str(info.value)


def test_s3_wrong_secret_fails_at_once_without_retries(seaweed: SeaweedServer, tmp_path: Path) -> None:
    from tests.support.seaweed import ACCESS_KEY

    good = seaweed.new_store()
    bad = open_store(
        StoreSettings(
            url=f"s3://{good.bucket}",
            endpoint_url=seaweed.endpoint_url,
            access_key_id=SecretStr(ACCESS_KEY),
            secret_access_key=SecretStr("not-the-Secret-42"),
        )
    )
    assert isinstance(bad, S3Store)
    sent = count_requests(bad)
    with pytest.raises(StorageError) as info:
        upload_run(bad, make_run_dir(tmp_path), "s/t/m")
    assert "not-the-Secret-42" not in str(info.value)
    assert "SignatureDoesNotMatch" in str(info.value) or "AccessDenied" in str(info.value)
    assert len(sent) == 1, "an access error is not worth retrying"


def test_an_s3_bucket_block_stores_runs_under_its_folder_with_its_credentials(
    seaweed: SeaweedServer, tmp_path: Path
) -> None:
    """prefect-aws's S3Bucket + AwsCredentials blocks (not saved: no Prefect server needed to read them) name the
    bucket, the folder, the endpoint and the keys; bugsweep's store uploads through a client made from them."""
    from prefect_aws import AwsCredentials, S3Bucket
    from prefect_aws.client_parameters import AwsClientParameters

    from blocks import bucket_store
    from tests.support.seaweed import ACCESS_KEY, SECRET_KEY

    bucket = seaweed.new_store(prefix="").bucket
    credentials = AwsCredentials(
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        aws_client_parameters=AwsClientParameters(endpoint_url=seaweed.endpoint_url),
    )
    store = bucket_store(S3Bucket(bucket_name=bucket, bucket_folder="team/bugsweep", credentials=credentials))
    sent = count_requests(store)

    result = upload_run(store, make_run_dir(tmp_path), "nightly/calc-1/qwen")

    assert store.location == f"s3://{bucket}/team/bugsweep"
    assert result.uris["grade.json"] == f"s3://{bucket}/team/bugsweep/nightly/calc-1/qwen/grade.json"
    assert sent[-1].endswith("grade.json"), "grade.json is written last"
    raw = seaweed.store(bucket)  # the bucket as a whole, without the block's folder
    assert "team/bugsweep/nightly/calc-1/qwen/patch.diff" in raw.list("team")
    assert SECRET_KEY not in repr(store)

    wrong = credentials.model_copy(update={"aws_secret_access_key": SecretStr("not-the-Secret-42")})
    with pytest.raises(StorageError, match=r"SignatureDoesNotMatch|AccessDenied"):
        bucket_store(S3Bucket(bucket_name=bucket, credentials=wrong)).put_bytes("x", b"x")


@pytest.fixture(scope="module")
def outage_server(tmp_path_factory: pytest.TempPathFactory):
    """A server of these tests' own, because they stop it (the shared one stays up for everyone else)."""
    from tests.support.seaweed import SeaweedServer

    server = SeaweedServer(tmp_path_factory.mktemp("seaweed-outage")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_seaweed(outage_server: SeaweedServer) -> SeaweedServer:
    """The outage server, running (a previous test may have left it stopped)."""
    if outage_server.proc is None:
        outage_server.start()
    return outage_server


def test_an_s3_fault_is_retried_by_the_store_alone_then_reported_and_local_files_stay(
    own_seaweed: SeaweedServer, tmp_path: Path
) -> None:
    """Who retries what, "an S3 call fails": the real SeaweedFS stopped mid-upload. One failing call is exactly
    `attempts` HTTP requests: botocore sends each once, even when the client's own config asks it to retry (a block's
    client parameters may), so no layer retries under the store's tries."""
    from botocore.config import Config

    run = make_run_dir(tmp_path)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    asks_botocore_to_retry = Config(retries={"max_attempts": 5, "mode": "standard"})
    store = own_seaweed.new_store(attempts=3, retry_wait_s=0.1, config=asks_botocore_to_retry)
    sent = count_requests(store)
    store.put_bytes("warm-up", b"ok")  # the client is connected and working before the outage
    sent.clear()

    own_seaweed.stop()
    with pytest.raises(StorageError) as info:
        upload_run(store, run, "sweep/calc-1/m")

    message = str(info.value)
    assert "after 3 tries" in message and info.value.retried == 2
    assert str(run) in message, "the error must say where the artifacts are kept"
    assert len(sent) == 3, "one request per try of the store: botocore retried nothing underneath"
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_s3_clients_send_each_request_once_whatever_their_settings_say(monkeypatch) -> None:
    """botocore's retries are off for every client bugsweep makes: from the settings, with AWS_MAX_ATTEMPTS set,
    and from a block's client config that asks for retries."""
    from botocore.config import Config

    from bugsweep.storage import s3_client, settings_s3_client

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "5")
    clients = [
        settings_s3_client(StoreSettings(url="s3://b/p", endpoint_url="http://127.0.0.1:1")),
        s3_client(endpoint_url="http://127.0.0.1:1", config=Config(retries={"total_max_attempts": 9})),
    ]
    for client in clients:
        assert client.meta.config.retries["total_max_attempts"] == 1
    assert StoreSettings().attempts == S3Store.attempts == 8


def test_s3_short_outage_is_ridden_out_by_retries(own_seaweed: SeaweedServer, tmp_path: Path) -> None:
    run = make_run_dir(tmp_path)
    store = own_seaweed.new_store(attempts=8, retry_wait_s=0.5)
    store.put_bytes("warm-up", b"ok")
    own_seaweed.stop()

    results: list[Any] = []
    uploader = threading.Thread(target=lambda: results.append(upload_run(store, run, "sweep/calc-1/m")))
    uploader.start()
    time.sleep(1.0)
    own_seaweed.start()  # from this thread: the server dies with the thread that started it (PDEATHSIG)
    uploader.join()

    assert results, "the upload failed although the server came back"
    (result,) = results
    assert set(result.uris) == {p.name for p in run.iterdir()}
    assert store.get_bytes("sweep/calc-1/m/patch.diff") == (run / "patch.diff").read_bytes()
