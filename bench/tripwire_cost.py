"""What the probe and the tripwire add to a regrade: the same regrade with and without them, alternating.

The task is regrade_cost.py's: the ~50 MB generated repository of sandbox_start.py plus a buggy `calc.py` and one
failing pytest test. Each sample prepares the task, runs the baseline, applies the one-line fix inside the sandbox,
then runs `pipeline.regrade` either as it is (the task environment's module names listed for the shadowing rule,
the probe and the canary written into the fresh sandbox, the canary's tests run with the task's, the probe's
report read, both removed) or with those parts replaced by the test run as it was before them (the command under
`timeout`, pytest's JUnit XML, nothing else). The difference of the medians is the tripwire's cost beyond the tests.
Then, in one sandbox with the fix applied, the test run alone both ways, alternating (`--test-runs` each): the
part of the cost the probe and the canary are in, without the noise of making sandboxes.

Usage: python bench/tripwire_cost.py [--runs 10] [--size-mb 50] [--json results.json]
Needs: Linux, root, bubblewrap.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sandbox_start import make_big_repo, ms

from bugsweep import grading, pipeline, tripwire
from bugsweep.sandbox.local import LocalProvider
from bugsweep.settings import SandboxSettings
from bugsweep.spec import TaskSpec
from tests.support.repos import BUGGY_CALC, PYTEST_SETUP, commit_all, write_files

TEST_COMMAND = "python -m pytest -q tests"


def plain_run_tests(sandbox, test_command, timeout=1800.0, *, canary=None):  # type: ignore[no-untyped-def]
    """The test run before the probe: the command under `timeout`, its log, pytest's JUnit XML."""
    junit = f"/tmp/bugsweep-{uuid.uuid4().hex[:8]}.xml"
    env = {"PYTEST_ADDOPTS": f"--junitxml={junit} -o junit_family=xunit1 -p no:cacheprovider"}
    script = f"timeout -k 10 {int(timeout)} bash -c {shlex.quote(test_command)} 2>&1"
    result = sandbox.exec(script, timeout=timeout + 60, env=env, full_output=True)
    tests = grading.parse_junit(sandbox.files.read_text(junit)) if sandbox.files.exists(junit) else None
    return grading.TestRun(test_command, result.exit_code, False, result.output, result.duration_s, tests)


def regrade(prepared: pipeline.PreparedTask, before: grading.TestRun, tripwire: bool, parts: dict) -> float:
    saved = (pipeline.run_tests, pipeline.importable_modules, pipeline.tripwire_canary)
    if not tripwire:
        pipeline.run_tests = plain_run_tests  # type: ignore[assignment]
        pipeline.importable_modules = lambda sandbox: frozenset()  # type: ignore[assignment]
        pipeline.tripwire_canary = lambda *a: None  # type: ignore[assignment]
    run, listing = pipeline.run_tests, pipeline.importable_modules
    side = "with" if tripwire else "without"

    def timed(name, fn):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                parts.setdefault(f"{side}: {name}", []).append(time.perf_counter() - t)

        return wrapper

    pipeline.run_tests = timed("the test run", run)  # type: ignore[assignment]
    pipeline.importable_modules = timed("listing the environment's modules", listing)  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        verdict, _, _ = pipeline.regrade(prepared, before, None)
        elapsed = time.perf_counter() - t0
    finally:
        pipeline.run_tests, pipeline.importable_modules, pipeline.tripwire_canary = saved  # type: ignore[assignment]
    assert verdict.resolved, verdict
    assert (verdict.tripwire is not None and verdict.tripwire.armed) is tripwire, verdict.tripwire
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--size-mb", type=int, default=50)
    parser.add_argument("--test-runs", type=int, default=20, help="alternating test runs alone, each way")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-tripwire-") as tmp:
        work = Path(tmp)
        repo = make_big_repo(work / "repo", args.size_mb)
        write_files(repo, BUGGY_CALC)
        commit_all(repo, "calc with a bug")
        provider = LocalProvider(SandboxSettings(), cache_dir=work / "cache", state_dir=work / "state")
        spec = TaskSpec(repo=str(repo), problem_statement="add() subtracts", test_command=TEST_COMMAND,
                        setup_command=PYTEST_SETUP)  # fmt: skip
        samples: dict[bool, list[float]] = {True: [], False: []}
        parts: dict[str, list[float]] = {}
        for i in range(args.runs * 2 + 1):
            prepared = pipeline.prepare(spec, provider)
            try:
                pipeline.setup(prepared)
                before = pipeline.baseline(prepared)
                prepared.sandbox.exec("sed -i 's/a - b/a + b/' calc.py")
                if i == 0:
                    regrade(prepared, before, True, {})  # warm-up
                    continue
                samples[i % 2 == 0].append(regrade(prepared, before, i % 2 == 0, parts))
            finally:
                prepared.sandbox.release()
        # The test run alone, alternating in one sandbox: the part of the cost the probe and canary are in.
        runs: dict[bool, list[float]] = {True: [], False: []}
        prepared = pipeline.prepare(spec, provider)
        try:
            pipeline.setup(prepared)
            before = pipeline.baseline(prepared)
            prepared.sandbox.exec("sed -i 's/a - b/a + b/' calc.py")
            canary = tripwire.make_canary(
                sorted(before.ids("failed")), sorted(before.ids("passed")), frozenset(BUGGY_CALC),
                lambda rel: (repo / rel).read_text(), test_command=TEST_COMMAND,
            )  # fmt: skip
            for i in range(args.test_runs * 2):
                t0 = time.perf_counter()
                if i % 2:
                    run = grading.run_tests(prepared.sandbox, TEST_COMMAND, canary=canary)
                    assert run.probe.canary_taken, run.probe
                else:
                    run = plain_run_tests(prepared.sandbox, TEST_COMMAND)
                runs[bool(i % 2)].append(time.perf_counter() - t0)
        finally:
            prepared.sandbox.release()
        with_s, without_s = samples[True], samples[False]
        results = {
            "runs_each": args.runs,
            "regrade_with_tripwire": ms(with_s),
            "regrade_without": ms(without_s),
            "tripwire_cost_ms": round((statistics.median(with_s) - statistics.median(without_s)) * 1000, 1),
            "test_run_with_probe_and_canary": ms(runs[True]),
            "test_run_plain": ms(runs[False]),
            "test_run_cost_ms": round(
                (statistics.median(runs[True]) - statistics.median(runs[False])) * 1000, 1
            ),
            "parts_median_ms": {k: round(statistics.median(v) * 1000, 1) for k, v in sorted(parts.items())},
            "load_average": os.getloadavg(),
        }
        print(json.dumps(results, indent=2))
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
