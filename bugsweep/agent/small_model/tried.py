"""Trying the model's code against the task's tests before the model hears of it: an edit inside one function,
a function written as text in a reply without a tool call, and a finish call while the tests still fail.

Each keeps what makes the tests pass and undoes the rest without a trace in the conversation (the trajectory
keeps every try: edit_tried, reply_code_tried, finish_refused).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from bugsweep.agent import prompts
from bugsweep.agent.focus import failure_digest, focus_test_output
from bugsweep.agent.model import ToolCall
from bugsweep.agent.rewrite import FunctionSpan, current_span, defined_names, functions_named
from bugsweep.agent.small_model.common import Notes, file_text
from bugsweep.agent.small_model.whole_function import rewrite_function
from bugsweep.agent.text import snippet

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentRun
    from bugsweep.agent.tools import ToolOutcome


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


def code_in_reply(run: AgentRun, notes: Notes, content: str) -> bool:
    """A reply without a tool call whose ```python block defines a function of the code under test: that
    function is tried in place of the file's and kept when the task's tests pass with it (the reply is then
    answered as an edit). Otherwise the file is put back, nothing is said, and the reply gets the usual nudge.

    Seen on the 1.5B model (bench/README.md, "The README's way ... code in a reply"): on a freshly started
    server its first reply explained the bug and wrote the right function as text, with no tool call; after the
    nudge it called finish, then sent the function back unchanged, and the right fix was never applied. Only
    functions of the files the first prompt named or the model read, defined once there, are tried.
    """
    if not run.test_command:
        return False
    names = defined_names(content)
    if not names:
        return False
    toolbox = run.toolbox
    files = [
        f
        for f in dict.fromkeys([*notes.sources, *toolbox.seen])
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


def answer_failing_finish(run: AgentRun, outcome: ToolOutcome) -> ToolOutcome | None:
    """A finish call while the task's tests still fail: the answer that says what they say (the work goes on);
    None when they pass. The policy asks this of the first finish call only: a second one ends the work as it is.

    Seen on the 1.5B model on real bugs (attrs, bench/README.md): after edits to a docstring of the wrong file
    it called finish with the failing test unchanged, its summary quoting the last error message.
    """
    if not run.test_command:
        return None
    tests = run.toolbox.run(run.test_command)
    if tests.exit_code == 0 or tests.timed_out:
        return None
    digest = failure_digest(tests.content) or focus_test_output(tests.content) or tests.content[-1500:]
    run.trajectory.add("finish_refused", turn=run.turn, tests_exit_code=tests.exit_code)
    return replace(
        outcome,
        finished=False,
        ok=False,
        summary="",
        content=prompts.FINISH_REFUSED.format(
            command=run.test_command.strip(), code=tests.exit_code, says=digest
        ),
    )
