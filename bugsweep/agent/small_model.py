"""The `small-model` policy: the help a small open model needs, measured on the embedded Qwen2.5-Coder-1.5B.

With it the embedded model resolved the demo 5 of 5 times (bench/README.md, "whole-function edits"); without it
(the `plain` policy) 0 of 2. What it does, each change seen in that model's trajectories:
- Whole-function edits (rewrite.py): an edit_file call that lands inside one Python function is first tried as sent
  and kept when the task's tests pass with it; otherwise it is undone, the call leaves the conversation, and the
  model is asked for the whole corrected function as a ```python block (shown with what the failing tests say:
  focus.failure_digest), which then replaces the function. A
  function written back unchanged moves the request to the one function of the file that it calls.
  An edit_file call whose `old` matches no single place but clearly means one function (it defines it, names it,
  or, found nowhere, is mostly that function's words: rewrite.function_meant) is answered the same way (seen:
  "old text not found" again and again on unread files, in the demo and on real bugs).
  So is an edit_file call that changes nothing (`new` equal to `old`) inside one function, once per function
  (seen on real bugs: the same region of the right file sent back unchanged, turn after turn).
  An answer that leaves the task's tests failing is followed by up to `rewrite_samples` answers to the same request
  at temperature 0.8 (each a turn), each tried against the tests; the first they pass with is kept (seen on real
  bugs: at temperature 0 the function came back unchanged, a sample at 0.8 wrote the fix).
- A reply without a tool call whose ```python block defines a function of the code under test is tried in place
  of that function and kept when the task's tests pass with it (seen: the demo on a freshly started server, whose
  first reply wrote the right function as text; bench/README.md, "code in a reply"). A function written whole
  gets back the docstring and annotated signature it left out (rewrite.keep_docstring).
- The first finish call while the task's tests still fail is answered with what they say; a second one ends the
  run (seen on real bugs: finish after edits to the wrong file, the test unchanged).
- A failed edit_file call leaves the conversation: the reply and its result are replaced by one note saying what
  went wrong (once a wrong `old` is in the history, the model sends it again and again).
- A read_file or edit_file call that fails exactly as an identical earlier call did is told so.
On real repositories (bench/README.md, "Real bugs"), also:
- A small first prompt: the failing tests, how they fail, the files their traceback names and the files that
  define what the failing tests import, instead of the
  repository's file list (thousands of tokens on a real project: minutes on two cores before the first reply);
  bounded by focus.FIRST_PROMPT_MAX_CHARS whatever the repository's size.
- Test output focused on failures: a `run` whose output has pytest's FAILURES/ERRORS section comes back as that
  section and the short summary, without the progress dots of the passing tests.
- A `run` of the same command as before is answered with what is new in its output since then, or that nothing
  is (seen: the same `python -m pytest tests` eight times in a row until the context was full). A failing test run
  repeated with nothing changed is followed by a request for the function where its traceback ends, when that is
  code under test and was not asked for before (seen: the same run ten times in a row despite that note).
- An edit_file `old` found nowhere as written but in exactly one place once quotes and whitespace are normalised
  is applied there, and the answer says so.
- An edit_file call on a file the model never read that finds no match gets the region of the file that best
  matches its `old`, with more context than usual (seen: three "old text not found" in a row on an unread file).
- A read_file without a range of a Python file longer than read_file shows at once comes back as the file's
  outline (classes and functions with their lines, those the failing tests name first): seen on real bugs, whole
  reads of a 2,602-line file, each overflowing the 8k window.
- Within an 8k window, the failing assertion is never lost: it is in the first message, which the loop's
  context-length shortening never elides (only old tool outputs go).
Every change is recorded in the trajectory (rewrite_requested, edit_tried, rewrite_sampled, model_sample,
forgotten events and the messages).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from bugsweep.agent import focus, prompts
from bugsweep.agent.focus import (
    failing_tests,
    failure_digest,
    files_in_traceback,
    focus_test_output,
    normalised_matches,
    same_output,
    what_is_new,
)
from bugsweep.agent.history import for_history
from bugsweep.agent.model import ModelReply, ToolCall
from bugsweep.agent.policy import Policy
from bugsweep.agent.rewrite import (
    FunctionSpan,
    RewriteError,
    called_functions,
    current_span,
    defined_names,
    enclosing_function,
    function_from_reply,
    function_meant,
    functions_named,
    keep_docstring,
    outline,
    splice,
)
from bugsweep.agent.text import closest_lines, loose_matches, new_syntax_error, occurrences, snippet
from bugsweep.agent.tools import Toolbox, ToolOutcome, parse_arguments

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentRun


_WORDS = re.compile(r"[A-Za-z_]\w*")

REPEAT_SAME = (
    "Note: this is the same command as in turn {turn}, and its output is the same: nothing it checks has changed "
    "since. Running it again will not help. Change the code first: read the function the failing test calls, "
    "then edit it."
)
REPEAT_CHANGED = (
    "Note: this is the same command as in turn {turn}. What is new in its output since then:\n{lines}"
)
EDIT_NORMALISED = (
    "Note: old was not in {path} exactly as written, but it matched one place (line {line}) once quotes and "
    "whitespace were normalised. The edit was applied there."
)
FINISH_REFUSED = (
    "Not finished: the tests still fail ({command} exited with {code}). They say:\n```\n{says}\n```\n"
    "Find the code that gives the wrong result, fix it, run the tests, and call finish when they pass. "
    "A second finish call ends the work as it is."
)
#: At most this many outline entries (those named in the failing tests first).
OUTLINE_MAX_ENTRIES = 60
#: A whole-function request whose answer leaves the tests failing is asked again (AgentSettings.rewrite_samples
#: times) at this temperature; the first version the tests pass with is kept.
SAMPLE_TEMPERATURE = 0.8

UNREAD_FILE = (
    "Error: The text in old was not found in {path}, so nothing was changed. You have not read {path}: edit only "
    "text you have read. The part of {path} most like your old is at {closest}\n"
    "To change those lines, copy them exactly into old and call edit_file again."
)


def _range_of(closest: str) -> tuple[int, int]:
    """The line range in a closest_lines header ("lines 12-20:" or "line 7:")."""
    numbers = closest.split(":", 1)[0].split()[-1].split("-")
    return int(numbers[0]), int(numbers[-1])


class SmallModelPolicy(Policy):
    name = "small-model"

    def __init__(self) -> None:
        self.pending_rewrite: FunctionSpan | None = None
        """The function the last turn asked to be rewritten whole."""
        self.rewrite_from = 0
        """Where the last rewrite request starts in the conversation."""
        self.failed_calls: dict[tuple[str, str], tuple[int, str]] = {}
        """Failed read_file/edit_file calls by (tool, arguments): the turn and the error, to recognise repeats."""
        self.last_calls: list[ToolCall] = []
        """The tool calls of the last reply the loop ran."""
        self.last_outcome: ToolOutcome | None = None
        self.commands: dict[str, tuple[int, str]] = {}
        """`run` commands seen: the turn and output of the last run of each."""
        self.finish_refused = False
        """Whether a finish call was already answered with the failing tests (only the first one is)."""
        self.failures: str | None = None
        """What the last test output with failures said (focus.failure_digest), shown with a rewrite request."""
        self.sources: list[str] = []
        """The code files (not tests) named in the first prompt."""
        self.asked: set[tuple[str, str]] = set()
        """(path, function) of every whole function asked for: an edit that changes nothing asks for each once."""
        self.stuck_on: FunctionSpan | None = None
        """The function to ask for before the next request: a test run repeated with nothing changed (see
        _focus_run)."""

    def start(self, run: AgentRun) -> None:
        """Replace the first message's file list with the failing tests and how they fail (see focus.first_prompt)."""
        if not run.test_command:
            return
        started = time.monotonic()
        tests = run.toolbox.run(run.test_command)
        output = tests.content
        self.failures = failure_digest(output)
        files, _ = run.toolbox.list_files(limit=100_000)
        failing = failing_tests(output)
        named = files_in_traceback(output, set(files))
        test_files = [f for f in dict.fromkeys([t.split("::")[0] for t in failing] + named) if f in files]
        # Seen: an assertion's traceback shows only the test's frame, so the code under test went unnamed and the
        # model edited the package's __init__. Where the names the test imports are defined is named too.
        under_test = [
            f
            for t in test_files
            if run.toolbox.is_protected(t)
            for f in run.toolbox._code_under_test(f"{run.toolbox.workdir}/{t}", t, self.failures or "")[1]
        ]
        sources = [f for f in dict.fromkeys(named + under_test) if not run.toolbox.is_protected(f)]
        self.sources = sources
        shown = sources + [f for f in test_files if f not in sources]
        first = focus.first_prompt(
            run.task,
            run.test_command,
            run.toolbox.workdir,
            failing,
            focus_test_output(output) or output[-2000:],
            shown,
        )
        run.drop_messages_from(1)
        run.append({"role": "user", "content": first})
        run.trajectory.add(
            "first_prompt_focused",
            tests_exit_code=tests.exit_code,
            chars=len(first),
            files_named=shown,
            duration_s=round(time.monotonic() - started, 3),
        )

    # -- hooks -------------------------------------------------------------------------------------------------
    def before_request(self, run: AgentRun) -> None:
        self._forget_failed_edit(run)
        if self.stuck_on is not None:
            span, self.stuck_on = self.stuck_on, None
            self._request_rewrite(run, span, None, stuck=True)

    def after_reply(self, run: AgentRun, reply: ModelReply) -> bool:
        self.last_calls, self.last_outcome = [], None
        pending, self.pending_rewrite = self.pending_rewrite, None
        if pending is not None:
            # The answer is a reply without tool calls. Asked once: tool calls sent instead (an edit_file call
            # included) run as sent.
            if not reply.tool_calls:
                self._answer_rewrite(run, pending, reply.content)
                return True
        elif not reply.tool_calls and self._code_in_reply(run, reply.content):
            return True
        elif len(reply.tool_calls) == 1 and reply.tool_calls[0].name == "edit_file":
            span = function_to_rewrite(run.toolbox, reply.tool_calls[0].arguments, asked=self.asked)
            if span is not None:
                if not self._edit_passes_tests(run, reply.tool_calls[0], span):
                    self._request_rewrite(run, span, reply.tool_calls[0])
                return True
        self.last_calls = reply.tool_calls
        return False

    def after_tool(self, run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
        if outcome.finished:
            return self._finish_when_tests_pass(run, outcome)
        if call.name == "run":
            outcome = self._focus_run(run, call, outcome)
        elif call.name == "read_file" and outcome.ok:
            outcome = self._outline_long_read(run, call, outcome)
        elif call.name == "edit_file" and not outcome.ok and not outcome.format_error:
            outcome = self._edit_loosely(run, call, outcome)
        self.last_outcome = outcome = self._mark_repeat(run, call, outcome)
        return outcome

    def _finish_when_tests_pass(self, run: AgentRun, outcome: ToolOutcome) -> ToolOutcome:
        """The first finish call while the task's tests still fail is answered with what they say, and the work
        goes on; a second one ends it as it is.

        Seen on the 1.5B model on real bugs (attrs, bench/README.md): after edits to a docstring of the wrong file
        it called finish with the failing test unchanged, its summary quoting the last error message.
        """
        if not run.test_command or self.finish_refused:
            return outcome
        tests = run.toolbox.run(run.test_command)
        if tests.exit_code == 0 or tests.timed_out:
            return outcome
        self.finish_refused = True
        digest = failure_digest(tests.content) or focus_test_output(tests.content) or tests.content[-1500:]
        run.trajectory.add("finish_refused", turn=run.turn, tests_exit_code=tests.exit_code)
        return replace(
            outcome,
            finished=False,
            ok=False,
            summary="",
            content=FINISH_REFUSED.format(
                command=run.test_command.strip(), code=tests.exit_code, says=digest
            ),
        )

    # -- real repositories ---------------------------------------------------------------------------------------
    def _focus_run(self, run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
        """Test output cut to its failures; a repeated command answered with what is new since its last run."""
        args, _ = parse_arguments(call.arguments)
        command = str((args or {}).get("command", "")).strip()
        head, _, output = outcome.content.partition("\n")
        focused = focus_test_output(output)
        self.failures = failure_digest(output) or self.failures
        content = f"{head}\n[test output focused on the failures]\n{focused}" if focused else outcome.content
        earlier = self.commands.get(command)
        self.commands[command] = (run.turn, output)
        if earlier is not None:
            turn, before = earlier
            if same_output(before, output):
                content += "\n\n" + REPEAT_SAME.format(turn=turn)
                if focused:
                    self.stuck_on = self._where_it_fails(run, output)
            else:
                new = what_is_new(before, output)
                content += "\n\n" + REPEAT_CHANGED.format(
                    turn=turn, lines="\n".join(new) or "(only lines left out)"
                )
        if content == outcome.content:
            return outcome
        run.trajectory.add(
            "run_focused", turn=run.turn, repeat_of=earlier[0] if earlier else None, focused=bool(focused)
        )
        return replace(outcome, content=content)

    def _where_it_fails(self, run: AgentRun, output: str) -> FunctionSpan | None:
        """The function of the code under test where the failing tests' traceback ends (its deepest frame in a
        repository file that is not a test), when it was not asked for whole before.

        Seen on real bugs (cachetools, bench/README.md): after two failed edits the 1.5B model ran the same test
        command ten times in a row to the end of its turns, each answered with the note that nothing had changed;
        the traceback ended in `__get__`, the function the real fix changed, and asked for it whole the model
        wrote the fix (in one sample of four).
        """
        toolbox = run.toolbox
        for path, line in reversed(focus.traceback_frames(output, toolbox.workdir)):
            if not path.endswith(".py") or toolbox.is_protected(path):
                continue
            found = repo_file(toolbox, path)
            if found is None:
                continue
            _, rel, text = found
            lines = text.split("\n")
            if not 1 <= line <= len(lines):
                continue
            start = sum(len(x) + 1 for x in lines[: line - 1])
            span = enclosing_function(text, rel, start, start + len(lines[line - 1]))
            if span is None or (span.path, span.name) in self.asked:
                return None
            return span
        return None

    def _outline_long_read(self, run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
        """A read without a range of a Python file longer than read_file shows at once (read_file_max_chars)
        comes back as its outline: classes and functions with their lines (those the failing tests name first),
        and how to read a part (a range is shown as asked for, in such a file).

        Seen on real bugs (prettytable, bench/README.md): read_file of a 2,602-line file without a range, four
        times in 12 turns; each answer (20,000 characters, ~6k tokens) overflowed the 8k window, so the loop
        elided the older messages, the model lost what it had read, and read the whole file again.
        """
        args, _ = parse_arguments(call.arguments)
        if not args or any(args.get(k) not in (None, "") for k in ("start_line", "end_line")):
            return outcome
        found = repo_file(run.toolbox, str(args.get("path", "")))
        if found is None or not found[1].endswith(".py"):
            return outcome
        _, rel, text = found
        entries = outline(text) if len(text) > run.toolbox.settings.read_file_max_chars else None
        if not entries:
            return outcome
        named = set(_WORDS.findall(self.failures or ""))
        first = [e for e in entries if e[2].rsplit(" ", 1)[-1].rsplit(".", 1)[-1] in named]
        rest = [e for e in entries if e not in first][: max(OUTLINE_MAX_ENTRIES - len(first), 0)]
        shown = sorted(first + rest)
        lines = [f"lines {a}-{b}: {what}" for a, b, what in shown]
        run.toolbox.seen.pop(rel, None)  # none of its code was shown
        run.trajectory.add("read_outlined", turn=run.turn, path=rel, chars=len(text), entries=len(shown))
        total = text.count("\n") + (0 if text.endswith("\n") else 1)
        return replace(
            outcome,
            content=prompts.read_outline(rel, total, len(text), lines, len(entries) - len(shown)),
        )

    def _edit_loosely(self, run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
        """A failed edit: apply it where `old` matches once quotes and whitespace are normalised; otherwise, for a
        file the model never read, show the region most like `old` with more context."""
        args, _ = parse_arguments(call.arguments)
        if args is None or not all(isinstance(args.get(k), str) for k in ("path", "old", "new")):
            return outcome
        path, old, new = args["path"], args["old"], args["new"]
        if not old.strip() or "not found" not in outcome.content:
            return outcome
        found = repo_file(run.toolbox, path)
        if found is None:
            return outcome
        _, rel, content = found
        spans = normalised_matches(content, old)
        if len(spans) == 1:
            start, end = spans[0]
            applied = run.toolbox.call("edit_file", {"path": path, "old": content[start:end], "new": new})
            if applied.ok:
                line = content.count("\n", 0, start) + 1
                run.trajectory.add("edit_normalised", turn=run.turn, path=rel, line=line)
                return replace(
                    applied, content=EDIT_NORMALISED.format(path=rel, line=line) + "\n" + applied.content
                )
            return outcome
        if rel in run.toolbox.seen:
            return outcome
        closest = closest_lines(content, old, context=6, max_lines=40)
        if not closest:
            return outcome
        run.toolbox.seen[rel] = _range_of(closest)
        run.trajectory.add("unread_file_region", turn=run.turn, path=rel)
        return replace(outcome, content=UNREAD_FILE.format(path=rel, closest=closest))

    # -- failed calls --------------------------------------------------------------------------------------------
    def _forget_failed_edit(self, run: AgentRun) -> None:
        """Take a failed edit_file call out of the conversation, keeping only what went wrong.

        Seen on the 1.5B model: once a wrong `old` text is in the history, the model sends it again and again,
        whatever the error says. The reply and its result are the last two messages, so replacing them with one
        note keeps the prompt prefix (and the server's cache) intact; the trajectory keeps the whole call.
        """
        calls, outcome = self.last_calls, self.last_outcome
        self.last_calls, self.last_outcome = [], None
        if len(calls) != 1 or calls[0].recovered or calls[0].name != "edit_file":
            return
        if run.messages[-1].get("role") != "tool" or not outcome or outcome.ok or outcome.format_error:
            return
        run.drop_messages_from(len(run.messages) - 2)
        run.append({"role": "user", "content": prompts.failed_edit_note(outcome.content)}, result=True)
        run.trajectory.add("forgotten", turn=run.turn, detail="failed edit_file call replaced by a note")
        run.trajectory.save()

    def _mark_repeat(self, run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
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
            self.failed_calls[key] = (run.turn, outcome.content)
            return outcome
        return replace(outcome, content=prompts.repeated_failure(call.name, earlier[0], outcome.content))

    # -- whole-function edits ----------------------------------------------------------------------------------
    def _edit_passes_tests(self, run: AgentRun, call: ToolCall, span: FunctionSpan) -> bool:
        """Try the edit as sent first, and keep it when the tests pass with it.

        Seen on the 1.5B model: a right one-line fix, answered with the request for the whole function, came back
        as the function copied unchanged from the file. So the request is only for edits that leave the tests
        failing (or that fail): those are undone without a trace in the conversation.
        """
        if not run.test_command:
            return False
        toolbox = run.toolbox
        before = file_text(toolbox, span.path)
        started = time.monotonic()
        outcome = toolbox.call("edit_file", call.arguments)
        if not outcome.ok or before is None:
            return False
        tests = toolbox.run(run.test_command)
        passed = tests.exit_code == 0
        run.trajectory.add(
            "edit_tried", turn=run.turn, function=span.name, tests_exit_code=tests.exit_code, kept=passed
        )
        if not passed:
            toolbox.write_if_room(*before)
            return False
        run.record_tool(call, outcome, time.monotonic() - started, exit_code=None, detail=None)
        # edit_done's last line asks for the test run that has just passed.
        content = outcome.content.rsplit("\n", 1)[0] + "\n" + prompts.tests_pass_after_edit(run.test_command)
        if call.recovered:
            run.append({"role": "user", "content": prompts.recovered_result(call.name, content)}, result=True)
        else:
            run.append({"role": "tool", "tool_call_id": call.id, "content": content}, result=True)
        run.trajectory.save()
        run.usable_reply()
        return True

    def _code_in_reply(self, run: AgentRun, content: str) -> bool:
        """A reply without a tool call whose ```python block defines a function of the code under test: that
        function is tried in place of the file's and kept when the task's tests pass with it (the reply is then
        answered as an edit). Otherwise the file is put back, nothing is said, and the reply gets the usual nudge.

        Seen on the 1.5B model (bench/README.md, "The README's way ... code in a reply"): on a freshly started server its first reply
        explained the bug and wrote the right function as text, with no tool call; after the nudge it called
        finish, then sent the function back unchanged, and the right fix was never applied. Only functions of the
        files the first prompt named or the model read, defined once there, are tried.
        """
        if not run.test_command:
            return False
        names = defined_names(content)
        if not names:
            return False
        toolbox = run.toolbox
        files = [
            f
            for f in dict.fromkeys([*self.sources, *toolbox.seen])
            if f.endswith(".py") and not toolbox.is_protected(f)
        ]
        texts = {f: text for f in files if (text := file_text(toolbox, f)) is not None}
        for name in names:
            spans = [s for f, (_, text) in texts.items() for s in functions_named(text, f, name)]
            if len(spans) != 1:
                continue
            span = spans[0]
            started = time.monotonic()
            outcome = rewrite_function(toolbox, span, content)
            if not outcome.ok:
                continue  # unusable or unchanged: nothing was written
            tests = toolbox.run(run.test_command)
            kept = tests.exit_code == 0
            run.trajectory.add(
                "reply_code_tried",
                turn=run.turn,
                function=span.name,
                path=span.path,
                tests_exit_code=tests.exit_code,
                kept=kept,
            )
            if not kept:
                toolbox.write_if_room(*texts[span.path])
                run.trajectory.save()
                return False
            call = ToolCall(
                "", "edit_file", json.dumps({"path": span.path, "function": span.name}), recovered=True
            )
            now = file_text(toolbox, span.path)
            written = current_span(now[1], span) if now is not None else None
            last = written.last if written is not None else span.last
            shown = snippet(now[1], span.first, last) if now is not None else ""
            answer = replace(outcome, content=prompts.reply_code_applied(span, last, shown, run.test_command))
            run.record_tool(
                call,
                answer,
                time.monotonic() - started,
                short_arg=f"{span.path}: whole {span.name} (from text)",
            )
            run.append({"role": "user", "content": answer.content}, result=True)
            run.trajectory.save()
            run.usable_reply()
            return True
        return False

    def _request_rewrite(
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
            span.name, span.path, span.first, span.last, source, caller, failures=self.failures, stuck=stuck
        )
        self.rewrite_from = len(run.messages)
        run.append({"role": "user", "content": request}, result=True)
        self.pending_rewrite = span
        self.asked.add((span.path, span.name))
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

    def _answer_rewrite(self, run: AgentRun, span: FunctionSpan, content: str) -> None:
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
            self.pending_rewrite = span
            run.format_error("the reply had no usable version of the function")
            return
        run.usable_reply()
        if before is not None and self._sampled_rewrite_passes(run, span, before, content):
            return
        if outcome.callees is not None:
            run.drop_messages_from(self.rewrite_from)
            run.trajectory.add(
                "forgotten", turn=run.turn, detail="unchanged function and its request removed"
            )
            if len(outcome.callees) == 1:
                self._request_rewrite(run, outcome.callees[0], None, caller=span.name)
                return
        run.append({"role": "user", "content": outcome.content}, result=True)
        run.trajectory.save()

    def _sampled_rewrite_passes(
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
        return None  # applied where it matches once quotes and spacing are normalised (_edit_loosely)
    else:
        span = function_meant(content, rel, old, found_nowhere=not spans)
    if span is not None and old == new and (span.path, span.name) in asked:
        return None  # asked for once already: the usual "old and new are the same"
    return span


def has_seen(toolbox: Toolbox, span: FunctionSpan) -> bool:
    """Whether the last read_file of the span's file showed the whole function."""
    first, last = toolbox.seen.get(span.path, (0, -1))
    return first <= span.first and span.last <= last


def repo_file(toolbox: Toolbox, path: str) -> tuple[str, str, str] | None:
    """(real path, repository-relative path, text) of an existing text file of the repository; None when there
    is none or it is not text."""
    found = toolbox.existing_file(path)
    if isinstance(found, ToolOutcome):
        return None
    real, rel = found
    try:
        return real, rel, toolbox.sandbox.files.read_text(real)
    except UnicodeDecodeError:
        return None


def file_text(toolbox: Toolbox, path: str) -> tuple[str, str] | None:
    """(real path, text) of a repository file, to put it back as it was; None when it cannot be read."""
    found = repo_file(toolbox, path)
    return None if found is None else (found[0], found[2])


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
