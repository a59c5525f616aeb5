"""Runtime cloud sandboxes (withruntime.com): one Firecracker microVM per task, through the `withruntime` SDK.

Same interface and behaviour as the local backend (bugsweep.sandbox.base): the repository sits at /workspace/repo,
commands run under bash there, the model sees the last 64 KiB of each stream while the grader gets the whole log,
and the sandbox is always deleted at the end. Only tool calls cross into the sandbox: the agent loop and the
model's API key stay on this machine (docs/runtime.md describes the optional mode where the loop runs inside).

Failures are sorted into bugsweep's families, after the SDK's own retries (it retries 429, 502-504 and dropped
connections with the same Idempotency-Key, and waits out capacity refusals on create):
- rate limits, capacity, 5xx, dropped connections -> SandboxError (infra: a step may retry it, never solve);
- a rejected or missing key (401), a refused permission (403), a blocked account, a refused create -> ConfigError;
- our sandbox answering 404, or no longer running, mid-task -> SandboxGone (infra: never graded; not retried
  in the same sandbox).

Cost: Runtime bills CPU actually used ($0.025 per vCPU-hour) and memory held ($0.0075 per GiB-hour). The sandbox
counts its commands' measured durations; `cost_usd()` prices them as if every vCPU were busy while a command ran
(an upper bound on CPU), plus the memory over the sandbox's whole lifetime. Prices are settings.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from withruntime import (
    AccountBlockedError,
    AuthenticationError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    Runtime,
    RuntimeAPIError,
)

from bugsweep.errors import ConfigError, SandboxError, SandboxGone
from bugsweep.runconfig import RuntimeFields
from bugsweep.sandbox import runtime_workspace
from bugsweep.sandbox.base import (
    OUTPUT_LIMIT_BYTES,
    Environment,
    ExecResult,
    RepoSource,
    Sandbox,
    SandboxFiles,
    SandboxProvider,
    SandboxSnapshot,
    SandboxUsage,
    tail,
)
from bugsweep.sandbox.sources import SourceCache
from bugsweep.settings import SandboxSettings

log = logging.getLogger(__name__)

#: Every sandbox bugsweep makes carries this label, so a cleanup never touches anyone else's sandboxes.
BUGSWEEP_LABEL = ("bugsweep", "1")
#: Error codes that say Runtime will not change network rules here (a product switched off, not a blip).
_NETWORK_REFUSED = {"network_rules_unavailable", "network_unavailable", "feature_unavailable", "unsupported"}
#: 409 codes that mean the sandbox is no longer running (stopped at its time limit, paused, deleted).
_NOT_RUNNING = {
    "sandbox_not_running",
    "not_running",
    "sandbox_stopped",
    "sandbox_deleted",
    "stopped",
    "deleted",
}


class RuntimeSettings(BaseSettings, RuntimeFields):
    """Runtime-only settings: a microVM's (bugsweep.runconfig.RuntimeFields, BUGSWEEP_RUNTIME_*), and the key and
    the API's address under the SDK's own variable names."""

    model_config = SettingsConfigDict(
        env_prefix="BUGSWEEP_RUNTIME_", env_file=".env", extra="ignore", populate_by_name=True
    )

    api_key: SecretStr = Field(
        SecretStr(""), validation_alias=AliasChoices("RUNTIME_API_KEY", "BUGSWEEP_RUNTIME_API_KEY")
    )
    """Runtime API key (RUNTIME_API_KEY). Never logged; never put into a sandbox. Empty: the key saved by
    `npx withruntime login`, if any."""
    api_url: str | None = Field(
        None, validation_alias=AliasChoices("RUNTIME_API_URL", "BUGSWEEP_RUNTIME_API_URL")
    )
    """API origin (RUNTIME_API_URL); unset: https://api.withruntime.com. Plain http only to localhost (tests)."""


@dataclass
class CleanupReport:
    """What `cleanup` did: the ids deleted and the ones that failed, with why."""

    deleted: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


@contextlib.contextmanager
def classified(
    action: str, sandbox_id: str | None = None, *, invalid_is_config: bool = False
) -> Iterator[None]:
    """Turn the SDK's errors into bugsweep's families. `action` completes "while trying to ..." in messages.

    `sandbox_id` is given for calls on a sandbox we created: its 404 then means it vanished (SandboxGone).
    The SDK's error text (code, message, hint, request id) never contains the API key.
    """
    try:
        yield
    except AuthenticationError as exc:
        raise ConfigError(
            f"Runtime rejected the API key while trying to {action} (401 {exc.code}). Set RUNTIME_API_KEY to a "
            "valid key from https://withruntime.com/account/keys (and RUNTIME_API_URL, if you use another API)."
        ) from exc
    except PermissionDeniedError as exc:
        raise ConfigError(
            f"Runtime refused to {action} (403 {exc.code}): {exc.message} The key in RUNTIME_API_KEY lacks the "
            "permission; use a key that may manage sandboxes."
        ) from exc
    except AccountBlockedError as exc:
        raise ConfigError(f"Runtime refused to {action}: the account may not spend ({exc.message})") from exc
    except NotFoundError as exc:
        if sandbox_id is not None:
            raise SandboxGone(
                f"Runtime sandbox {sandbox_id} vanished while trying to {action} ({exc.code}): deleted, expired or "
                "its host failed. The task should be retried in a new sandbox."
            ) from exc
        raise SandboxError(f"Runtime could not {action}: {exc.code}: {exc.message}") from exc
    except ConflictError as exc:
        if sandbox_id is not None and exc.code in _NOT_RUNNING:
            raise SandboxGone(
                f"Runtime sandbox {sandbox_id} is no longer running ({exc.code}): {exc.message}"
            ) from exc
        raise SandboxError(f"Runtime could not {action} ({exc.code}): {exc.message}") from exc
    except InvalidRequestError as exc:
        if invalid_is_config:
            raise ConfigError(
                f"Runtime refused to {action} ({exc.status} {exc.code}): {exc.message} "
                "Check the BUGSWEEP_RUNTIME_* settings (vcpu, memory_mib, disk_mib, timeout_seconds, image)."
            ) from exc
        raise SandboxError(f"Runtime could not {action} ({exc.code}): {exc.message}") from exc
    except RuntimeAPIError as exc:
        if exc.code == "missing_api_key":
            raise ConfigError(
                f"No Runtime API key to {action}: set RUNTIME_API_KEY (a key from "
                "https://withruntime.com/account/keys) or run `npx withruntime login`."
            ) from exc
        # Rate limits, capacity, 5xx and dropped connections, after the SDK's own retries.
        status = f" {exc.status}" if exc.status else ""
        raise SandboxError(
            f"Runtime failed to {action} after retries [{exc.code}{status}]: {exc.message}"
        ) from exc


def _ignore(_: str) -> None:
    """An output callback that only switches the SDK's exec to streaming (it keeps the whole output itself)."""


def clean_labels(labels: dict[str, str]) -> dict[str, str]:
    """Labels as Runtime takes them: short names and values of letters, digits, '.', '_' and '-'.

    A model name such as "qwen/qwen3-coder:30b" becomes "qwen-qwen3-coder-30b"; `list --label` and `cleanup
    --label` apply the same cleaning, so a user can pass the original text.
    """

    def clean(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-")[:63] or "-"

    return {clean(k): clean(v) for k, v in labels.items()}


class RuntimeFiles:
    """File access inside a Runtime sandbox (absolute sandbox paths)."""

    def __init__(self, sandbox: RuntimeSandbox) -> None:
        self._sandbox = sandbox

    def read_text(self, path: str) -> str:
        """The file as text (undecodable bytes replaced). Raises FileNotFoundError for a missing file."""
        with classified(f"read {path}", self._sandbox.id):
            try:
                return self._sandbox.sdk.files.read(path).decode("utf-8", "replace")
            except NotFoundError as exc:
                if exc.code in ("file_not_found", "not_found"):
                    raise FileNotFoundError(f"{path}: no such file in the sandbox") from exc
                raise
            except InvalidRequestError as exc:
                if "directory" in exc.code:
                    raise IsADirectoryError(f"{path}: is a directory") from exc
                raise
            except PermissionDeniedError as exc:
                raise PermissionError(f"{path}: the sandbox user may not read it ({exc.message})") from exc

    def write(self, path: str, data: str | bytes) -> None:
        """Writes atomically, making parent folders. Any size under /workspace; elsewhere up to 1 MiB, where
        the sandbox user may write (a 403 there is PermissionError, not a problem with the API key)."""
        with classified(f"write {path}", self._sandbox.id):
            try:
                self._sandbox.sdk.files.write(path, data)
            except PermissionDeniedError as exc:
                raise PermissionError(f"{path}: the sandbox user may not write it ({exc.message})") from exc

    def exists(self, path: str) -> bool:
        with classified(f"look for {path}", self._sandbox.id):
            return self._sandbox.sdk.files.exists(path)


class RuntimeSandbox:
    """One task's Runtime microVM. Use as a context manager, or call release() in a finally block."""

    def __init__(
        self,
        sdk_sandbox: Any,
        settings: SandboxSettings,
        runtime_settings: RuntimeSettings,
        sources: SourceCache | None = None,
    ) -> None:
        self.sdk = sdk_sandbox
        """The SDK's Sandbox, for what this interface does not cover (snapshots, previews, ...)."""
        self.id: str = sdk_sandbox.id
        self.workdir = settings.workdir
        self.files: SandboxFiles = RuntimeFiles(self)
        self.vcpu = runtime_settings.vcpu
        self.memory_mib = runtime_settings.memory_mib or settings.memory_mib
        self._prices = (runtime_settings.price_per_vcpu_hour, runtime_settings.price_per_gib_hour)
        self._isolate_network = runtime_settings.isolate_network
        self._internet_on = not runtime_settings.isolate_network
        self.clone_timeout = runtime_settings.clone_timeout_s
        self.sources = sources or SourceCache()
        self._command_seconds = 0.0
        self._commands = 0
        self._created = time.monotonic()
        self._released_at: float | None = None
        self._lock = threading.Lock()
        self.python = "python3"
        """The interpreter inside the microVM the task environment was made from."""
        self.task_env: dict[str, str] = {}
        """PATH and VIRTUAL_ENV of the task environment, for every command once it exists."""

    # -- the Sandbox protocol ---------------------------------------------------------------------------------
    def exec(
        self,
        command: str,
        *,
        timeout: float = 300.0,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        network: bool = False,
        full_output: bool = False,
        stdin: str | None = None,
    ) -> ExecResult:
        """Run `command` under bash in `cwd` (default: the repository; a relative cwd is inside it).

        `full_output=True` streams the command's output (NDJSON) and returns all of it, for test logs;
        otherwise each stream keeps its last 64 KiB. (The SDK streams by itself for timeouts over 60 s.)
        `network=True` switches the sandbox's internet on for this one command (see isolate_network).
        """
        if self._released_at is not None:
            raise SandboxGone(f"Runtime sandbox {self.id} was already released")
        if cwd and not cwd.startswith("/"):  # relative to the repository, as on the local backend
            cwd = f"{self.workdir}/{cwd}"
        streaming: dict[str, Any] = {"on_stdout": _ignore, "on_stderr": _ignore} if full_output else {}
        started = time.monotonic()
        with self._network(network), classified("run a command", self.id):
            result = self.sdk.exec(
                command,
                cwd=cwd or self.workdir,
                env={**self.task_env, **(env or {})} or None,
                stdin=stdin,
                timeout_ms=max(1, int(timeout * 1000)),
                **streaming,
            )
        wall = time.monotonic() - started
        duration = result.duration_ms / 1000 if result.duration_ms is not None else wall
        with self._lock:
            self._command_seconds += duration
            self._commands += 1
        stdout, stderr = result.stdout or "", result.stderr or ""
        truncated = bool(result.stdout_truncated or result.stderr_truncated)
        if not full_output:
            stdout, cut_out = tail(stdout, OUTPUT_LIMIT_BYTES)
            stderr, cut_err = tail(stderr, OUTPUT_LIMIT_BYTES)
            truncated = truncated or cut_out or cut_err
        return ExecResult(
            exit_code=None if result.timed_out else result.exit_code,
            stdout=stdout,
            stderr=stderr,
            timed_out=bool(result.timed_out),
            truncated=truncated,
            duration_s=duration,
            out_of_memory=bool(result.out_of_memory),
        )

    # -- the task environment (runtime_workspace.py) -----------------------------------------------------------------
    def setup_environment(
        self, command: str | None, *, timeout: float = 1800.0, network: bool = True
    ) -> tuple[ExecResult | None, Environment]:
        """Run the setup in the task environment (built in the microVM every time: Runtime keeps no layers)."""
        return runtime_workspace.setup_environment(self, command, timeout=timeout, network=network)

    def snapshot(self) -> runtime_workspace.RuntimeSnapshot:
        """The repository and the task environment as one archive on this machine (see runtime_workspace.py)."""
        return runtime_workspace.snapshot(self)

    def release(self) -> None:
        """Delete the sandbox. Idempotent; never raises (a sandbox that cannot be deleted now is deleted by
        Runtime at its time limit, and `bugsweep sandboxes cleanup` finds it by label)."""
        with self._lock:
            if self._released_at is not None:
                return
            self._released_at = time.monotonic()
        try:
            self.sdk.delete()
        except NotFoundError:
            pass
        except Exception as exc:
            log.warning(
                "could not delete Runtime sandbox %s: %s. It is deleted at its time limit; "
                "`bugsweep sandboxes cleanup --label bugsweep=1` removes leftovers.",
                self.id,
                exc,
            )

    def __enter__(self) -> RuntimeSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- usage and cost ---------------------------------------------------------------------------------------
    @property
    def lifetime_s(self) -> float:
        """Seconds from running to release (or to now, while it lives)."""
        end = self._released_at if self._released_at is not None else time.monotonic()
        return end - self._created

    def cost_usd(self) -> float:
        """Estimated Runtime charge: vCPUs x command seconds at the vCPU-hour price (an upper bound on CPU
        used) plus memory GiB x lifetime at the GiB-hour price. 2 vCPU / 4 GiB for 15 min with 45 s of
        commands: 2*45/3600*0.025 + 4*0.25*0.0075 = $0.0081."""
        per_vcpu_hour, per_gib_hour = self._prices
        cpu = self.vcpu * self._command_seconds / 3600 * per_vcpu_hour
        memory = self.memory_mib / 1024 * self.lifetime_s / 3600 * per_gib_hour
        return cpu + memory

    @property
    def usage(self) -> SandboxUsage:
        """What this sandbox consumed so far; extra holds lifetime_s, vcpu, memory_gib and cost_usd."""
        return SandboxUsage(
            command_seconds=self._command_seconds,
            commands=self._commands,
            extra={
                "lifetime_s": self.lifetime_s,
                "vcpu": float(self.vcpu),
                "memory_gib": self.memory_mib / 1024,
                "cost_usd": self.cost_usd(),
            },
        )

    # -- helpers ----------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _network(self, wanted: bool) -> Iterator[None]:
        """Internet on for one command when asked and the sandbox is isolated; off again afterwards. If switching
        it off fails, the next command without network tries again first and fails rather than run online."""
        if not self._isolate_network:
            yield
            return
        if not wanted:
            if self._internet_on:
                self._set_internet(False)
            yield
            return
        self._set_internet(True)
        try:
            yield
        finally:
            with contextlib.suppress(SandboxError):
                self._set_internet(False)

    def _set_internet(self, on: bool) -> None:
        try:
            with classified("change the sandbox's network rules", self.id):
                if on:
                    self._internet_on = True  # before the call: a lost answer may still have switched it on
                self.sdk.network.set(internet=on)
                self._internet_on = on
        except SandboxError as exc:
            cause = exc.__cause__
            if isinstance(cause, RuntimeAPIError) and cause.code in _NETWORK_REFUSED:
                raise ConfigError(
                    f"Runtime cannot change this sandbox's network rules ({cause.code}), so setup commands cannot "
                    "get the internet while agent commands stay offline. Set BUGSWEEP_RUNTIME_ISOLATE_NETWORK=false "
                    "to leave the internet on for the whole sandbox."
                ) from exc
            raise


class RuntimeProvider:
    """Creates Runtime sandboxes. One SDK client (a connection pool) serves every sandbox it makes.

    `RuntimeProvider(SandboxSettings())` reads everything else from the environment (RuntimeSettings).
    """

    name = "runtime"

    def __init__(
        self,
        settings: SandboxSettings | None = None,
        runtime_settings: RuntimeSettings | None = None,
        *,
        client: Runtime | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        """`cache_dir`: where checkouts of refs of local repositories are cached (default: SandboxSettings.cache_dir,
        else ~/.cache/bugsweep)."""
        self.settings = settings or SandboxSettings()
        # Read from the environment; mypy cannot see that the aliased fields have defaults.
        self.runtime_settings = runtime_settings or RuntimeSettings()  # type: ignore[call-arg]
        self._client = client
        self._client_lock = threading.Lock()
        self.sources = SourceCache(
            cache_dir or (Path(self.settings.cache_dir) if self.settings.cache_dir else None)
        )

    @property
    def client(self) -> Runtime:
        with self._client_lock:
            if self._client is None:
                rs = self.runtime_settings
                try:
                    self._client = Runtime(
                        api_key=rs.api_key.get_secret_value() or None,
                        base_url=rs.api_url or None,
                        timeout=rs.request_timeout_s,
                        max_retries=rs.max_retries,
                        wait_for_capacity=rs.wait_for_capacity_s,
                    )
                except ValueError as exc:
                    raise ConfigError(f"RUNTIME_API_URL {rs.api_url!r} is not usable: {exc}") from exc
                except RuntimeAPIError as exc:
                    raise ConfigError(
                        f"Runtime API key unusable ({exc.code}): check RUNTIME_API_KEY"
                    ) from exc
            return self._client

    def create(
        self,
        source: RepoSource,
        *,
        labels: dict[str, str] | None = None,
        disk_mib: int | None = None,
        python: str | None = None,
    ) -> RuntimeSandbox:
        """A running sandbox labelled `labels` + bugsweep=1, with the repository at workdir (and a disk of
        `disk_mib`, default: BUGSWEEP_RUNTIME_DISK_MIB, else Runtime's default) and an empty task environment made
        from `python` (an interpreter inside the microVM; default python3)."""
        sandbox = self._new_sandbox(labels, disk_mib)
        try:
            runtime_workspace.put_repo(sandbox, source)
            runtime_workspace.make_task_env(sandbox, python)
        except BaseException:
            sandbox.release()
            raise
        return sandbox

    def create_from(
        self, snapshot: SandboxSnapshot, *, labels: dict[str, str] | None = None
    ) -> RuntimeSandbox:
        """A new microVM holding `snapshot`'s repository and task environment (unpacked, not reinstalled)."""
        if not isinstance(snapshot, runtime_workspace.RuntimeSnapshot):
            raise TypeError(f"a Runtime sandbox cannot be made from {snapshot!r}")
        sandbox = self._new_sandbox(labels, snapshot.disk_mib)
        try:
            runtime_workspace.unpack(sandbox, snapshot)
        except BaseException:
            sandbox.release()
            raise
        return sandbox

    def _new_sandbox(self, labels: dict[str, str] | None, disk_mib: int | None) -> RuntimeSandbox:
        rs = self.runtime_settings
        fields: dict[str, Any] = {
            "labels": {**clean_labels(labels or {}), BUGSWEEP_LABEL[0]: BUGSWEEP_LABEL[1]},
            "vcpu": rs.vcpu,
            "memory_mib": rs.memory_mib or self.settings.memory_mib,
            "timeout_seconds": rs.timeout_seconds,
            "on_lease_end": "delete",
            "idle_pause_seconds": 0,  # a slow model must not find its sandbox paused between two tool calls
            "network": {"internet": not rs.isolate_network},
        }
        if disk_mib or rs.disk_mib:
            fields["disk_mib"] = disk_mib or rs.disk_mib
        if rs.image:
            fields["image"] = rs.image
        if rs.max_cost_usd is not None:
            fields["max_cost_micros"] = int(rs.max_cost_usd * 1_000_000)
        with classified("create a Runtime sandbox", invalid_is_config=True):
            sdk_sandbox = self.client.sandboxes.create(**fields)
        return RuntimeSandbox(sdk_sandbox, self.settings, rs, self.sources)

    def list(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        """Live bugsweep sandboxes whose labels all match (stopped ones too), as the API describes them."""
        wanted = {**clean_labels(labels), BUGSWEEP_LABEL[0]: BUGSWEEP_LABEL[1]}
        with classified("list sandboxes"):
            return [
                s.info for s in self.client.sandboxes.list(labels=wanted, include_stopped=True, limit=100)
            ]

    def cleanup(self, labels: dict[str, str]) -> CleanupReport:
        """Delete every bugsweep sandbox whose labels all match (leftovers of crashed runs)."""
        wanted = {**clean_labels(labels), BUGSWEEP_LABEL[0]: BUGSWEEP_LABEL[1]}
        with classified("delete sandboxes by label"):
            done = self.client.sandboxes.delete_all(labels=wanted)
        return CleanupReport(
            deleted=list(done["deleted"]),
            failed=[(f["id"], str(f["error"]).splitlines()[0]) for f in done["failed"]],
        )

    def close(self) -> None:
        """Close the SDK's connections (sandboxes already released are unaffected)."""
        if self._client is not None:
            self._client.close()


def _fits_the_protocols(provider: RuntimeProvider) -> SandboxProvider:
    """Never called: mypy checks here that RuntimeProvider (and the RuntimeSandbox it makes) fit the Protocols."""
    sandbox: Sandbox = provider.create(RepoSource("."))
    del sandbox
    return provider
