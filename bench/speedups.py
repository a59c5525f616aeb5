"""Do the local sandbox's speed-ups earn their place? Whole jobs, each mechanism on and off, side by side.

A mechanism whose only purpose is speed stays only if it saves at least 10% of the wall time of a realistic job
(issue #24 item 6). This runs such jobs, each as a whole `bugsweep` process, under every configuration in turn
(interleaved: one repetition runs every configuration once, in an order rotated from one repetition to the next,
so that a drift of the machine's load touches them alike), and reports each configuration's wall time against the default's, repetition by repetition:

- `solve`: `bugsweep solve` on the buggy calc repository (tests/support/repos.py): prepare, setup (the
  environment layer is built by an untimed warm-up run and reused, as on any machine after its first task),
  baseline, the agent loop, the regrade. The model is a scripted OpenAI-compatible server on 127.0.0.1
  (tests/support/scripted_model.py) that answers every turn after `--latency` seconds (1 s: a fast hosted model)
  with a fixed script of `--turns` tool calls (`run` with shell commands and pytest, `read_file`, `edit_file`, the
  fix, `finish`), like a real short solve.
- `solve-warm`: the same solve as a long-lived process's later task (a worker's, a sweep's): in the same
  process, after a sandbox was made, used and released, and its spare disk made for the next one (so that the
  agent's sandbox has a spare and a resident); the solve's own time, without the process's start.
- `mine`: `bugsweep mine` on a generated history (bench/mining.py's: `--fixes` bug fixes, each after a commit
  adding the buggy function and before a docs-only commit), validating every candidate with `--runs` test runs
  per state, each in a sandbox of its own.

The configurations (each mechanism switched off through its setting, or here, for one without a setting):
- `on`: the defaults;
- `no-resident`: `BUGSWEEP_SANDBOX_RESIDENT=0` (a bubblewrap per command);
- `no-spares`: `BUGSWEEP_SANDBOX_SPARE_DISKS=0` (each sandbox makes its disk at create(); a resident only ever
  comes with a spare, so this is also without the resident);
- `no-spawner`: commands join the cgroups themselves (the spawner's start is replaced by "cannot start", which
  its callers already handle: the bench's own switch, there is no setting);
- `none`: all three off.

The three were removed after this measurement (issue #24 item 6; bench/README.md has the figures): to measure
them again, run this file on the tree of commit 3a0484d (`git archive 3a0484d | tar -x -C DIR`, then
`PYTHONPATH=DIR python DIR/bench/speedups.py`); later code runs only `--jobs solve,mine --configs on`.

Usage: python bench/speedups.py [--reps 3] [--jobs solve,solve-warm,mine] [--configs on,none] [--turns 24]
                                [--latency 1.0] [--json out.json]
Needs: bubblewrap and the rest of the local sandbox (README), root, and PyPI once for the warm-up's
`pip install pytest`.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.repos import PYTEST_SETUP, make_repo  # noqa: E402
from tests.support.scripted_model import ScriptedModelServer, tool_call  # noqa: E402

CONFIGS: dict[str, dict[str, str]] = {
    "on": {},
    "no-resident": {"BUGSWEEP_SANDBOX_RESIDENT": "0"},
    "no-spares": {"BUGSWEEP_SANDBOX_SPARE_DISKS": "0"},
    "no-spawner": {"BENCH_NO_SPAWNER": "1"},
    "none": {"BUGSWEEP_SANDBOX_RESIDENT": "0", "BUGSWEEP_SANDBOX_SPARE_DISKS": "0", "BENCH_NO_SPAWNER": "1"},
}

TEST_COMMAND = "python -m pytest -q"

#: The scripted solve: what a short real one does (look around, run the tests, read, edit, fix, check, finish).
SCRIPT: list[dict[str, Any]] = [
    tool_call("run", command="ls -la"),
    tool_call("read_file", path="calc.py"),
    tool_call("read_file", path="tests/test_calc.py"),
    tool_call("run", command=TEST_COMMAND),
    tool_call("run", command="grep -rn 'def ' --include=*.py ."),
    tool_call("run", command="git log --oneline | head -5"),
    tool_call("read_file", path="pyproject.toml"),
    tool_call("run", command="python -c 'import calc; print(calc.add(2, 3))'"),
    tool_call(
        "edit_file", path="calc.py", old="def mul(a, b):\n", new='def mul(a, b):\n    """a times b."""\n'
    ),
    tool_call("run", command="python -m pytest -q tests/test_calc.py::test_mul"),
    tool_call("run", command="cat calc.py"),
    tool_call("run", command="python -m pytest -q -x"),
    tool_call("read_file", path="calc.py"),
    tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b"),
    tool_call("run", command=TEST_COMMAND),
    tool_call("run", command="git diff"),
    tool_call("run", command="python -m pytest -q tests/test_calc.py::test_add"),
    tool_call("run", command="find . -name '*.py' -not -path './.git/*'"),
    tool_call("run", command="wc -l calc.py tests/test_calc.py"),
    tool_call("read_file", path="calc.py"),
    tool_call("run", command=TEST_COMMAND),
    tool_call("run", command="git status --short"),
    tool_call("run", command="python -m pytest -q -p no:cacheprovider"),
]


def script_reply(turns: int, latency: float) -> Any:
    """The server's step for every request: after `latency` s, the next call of the script by the number of
    replies in the conversation so far (so one server serves every run), `finish` at turn `turns`."""

    def step(body: dict[str, Any]) -> dict[str, Any]:
        time.sleep(latency)
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if done >= turns - 1:
            return tool_call("finish", summary="add() subtracted; it adds now.")
        return SCRIPT[done % len(SCRIPT)]

    return step


def mining_history(root: Path, fixes: int) -> Path:
    from bench.mining import generated_history

    return generated_history(root, fixes)


def child_argv(job: str, work: Path, args: argparse.Namespace, out: Path) -> list[str]:
    if job in ("solve", "solve-warm"):
        return [
            "solve", "--repo", str(work / "calc"), "--task", "add(2, 3) is not 5. Fix the code.",
            "--test-command", TEST_COMMAND, "--setup-command", PYTEST_SETUP, "--out", str(out),
            "--max-turns", str(args.turns + 5),
        ]  # fmt: skip
    return [
        "mine", str(work / "history"), "--setup-command", PYTEST_SETUP, "--runs", str(args.runs),
        "--out", str(out / "tasks.jsonl"),
    ]  # fmt: skip


def run_child(job: str, config: str, work: Path, args: argparse.Namespace, base_url: str, n: int) -> float:
    """One whole job as its own process under `config`: its wall time in seconds (checked: it must succeed)."""
    out = work / "out" / f"{job}-{config}-{n}"
    out.mkdir(parents=True)
    env = {
        **os.environ,
        **CONFIGS[config],
        "LLM_BASE_URL": base_url,
        "LLM_MODEL": "scripted",
        "LLM_API_KEY": "none",
        "BUGSWEEP_SANDBOX_ENV_DIR": str(work / "environments"),
        "BUGSWEEP_SANDBOX_CACHE_DIR": str(work / "cache"),
        "BUGSWEEP_SANDBOX_STATE_DIR": str(work / "state"),
        "PYTHONPATH": str(ROOT),
        "BENCH_WARM": "1" if job == "solve-warm" else "0",
    }
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", *child_argv(job, work, args, out)]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True)
    wall = time.monotonic() - started
    if job == "solve-warm":  # the second task's own time, without the process's start and its first sandbox
        wall = float(done.stderr.rsplit("BENCH_WALL_S=", 1)[1].split()[0])
    if done.returncode != 0:
        raise SystemExit(
            f"{job} under {config} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    if job == "mine":
        kept = len((out / "tasks.jsonl").read_text().splitlines())
        if kept != args.fixes:
            raise SystemExit(
                f"mine under {config} kept {kept} tasks, not {args.fixes}:\n{done.stdout[-3000:]}"
            )
    return wall


def child(argv: list[str]) -> None:
    """Inside the job's process: switch the spawner off if asked, warm the process up for `solve-warm`, then run
    the command line (timed from here: the time of the command, not of the process, is printed last)."""
    if os.environ.get("BENCH_NO_SPAWNER") == "1":
        from bugsweep.sandbox.local import spawner

        spawner.Spawner.start = classmethod(lambda cls, wrapper: None)  # type: ignore[method-assign,assignment]
    if os.environ.get("BENCH_WARM") == "1":
        warm_up(Path(argv[argv.index("--repo") + 1]))
    from bugsweep.cli import main

    started = time.monotonic()
    try:
        main(argv)
    except SystemExit as exc:
        print(f"BENCH_WALL_S={time.monotonic() - started:.3f}", file=sys.stderr)
        raise SystemExit(exc.code) from None


def warm_up(repo: Path) -> None:
    """What a long-lived process (a worker, a sweep) has done before its next task: a sandbox made, used and
    released, then the background work that follows it (the spare disk made for the next one) given time."""
    from bugsweep.sandbox import RepoSource, get_provider
    from bugsweep.sandbox.local import spares

    provider: Any = get_provider("local")
    with provider.create(RepoSource(str(repo))) as sandbox:
        sandbox.exec("true")
    deadline = time.monotonic() + 10
    while (
        provider.settings.spare_disks and not spares.ready(provider.state_dir) and time.monotonic() < deadline
    ):
        time.sleep(0.05)


def summary(walls: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Per configuration: median wall, and the median and range of its ratio to `on` repetition by repetition."""
    rows = {}
    for config, samples in walls.items():
        ratios = [s / o for s, o in zip(samples, walls["on"], strict=True)]
        rows[config] = {
            "median_wall_s": round(statistics.median(samples), 2),
            "ratio_to_on": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3),
            "ratio_max": round(max(ratios), 3),
            "walls_s": [round(s, 2) for s in samples],
        }
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--jobs", default="solve,mine")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--turns", type=int, default=24, help="turns of the scripted solve, `finish` included")
    p.add_argument("--latency", type=float, default=1.0, help="seconds the model takes per turn")
    p.add_argument("--fixes", type=int, default=3, help="bug fixes in the mined history")
    p.add_argument("--runs", type=int, default=3, help="test runs per state of a mined candidate")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    jobs, configs = args.jobs.split(","), args.configs.split(",")
    assert configs[0] == "on", "ratios are to the first configuration, `on`"
    results: dict[str, Any] = {"args": vars(args) | {"json": str(args.json)}, "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-speedups-") as tmp:
        work = Path(tmp)
        make_repo(work / "calc")
        mining_history(work / "history", args.fixes)
        with ScriptedModelServer([script_reply(args.turns, args.latency)] * 100_000) as server:
            for job in jobs:  # untimed: builds the environment layer every later run reuses
                run_child(job, "on", work, args, server.base_url, -1)
            walls: dict[str, dict[str, list[float]]] = {job: {c: [] for c in configs} for job in jobs}
            for rep in range(args.reps):
                for job in jobs:
                    order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
                    for config in order:
                        wall = run_child(job, config, work, args, server.base_url, rep)
                        walls[job][config].append(wall)
                        print(f"rep {rep} {job:10} {config:12} {wall:7.2f} s", flush=True)
    results["load_after"] = os.getloadavg()
    for job in jobs:
        results[job] = summary(walls[job])
        print(f"\n{job}: wall time of the whole job, each configuration against `on` (median of the pairs)")
        print(f"{'configuration':14} {'median s':>9} {'ratio':>7} {'min':>7} {'max':>7}")
        for config, row in results[job].items():
            print(
                f"{config:14} {row['median_wall_s']:9.2f} {row['ratio_to_on']:7.3f} "
                f"{row['ratio_min']:7.3f} {row['ratio_max']:7.3f}"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
