"""A real git server on 127.0.0.1 for tests: Git's own `git http-backend` (smart HTTP) behind a small HTTP server.

Reads are anonymous and pushes need HTTP Basic credentials (user name and token), as on a forge hosting a public
repository: the server answers 401 to a push without them or with a wrong token, and hands the user name on to
http-backend as REMOTE_USER (which enables receive-pack). Every request's Authorization header is recorded, so a
test can tell what reached the server. Not a mock: the repositories are bare repositories served by git itself.
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support.repos import git


class GitHttpServer:
    """`root` holds bare repositories (NAME.git), served at http://127.0.0.1:PORT/NAME.git."""

    def __init__(self, root: Path, *, user: str, token: str) -> None:
        self.root = root
        self.user, self.token = user, token
        self.authorizations: list[str] = []
        self.refused: list[str] = []
        """The paths of requests answered 401 (a push without the right credentials)."""
        self._httpd: ThreadingHTTPServer | None = None

    def url(self, name: str) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/{name}"

    def bare_copy(self, source: Path, name: str) -> str:
        """A bare clone of the repository at `source`, served as NAME; its URL."""
        git(self.root, "clone", "-q", "--bare", str(source), str(self.root / name))
        return self.url(name)

    def branches(self, name: str) -> dict[str, str]:
        """The branches of a served repository (name -> commit), read on the server's side."""
        out = git(self.root / name, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads")
        return dict(line.split(" ", 1) for line in out.splitlines() if line)

    def start(self) -> GitHttpServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                header = self.headers.get("Authorization", "")
                server.authorizations.append(header)
                remote_user = ""
                if "git-receive-pack" in self.path:
                    expected = base64.b64encode(f"{server.user}:{server.token}".encode()).decode()
                    if header != f"Basic {expected}":
                        server.refused.append(self.path)
                        self.send_response(401)
                        self.send_header("WWW-Authenticate", 'Basic realm="git"')
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    remote_user = server.user
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                env = {
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "GIT_PROJECT_ROOT": str(server.root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "REQUEST_METHOD": self.command,
                    "PATH_INFO": parts.path,
                    "QUERY_STRING": parts.query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "REMOTE_USER": remote_user,
                    "REMOTE_ADDR": "127.0.0.1",
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                }
                done = subprocess.run(
                    ["git", "http-backend"], input=body, env=env, capture_output=True, timeout=120
                )
                head, _, payload = done.stdout.partition(b"\r\n\r\n")
                status = 200
                headers = []
                for line in head.decode("latin-1").split("\r\n"):
                    key, _, value = line.partition(":")
                    if key.lower() == "status":
                        status = int(value.strip().split()[0])
                    elif key:
                        headers.append((key, value.strip()))
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
