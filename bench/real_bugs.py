"""Benchmark: real bug fixes mined from public projects' history, bugsweep's agent vs mini-swe-agent.

    python bench/real_bugs.py                                   # every task, both agents, the embedded model
    python bench/real_bugs.py --agents bugsweep --max-tasks 5
    python bench/real_bugs.py --resume bench/results/real_bugs-<stamp>.json   # skip the runs already done
    python bench/real_bugs.py --agents bugsweep --attempts 3 --policy plain   # pass@3 and pass@1 of the same runs

The tasks (bench/real_bugs.jsonl) were made by `bugsweep mine` on clones of the repositories the file names. The file
holds a repository URL, the fix's parent and fix commits, the test files, test ids and commands, and no project
source: the test patch is rebuilt here from the clone (the fix commit's diff of its test files).
`--mirrors DIR` points at local clones laid out as DIR/<owner>+<name>/repo (default /work/.mirror); without one the
repository URL is cloned.

Both agents get the same task in the same kind of sandbox, the same model server, the same turn limit, and are
graded by the same grader:
- bugsweep: `pipeline.solve_task`, as `bugsweep sweep` runs a task (prepare, setup, baseline, agent, regrade), with
  the policy of `--policy`, else BUGSWEEP_POLICY, else the embedded model's own (`small-model`, as `bugsweep demo`
  runs it); the policy in force is read back from grade.json.
- mini-swe-agent (PyPI `mini-swe-agent`, its default `mini.yaml` tool-calling config and DefaultAgent): its
  `bash` tool runs in a bugsweep sandbox prepared exactly as for bugsweep (test patch applied, setup run, tests
  failing), then `pipeline.regrade` grades it (test files restored, FAIL_TO_PASS and PASS_TO_PASS checked). Its task
  text is the problem statement plus the test command (bugsweep's agent is told the test command too).
One run at a time (the machine is shared: run it under `nice -n 19`, which it makes hold against other sessions'
work too, see yield_as_niced); results are written after every run, so a stopped benchmark keeps what it measured.
Results: bench/results/real_bugs-<time>.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TASKS = ROOT / "bench" / "real_bugs.jsonl"


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def local_repo(url: str, mirrors: Path) -> str:
    """The local clone of `url` under `mirrors` (owner+name/repo), or the URL itself."""
    m = re.match(r"https://github\.com/([^/]+)/([^/]+?)(\.git)?/?$", url)
    if m:
        path = mirrors / f"{m[1]}+{m[2]}" / "repo"
        if path.exists():
            return str(path)
    return url


def with_test_patch(spec: Any) -> Any:
    """The task with its test_patch rebuilt from the local clone: the fix commit's changes to its test files (the
    task file does not carry them, so that no project source is committed here)."""
    if spec.test_patch or not spec.fix_commit or not spec.test_files:
        return spec
    diff = subprocess.run(
        ["git", "-C", spec.repo, "diff", "--binary", "--no-renames", spec.base_commit, spec.fix_commit, "--",
         *spec.test_files],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return spec.model_copy(update={"test_patch": diff})


def policy_of(grade: dict[str, Any]) -> str:
    policy = grade.get("policy")
    if isinstance(policy, dict):
        return str(policy.get("name", policy))
    if policy:
        return str(policy)
    return f"edit_style={os.environ.get('BUGSWEEP_EDIT_STYLE', 'auto')} (no policy key in grade.json)"


def run_bugsweep(
    spec: Any, base_url: str, model: str, out_dir: Path, max_turns: int, attempts: int = 1,
    escalate_to: list[Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    from bugsweep.pipeline import solve_task
    from bugsweep.sandbox import get_provider
    from bugsweep.settings import AgentSettings, ModelSettings

    settings = ModelSettings(base_url=base_url, model=model, api_key="none")  # type: ignore[arg-type]
    started = time.monotonic()
    error = None
    try:
        solve_task(
            spec,
            provider=get_provider("local"),
            model_settings=settings,
            agent_settings=AgentSettings(max_turns=max_turns, attempts=attempts),
            out_dir=out_dir,
            labels={"purpose": "bench", "task": spec.instance_id},
            escalate_to=escalate_to or [],
        )
    except Exception as exc:  # recorded in grade.json by solve_task; the run is counted as not resolved
        error = f"{type(exc).__name__}: {exc}"[:500]
    wall = time.monotonic() - started
    try:
        grade = json.loads((out_dir / "grade.json").read_text())
    except (OSError, ValueError):
        grade = {}
    return {
        "agent": "bugsweep",
        "policy": policy_of(grade),
        "resolved": bool(grade.get("resolved")),
        "stop_reason": grade.get("stop_reason"),
        "turns": grade.get("turns", 0),
        "prompt_tokens": grade.get("prompt_tokens", 0),
        "completion_tokens": grade.get("completion_tokens", 0),
        "agent_wall_s": grade.get("agent_wall_s"),
        "wall_s": wall,
        "error": error or grade.get("error"),
        "failure_kind": grade.get("failure_kind"),
        "kept_attempt": grade.get("kept_attempt"),
        "resolved_first": bool(grade.get("resolved")) and grade.get("kept_attempt") in (None, 1),
        "attempts": [
            {k: a.get(k) for k in ("attempt", "model", "temperature", "verdict", "stop_reason", "turns",
                                   "prompt_tokens", "completion_tokens", "cost_usd", "wall_s")}
            for a in grade.get("attempts") or []
        ],
        "out": str(out_dir),
    }  # fmt: skip


def run_mini(spec: Any, base_url: str, model: str, out_dir: Path, max_turns: int) -> dict[str, Any]:
    """One mini-swe-agent run whose bash commands run in a bugsweep sandbox, graded by bugsweep's grader."""
    # bench/_mini.py, imported first: it sets mini-swe-agent's environment before mini is imported
    from _mini import mini_agent, mini_config, run_mini_agent, token_usage
    from minisweagent.environments.local import LocalEnvironment

    from bugsweep.pipeline import baseline, prepare, regrade, setup
    from bugsweep.rundir import write_run_dir
    from bugsweep.sandbox import get_provider

    class SandboxEnvironment(LocalEnvironment):  # type: ignore[misc]
        """mini's environment protocol over a bugsweep sandbox (the same sandbox bugsweep's agent gets)."""

        def __init__(self, sandbox: Any, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.sandbox = sandbox

        def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
            result = self.sandbox.exec(
                action.get("command", ""), cwd=cwd or None, timeout=timeout or self.config.timeout
            )
            output = {
                "output": result.output + ("\n(timed out)" if result.timed_out else ""),
                "returncode": result.exit_code if result.exit_code is not None else -1,
                "exception_info": "",
            }
            self._check_finished(output)
            return output

    config = mini_config()
    started = time.monotonic()
    prepared = None
    row: dict[str, Any] = {"agent": "mini-swe-agent", "policy": "mini.yaml (mini-swe-agent's default)"}
    try:
        prepared = prepare(spec, get_provider("local"), labels={"purpose": "bench", "task": spec.instance_id})
        setup(prepared)
        before = baseline(prepared)
        env = SandboxEnvironment(
            prepared.sandbox,
            cwd=prepared.sandbox.workdir,
            env=config.get("environment", {}).get("env", {}),
            timeout=300,
        )
        agent = mini_agent(config, env, base_url=base_url, model=model, max_turns=max_turns, out_dir=out_dir)
        exit_status, agent_wall = run_mini_agent(agent, spec.problem_statement, spec.test_command)
        verdict, after, patch = regrade(prepared, before, None, model_name=model)
        prompt, completion = token_usage(agent)
        verdict.stop_reason, verdict.turns = exit_status, agent.n_calls
        verdict.prompt_tokens, verdict.completion_tokens = prompt, completion
        write_run_dir(out_dir, verdict, patch=patch, before=before, after=after, spec=spec)
        row |= {
            "resolved": verdict.resolved,
            "stop_reason": exit_status,
            "turns": agent.n_calls,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "agent_wall_s": agent_wall,
            "tests_changed_by_agent": bool(verdict.touched_test_files),
        }
    except Exception as exc:
        row |= {"resolved": False, "error": f"{type(exc).__name__}: {exc}"[:500], "turns": 0}
        row.setdefault("prompt_tokens", 0)
        row.setdefault("completion_tokens", 0)
    finally:
        if prepared is not None:
            prepared.sandbox.release()
    row["wall_s"] = time.monotonic() - started
    row["out"] = str(out_dir)
    return row


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    resolved = [r for r in rows if r["resolved"]]
    tokens = [r["prompt_tokens"] + r["completion_tokens"] for r in resolved]
    return {
        "resolved": len(resolved),
        "resolved_first_attempt": sum(1 for r in rows if r.get("resolved_first", r["resolved"])),
        "runs": len(rows),
        "errors": sum(1 for r in rows if r.get("error")),
        "median_turns": statistics.median(r["turns"] for r in rows) if rows else None,
        "median_tokens": statistics.median(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
        if rows
        else None,
        "tokens_per_resolved": sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows) / len(resolved)
        if resolved
        else None,
        "median_tokens_resolved_run": statistics.median(tokens) if tokens else None,
        "median_wall_s": statistics.median(r["wall_s"] for r in rows) if rows else None,
        "total_wall_s": sum(r["wall_s"] for r in rows),
        "policies": sorted({str(r.get("policy")) for r in rows}),
    }


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def yield_as_niced() -> None:
    """Run under `nice -n N`: make the niceness hold against other sessions' work too. With the kernel's autogroup
    scheduling on (/proc/sys/kernel/sched_autogroup_enabled, as on these machines) each session is one group with
    an equal share, so a niced benchmark started from its own shell took as much CPU as a whole test suite (the
    model server at 37-50% of the 2 cores beside it); giving its autogroup the same niceness makes it yield. The
    embedded model server it starts is in the same session, and so is every process of that session (the shell
    that started it too). Best effort: without autogroup nothing changes."""
    niceness = os.nice(0)
    if niceness > 0:
        with contextlib.suppress(OSError):
            Path("/proc/self/autogroup").write_text(str(niceness))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=Path, default=DEFAULT_TASKS)
    parser.add_argument("--agents", default="bugsweep,mini", help="comma-separated: bugsweep, mini")
    parser.add_argument("--max-turns", type=int, default=30)
    parser.add_argument("--max-tasks", type=int, default=None, help="only the first N tasks of the file")
    parser.add_argument("--only", default=None, help="comma-separated instance ids")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--resume", type=Path, default=None, help="a results file to continue")
    parser.add_argument(
        "--base-url", default=None, help="a running model server (default: the embedded model)"
    )
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--attempts",
        type=int,
        default=1,
        help="bugsweep's attempts per task and model (each in its own sandbox, graded by the clean room; the "
        "first resolved one ends the task); the table gives pass@1 beside pass@N",
    )
    parser.add_argument(
        "--escalate-to",
        action="append",
        default=[],
        metavar="NAME=BASE_URL[,KEY_ENV[,MODEL_ID]]",
        help="a model bugsweep's agent escalates to on what the model did not resolve (repeat, in order), as "
        "`bugsweep solve --escalate-to`",
    )
    parser.add_argument(
        "--policy",
        default=None,
        help="bugsweep's agent policy (default: BUGSWEEP_POLICY, else the embedded model's own, as `bugsweep demo`); "
        "comma-separated: each task runs under each policy in turn (plain,small-model), so a stopped run keeps "
        "both sides of the tasks it finished",
    )
    parser.add_argument(
        "--extra-setup",
        default=None,
        metavar="CMD",
        help="appended to every task's setup command as `&& CMD` (a pin of the task environment, e.g. "
        "\"pip install 'pytest<9.2' 'setuptools<75'\": the environment changed since mining)",
    )
    args = parser.parse_args()
    from bugsweep.embedded import DEFAULT_MODEL

    # Read by AgentSettings in run_bugsweep; recorded per run from grade.json.
    policies = (args.policy or os.environ.get("BUGSWEEP_POLICY") or DEFAULT_MODEL.policy).split(",")
    # Stopped with SIGTERM (a background job ignores SIGINT): unwind as for Ctrl-C, so sandboxes are released.
    signal.signal(signal.SIGTERM, _interrupt)
    yield_as_niced()

    from bugsweep.embedded.server import ensure_embedded_model
    from bugsweep.spec import load_tasks

    tasks = load_tasks(args.tasks)
    if args.only:
        wanted = set(args.only.split(","))
        tasks = [t for t in tasks if t.instance_id in wanted]
    if args.max_tasks:
        tasks = tasks[: args.max_tasks]
    agents = [a.strip() for a in args.agents.split(",") if a.strip()]
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    if args.resume:
        path = args.resume
        report = json.loads(path.read_text())
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"real_bugs-{stamp}.json"
        report = {
            "started": stamp,
            "tasks_file": str(args.tasks),
            "max_turns": args.max_turns,
            "attempts": args.attempts,
            "escalate_to": args.escalate_to,
            "policies": policies,
            "extra_setup": args.extra_setup,
            "cores": os.cpu_count(),
            "load_before": load(),
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip(),
            "runs": [],
        }
    run_root = Path(tempfile.gettempdir()) / f"bugsweep-real-bugs-{report['started']}"
    done = {(r["task"], r["agent"], r.get("asked_policy")) for r in report["runs"]}
    names = {"bugsweep": "bugsweep", "mini": "mini-swe-agent"}

    def save() -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=2))
        tmp.replace(path)

    from bugsweep.endpoints import parse_endpoints

    escalate_to = [e.settings() for e in parse_endpoints(args.escalate_to, [], "--escalate-to", "")]
    print(
        f"{len(tasks)} task(s), agents {agents}, max {args.max_turns} turns, {args.attempts} attempt(s) per "
        f"model{', then ' + ', '.join(m.model for m in escalate_to) if escalate_to else ''}; load: {load()}",
        flush=True,
    )
    with ensure_embedded_model(progress=lambda m: print(m, flush=True)) as endpoint:
        base_url = args.base_url or endpoint.base_url
        model = args.model or endpoint.model
        report["model"] = model
        for spec in tasks:
            spec = with_test_patch(spec.model_copy(update={"repo": local_repo(spec.repo, args.mirrors)}))
            if args.extra_setup:
                spec = spec.model_copy(
                    update={"setup_command": f"{spec.setup_command} && {args.extra_setup}"}
                )
            for agent, policy in [(a, p) for a in agents for p in (policies if a == "bugsweep" else [None])]:
                if (spec.instance_id, names[agent], policy) in done:
                    continue
                out_dir = run_root / spec.instance_id / (f"{agent}-{policy}" if policy else agent)
                if policy:  # read by AgentSettings in run_bugsweep; recorded per run from grade.json
                    os.environ["BUGSWEEP_POLICY"] = policy
                if agent == "bugsweep":
                    row = run_bugsweep(
                        spec, base_url, model, out_dir, args.max_turns, args.attempts, escalate_to
                    )
                else:
                    row = run_mini(spec, base_url, model, out_dir, args.max_turns)
                row["task"], row["load"], row["asked_policy"] = spec.instance_id, load(), policy
                report["runs"].append(row)
                save()
                print(
                    f"{spec.instance_id:<28} {names[agent]:<15} {policy or '':<12} "
                    f"{'RESOLVED' if row['resolved'] else 'not resolved':<13} "
                    f"{'at attempt ' + str(row['kept_attempt']) + ' ' if row.get('kept_attempt') else ''}"
                    f"stop={row.get('stop_reason')} "
                    f"turns={row['turns']} tokens={row['prompt_tokens']}+{row['completion_tokens']} "
                    f"wall={row['wall_s']:.0f}s {('error: ' + row['error'][:120]) if row.get('error') else ''}",
                    flush=True,
                )
    report["load_after"] = load()
    report["summary"] = {
        f"{names[a]} ({p})" if p else names[a]: summarise(
            [r for r in report["runs"] if r["agent"] == names[a] and r.get("asked_policy") == p]
        )
        for a in agents
        for p in (policies if a == "bugsweep" else [None])
    }
    save()
    print(
        f"\n| agent | resolved/runs (pass@{args.attempts}) | pass@1 | median turns | tokens per resolved task | "
        "median wall | policy |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for agent, s in report["summary"].items():
        per = f"{s['tokens_per_resolved']:.0f}" if s["tokens_per_resolved"] else "-"
        wall = f"{s['median_wall_s']:.0f} s" if s["median_wall_s"] is not None else "-"
        print(
            f"| {agent} | {s['resolved']}/{s['runs']} | {s['resolved_first_attempt']}/{s['runs']} | "
            f"{s['median_turns']} | {per} | {wall} | {'; '.join(s['policies'])} |"
        )
    print(f"results: {path}  (run folders in {run_root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
