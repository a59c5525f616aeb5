"""`bugsweep model check`: does an OpenAI-compatible endpoint return tool calls the agent can use, and how fast is it?

Sends a few small tool-calling requests with the agent's own system prompt and tools (so the probe measures what a
run will meet) and sorts each reply into one of three outcomes:
- native: the reply carries `tool_calls` naming one of the tools, with JSON-object arguments;
- text: no `tool_calls`, but the reply text holds a call that `recover_text_tool_calls` (the agent loop's recovery)
  finds, so runs still work, a little less reliably;
- none: neither, so the agent cannot work with this endpoint as configured.
Speed comes from llama.cpp's `timings` field when the server sends it (prompt and generation tokens per second),
otherwise from usage and wall time (end-to-end, a lower bound).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from bugsweep.agent import prompts
from bugsweep.agent.model import recover_text_tool_calls
from bugsweep.errors import ConfigError, ModelUnavailable

Outcome = Literal["native", "text", "none"]


@dataclass
class ProbeReply:
    """One probe request and what came back."""

    name: str
    outcome: Outcome
    tool: str | None
    arguments: str | None
    content: str
    prompt_tokens: int
    completion_tokens: int
    wall_s: float
    prompt_ms: float | None = None
    """From llama.cpp `timings`: time spent on the uncached part of the prompt."""
    prompt_n: int | None = None
    predicted_ms: float | None = None
    predicted_n: int | None = None


@dataclass
class CheckResult:
    base_url: str
    model: str
    replies: list[ProbeReply] = field(default_factory=list)

    @property
    def verdict(self) -> Outcome:
        """native if every reply was native; text if every reply was usable and some needed recovery; else none."""
        outcomes = {reply.outcome for reply in self.replies}
        if not outcomes or "none" in outcomes:
            return "none"
        return "text" if "text" in outcomes else "native"

    def count(self, outcome: Outcome) -> int:
        return sum(reply.outcome == outcome for reply in self.replies)

    @property
    def prompt_tps(self) -> float | None:
        """Prompt tokens per second over the uncached prompt tokens (llama.cpp timings only)."""
        timed = [r for r in self.replies if r.prompt_ms and r.prompt_n]
        if not timed:
            return None
        return sum(r.prompt_n or 0 for r in timed) / (sum(r.prompt_ms or 0 for r in timed) / 1000)

    @property
    def generation_tps(self) -> float | None:
        """Generation tokens per second: llama.cpp timings if sent, else completion tokens over wall time."""
        timed = [r for r in self.replies if r.predicted_ms and r.predicted_n]
        if timed:
            return sum(r.predicted_n or 0 for r in timed) / (sum(r.predicted_ms or 0 for r in timed) / 1000)
        wall = sum(r.wall_s for r in self.replies)
        tokens = sum(r.completion_tokens for r in self.replies)
        return tokens / wall if wall > 0 and tokens else None

    @property
    def speed_source(self) -> str:
        return (
            "server timings"
            if any(r.predicted_ms for r in self.replies)
            else "usage / wall time (end to end)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "model": self.model,
            "verdict": self.verdict,
            "native": self.count("native"),
            "text": self.count("text"),
            "none": self.count("none"),
            "prompt_tokens_per_s": self.prompt_tps,
            "generation_tokens_per_s": self.generation_tps,
            "speed_source": self.speed_source,
            "replies": [reply.__dict__ for reply in self.replies],
        }


def probe_conversations(repo_dir: str = prompts.REPO_DIR) -> list[tuple[str, list[dict[str, Any]]]]:
    """Small agent-like conversations, each of which calls for a tool call as the next reply."""
    system = {"role": "system", "content": prompts.system_prompt(repo_dir)}
    task = prompts.first_user_message(
        "tests/test_calc.py fails: add(2, 3) returns -1. Fix the code.", "python -m pytest -q", repo_dir
    )
    earlier_call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_probe_1",
                "type": "function",
                "function": {"name": "run", "arguments": json.dumps({"command": "python -m pytest -q"})},
            }
        ],
    }
    test_output = (
        "exit code 1\nF.                                                                       [100%]\n"
        "FAILED tests/test_calc.py::test_add - assert -1 == 5\n 1 failed, 1 passed in 0.03s"
    )
    return [
        ("first turn", [system, {"role": "user", "content": task}]),
        (
            "after a tool result",
            [
                system,
                {"role": "user", "content": task},
                earlier_call,
                {"role": "tool", "tool_call_id": "call_probe_1", "content": test_output},
            ],
        ),
        ("read a named file", [system, {"role": "user", "content": "Show me what calc.py contains."}]),
    ]


def classify(message: dict[str, Any], tool_names: set[str]) -> tuple[Outcome, str | None, str | None]:
    """The outcome of one assistant message, and the first usable call's tool and arguments."""
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        name, arguments = function.get("name"), function.get("arguments")
        if name in tool_names and _is_json_object(arguments):
            return "native", name, arguments if isinstance(arguments, str) else json.dumps(arguments)
    for recovered in recover_text_tool_calls(message.get("content") or ""):
        if recovered.name in tool_names and _is_json_object(recovered.arguments):
            return "text", recovered.name, recovered.arguments
    return "none", None, None


def _is_json_object(arguments: Any) -> bool:
    if isinstance(arguments, dict):
        return True
    try:
        return isinstance(json.loads(arguments), dict)
    except (TypeError, ValueError):
        return False


def check_endpoint(
    base_url: str, model: str, api_key: str = "", max_tokens: int = 256, timeout_s: float = 600.0
) -> CheckResult:
    """Send the probe conversations to `base_url` (…/v1) and classify the replies. Raises on HTTP failure."""
    tools = prompts.tool_schemas(command_timeout_s=300, output_tail_chars=6000, read_file_max_chars=20000)
    tool_names = {tool["function"]["name"] for tool in tools}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    result = CheckResult(base_url=base_url, model=model)
    url = base_url.rstrip("/") + "/chat/completions"
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        for name, messages in probe_conversations():
            body = {
                "model": model,
                "messages": messages,
                "tools": tools,
                "temperature": 0,
                "max_tokens": max_tokens,
            }
            started = time.monotonic()
            try:
                response = client.post(url, json=body)
            except httpx.HTTPError as exc:
                raise ModelUnavailable(f"{url} did not answer: {exc}") from exc
            wall = time.monotonic() - started
            if response.status_code in (400, 401, 403, 404):
                raise ConfigError(
                    f"{url} refused the request ({response.status_code}): {response.text[:300]}"
                )
            if response.status_code >= 300:
                raise ModelUnavailable(f"{url} answered {response.status_code}: {response.text[:300]}")
            data = response.json()
            message = data["choices"][0]["message"]
            outcome, tool, arguments = classify(message, tool_names)
            usage = data.get("usage") or {}
            timings = data.get("timings") or {}
            result.replies.append(
                ProbeReply(
                    name=name,
                    outcome=outcome,
                    tool=tool,
                    arguments=arguments,
                    content=(message.get("content") or "")[:500],
                    prompt_tokens=int(usage.get("prompt_tokens") or 0),
                    completion_tokens=int(usage.get("completion_tokens") or 0),
                    wall_s=wall,
                    prompt_ms=timings.get("prompt_ms"),
                    prompt_n=timings.get("prompt_n"),
                    predicted_ms=timings.get("predicted_ms"),
                    predicted_n=timings.get("predicted_n"),
                )
            )
    return result


VERDICT_TEXT = {
    "native": "tool calls come back native (tool_calls): the agent works as intended",
    "text": "tool calls come back as text that the agent recovers: runs work, a little less reliably",
    "none": "no usable tool calls: the agent cannot work with this endpoint as configured",
}
