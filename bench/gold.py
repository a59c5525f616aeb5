"""Every mined task graded with its own fix: is each task one that its real fix resolves under the grader?

A task that its own fix commit does not resolve is one no agent can: a PASS_TO_PASS test that the task's command
never runs, an environment that differs between mining and grading, a test that passes only on the mining run.
This runs `bugsweep sweep --tasks FILE` as a user would, with a scripted OpenAI-compatible stand-in for the model
(tests/support/scripted_model.py: NOT a model) that answers every task with the task's own `patch` (the fix commit
without its tests, applied with `git apply` through the agent's `run` tool) and then `finish`. The grade is the
grader's own (baseline, the clean room's regrade with the mirror pair).

Usage: python bench/gold.py TASKS.jsonl [TASKS.jsonl ...] [--out DIR]
Each task file as `bugsweep mine` writes it; a task's `repo` may be replaced with its local clone: `--mirrors DIR`
maps a repository path ending in OWNER+NAME/repo to DIR/OWNER+NAME/repo (default: the path as it is).
Prints one line per task that was not resolved (its grade's reason) and the counts per file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.scripted_model import ScriptedModelServer, tool_call  # noqa: E402


def gold_answers(patches: dict[str, str]) -> Any:
    """The stand-in's step: the patch of the task whose problem statement the first user message holds."""

    def step(body: dict[str, Any]) -> dict[str, Any]:
        if any(m.get("role") == "tool" for m in body["messages"]):
            return tool_call("finish", summary="applied the fix commit's change")
        asked = " ".join(str(m.get("content") or "") for m in body["messages"] if m.get("role") == "user")
        found = [patch for problem, patch in patches.items() if problem in asked]
        if len(found) != 1:
            return tool_call("finish", summary="no single task matched")
        script = f"cat > /tmp/gold.diff <<'BUGSWEEP_GOLD'\n{found[0]}BUGSWEEP_GOLD\ngit apply /tmp/gold.diff"
        return tool_call("run", command=script)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("tasks", nargs="+", type=Path)
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for the sweeps (default: a new temporary one)"
    )
    parser.add_argument("--mirrors", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="gold-"))
    out.mkdir(parents=True, exist_ok=True)
    totals = {"resolved": 0, "not resolved": 0}
    for path in args.tasks:
        tasks = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if args.mirrors:
            for task in tasks:
                parts = Path(task["repo"]).parts
                if len(parts) >= 2 and parts[-1] == "repo":
                    task["repo"] = str(args.mirrors / parts[-2] / "repo")
        problems = [t["problem_statement"] for t in tasks]
        if len(set(problems)) != len(problems):  # the stand-in tells tasks apart by their problem statements
            dupes = {p for p in problems if problems.count(p) > 1}
            tasks = [t for t in tasks if t["problem_statement"] not in dupes]
            print(f"{path.name}: {len(dupes)} problem statement(s) shared by several tasks: those left out")
        name = path.stem.replace("+", "-").replace(".", "-")
        task_file = out / f"{name}.jsonl"
        task_file.write_text("".join(json.dumps(t) + "\n" for t in tasks))
        patches = {t["problem_statement"]: t["patch"] for t in tasks}
        with ScriptedModelServer([gold_answers(patches)] * (2 * len(tasks) + 10)) as server:
            env = {
                **os.environ,
                "LLM_BASE_URL": server.base_url,
                "LLM_MODEL": "gold",
                "LLM_API_KEY": "unused",
            }
            subprocess.run(
                [sys.executable, "-m", "bugsweep", "sweep", "--tasks", str(task_file), "--name", f"gold-{name}"],
                cwd=out, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
            )  # fmt: skip
        grades = [
            json.loads(g.read_text()) for g in (out / "artifacts" / f"gold-{name}").glob("*/*/*/grade.json")
        ]
        resolved = sum(1 for g in grades if g["resolved"])
        print(f"{path.name}: {resolved} of {len(tasks)} resolved by their own fix ({len(grades)} graded)")
        for g in sorted(grades, key=lambda g: g["instance_id"]):
            if not g["resolved"]:
                print(f"  {g['instance_id']}: {g.get('reason') or g.get('error')}")
        totals["resolved"] += resolved
        totals["not resolved"] += len(tasks) - resolved
    print(json.dumps(totals))


if __name__ == "__main__":
    main()
