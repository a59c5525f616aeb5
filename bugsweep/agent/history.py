"""How the conversation is kept: what goes back into the history from a reply, and how it shrinks when the
endpoint says it no longer fits. Used by the loop for every model and every policy."""

from __future__ import annotations

import json
from typing import Any

from bugsweep.agent import prompts


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
