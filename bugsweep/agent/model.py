"""The model client: one chat completion per agent turn against any OpenAI-compatible endpoint.

Retries live here, with tenacity, because only the client can tell a passing failure from a permanent one, and
only here: a request retried here is the same turn, so an outage never costs the turns already made (the openai
client's own retries are off, and the solve step is never run again). 429, 5xx, timeouts and dropped connections
are retried with exponential backoff (honouring Retry-After), LLM_MAX_RETRIES times;
400/401/403/404, and an address where nothing listens (connection refused, unknown host), mean the settings are
wrong and raise ConfigError at once; but a refused connection to an endpoint that answered before
(bugsweep.agent.endpoint.answered_before: a server restarting) is an outage, retried with backoff for
LLM_OUTAGE_WAIT_S seconds. A context-length error raises
ContextLengthExceeded so that the loop can shorten the history and go on. Tool calls that a small model writes as text
instead of `tool_calls` are recovered here too (`recover_text_tool_calls`).

Every request holds a slot of its endpoint while it is sent and answered, never while a retry waits
(bugsweep.agent.endpoint: the endpoint's limit, shared through Prefect by every run that uses it).
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import openai
from openai.types.chat import ChatCompletion
from tenacity import RetryCallState, Retrying, retry_if_exception

from bugsweep.agent import endpoint
from bugsweep.errors import ConfigError, ModelUnavailable
from bugsweep.settings import ModelSettings

#: Longest Retry-After we honour; a server asking for longer gets this instead (the retry budget is finite anyway).
MAX_RETRY_AFTER_S = 120.0

_CONTEXT_PATTERNS = re.compile(
    r"context[ _-]?length|maximum context|context[ _-]?window|context size|exceed_context|too many tokens|"
    r"prompt is too long",
    re.IGNORECASE,
)


class ContextLengthExceeded(Exception):
    """The conversation no longer fits the model's context window. Not a ConfigError: the loop shortens and retries."""


@dataclass
class Usage:
    """Tokens of one reply, or summed over a run."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class ToolCall:
    """One tool call of a reply. `arguments` is the raw JSON text the model sent (it may be invalid)."""

    id: str
    name: str
    arguments: str
    recovered: bool = False
    """True when the model wrote the call as text and recover_text_tool_calls found it."""


@dataclass
class ModelReply:
    """One assistant reply: the message as it goes back into the history, its tool calls, usage and timing."""

    message: dict[str, Any]
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    latency_s: float = 0.0
    finish_reason: str | None = None
    attempts: int = 1

    @property
    def content(self) -> str:
        return self.message.get("content") or ""

    @property
    def recovered(self) -> bool:
        return any(call.recovered for call in self.tool_calls)

    def record(self) -> dict[str, Any]:
        """The reply as a trajectory event's fields."""
        return {
            "message": self.message,
            "usage": self.usage.to_dict(),
            "latency_s": round(self.latency_s, 4),
            "finish_reason": self.finish_reason,
            "attempts": self.attempts,
            "recovered_tool_calls": self.recovered,
        }


RetryHook = Callable[[int, BaseException, float], None]
"""Called before each retry with (attempt number, the error, seconds until the next try)."""


class ChatModel:
    """A chat-completions client for one endpoint and model, with retries and text tool-call recovery."""

    def __init__(
        self,
        settings: ModelSettings,
        *,
        on_retry: RetryHook | None = None,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
    ) -> None:
        if not settings.base_url:
            raise ConfigError(
                "no model endpoint: set LLM_BASE_URL (and LLM_MODEL, LLM_API_KEY), or start the embedded model"
            )
        self.settings = settings
        self.on_retry = on_retry
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.request_slot = endpoint.request_slot(settings)
        """Held around each request: the endpoint's limit (bugsweep.agent.endpoint)."""
        self._secret = settings.api_key.get_secret_value()
        # Our own retries (tenacity), so the client must not retry underneath them.
        self.client = openai.OpenAI(
            base_url=settings.base_url,
            api_key=self._secret or "none",
            max_retries=0,
            timeout=settings.request_timeout_s,
        )

    @property
    def name(self) -> str:
        return self.settings.model

    def cost_usd(self, usage: Usage) -> float:
        return self.settings.cost_usd(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)

    # -- the endpoint, checked before any work ------------------------------------------------------------------
    def check(self, timeout_s: float = 20.0, attempts: int = 3) -> list[str]:
        """Ask the endpoint which models it serves (GET /models: no tokens, no cost), so that a wrong base URL, key
        or model name fails in seconds, before any sandbox or install. Returns the served names. Raises ConfigError
        at once (nothing answers, the key is refused, no such path, the model is not among the served ones) or
        ModelUnavailable after `attempts` tries (the endpoint is down: timeouts, 429, 5xx). An endpoint without a
        models list (404 there) is asked for one token instead."""
        client = self.client.with_options(timeout=timeout_s)
        tries = 0

        def ask() -> list[str]:
            nonlocal tries
            tries += 1
            try:
                with self._answers():
                    return [m.id for m in client.models.list().data]
            except openai.NotFoundError:
                body = {
                    "model": self.settings.model,
                    "messages": [{"role": "user", "content": "ok"}],
                    "max_tokens": 1,
                }
                with self.request_slot(), self._answers():
                    client.post("/chat/completions", body=body, cast_to=ChatCompletion)
                return []

        retrying = self._retrying(max(1, min(attempts, self.settings.max_retries + 1)))
        try:
            served = retrying(ask)
        except openai.APIStatusError as exc:
            raise self._translate(exc, tries) from None
        except openai.APIConnectionError as exc:
            raise self._unreachable(exc, tries) from None
        if served and self.settings.model not in served:
            raise ConfigError(
                f"the model endpoint {self.settings.base_url} does not serve model {self.settings.model!r} "
                f"(it serves: {', '.join(served[:20])}): check LLM_MODEL or the model endpoint block"
            )
        return served

    def _unreachable(self, exc: openai.APIConnectionError, attempts: int) -> Exception:
        if self._outage(exc):
            return ModelUnavailable(
                f"the model endpoint {self.settings.base_url} answered before and has refused connections since, "
                f"for longer than LLM_OUTAGE_WAIT_S ({self.settings.outage_wait_s:.0f} s; {attempts} attempts): "
                f"{self._redact(str(exc.__cause__ or exc))}",
                retried=attempts - 1,
            )
        if _is_refused(exc):
            return ConfigError(
                f"nothing answers at the model endpoint {self.settings.base_url} (after {attempts} attempt: "
                f"{self._redact(str(exc.__cause__ or exc))}); check its base URL (LLM_BASE_URL or the model "
                "endpoint block) and that the server is running"
            )
        return ModelUnavailable(
            f"the model endpoint {self.settings.base_url} did not answer after {attempts} attempts: "
            f"{self._redact(str(exc))}",
            retried=attempts - 1,
        )

    # -- one completion ----------------------------------------------------------------------------------------
    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        temperature: float | None = None,
        seed: int | None = None,
    ) -> ModelReply:
        """One reply, at the settings' temperature unless `temperature` is given (`seed`: the server's sampling
        seed, for a reproducible sample). Raises ConfigError, ContextLengthExceeded, or ModelUnavailable after the
        retries."""
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": messages,
            "tools": tools,
            "max_tokens": self.settings.max_tokens_per_reply,
            "temperature": self.settings.temperature if temperature is None else temperature,
        }
        if seed is not None:
            body["seed"] = seed
        started = time.monotonic()
        retrying = self._retrying(self.settings.max_retries + 1)
        attempts = 0
        try:
            for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    # client.post rather than chat.completions.create: create() walks every message through
                    # the SDK's TypedDict transform, which costs milliseconds per turn and grows with the
                    # history (measured: most of the loop's own time at 200 turns). The body here is plain JSON
                    # already; errors, auth and the typed ChatCompletion reply are the same.
                    with self.request_slot(), self._answers():
                        response = self.client.post("/chat/completions", body=body, cast_to=ChatCompletion)
        except openai.APIStatusError as exc:
            raise self._translate(exc, attempts) from None
        except openai.APIConnectionError as exc:
            raise self._unreachable(exc, attempts) from None
        return self._reply(response, time.monotonic() - started, attempts)

    def _reply(self, response: Any, latency: float, attempts: int) -> ModelReply:
        if not getattr(response, "choices", None):
            raise ModelUnavailable(
                f"the model endpoint {self.settings.base_url} sent a reply without choices"
            )
        choice = response.choices[0]
        msg = choice.message
        message: dict[str, Any] = {"role": "assistant", "content": msg.content}
        calls: list[ToolCall] = []
        if msg.tool_calls:
            message["tool_calls"] = []
            for i, call in enumerate(msg.tool_calls):
                function = getattr(call, "function", None)
                name = getattr(function, "name", None) or ""
                arguments = getattr(function, "arguments", None) or ""
                if not isinstance(arguments, str):  # some servers send the arguments as an object
                    arguments = json.dumps(arguments)
                call_id = call.id or f"call_{i}_{uuid.uuid4().hex[:8]}"
                message["tool_calls"].append(
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                )
                calls.append(ToolCall(call_id, name, arguments))
        elif msg.content is None:
            message["content"] = ""
        # Provider extras (DeepSeek's reasoning_content, OpenRouter's reasoning) go back with the message:
        # DeepSeek's thinking mode rejects a tool-call turn whose reasoning_content was dropped.
        for key, value in (msg.model_extra or {}).items():
            if value is not None and key not in message:
                message[key] = value
        if not calls and msg.content:
            calls = recover_text_tool_calls(msg.content)
        usage = _usage(getattr(response, "usage", None))
        return ModelReply(message, calls, usage, latency, choice.finish_reason, attempts)

    # -- retries -----------------------------------------------------------------------------------------------
    def _retrying(self, attempts: int) -> Retrying:
        """Passing failures retried `attempts` times in all; an outage (`_outage`) for LLM_OUTAGE_WAIT_S seconds from
        its first refused connection, however many tries that takes."""
        outage_since: list[float] = []

        def stop(state: RetryCallState) -> bool:
            exc = state.outcome.exception() if state.outcome else None
            if exc is not None and self._outage(exc):
                outage_since[:1] = outage_since[:1] or [time.monotonic()]
                return time.monotonic() - outage_since[0] >= self.settings.outage_wait_s
            return state.attempt_number >= attempts

        return Retrying(
            retry=retry_if_exception(lambda exc: _is_transient(exc) or self._outage(exc)),
            stop=stop,
            wait=self._wait,
            before_sleep=self._before_sleep,
            reraise=True,
        )

    def _outage(self, exc: BaseException) -> bool:
        """A refused connection to an endpoint that answered before: a server restarting, not a wrong address."""
        return _is_refused(exc) and endpoint.answered_before(self.settings)

    @contextlib.contextmanager
    def _answers(self) -> Iterator[None]:
        """Record that the endpoint answered (any HTTP status) once a request got a response."""
        try:
            yield
        except openai.APIStatusError:
            endpoint.mark_answered(self.settings)
            raise
        endpoint.mark_answered(self.settings)

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = _retry_after(exc)
        if retry_after is not None:
            return retry_after
        # Exponential backoff with jitter, so that parallel runs hitting the same limit do not retry in lockstep.
        base = min(self.backoff_initial_s * 2 ** (state.attempt_number - 1), self.backoff_max_s)
        return base + random.uniform(0, self.backoff_initial_s)

    def _before_sleep(self, state: RetryCallState) -> None:
        if self.on_retry and state.outcome is not None:
            exc = state.outcome.exception()
            if exc is not None:
                sleep = state.next_action.sleep if state.next_action else 0.0
                self.on_retry(state.attempt_number, exc, float(sleep))

    def _translate(self, exc: openai.APIStatusError, attempts: int) -> Exception:
        status = exc.status_code
        detail = self._redact(_error_message(exc))
        where = self.settings.base_url
        if status == 400 and _CONTEXT_PATTERNS.search(detail):
            return ContextLengthExceeded(detail)
        if status == 401:
            return ConfigError(
                f"the model endpoint {where} rejected the API key (401): check LLM_API_KEY. {detail}"
            )
        if status == 403:
            return ConfigError(
                f"the model endpoint {where} refused access (403): check LLM_API_KEY and that it may use "
                f"model {self.settings.model!r}. {detail}"
            )
        if status == 404:
            return ConfigError(
                f"the model endpoint answered 404 for {where}/chat/completions with model "
                f"{self.settings.model!r}: check LLM_BASE_URL (it usually ends in /v1) and LLM_MODEL. {detail}"
            )
        if 400 <= status < 500 and status not in (408, 409, 429):
            return ConfigError(
                f"the model endpoint {where} rejected the request ({status}): {detail}. "
                f"Check LLM_MODEL and that the model supports tool calls."
            )
        return ModelUnavailable(
            f"the model endpoint {where} kept failing ({status}) after {attempts} attempts: {detail}",
            retried=attempts - 1,
        )

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text


@contextlib.contextmanager
def retries_reported(model: object, hook: RetryHook) -> Iterator[None]:
    """While the block runs, `hook` also hears of every retry of `model` (a ChatModel; any other: nothing)."""
    if not isinstance(model, ChatModel):
        yield
        return
    previous = model.on_retry

    def both(attempt: int, exc: BaseException, sleep: float) -> None:
        if previous:
            previous(attempt, exc, sleep)
        hook(attempt, exc, sleep)

    model.on_retry = both
    try:
        yield
    finally:
        model.on_retry = previous


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)) and not _is_refused(exc)


def _is_refused(exc: BaseException) -> bool:
    """A connection that could not be opened at all (refused, unknown host): a wrong URL, not a passing outage."""
    if isinstance(exc, openai.APITimeoutError):
        return False
    cause: BaseException | None = exc
    for _ in range(8):  # openai -> httpx -> httpcore -> the socket's error
        if cause is None:
            return False
        if isinstance(cause, (ConnectionRefusedError, socket.gaierror)):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _retry_after(exc: BaseException | None) -> float | None:
    """Seconds from a Retry-After (or retry-after-ms) header, when the server sent one."""
    response = getattr(exc, "response", None)
    if response is None:
        return None
    headers = response.headers
    try:
        if headers.get("retry-after-ms"):
            return min(float(headers["retry-after-ms"]) / 1000, MAX_RETRY_AFTER_S)
        if headers.get("retry-after"):
            return min(max(float(headers["retry-after"]), 0.0), MAX_RETRY_AFTER_S)
    except ValueError:
        return None  # an HTTP date: rare for APIs; fall back to our own backoff
    return None


def _error_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
    return str(exc.message)


def _usage(raw: Any) -> Usage:
    if raw is None:
        return Usage()
    details = getattr(raw, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) or 0
    if not cached:
        # DeepSeek reports its cache hits under its own name.
        cached = (getattr(raw, "model_extra", None) or {}).get("prompt_cache_hit_tokens") or 0
    return Usage(int(raw.prompt_tokens or 0), int(raw.completion_tokens or 0), int(cached))


# -- tool calls written as text ----------------------------------------------------------------------------------

_FENCED = re.compile(r"```[a-zA-Z_]*[ \t]*\n?(.*?)```", re.DOTALL)
_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def recover_text_tool_calls(content: str) -> list[ToolCall]:
    """Tool calls that a model wrote as text: ```json fenced blocks or <tool_call> tags holding
    {"name": ..., "arguments": {...}} (or "parameters"), one object or a list of them.

    Small open models do this when their chat template does not match what the server parses. Only objects that
    name a tool and carry arguments count, so ordinary JSON in a reply (a config file, say) is left alone.
    """
    blocks = [m.group(1) for m in _TAGGED.finditer(content)]
    if not blocks:
        blocks = [m.group(1) for m in _FENCED.finditer(content)]
    calls: list[ToolCall] = []
    for block in blocks:
        for obj in _json_objects(block.strip()):
            call = _as_call(obj)
            if call is not None:
                calls.append(call)
    return calls


def unreadable_text_tool_call(content: str) -> str | None:
    """The start of what looks like a tool call written as text that could not be read (a <tool_call> tag, or a
    fenced block naming a tool, whose JSON does not parse); None when the reply does not look like one."""
    blocks = [m.group(1) for m in _TAGGED.finditer(content)]
    blocks += [m.group(1) for m in _FENCED.finditer(content) if re.search(r'"name"\s*:', m.group(1))]
    for block in blocks:
        if not any(_as_call(obj) for obj in _json_objects(block.strip())):
            return block.strip()
    return None


def _json_objects(text: str) -> list[Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        # Trailing prose or several objects in a row: decode what parses, object by object.
        decoder, found, i = json.JSONDecoder(), [], text.find("{")
        while i != -1:
            try:
                value, end = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                i = text.find("{", i + 1)
                continue
            found.append(value)
            i = text.find("{", end)
        return found
    return value if isinstance(value, list) else [value]


def _as_call(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    arguments = obj.get("arguments", obj.get("parameters"))
    if not isinstance(name, str) or arguments is None:
        return None
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(f"text_{uuid.uuid4().hex[:10]}", name, raw, recovered=True)
