"""The clean-room regrade against the old in-sandbox regrade: same task, same run, alternating.

The task: the ~50 MB generated repository of sandbox_start.py plus a buggy `calc.py` and one failing pytest test.
Each sample prepares a task (sandbox, task-state commit, the task-state snapshot read from outside), runs the
baseline, applies the one-line fix inside the sandbox (what an agent does), then grades it one of two ways:

- old: what bugsweep did before issue #10, in the agent's own sandbox: `git add -A` + `git diff --cached` for the
  patch and the changed files, restore the test files with git, run the tests there;
- new: `pipeline.regrade`: read the change from outside, make a fresh sandbox in the task state, write the change
  into it, run the tests there.

Reported: the median of each, their difference, the parts of each (the old one's git inside the sandbox; the new
one's reading the change, the fresh sandbox, the tests), each one's time beside its test run (what grading adds to
running the tests), and the task-state snapshot that `prepare` now pays.

Usage: python bench/regrade_cost.py [--runs 10] [--size-mb 50] [--json results.json]
Needs: Linux, root, bubblewrap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sandbox_start import make_big_repo, ms, tree_mb

from bugsweep import pipeline
from bugsweep.grading import cleanroom, regrade
from bugsweep.grading.runs import GIT, run_tests
from bugsweep.sandbox.local import LocalProvider
from bugsweep.settings import SandboxSettings
from bugsweep.spec import TaskSpec
from tests.support.repos import BUGGY_CALC, PYTEST_SETUP, commit_all, write_files

EXCLUDES = "':(exclude,glob)**/__pycache__/**' ':(exclude,glob)**/*.pyc' ':(exclude,glob)**/.pytest_cache/**'"
TEST_COMMAND = "python -m pytest -q tests"


def old_regrade(prepared: pipeline.PreparedTask, parts: dict[str, list[float]]) -> float:
    """The pre-#10 regrade, as it was: git inside the agent's sandbox, then the tests in that same sandbox."""
    t0 = time.perf_counter()
    sbx, state = prepared.sandbox, prepared.task_state
    patch = sbx.exec(
        f"{GIT} add -A -- . {EXCLUDES} >/dev/null 2>&1; {GIT} diff --cached --binary {state}", timeout=300
    )
    names = sbx.exec(f"{GIT} diff --cached --name-only --no-renames {state}", timeout=300)
    assert "return a + b" in patch.stdout and names.stdout.split() == ["calc.py"]
    parts.setdefault("old: git add + diff inside", []).append(time.perf_counter() - t0)
    t1 = time.perf_counter()
    run = run_tests(sbx, TEST_COMMAND)
    parts.setdefault("old: tests", []).append(time.perf_counter() - t1)
    assert run.passed, run.log[-2000:]
    return time.perf_counter() - t0


def new_regrade(prepared: pipeline.PreparedTask, parts: dict[str, list[float]]) -> float:
    """pipeline.regrade, with its parts timed by wrapping the functions it calls."""
    timers = {
        "new: read change from outside": (pipeline, pipeline.read_change),
        "new: fresh sandbox": (pipeline, pipeline.fresh_sandbox),
        "new: tests (each run of the pair)": (regrade, regrade.run_tests),
    }

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                parts.setdefault(name, []).append(time.perf_counter() - t)

        return wrapper

    for name, (module, fn) in timers.items():
        setattr(module, fn.__name__, timed(name, fn))
    try:
        t0 = time.perf_counter()
        verdict, _after, patch = pipeline.regrade(prepared, BEFORE[0], None)
        elapsed = time.perf_counter() - t0
    finally:
        for module, fn in timers.values():
            setattr(module, fn.__name__, fn)
    assert verdict.resolved and "return a + b" in patch, verdict
    return elapsed


BEFORE: list = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--size-mb", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-regrade-") as tmp:
        work = Path(tmp)
        repo = make_big_repo(work / "repo", args.size_mb)
        write_files(repo, BUGGY_CALC)
        commit_all(repo, "calc with a bug")
        provider = LocalProvider(SandboxSettings(), cache_dir=work / "cache", state_dir=work / "state")
        spec = TaskSpec(
            repo=str(repo),
            problem_statement="add() subtracts",
            test_command=TEST_COMMAND,
            setup_command=PYTEST_SETUP,
        )
        old_s, new_s, snapshot_s, prepare_s = [], [], [], []
        parts: dict[str, list[float]] = {}
        for i in range(args.runs * 2 + 1):
            t0 = time.perf_counter()
            prepared = pipeline.prepare(spec, provider)
            pipeline.setup(prepared)  # the task environment (pytest); a layer reused after the first sample
            prepare_s.append(time.perf_counter() - t0)
            try:
                t0 = time.perf_counter()
                cleanroom.tree_access(prepared.sandbox).read_tree()  # type: ignore[union-attr]
                snapshot_s.append(time.perf_counter() - t0)
                BEFORE[:] = [pipeline.baseline(prepared)]
                prepared.sandbox.exec("sed -i 's/a - b/a + b/' calc.py")
                if i == 0:
                    continue  # warm-up: first checkout, bwrap probe
                if i % 2:
                    old_s.append(old_regrade(prepared, parts))
                else:
                    new_s.append(new_regrade(prepared, parts))
            finally:
                prepared.sandbox.release()
        old, new = ms(old_s), ms(new_s)
        results = {
            "runs_each": args.runs,
            "repo_mb_without_git": round(tree_mb(repo, skip_git=True), 1),
            "repo_files": sum(len(f) for _, _, f in os.walk(repo)),
            "old_regrade_in_agent_sandbox": old,
            "new_regrade_clean_room": new,
            "added_ms": round(new["median_ms"] - old["median_ms"], 1),
            "parts_median_ms": {k: round(statistics.median(v) * 1000, 1) for k, v in sorted(parts.items())},
            "new_minus_tests_ms": round(
                (statistics.median(new_s) - statistics.median(parts["new: tests"])) * 1000, 1
            ),
            "old_minus_tests_ms": round(
                (statistics.median(old_s) - statistics.median(parts["old: tests"])) * 1000, 1
            ),
            "task_state_snapshot_in_prepare": ms(snapshot_s),
            "prepare_total": ms(prepare_s),
            "load_average": os.getloadavg(),
        }
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
