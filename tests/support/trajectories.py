"""A synthetic long run folder for the review page's size and speed checks (tests/test_review.py,
bench/review_page.py): a trajectory of N turns written event by event as the agent loop writes them (a model reply
with its usage, a tool event, the tool's result message), with results of the sizes real runs have (a failing
pytest run's output, up to the loop's 6,000-character tail; a file read). It is made up, not recorded: the page
must open fast whatever the turns say.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bugsweep.grading import Grade

_PYTEST_FAILURE = (
    "F.F..                                                                    [100%]\n"
    "=================================== FAILURES ===================================\n"
    "_________________________________ test_add_{n} _________________________________\n\n"
    "    def test_add_{n}():\n>       assert add({n}, 3) == {m}\nE       assert {k} == {m}\n"
    "E        +  where {k} = add({n}, 3)\n\ntests/test_calc.py:{n}: AssertionError\n"
)


def _result(turn: int) -> str:
    """About 4,000 characters of test output, or a file read every third turn."""
    if turn % 3 == 0:
        body = "".join(f"def f_{turn}_{i}(a, b):\n    return a + b + {i}\n\n\n" for i in range(60))
        return f"calc.py ({60 * 4} lines):\n{body}"
    lines = "".join(_PYTEST_FAILURE.format(n=turn + i, m=turn + i + 3, k=turn + i - 3) for i in range(12))
    return f"Exit code: 1\n{lines}FAILED tests/test_calc.py::test_add_{turn} - assert\n2 failed, 3 passed in 0.05s\n"


def long_trajectory(turns: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "meta", "t": 0.0, "model": "synthetic", "policy": "plain", "task": "test_add fails",
         "test_command": "python -m pytest -q", "config_digest": "0123456789ab"},
        {"type": "message", "t": 0.01, "turn": 0, "message": {"role": "system", "content": "You fix bugs."}},
        {"type": "message", "t": 0.02, "turn": 0, "message": {"role": "user", "content": "Task: test_add fails"}},
    ]  # fmt: skip
    t, tokens = 0.02, 0
    for turn in range(1, turns + 1):
        call_id = f"call_{turn:04d}"
        name, arguments = (
            ("read_file", {"path": "calc.py"})
            if turn % 3 == 0
            else ("run", {"command": f"python -m pytest -q -k {turn}"})
        )
        prompt, completion = 1_000 + 40 * turn, 60
        tokens += prompt + completion
        t += 1.5
        reply = {
            "role": "assistant",
            "content": f"Turn {turn}: the test still fails; I look at the output once more.",
            "tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)}}],
        }  # fmt: skip
        events += [
            {"type": "model_reply", "t": round(t, 4), "turn": turn, "total_tokens": tokens,
             "cost_usd": round(tokens * 2e-7, 6), "message": reply,
             "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": prompt // 2},
             "latency_s": 1.2, "finish_reason": "tool_calls", "attempts": 1, "recovered_tool_calls": False},
            {"type": "tool", "t": round(t + 0.3, 4), "turn": turn, "id": call_id, "name": name, "arguments": arguments,
             "recovered": False, "duration_s": 0.3, "ok": False, "format_error": False, "exit_code": 1,
             "timed_out": False},
            {"type": "message", "t": round(t + 0.3, 4), "turn": turn,
             "message": {"role": "tool", "tool_call_id": call_id, "content": _result(turn)}},
        ]  # fmt: skip
    events.append({"type": "stop", "t": round(t + 0.4, 4), "turn": turns, "stop_reason": "max_turns",
                   "detail": f"{turns} turns", "summary": None, "policy": "plain", "turns": turns})  # fmt: skip
    return events


def write_long_run(folder: Path, turns: int = 200, instance_id: str = "calc-long") -> Path:
    """A run folder (grade.json, patch.diff, trajectory.json, task.json) whose agent ran `turns` turns."""
    events = long_trajectory(turns)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trajectory.json").write_text(json.dumps(events, indent=None), encoding="utf-8")
    (folder / "patch.diff").write_text(
        "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n"
        "-    return a - b\n+    return a - b + 0\n",
        encoding="utf-8",
    )
    grade = Grade(
        instance_id=instance_id, model="synthetic", failed_before=True, FAIL_TO_FAIL=["tests/test_calc.py::test_add"],
        reason="1 test(s) that failed before do not pass after", stop_reason="max_turns", policy="plain",
        turns=turns, prompt_tokens=sum(1_000 + 40 * n for n in range(1, turns + 1)), completion_tokens=60 * turns,
        wall_s=1.5 * turns, config={"policy": "plain", "agent": {"max_turns": turns}}, config_digest="0123456789ab",
    )  # fmt: skip
    (folder / "grade.json").write_text(grade.model_dump_json(indent=2), encoding="utf-8")
    return folder
