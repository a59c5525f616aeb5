"""The agent's small types, in one place: what the loop needs of a model, what it reports while it runs, what it
returns, and the progress it keeps reachable for a caller whose run is interrupted."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from bugsweep.agent.model import ModelReply, Usage
from bugsweep.settings import AgentSettings

StopReason = Literal["finished", "max_turns", "max_tokens", "max_cost", "max_wall", "format_errors"]


class Model(Protocol):
    """What the loop needs of a model client (ChatModel is the real one)."""

    @property
    def name(self) -> str: ...

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        *,
        temperature: float | None = None,
        seed: int | None = None,
    ) -> ModelReply: ...

    def cost_usd(self, usage: Usage) -> float: ...


@dataclass
class AgentEvent:
    """One line of progress for the command line or the Prefect logs."""

    kind: str
    """"model" (a reply arrived), "tool" (a tool call ran), "rewrite" (the policy answered an edit_file call with a
    request for the whole function), "nudge" (a reply had no tool call), "error" (a format error, a model retry, a
    shortened context) or "stop" (the run ended)."""
    turn: int
    tool: str | None = None
    short_arg: str | None = None
    """The command cut to ~80 characters, or the path."""
    exit_code: int | None = None
    """Exit code of `run`; None for other tools or a command that timed out."""
    ok: bool | None = None
    tokens: int = 0
    """Prompt plus completion tokens so far."""
    cost_usd: float = 0.0
    elapsed_s: float = 0.0
    detail: str | None = None
    """The first line of an error, the stop reason, or the finish summary."""
    recovered: bool = False
    """True for a tool call the model wrote as text."""


@dataclass
class AgentProgress:
    """What a run has used so far, updated by the loop after every reply. A caller that passes one in still has
    the turns, tokens, cost and time of a run that was interrupted (Ctrl-C, SIGTERM) or crashed."""

    policy: str = "plain"
    """The policy in force (policy.py)."""
    turns: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    started: float | None = None
    """Set when the loop starts (time.monotonic); None while the agent has not started."""
    ended: float | None = None
    """Set when the run stops, however it stops."""

    @property
    def wall_s(self) -> float:
        if self.started is None:
            return 0.0
        return (self.ended if self.ended is not None else time.monotonic()) - self.started

    def grade_fields(self) -> dict[str, Any]:
        """What a Grade records of the agent's run so far; nothing when the agent never started."""
        if self.started is None:
            return {}
        return {
            "policy": self.policy,
            "turns": self.turns,
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
            "cached_tokens": self.usage.cached_tokens,
            "cost_usd": self.cost_usd,
            "agent_wall_s": self.wall_s,
        }

    def over_budget(self, s: AgentSettings, turns: int, elapsed: float) -> tuple[StopReason, str] | None:
        """(stop reason, why) when a budget of `s` is used up, else None."""
        tokens = self.usage.total_tokens
        if turns >= s.max_turns:
            return "max_turns", f"reached max_turns={s.max_turns}"
        if s.max_total_tokens is not None and tokens >= s.max_total_tokens:
            return "max_tokens", f"used {tokens} tokens of max_total_tokens={s.max_total_tokens}"
        if s.max_cost_usd is not None and self.cost_usd >= s.max_cost_usd:
            return "max_cost", f"spent ${self.cost_usd:.4f} of max_cost_usd={s.max_cost_usd}"
        if s.max_wall_s is not None and elapsed >= s.max_wall_s:
            return "max_wall", f"ran {elapsed:.0f} s of max_wall_s={s.max_wall_s}"
        return None


@dataclass
class AgentResult:
    stop_reason: StopReason
    summary: str
    """The model's finish summary ("" when it never called finish)."""
    turns: int
    usage: Usage
    cost_usd: float
    wall_s: float
    trajectory: list[dict[str, Any]]
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The final conversation as last sent to the model."""
    detail: str = ""
    """Why the run stopped, in words (e.g. which budget and its value)."""
    policy: str = "plain"
    """The policy the run was under (policy.py): recorded in grade.json and every report."""

    def record(self) -> dict[str, Any]:
        """The result as the fields of the trajectory's stop event."""
        return {
            "stop_reason": self.stop_reason,
            "detail": self.detail,
            "summary": self.summary,
            "policy": self.policy,
            "turns": self.turns,
            "usage": self.usage.to_dict(),
            "cost_usd": self.cost_usd,
            "wall_s": round(self.wall_s, 4),
        }
