"""The task environment built once and reused: mining and a sweep on one repository, before and after, in one run.

1. Mining: `bugsweep mine REPO --limit N --runs 1` twice, one after the other: with the code before the task
   environment (`--before`, a commit of this repository, exported to a temporary folder: every validation runs its
   setup with pip in a fresh sandbox) and with this tree (each candidate's setup is a layer keyed by its dependency
   files, built once with uv and reused by both states of a candidate and by every later candidate with the same
   key). The "after" run starts from an empty environment folder and download cache: cold, as on a new machine.
2. Sweep: the tasks the "after" run kept, prepared one after the other as a sweep does (`pipeline.prepare` +
   `pipeline.setup`) with another empty environment folder: the setup step's wall time of the first task against the
   rest.

Usage: python bench/task_env.py --repo /work/.mirror/tkem+cachetools/repo --limit 5 --since 2019-01-01 --before c0115e5
       python bench/task_env.py --repo /work/.mirror/tkem+cachetools/repo --limit 10 --before c0115e5 --skip-before
Needs: bubblewrap, root (overlayfs), network to PyPI for the installs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _tree import export

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def mine(code: Path, repo: str, limit: int, out: Path, env_dir: Path, extra: list[str]) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(code), "BUGSWEEP_SANDBOX_ENV_DIR": str(env_dir)}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "bugsweep", "mine", repo, "--limit", str(limit), "--runs", "1", "--out", str(out),
         *extra],
        env=env, capture_output=True, text=True, cwd=code,
    )  # fmt: skip
    wall = time.monotonic() - started
    report: dict[str, object] = {}
    report_file = out.with_name(out.name + ".mining.json")
    if not report_file.exists():
        report_file = out.with_suffix(".mining.json")
    if report_file.exists():
        report = json.loads(report_file.read_text())
    kept = sum(1 for line in out.read_text().splitlines() if line.strip()) if out.exists() else 0
    return {"wall_s": round(wall, 1), "exit": proc.returncode, "kept": kept, "report": report,
            "stderr_tail": proc.stderr[-400:]}  # fmt: skip


def sweep_setups(tasks_file: Path, env_dir: Path) -> list[dict[str, object]]:
    from bugsweep.pipeline import prepare, setup
    from bugsweep.sandbox.local import LocalProvider
    from bugsweep.settings import SandboxSettings
    from bugsweep.spec import load_tasks

    provider = LocalProvider(SandboxSettings(env_dir=str(env_dir)))
    rows = []
    for spec in load_tasks(tasks_file):
        prepared = prepare(spec, provider)
        try:
            started = time.monotonic()
            setup(prepared)
            took = time.monotonic() - started
        finally:
            prepared.sandbox.release()
        env = prepared.environment
        rows.append({"task": spec.instance_id, "setup_s": round(took, 2), "reused": bool(env and env.reused),
                     "layer": env.key if env else None})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", required=True)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument(
        "--before", required=True, help="a commit of this repository without the task environment"
    )
    parser.add_argument("--since", default=None)
    parser.add_argument(
        "--skip-before", action="store_true", help="only the 'after' mining run and the sweep"
    )
    args = parser.parse_args()
    extra = ["--since", args.since] if args.since else []
    work = Path(tempfile.mkdtemp(prefix="bench-task-env-"))
    before_code = export(args.before, work / "before")

    results: dict[str, object] = {"repo": args.repo, "limit": args.limit, "before": args.before}
    runs = (("before", before_code), ("after", ROOT))
    for label, code in runs[1:] if args.skip_before else runs:
        results[label] = mine(
            code, args.repo, args.limit, work / f"{label}.jsonl", work / f"envs-{label}", extra
        )
        print(label, json.dumps({k: v for k, v in results[label].items() if k != "report"}), flush=True)  # type: ignore[union-attr]
    rows = sweep_setups(work / "after.jsonl", work / "envs-sweep")
    results["sweep"] = rows
    if rows:
        rest = [float(r["setup_s"]) for r in rows[1:]]  # type: ignore[arg-type]
        results["sweep_summary"] = {
            "first_s": rows[0]["setup_s"],
            "rest_median_s": statistics.median(rest) if rest else None,
            "rest_reused": sum(1 for r in rows[1:] if r["reused"]),
            "layers": len({r["layer"] for r in rows}),
        }
    (work / "results.json").write_text(json.dumps(results, indent=1))
    print(json.dumps({k: v for k, v in results.items() if k not in ("before", "after", "sweep")}, indent=1))
    print(f"results: {work / 'results.json'}")


if __name__ == "__main__":
    main()
