"""Trying the model's edit inside one function against the task's tests before the model hears of it: kept when
they pass, undone without a trace in the conversation otherwise (the trajectory keeps every try: edit_tried)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bugsweep.agent import prompts
from bugsweep.agent.model import ToolCall
from bugsweep.agent.rewrite import FunctionSpan
from bugsweep.agent.small_model.common import file_text

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentRun


def edit_passes_tests(run: AgentRun, call: ToolCall, span: FunctionSpan) -> bool:
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
