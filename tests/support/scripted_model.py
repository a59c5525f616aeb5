"""A scripted OpenAI-compatible chat server: real HTTP on 127.0.0.1, replaying a list of replies in order.

This is NOT a model. It makes agent-loop tests deterministic: each POST /v1/chat/completions takes the next
scripted step. A step is one of
- a reply: {"content": str | None, "tool_calls": [{"name": str, "arguments": dict | str, "id": str?}],
            "reasoning_content": str?, "usage": {...}?}
- an HTTP error: {"status": 429, "headers": {"Retry-After": "0"}, "body": {...}?}
- a stall: {"sleep": seconds} followed by the rest of the step (for timeout tests)
- a drop: {"drop": True} closes the connection without answering
- a callable taking the request body (dict) and returning one of the above (to react to what the agent sent).
When the script runs out, the server answers with a `finish` tool call, so a loop never hangs on a short script.
Every request body is recorded in `server.requests`. `latency_s` delays every answer (a model's time to think);
`in_flight` and `most_in_flight` count the chat requests being answered at once, and `spans` records each one's
(start, end, first user message) on this process's monotonic clock, so a test can check an endpoint's limit (a
request cut off before its body came whole is neither answered, counted nor recorded). The
server can be stopped and started again on the same port (`stop()`, `start()`): a model server restarting.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Step = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    """A scripted reply with one tool call: tool_call("run", command="pytest -q")."""
    return {"content": None, "tool_calls": [{"name": name, "arguments": arguments}]}


def text_reply(content: str) -> dict[str, Any]:
    return {"content": content, "tool_calls": []}


class ScriptedModelServer:
    def __init__(
        self, steps: Iterable[Step] = (), model: str = "scripted-model", served: list[str] | None = None,
        latency_s: float = 0.0, port: int = 0,
    ) -> None:  # fmt: skip
        self.steps: list[Step] = list(steps)
        self.model = model
        self.latency_s = latency_s
        self.port = port
        self.in_flight = 0
        self.stops, self.stopped_at = 0, 0.0
        self.most_in_flight = 0
        self.spans: list[tuple[float, float, str]] = []
        #: What GET /models lists: by default nothing (a stand-in that answers for any model name); a list makes
        #: it a server of those models only (for a wrong-model-name check).
        self.served = served
        self.requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> ScriptedModelServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # otherwise each keep-alive reply stalls ~44 ms

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server._connections.add(self.connection)

            def finish(self) -> None:
                with server._lock:
                    server._connections.discard(self.connection)
                super().finish()

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    listed = [{"id": name, "object": "model"} for name in server.served or []]
                    self._send(200, {"object": "list", "data": listed})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    body: dict[str, Any] = json.loads(self.rfile.read(length) or b"{}")
                except (OSError, ValueError):
                    body = {}
                if not body:  # cut off before it was whole (the server stopped as it came in): never answered
                    self.close_connection = True
                    return
                started = time.monotonic()
                with server._lock:
                    server.in_flight += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                    stops = server.stops
                try:
                    if server.latency_s:
                        time.sleep(server.latency_s)
                    self._answer(body)
                finally:
                    with server._lock:
                        # a request a stop cut off ended there (stop() already took it out of in_flight)
                        cut = server.stops != stops
                        if not cut:
                            server.in_flight -= 1
                        ended = server.stopped_at if cut else time.monotonic()
                        server.spans.append((started, ended, _first_user_message(body)))

            def _answer(self, body: dict[str, Any]) -> None:
                with server._lock:
                    server.requests.append(body)
                    server.request_headers.append({k.lower(): v for k, v in self.headers.items()})
                    step: Step | None = server.steps.pop(0) if server.steps else None
                if callable(step):
                    step = step(body)
                if step is None:
                    step = tool_call("finish", summary="(script ended)")
                if step.get("sleep"):
                    time.sleep(float(step["sleep"]))
                if step.get("drop"):
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if "status" in step:
                    err = step.get("body") or {
                        "error": {"message": f"scripted error {step['status']}", "type": "scripted"}
                    }
                    self._send(int(step["status"]), err, step.get("headers") or {})
                    return
                self._send(200, server._completion(body, step))

            def _send(
                self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._httpd.server_address[1]
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Drop every open connection (a keep-alive one included, a request being answered cut off at once) and stop
        listening, as a server that stops; a connection accepted meanwhile is dropped too. The requests being answered
        end there: no longer in flight, their spans end at the stop (their handlers may still run out their script)."""
        with self._lock:
            self.stops, self.stopped_at, self.in_flight = self.stops + 1, time.monotonic(), 0
        self._drop_connections()
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        self._drop_connections()

    def _drop_connections(self) -> None:
        with self._lock:
            connections, self._connections = list(self._connections), set()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self.port, "server not started"
        return f"http://127.0.0.1:{self.port}/v1"

    def add(self, *steps: Step) -> None:
        with self._lock:
            self.steps.extend(steps)

    # -- replies ---------------------------------------------------------------------------------------------
    def _completion(self, request: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": step.get("content")}
        if step.get("reasoning_content"):
            message["reasoning_content"] = step["reasoning_content"]
        calls = []
        for call in step.get("tool_calls") or []:
            args = call.get("arguments", {})
            calls.append(
                {
                    "id": call.get("id") or f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
        if calls:
            message["tool_calls"] = calls
        prompt_chars = len(json.dumps(request.get("messages", [])))
        usage = step.get("usage") or {
            "prompt_tokens": prompt_chars // 4,
            "completion_tokens": max(1, len(json.dumps(message)) // 4),
        }
        usage.setdefault("total_tokens", usage["prompt_tokens"] + usage["completion_tokens"])
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", self.model),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": usage,
        }


def _first_user_message(body: dict[str, Any]) -> str:
    for message in body.get("messages") or []:
        if message.get("role") == "user":
            return str(message.get("content") or "")
    return ""
