"""Task environments built and reused while mining one window of a repository's history, before and after a change.

`bugsweep mine REPO --runs 1 ...` runs twice, one after the other: with the code at `--before` (a commit of this
repository, exported to a temporary folder) and with this tree, each from an empty environment folder, download
cache and checkout cache (cold, as on a new machine). Counted from each run's own log: the setups that built an
environment ("setup: building the task environment") and those that reused one ("setup: reusing ..."), the
environment layers left in its environment folder, the tasks kept and the wall time.

Usage: python bench/env_reuse.py --repo /work/.mirror/python-humanize+humanize/repo --before main \
           --since 2024-09-10 --until 2025-06-01 --limit 10
Needs: bubblewrap, root (overlayfs), network to PyPI for the installs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _tree import export

ROOT = Path(__file__).resolve().parents[1]

#: Runs `bugsweep mine` with the setup step's log lines on stderr.
RUNNER = (
    "import logging, sys\n"
    "handler = logging.StreamHandler(sys.stderr)\n"
    "handler.setFormatter(logging.Formatter('ENVLOG %(message)s'))\n"
    "log = logging.getLogger('bugsweep.sandbox.local.taskenv')\n"
    "log.addHandler(handler)\n"
    "log.setLevel(logging.INFO)\n"
    "from bugsweep.cli import main\n"
    "main(sys.argv[1:])\n"
)


def mine(code: Path, work: Path, args: argparse.Namespace) -> dict[str, object]:
    env_dir = work / "envs"
    env = {**os.environ, "PYTHONPATH": str(code), "BUGSWEEP_SANDBOX_ENV_DIR": str(env_dir),
           "BUGSWEEP_SANDBOX_CACHE_DIR": str(work / "cache")}  # fmt: skip
    argv = ["mine", args.repo, "--runs", "1", "--limit", str(args.limit), "--out", str(work / "tasks.jsonl")]
    for flag in ("since", "until", "setup_command"):
        if getattr(args, flag):
            argv += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, *argv], env=env, capture_output=True, text=True, cwd=code
    )
    wall = time.monotonic() - started
    lines = [line for line in proc.stderr.splitlines() if line.startswith("ENVLOG ")]
    tasks = work / "tasks.jsonl"
    layers = [
        p.name for p in env_dir.iterdir() if (p / "meta.json").exists() and not p.name.startswith("base-")
    ]
    return {
        "wall_s": round(wall, 1),
        "exit": proc.returncode,
        "builds": sum("building the task environment" in line for line in lines),
        "reuses": sum("reusing the task environment" in line for line in lines),
        "layers": len(layers),
        "kept": len(tasks.read_text().splitlines()) if tasks.exists() else 0,
        "setup_commands": sorted({line.rsplit(": ", 1)[-1] for line in lines if ": " in line}),
        "stderr_tail": proc.stderr[-600:] if proc.returncode not in (0, 1) else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", required=True)
    parser.add_argument("--before", required=True, help="a commit of this repository: the code before")
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--since")
    parser.add_argument("--until")
    parser.add_argument("--setup-command")
    parser.add_argument("--only", choices=["before", "after"])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-env-reuse-"))
    before = export(args.before, work / "before-code")
    results: dict[str, object] = {
        "repo": args.repo,
        "before": args.before,
        "window": [args.since, args.until],
    }
    for side, code in (("before", before), ("after", ROOT)):
        if args.only and side != args.only:
            continue
        (work / side).mkdir()
        results[side] = mine(code, work / side, args)
        print(json.dumps({side: results[side]}), flush=True)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    print(f"results: {work / 'results.json'}")


if __name__ == "__main__":
    main()
