"""A local fake of the Runtime sandbox API (withruntime.com), for tests and benchmarks. NOT the real service.

Plain HTTP/1.1 on 127.0.0.1 following the wire protocol the `withruntime` SDK (0.35.0) speaks, so the real SDK
runs against it unchanged: `Runtime(api_key=fake.api_key, base_url=fake.url)`, or RUNTIME_API_URL / RUNTIME_API_KEY.
What it implements, read off the SDK's source:

- auth: `Authorization: Bearer <key>`; any other key is a 401 `invalid_api_key`.
- sandboxes: create (camelCase body, unknown fields and out-of-range sizes refused with 400), get, list by
  `label=k:v` with cursor pages, delete (deleting again answers the same), stop / extend / update, and the
  sandbox's lifetime (`timeoutSeconds`, then `onLeaseEnd`: delete, or stop).
- exec: `POST /v1/sandboxes/{id}:exec`, whole answers (each stream cut to its last 64 KiB, `*Truncated` set) or
  NDJSON streams (`start`, `stdout`/`stderr` with byte offsets across both streams, `exit`), timeouts as
  `timedOut: true, exitCode: null`; processes can be listed, signalled and followed from a cursor.
- files: content get/put (with x-content-length and x-content-sha256), stat, list, mkdir, remove, rename, chmod,
  chunked uploads, and folder archives (get, put, chunked put) that the SDK's `files.upload` uses.
- network rules: `GET/PUT /v1/sandboxes/{id}/network`; with `internet: false` commands run without a network.
- idempotency: a non-GET call repeated with the same `Idempotency-Key` is answered from the first answer
  (a streamed exec follows the same process again), so a retried write never happens twice.
- errors: `{"error": {"code", "message", "hint", "requestId", "retryable", "retryAfterMs"}}` with the status.

Each sandbox is a temporary folder; its commands run under bubblewrap (Debian `bubblewrap`) with that folder's
`workspace/` mounted at /workspace and `tmp/` at /tmp, the host's other folders read-only, HOME=/workspace.
That is what makes `/workspace/repo` a real path for the commands, as in a Runtime microVM.

Fault injection, for tests: `fail_next(...)` queues error answers (429 with Retry-After / retryAfterMs, 503, ...),
a wrong key gets 401, `delete_sandbox(id)` / `delete_when_running(marker)` delete a sandbox under a running
command, `cut_streams(n)` drops streamed execs' connections mid-output, and `requests` records every call with its
Idempotency-Key, the status it got and the start of its body.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import hashlib
import io
import json
import os
import posixpath
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

#: What a whole (not streamed) exec answer keeps of each stream: its last 64 KiB.
WHOLE_OUTPUT_LIMIT = 64 * 1024
CHUNK_BYTES = 1_048_576
CREATE_FIELDS = {
    "name",
    "labels",
    "funding",
    "region",
    "vcpu",
    "memoryMiB",
    "diskMiB",
    "cpu",
    "cpuFloorMillis",
    "timeoutSeconds",
    "pausable",
    "idlePauseSeconds",
    "autoWake",
    "user",
    "persistent",
    "maxTotalCostMicros",
    "getOrCreate",
    "onLeaseEnd",
    "maxCostMicros",
    "network",
    "image",
    "snapshot",
    "spreadFrom",
    "volumes",
    "env",
    "tailscale",
    "secrets",
}


class ApiError(Exception):
    """An error answer, in the API's shape."""

    def __init__(self, status: int, code: str, message: str, hint: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.hint, self.extra = status, code, message, hint, extra

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "code": self.code,
            "message": self.message,
            "requestId": "req_" + uuid.uuid4().hex[:12],
        }
        if self.hint:
            error["hint"] = self.hint
        error.update(self.extra)
        return {"error": error}


@dataclass
class Fault:
    """Queued error answers: the next `count` calls that match get `status` instead of being run."""

    count: int
    status: int
    code: str
    retry_after_ms: int | None = None
    retry_after: str | None = None
    """The Retry-After header, in seconds, as text."""
    match: str | None = None
    """A substring of "METHOD /path" (e.g. ":exec", "POST /v1/sandboxes"); None matches every call."""
    retryable: bool | None = None
    after: int = 0
    """Matching calls to let through before the faults start."""


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    idempotency_key: str | None
    status: int = 0
    body: bytes = b""
    """The first 64 KiB of the request body (to check what was sent, e.g. that no secret crossed)."""


@dataclass
class FakeProcess:
    id: str
    sandbox_id: str
    command: str
    started: float = field(default_factory=time.monotonic)
    events: list[dict[str, Any]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    offset: int = 0
    done: bool = False
    exit_event: dict[str, Any] | None = None
    popen: subprocess.Popen[bytes] | None = None
    deleted: bool = False

    def info(self) -> dict[str, Any]:
        exit_event = self.exit_event or {}
        return {
            "id": self.id,
            "command": self.command,
            "user": "sandbox",
            "state": "exited" if self.done else "running",
            "exitCode": exit_event.get("exitCode"),
        }

    def follow(self, cursor: int = 0) -> Iterator[dict[str, Any]]:
        """Every event from `cursor` (bytes of output) on, as they come, until the exit or an error event."""
        index = 0
        while True:
            with self.cond:
                while index >= len(self.events) and not self.done:
                    self.cond.wait(1.0)
                pending = self.events[index:]
                index = len(self.events)
                finished = self.done and index >= len(self.events)
            for event in pending:
                if event["type"] in ("stdout", "stderr") and event["offset"] < cursor:
                    continue
                yield event
            if finished:
                return


@dataclass
class FakeSandbox:
    id: str
    folder: Path
    record: dict[str, Any]
    expires_at: float | None
    processes: dict[str, FakeProcess] = field(default_factory=dict)
    internet: bool = True
    starts_at: float = 0.0

    @property
    def state(self) -> str:
        return str(self.record["state"])


class FakeRuntime:
    """The fake API server. `with FakeRuntime() as fake:` starts it on a free port and stops it at the end."""

    def __init__(
        self, api_key: str = "rt_test_key", root: str | Path | None = None, start_delay_s: float = 0.0
    ) -> None:
        """`start_delay_s` > 0: a create answers at once with state "starting" and the sandbox runs that much
        later, so the SDK's wait (GET ?waitFor=running) is exercised; commands sent meanwhile wait for it."""
        self.api_key = api_key
        self.start_delay_s = start_delay_s
        self.requests: list[RecordedRequest] = []
        self.faults: list[Fault] = []
        self.sandboxes: dict[str, FakeSandbox] = {}
        self._root_given = Path(root) if root else None
        self._root: Path | None = None
        self._lock = threading.RLock()
        self._answers: dict[str, tuple[str, int, Any]] = {}
        self._stream_answers: dict[str, FakeProcess] = {}
        self._uploads: dict[str, dict[str, Any]] = {}
        self._delete_markers: list[str] = []
        self._streams_to_cut = 0
        self._spawner = _Spawner()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() the fake first"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> FakeRuntime:
        if shutil.which("bwrap") is None:
            raise OSError(
                "the fake Runtime server runs each sandbox's commands under bubblewrap: "
                "install the Debian package `bubblewrap`"
            )
        self._root = self._root_given or Path(tempfile.mkdtemp(prefix="fake-runtime-"))
        self._root.mkdir(parents=True, exist_ok=True)
        self._httpd = _QuietServer(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-runtime", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops serving, kills every command still running and removes every sandbox folder."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._lock:
            for sbx in list(self.sandboxes.values()):
                self._kill_all(sbx)
        self._spawner.close()
        if self._root is not None and self._root_given is None:
            shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> FakeRuntime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- fault injection and inspection ----------------------------------------------------------------------
    def fail_next(
        self,
        count: int = 1,
        *,
        status: int = 503,
        code: str | None = None,
        retry_after_ms: int | None = 1,
        retry_after: str | None = None,
        match: str | None = None,
        retryable: bool | None = None,
        after: int = 0,
    ) -> None:
        """Answer the next `count` matching calls with `status` (nothing is run for them).

        The default code follows the status: 429 `rate_limited` (which the SDK retries until its deadline, as
        "nothing ran"), 503 `host_unavailable` (retried up to max_retries). `retry_after_ms=1` keeps the SDK's
        waits short in tests; pass None to make it use its own backoff, or `retry_after` for the header form.
        `after` lets that many matching calls through first.
        """
        default = {429: "rate_limited", 401: "invalid_api_key", 403: "permission_denied"}.get(status)
        with self._lock:
            self.faults.append(
                Fault(
                    count,
                    status,
                    code or default or ("host_unavailable" if status >= 500 else "failed"),
                    retry_after_ms,
                    retry_after,
                    match,
                    retryable,
                    after,
                )
            )

    def delete_sandbox(self, sandbox_id: str) -> None:
        """Delete a sandbox as if someone else did (or its host died): its running commands end, its files go."""
        with self._lock:
            sbx = self.sandboxes.get(sandbox_id)
            if sbx is None or sbx.state == "deleted":
                return
            sbx.record.update(state="deleted", deletedAt=_now())
            self._kill_all(sbx, deleted=True)
        shutil.rmtree(sbx.folder, ignore_errors=True)

    def delete_when_running(self, marker: str) -> None:
        """The next command whose text contains `marker` has its sandbox deleted while it runs."""
        with self._lock:
            self._delete_markers.append(marker)

    def cut_streams(self, count: int = 1) -> None:
        """The next `count` streamed execs lose their connection after their first output event, as a dropped
        network would; the command runs on, and its output can be followed from the cursor (the SDK does)."""
        with self._lock:
            self._streams_to_cut += count

    def keys(self, match: str) -> list[str | None]:
        """The Idempotency-Key of every recorded call whose "METHOD /path" contains `match`, in order."""
        return [r.idempotency_key for r in self.requests if match in f"{r.method} {r.path}"]

    def statuses(self, match: str) -> list[int]:
        return [r.status for r in self.requests if match in f"{r.method} {r.path}"]

    def live_sandboxes(self) -> list[FakeSandbox]:
        with self._lock:
            for sbx in list(self.sandboxes.values()):
                self._expire(sbx)
            return [s for s in self.sandboxes.values() if s.state != "deleted"]

    def running_processes(self, sandbox_id: str) -> list[FakeProcess]:
        with self._lock:
            sbx = self.sandboxes.get(sandbox_id)
            return [p for p in sbx.processes.values() if not p.done] if sbx else []

    # -- request handling ----------------------------------------------------------------------------------------
    def _pop_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.count > 0 and (fault.match is None or fault.match in f"{method} {path}"):
                    if fault.after > 0:
                        fault.after -= 1
                        continue
                    fault.count -= 1
                    return fault
        return None

    def _sandbox(self, sandbox_id: str, *, running: bool = False, wait_s: float = 0.0) -> FakeSandbox:
        """The sandbox, or the API's 404; with `running`, a 409 unless it runs (one still starting is waited
        for, as the API does); `wait_s` waits that long for a starting sandbox to run (GET ?waitFor=running)."""
        sbx = self.sandboxes.get(sandbox_id)
        if sbx is not None and sbx.state == "starting":
            until = sbx.starts_at if running else min(sbx.starts_at, time.time() + wait_s)
            time.sleep(max(0.0, until - time.time()))
        with self._lock:
            if sbx is not None and sbx.state == "starting" and time.time() >= sbx.starts_at:
                sbx.record["state"] = "running"
            if sbx is not None:
                self._expire(sbx)
            if sbx is None or sbx.state == "deleted":
                raise ApiError(
                    404,
                    "sandbox_not_found",
                    f"Sandbox {sandbox_id} was not found.",
                    "List your sandboxes with runtime.sandboxes.list().",
                )
            if running and sbx.state != "running":
                raise ApiError(
                    409,
                    "sandbox_not_running",
                    f"Sandbox {sandbox_id} is {sbx.state}, not running.",
                    "Wake or restart it first.",
                )
            return sbx

    def _expire(self, sbx: FakeSandbox) -> None:
        if sbx.expires_at is None or sbx.state != "running" or time.time() < sbx.expires_at:
            return
        if sbx.record.get("onLeaseEnd") == "delete":
            sbx.record.update(state="deleted", deletedAt=_now(), stopReason="timeout")
            self._kill_all(sbx, deleted=True)
            shutil.rmtree(sbx.folder, ignore_errors=True)
        else:
            sbx.record.update(state="stopped", stopReason="timeout")
            self._kill_all(sbx)

    def _kill_all(self, sbx: FakeSandbox, deleted: bool = False) -> None:
        for proc in sbx.processes.values():
            if proc.done:
                continue
            proc.deleted = proc.deleted or deleted
            _kill(proc)

    # sandboxes
    def create_sandbox(self, body: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(body) - CREATE_FIELDS)
        if unknown:
            raise ApiError(400, "invalid_request", f"{unknown[0]} is not a known field.")
        timeout = body.get("timeoutSeconds")
        if timeout is not None and not (isinstance(timeout, int) and 60 <= timeout <= 86400):
            raise ApiError(
                400,
                "invalid_request",
                "timeoutSeconds must be 60 to 86400.",
                details={"field": "timeoutSeconds"},
            )
        vcpu = body.get("vcpu", 2)
        memory = body.get("memoryMiB", 4096)
        if not (isinstance(vcpu, int) and 1 <= vcpu <= 16) or not (
            isinstance(memory, int) and 256 <= memory <= 65536
        ):
            raise ApiError(400, "invalid_request", "vcpu must be 1 to 16 and memoryMiB 256 to 65536.")
        labels = body.get("labels") or {}
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise ApiError(400, "invalid_request", "labels must map names to strings.")
        network = body.get("network") or {}
        sandbox_id = "sbx_" + uuid.uuid4().hex[:16]
        assert self._root is not None
        folder = self._root / sandbox_id
        (folder / "workspace").mkdir(parents=True)
        (folder / "tmp").mkdir()
        (
            folder / "opt"
        ).mkdir()  # a microVM's /opt is its own and writable (the task environment lives there)
        record = {
            "id": sandbox_id,
            "name": body.get("name"),
            "state": "starting" if self.start_delay_s > 0 else "running",
            "labels": labels,
            "vcpu": vcpu,
            "memoryMiB": memory,
            "diskMiB": body.get("diskMiB", 10240),
            "timeoutSeconds": timeout,
            "image": body.get("image") or "runtime/default",
            "onLeaseEnd": body.get("onLeaseEnd"),
            "idlePauseSeconds": body.get("idlePauseSeconds", 300),
            "maxCostMicros": body.get("maxCostMicros"),
            "env": sorted((body.get("env") or {}).keys()),
            "network": {"internet": bool(network.get("internet", True))},
            "region": "local",
            "createdAt": _now(),
        }
        sbx = FakeSandbox(
            sandbox_id,
            folder,
            record,
            time.time() + timeout if timeout else None,
            internet=bool(network.get("internet", True)),
            starts_at=time.time() + self.start_delay_s,
        )
        sbx.record["env_values"] = dict(body.get("env") or {})
        with self._lock:
            self.sandboxes[sandbox_id] = sbx
        return self.public(sbx)

    @staticmethod
    def public(sbx: FakeSandbox) -> dict[str, Any]:
        return {k: v for k, v in sbx.record.items() if k != "env_values"}

    def list_sandboxes(self, query: dict[str, list[str]]) -> dict[str, Any]:
        wanted = [item.split(":", 1) for item in query.get("label", [])]
        include_stopped = query.get("includeStopped", ["false"])[0] == "true"
        limit = int(query.get("limit", ["50"])[0])
        start = int(query.get("cursor", ["0"])[0] or 0)
        matches = []
        for sbx in self.live_sandboxes():
            labels = sbx.record["labels"]
            if any(len(pair) != 2 or labels.get(pair[0]) != pair[1] for pair in wanted):
                continue
            if sbx.state == "stopped" and not include_stopped:
                continue
            matches.append(self.public(sbx))
        page = matches[start : start + limit]
        more = start + limit < len(matches)
        return {"data": page, "nextCursor": str(start + limit) if more else None}

    # commands
    def start_process(self, sbx: FakeSandbox, body: dict[str, Any], default_timeout_ms: int) -> FakeProcess:
        command = body.get("command")
        argv = body.get("argv") or []
        if command is None and not argv:
            raise ApiError(400, "invalid_request", "Give command or argv.")
        inner = ["bash", "-c", command] if command is not None else [str(a) for a in argv]
        cwd = body.get("cwd") or "/workspace"
        if not self.host_path(sbx, cwd, write=False).is_dir():
            raise ApiError(400, "cwd_not_found", f"The working directory {cwd} does not exist.")
        timeout_ms = int(body.get("timeoutMs") or default_timeout_ms)
        env = {
            "PATH": f"{Path(sys.executable).parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/workspace",
            "USER": "sandbox",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            **sbx.record.get("env_values", {}),
            **{str(k): str(v) for k, v in (body.get("env") or {}).items()},
        }
        stdin: bytes | None = None
        if isinstance(body.get("stdin"), str):
            stdin = body["stdin"].encode()
        elif body.get("stdinBase64"):
            stdin = base64.b64decode(body["stdinBase64"])
        proc = FakeProcess("proc_" + uuid.uuid4().hex[:12], sbx.id, command or " ".join(inner))
        proc.events.append({"type": "start", "processId": proc.id})
        popen = self._spawner.call(
            partial(
                subprocess.Popen,
                _bwrap(sbx, cwd) + inner,
                env=env,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        )
        proc.popen = popen
        with self._lock:
            sbx.processes[proc.id] = proc
            marker = next((m for m in self._delete_markers if m in proc.command), None)
            if marker is not None:
                self._delete_markers.remove(marker)
        readers = [
            threading.Thread(target=_pump, args=(proc, popen.stdout, "stdout"), daemon=True),
            threading.Thread(target=_pump, args=(proc, popen.stderr, "stderr"), daemon=True),
        ]
        for reader in readers:
            reader.start()
        if stdin is not None:
            threading.Thread(target=_feed, args=(popen, stdin), daemon=True).start()
        threading.Thread(target=_reap, args=(proc, readers, timeout_ms), daemon=True).start()
        if marker is not None:
            threading.Thread(target=self._delete_soon, args=(sbx.id,), daemon=True).start()
        return proc

    def _delete_soon(self, sandbox_id: str) -> None:
        time.sleep(0.2)
        self.delete_sandbox(sandbox_id)

    # files
    def host_path(self, sbx: FakeSandbox, path: str, *, write: bool) -> Path:
        """Where a sandbox path lives on this machine: /workspace and /tmp in the sandbox's folder, the rest
        read-only from the host (as the sandbox user sees a read-only system)."""
        if not path.startswith("/"):
            raise ApiError(400, "invalid_path", f"{path} is not an absolute path.")
        clean = posixpath.normpath(path)
        for mount in ("/workspace", "/tmp"):
            if clean == mount or clean.startswith(mount + "/"):
                return sbx.folder / mount.lstrip("/") / clean[len(mount) + 1 :]
        if write:
            raise ApiError(
                403,
                "permission_denied",
                f"The sandbox user cannot write {path}.",
                "Write under /workspace or /tmp.",
            )
        return Path(clean)


class _Spawner:
    """Starts every command from one long-lived thread. bwrap's --die-with-parent (PR_SET_PDEATHSIG) fires when
    the *thread* that started it ends, so a command started from a request's thread would die with that request
    (a dropped stream), while in Runtime it runs on and can be followed."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="fake-runtime-spawner", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, done = item
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

    def call(self, fn: Callable[[], Any]) -> Any:
        done: Future[Any] = Future()
        self._queue.put((fn, done))
        return done.result()

    def close(self) -> None:
        self._queue.put(None)


class _QuietServer(ThreadingHTTPServer):
    """A client closing a kept-alive connection is normal, not an error worth a traceback."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _bwrap(sbx: FakeSandbox, cwd: str) -> list[str]:
    """bubblewrap arguments that show the sandbox's folder at /workspace and /tmp, the host read-only."""
    args = [
        "bwrap",
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--hostname",
        sbx.id.replace("_", "-"),
    ]
    if not sbx.internet:
        args.append("--unshare-net")
    for entry in sorted(os.listdir("/")):
        if entry in ("proc", "dev", "tmp", "workspace", "opt"):
            continue
        full = "/" + entry
        if os.path.islink(full):
            args += ["--symlink", os.readlink(full), full]
        elif os.path.isdir(full):
            args += ["--ro-bind", full, full]
    args += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--bind",
        str(sbx.folder / "workspace"),
        "/workspace",
        "--bind",
        str(sbx.folder / "tmp"),
        "/tmp",
        "--bind",
        str(sbx.folder / "opt"),
        "/opt",
        "--chdir",
        cwd,
        "--",
    ]
    return args


def _pump(proc: FakeProcess, pipe: Any, stream: str) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    fd = pipe.fileno()
    while True:
        data = os.read(fd, 65536)
        text = decoder.decode(data, final=not data)
        if text:
            with proc.cond:
                proc.events.append({"type": stream, "offset": proc.offset, "data": text})
                proc.offset += len(text.encode())
                proc.cond.notify_all()
        if not data:
            pipe.close()
            return


def _feed(popen: subprocess.Popen[bytes], data: bytes) -> None:
    assert popen.stdin is not None
    with contextlib.suppress(OSError):
        popen.stdin.write(data)
    with contextlib.suppress(OSError):
        popen.stdin.close()


def _kill(proc: FakeProcess) -> None:
    if proc.popen is not None and proc.popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGKILL)


def _reap(proc: FakeProcess, readers: list[threading.Thread], timeout_ms: int) -> None:
    assert proc.popen is not None
    timed_out = False
    try:
        proc.popen.wait(timeout=timeout_ms / 1000)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc)
        proc.popen.wait()
    for reader in readers:
        reader.join()
    code = proc.popen.returncode
    with proc.cond:
        if proc.deleted:
            proc.events.append(
                {
                    "type": "error",
                    "error": {
                        "code": "sandbox_deleted",
                        "status": 404,
                        "message": f"Sandbox {proc.sandbox_id} was deleted.",
                        "hint": "Its commands ended with it; create a new sandbox.",
                    },
                }
            )
        else:
            exit_code = None if timed_out else (128 - code if code < 0 else code)
            proc.exit_event = {
                "type": "exit",
                "exitCode": exit_code,
                "timedOut": timed_out,
                "state": "exited",
                "durationMs": int((time.monotonic() - proc.started) * 1000),
            }
            proc.events.append(proc.exit_event)
        proc.done = True
        proc.cond.notify_all()


def _glob_match(path: str, pattern: str) -> bool:
    """Glob with '/'-aware wildcards: `*` and `?` stay within one name, `**/` crosses folders."""
    parts = re.split(r"(\*\*/|\*\*|\*|\?)", pattern)
    table = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    regex = "".join(table.get(part, re.escape(part)) for part in parts)
    return re.fullmatch(regex, path) is not None


def _tail_bytes(text: str, limit: int) -> tuple[str, bool]:
    raw = text.encode()
    if len(raw) <= limit:
        return text, False
    return raw[-limit:].decode("utf-8", "ignore"), True


def _safe_extract(data: bytes, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
        archive.extractall(target, filter="data")


def _handler_for(fake: FakeRuntime) -> type[BaseHTTPRequestHandler]:
    routes: list[tuple[str, re.Pattern[str], Callable[..., None]]] = []

    def route(method: str, pattern: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
        def add(fn: Callable[..., None]) -> Callable[..., None]:
            routes.append((method, re.compile("^" + pattern + "$"), fn))
            return fn

        return add

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # otherwise each kept-alive answer stalls about 44 ms

        def log_message(self, *args: Any) -> None:
            pass

        # -- plumbing --------------------------------------------------------------------------------------
        def _dispatch(self, method: str) -> None:
            split = urlsplit(self.path)
            path, query = split.path, parse_qs(split.query, keep_blank_values=True)
            length = int(self.headers.get("Content-Length") or 0)
            self.raw_body = self.rfile.read(length) if length else b""
            self.fingerprint = ""
            self.query = query
            self.record = RecordedRequest(
                method, path, query, self.headers.get("Idempotency-Key"), body=self.raw_body[:65536]
            )
            with fake._lock:
                fake.requests.append(self.record)
            try:
                if self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    raise ApiError(
                        401,
                        "invalid_api_key",
                        "The API key is not valid.",
                        "Make a key at https://withruntime.com/account/keys and set RUNTIME_API_KEY.",
                    )
                fault = fake._pop_fault(method, path)
                if fault is not None:
                    extra: dict[str, Any] = {}
                    if fault.retry_after_ms is not None:
                        extra["retryAfterMs"] = fault.retry_after_ms
                    if fault.retryable is not None:
                        extra["retryable"] = fault.retryable
                    headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                    error = ApiError(
                        fault.status, fault.code, f"Injected {fault.status} ({fault.code}).", **extra
                    )
                    self._json(fault.status, error.body(), headers)
                    return
                for verb, pattern, fn in routes:
                    found = pattern.match(path)
                    if verb == method and found:
                        args = [unquote(g) for g in found.groups()]
                        key = self.record.idempotency_key
                        if method != "GET" and key and self._replay(key, path):
                            return
                        fn(self, *args)
                        return
                raise ApiError(404, "not_found", f"No route for {method} {path}.")
            except ApiError as error:
                self._json(error.status, error.body())
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def _replay(self, key: str, path: str) -> bool:
            fingerprint = hashlib.sha256(path.encode() + b"\0" + self.raw_body).hexdigest()
            with fake._lock:
                stored = fake._answers.get(key)
                proc = fake._stream_answers.get(key)
            if stored is not None:
                if stored[0] != fingerprint:
                    raise ApiError(
                        422, "idempotency_key_reused", "This Idempotency-Key was used for a different call."
                    )
                answer = stored[2]
                if isinstance(answer, dict) and path.endswith(("/v1/sandboxes", ":exec")):
                    answer = {**answer, "replayed": True}
                self._json(stored[1], answer, remember=False)
                return True
            if proc is not None:
                self._stream(proc, 0, remember=False)
                return True
            self.fingerprint = fingerprint
            return False

        def _json(
            self, status: int, body: Any, headers: dict[str, str] | None = None, remember: bool = True
        ) -> None:
            data = json.dumps(body).encode()
            self.record.status = status
            key = self.record.idempotency_key
            if remember and key and 200 <= status < 300 and self.command != "GET":
                with fake._lock:
                    fake._answers[key] = (getattr(self, "fingerprint", ""), status, body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _bytes(self, data: bytes, headers: dict[str, str] | None = None) -> None:
            self.record.status = 200
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, proc: FakeProcess, cursor: int, remember: bool = True) -> None:
            key = self.record.idempotency_key
            if remember and key:
                with fake._lock:
                    fake._stream_answers[key] = proc
            self.record.status = 200
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            with fake._lock:
                cut = remember and fake._streams_to_cut > 0
                fake._streams_to_cut -= int(cut)
            for event in proc.follow(cursor):
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
                if cut and event["type"] in ("stdout", "stderr"):
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def body(self) -> dict[str, Any]:
            try:
                value = json.loads(self.raw_body or b"{}")
            except ValueError as exc:
                raise ApiError(400, "invalid_json", "The body is not JSON.") from exc
            if not isinstance(value, dict):
                raise ApiError(400, "invalid_json", "The body must be a JSON object.")
            return value

        def arg(self, name: str, default: str | None = None) -> str:
            values = self.query.get(name)
            if not values:
                if default is None:
                    raise ApiError(400, "invalid_request", f"{name} is required.")
                return default
            return values[0]

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def do_PUT(self) -> None:
            self._dispatch("PUT")

        def do_DELETE(self) -> None:
            self._dispatch("DELETE")

    S = r"/v1/sandboxes/([^/:]+)"

    # -- sandboxes ------------------------------------------------------------------------------------------
    @route("GET", r"/v1/me")
    def me(h: Handler) -> None:
        h._json(200, {"organization": {"id": "org_fake"}, "credential": {"kind": "api_key"}})

    @route("POST", r"/v1/sandboxes")
    def create(h: Handler) -> None:
        h._json(200, fake.create_sandbox(h.body()))

    @route("GET", r"/v1/sandboxes")
    def list_(h: Handler) -> None:
        h._json(200, fake.list_sandboxes(h.query))

    @route("GET", S)
    def get(h: Handler, sid: str) -> None:
        wait = float(h.arg("timeoutSeconds", "60")) if h.arg("waitFor", "") == "running" else 0.0
        h._json(200, fake.public(fake._sandbox(sid, wait_s=wait)))

    @route("DELETE", S)
    def delete(h: Handler, sid: str) -> None:
        with fake._lock:
            sbx = fake.sandboxes.get(sid)
        if sbx is None:
            raise ApiError(404, "sandbox_not_found", f"Sandbox {sid} was not found.")
        fake.delete_sandbox(sid)
        h._json(200, {"id": sid, "status": "deleted", "deletedAt": sbx.record.get("deletedAt")})

    @route("POST", S + r":(stop|pause|wake|extend|update)")
    def lifecycle(h: Handler, sid: str, verb: str) -> None:
        sbx = fake._sandbox(sid)
        body = h.body()
        with fake._lock:
            if verb in ("stop", "pause"):
                fake._kill_all(sbx)
                sbx.record["state"] = "stopped" if verb == "stop" else "paused"
            elif verb == "wake":
                sbx.record["state"] = "running"
            elif verb == "extend" and sbx.expires_at is not None:
                sbx.expires_at = max(sbx.expires_at, time.time()) + int(body.get("seconds", 0))
            elif verb == "update" and isinstance(body.get("labels"), dict):
                sbx.record["labels"] = body["labels"]
        h._json(200, fake.public(sbx))

    @route("GET", S + r"/network")
    def network_get(h: Handler, sid: str) -> None:
        h._json(200, {"internet": fake._sandbox(sid).internet})

    @route("PUT", S + r"/network")
    def network_set(h: Handler, sid: str) -> None:
        sbx = fake._sandbox(sid, running=True)
        body = h.body()
        sbx.internet = bool(body.get("internet"))
        sbx.record["network"] = {"internet": sbx.internet}
        h._json(200, {"internet": sbx.internet, **{k: v for k, v in body.items() if k != "internet"}})

    # -- commands -------------------------------------------------------------------------------------------
    @route("POST", S + r":exec")
    def exec_(h: Handler, sid: str) -> None:
        sbx = fake._sandbox(sid, running=True)
        body = h.body()
        proc = fake.start_process(sbx, body, 60_000)
        if body.get("stream"):
            h._stream(proc, 0)
            return
        for _ in proc.follow(0):
            pass
        if proc.deleted:
            raise ApiError(404, "sandbox_not_found", f"Sandbox {sid} was deleted while the command ran.")
        out = {"stdout": "", "stderr": ""}
        for event in proc.events:
            if event["type"] in out:
                out[event["type"]] += event["data"]
        stdout, stdout_cut = _tail_bytes(out["stdout"], WHOLE_OUTPUT_LIMIT)
        stderr, stderr_cut = _tail_bytes(out["stderr"], WHOLE_OUTPUT_LIMIT)
        exit_event = proc.exit_event or {}
        h._json(
            200,
            {
                "exitCode": exit_event.get("exitCode"),
                "stdout": stdout,
                "stderr": stderr,
                "timedOut": exit_event.get("timedOut", False),
                "stdoutTruncated": stdout_cut,
                "stderrTruncated": stderr_cut,
                "durationMs": exit_event.get("durationMs"),
                "processId": proc.id,
            },
        )

    @route("POST", S + r"/processes")
    def spawn(h: Handler, sid: str) -> None:
        proc = fake.start_process(fake._sandbox(sid, running=True), h.body(), 86_400_000)
        h._json(200, proc.info())

    @route("GET", S + r"/processes")
    def processes(h: Handler, sid: str) -> None:
        h._json(200, {"data": [p.info() for p in fake._sandbox(sid).processes.values()]})

    @route("GET", S + r"/processes/([^/:]+)")
    def process(h: Handler, sid: str, pid: str) -> None:
        proc = fake._sandbox(sid).processes.get(pid)
        if proc is None:
            raise ApiError(404, "process_not_found", f"Process {pid} was not found.")
        h._json(200, proc.info())

    @route("GET", S + r"/processes/([^/:]+)/output")
    def output(h: Handler, sid: str, pid: str) -> None:
        proc = fake._sandbox(sid).processes.get(pid)
        if proc is None:
            raise ApiError(404, "process_not_found", f"Process {pid} was not found.")
        h._stream(proc, int(h.arg("cursor", "0")), remember=False)

    @route("POST", S + r"/processes/([^/:]+):signal")
    def signal_(h: Handler, sid: str, pid: str) -> None:
        proc = fake._sandbox(sid).processes.get(pid)
        if proc is None:
            raise ApiError(404, "process_not_found", f"Process {pid} was not found.")
        _kill(proc)
        h._json(200, proc.info())

    # -- files ----------------------------------------------------------------------------------------------
    @route("GET", S + r"/files/content")
    def read(h: Handler, sid: str) -> None:
        target = fake.host_path(fake._sandbox(sid, running=True), h.arg("path"), write=False)
        if target.is_dir():
            raise ApiError(400, "is_a_directory", f"{h.arg('path')} is a directory.")
        try:
            data = target.read_bytes()
        except FileNotFoundError as exc:
            raise ApiError(404, "file_not_found", f"{h.arg('path')} does not exist.") from exc
        except PermissionError as exc:
            raise ApiError(
                403, "permission_denied", f"The sandbox user cannot read {h.arg('path')}."
            ) from exc
        headers = {"x-content-length": str(len(data))}
        if len(data) <= 8 * CHUNK_BYTES:
            headers["x-content-sha256"] = hashlib.sha256(data).hexdigest()
        h._bytes(data, headers)

    @route("PUT", S + r"/files/content")
    def write(h: Handler, sid: str) -> None:
        path = h.arg("path")
        if len(h.raw_body) > CHUNK_BYTES:
            raise ApiError(413, "too_large", "Write more than 1 MiB through /uploads.")
        target = fake.host_path(fake._sandbox(sid, running=True), path, write=True)
        _atomic_write(target, h.raw_body, int(h.arg("mode", "644"), 8))
        h._json(200, {"path": path, "size": len(h.raw_body)})

    @route("GET", S + r"/files/stat")
    def stat(h: Handler, sid: str) -> None:
        target = fake.host_path(fake._sandbox(sid, running=True), h.arg("path"), write=False)
        if not target.exists() and not target.is_symlink():
            h._json(200, {"path": h.arg("path"), "exists": False})
            return
        info = target.lstat()
        kind = "symlink" if target.is_symlink() else "directory" if target.is_dir() else "file"
        h._json(
            200,
            {
                "path": h.arg("path"),
                "exists": True,
                "type": kind,
                "size": info.st_size,
                "mode": format(info.st_mode & 0o777, "03o"),
                "mtime": info.st_mtime,
            },
        )

    @route("GET", S + r"/files/list")
    def list_files(h: Handler, sid: str) -> None:
        root_path = h.arg("path", "/workspace")
        root = fake.host_path(fake._sandbox(sid, running=True), root_path, write=False)
        if not root.is_dir():
            raise ApiError(404, "file_not_found", f"{root_path} is not a directory.")
        depth = int(h.arg("depth", "1"))
        pattern = h.query.get("glob", [None])[0]
        hidden = h.arg("hidden", "false") == "true"
        limit = int(h.arg("limit", "1000"))
        found: list[dict[str, Any]] = []
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(root)
            level = 0 if str(rel_dir) == "." else len(rel_dir.parts)
            if not hidden:
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                filenames = [f for f in filenames if not f.startswith(".")]
            if level + 1 >= depth and not pattern:
                dirnames_now, dirnames[:] = list(dirnames), []
            else:
                dirnames_now = list(dirnames)
            for name, kind in [(d, "directory") for d in dirnames_now] + [(f, "file") for f in filenames]:
                rel = str(rel_dir / name) if level else name
                if pattern and not _glob_match(rel, pattern):
                    continue
                found.append({"path": posixpath.join(root_path, rel), "name": name, "type": kind})
        h._json(200, {"data": sorted(found, key=lambda e: e["path"])[:limit]})

    @route("POST", S + r"/files:(mkdir|remove|rename|chmod)")
    def file_op(h: Handler, sid: str, verb: str) -> None:
        sbx = fake._sandbox(sid, running=True)
        body = h.body()
        if verb == "mkdir":
            fake.host_path(sbx, body["path"], write=True).mkdir(
                parents=bool(body.get("parents", True)), exist_ok=True
            )
            h._json(200, {"path": body["path"]})
        elif verb == "remove":
            target = fake.host_path(sbx, body["path"], write=True)
            removed = target.exists() or target.is_symlink()
            if target.is_dir() and not target.is_symlink():
                if body.get("recursive"):
                    shutil.rmtree(target)
                else:
                    target.rmdir()
            elif removed:
                target.unlink()
            h._json(200, {"removed": removed})
        elif verb == "rename":
            source, dest = (
                fake.host_path(sbx, body["from"], write=True),
                fake.host_path(sbx, body["to"], write=True),
            )
            if dest.exists() and not body.get("overwrite"):
                raise ApiError(409, "file_exists", f"{body['to']} exists.")
            dest.parent.mkdir(parents=True, exist_ok=True)
            source.replace(dest)
            h._json(200, {"from": body["from"], "to": body["to"]})
        else:
            fake.host_path(sbx, body["path"], write=True).chmod(int(body["mode"], 8))
            h._json(200, {"path": body["path"], "mode": body["mode"]})

    @route("POST", S + r"/uploads")
    def upload_begin(h: Handler, sid: str) -> None:
        sbx = fake._sandbox(sid, running=True)
        body = h.body()
        if not (body["path"] == "/workspace" or body["path"].startswith("/workspace/")):
            raise ApiError(403, "permission_denied", "Writes over 1 MiB go under /workspace only.")
        upload = "up_" + uuid.uuid4().hex[:12]
        with fake._lock:
            fake._uploads[upload] = {
                "sandbox": sbx.id,
                "kind": "file",
                "buffer": bytearray(body["size"]),
                **body,
            }
        h._json(200, {"uploadId": upload, "chunkBytes": CHUNK_BYTES, "mode": body.get("mode")})

    @route("POST", S + r"/files/archive/uploads")
    def archive_begin(h: Handler, sid: str) -> None:
        sbx = fake._sandbox(sid, running=True)
        body = h.body()
        upload = "up_" + uuid.uuid4().hex[:12]
        with fake._lock:
            fake._uploads[upload] = {"sandbox": sbx.id, "kind": "archive", "buffer": bytearray(), **body}
        h._json(200, {"uploadId": upload, "chunkBytes": CHUNK_BYTES})

    def _upload(sid: str, upload: str) -> dict[str, Any]:
        fake._sandbox(sid, running=True)
        with fake._lock:
            state = fake._uploads.get(upload)
        if state is None or state["sandbox"] != sid:
            raise ApiError(404, "upload_not_found", f"Upload {upload} was not found.")
        return state

    @route("PUT", S + r"(?:/files/archive)?/uploads/([^/:]+)")
    def upload_chunk(h: Handler, sid: str, upload: str) -> None:
        state = _upload(sid, upload)
        offset = int(h.arg("offset"))
        buffer: bytearray = state["buffer"]
        if len(buffer) < offset + len(h.raw_body):
            buffer.extend(b"\0" * (offset + len(h.raw_body) - len(buffer)))
        buffer[offset : offset + len(h.raw_body)] = h.raw_body
        h._json(200, {"offset": offset + len(h.raw_body)})

    @route("POST", S + r"(?:/files/archive)?/uploads/([^/:]+):(commit|abort)")
    def upload_end(h: Handler, sid: str, upload: str, verb: str) -> None:
        state = _upload(sid, upload)
        with fake._lock:
            fake._uploads.pop(upload, None)
        if verb == "abort":
            h._json(200, {"aborted": True})
            return
        sbx = fake._sandbox(sid, running=True)
        data = bytes(state["buffer"])
        if state["kind"] == "archive":
            _safe_extract(data, fake.host_path(sbx, state["path"], write=True))
            h._json(200, {"path": state["path"]})
            return
        if hashlib.sha256(data).hexdigest() != state.get("sha256"):
            raise ApiError(422, "checksum_mismatch", "The chunks do not add up to the SHA-256 given.")
        _atomic_write(
            fake.host_path(sbx, state["path"], write=True), data, int(state.get("mode") or "644", 8)
        )
        h._json(200, {"path": state["path"], "size": len(data)})

    @route("PUT", S + r"/files/archive")
    def unarchive(h: Handler, sid: str) -> None:
        sbx = fake._sandbox(sid, running=True)
        path = h.arg("path")
        try:
            _safe_extract(h.raw_body, fake.host_path(sbx, path, write=True))
        except tarfile.TarError as exc:
            raise ApiError(400, "invalid_archive", f"Not a tar archive: {exc}") from exc
        h._json(200, {"path": path})

    @route("GET", S + r"/files/archive")
    def archive(h: Handler, sid: str) -> None:
        sbx = fake._sandbox(sid, running=True)
        root = fake.host_path(sbx, h.arg("path"), write=False)
        if not root.is_dir():
            raise ApiError(404, "file_not_found", f"{h.arg('path')} is not a directory.")
        excluded = set(h.query.get("exclude", []))
        buffer = io.BytesIO()
        mode = "w:gz" if h.arg("gzip", "true") == "true" else "w"
        with tarfile.open(fileobj=buffer, mode=mode) as tar:  # type: ignore[call-overload]
            tar.add(root, arcname=".", filter=lambda info: None if info.name[2:] in excluded else info)
        data = buffer.getvalue()
        h._bytes(data, {"x-content-length": str(len(data))})

    return Handler


def _atomic_write(target: Path, data: bytes, mode: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial-{uuid.uuid4().hex[:6]}")
    partial.write_bytes(data)
    partial.chmod(mode)
    partial.replace(target)
