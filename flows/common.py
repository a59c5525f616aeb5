"""What the flows share: their typed parameters, the run configuration loaded from blocks, and sandbox release.

Flow parameters take blocks (`model`: a ModelEndpoint, `store`: prefect-aws's S3Bucket), which the UI's run form
offers as a list of saved blocks; a run's parameters hold only a reference to the block (Prefect stores and shows
parameters in plain text), never its secrets. A block left empty is the default-named one when it exists, else the
environment (LLM_*, BUGSWEEP_STORE_*, BUGSWEEP_SANDBOX_*), so a flow runs on a fresh machine before
`bugsweep blocks create`. The run itself is built by bugsweep.runbuilder.build_run, as on the command line: the
form's fields over the blocks over the environment of the process running the flow (a worker's) over the
defaults; `limits` fields left empty are unset, never defaults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from bugsweep import runconfig
from bugsweep.errors import BugsweepError, ConfigError, InfraError, first_line
from bugsweep.runbuilder import backend_of, build_run, sandbox_provider
from bugsweep.settings import BranchSettings, ModelSettings
from bugsweep.storage import ArtifactStore, LocalStore, StoreSettings, open_store
from bugsweep.sweep import RunSetup as RunSetup  # the flows' run, re-exported
from tasks.fanout import CRASH_RERUNS as CRASH_RERUNS  # the reruns the crash automation makes, re-exported

if TYPE_CHECKING:
    from prefect import Flow
    from prefect.client.schemas.objects import FlowRun
    from prefect.states import State
    from prefect_aws import S3Bucket

    from blocks import GitBranches, ModelEndpoint
    from bugsweep.sandbox.base import Sandbox, SandboxProvider

log = logging.getLogger(__name__)

SandboxName = Literal["local", "runtime"]
#: The label every sandbox of a flow run carries, so the flow's hooks (and `bugsweep sandboxes cleanup`) find it.
FLOW_RUN_LABEL = "prefect-flow-run"


# -- typed parameters (the UI draws a form from these) ----------------------------------------------------------


def form_field(default: Any, title: str, help: str) -> Any:
    """A flow parameter's default with the title and help text the UI's run form shows (`...`: required).

    Prefect titles a parameter with its name and takes its description from a `Field` default; the title goes in
    through `json_schema_extra`, which is applied last. Called directly, the flow gets `default`.
    """
    return Field(default, description=help, json_schema_extra={"title": title})


def model_field() -> Any:
    """The flows' `model` parameter: a saved model endpoint block, or empty."""
    return form_field(
        None,
        "Model endpoint",
        "A saved model endpoint block; empty: the one named bugsweep-model, else the worker's LLM_* variables, "
        "else the embedded open model.",
    )


def escalate_to_field() -> Any:
    """The flows' `escalate_to` parameter: saved model endpoint blocks, in order, or none."""
    return form_field(
        [],
        "Models to escalate to",
        "Saved model endpoint blocks tried after the model, in order, each (with its attempts) only on a task the "
        "ones before did not resolve: a cheaper model first, a stronger one for what it could not fix. Empty: the "
        "model alone.",
    )


def sandbox_field() -> Any:
    """The flows' `sandbox` parameter: empty unless the run chooses one."""
    return form_field(
        None,
        "Sandbox",
        f"local: bubblewrap on the worker; runtime: Runtime microVMs. {runconfig.BACKEND_UNSET}",
    )


def push_branches_field() -> Any:
    """The flows' `push_branches` parameter: push each resolved task's fix as a branch."""
    return form_field(
        False,
        "Push fixes as branches",
        "Commit each resolved task's graded fix (with the task's test patch) on its base commit and push it as "
        "branch PREFIX/SWEEP/TASK; nothing is pushed for a task that is not resolved.",
    )


def branches_field() -> Any:
    """The flows' `branches` parameter: where branches go, a saved git branches block, or empty."""
    return form_field(
        None,
        "Where branches go",
        "A saved git branches block (push URL, branch prefix, author, a Secret block with the token); empty: the "
        "one named bugsweep-branches, else the worker's BUGSWEEP_BRANCH_* variables (default: the task's own "
        "repository when it is a URL).",
    )


def store_field() -> Any:
    """The flows' `store` parameter: a saved S3 bucket block, or empty."""
    return form_field(
        None,
        "Artifact store (S3 bucket)",
        "A saved S3 bucket block (prefect-aws); run folders go to its folder as SWEEP/TASK/MODEL/CONFIG. Empty: "
        "the one named bugsweep-artifacts, else the worker's BUGSWEEP_STORE_URL (a folder or s3://).",
    )


#: The agent's budget and policy per task, declared once (bugsweep.runconfig.AgentLimits), each field unset unless
#: given: the flows' `limits` parameter.
AgentChoices = runconfig.AgentChoices


def limits_field(help: str) -> Any:
    """The flows' `limits` parameter: every field empty unless the run sets it (then BUGSWEEP_*, else the default)."""
    return form_field(AgentChoices(), "Agent limits", help)


# -- the run configuration --------------------------------------------------------------------------------------


def load_block(block_class: Any, name: str, default_name: str) -> Any | None:
    """The block saved under `name`; None when the default name was never created (then the environment is used)."""
    try:
        return block_class.load(name)
    except ValueError as exc:  # Prefect's "Unable to find block document named ..."
        if name == default_name:
            return None
        raise ConfigError(
            f"no {block_class.get_block_type_name()!r} block named {name!r}: create it with "
            "`bugsweep blocks create` or in the Prefect UI (Blocks)"
        ) from exc


def block_ref(block: Any) -> dict[str, Any] | None:
    """A saved block as a deployment run's parameter (a reference the run resolves; never its secrets)."""
    if block is None:
        return None
    if getattr(block, "_block_document_id", None) is None:
        raise ConfigError(
            f"a {block.get_block_type_name()!r} block that was never saved cannot be sent to a deployment run: "
            "save it (UI: Blocks) and choose it by name"
        )
    return {"$ref": {"block_document_id": str(block._block_document_id)}}


def load_run_config(
    model: ModelEndpoint | None,
    sandbox: SandboxName | None,
    store: S3Bucket | None,
    limits: AgentChoices | None,
    flow_run_id: str | None = None,
    *,
    push_branches: bool = False,
    branches: GitBranches | None = None,
    escalate_to: list[ModelEndpoint] | None = None,
) -> RunSetup:
    """Read the chosen blocks (or the default-named ones) and build the run from them (bugsweep.runbuilder:
    `limits` given over the blocks over the environment over the defaults), with where its artifacts go.
    `escalate_to`: saved model endpoint blocks a task escalates to, in order.

    No model block: the `bugsweep-model` block when it exists, else the LLM_* variables (else the embedded model).
    No store block: the `bugsweep-artifacts` S3Bucket block when it exists, else BUGSWEEP_STORE_URL (a folder or
    s3://). Run folders are written to BUGSWEEP_STORE_LOCAL_DIR first (the store's folder when it is one).
    With `push_branches`: the git branches block chosen, else the `bugsweep-branches` block, else
    BUGSWEEP_BRANCH_*. The model's key and the git token never leave the settings objects.
    """
    built = build_run(
        limits, endpoint=load_endpoint(model), provider=load_sandboxes(sandbox),
        escalate_to=[block.settings() for block in escalate_to or []],
    )  # fmt: skip
    artifacts, local_dir = load_store(store)
    return RunSetup.of(
        built, artifacts, local_dir, labels=run_labels(flow_run_id),
        branches=load_branches(branches) if push_branches else None,
    )  # fmt: skip


def run_labels(flow_run_id: str | None) -> dict[str, str]:
    """The labels a flow run's sandboxes carry: the run's id, so its hooks (and cleanups) find them."""
    return {FLOW_RUN_LABEL: flow_run_id} if flow_run_id else {}


def load_endpoint(model: ModelEndpoint | None) -> ModelSettings | None:
    """The model endpoint block chosen, else the `bugsweep-model` block; None when neither (then LLM_*)."""
    from blocks import MODEL_BLOCK, ModelEndpoint

    endpoint = model or load_block(ModelEndpoint, MODEL_BLOCK, MODEL_BLOCK)
    return endpoint.settings() if endpoint else None


def load_sandboxes(sandbox: SandboxName | None) -> SandboxProvider:
    """The sandbox provider of the backend chosen (else BUGSWEEP_SANDBOX_BACKEND, else local), its saved block's
    settings over BUGSWEEP_SANDBOX_*; on a local machine, the sandboxes dead processes left there are removed
    first."""
    from blocks import LOCAL_SANDBOX_BLOCK, RUNTIME_SANDBOX_BLOCK, LocalSandbox, RuntimeSandbox

    if backend_of(sandbox) == "local":
        local = load_block(LocalSandbox, LOCAL_SANDBOX_BLOCK, LOCAL_SANDBOX_BLOCK)
        provider = sandbox_provider("local", saved_limits=local.saved_limits() if local else None)
        remove_dead_sandboxes(provider)
        return provider
    runtime = load_block(RuntimeSandbox, RUNTIME_SANDBOX_BLOCK, RUNTIME_SANDBOX_BLOCK)
    if runtime is None:
        return sandbox_provider("runtime")
    return sandbox_provider(
        "runtime", saved_limits=runtime.saved_limits(), saved_runtime=runtime.runtime_settings()
    )


def load_store(store: S3Bucket | None) -> tuple[ArtifactStore, Path]:
    """The artifact store (the bucket block chosen, else `bugsweep-artifacts`, else BUGSWEEP_STORE_URL) and the
    local folder run folders are written to first."""
    from prefect_aws import S3Bucket

    from blocks import STORE_BLOCK, bucket_store

    settings = StoreSettings()
    bucket = store or load_block(S3Bucket, STORE_BLOCK, STORE_BLOCK)
    artifacts = bucket_store(bucket, settings) if bucket else open_store(settings)
    local_dir = Path(
        artifacts.location if isinstance(artifacts, LocalStore) else settings.local_dir
    ).resolve()
    return artifacts, local_dir


def load_branches(block: GitBranches | None) -> BranchSettings:
    """Where branches go and the token: from the block chosen, else the `bugsweep-branches` block, else
    BUGSWEEP_BRANCH_*. The token is read from the block's Secret block here and nowhere else."""
    from pydantic import SecretStr

    from blocks import BRANCHES_BLOCK, GitBranches

    chosen = block or load_block(GitBranches, BRANCHES_BLOCK, BRANCHES_BLOCK)
    if chosen is None:
        return BranchSettings()
    token = chosen.token_value() or SecretStr("")
    return BranchSettings(**chosen.settings().model_dump(), token=token)


def remove_dead_sandboxes(provider: Any) -> None:
    """A run starting on a machine first removes the local sandboxes that dead processes left there (a worker and
    its runs killed together leave their overlay mounts, cgroups and folders behind)."""
    try:
        removed = provider.reap_stale()
    except Exception:  # never stop a run for a cleanup; the next one tries again
        log.warning("could not remove the sandboxes dead processes left", exc_info=True)
        return
    if removed:
        log.warning(
            "removed %d sandbox(es) dead processes left on this machine: %s", len(removed), ", ".join(removed)
        )


@contextlib.contextmanager
def model_endpoint(run: RunSetup) -> Iterator[RunSetup]:
    """The run with a reachable model: when no endpoint is configured, the embedded open model, for the block.
    Its configuration stays the one made before the embedded model's address was known."""
    if run.model.base_url:
        yield run
        return
    from bugsweep.embedded.server import ensure_embedded_model

    log.info("no model endpoint configured (block or LLM_BASE_URL): using the embedded open model")
    with ensure_embedded_model(progress=lambda message: log.info("%s", message)) as endpoint:
        yield dataclasses.replace(run, model=endpoint.serving(run.model))


def refuse_endless_reruns() -> None:
    """End a flow run that has already crashed CRASH_RERUNS times and was scheduled again (its process killed each
    time, e.g. out of memory): Failed, which no automation runs again."""
    from prefect.runtime import flow_run

    starts = int(flow_run.run_count or 0)
    if starts > 1 + CRASH_RERUNS:
        raise InfraError(
            f"this flow run crashed {starts - 1} times (its process was killed: out of memory, or its machine "
            f"lost); it is not run again after {CRASH_RERUNS} rerun(s): look at the worker's machine, then start "
            "a new run"
        )


def failed_state(exc: BugsweepError, message: str | None = None) -> State[Any]:
    """The final state of a flow run that ends in an outcome bugsweep expects (a task file with a bad line, a
    model or store that refuses, a sweep with tasks that could not run): Failed, its message the reason in one
    line, its data the error. Returned by the flow instead of raising, so that no traceback is logged for it
    (Prefect logs one for every exception a flow raises); a caller of the flow still gets the error raised."""
    from prefect.states import Failed

    why = (
        message
        or f"{'configuration' if isinstance(exc, ConfigError) else exc.kind} failure: {first_line(str(exc))}"
    )
    return Failed(message=why, data=exc)


def current_flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    return str(run_id) if run_id else None


# -- sandboxes in use, released by the flows' hooks --------------------------------------------------------------


class LiveSandboxes:
    """The sandboxes this process's flow runs hold right now.

    Each task releases its own sandbox in `finally`; this registry is the second line: a flow's on_failure,
    on_crashed and on_cancellation hooks release whatever its run still holds, whatever path ended it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_run: dict[str, list[Sandbox]] = {}

    def add(self, run_id: str | None, sandbox: Sandbox) -> None:
        with self._lock:
            self._by_run.setdefault(run_id or "", []).append(sandbox)

    def discard(self, run_id: str | None, sandbox: Sandbox) -> None:
        with self._lock:
            held = self._by_run.get(run_id or "", [])
            if sandbox in held:
                held.remove(sandbox)

    def held(self, run_id: str | None = None) -> list[Sandbox]:
        """The sandboxes one flow run holds; with no run id, those of every run in this process."""
        with self._lock:
            if run_id is None:
                return [s for held in self._by_run.values() for s in held]
            return list(self._by_run.get(run_id, []))

    @contextlib.contextmanager
    def held_by(self, run_id: str | None) -> Iterator[Callable[[Sandbox], None]]:
        """A task's `on_sandbox`: each sandbox it is given is held by flow run `run_id` until the block ends (the
        task has released it by then)."""
        held: list[Sandbox] = []

        def hold(sandbox: Sandbox) -> None:
            held.append(sandbox)
            self.add(run_id, sandbox)

        try:
            yield hold
        finally:
            for sandbox in held:
                self.discard(run_id, sandbox)

    def release_all(self, run_id: str | None) -> int:
        with self._lock:
            held = self._by_run.pop(run_id or "", [])
        for sandbox in held:
            sandbox.release()  # idempotent, never raises
        return len(held)


LIVE_SANDBOXES = LiveSandboxes()


def release_sandboxes(flow: Flow[..., Any], flow_run: FlowRun, state: State[Any]) -> None:
    """Flow hook (failure, crash, cancellation): release every sandbox the run still holds.

    In the flow's own process that is the in-memory registry. When the worker killed the process (a cancellation
    from the UI), the hook runs elsewhere and the registry is empty: then the sandbox backend is asked to delete
    what carries the run's label (Runtime), and the local backend reaps sandboxes whose owner process died.
    """
    run_id = str(flow_run.id)
    released = LIVE_SANDBOXES.release_all(run_id)
    log.warning(
        "flow run %s ended %s: released %d sandbox(es) it still held",
        flow_run.name,
        state.type.value,
        released,
    )
    if released:
        return
    if backend_of((flow_run.parameters or {}).get("sandbox")) == "runtime":
        try:
            provider = load_sandboxes("runtime")  # its saved block's key, else RUNTIME_API_KEY
            provider.cleanup({FLOW_RUN_LABEL: run_id})  # type: ignore[attr-defined]
        except Exception:  # a hook must never raise; the sandboxes' own lifetime limit is the last resort
            log.exception("could not clean up Runtime sandboxes of flow run %s", run_id)


#: The hooks every flow that holds sandboxes is declared with: `@flow(..., **RELEASE_SANDBOXES_HOOKS)`.
RELEASE_SANDBOXES_HOOKS: dict[str, Any] = {
    "on_failure": [release_sandboxes],
    "on_crashed": [release_sandboxes],
    "on_cancellation": [release_sandboxes],
}
