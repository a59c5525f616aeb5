"""The `small-model` policy object: what it keeps of one run, and which of its parts each of the loop's hooks
calls (the parts, and what each answers, are listed in small_model/__init__.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bugsweep.agent import focus
from bugsweep.agent.focus import failing_tests, failure_digest, files_in_traceback, focus_test_output
from bugsweep.agent.model import ModelReply, ToolCall
from bugsweep.agent.policy import Policy
from bugsweep.agent.small_model.common import Notes
from bugsweep.agent.small_model.lookups import code_under_test
from bugsweep.agent.small_model.repeats import Repeats
from bugsweep.agent.small_model.tool_help import help_with_edit, read_help
from bugsweep.agent.small_model.tried import edit_passes_tests
from bugsweep.agent.small_model.whole_function import WholeFunctions, function_to_rewrite
from bugsweep.agent.tools import ToolOutcome

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentRun


class SmallModelPolicy(Policy):
    name = "small-model"
    reads_short_files_whole = True  # tool_help.py: a short file is read whole, so it is never edited blind

    def __init__(self) -> None:
        self.notes = Notes()
        """What the policy has learned of the task: the failing tests' digest, the code files, what it asked for."""
        self.repeats = Repeats(self.notes)
        self.functions = WholeFunctions(self.notes)

    def start(self, run: AgentRun) -> None:
        """Replace the first message's file list with the failing tests and how they fail (see focus.first_prompt)."""
        if not run.test_command:
            return
        started = time.monotonic()
        tests = run.toolbox.run(run.test_command)
        output = tests.content
        self.notes.failures = failure_digest(output)
        files, _ = run.toolbox.list_files(limit=100_000)
        failing = failing_tests(output)
        named = files_in_traceback(output, set(files))
        test_files = [f for f in dict.fromkeys([t.split("::")[0] for t in failing] + named) if f in files]
        # Seen: an assertion's traceback shows only the test's frame, so the code under test went unnamed and the
        # model edited the package's __init__. Where the names the test imports are defined is named too.
        toolbox = run.toolbox
        under_test = [
            f
            for t in test_files
            if toolbox.is_protected(t)
            for f in code_under_test(toolbox, f"{toolbox.workdir}/{t}", t, self.notes.failures or "")[1]
        ]
        sources = [f for f in dict.fromkeys(named + under_test) if not toolbox.is_protected(f)]
        self.notes.sources = sources
        shown = sources + [f for f in test_files if f not in sources]
        first = focus.first_prompt(
            run.task,
            run.test_command,
            toolbox.workdir,
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

    def before_request(self, run: AgentRun) -> None:
        self.repeats.forget_failed_edit(run)
        if self.repeats.stuck_on is not None:
            span, self.repeats.stuck_on = self.repeats.stuck_on, None
            self.functions.request(run, span, None, stuck=True)

    def after_reply(self, run: AgentRun, reply: ModelReply) -> bool:
        self.repeats.last_calls, self.repeats.last_outcome = [], None
        pending, self.functions.pending = self.functions.pending, None
        calls = reply.tool_calls
        if pending is not None:
            # The answer is a reply without tool calls. Asked once: tool calls sent instead (an edit_file call
            # included) run as sent.
            if not calls:
                self.functions.answer(run, pending, reply.content)
                return True
        elif len(calls) == 1 and calls[0].name == "edit_file":
            span = function_to_rewrite(run.toolbox, calls[0].arguments, asked=self.notes.asked)
            if span is not None:
                if not edit_passes_tests(run, calls[0], span):
                    self.functions.request(run, span, calls[0])
                return True
        self.repeats.last_calls = calls
        return False

    def after_tool(self, run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
        if outcome.finished:
            return outcome
        if call.name == "run":
            outcome = self.repeats.focus_run(run, call, outcome)
        elif call.name == "read_file":
            outcome = read_help(run, call, outcome)
        elif call.name == "edit_file" and not outcome.ok and not outcome.format_error:
            outcome = help_with_edit(run, call, outcome)
        self.repeats.last_outcome = outcome = self.repeats.mark(run, call, outcome)
        return outcome
