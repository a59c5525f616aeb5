"""The small-model policy's memory of the conversation: failed edits taken out of it, calls that fail as before
and commands run again said to be repeats, and test output cut down to its failures.

Seen on the 1.5B model: once a wrong `old` is in the history it is sent again and again; an identical failed call
is repeated until the turn limit; the same test command is run eight or ten times in a row (bench/README.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from bugsweep.agent import focus, prompts
from bugsweep.agent.focus import failure_digest, focus_test_output, same_output, what_is_new
from bugsweep.agent.model import ToolCall
from bugsweep.agent.rewrite import FunctionSpan, enclosing_function
from bugsweep.agent.small_model.common import Notes, repo_file
from bugsweep.agent.tools import ToolOutcome, parse_arguments

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentRun


@dataclass
class Repeats:
    notes: Notes
    failed_calls: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    """Failed read_file/edit_file calls by (tool, arguments): the turn and the error, to recognise repeats."""
    commands: dict[str, tuple[int, str]] = field(default_factory=dict)
    """`run` commands seen: the turn and output of the last run of each."""
    last_calls: list[ToolCall] = field(default_factory=list)
    """The tool calls of the last reply the loop ran."""
    last_outcome: ToolOutcome | None = None
    stuck_on: FunctionSpan | None = None
    """The function to ask for before the next request: a test run repeated with nothing changed (see
    focus_run)."""

    def forget_failed_edit(self, run: AgentRun) -> None:
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

    def mark(self, run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
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

    def focus_run(self, run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
        """Test output cut to its failures; a repeated command answered with what is new since its last run."""
        args, _ = parse_arguments(call.arguments)
        command = str((args or {}).get("command", "")).strip()
        head, _, output = outcome.content.partition("\n")
        focused = focus_test_output(output)
        self.notes.failures = failure_digest(output) or self.notes.failures
        content = f"{head}\n[test output focused on the failures]\n{focused}" if focused else outcome.content
        earlier = self.commands.get(command)
        self.commands[command] = (run.turn, output)
        if earlier is not None:
            turn, before = earlier
            if same_output(before, output):
                content += "\n\n" + prompts.REPEAT_SAME.format(turn=turn)
                if focused:
                    self.stuck_on = self._where_it_fails(run, output)
            else:
                new = what_is_new(before, output)
                content += "\n\n" + prompts.REPEAT_CHANGED.format(
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
            if span is None or (span.path, span.name) in self.notes.asked:
                return None
            return span
        return None
