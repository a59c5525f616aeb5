"""Benchmark: the embedded open model on the demo bug, bugsweep's agent vs mini-swe-agent, N runs each.

    python bench/embedded_demo.py --runs 5                # both agents
    python bench/embedded_demo.py --runs 5 --agents bugsweep
    python bench/embedded_demo.py --runs 3 --agents bugsweep,bugsweep-plain --case bench/cases/pages

What it measures (issue 3's bar: resolved in >= 4 of 5 runs, median wall time < 5 min on 2 cores):
- bugsweep: `bugsweep demo` exactly as a user runs it (a subprocess), graded by bugsweep (tests fail before, pass
  after, test files untouched). Wall time is the whole command, including sandbox and grading.
- mini-swe-agent (PyPI `mini-swe-agent`, its default `mini.yaml` tool-calling config, DefaultAgent, LocalEnvironment
  in a temporary copy of the same demo project) with the same model server, task text and turn limit. Graded the
  same way here: test files restored from git, then the test command must pass (and failed before).
- bugsweep runs under BUGSWEEP_POLICY=small-model (what the embedded model's configuration defaults to: the server
  here is reached through LLM_BASE_URL, so the policy is named explicitly); bugsweep-plain: the same with
  BUGSWEEP_POLICY=plain (edit_file applied as sent, no whole-function edits), to measure the policy side by side.
  (Called bugsweep-replace, with BUGSWEEP_EDIT_STYLE=replace, before the policies.)
`--case DIR` runs another small project instead of the demo (DIR holds the files and a case.json with "task" and
"test_command"; bench/cases/ has two); bugsweep then runs as `bugsweep solve` on a git copy of it.
The server is started once (or reused) for all runs, so its 3-15 s start is not in the per-run times.
`--cold` runs `bugsweep demo` exactly as the README's quick start does instead: no LLM_BASE_URL, no policy named,
so each run starts the embedded server itself (an empty prompt cache: the model's replies at temperature 0 differ
between a fresh server and one that has served the same prompt before) and stops it after; its start is in the
per-run times. bugsweep agents only; no model server may be running. Machine load
(`uptime`) is recorded before and after, because other processes share the 2 cores.
Results go to bench/results/embedded_demo-<time>.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bugsweep.cli.solve import DEMO_TASK, DEMO_TEST_COMMAND, materialise_demo_repo  # noqa: E402
from bugsweep.embedded import DEFAULT_MODEL, EmbeddedSettings  # noqa: E402
from bugsweep.embedded.server import EmbeddedModel, ensure_embedded_model, is_ready  # noqa: E402
from tests.support.repos import PYTEST_SETUP, make_repo  # noqa: E402


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


class Case:
    """The project the agents work on: the bundled demo, or a folder with the files and a case.json."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        if folder is None:
            self.name, self.task, self.test_command = "demo", DEMO_TASK, DEMO_TEST_COMMAND
        else:
            meta = json.loads((folder / "case.json").read_text())
            self.name, self.task, self.test_command = folder.name, meta["task"], meta["test_command"]

    def materialise(self, dest: Path) -> Path:
        """A git repository with the project in one commit, at `dest`."""
        if self.folder is None:
            return materialise_demo_repo(dest)
        files = {
            str(p.relative_to(self.folder)): p.read_text()
            for p in sorted(self.folder.rglob("*"))
            if p.is_file() and p.name != "case.json" and "__pycache__" not in p.parts
        }
        return make_repo(dest, files, message=f"{self.name}: with a bug")


def run_bugsweep(
    case: Case, base_url: str | None, model: str, out_dir: Path, max_turns: int, policy: str = "small-model"
) -> dict[str, Any]:
    """One `bugsweep demo` (or `bugsweep solve` on a copy of the case) run against the running server, or with
    `base_url` None as the README runs it (its own embedded server, the policy its default); the grade comes from
    its grade.json."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_") and k != "BUGSWEEP_POLICY"}
    if base_url is not None:
        env.update({"LLM_BASE_URL": base_url, "LLM_MODEL": model, "LLM_API_KEY": "none"})
    if base_url is not None or policy != "small-model":
        env["BUGSWEEP_POLICY"] = policy
    command = ["bugsweep", "demo", "--out", str(out_dir), "--max-turns", str(max_turns)]
    if case.folder is not None:
        repo = case.materialise(Path(tempfile.mkdtemp(prefix=f"bench-{case.name}-")) / "repo")
        command = [
            "bugsweep", "solve", "--repo", str(repo), "--task", case.task, "--test-command", case.test_command,
            "--setup-command", PYTEST_SETUP, "--out", str(out_dir), "--max-turns", str(max_turns),
        ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    (out_dir / "console.log").parent.mkdir(parents=True, exist_ok=True)
    (out_dir / "console.log").write_text(proc.stdout + proc.stderr)
    try:
        grade = json.loads((out_dir / "grade.json").read_text())
    except (OSError, ValueError):
        return {
            "agent": "bugsweep" if policy == "small-model" else f"bugsweep-{policy}",
            "resolved": False,
            "error": f"exit {proc.returncode}, no grade.json",
            "wall_s": wall,
            "turns": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "out": str(out_dir),
        }
    return {
        "agent": "bugsweep" if policy == "small-model" else f"bugsweep-{policy}",
        "resolved": bool(grade.get("resolved")),
        "stop_reason": grade.get("stop_reason"),
        "turns": grade.get("turns", 0),
        "prompt_tokens": grade.get("prompt_tokens", 0),
        "completion_tokens": grade.get("completion_tokens", 0),
        "cached_tokens": grade.get("cached_tokens", 0),
        "agent_wall_s": grade.get("wall_s"),
        "wall_s": wall,
        "error": grade.get("error"),
        "out": str(out_dir),
    }


def run_mini(
    case: Case, base_url: str, model: str, out_dir: Path, max_turns: int, text: bool = False
) -> dict[str, Any]:
    """One mini-swe-agent run on a fresh copy of the project, graded like bugsweep grades.

    `text`: mini's text-based mode (`mini_textbased.yaml`, the command in a fenced block, no `tools`) instead of
    its default tool-calling mode (`mini.yaml`).
    """
    # bench/_mini.py, imported first: it sets mini-swe-agent's environment before mini is imported
    from _mini import mini_agent, mini_config, run_mini_agent, token_usage
    from minisweagent.environments.local import LocalEnvironment

    config = mini_config(text)
    work = Path(tempfile.mkdtemp(prefix="mini-demo-"))
    repo = case.materialise(work / "repo")
    before = subprocess.run(case.test_command, shell=True, cwd=repo, capture_output=True, text=True)
    env = LocalEnvironment(cwd=str(repo), env=config.get("environment", {}).get("env", {}), timeout=300)
    agent = mini_agent(
        config, env, base_url=base_url, model=model, max_turns=max_turns, out_dir=out_dir, text=text
    )
    exit_status, wall = run_mini_agent(agent, case.task, case.test_command)
    changed_tests = subprocess.run(
        ["git", "status", "--porcelain", "tests"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    subprocess.run(["git", "checkout", "-q", "HEAD", "--", "tests"], cwd=repo, check=False)
    after = subprocess.run(case.test_command, shell=True, cwd=repo, capture_output=True, text=True)
    patch = subprocess.run(["git", "diff"], cwd=repo, capture_output=True, text=True).stdout
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "patch.diff").write_text(patch)
    prompt, completion = token_usage(agent)
    shutil.rmtree(work, ignore_errors=True)
    return {
        "agent": "mini-swe-agent-text" if text else "mini-swe-agent",
        "resolved": before.returncode != 0 and after.returncode == 0,
        "stop_reason": exit_status,
        "turns": agent.n_calls,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "wall_s": wall,
        "tests_changed_by_agent": bool(changed_tests),
        "patch_lines": len(patch.splitlines()),
        "out": str(out_dir),
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [r["wall_s"] for r in rows]
    return {
        "resolved": sum(r["resolved"] for r in rows),
        "runs": len(rows),
        "median_wall_s": statistics.median(walls) if walls else None,
        "max_wall_s": max(walls) if walls else None,
        "median_turns": statistics.median(r["turns"] for r in rows) if rows else None,
        "median_prompt_tokens": statistics.median(r["prompt_tokens"] for r in rows) if rows else None,
        "median_completion_tokens": statistics.median(r["completion_tokens"] for r in rows) if rows else None,
        "stop_reasons": sorted({str(r.get("stop_reason")) for r in rows}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--agents",
        default="bugsweep,mini",
        help="comma-separated: bugsweep, bugsweep-plain, mini (tool calls), mini-text",
    )
    parser.add_argument(
        "--case", type=Path, default=None, help="a folder like bench/cases/pages (default: the demo)"
    )
    parser.add_argument("--max-turns", type=int, default=30)
    parser.add_argument(
        "--cold",
        action="store_true",
        help="each run as the README's `bugsweep demo`: it starts (and stops) the embedded server itself",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run_root = Path(tempfile.gettempdir()) / f"bugsweep-bench-{stamp}"
    agents = [a.strip() for a in args.agents.split(",") if a.strip()]
    case = Case(args.case)
    if args.cold and (any(not a.startswith("bugsweep") for a in agents) or args.case is not None):
        parser.error("--cold runs `bugsweep demo` only: --agents bugsweep,bugsweep-plain and no --case")
    if args.cold and is_ready(EmbeddedSettings(), DEFAULT_MODEL.name):
        parser.error("--cold: a model server is already running (bugsweep model stop)")
    report: dict[str, Any] = {
        "started": stamp,
        "case": case.name,
        "task": case.task,
        "load_before": load(),
        "cores": os.cpu_count(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "cold": args.cold,
        "runs": [],
    }
    print(f"load before: {report['load_before']}", flush=True)
    server = (
        contextlib.nullcontext(EmbeddedModel(None, DEFAULT_MODEL.name, None, started=False))  # type: ignore[arg-type]
        if args.cold
        else ensure_embedded_model(progress=lambda m: print(m, flush=True))
    )
    with server as endpoint:
        report["model"] = endpoint.model
        for agent in agents:
            for i in range(1, args.runs + 1):
                out_dir = run_root / f"{agent}-{i}"
                if agent.startswith("bugsweep"):
                    policy = "plain" if agent == "bugsweep-plain" else "small-model"
                    row = run_bugsweep(
                        case, endpoint.base_url, endpoint.model, out_dir, args.max_turns, policy
                    )
                else:
                    row = run_mini(
                        case,
                        endpoint.base_url,
                        endpoint.model,
                        out_dir,
                        args.max_turns,
                        text=agent == "mini-text",
                    )
                row["run"], row["load"] = i, load()
                report["runs"].append(row)
                print(
                    f"{agent:<15} run {i}: {'RESOLVED' if row['resolved'] else 'not resolved':<13} "
                    f"stop={row.get('stop_reason')} turns={row['turns']} "
                    f"tokens={row['prompt_tokens']}+{row['completion_tokens']} wall={row['wall_s']:.0f}s "
                    f"({row['load'].split('load average:')[-1].strip()})",
                    flush=True,
                )
    report["load_after"] = load()
    names = {
        "bugsweep": "bugsweep",
        "bugsweep-plain": "bugsweep-plain",
        "mini": "mini-swe-agent",
        "mini-text": "mini-swe-agent-text",
    }
    report["summary"] = {
        names[a]: summarise([r for r in report["runs"] if r["agent"] == names[a]]) for a in agents
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"embedded_demo-{case.name}-{stamp}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"\nload after: {report['load_after']}")
    print(
        "| agent | resolved/runs | median wall | max wall | median turns | median tokens (prompt+completion) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for agent, s in report["summary"].items():
        print(
            f"| {agent} | {s['resolved']}/{s['runs']} | {s['median_wall_s']:.0f} s | {s['max_wall_s']:.0f} s | "
            f"{s['median_turns']} | {s['median_prompt_tokens']:.0f}+{s['median_completion_tokens']:.0f} |"
        )
    print(f"results: {path}  (run folders in {run_root})")


if __name__ == "__main__":
    sys.exit(main())
