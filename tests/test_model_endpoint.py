"""The model endpoint as a shared resource, in the client alone (no Prefect): its name, its limit on requests at
once within a process, and a refused connection after it answered (an outage) against one before (a wrong
address). The flows' limit shared through Prefect is tested in tests/test_flows.py and tests/test_fleet.py.

Stand-in: the scripted OpenAI-compatible server (real HTTP on 127.0.0.1), with a latency per answer and a count of
the requests it answers at once; stopped and started again on its port for an outage.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
from pydantic import SecretStr

from bugsweep.agent import endpoint
from bugsweep.agent.model import ChatModel
from bugsweep.errors import ConfigError, ModelUnavailable
from bugsweep.settings import ModelSettings
from tests.support.scripted_model import ScriptedModelServer, tool_call

MESSAGES = [{"role": "user", "content": "fix it"}]


def settings(server: ScriptedModelServer, **fields: Any) -> ModelSettings:
    return ModelSettings(
        base_url=server.base_url, model="scripted-model", api_key=SecretStr("sk-never-in-a-name"), **fields
    )


def test_an_endpoint_is_named_by_its_address_and_model_never_its_key_and_a_loopback_one_by_its_machine() -> (
    None
):
    remote = ModelSettings(
        base_url="https://api.deepseek.com/v1", model="deepseek/chat", api_key=SecretStr("sk-1")
    )
    assert endpoint.endpoint_name(remote) == "llm:api.deepseek.com:v1:deepseek:chat"
    assert endpoint.endpoint_name(remote.model_copy(update={"api_key": SecretStr("sk-2")})) == (
        endpoint.endpoint_name(remote)
    ), "one endpoint whatever key reaches it"
    assert not set("/%&<> ") & set(endpoint.endpoint_name(remote)), "a name Prefect accepts"
    here = ModelSettings(base_url="http://127.0.0.1:8012/v1", model="qwen")
    assert endpoint.endpoint_name(here) == f"llm:{socket.gethostname()}.127.0.0.1:8012:v1:qwen", (
        "the embedded model of this machine is not another machine's"
    )


def test_requests_beyond_the_endpoints_limit_wait_for_a_slot_in_one_process(scripted_model) -> None:
    server = scripted_model([], latency_s=0.3)
    model = ChatModel(settings(server, max_concurrent_requests=2))
    threads = [threading.Thread(target=model.complete, args=(MESSAGES, [])) for _ in range(6)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    took = time.monotonic() - started
    # the server records a span after its answer is sent: the last may lag the reply
    deadline = time.monotonic() + 5
    while len(server.spans) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.most_in_flight == 2
    assert len(server.spans) == 6 and took >= 0.9, "three rounds of two"
    unlimited = scripted_model([], latency_s=0.3)
    free = ChatModel(settings(unlimited, max_concurrent_requests=0))
    threads = [threading.Thread(target=free.complete, args=(MESSAGES, [])) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert unlimited.most_in_flight == 4, "0: no limit"


def test_a_refused_connection_before_the_endpoint_ever_answered_is_a_configuration_error_at_once() -> None:
    with socket.socket() as sock:  # a port where nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    model = ChatModel(ModelSettings(base_url=f"http://127.0.0.1:{port}/v1", model="m", outage_wait_s=60))
    started = time.monotonic()
    with pytest.raises(ConfigError, match="nothing answers"):
        model.complete(MESSAGES, [])
    assert time.monotonic() - started < 5


def test_a_server_that_answered_then_restarts_is_waited_for_and_the_turn_is_answered(scripted_model) -> None:
    """Connections refused for ~1.5 s after an answer: the same request is retried with backoff until the server is
    back (LLM_OUTAGE_WAIT_S), not failed as a wrong address."""
    server = scripted_model([tool_call("run", command="true"), tool_call("finish", summary="done")])
    retries: list[str] = []
    model = ChatModel(
        settings(server, outage_wait_s=30), on_retry=lambda n, exc, wait: retries.append(str(exc)),
        backoff_initial_s=0.3,
    )  # fmt: skip
    assert model.complete(MESSAGES, []).tool_calls[0].name == "run"
    server.stop()
    threading.Timer(1.5, server.start).start()

    reply = model.complete(MESSAGES, [])

    assert reply.tool_calls[0].name == "finish" and reply.attempts > 1
    assert retries, "retried while the server was down"


def test_an_outage_longer_than_the_wait_fails_as_infra_saying_how_long(scripted_model) -> None:
    server = scripted_model([])
    model = ChatModel(settings(server, outage_wait_s=1.5), backoff_initial_s=0.2)
    model.check()  # the endpoint answers once (GET /models)
    server.stop()
    started = time.monotonic()

    with pytest.raises(ModelUnavailable, match="LLM_OUTAGE_WAIT_S") as raised:
        ChatModel(settings(server, outage_wait_s=1.5), backoff_initial_s=0.2).complete(MESSAGES, [])

    assert 1.5 <= time.monotonic() - started < 10
    assert raised.value.kind == "infra" and raised.value.retried >= 1
    assert "sk-never-in-a-name" not in str(raised.value)


def test_a_caller_that_knows_the_endpoint_answered_makes_a_refusal_an_outage() -> None:
    """A sweep checked the endpoint before it fanned out: its runs on workers wait out a restart from their
    first request (bugsweep.agent.endpoint.mark_answered)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    checked = ModelSettings(
        base_url=f"http://127.0.0.1:{port}/v1", model="checked-by-the-sweep", outage_wait_s=0.5
    )
    endpoint.mark_answered(checked)
    with pytest.raises(ModelUnavailable, match="answered before"):
        ChatModel(checked, backoff_initial_s=0.1).complete(MESSAGES, [])


def test_a_slot_is_asked_for_again_while_the_prefect_server_is_busy_and_a_real_refusal_is_not() -> None:
    """tasks.limits.patiently: a 503 from the Prefect server (SQLite busy under a night's load) is waited out, also
    as Prefect's `concurrency()` raises it (ConcurrencySlotAcquisitionError from the 503); a 400 is the caller's
    mistake and raised at once, wrapped or not."""
    import httpx
    from prefect.concurrency._asyncio import ConcurrencySlotAcquisitionError

    from tasks.limits import patiently

    def answer(code: int) -> httpx.HTTPStatusError:
        request = httpx.Request("POST", "http://prefect/api/v2/concurrency_limits/increment-with-lease")
        return httpx.HTTPStatusError(
            str(code), request=request, response=httpx.Response(code, request=request)
        )

    calls: list[int] = []

    def busy_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise answer(503)
        return "slot"

    assert patiently(busy_once) == "slot" and len(calls) == 2

    def refused() -> str:
        calls.append(1)
        raise answer(400)

    calls.clear()
    with pytest.raises(httpx.HTTPStatusError):
        patiently(refused)
    assert len(calls) == 1

    def wrapped(code: int) -> ConcurrencySlotAcquisitionError:
        try:
            raise ConcurrencySlotAcquisitionError(
                f"Unable to acquire concurrency slots on ['llm']: {code}"
            ) from (answer(code))
        except ConcurrencySlotAcquisitionError as exc:
            return exc

    def busy_once_in_prefect() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise wrapped(503)
        return "slot"

    calls.clear()
    assert patiently(busy_once_in_prefect) == "slot" and len(calls) == 2

    def refused_in_prefect() -> str:
        calls.append(1)
        raise wrapped(400)

    calls.clear()
    with pytest.raises(ConcurrencySlotAcquisitionError):
        patiently(refused_in_prefect)
    assert len(calls) == 1
