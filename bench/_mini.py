"""mini-swe-agent as the benchmarks run it (bench/embedded_demo.py, bench/real_bugs.py): its own config file
(`mini.yaml`, or `mini_textbased.yaml` for its text mode), its DefaultAgent, temperature 0, no cost limit, and the
benchmark's turn limit. What differs between the benchmarks is only where its commands run (the environment).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")


def mini_config(text: bool = False) -> dict[str, Any]:
    """mini-swe-agent's built-in config: `mini.yaml` (tool calls), or `mini_textbased.yaml` (`text`)."""
    import yaml
    from minisweagent.config import builtin_config_dir

    config: dict[str, Any] = yaml.safe_load(
        (builtin_config_dir / ("mini_textbased.yaml" if text else "mini.yaml")).read_text()
    )
    return config


def mini_agent(
    config: dict[str, Any],
    env: Any,
    *,
    base_url: str,
    model: str,
    max_turns: int,
    out_dir: Path,
    text: bool = False,
) -> Any:
    """A DefaultAgent on `env`, talking to the OpenAI-compatible server at `base_url`; its trajectory goes to
    out_dir/trajectory.json."""
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.litellm_model import LitellmModel
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    model_class = LitellmTextbasedModel if text else LitellmModel
    model_obj = model_class(
        model_name=f"openai/{model}",
        model_kwargs={
            "api_base": base_url,
            "api_key": "none",
            "temperature": 0.0,
            "max_tokens": 1024,
            "drop_params": True,
        },
        cost_tracking="ignore_errors",
        **{
            k: v
            for k, v in config.get("model", {}).items()
            if k in {"observation_template", "format_error_template"}
        },
    )
    agent_config = {k: v for k, v in config["agent"].items() if k in {"system_template", "instance_template"}}
    return DefaultAgent(
        model_obj,
        env,
        **agent_config,
        step_limit=max_turns,
        cost_limit=0.0,
        wall_time_limit_seconds=3600,
        output_path=out_dir / "trajectory.json",
    )


def run_mini_agent(agent: Any, problem: str, test_command: str) -> tuple[str, float]:
    """Run the agent on the problem, told the test command as bugsweep's agent is: (exit status, wall seconds).
    A crash of the agent is a failed run, recorded as such in the status."""
    started = time.monotonic()
    try:
        info = agent.run(f"{problem}\n\nThe tests run with this command: {test_command}")
        exit_status = info.get("exit_status", "")
    except Exception as exc:
        exit_status = f"crash: {type(exc).__name__}: {exc}"[:300]
    return exit_status, time.monotonic() - started


def token_usage(agent: Any) -> tuple[int, int]:
    """(prompt, completion) tokens over the agent's whole conversation, from the server's usage reports."""
    prompt = completion = 0
    for message in agent.messages:
        usage = ((message.get("extra") or {}).get("response") or {}).get("usage") or {}
        prompt += int(usage.get("prompt_tokens") or 0)
        completion += int(usage.get("completion_tokens") or 0)
    return prompt, completion
