"""The agent loop: ask the model, run the tool calls it makes, append the results, until it calls finish or a
budget (turns, tokens, cost, wall time) runs out.

A reply without a usable tool call is a format error: the model gets the nudge or the error text, and after
`max_consecutive_format_errors` in a row the run stops. The history only grows at its end, so a server's prompt
cache reuses the previous prompt every turn; the exception is the context-length shortening, which elides the oldest
tool outputs when the endpoint says the conversation no longer fits. Everything else that changes what the model
sees is the policy's (policy.py). Tool calls written as text are recovered by the model client (model.py) for every
model: one that sends native tool calls never reaches that code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bugsweep.agent import prompts
from bugsweep.agent.conversation import Conversation, StopRun
from bugsweep.agent.history import for_history, shorten_oldest_tool_outputs
from bugsweep.agent.model import ContextLengthExceeded, ModelReply, ToolCall, Usage, retries_reported
from bugsweep.agent.policy import Policy, make_policy
from bugsweep.agent.tools import Toolbox, ToolOutcome, short
from bugsweep.agent.trajectory import Trajectory
from bugsweep.agent.types import AgentEvent, AgentProgress, AgentResult, Model, StopReason
from bugsweep.sandbox.base import Sandbox
from bugsweep.settings import AgentSettings

__all__ = ["AgentEvent", "AgentProgress", "AgentResult", "AgentRun", "Model", "StopReason", "run_agent"]


def run_agent(
    task: str,
    sandbox: Sandbox,
    model: Model,
    settings: AgentSettings | None = None,
    *,
    on_event: Callable[[AgentEvent], None] | None = None,
    trajectory_path: Path | None = None,
    test_command: str | None = None,
    protected_paths: Iterable[str] = (),
    policy: Policy | None = None,
    progress: AgentProgress | None = None,
    meta: dict[str, Any] | None = None,
) -> AgentResult:
    """Let the model work on `task` in `sandbox` until it finishes or a budget stops it.

    `test_command` is mentioned to the model in the first message; `protected_paths` (repo-relative) are refused by
    edit_file in addition to `settings.protected_globs`. `policy` defaults to the one `settings.policy` names;
    `progress`, when given, is kept up to date (turns, tokens, cost, time), so a caller whose run is interrupted
    still has them. `meta` is recorded in the trajectory's first event too (the run's configuration and its digest,
    bugsweep.runconfig). Raises ModelUnavailable, ConfigError or a SandboxError; the trajectory is saved before any of
    them (or an interruption) propagates.
    """
    settings = settings or AgentSettings()
    key = getattr(getattr(model, "settings", None), "api_key", None)
    trajectory = Trajectory(trajectory_path, secrets=[key.get_secret_value()] if key else [])
    limit = settings.max_wall_s
    toolbox = Toolbox(
        sandbox,
        settings,
        protected_paths=protected_paths,
        time_left=lambda: None if limit is None else limit - trajectory.elapsed(),
        test_command=test_command,
    )
    policy, progress = policy or make_policy(settings.policy), progress or AgentProgress()
    return AgentRun(
        task=task,
        model=model,
        settings=settings,
        policy=policy,
        toolbox=toolbox,
        trajectory=trajectory,
        progress=progress,
        on_event=on_event,
        test_command=test_command,
        meta=meta or {},
    ).run()


@dataclass(eq=False, kw_only=True)
class AgentRun(Conversation):
    """One run of the loop: its conversation (conversation.py), counters and budgets. Policies get it at their
    hooks."""

    task: str
    model: Model
    policy: Policy
    toolbox: Toolbox
    test_command: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    """More for the trajectory's `meta` event: the run's configuration and its digest."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    summary: str = ""

    def __post_init__(self) -> None:
        # A progress object counts this run of the loop only, from zero.
        used = self.progress
        used.policy, used.turns, used.usage, used.cost_usd = self.policy.name, 0, Usage(), 0.0
        used.started, used.ended = self.trajectory.started, None

    def run(self) -> AgentResult:
        try:
            with retries_reported(self.model, self._on_retry):
                self._start()
                while True:
                    if over := self.progress.over_budget(self.settings, self.turn, self.trajectory.elapsed()):
                        raise StopRun(*over)
                    self.policy.before_request(self)
                    if self._turn():
                        raise StopRun("finished", "the model called finish")
        except StopRun as stop:
            return self._finish(*stop.args)
        except BaseException as exc:
            self.progress.ended = time.monotonic()
            self.trajectory.add("crash", turn=self.turn, error=type(exc).__name__, message=str(exc)[:2000])
            self.trajectory.save()
            self.emit("error", detail=f"{type(exc).__name__}: {short(str(exc), 200)}")
            raise

    def _start(self) -> None:
        self.tools = self.toolbox.schemas(short_files_whole=self.policy.reads_short_files_whole)
        self.trajectory.add(
            "meta",
            model=self.model.name,
            base_url=getattr(getattr(self.model, "settings", None), "base_url", None),
            policy=self.policy.name,
            task=self.task,
            test_command=self.test_command,
            workdir=self.toolbox.workdir,
            settings=self.settings.model_dump(mode="json"),
            tools=self.tools,
            **self.meta,
        )
        self.append({"role": "system", "content": prompts.system_prompt(self.toolbox.workdir)})
        files, more = self.toolbox.list_files()
        first = prompts.first_user_message(self.task, self.test_command, self.toolbox.workdir, files, more)
        self.append({"role": "user", "content": first})
        self.policy.start(self)
        self.trajectory.save()

    def _turn(self) -> bool:
        """One model reply and its tool calls. True when the model called finish."""
        reply = self._complete()
        progress = self._count(reply)
        self.messages.append(for_history(reply.message))
        self.trajectory.add(
            "model_reply",
            turn=self.turn,
            total_tokens=progress.usage.total_tokens,
            cost_usd=progress.cost_usd,
            **reply.record(),
        )
        self.trajectory.save()
        self.emit("model", detail=f"{len(reply.tool_calls)} tool call(s)", recovered=reply.recovered)
        if self.policy.after_reply(self, reply):
            return False
        if not reply.tool_calls:
            self.no_tool_call(reply.content)
            return False

        usable = finished = False
        recovered_results: list[str] = []
        for call in reply.tool_calls:
            outcome = self._call_tool(call)
            usable = usable or not outcome.format_error
            if call.recovered:
                recovered_results.append(prompts.recovered_result(call.name, outcome.content))
            else:
                self.append(
                    {"role": "tool", "tool_call_id": call.id, "content": outcome.content}, result=True
                )
            self.trajectory.save()
            if outcome.finished:
                self.summary, finished = outcome.summary, True
                break  # calls after finish are not run
        if recovered_results:
            # Calls written as text have no tool_call_id to answer: their results come back as one user message,
            # valid on every server, and the model's turn stays as written (so the prompt cache holds).
            self.append({"role": "user", "content": "\n\n".join(recovered_results)}, result=True)
            self.trajectory.save()
        if finished:
            return True
        if usable:
            self.usable_reply()
        else:
            self.format_error("no usable tool call in the reply")
        return False

    def _count(self, reply: ModelReply) -> AgentProgress:
        """One more turn, with the reply's tokens and cost: every model call counts so (the loop's replies and a
        policy's samples alike)."""
        self.turn += 1
        progress = self.progress
        progress.turns, progress.usage = self.turn, progress.usage + reply.usage
        progress.cost_usd = self.model.cost_usd(progress.usage)
        return progress

    def _call_tool(self, call: ToolCall) -> ToolOutcome:
        started = time.monotonic()
        outcome = self.toolbox.call(call.name, call.arguments)
        outcome = self.policy.after_tool(self, call, outcome)
        self.record_tool(call, outcome, time.monotonic() - started)
        return outcome

    def _complete(self) -> ModelReply:
        """The model's reply; when the conversation no longer fits, the oldest tool outputs are shortened first."""
        while True:
            try:
                return self.model.complete(self.messages, self.tools)
            except ContextLengthExceeded as exc:
                elided = shorten_oldest_tool_outputs(self.messages, self.result_indices)
                if not elided:
                    why = f"the conversation no longer fits the model's context window ({exc})"
                    raise StopRun("max_tokens", why) from None
                self.trajectory.add(
                    "context_shortened", turn=self.turn, elided_messages=elided, error=str(exc)[:500]
                )
                self.trajectory.save()
                self.emit("error", detail=f"context window full: elided {len(elided)} old tool output(s)")

    # -- what policies use to change the conversation ----------------------------------------------------------
    def sample(self, messages: list[dict[str, Any]], *, temperature: float, seed: int) -> ModelReply | None:
        """One more reply to `messages` (an earlier state of the conversation) at `temperature`, for a policy that
        tries several answers to one request. It counts as a turn, and its tokens and cost as any reply's; it is
        recorded as a `model_sample` event and does not enter the conversation. None when a budget is used up or
        the conversation no longer fits."""
        if self.progress.over_budget(self.settings, self.turn, self.trajectory.elapsed()):
            return None
        try:
            reply = self.model.complete(messages, self.tools, temperature=temperature, seed=seed)
        except ContextLengthExceeded:
            return None
        progress = self._count(reply)
        self.trajectory.add(
            "model_sample",
            turn=self.turn,
            temperature=temperature,
            seed=seed,
            total_tokens=progress.usage.total_tokens,
            cost_usd=progress.cost_usd,
            **reply.record(),
        )
        self.trajectory.save()
        self.emit("model", detail=f"sample at temperature {temperature}")
        return reply

    def _on_retry(self, attempt: int, exc: BaseException, sleep: float) -> None:
        what, sleep = f"{type(exc).__name__}: {short(str(exc), 120)}", round(sleep, 3)
        self.trajectory.add("model_retry", turn=self.turn, attempt=attempt, error=what, sleep_s=sleep)
        self.emit(
            "error", detail=f"model endpoint failed (attempt {attempt}), retrying in {sleep:.1f} s: {what}"
        )

    def _finish(self, reason: StopReason, detail: str) -> AgentResult:
        used = self.progress
        used.ended = time.monotonic()
        counts = (self.turn, used.usage, used.cost_usd, used.wall_s)
        result = AgentResult(reason, self.summary, *counts, [], self.messages, detail, self.policy.name)
        self.trajectory.add("stop", turn=self.turn, **result.record())
        self.trajectory.save()
        self.emit("stop", detail=f"{reason}: {detail}")
        result.trajectory = self.trajectory.events
        return result
