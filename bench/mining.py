"""Mining throughput, and comparison wall time against the sum of the single runs.

1. Mining: a generated history of `--fixes` bug fixes, each preceded by a commit that adds the buggy function and
   followed by a docs-only commit (so 3 commits per fix, 1 of which is a real task), mined with the real local
   sandbox and real pytest. Reported: commits scanned per minute, candidates validated per minute, tasks kept, and
   the screening speed alone (git only, no sandbox). `--repo PATH` mines a real repository instead (first
   `--limit` tasks).
2. Comparison: `--tasks` tasks x `--models` scripted models x `--runs` runs through the compare flow (Prefect, real
   local sandbox, real pytest), with `--latency` seconds of model "thinking" per reply (a real endpoint takes
   seconds per turn; the scripted server none). Reported: the flow's wall time against the sum of the runs' own
   wall times (what one after another would take), at `--concurrency`.

Usage: python bench/mining.py [--fixes 6] [--runs 2] [--tasks 4] [--models 3] [--latency 2] [--concurrency 6]
       python bench/mining.py --only mining --repo /work/.mirror/pallets+click/repo --limit 5
Needs: bubblewrap (the local sandbox); a Prefect API (PREFECT_API_URL) or a few seconds for a temporary one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bugsweep.mining import Rejection, mine, scan_history, screen
from bugsweep.sandbox import get_provider
from bugsweep.spec import TaskSpec, dump_tasks
from tests.support.repos import PYTEST_SETUP, commit_all, make_repo, write_files
from tests.support.scripted_model import ScriptedModelServer, tool_call


def generated_history(root: Path, fixes: int) -> Path:
    """`fixes` times: add a buggy function, fix it with a test, touch the docs."""
    repo = make_repo(
        root,
        {
            "lib.py": "",
            "README.md": "lib\n",
            "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\n',
        },
    )
    source = ""
    for i in range(fixes):
        source += f"\n\ndef f{i}(x):\n    return x - {i + 1}\n"
        write_files(repo, {"lib.py": source})
        commit_all(repo, f"Add f{i}")
        source = source.replace(f"return x - {i + 1}", f"return x + {i + 1}")
        write_files(repo, {
            "lib.py": source,
            f"tests/test_f{i}.py": f"from lib import f{i}\n\n\ndef test_f{i}():\n    assert f{i}(1) == 1 + {i + 1}\n",
        })  # fmt: skip
        commit_all(repo, f"Fix f{i} subtracting instead of adding")
        write_files(repo, {"README.md": f"lib, with f0..f{i}\n"})
        commit_all(repo, f"Document f{i}")
    return repo


def bench_mining(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    repo = Path(args.repo) if args.repo else generated_history(work / "history", args.fixes)
    t = time.monotonic()
    screened = sum(not isinstance(screen(c), Rejection) for c in scan_history(repo))
    commits = sum(1 for _ in scan_history(repo))
    screen_s = time.monotonic() - t
    result = mine(
        str(repo),
        provider=get_provider("local"),
        runs=args.runs,
        limit=args.limit or 10_000,
        concurrency=args.mine_concurrency,
    )
    minutes = result.elapsed_s / 60
    return {
        "repo": str(args.repo or f"generated ({args.fixes} fixes, {commits} commits)"),
        "runs_per_state": args.runs,
        "validations_at_once": args.mine_concurrency,
        "commits_in_history": commits,
        "screening_passed": screened,
        "screening_only_s": round(screen_s, 2),
        "screening_commits_per_min": round(commits / (screen_s / 60)),
        "scanned": result.scanned,
        "validated": result.validated,
        "kept": len(result.tasks),
        "rejected_by_reason": result.reasons(),
        "elapsed_s": round(result.elapsed_s, 1),
        "scanned_per_min": round(result.scanned / minutes, 1),
        "validated_per_min": round(result.validated / minutes, 2),
        "s_per_validation": round(result.elapsed_s / max(result.validated, 1), 1),
    }


def bench_compare(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from flows.compare import ModelEntry, compare

    tasks = []
    for i in range(args.tasks):
        repo = make_repo(work / f"task{i}", {
            "calc.py": f"def f(x):\n    return x - {i + 1}\n",
            "tests/test_calc.py": f"from calc import f\n\n\ndef test_f():\n    assert f(1) == 1 + {i + 1}\n",
            "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\n',
        })  # fmt: skip
        tasks.append(TaskSpec(instance_id=f"t{i}", repo=str(repo), problem_statement=f"f() must add {i + 1}",
                              test_command="python -m pytest -q", setup_command=PYTEST_SETUP))  # fmt: skip
    tasks_file = work / "tasks.jsonl"
    dump_tasks(tasks, tasks_file)

    def fixer(body: dict[str, Any]) -> dict[str, Any]:
        time.sleep(args.latency)
        messages = body["messages"]
        if not any(m["role"] == "assistant" for m in messages):
            i = next(m["content"] for m in messages if m["role"] == "user").split("must add ")[1].split()[0]
            return tool_call("edit_file", path="calc.py", old=f"return x - {i}", new=f"return x + {i}")
        return tool_call("finish", summary="done")

    os.environ["BUGSWEEP_STORE_URL"] = str(work / "artifacts")
    servers = [ScriptedModelServer([fixer] * 10_000, model=f"m{j}").start() for j in range(args.models)]
    rows = []
    try:
        models = [ModelEntry.parse(f"m{j}={s.base_url}") for j, s in enumerate(servers)]
        for concurrency in sorted({1, args.concurrency}) if args.sequential else [args.concurrency]:
            t = time.monotonic()
            report = compare(
                tasks_file, models, runs=args.runs, concurrency=concurrency, name=f"bench-c{concurrency}"
            )
            wall = time.monotonic() - t
            n = len(report.records)
            rows.append({
                "runs": n,
                "shape": f"{args.tasks} tasks x {args.models} models x {args.runs} runs",
                "concurrency": concurrency,
                "model_latency_s_per_reply": args.latency,
                "flow_wall_s": round(report.wall_s or 0.0, 1),
                "call_wall_s_incl_flow_start": round(wall, 1),
                "sum_of_run_wall_s": round(report.sum_run_wall_s, 1),
                "slowest_run_s": round(max(r.wall_s for r in report.records), 1),
                "mean_run_s": round(report.sum_run_wall_s / n, 1),
                "sum_over_wall": round(report.sum_run_wall_s / (report.wall_s or 1), 2),
                "resolved": sum(r.resolved for r in report.records),
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    finally:
        for s in servers:
            s.stop()
    return {"rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["mining", "compare"])
    p.add_argument("--fixes", type=int, default=6)
    p.add_argument("--repo", help="mine this repository instead of a generated one")
    p.add_argument("--limit", type=int, default=0, help="with --repo: stop after this many tasks")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--models", type=int, default=3)
    p.add_argument("--latency", type=float, default=2.0)
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--mine-concurrency", type=int, default=1, help="candidates validated at once")
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--no-sequential", dest="sequential", action="store_false", help="skip the concurrency=1 baseline"
    )
    args = p.parse_args()
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-mining-") as tmp:
        if args.only in (None, "mining"):
            results["mining"] = bench_mining(args, Path(tmp))
            print(json.dumps(results["mining"], indent=2), flush=True)
        if args.only in (None, "compare"):
            results["compare"] = bench_compare(args, Path(tmp))
            print(json.dumps(results["compare"], indent=2), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
