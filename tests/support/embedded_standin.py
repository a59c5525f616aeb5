"""A stand-in for the embedded model server, and a run that uses it by lease, for the lease tests.

The real server loads 1.1 GB of weights (tests/test_embedded_model.py starts it once); here the server is a small
HTTP server that lists the embedded model's name on /v1/models, started by bugsweep's own `start_background` and
watched by bugsweep's own `stop_when_unused`, exactly as the real one. NOT a model: it answers nothing else.

    python -m tests.support.embedded_standin serve --port P [--stop-when-unused]   (started by bugsweep)
    python -m tests.support.embedded_standin run --until FILE   (a run: holds a lease until FILE exists)

Both read BUGSWEEP_CACHE_DIR and BUGSWEEP_MODEL_PORT, as bugsweep does.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bugsweep.embedded import DEFAULT_MODEL, EmbeddedSettings


def serve(settings: EmbeddedSettings, stop_when_unused: bool) -> None:
    from bugsweep.embedded import server as embedded

    class Models(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"object": "list", "data": [{"id": DEFAULT_MODEL.name}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", settings.port), Models)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if stop_when_unused:
        embedded.stop_when_unused(settings, stop, every_s=1.0)
    print(f"serving on {settings.port}", flush=True)
    stop.wait()
    httpd.shutdown()
    httpd.server_close()
    print("stopped", flush=True)


def run(settings: EmbeddedSettings, until: Path) -> None:
    """A run on this machine: takes a lease on the (stand-in) server, starting it when none runs, and holds it until
    `until` exists. Prints one JSON line once it has the server."""
    from bugsweep.embedded import install
    from bugsweep.embedded import server as embedded

    def standin_command(settings: EmbeddedSettings, leased: bool) -> list[str]:
        command = [sys.executable, "-m", "tests.support.embedded_standin", "serve"]
        return [*command, "--stop-when-unused"] if leased else command

    embedded.server_command = standin_command  # type: ignore[assignment]
    install.ensure_model_file = lambda *args, **kwargs: Path("/dev/null")  # type: ignore[assignment]
    with embedded.ensure_embedded_model(
        settings, progress=lambda message: print(message, flush=True)
    ) as model:
        print(json.dumps({"pid": model.pid, "started": model.started}), flush=True)
        while not until.exists():
            time.sleep(0.1)
    print("done", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["serve", "run"])
    parser.add_argument("--stop-when-unused", action="store_true")
    parser.add_argument("--until", type=Path)
    args = parser.parse_args()
    settings = EmbeddedSettings()
    if args.what == "serve":
        serve(settings, args.stop_when_unused)
    else:
        run(settings, args.until)


if __name__ == "__main__":
    main()
