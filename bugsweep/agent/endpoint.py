"""A model endpoint as a shared resource: its name, how many requests it may hold at once, and whether it has
answered before. Plain Python; the Prefect layer hands in its own limits (tasks/endpoint_limits.py).

- `endpoint_name(settings)`: one name per endpoint (its host, path and model; never its key), the same on every
  machine for a remote endpoint and the machine's own for a server on its loopback (the embedded model).
- A request slot is taken around every request the model client makes (bugsweep.agent.model.ChatModel) and
  released when its answer came: where a limit on the endpoint applies. How slots are limited is chosen by whoever
  runs the client: `use_request_limits(factory)` sets it for this process (the flows hand in a Prefect global
  concurrency limit per endpoint, which every run on every machine shares through the server). Without one, the
  limit is `LocalLimits`: the endpoint's `max_concurrent_requests` and `max_requests_per_minute` within this one
  process only (`bugsweep solve`, `bugsweep demo`).
- `mark_answered` / `answered_before`: an endpoint that answered once in this process (or that the caller knows
  answered: a sweep checked it before it fanned out) and now refuses connections is having an outage (a server
  restarting): the client waits for it (`outage_wait_s`). One that never answered is a wrong address: a
  configuration error at once.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from bugsweep.runconfig import ModelFields

RequestSlot = Callable[[], AbstractContextManager[None]]
"""Taken around one request to an endpoint, released when its answer came."""
RequestLimits = Callable[["ModelFields"], RequestSlot]
"""How the requests to an endpoint are limited in this process: its request slot, from its settings."""

#: Characters Prefect does not allow in a name (a global concurrency limit's), replaced in endpoint names.
_NOT_IN_NAMES = re.compile(r"[/%&<>\s]+")
_LOOPBACK_HOSTS = {"localhost", "ip6-localhost"}


def _on_this_machine(host: str) -> bool:
    if host.lower() in _LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def endpoint_name(settings: ModelFields) -> str:
    """The endpoint's name: `llm:HOST[:PORT]:PATH:MODEL` (e.g. `llm:api.deepseek.com:v1:deepseek-chat`), made for
    a name Prefect accepts. A server on the loopback (the embedded model) is this machine's own, so its name
    carries the machine's: two machines' embedded models are two endpoints."""
    url = urlsplit(settings.base_url or "")
    host = url.hostname or "embedded"
    if _on_this_machine(host):
        host = f"{socket.gethostname()}.{host}"
    where = f"{host}:{url.port}" if url.port else host
    path = url.path.strip("/")
    name = ":".join(part for part in ("llm", where, path, settings.model) if part)
    return _NOT_IN_NAMES.sub(":", name)[:200]


class LocalLimits:
    """The endpoints' limits within this process: `max_concurrent_requests` requests at once (a semaphore per
    endpoint) and request starts spaced to `max_requests_per_minute`. What a run without Prefect gets."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[tuple[str, int, int], RequestSlot] = {}

    def __call__(self, settings: ModelFields) -> RequestSlot:
        key = (endpoint_name(settings), settings.max_concurrent_requests, settings.max_requests_per_minute)
        with self._lock:
            if key not in self._slots:
                self._slots[key] = _local_slot(
                    settings.max_concurrent_requests, settings.max_requests_per_minute
                )
            return self._slots[key]


def _local_slot(at_once: int, per_minute: int) -> RequestSlot:
    semaphore = threading.BoundedSemaphore(at_once) if at_once > 0 else None
    spacing_s = 60.0 / per_minute if per_minute > 0 else 0.0
    lock = threading.Lock()
    next_start = [0.0]

    @contextlib.contextmanager
    def slot() -> Iterator[None]:
        if spacing_s:
            with lock:
                start = max(next_start[0], time.monotonic())
                next_start[0] = start + spacing_s
            time.sleep(max(0.0, start - time.monotonic()))
        if semaphore is None:
            yield
            return
        with semaphore:
            yield

    return slot


_local = LocalLimits()
_limits: RequestLimits = _local
_limits_lock = threading.Lock()
_answered: set[str] = set()


def request_slot(settings: ModelFields) -> RequestSlot:
    """The request slot of this endpoint, from the limits this process uses (`use_request_limits`)."""
    return _limits(settings)


def local_limits() -> RequestLimits:
    """This process's own limits (what a run without Prefect gets); a factory handed in may fall back to them."""
    return _local


def use_request_limits(factory: RequestLimits | None) -> None:
    """Limit every model request made in this process from now on with `factory` (None: the local limits again)."""
    global _limits
    with _limits_lock:
        _limits = factory or _local


def mark_answered(settings: ModelFields) -> None:
    """The endpoint answered a request (any status): from now on, a refused connection is an outage."""
    _answered.add(endpoint_name(settings))


def answered_before(settings: ModelFields) -> bool:
    """Whether the endpoint answered in this process, or a caller said it had (`mark_answered`)."""
    return endpoint_name(settings) in _answered
