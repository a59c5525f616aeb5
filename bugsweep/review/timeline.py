"""A trajectory (bugsweep.agent.trajectory's events) as the review page's timeline: one entry per turn.

Each turn holds the model's reply (its text, its reasoning), its tokens, its own cost (the events record the running
total), how long the model and the tools took, each tool call with its arguments, outcome and result (the tool
message answering the call's id), the messages the harness added, and every other event of the turn (a policy's
notes, retries, context shortening) as a one-line note. The page renders it in the browser, from JSON, only when a
task is opened; everything in it is plain data, shown as text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

#: Fields of an event that every event has, left out of a note's text.
_COMMON = frozenset({"type", "t", "turn"})


def _text(value: Any) -> str:
    """A message's content as text (a list of content parts is joined; anything else is its JSON)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in value)
    return json.dumps(value, ensure_ascii=False)


def _note(event: dict[str, Any]) -> str:
    fields = {k: v for k, v in event.items() if k not in _COMMON}
    return f"{event.get('type', '?')}: {json.dumps(fields, ensure_ascii=False, default=str)}"


def _new_turn(number: int) -> dict[str, Any]:
    return {
        "turn": number, "kind": "reply", "t": None, "model_s": 0.0, "tools_s": 0.0, "prompt": 0,
        "completion": 0, "cached": 0, "cost": 0.0, "text": "", "reasoning": "", "finish_reason": None,
        "calls": [], "messages": [], "notes": [],
    }  # fmt: skip


def build_timeline(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """{"start": the messages before the first reply, "turns": [...], "stop": the stop event or None,
    "meta": the first event's task, model, policy and configuration digest}."""
    start: list[dict[str, str]] = []
    turns: dict[int, dict[str, Any]] = {}
    calls_by_id: dict[str, dict[str, Any]] = {}
    meta: dict[str, Any] = {}
    stop: dict[str, Any] | None = None
    cost_so_far = 0.0

    def turn_of(event: dict[str, Any]) -> dict[str, Any]:
        number = int(event.get("turn") or 0)
        if number not in turns:
            turns[number] = _new_turn(number)
        return turns[number]

    for event in events:
        kind = event.get("type")
        if kind == "meta":
            meta = {k: event.get(k) for k in ("model", "policy", "task", "test_command", "config_digest")}
        elif kind in ("model_reply", "model_sample"):
            turn = turn_of(event)
            message = event.get("message") or {}
            usage = event.get("usage") or {}
            total = float(event.get("cost_usd") or 0.0)
            turn.update(
                kind="sample" if kind == "model_sample" else "reply",
                t=event.get("t"),
                model_s=float(event.get("latency_s") or 0.0),
                prompt=int(usage.get("prompt_tokens") or 0),
                completion=int(usage.get("completion_tokens") or 0),
                cached=int(usage.get("cached_tokens") or 0),
                cost=max(total - cost_so_far, 0.0),
                text=_text(message.get("content")),
                reasoning=_text(message.get("reasoning_content") or message.get("reasoning")),
                finish_reason=event.get("finish_reason"),
            )
            cost_so_far = max(cost_so_far, total)
            if kind == "model_sample":
                turn["notes"].append(
                    f"a sample at temperature {event.get('temperature')} (not in the conversation)"
                )
        elif kind == "tool":
            turn = turn_of(event)
            call = {
                "name": str(event.get("name") or "?"),
                "args": event.get("arguments"),
                "ok": bool(event.get("ok")),
                "exit": event.get("exit_code"),
                "timed_out": bool(event.get("timed_out")),
                "format_error": bool(event.get("format_error")),
                "recovered": bool(event.get("recovered")),
                "s": float(event.get("duration_s") or 0.0),
                "result": None,
            }
            turn["tools_s"] += call["s"]
            turn["calls"].append(call)
            if event.get("id"):
                calls_by_id[str(event["id"])] = call
        elif kind == "message":
            message = event.get("message") or {}
            role, text = str(message.get("role") or "?"), _text(message.get("content"))
            answered = calls_by_id.get(str(message.get("tool_call_id"))) if role == "tool" else None
            if answered is not None and answered["result"] is None:
                answered["result"] = text
            elif not event.get("turn"):
                start.append({"role": role, "text": text})
            else:
                turn_of(event)["messages"].append({"role": role, "text": text})
        elif kind == "stop":
            stop = {k: v for k, v in event.items() if k not in _COMMON}
        else:
            target = turn_of(event) if event.get("turn") else None
            if target is None:
                start.append({"role": "note", "text": _note(event)})
            else:
                target["notes"].append(_note(event))
    ordered = [turns[n] for n in sorted(turns) if n > 0 or turns[n]["calls"] or turns[n]["notes"]]
    for turn in ordered:
        turn["tools_s"] = round(turn["tools_s"], 4)
    return {"meta": meta, "start": start, "turns": ordered, "stop": stop}
