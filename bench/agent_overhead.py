"""Harness overhead per agent turn: bugsweep's loop against mini-swe-agent, both driven by the same zero-latency
scripted model server in the same process and run.

Each agent gets N replies that call a shell tool with `true`, then a reply that ends the run. The scripted server
stamps the arrival of every request; the time between two consecutive requests is one turn of harness work (parse
the reply, run the command in the environment, append the result, save the trajectory, build and send the next
request) plus the server's own constant cost, which is the same for both agents. The median over the turns is
reported, with the interquartile range.

Environments, so that like is compared with like:
- `subprocess`: a plain host shell per command (bugsweep: a minimal Sandbox over subprocess, defined below;
  mini-swe-agent: its LocalEnvironment);
- `bwrap`: isolated with bubblewrap (bugsweep: its local sandbox, overlayfs + cgroup + namespaces;
  mini-swe-agent: its BubblewrapEnvironment).
Both agents save their trajectory after every step, as they do by default in real runs.

Usage: python bench/agent_overhead.py [--turns 200] [--json results.json]
Needs: pip install mini-swe-agent (the `bench` extra); bubblewrap for the bwrap rows.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bugsweep.agent.loop import run_agent
from bugsweep.agent.model import ChatModel
from bugsweep.sandbox.base import ExecResult, tail
from bugsweep.settings import AgentSettings, ModelSettings
from tests.support.repos import make_repo, with_pytest
from tests.support.scripted_model import ScriptedModelServer, tool_call

MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class SubprocessSandbox:
    """A Sandbox over plain subprocess in a host folder: no isolation, the same footing as mini's LocalEnvironment."""

    def __init__(self, root: Path) -> None:
        self.id = "subprocess"
        self.workdir = str(root)
        self.files = self

    def read_text(self, path: str) -> str:
        return Path(path).read_text()

    def write(self, path: str, data: str | bytes) -> None:
        Path(path).write_bytes(data.encode() if isinstance(data, str) else data)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def exec(self, command: str, *, timeout: float = 300.0, cwd: str | None = None, **_: Any) -> ExecResult:
        started = time.monotonic()
        try:
            p = subprocess.run(
                ["bash", "-c", command],
                cwd=cwd or self.workdir,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            return ExecResult(None, str(exc.stdout or ""), str(exc.stderr or ""), timed_out=True)
        out, cut = tail(p.stdout, 64 * 1024)
        return ExecResult(p.returncode, out, p.stderr, truncated=cut, duration_s=time.monotonic() - started)

    def release(self) -> None:
        pass

    def __enter__(self) -> SubprocessSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def stamped(reply: dict[str, Any], arrivals: list[float]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A scripted step that records when its request arrived."""

    def step(_: dict[str, Any]) -> dict[str, Any]:
        arrivals.append(time.perf_counter())
        return reply

    return step


def per_turn_ms(arrivals: list[float]) -> list[float]:
    return [(b - a) * 1000 for a, b in itertools.pairwise(arrivals)]


def bench_bugsweep(env: str, turns: int, work: Path) -> list[float]:
    repo = make_repo(Path(tempfile.mkdtemp(dir=work)) / "repo")
    arrivals: list[float] = []
    steps = [stamped(tool_call("run", command="true"), arrivals) for _ in range(turns)]
    steps.append(stamped(tool_call("finish", summary="done"), arrivals))
    with ScriptedModelServer(steps) as server:
        model = ChatModel(ModelSettings(base_url=server.base_url, model="scripted"))
        settings = AgentSettings(max_turns=turns + 5, max_wall_s=None)
        if env == "bwrap":
            from bugsweep.sandbox import RepoSource, get_provider

            sandbox: Any = with_pytest(get_provider("local").create(RepoSource(str(repo))))
        else:
            sandbox = SubprocessSandbox(repo)
        with sandbox:
            result = run_agent(
                task="bench",
                sandbox=sandbox,
                model=model,
                settings=settings,
                trajectory_path=work / f"bugsweep-{env}.json",
            )
    assert result.stop_reason == "finished" and result.turns == turns + 1, result.stop_reason
    return per_turn_ms(arrivals)


def bench_mini(env: str, turns: int, work: Path) -> list[float]:
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import builtin_config_dir
    from minisweagent.models.litellm_model import LitellmModel

    repo = make_repo(Path(tempfile.mkdtemp(dir=work)) / "repo")
    arrivals: list[float] = []

    def bash(command: str) -> dict[str, Any]:
        return {
            "content": "THOUGHT: go.",
            "tool_calls": [{"name": "bash", "arguments": {"command": command}}],
        }

    steps = [stamped(bash("true"), arrivals) for _ in range(turns)]
    steps.append(stamped(bash(MINI_SUBMIT), arrivals))
    config = yaml.safe_load((builtin_config_dir / "default.yaml").read_text())["agent"]
    config.update(step_limit=turns + 5, cost_limit=0, output_path=work / f"mini-{env}.traj.json")
    with ScriptedModelServer(steps) as server:
        model = LitellmModel(
            model_name="openai/scripted",
            model_kwargs={"api_base": server.base_url, "api_key": "none"},
            cost_tracking="ignore_errors",
        )
        if env == "bwrap":
            from minisweagent.environments.extra.bubblewrap import BubblewrapEnvironment

            environment: Any = BubblewrapEnvironment(cwd=str(repo))
        else:
            from minisweagent.environments.local import LocalEnvironment

            environment = LocalEnvironment(cwd=str(repo))
        agent = DefaultAgent(model, environment, **config)
        info = agent.run("bench")
    assert info.get("exit_status") == "Submitted", info
    return per_turn_ms(arrivals)


def summarise(samples: list[float]) -> dict[str, float]:
    """Median and quartiles over all turns, plus the medians of the first and last quarter of the run: a harness
    whose per-turn work grows with the history shows it as last > first."""
    q = statistics.quantiles(samples, n=4)
    k = max(1, len(samples) // 4)
    return {
        "median_ms": statistics.median(samples),
        "p25_ms": q[0],
        "p75_ms": q[2],
        "first_quarter_median_ms": statistics.median(samples[:k]),
        "last_quarter_median_ms": statistics.median(samples[-k:]),
        "turns": len(samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--envs", default="subprocess,bwrap")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
    # Without this, importing litellm tries to download its price list (3 tries) on an offline machine.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True  # its "Provider List" banner on every unknown-price lookup

    rows: dict[str, dict[str, float]] = {}
    work = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    try:
        agents: list[tuple[str, Callable[[str, int, Path], list[float]]]] = [
            ("bugsweep", bench_bugsweep),
            ("mini-swe-agent", bench_mini),
        ]
        for i, env in enumerate(args.envs.split(",")):
            if env == "bwrap" and not shutil.which("bwrap"):
                print("bwrap not installed: skipping the bwrap rows", file=sys.stderr)
                continue
            # Alternate the order per environment so neither agent always runs on a warmer machine.
            for name, fn in agents if i % 2 == 0 else agents[::-1]:
                rows[f"{name} / {env}"] = summarise(fn(env, args.turns, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"{'agent / environment':30} {'median ms/turn':>14} {'p25':>7} {'p75':>7} {'first 1/4':>9} {'last 1/4':>9}"
    )
    for key, row in rows.items():
        print(
            f"{key:30} {row['median_ms']:14.2f} {row['p25_ms']:7.2f} {row['p75_ms']:7.2f} "
            f"{row['first_quarter_median_ms']:9.2f} {row['last_quarter_median_ms']:9.2f}"
        )
    for env in args.envs.split(","):
        ours, theirs = rows.get(f"bugsweep / {env}"), rows.get(f"mini-swe-agent / {env}")
        if ours and theirs:
            print(f"ratio bugsweep/mini-swe-agent ({env}): {ours['median_ms'] / theirs['median_ms']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
