"""The conversation of one run as the loop keeps it: the messages sent to the model, the record of every step
(the trajectory) and the progress events, and the count of replies in a row without a usable tool call.

AgentRun (loop.py) is a Conversation with a model, a toolbox and a policy; these methods are the part of AgentRun
that policies use to change what the model sees (policy.py). The history only grows at its end, except where a
policy takes out its newest messages (`drop_messages_from`), so the prefix a server has cached holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bugsweep.agent import prompts
from bugsweep.agent.model import ToolCall, unreadable_text_tool_call
from bugsweep.agent.tools import ToolOutcome, short
from bugsweep.agent.trajectory import Trajectory
from bugsweep.agent.types import AgentEvent, AgentProgress
from bugsweep.settings import AgentSettings


class StopRun(Exception):
    """The run ends: args are (stop reason, why in words)."""


@dataclass(eq=False, kw_only=True)
class Conversation:
    settings: AgentSettings
    trajectory: Trajectory
    progress: AgentProgress
    on_event: Callable[[AgentEvent], None] | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The conversation as it is sent to the model."""
    result_indices: list[int] = field(default_factory=list)
    """Indices of messages holding tool output: what the context-length shortening may elide."""
    turn: int = 0
    format_errors: int = 0

    def append(self, message: dict[str, Any], result: bool = False) -> None:
        """Add a message at the end (and to the trajectory); `result`: tool output the shortening may elide."""
        if result:
            self.result_indices.append(len(self.messages))
        self.messages.append(message)
        self.trajectory.add("message", turn=self.turn, message=message)

    def drop_messages_from(self, index: int) -> None:
        """Take messages[index:] out of the conversation (they are the newest, so the cached prefix holds)."""
        del self.messages[index:]
        while self.result_indices and self.result_indices[-1] >= index:
            self.result_indices.pop()

    def format_error(self, why: str) -> None:
        """Count a reply without a usable tool call; stops the run after too many in a row."""
        self.format_errors = n = self.format_errors + 1
        if n >= self.settings.max_consecutive_format_errors:
            raise StopRun("format_errors", f"{n} replies in a row without a usable tool call ({why})")

    def usable_reply(self) -> None:
        """The reply was usable: the count of format errors in a row starts again."""
        self.format_errors = 0

    def no_tool_call(self, content: str) -> None:
        """Answer a reply without a tool call: the nudge, or what was wrong with a tool call written as text."""
        self.format_error("the reply had no tool call")
        broken = unreadable_text_tool_call(content)
        self.append(
            {"role": "user", "content": prompts.unreadable_text_call(broken) if broken else prompts.NUDGE}
        )
        if broken is not None:
            self.emit("error", detail="a tool call written as text could not be read")
        else:
            self.emit("nudge", detail=prompts.NUDGE)
        self.trajectory.save()

    def record_tool(self, call: ToolCall, outcome: ToolOutcome, duration: float, **event: Any) -> None:
        """Record a tool call and its outcome in the trajectory, and show it as a progress event."""
        arguments = outcome.arguments if outcome.arguments is not None else call.arguments
        self.trajectory.add(
            "tool",
            turn=self.turn,
            id=call.id or None,
            name=call.name,
            arguments=arguments,
            recovered=call.recovered,
            duration_s=round(duration, 4),
            **outcome.record(),
        )
        detail = None if outcome.ok else short(outcome.content, 160)
        fields = {"short_arg": outcome.short_arg, "exit_code": outcome.exit_code, "detail": detail, **event}
        self.emit("tool", tool=call.name, ok=outcome.ok, recovered=call.recovered, **fields)

    def emit(self, kind: str, **fields: Any) -> None:
        """A progress event for the command line or the Prefect logs."""
        if self.on_event is not None:
            used, elapsed = self.progress, self.trajectory.elapsed()
            tokens, cost = used.usage.total_tokens, used.cost_usd
            self.on_event(
                AgentEvent(kind, self.turn, tokens=tokens, cost_usd=cost, elapsed_s=elapsed, **fields)
            )
