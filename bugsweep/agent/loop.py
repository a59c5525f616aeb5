"""The agent loop: ask the model, run the tool calls it makes, feed the results back, until it calls finish or a
budget runs out.

One turn is one model reply. Before each turn the budgets are checked (turns, total tokens, cost, wall time); after
each reply its tool calls run in order. A reply without a usable tool call is a format error: the model gets the nudge
or the error text, and after `max_consecutive_format_errors` of them in a row the run stops. The history only ever
grows at its end, so a server's prompt cache (llama.cpp) reuses the whole previous prompt every turn. The exceptions
touch only the last reply or the oldest outputs: a failed edit_file call, and (edit_style "whole_function", see
rewrite.py) an edit inside one function, are replaced by a note, and the context-length shortening replaces the
oldest tool outputs when the endpoint says the conversation no longer fits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from bugsweep.agent import prompts
from bugsweep.agent.model import (
    ChatModel,
    ContextLengthExceeded,
    ModelReply,
    ToolCall,
    Usage,
    unreadable_text_tool_call,
)
from bugsweep.agent.rewrite import FunctionSpan
from bugsweep.agent.tools import Toolbox, ToolOutcome, parse_arguments, short
from bugsweep.agent.trajectory import Trajectory
from bugsweep.sandbox.base import Sandbox
from bugsweep.settings import AgentSettings

StopReason = Literal["finished", "max_turns", "max_tokens", "max_cost", "max_wall", "format_errors"]


class Model(Protocol):
    """What the loop needs of a model client (ChatModel is the real one)."""

    @property
    def name(self) -> str: ...

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelReply: ...

    def cost_usd(self, usage: Usage) -> float: ...


@dataclass
class AgentEvent:
    """One line of progress for the command line or the Prefect logs."""

    kind: str
    """"model" (a reply arrived), "tool" (a tool call ran), "rewrite" (an edit_file call was answered with a request
    for the whole function), "nudge" (a reply had no tool call), "error" (a format error, a model retry, a
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


class _Stop(Exception):
    def __init__(self, reason: StopReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


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
) -> AgentResult:
    """Let the model work on `task` in `sandbox` until it finishes or a budget stops it.

    `test_command` is mentioned to the model in the first message; `protected_paths` (repo-relative) are refused by
    edit_file in addition to `settings.protected_globs`. Raises ModelUnavailable, ConfigError or a SandboxError;
    the trajectory is saved before any of them propagates.
    """
    return _AgentRun(
        task,
        sandbox,
        model,
        settings or AgentSettings(),
        on_event,
        trajectory_path,
        test_command,
        protected_paths,
    ).run()


class _AgentRun:
    def __init__(
        self,
        task: str,
        sandbox: Sandbox,
        model: Model,
        settings: AgentSettings,
        on_event: Callable[[AgentEvent], None] | None,
        trajectory_path: Path | None,
        test_command: str | None,
        protected_paths: Iterable[str],
    ) -> None:
        self.task = task
        self.model = model
        self.settings = settings
        self.on_event = on_event
        self.test_command = test_command
        secrets = []
        model_settings = getattr(model, "settings", None)
        if model_settings is not None and hasattr(model_settings, "api_key"):
            secrets.append(model_settings.api_key.get_secret_value())
        self.trajectory = Trajectory(trajectory_path, secrets=secrets)
        self.toolbox = Toolbox(
            sandbox,
            settings,
            protected_paths=protected_paths,
            time_left=self._wall_left,
            test_command=test_command,
        )
        self.tools = self.toolbox.schemas()
        self.messages: list[dict[str, Any]] = []
        self.result_indices: list[int] = []
        """Indices of messages holding tool output: what the context-length shortening may elide."""
        self.turn = 0
        self.usage = Usage()
        self.cost = 0.0
        self.format_errors = 0
        self.summary = ""
        self._last_outcome: ToolOutcome | None = None
        self.whole_functions = resolve_edit_style(settings.edit_style, model.name) == "whole_function"
        self.pending_rewrite: FunctionSpan | None = None
        """The function the last turn asked to be rewritten whole (edit_style "whole_function")."""
        self.rewrite_from = 0
        """Where the last rewrite request starts in `messages`."""
        self.failed_calls: dict[tuple[str, str], tuple[int, str]] = {}
        """Failed read_file/edit_file calls by (tool, arguments): the turn and the error, to recognise repeats."""

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(self) -> AgentResult:
        restore_hook = self._hook_retries()
        try:
            self._start()
            while True:
                self._check_budgets()
                if self._turn():
                    raise _Stop("finished", "the model called finish")
        except _Stop as stop:
            return self._finish(stop.reason, stop.detail)
        except BaseException as exc:
            self.trajectory.add("crash", turn=self.turn, error=type(exc).__name__, message=str(exc)[:2000])
            self.trajectory.save()
            self._emit("error", detail=f"{type(exc).__name__}: {short(str(exc), 200)}")
            raise
        finally:
            restore_hook()

    def _start(self) -> None:
        self.trajectory.add(
            "meta",
            model=self.model.name,
            base_url=getattr(getattr(self.model, "settings", None), "base_url", None),
            task=self.task,
            test_command=self.test_command,
            workdir=self.toolbox.workdir,
            settings=self.settings.model_dump(mode="json"),
            tools=self.tools,
        )
        self._append({"role": "system", "content": prompts.system_prompt(self.toolbox.workdir)})
        files, more = self.toolbox.list_files()
        first = prompts.first_user_message(self.task, self.test_command, self.toolbox.workdir, files, more)
        self._append({"role": "user", "content": first})
        self.trajectory.save()

    def _turn(self) -> bool:
        """One model reply and its tool calls. True when the model called finish."""
        reply = self._complete()
        self.turn += 1
        self.usage = self.usage + reply.usage
        self.cost = self.model.cost_usd(self.usage)
        self.messages.append(for_history(reply.message))
        self.trajectory.add(
            "model_reply",
            turn=self.turn,
            message=reply.message,
            usage=reply.usage.to_dict(),
            latency_s=round(reply.latency_s, 4),
            finish_reason=reply.finish_reason,
            attempts=reply.attempts,
            recovered_tool_calls=reply.recovered,
            total_tokens=self.usage.total_tokens,
            cost_usd=self.cost,
        )
        self.trajectory.save()
        self._emit("model", detail=f"{len(reply.tool_calls)} tool call(s)", recovered=reply.recovered)

        pending, self.pending_rewrite = self.pending_rewrite, None
        if pending is not None:
            # The answer is a reply without tool calls. Asked once: tool calls sent instead (an edit_file call
            # included) run as sent.
            if not reply.tool_calls:
                self._answer_rewrite(pending, reply.content)
                return False
        elif self.whole_functions and len(reply.tool_calls) == 1 and reply.tool_calls[0].name == "edit_file":
            span = self.toolbox.function_to_rewrite(reply.tool_calls[0].arguments)
            if span is not None:
                if not self._edit_passes_tests(reply.tool_calls[0], span):
                    self._request_rewrite(span, reply.tool_calls[0])
                return False

        if not reply.tool_calls:
            self._format_error("the reply had no tool call")
            broken = unreadable_text_tool_call(reply.content)
            if broken is not None:
                self._append({"role": "user", "content": prompts.unreadable_text_call(broken)})
                self._emit("error", detail="a tool call written as text could not be read")
            else:
                self._append({"role": "user", "content": prompts.NUDGE})
                self._emit("nudge", detail=prompts.NUDGE)
            self.trajectory.save()
            return False

        usable = False
        finished = False
        recovered_results: list[str] = []
        for call in reply.tool_calls:
            outcome = self._call_tool(call)
            usable = usable or not outcome.format_error
            if call.recovered:
                recovered_results.append(prompts.recovered_result(call.name, outcome.content))
            else:
                self._append(
                    {"role": "tool", "tool_call_id": call.id, "content": outcome.content}, result=True
                )
            self.trajectory.save()
            if outcome.finished:
                self.summary = outcome.summary
                finished = True
                break  # calls after finish are not run
        if recovered_results:
            # The model wrote its calls as text, so there is no tool_call_id to answer: the assistant message stays
            # exactly as the model wrote it, and the results come back as one user message. This is valid on every
            # server (OpenAI checks that each tool message answers a tool_calls id; llama.cpp renders the history
            # with the model's own template), and it never rewrites the model's turn, so the prompt cache holds.
            self._append({"role": "user", "content": "\n\n".join(recovered_results)}, result=True)
            self.trajectory.save()
        if finished:
            return True
        self._forget_failed_edit(reply.tool_calls)
        if usable:
            self.format_errors = 0
        else:
            self._format_error("no usable tool call in the reply")
        return False

    def _call_tool(self, call: ToolCall) -> ToolOutcome:
        started = time.monotonic()
        outcome = self.toolbox.call(call.name, call.arguments)
        duration = time.monotonic() - started
        outcome = self._mark_repeat(call, outcome)
        self._last_outcome = outcome
        arguments = outcome.arguments if outcome.arguments is not None else call.arguments
        self._record_tool(call.id, call.name, arguments, outcome, call.recovered, duration)
        self._emit(
            "tool",
            tool=call.name,
            short_arg=outcome.short_arg,
            exit_code=outcome.exit_code,
            ok=outcome.ok,
            detail=None if outcome.ok else short(outcome.content, 160),
            recovered=call.recovered,
        )
        return outcome

    def _record_tool(
        self,
        call_id: str | None,
        name: str,
        arguments: Any,
        outcome: ToolOutcome,
        recovered: bool,
        duration: float,
    ) -> None:
        self.trajectory.add(
            "tool",
            turn=self.turn,
            id=call_id,
            name=name,
            arguments=arguments,
            ok=outcome.ok,
            format_error=outcome.format_error,
            exit_code=outcome.exit_code,
            timed_out=outcome.timed_out,
            recovered=recovered,
            duration_s=round(duration, 4),
        )

    def _forget_failed_edit(self, calls: list[ToolCall]) -> None:
        """Take a failed edit_file call out of the conversation, keeping only what went wrong.

        Seen on the 1.5B model: once a wrong `old` text is in the history, the model sends it again and again,
        whatever the error says. The reply and its result are the last two messages, so replacing them with one
        note keeps the prompt prefix (and the server's cache) intact; the trajectory keeps the whole call.
        """
        if len(calls) != 1 or calls[0].recovered or calls[0].name != "edit_file":
            return
        last = self.messages[-1]
        if last.get("role") != "tool" or not self._last_outcome or self._last_outcome.ok:
            return
        if self._last_outcome.format_error:
            return
        self._drop_messages_from(len(self.messages) - 2)
        note = prompts.failed_edit_note(self._last_outcome.content)
        self._append({"role": "user", "content": note}, result=True)
        self.trajectory.add("forgotten", turn=self.turn, detail="failed edit_file call replaced by a note")
        self.trajectory.save()

    def _edit_passes_tests(self, call: ToolCall, span: FunctionSpan) -> bool:
        """Whole-function edits: try the edit as sent first, and keep it when the tests pass with it.

        Seen on the 1.5B model: a right one-line fix, answered with the request for the whole function, came back
        as the function copied unchanged from the file. So the request is only for edits that leave the tests
        failing (or that fail): those are undone without a trace in the conversation.
        """
        if not self.test_command:
            return False
        before = self.toolbox.file_text(span.path)
        started = time.monotonic()
        outcome = self.toolbox.call("edit_file", call.arguments)
        if not outcome.ok or before is None:
            return False
        tests = self.toolbox.run(self.test_command)
        passed = tests.exit_code == 0
        self.trajectory.add(
            "edit_tried", turn=self.turn, function=span.name, tests_exit_code=tests.exit_code, kept=passed
        )
        if not passed:
            self.toolbox.sandbox.files.write(*before)
            return False
        self._record_tool(
            call.id, call.name, outcome.arguments, outcome, call.recovered, time.monotonic() - started
        )
        self._emit("tool", tool=call.name, short_arg=outcome.short_arg, ok=True, recovered=call.recovered)
        # edit_done's last line asks for the test run that has just passed.
        content = outcome.content.rsplit("\n", 1)[0] + "\n" + prompts.tests_pass_after_edit(self.test_command)
        if call.recovered:
            self._append(
                {"role": "user", "content": prompts.recovered_result(call.name, content)}, result=True
            )
        else:
            self._append({"role": "tool", "tool_call_id": call.id, "content": content}, result=True)
        self.trajectory.save()
        self.format_errors = 0
        return True

    def _request_rewrite(self, span: FunctionSpan, call: ToolCall | None, caller: str | None = None) -> None:
        """Ask for the whole function `span` as a code block, in place of an edit_file call inside it.

        The reply with the call leaves the conversation (it is the last message, so the cached prefix holds): a
        small model shown its own `new` copies it into the function it writes next. The trajectory keeps it.
        """
        if call is not None:
            self.messages.pop()
        source = None if self.toolbox.has_seen(span) else span.source
        request = prompts.rewrite_request(span.name, span.path, span.first, span.last, source, caller)
        self.rewrite_from = len(self.messages)
        self._append({"role": "user", "content": request}, result=True)
        self.pending_rewrite = span
        self.trajectory.add(
            "rewrite_requested",
            turn=self.turn,
            function=span.name,
            path=span.path,
            lines=[span.first, span.last],
            arguments=parse_arguments(call.arguments)[0] if call is not None else None,
            caller=caller,
        )
        self.trajectory.save()
        self._emit(
            "rewrite",
            tool="edit_file",
            short_arg=f"{span.path}: {span.name}",
            detail=f"asked for the whole {span.name}",
        )

    def _answer_rewrite(self, span: FunctionSpan, content: str) -> None:
        """Apply the function written in a reply's code block.

        A reply without a usable function is asked again. A function written back unchanged leaves the
        conversation together with the request (the model copies its own last reply), and the request moves to
        the function it calls, when there is exactly one in the file.
        """
        started = time.monotonic()
        outcome = self.toolbox.rewrite_function(span, content)
        arguments = {"path": span.path, "function": span.name}
        self._record_tool(None, "edit_file", arguments, outcome, True, time.monotonic() - started)
        self._emit(
            "tool",
            tool="edit_file",
            short_arg=f"{span.path}: whole {span.name}",
            ok=outcome.ok,
            detail=None if outcome.ok else short(outcome.content, 160),
            recovered=True,
        )
        if outcome.format_error:
            self._append({"role": "user", "content": outcome.content}, result=True)
            self.trajectory.save()
            self.pending_rewrite = span
            self._format_error("the reply had no usable version of the function")
            return
        self.format_errors = 0
        if outcome.callees is not None:
            self._drop_messages_from(self.rewrite_from)
            self.trajectory.add(
                "forgotten", turn=self.turn, detail="unchanged function and its request removed"
            )
            if len(outcome.callees) == 1:
                self._request_rewrite(outcome.callees[0], None, caller=span.name)
                return
        self._append({"role": "user", "content": outcome.content}, result=True)
        self.trajectory.save()

    def _mark_repeat(self, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
        """Say so when a read_file or edit_file call fails exactly as an identical earlier call did.

        The call still runs (the files may have changed since), so the answer is always true; `run` is left alone,
        since running the same failing tests again is normal work.
        """
        if call.name not in ("read_file", "edit_file"):
            return outcome
        try:
            key = (call.name, json.dumps(call.arguments, sort_keys=True, default=str))
        except (TypeError, ValueError):
            return outcome
        if outcome.ok:
            self.failed_calls.pop(key, None)
            return outcome
        earlier = self.failed_calls.get(key)
        if earlier is None or earlier[1] != outcome.content:
            self.failed_calls[key] = (self.turn, outcome.content)
            return outcome
        return replace(outcome, content=prompts.repeated_failure(call.name, earlier[0], outcome.content))

    def _format_error(self, why: str) -> None:
        self.format_errors += 1
        limit = self.settings.max_consecutive_format_errors
        if self.format_errors >= limit:
            raise _Stop(
                "format_errors", f"{self.format_errors} replies in a row without a usable tool call ({why})"
            )

    # -- the model call, with the context-length shortening ---------------------------------------------------
    def _complete(self) -> ModelReply:
        while True:
            try:
                return self.model.complete(self.messages, self.tools)
            except ContextLengthExceeded as exc:
                elided = shorten_oldest_tool_outputs(self.messages, self.result_indices)
                if not elided:
                    raise _Stop(
                        "max_tokens", f"the conversation no longer fits the model's context window ({exc})"
                    ) from None
                self.trajectory.add(
                    "context_shortened", turn=self.turn, elided_messages=elided, error=str(exc)[:500]
                )
                self.trajectory.save()
                self._emit("error", detail=f"context window full: elided {len(elided)} old tool output(s)")

    # -- budgets -----------------------------------------------------------------------------------------------
    def _wall_left(self) -> float | None:
        if self.settings.max_wall_s is None:
            return None
        return self.settings.max_wall_s - self.trajectory.elapsed()

    def _check_budgets(self) -> None:
        s = self.settings
        if self.turn >= s.max_turns:
            raise _Stop("max_turns", f"reached max_turns={s.max_turns}")
        if s.max_total_tokens is not None and self.usage.total_tokens >= s.max_total_tokens:
            raise _Stop(
                "max_tokens",
                f"used {self.usage.total_tokens} tokens of max_total_tokens={s.max_total_tokens}",
            )
        if s.max_cost_usd is not None and self.cost >= s.max_cost_usd:
            raise _Stop("max_cost", f"spent ${self.cost:.4f} of max_cost_usd={s.max_cost_usd}")
        left = self._wall_left()
        if left is not None and left <= 0:
            raise _Stop("max_wall", f"ran {self.trajectory.elapsed():.0f} s of max_wall_s={s.max_wall_s}")

    # -- bookkeeping -------------------------------------------------------------------------------------------
    def _append(self, message: dict[str, Any], result: bool = False) -> None:
        if result:
            self.result_indices.append(len(self.messages))
        self.messages.append(message)
        self.trajectory.add("message", turn=self.turn, message=message)

    def _drop_messages_from(self, index: int) -> None:
        """Take messages[index:] out of the conversation (they are the newest, so the cached prefix holds)."""
        del self.messages[index:]
        while self.result_indices and self.result_indices[-1] >= index:
            self.result_indices.pop()

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.on_event is None:
            return
        self.on_event(
            AgentEvent(
                kind=kind,
                turn=self.turn,
                tokens=self.usage.total_tokens,
                cost_usd=self.cost,
                elapsed_s=self.trajectory.elapsed(),
                **fields,
            )
        )

    def _hook_retries(self) -> Callable[[], None]:
        """Show model retries as progress events while this run owns the model; returns the undo."""
        if not isinstance(self.model, ChatModel):
            return lambda: None
        model = self.model
        previous = model.on_retry

        def on_retry(attempt: int, exc: BaseException, sleep: float) -> None:
            if previous:
                previous(attempt, exc, sleep)
            what = f"{type(exc).__name__}: {short(str(exc), 120)}"
            self.trajectory.add(
                "model_retry", turn=self.turn, attempt=attempt, error=what, sleep_s=round(sleep, 3)
            )
            self._emit(
                "error",
                detail=f"model endpoint failed (attempt {attempt}), retrying in {sleep:.1f} s: {what}",
            )

        model.on_retry = on_retry

        def restore() -> None:
            model.on_retry = previous

        return restore

    def _finish(self, reason: StopReason, detail: str) -> AgentResult:
        wall = self.trajectory.elapsed()
        self.trajectory.add(
            "stop",
            turn=self.turn,
            stop_reason=reason,
            detail=detail,
            summary=self.summary,
            turns=self.turn,
            usage=self.usage.to_dict(),
            cost_usd=self.cost,
            wall_s=round(wall, 4),
        )
        self.trajectory.save()
        self._emit("stop", detail=f"{reason}: {detail}")
        return AgentResult(
            stop_reason=reason,
            summary=self.summary,
            turns=self.turn,
            usage=self.usage,
            cost_usd=self.cost,
            wall_s=wall,
            trajectory=self.trajectory.events,
            messages=self.messages,
            detail=detail,
        )


def for_history(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as it goes back into the history: whole, except that tool-call arguments which are not
    valid JSON become "{}" (the tool result quotes what was sent and says what is wrong).

    Seen with llama.cpp: after the 1.5B model sent `{"command` as arguments, the server failed every later request
    (HTTP 500, "Failed to parse tool call arguments as JSON") because it parses the history's tool calls to render
    them; the run ended as an infrastructure failure. The trajectory keeps the reply as the model sent it.
    """
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed, changed = [], False
    for call in calls:
        arguments = (call.get("function") or {}).get("arguments")
        if isinstance(arguments, str):
            try:
                valid = isinstance(json.loads(arguments), dict)
            except ValueError:
                valid = False
            if not valid:
                call = {**call, "function": {**call["function"], "arguments": "{}"}}
                changed = True
        fixed.append(call)
    return {**message, "tool_calls": fixed} if changed else message


def resolve_edit_style(style: str, model_name: str) -> str:
    """'auto' becomes 'whole_function' for the embedded model and 'replace' for every other one."""
    if style != "auto":
        return style
    from bugsweep.embedded import MODEL_NAME

    return "whole_function" if model_name == MODEL_NAME else "replace"


def shorten_oldest_tool_outputs(messages: list[dict[str, Any]], candidates: list[int]) -> list[int]:
    """Replace the oldest half (at least one) of the not yet elided tool outputs with a short marker, in place.

    Returns the indices it changed; empty when nothing is left to shorten. Only tool outputs are touched: the
    system prompt, the task and the model's own messages stay as they were.
    """
    open_ = [
        i
        for i in candidates
        if isinstance(messages[i].get("content"), str)
        and len(messages[i]["content"]) > len(prompts.ELIDED_OUTPUT) * 2
    ]
    if not open_:
        return []
    chosen = open_[: max(1, len(open_) // 2)]
    for i in chosen:
        messages[i] = {**messages[i], "content": prompts.ELIDED_OUTPUT}
    return chosen
