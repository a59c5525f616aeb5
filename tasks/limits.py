"""A model endpoint's limits as Prefect global concurrency limits, shared by every run on every machine.

The model client takes a request slot around each request (bugsweep.agent.endpoint); here that slot is a slot of
the global concurrency limit named after the endpoint (`endpoint_name`: host, path and model, never the key),
sized by its `max_concurrent_requests`, and, when the provider counts requests per minute
(`max_requests_per_minute`), a slot of a second limit whose slots decay at that rate (`rate_limit`). A run makes a
limit that is missing, and resizes one whose size differs from its settings (the last run started with another
size wins). The UI lists them under Concurrency; `prefect gcl ls` from a shell.

A slot is held with a lease of LEASE_S seconds that the run renews while it waits for the answer: a run killed
mid-request gives its slot back when the lease runs out. Outside a Prefect run (`bugsweep solve`) the core's own
limits apply, within the process (bugsweep.agent.endpoint.LocalLimits).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from bugsweep.agent import endpoint
from bugsweep.errors import InfraError

if TYPE_CHECKING:
    from bugsweep.agent.endpoint import RequestSlot
    from bugsweep.runconfig import ModelFields

#: Seconds a request's slot is leased for (the shortest Prefect allows), renewed while the request runs.
LEASE_S = 60.0
#: The name of an endpoint's requests-per-minute limit, after its own name.
RATE_SUFFIX = ":per-minute"
#: Seconds a slot is asked for again while the Prefect server answers "busy" (502, 503, 504, 408, 429) or cannot be
#: reached, on top of the Prefect client's own few retries: a SQLite-backed server under a night's load answers 503
#: for a while, and a task must wait for it rather than fail.
SERVER_BUSY_S = 300.0

T = TypeVar("T")


def _server_busy(exc: BaseException | None) -> bool:
    """Whether `exc`, or the error it was raised from, is the Prefect server being busy: Prefect's `concurrency()`
    raises ConcurrencySlotAcquisitionError from the server's 503 ("Unable to acquire concurrency slots ...: 503
    Service Unavailable"; seen failing a night's run under load)."""
    import httpx

    while exc is not None:
        if isinstance(exc, httpx.HTTPStatusError):
            return exc.response.status_code in (408, 429, 502, 503, 504)
        if isinstance(exc, httpx.TransportError):
            return True
        exc = exc.__cause__
    return False


def patiently(call: Callable[[], T]) -> T:
    """`call()`, asked again with growing waits for up to SERVER_BUSY_S while the Prefect server is busy."""
    for attempt in Retrying(
        retry=retry_if_exception(_server_busy),
        wait=wait_exponential(multiplier=1, max=15),
        stop=stop_after_delay(SERVER_BUSY_S),
        reraise=True,
    ):
        with attempt:
            return call()
    raise AssertionError("unreachable")  # pragma: no cover


_ensured: dict[tuple[str, str], tuple[int, float]] = {}
_ensured_lock = threading.Lock()


def in_a_prefect_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def ensure_limit(name: str, limit: int, slot_decay_per_second: float = 0.0) -> None:
    """The global concurrency limit `name` exists with this size (made or resized; once per process for one size)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.settings import PREFECT_API_URL

    key = (str(PREFECT_API_URL.value()), name)
    with _ensured_lock:
        if _ensured.get(key) == (limit, slot_decay_per_second):
            return
        try:
            with get_client(sync_client=True) as client:
                try:
                    patiently(
                        lambda: client.upsert_global_concurrency_limit_by_name(
                            name, limit, slot_decay_per_second
                        )
                    )
                except ObjectAlreadyExists:  # another run made it at the same moment: resize it if needed
                    patiently(
                        lambda: client.upsert_global_concurrency_limit_by_name(
                            name, limit, slot_decay_per_second
                        )
                    )
        except Exception as exc:
            raise InfraError(
                f"could not make or resize the concurrency limit {name!r} on the Prefect server: {exc}"
            ) from exc
        _ensured[key] = (limit, slot_decay_per_second)


def prefect_request_limits(settings: ModelFields) -> RequestSlot:
    """The request slot of this endpoint in a Prefect run: its global concurrency limit (and rate limit), made or
    resized first; outside a run, the process's own limits."""
    if not in_a_prefect_run():
        return endpoint.local_limits()(settings)
    name = endpoint.endpoint_name(settings)
    at_once, per_minute = settings.max_concurrent_requests, settings.max_requests_per_minute
    if at_once:
        ensure_limit(name, at_once)
    if per_minute:
        ensure_limit(name + RATE_SUFFIX, per_minute, slot_decay_per_second=per_minute / 60.0)

    @contextlib.contextmanager
    def slot() -> Iterator[None]:
        from prefect.concurrency.sync import concurrency, rate_limit

        if per_minute:
            patiently(lambda: rate_limit(name + RATE_SUFFIX, occupy=1))
        if not at_once:
            yield
            return
        with contextlib.ExitStack() as stack:
            patiently(
                lambda: stack.enter_context(
                    concurrency(name, occupy=1, lease_duration=LEASE_S, raise_on_lease_renewal_failure=False)
                )
            )
            yield

    return slot


def use_prefect_limits() -> None:
    """Every model request this process makes in a Prefect run takes its endpoint's slots from now on."""
    endpoint.use_request_limits(prefect_request_limits)
