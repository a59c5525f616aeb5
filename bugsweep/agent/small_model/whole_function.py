"""Whole-function edits, the small-model policy's main help: ask for a whole Python function as a ```python
block, and put the function written there in place of the file's.

Seen on the embedded 1.5B model (bench/README.md, "whole-function edits"): inside edit_file's JSON arguments it
wrote a wrong rule, as a plain code block the right one, 5 of 5 times. So an edit_file call inside one function
whose edit leaves the tests failing (tried.py) is answered with a request for the whole function, shown with what
the failing tests say; so is an `old` that matches no single place but clearly means one function
(rewrite.function_meant), and once per function an edit whose `new` equals its `old`. An answer that leaves the
tests failing is followed by samples of the same request at SAMPLE_TEMPERATURE, each tried against the tests.
The parsing and splicing of functions is rewrite.py's (text in, text out); this module does the asking.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bugsweep.agent import prompts
from bugsweep.agent.focus import normalised_matches
from bugsweep.agent.history import for_history
from bugsweep.agent.model import ToolCall
from bugsweep.agent.rewrite import (
    FunctionSpan,
    RewriteError,
    called_functions,
    current_span,
    enclosing_function,
    function_from_reply,
    function_meant,
    keep_docstring,
    splice,
)
from bugsweep.agent.small_model.common import Notes, file_text, has_seen
from bugsweep.agent.text import loose_matches, new_syntax_error, occurrences, snippet
from bugsweep.agent.tools import Toolbox, ToolOutcome, parse_arguments

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentRun

#: A whole-function request whose answer leaves the tests failing is asked again (AgentSettings.rewrite_samples
#: times) at this temperature; the first version the tests pass with is kept.
SAMPLE_TEMPERATURE = 0.8


@dataclass
class WholeFunctions:
    """The whole-function requests of one run: the one waiting for its answer, and where it starts."""

    notes: Notes
    pending: FunctionSpan | None = None
    """The function the last turn asked to be rewritten whole."""
    rewrite_from: int = 0
    """Where the last rewrite request starts in the conversation."""

    def request(
        self,
        run: AgentRun,
        span: FunctionSpan,
        call: ToolCall | None,
        caller: str | None = None,
        stuck: bool = False,
    ) -> None:
        """Ask for the whole function `span` as a code block, in place of an edit_file call inside it.

        The reply with the call leaves the conversation (it is the last message, so the cached prefix holds): a
        small model shown its own `new` copies it into the function it writes next. The trajectory keeps it.
        """
        if call is not None:
            run.drop_messages_from(len(run.messages) - 1)
        source = None if has_seen(run.toolbox, span) else span.source
        request = prompts.rewrite_request(
            span.name,
            span.path,
            span.first,
            span.last,
            source,
            caller,
            failures=self.notes.failures,
            stuck=stuck,
        )
        self.rewrite_from = len(run.messages)
        run.append({"role": "user", "content": request}, result=True)
        self.pending = span
        self.notes.asked.add((span.path, span.name))
        run.trajectory.add(
            "rewrite_requested",
            turn=run.turn,
            function=span.name,
            path=span.path,
            lines=[span.first, span.last],
            arguments=parse_arguments(call.arguments)[0] if call is not None else None,
            caller=caller,
            stuck=stuck,
        )
        run.trajectory.save()
        run.emit(
            "rewrite",
            tool="edit_file",
            short_arg=f"{span.path}: {span.name}",
            detail=f"asked for the whole {span.name}",
        )

    def answer(self, run: AgentRun, span: FunctionSpan, content: str) -> None:
        """Apply the function written in a reply's code block.

        A reply without a usable function is asked again. A function written back unchanged leaves the
        conversation together with the request (the model copies its own last reply), and the request moves to
        the function it calls, when there is exactly one in the file.
        """
        started = time.monotonic()
        before = file_text(run.toolbox, span.path)
        outcome = rewrite_function(run.toolbox, span, content)
        call = ToolCall(
            "", "edit_file", json.dumps({"path": span.path, "function": span.name}), recovered=True
        )
        outcome.arguments = {"path": span.path, "function": span.name}
        run.record_tool(
            call, outcome, time.monotonic() - started, short_arg=f"{span.path}: whole {span.name}"
        )
        if outcome.format_error:
            run.append({"role": "user", "content": outcome.content}, result=True)
            run.trajectory.save()
            self.pending = span
            run.format_error("the reply had no usable version of the function")
            return
        run.usable_reply()
        if before is not None and self._sample_passes(run, span, before, content):
            return
        if outcome.callees is not None:
            run.drop_messages_from(self.rewrite_from)
            run.trajectory.add(
                "forgotten", turn=run.turn, detail="unchanged function and its request removed"
            )
            if len(outcome.callees) == 1:
                self.request(run, outcome.callees[0], None, caller=span.name)
                return
        run.append({"role": "user", "content": outcome.content}, result=True)
        run.trajectory.save()

    def _sample_passes(
        self, run: AgentRun, span: FunctionSpan, before: tuple[str, str], answered: str
    ) -> bool:
        """When the tests still fail after the model's answer to a whole-function request, ask the same request
        again up to `rewrite_samples` times (AgentSettings) at SAMPLE_TEMPERATURE, try each new version of the
        function against the task's tests, and keep the first they pass with: the sample's reply then takes the
        answer's place in the conversation. Otherwise the file is left as the answer made it and nothing is said.
        Each sample is a turn (AgentRun.sample).

        Seen on real bugs (bench/README.md, "What the model can write when shown the place"): at temperature 0 the
        1.5B model wrote the function back unchanged, or wrong, while a sample at 0.8 of the same request wrote
        the fix (cachetools, `__get__`); and a function written back unchanged once is written back unchanged at
        temperature 0 every time it is asked again (marshmallow, 5 times in a run).
        """
        toolbox = run.toolbox
        samples = run.settings.rewrite_samples
        if not samples or not run.test_command or toolbox.run(run.test_command).exit_code == 0:
            return False
        answered_text = file_text(toolbox, span.path)
        request = run.messages[: self.rewrite_from + 1]
        tried: set[str] = set()
        with contextlib.suppress(RewriteError):
            tried.add(function_from_reply(answered, span.name))  # the answer itself failed already
        codes: list[int | None] = []
        for seed in range(1, samples + 1):
            reply = run.sample(request, temperature=SAMPLE_TEMPERATURE, seed=seed)
            if reply is None:
                break
            try:
                code = function_from_reply(reply.content or "", span.name)
            except RewriteError:
                continue
            if code in tried:
                continue
            tried.add(code)
            toolbox.write_if_room(*before)
            outcome = rewrite_function(toolbox, span, reply.content or "")
            if not outcome.ok:
                continue
            tests = toolbox.run(run.test_command)
            codes.append(tests.exit_code)
            if tests.exit_code != 0:
                continue
            run.trajectory.add(
                "rewrite_sampled", turn=run.turn, function=span.name, path=span.path, kept_seed=seed,
                tests_exit_codes=codes,
            )  # fmt: skip
            run.drop_messages_from(len(run.messages) - 1)  # the answer (the newest message) gives way
            run.append(for_history(reply.message))
            text = outcome.content.rsplit("\n", 1)[0] + "\n" + prompts.tests_pass_after_edit(run.test_command)
            run.append({"role": "user", "content": text}, result=True)
            run.trajectory.save()
            run.emit(
                "rewrite", tool="edit_file", short_arg=f"{span.path}: {span.name}", detail="a sample passed"
            )
            return True
        if answered_text is not None:
            toolbox.write_if_room(*answered_text)
        run.trajectory.add(
            "rewrite_sampled", turn=run.turn, function=span.name, path=span.path, kept_seed=None,
            tests_exit_codes=codes,
        )  # fmt: skip
        run.trajectory.save()
        return False


def function_to_rewrite(
    toolbox: Toolbox,
    raw_arguments: str | dict[str, Any] | None,
    asked: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
) -> FunctionSpan | None:
    """The Python function that an edit_file call would change: where its `old` matches exactly one place inside
    one function of a code file, or, when it matches no single place, the function it clearly means
    (rewrite.function_meant). An edit whose `new` equals its `old` means that function too, unless it was asked
    for already (`asked`: (path, name) pairs): seen on real bugs (attrs, prettytable; bench/README.md), the model
    sent a region of the right file back unchanged, again and again, whatever the error said; it knew where, not
    what. None for every other call (those run as usual, so their errors and refusals stay the same)."""
    args, _ = parse_arguments(raw_arguments)
    if args is None or not all(isinstance(args.get(k), str) for k in ("path", "old", "new")):
        return None
    path, old, new = args["path"], args["old"], args["new"]
    if not path.strip().endswith(".py") or not old.strip():
        return None
    resolved = toolbox.resolve(path)
    if isinstance(resolved, ToolOutcome):
        return None
    real, rel, kind, _ = resolved
    if kind != "file" or toolbox.is_protected(rel):
        return None
    try:
        content = toolbox.sandbox.files.read_text(real)
    except UnicodeDecodeError:
        return None
    spans = [(i, i + len(old)) for i in occurrences(content, old)] or loose_matches(content, old)
    if len(spans) == 1:
        span = enclosing_function(content, rel, *spans[0])
    elif not spans and len(normalised_matches(content, old)) == 1:
        # Only quotes or spacing differ from one place: the edit runs as sent and the tools' answer shows that
        # place (as measured on real tasks, bench/README.md; it was applied there until that run).
        return None
    else:
        span = function_meant(content, rel, old, found_nowhere=not spans)
    if span is not None and old == new and (span.path, span.name) in asked:
        return None  # asked for once already: the usual "old and new are the same"
    return span


def rewrite_function(toolbox: Toolbox, span: FunctionSpan, reply: str) -> ToolOutcome:
    """Replace the function of `span` with its version from the code block in `reply`.

    A reply without a usable version of the function is a format_error (the loop asks again); one that does
    not change the function is not (the model may well be right that the bug lies elsewhere)."""
    found = toolbox.existing_file(span.path)
    if isinstance(found, ToolOutcome):
        return found
    real, rel = found
    content = toolbox.sandbox.files.read_text(real)
    now = current_span(content, span)
    if now is None:
        return ToolOutcome(prompts.function_gone(span.name, rel), ok=False, short_arg=rel)
    try:
        function = function_from_reply(reply, span.name)
    except RewriteError as exc:
        return ToolOutcome(
            prompts.rewrite_unusable(str(exc), now), ok=False, format_error=True, short_arg=rel
        )
    function = keep_docstring(now.source, function)
    updated = splice(content, now, function)
    if updated == content:
        # Seen: asked for a function it had edited at a call site, the model wrote it back unchanged, turn
        # after turn. What the function calls in this file is where the wrong value comes from.
        callees = called_functions(content, now)
        return ToolOutcome(
            prompts.rewrite_unchanged(now, [(c.name, c.first) for c in callees]),
            ok=False,
            short_arg=rel,
            callees=callees,
        )
    broken = new_syntax_error(content, updated, rel)
    if broken is not None:
        return ToolOutcome(
            prompts.rewrite_unusable(broken[1], now), ok=False, format_error=True, short_arg=rel
        )
    if not toolbox.write_if_room(real, updated):
        return ToolOutcome(prompts.disk_full_error("edit_file"), ok=False, short_arg=rel)
    last = now.first + function.rstrip("\n").count("\n")
    text = prompts.function_rewritten(now, last, snippet(updated, now.first, last), toolbox.test_command)
    return ToolOutcome(text, short_arg=rel, arguments={"path": rel, "function": span.name})
