"""Run the embedded model with llama.cpp's own server (the `xllamacpp` wheel), on 127.0.0.1 only.

`bugsweep model serve` starts it as a detached process (`python -m bugsweep.embedded.server`) that writes a pid file
and a log into the state dir, so `model status` and `model stop` work from any shell; `--foreground` runs it
attached. `ensure_embedded_model()` is what `solve`, `demo` and the flows call: one server per machine (per user and
port), shared by every run there by lease. Each run holds a lease (a file in the state dir naming its process)
while it uses the server; it reuses the server already answering on the port, or starts one. The server stops
when the last lease ends: the run that leaves last stops it, and the server itself stops once it finds no live
lease (its holders killed), so it never stops under a run that uses it. A server started by `bugsweep model
serve` runs until `bugsweep model stop`.

Settings chosen for small, shared machines: two slots with a full context each (two agents sharing the server
keep their own prompt caches),
threads = cores, `OMP_WAIT_POLICY=PASSIVE` (spinning OpenMP threads made generation fall under 1 tok/s on a busy
2-core machine), and prompt caching with chunk reuse so later agent turns only process what is new.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bugsweep.embedded import CHAT_TEMPLATE_PATH, DEFAULT_MODEL, EmbeddedSettings, ModelSpec
from bugsweep.errors import ConfigError, InfraError

Progress = Callable[[str], None]

#: OpenMP must not busy-wait on a shared machine; read when the library loads, so set before importing xllamacpp.
SERVER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


@dataclass
class EmbeddedModel:
    """A running embedded model endpoint, as `ensure_embedded_model()` hands it out."""

    base_url: str
    """OpenAI-compatible base URL, e.g. http://127.0.0.1:8012/v1."""
    model: str
    """Model name to send with requests."""
    pid: int | None
    """Server process id, when known (a server found on the port may belong to another user)."""
    started: bool
    """True when this context started the server."""
    slots: int = 2
    """Requests the server answers at once (its `n_parallel`): the endpoint's limit."""

    def serving(self, settings: Any) -> Any:
        """Model settings (bugsweep.settings.ModelSettings) made to use this server: its address and model, and as
        many requests at once as it has slots."""
        return settings.model_copy(
            update={"base_url": self.base_url, "model": self.model, "max_concurrent_requests": self.slots}
        )


@dataclass
class ServerState:
    """What the pid file records about a background server."""

    pid: int
    port: int
    model: str
    model_path: str
    log_path: str
    threads: int
    ctx: int
    started_at: float
    leased: bool = False
    """Started for runs (ensure_embedded_model): it stops when the last lease ends. False: by `model serve`."""
    process_start: int | None = None
    """The process's start time (clock ticks after boot, /proc/PID/stat), so a reused pid is not taken for it."""


# -- the server itself -----------------------------------------------------------------------------------------


def build_params(model_path: Path, settings: EmbeddedSettings, model_name: str, chat_template: str) -> Any:
    """llama.cpp server parameters (`xllamacpp.CommonParams`) for one agent on a small CPU machine."""
    for key, value in SERVER_ENV.items():
        os.environ.setdefault(key, value)
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model_path)
    params.model_alias = {model_name}  # a set of names in this binding; the first is what /v1/models reports
    params.hostnames = ["127.0.0.1"]
    params.port = settings.port
    params.n_ctx = settings.ctx * settings.n_parallel  # llama.cpp splits n_ctx evenly between the slots
    params.n_parallel = settings.n_parallel
    params.cpuparams.n_threads = settings.threads
    params.cpuparams_batch.n_threads = settings.threads
    params.use_jinja = True
    params.chat_template = chat_template
    params.cache_prompt = True
    params.n_cache_reuse = (
        256  # reuse cached chunks after an edited middle (elided old tool output) by KV shifting
    )
    return params


def serve_foreground(
    settings: EmbeddedSettings,
    spec: ModelSpec = DEFAULT_MODEL,
    progress: Progress = print,
    stop_event: threading.Event | None = None,
) -> None:
    """Load the model and serve until SIGINT/SIGTERM (or `stop_event`). Installs and joins the model if needed."""
    from bugsweep.embedded.install import ensure_model_file

    model_path = ensure_model_file(spec, settings, echo=progress)
    _check_port_free(settings.port)
    params = build_params(model_path, settings, spec.name, CHAT_TEMPLATE_PATH.read_text())
    import xllamacpp

    progress(f"Loading {spec.name} ({settings.threads} threads, context {settings.ctx}) ...")
    try:
        server = xllamacpp.Server(params)
    except RuntimeError as exc:
        raise InfraError(f"llama.cpp could not start the server on 127.0.0.1:{settings.port}: {exc}") from exc
    stop = stop_event or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    progress(f"Serving {spec.name} at {settings.base_url} (OpenAI-compatible). Stop with Ctrl-C.")
    try:
        while not stop.wait(0.5):
            pass
    finally:
        progress("Stopping the server ...")
        del server


def _check_port_free(port: int) -> None:
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError(
                f"Port {port} on 127.0.0.1 is already in use ({exc.strerror}). Stop what uses it, or choose "
                "another port with --port or BUGSWEEP_MODEL_PORT."
            ) from exc


# -- state files ------------------------------------------------------------------------------------------------


def _pid_path(settings: EmbeddedSettings) -> Path:
    return settings.state_dir / f"server-{settings.port}.json"


def log_path(settings: EmbeddedSettings) -> Path:
    return settings.state_dir / f"server-{settings.port}.log"


def read_state(settings: EmbeddedSettings) -> ServerState | None:
    """The recorded background server on this port, if its process is still alive (stale pid files are removed)."""
    path = _pid_path(settings)
    try:
        state = ServerState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if not _is_our_process(state.pid, state.process_start):
        path.unlink(missing_ok=True)
        return None
    return state


def _is_our_process(pid: int, process_start: int | None = None) -> bool:
    """Alive and really the process recorded (not a recycled pid): the same start time, or, for a record without
    one, a command line naming the server."""
    if process_start is not None:
        return _alive(pid) and _process_start(pid) == process_start
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"bugsweep.embedded.server" in cmdline


def _process_start(pid: int) -> int | None:
    """When the process started (clock ticks after boot); None when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


# -- leases: which runs use the server ---------------------------------------------------------------------------


def lease_dir(settings: EmbeddedSettings) -> Path:
    return settings.state_dir / f"leases-{settings.port}"


@dataclass
class Lease:
    """A run's hold on the server: a file naming its process, removed when the run is done with the server."""

    path: Path

    @classmethod
    def take(cls, settings: EmbeddedSettings) -> Lease:
        folder = lease_dir(settings)
        folder.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        path = folder / f"{pid}-{uuid.uuid4().hex[:8]}.json"
        path.write_text(json.dumps({"pid": pid, "process_start": _process_start(pid), "since": time.time()}))
        return cls(path)

    def end(self) -> None:
        self.path.unlink(missing_ok=True)


def live_leases(settings: EmbeddedSettings) -> list[int]:
    """The processes holding a lease on the server now (leases of dead processes are removed)."""
    holders = []
    for path in sorted(lease_dir(settings).glob("*.json")):
        try:
            record = json.loads(path.read_text())
            pid, started = int(record["pid"]), record.get("process_start")
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if _is_leaseholder(pid, started):
            holders.append(pid)
        else:
            path.unlink(missing_ok=True)
    return holders


def _is_leaseholder(pid: int, process_start: int | None) -> bool:
    return _alive(pid) and (process_start is None or _process_start(pid) == process_start)


def stop_when_unused(
    settings: EmbeddedSettings, stop: threading.Event, every_s: float = 5.0
) -> threading.Thread:
    """In the server's own process (started for runs): set `stop` once two looks `every_s` apart find no live
    lease (every run that used it ended, or was killed). The start lock is taken then and kept until the process
    exits, so that no run takes the dying server for a live one."""

    def watch() -> None:
        unused = 0
        while not stop.wait(every_s):
            lock = _lock_file(settings)
            fcntl.flock(lock, fcntl.LOCK_EX)
            unused = unused + 1 if not live_leases(settings) else 0
            if unused < 2:
                fcntl.flock(lock, fcntl.LOCK_UN)
                lock.close()
                continue
            _pid_path(settings).unlink(missing_ok=True)
            stop.set()  # the lock stays held until this process exits (the kernel releases it)
            _held_until_exit.append(lock)
            return

    thread = threading.Thread(target=watch, name="stop-when-unused", daemon=True)
    thread.start()
    return thread


_held_until_exit: list[Any] = []


def _lock_file(settings: EmbeddedSettings) -> Any:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return (settings.state_dir / f"server-{settings.port}.lock").open("w")


@contextlib.contextmanager
def _start_lock(settings: EmbeddedSettings) -> Iterator[None]:
    """Serialises starts, leases and stops on one port: two commands starting at once do not both load 1.1 GB,
    and a server is never stopped while a run takes a lease on it."""
    with _lock_file(settings) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# -- health ----------------------------------------------------------------------------------------------------


def served_models(port: int, timeout_s: float = 2.0) -> list[str] | None:
    """Model names a ready OpenAI-compatible server on 127.0.0.1:port lists; None when nothing ready answers."""
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=timeout_s)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None  # llama.cpp answers 503 while the model is loading
    try:
        return [str(item.get("id")) for item in response.json().get("data", [])]
    except (ValueError, AttributeError):
        return []


def is_ready(settings: EmbeddedSettings, model: str) -> bool:
    models = served_models(settings.port)
    return models is not None and model in models


# -- background server -----------------------------------------------------------------------------------------


def server_command(settings: EmbeddedSettings, leased: bool) -> list[str]:
    """The detached server's command line (`leased`: it stops itself once no run holds a lease)."""
    command = [sys.executable, "-m", "bugsweep.embedded.server", "--port", str(settings.port), "--threads",
               str(settings.threads), "--ctx", str(settings.ctx)]  # fmt: skip
    return [*command, "--stop-when-unused"] if leased else command


def start_background(
    settings: EmbeddedSettings,
    spec: ModelSpec = DEFAULT_MODEL,
    progress: Progress = print,
    leased: bool = False,
) -> ServerState:
    """Start a detached server process and wait until it answers; returns its recorded state. `leased`: started
    for runs, it stops when the last lease ends (else it runs until `bugsweep model stop`).

    The model is installed and joined here, in this process, so pip's and the join's progress are visible.
    """
    from bugsweep.embedded import install

    model_path = install.ensure_model_file(spec, settings, echo=progress)
    _check_port_free(settings.port)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    log = log_path(settings)
    command = server_command(settings, leased)
    env = {
        **os.environ,
        **SERVER_ENV,
        "BUGSWEEP_CACHE_DIR": str(settings.cache_dir),
        "BUGSWEEP_MODEL_N_PARALLEL": str(settings.n_parallel),
        "BUGSWEEP_MODEL_AUTO_INSTALL": "false",
    }
    with log.open("w") as log_file:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    state = ServerState(
        pid=process.pid,
        port=settings.port,
        model=spec.name,
        model_path=str(model_path),
        log_path=str(log),
        threads=settings.threads,
        ctx=settings.ctx,
        started_at=time.time(),
        leased=leased,
        process_start=_process_start(process.pid),
    )
    _pid_path(settings).write_text(json.dumps(asdict(state)))
    progress(f"Starting the embedded model server (pid {process.pid}, log {log}) ...")
    started, last_note = time.monotonic(), 0.0
    while not is_ready(settings, spec.name):
        if process.poll() is not None:
            _pid_path(settings).unlink(missing_ok=True)
            raise InfraError(
                f"The embedded model server exited with code {process.returncode} while starting. "
                f"Last lines of {log}:\n{_tail(log)}"
            )
        waited = time.monotonic() - started
        if waited > settings.start_timeout_s:
            _terminate(process.pid)
            _pid_path(settings).unlink(missing_ok=True)
            raise InfraError(
                f"The embedded model server did not answer within {settings.start_timeout_s:.0f} s "
                f"(BUGSWEEP_MODEL_START_TIMEOUT_S). Last lines of {log}:\n{_tail(log)}"
            )
        if waited - last_note >= 10:
            progress(f"  still loading ({waited:.0f} s) ...")
            last_note = waited
        time.sleep(0.5)
    progress(f"Embedded model ready at {settings.base_url} after {time.monotonic() - started:.0f} s")
    return state


def stop_background(settings: EmbeddedSettings, timeout_s: float = 30.0) -> ServerState | None:
    """Stop the recorded background server on this port, whether runs hold leases on it or not (`bugsweep model
    stop`); returns its state, or None if none was running."""
    with _start_lock(settings):
        state = read_state(settings)
        if state is None:
            return None
        _terminate(state.pid, timeout_s)
        _pid_path(settings).unlink(missing_ok=True)
    return state


def _terminate(pid: int, timeout_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if the process is still there after `timeout_s`; returns once it is gone (reaped)."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    """Whether `pid` still runs. Reaps it when it is our child that has exited, so no zombie is left behind.

    A process whose main thread has exited shows as a zombie ("Z") while its other threads still run (and may still
    hold the port): seen once in CI. So our child counts as alive until waitpid reaps it, and another process's
    zombie only when no thread of it is left.
    """
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        return reaped != pid
    except ChildProcessError:
        pass  # not our child (started by another bugsweep command): its parent or init reaps it
    state = _proc_state(pid)
    if state in ("", "X"):
        return False
    if state == "Z":
        try:
            return len(os.listdir(f"/proc/{pid}/task")) > 1
        except OSError:
            return False
    return True


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.contextmanager
def ensure_embedded_model(
    settings: EmbeddedSettings | None = None, spec: ModelSpec = DEFAULT_MODEL, progress: Progress = print
) -> Iterator[EmbeddedModel]:
    """A running embedded model for the duration of the block, held by a lease.

    Reuses the server already answering on the port with this model (started by another run on this machine, or
    by `bugsweep model serve`), else installs and joins the model if needed and starts one. When the block ends,
    its lease ends, and when it was the last lease on a server started for runs, that server is stopped (a
    server started by `bugsweep model serve` keeps running). Raises ConfigError if the port is taken by something
    else, InfraError if the server cannot start.
    """
    settings = settings or EmbeddedSettings()
    with _start_lock(settings):
        lease = Lease.take(settings)
        try:
            endpoint = _reuse_or_start(settings, spec, progress)
        except BaseException:
            lease.end()
            raise
    try:
        yield endpoint
    finally:
        with _start_lock(settings):
            lease.end()
            state = read_state(settings)
            if state is not None and state.leased and not live_leases(settings):
                progress("Stopping the embedded model server: no run on this machine uses it any more")
                _terminate(state.pid)
                _pid_path(settings).unlink(missing_ok=True)


def _reuse_or_start(settings: EmbeddedSettings, spec: ModelSpec, progress: Progress) -> EmbeddedModel:
    """The server on the port (with the start lock held): reused when it answers or is loading, else started."""
    state = read_state(settings)
    if is_ready(settings, spec.name):
        progress(f"Using the embedded model already running at {settings.base_url}")
        return EmbeddedModel(
            settings.base_url, spec.name, state.pid if state else None, False, settings.n_parallel
        )
    if state is not None:
        # Another command is loading it right now (we held the lock, so it is past its start): wait for it.
        _wait_ready(settings, spec.name, state, progress)
        return EmbeddedModel(settings.base_url, spec.name, state.pid, False, settings.n_parallel)
    other = served_models(settings.port)
    if other is not None:
        raise ConfigError(
            f"Port {settings.port} answers with other models ({', '.join(other) or 'none'}), "
            "not the embedded model. Set BUGSWEEP_MODEL_PORT to a free port, or set "
            "LLM_BASE_URL to use that server."
        )
    started = start_background(settings, spec, progress, leased=True)
    return EmbeddedModel(settings.base_url, spec.name, started.pid, True, settings.n_parallel)


def _wait_ready(settings: EmbeddedSettings, model: str, state: ServerState, progress: Progress) -> None:
    progress(f"Waiting for the embedded model server (pid {state.pid}) to finish loading ...")
    deadline = time.monotonic() + settings.start_timeout_s
    while not is_ready(settings, model):
        if not _is_our_process(state.pid, state.process_start):
            raise InfraError(
                f"The embedded model server (pid {state.pid}) exited while loading; see {state.log_path}"
            )
        if time.monotonic() > deadline:
            raise InfraError(
                f"The embedded model server (pid {state.pid}) did not become ready; see {state.log_path}"
            )
        time.sleep(0.5)


# -- `python -m bugsweep.embedded.server`: the detached process ----------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Serve the embedded model (started by `bugsweep model serve`)."
    )
    parser.add_argument("--port", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--ctx", type=int)
    parser.add_argument(
        "--stop-when-unused", action="store_true", help="Stop once no run on this machine holds a lease."
    )
    args = parser.parse_args(argv)
    overrides = {
        key: value for key, value in vars(args).items() if value is not None and key != "stop_when_unused"
    }
    settings = EmbeddedSettings(**overrides)
    stop = threading.Event()
    if args.stop_when_unused:
        stop_when_unused(settings, stop)
    serve_foreground(settings, progress=lambda message: print(message, flush=True), stop_event=stop)


if __name__ == "__main__":
    main()
