"""The task environment's bytecode: whole mining runs with the code before and after, side by side, in one run.

A graded test run writes no bytecode (PYTHONDONTWRITEBYTECODE, bugsweep.grading.harness), so when the task
environment holds none, every run compiles pytest and the task's dependencies again. Since 9eeab95 the setup makes
the installed packages' bytecode once (UV_COMPILE_BYTECODE) and it goes with the environment's layer.

For each repository, `bugsweep mine REPO ...` runs with the code of `--before` (a commit of this repository,
exported to a temporary folder) and with this tree, alternately, `--rounds` times each, every run with an empty
environment folder (cold: each layer is built, its bytecode included, within the run), and the download cache
shared (warmed by an untimed first run). Printed per run: wall time, the CPU time of the
processes it waited for (the sandboxes' commands are not all among them: read the wall time), tasks kept; then the
medians and their ratio.

Usage: python bench/bytecode.py --before b9271ae --rounds 2 \\
           --repo /work/.mirror/Kozea+tinycss2/repo --repo /work/.mirror/tox-dev+platformdirs/repo
Needs: bubblewrap, root (overlayfs), the package index for the installs.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _tree import export

ROOT = Path(__file__).resolve().parents[1]
TEST_COMMAND = "python -m pytest -q -p no:cacheprovider -o addopts= {test_files}"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def mine(code: Path, repo: str, work: Path, args: argparse.Namespace) -> tuple[float, float, int]:
    """One whole `bugsweep mine` run: wall seconds, CPU seconds, tasks kept."""
    out = work / "tasks.jsonl"
    command = [
        sys.executable, "-m", "bugsweep", "mine", repo, "--since", args.since, "--until", args.until,
        "--limit", str(args.limit), "--runs", "1", "--test-command", TEST_COMMAND, "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code), "BUGSWEEP_SANDBOX_ENV_DIR": str(work / "envs")}
    cpu, started = children_cpu(), time.monotonic()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=work)
    wall, cpu = time.monotonic() - started, children_cpu() - cpu
    if proc.returncode != 0:
        sys.exit(f"bugsweep mine failed ({proc.returncode}) with {code}:\n{proc.stderr[-3000:]}")
    kept = len(out.read_text().splitlines()) if out.exists() else 0
    return wall, cpu, kept


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", required=True, help="commit of this repository with the code before")
    parser.add_argument("--repo", action="append", required=True, help="a repository to mine (repeatable)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--since", default="2010-01-01")
    parser.add_argument("--until", default="2026-09-01")
    parser.add_argument("--limit", type=int, default=10000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-bytecode-") as tmp:
        codes = {"before": export(args.before, Path(tmp) / "before"), "after": ROOT}
        for repo in args.repo:
            mine(ROOT, repo, Path(tempfile.mkdtemp(dir=tmp)), args)  # untimed: the download cache
            runs: dict[str, list[tuple[float, float, int]]] = {"before": [], "after": []}
            for i in range(args.rounds):
                for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
                    result = mine(codes[name], repo, Path(tempfile.mkdtemp(dir=tmp)), args)
                    runs[name].append(result)
                    print(f"{Path(repo).parent.name} {name}: {result[0]:.1f} s wall, {result[1]:.1f} s CPU, "
                          f"{result[2]} kept", flush=True)  # fmt: skip
            wall = {name: statistics.median(r[0] for r in rs) for name, rs in runs.items()}
            cpu = {name: statistics.median(r[1] for r in rs) for name, rs in runs.items()}
            print(f"{Path(repo).parent.name}: median wall {wall['before']:.1f} -> {wall['after']:.1f} s "
                  f"({wall['after'] / wall['before']:.2f}x), CPU {cpu['before']:.1f} -> {cpu['after']:.1f} s "
                  f"({cpu['after'] / cpu['before']:.2f}x)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
