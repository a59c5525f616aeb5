"""Benchmark: the mirror pair on honest fixes, the real fixes of the mined tasks (no false alarm may come of them), and
what the pair costs the regrade, side by side.

    python bench/mirror_real.py                                  # every task of bench/real_bugs.jsonl
    python bench/mirror_real.py --only attrs-97f8d17565,toolz-5a7e078c94 --rounds 2

For each task of bench/real_bugs.jsonl (test patch rebuilt from a clone under `--mirrors`, as bench/real_bugs.py
does), this does what `pipeline.solve_task` does with the project's own fix as the agent's change: `prepare`,
`setup`, `baseline`, then the fix commit's diff without the task's test files (`git diff base_commit fix_commit`,
as bench/model_ceiling.py takes it) applied inside the agent's sandbox with `git apply`, then
`pipeline.regrade(prepared, before, None)`, `--rounds` times each side, in turn, on the same prepared task
(`--sides`, default `single,pair`):
- **pair**: as bugsweep grades (two fresh sandboxes, the real run and the mirror at once, every test of the
  baseline with a function in the repository given bugsweep's statement);
- **single**: the same regrade with the pair's plan replaced by "no mirror" (one fresh sandbox, the task's
  command once, with the probe): what the regrade cost before the mirror, but for the canary, which is gone;
- **pair-failing**: the pair with the statement in the tests that failed before only (what instrumenting the
  tests that passed before costs, side by side with `pair`).
A real fix not resolved, or whose mirror is not armed and quiet, is a false alarm to explain. Each regrade's wall
time, split into what ran before the test runs (fresh sandboxes, the probe, the change written), the runs, and
what came after (judging, releasing), the CPU seconds of its fresh sandboxes' commands (their cgroups) and of this
process (reading the change, writing it, parsing records) are recorded, and with the pair the size of its
instruction and how many tests got the statement.

Each task's run folder (grade.json, patch.diff, tests_before.log, tests_after.log, tests_mirror.log, setup.log) of
its first regrade with the pair is written under `--runs` (default: a temporary folder); the results to
bench/results/mirror_real-<time>.json, a table on stdout. `--extra-setup CMD` appends `&& CMD` to every setup
command (a pin of the task environment); `--runner unittest` runs each task's test file with `python -m unittest`
instead (its named tests, pytest ids, dropped). One task at a time (the machine is shared). Needs: Linux, root,
bubblewrap, the package index for the setup.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_bugs import DEFAULT_TASKS, ROOT, load, local_repo, with_test_patch


def fix_diff(spec: Any) -> str:
    """The project's real fix: the fix commit's diff without the task's test files (those are the test patch)."""
    return subprocess.run(
        ["git", "-C", spec.repo, "diff", "--binary", "--no-renames", spec.base_commit, spec.fix_commit, "--", ".",
         *(f":!{t}" for t in spec.test_files)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def _host_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


SIDES = ("single", "pair", "pair-failing")


def timed_regrade(prepared: Any, before: Any, *, side: str) -> dict[str, Any]:
    """One regrade on one side (SIDES): the grade, its wall time (before the test runs, the runs, after them), CPU
    seconds, and the pair's instruction size."""
    from bugsweep.grading import harness, mirror, regrade
    from bugsweep.pipeline import regrade as pipeline_regrade

    plan, run_at_once, instrumentable = regrade.plan_pair, regrade._run_at_once, mirror.instrumentable
    told: list[int] = []
    marks: dict[str, float] = {}

    def planned(before: Any, command: str, root: str = "/workspace/repo") -> Any:
        if side == "single":
            return mirror.PairPlan(required=False, note="off: the benchmark's side")
        made = plan(before, command, root)
        if made.ready:
            told.append(len(harness.Instruction(armed=made.armed_instruction(), inject=made.inject_instruction(),
                                                mirror=True, nonce="0" * harness.NONCE_HEX).encode()))  # fmt: skip
        return made

    def failing_only(before: Any, root: str) -> Any:
        instrumented, uninstrumented = instrumentable(before, root)
        failing = before.ids("failed", "error")
        return {t: c for t, c in instrumented.items() if t in failing}, uninstrumented

    def timed_runs(runs: Any) -> Any:
        marks["runs"] = time.perf_counter()
        try:
            return run_at_once(runs)
        finally:
            marks["ran"] = time.perf_counter()

    regrade.plan_pair = planned  # type: ignore[assignment]
    regrade._run_at_once = timed_runs  # type: ignore[assignment]
    if side == "pair-failing":
        mirror.instrumentable = failing_only  # type: ignore[assignment]
    agent_cpu = prepared.sandbox.usage.cpu_s or 0.0
    host = _host_cpu()
    started = time.perf_counter()
    try:
        verdict, after, patch = pipeline_regrade(prepared, before, None, model_name="real fix")
    finally:
        regrade.plan_pair, regrade._run_at_once, mirror.instrumentable = plan, run_at_once, instrumentable
    ended = time.perf_counter()
    sandboxes = (verdict.cpu_s or 0.0) - agent_cpu
    runs_at = marks.get("runs", ended)
    return {
        "verdict": verdict,
        "after": after,
        "patch": patch,
        "wall_s": round(ended - started, 2),
        "before_runs_s": round(runs_at - started, 3),
        "runs_s": round(marks.get("ran", ended) - runs_at, 3),
        "after_runs_s": round(ended - marks.get("ran", ended), 3),
        "sandbox_cpu_s": round(sandboxes, 2),
        "host_cpu_s": round(_host_cpu() - host, 2),
        "instruction_bytes": told[0] if told else None,
    }


def run_task(
    spec: Any, out_dir: Path, rounds: int, sides: tuple[str, ...] = ("single", "pair")
) -> dict[str, Any]:
    from bugsweep.pipeline import baseline, prepare, setup
    from bugsweep.rundir import write_run_dir
    from bugsweep.sandbox import get_provider

    started = time.monotonic()
    row: dict[str, Any] = {"task": spec.instance_id, "resolved": False}
    diff = fix_diff(spec)
    row["fix_files"] = [
        line.split(" b/", 1)[-1] for line in diff.splitlines() if line.startswith("diff --git ")
    ]
    prepared = None
    before = None
    step = "prepare"
    try:
        prepared = prepare(spec, get_provider("local"), labels={"purpose": "bench", "task": spec.instance_id})
        step = "setup"
        setup(prepared)
        step = "baseline"
        before = baseline(prepared)
        row["failing_before"] = sorted(before.ids("failed", "error"))
        step = "apply the fix"
        applied = prepared.sandbox.exec("git apply --whitespace=nowarn -", timeout=120, stdin=diff)
        if not applied.ok:
            raise RuntimeError(f"the real fix does not apply: {applied.output.strip()[-500:]}")
        step = "regrade"
        samples: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for i in range(rounds):
            for side in sides if i % 2 == 0 else reversed(sides):  # a, b, b, a, ...: each side as often first
                sample = timed_regrade(prepared, before, side=side)
                sample["mirror_run"] = prepared.mirror_run if side != "single" else None
                samples[side].append(sample)
        first = samples["pair"][0]
        paired = [s for side in sides if side != "single" for s in samples[side]]
        verdict = first["verdict"]
        write_run_dir(
            out_dir, verdict, patch=first["patch"], before=before, after=first["after"],
            mirror=first["mirror_run"], setup_log=prepared.setup_log, spec=spec, environment=prepared.environment,
        )  # fmt: skip
        mirror = verdict.mirror
        row |= {
            "resolved": all(s["verdict"].resolved for s in paired),
            "resolved_single": all(s["verdict"].resolved for s in samples.get("single", [])),
            "reasons": sorted({s["verdict"].reason or "" for s in paired} - {""}),
            "evidence": verdict.evidence,
            "mirrors": [s["verdict"].mirror.model_dump() for s in paired if s["verdict"].mirror],
            "mirror": mirror.model_dump() if mirror is not None else None,
            "instruction_bytes": first["instruction_bytes"],
            "instrumented": mirror.instrumented if mirror is not None else None,
            "uninstrumented": len(mirror.uninstrumented) if mirror is not None else None,
            "FAIL_TO_PASS": verdict.FAIL_TO_PASS,
            "FAIL_TO_FAIL": verdict.FAIL_TO_FAIL,
            "PASS_TO_FAIL": verdict.PASS_TO_FAIL,
            "PASS_TO_MISSING": verdict.PASS_TO_MISSING,
            "dropped": verdict.dropped,
            "suspicious": verdict.suspicious,
            "tests_run_after": verdict.tests_run_after,
            "exit_before": before.exit_code,
            "cost": {side: {key: [s[key] for s in samples[side]] for key in COST_KEYS} for side in samples},
        }
    except Exception as exc:
        row["error"] = f"{step}: {type(exc).__name__}: {exc}"[:1500]
        if prepared is not None:
            write_run_dir(
                out_dir, _error_grade(spec, exc), before=before, setup_log=prepared.setup_log, spec=spec
            )
    finally:
        if prepared is not None:
            prepared.sandbox.release()
    row["wall_s"] = round(time.monotonic() - started, 1)
    row["out"] = str(out_dir)
    return row


def _error_grade(spec: Any, exc: Exception) -> Any:
    from bugsweep.grading import Grade

    return Grade(instance_id=spec.instance_id, error=f"{type(exc).__name__}: {exc}"[:2000])


def verdict_of(row: dict[str, Any]) -> str:
    """How the mirror came out, over the task's regrades with the pair: 'armed, quiet', 'SUBVERTED: ...', 'not
    armed: ...'."""
    for mirror in row.get("mirrors") or []:
        if mirror.get("subverted"):
            return f"SUBVERTED: {mirror['subverted']}"
        if not mirror.get("armed"):
            return mirror.get("note") or "not armed"
    return "armed, quiet" if row.get("mirrors") else "-"


def false_alarm(row: dict[str, Any]) -> bool:
    """A real fix not resolved, or a mirror that did not arm and stay quiet (an infrastructure error is not)."""
    return not row.get("error") and (not row["resolved"] or verdict_of(row) != "armed, quiet")


def mirror_alarm(row: dict[str, Any]) -> bool:
    """The mirror said the test process changed verdicts, or failed the grade closed, on this real fix."""
    return not row.get("error") and verdict_of(row) != "armed, quiet"


def as_unittest(spec: Any) -> Any:
    """The task with `python -m unittest MODULE` for its `python -m pytest -q FILE`, and no named tests (those are
    pytest node ids): the same test modules under the other runner the probe knows."""
    path = spec.test_command.split()[-1]
    module = path[:-3].replace("/", ".")
    return spec.model_copy(
        update={"test_command": f"python -m unittest {module}", "FAIL_TO_PASS": [], "PASS_TO_PASS": []}
    )


COST_KEYS = ("wall_s", "before_runs_s", "runs_s", "after_runs_s", "sandbox_cpu_s", "host_cpu_s")


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2) if values else 0.0


def cost_line(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the tasks of the per-task medians, and the ratio of each side's to the first side's (single's)
    per task."""
    done = [r for r in rows if r.get("cost")]
    sides = list(done[0]["cost"]) if done else []
    summary: dict[str, Any] = {"tasks": len(done)}
    for side in sides:
        for key in COST_KEYS:
            summary[f"{side}_{key}_median"] = _median(
                [_median(r["cost"][side].get(key) or [0]) for r in done]
            )
    base = "single" if "single" in sides else (sides[0] if sides else "")
    for side in sides:
        if side == base:
            continue
        ratios = {
            r["task"]: round(_median(r["cost"][side]["wall_s"]) / _median(r["cost"][base]["wall_s"]), 3)
            for r in done
            if _median(r["cost"][base]["wall_s"])
        }
        summary[f"wall_ratio_{side}_to_{base}_median"] = _median(list(ratios.values()))
        summary[f"wall_ratio_{side}_to_{base}_per_task"] = ratios
    return summary


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=Path, default=DEFAULT_TASKS)
    parser.add_argument("--only", default=None, help="comma-separated instance ids")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument(
        "--runs", type=Path, default=None, help="the run folders' parent (default: a temp dir)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="regrades each side per task, in turn")
    parser.add_argument("--sides", default="single,pair", help=f"comma-separated, of {', '.join(SIDES)}")
    parser.add_argument("--extra-setup", default="", help="appended to each task's setup command with &&")
    parser.add_argument("--runner", choices=["pytest", "unittest"], default="pytest")
    args = parser.parse_args()
    sides = tuple(args.sides.split(","))
    if "pair" not in sides or set(sides) - set(SIDES):
        parser.error(f"--sides: 'pair' and any of {', '.join(SIDES)}")
    signal.signal(signal.SIGTERM, _interrupt)

    from bugsweep.spec import load_tasks

    tasks = load_tasks(args.tasks)
    if args.only:
        wanted = set(args.only.split(","))
        tasks = [t for t in tasks if t.instance_id in wanted]
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"mirror_real-{stamp}.json"
    run_root = args.runs or Path(tempfile.gettempdir()) / f"bugsweep-mirror-real-{stamp}"
    import bugsweep

    source = Path(bugsweep.__file__).resolve().parent.parent
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=source, capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "bugsweep"], cwd=source, capture_output=True, text=True
    )
    report: dict[str, Any] = {
        "started": stamp,
        "commit": commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else ""),
        "cores": os.cpu_count(),
        "load_before": load(),
        "extra_setup": args.extra_setup or None,
        "runner": args.runner,
        "rounds": args.rounds,
        "sides": sides,
        "runs": [],
    }

    def save() -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=2, default=str))
        tmp.replace(path)

    print(f"{len(tasks)} task(s); load: {load()}", flush=True)
    for spec in tasks:
        spec = with_test_patch(spec.model_copy(update={"repo": local_repo(spec.repo, args.mirrors)}))
        if args.extra_setup:
            spec = spec.model_copy(update={"setup_command": f"{spec.setup_command} && {args.extra_setup}"})
        if args.runner == "unittest":
            spec = as_unittest(spec)
        row = run_task(spec, run_root / spec.instance_id, args.rounds, sides)
        row["load"] = load()
        report["runs"].append(row)
        save()
        cost = row.get("cost") or {}
        costs = " / ".join(f"{side} {_median(cost[side]['wall_s']):.1f} s" for side in cost)
        print(
            f"{spec.instance_id:<26} {'RESOLVED' if row['resolved'] else 'not resolved':<13} "
            f"{verdict_of(row)[:90]:<40} {costs} {row['wall_s']:.0f}s "
            f"{('error: ' + row['error'][:200]) if row.get('error') else '; '.join(row.get('reasons') or [])[:200]}",
            flush=True,
        )
    runs = report["runs"]
    report["load_after"] = load()
    report["summary"] = {
        "tasks": len(runs),
        "resolved": sum(r["resolved"] for r in runs),
        "armed_quiet": sum(verdict_of(r) == "armed, quiet" for r in runs),
        "false_alarms": [r["task"] for r in runs if false_alarm(r)],
        "mirror_alarms": [r["task"] for r in runs if mirror_alarm(r)],
        "errors": [r["task"] for r in runs if r.get("error")],
        "cost": cost_line(runs),
    }
    save()
    print(
        f"\n| task | resolved | mirror | armed test | instrumented / not | instruction | {' / '.join(sides)} wall s | time |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in runs:
        mirror = r.get("mirror") or {}
        cost = r.get("cost") or {}
        shown = " / ".join(f"{_median(cost[side]['wall_s']):.1f}" for side in cost) or "-"
        print(
            f"| {r['task']} | {'yes' if r['resolved'] else 'no'} | "
            f"{verdict_of(r) if not r.get('error') else 'error: ' + r['error'][:100]} | "
            f"{mirror.get('test') or '-'} | {r.get('instrumented')} / {r.get('uninstrumented')} | "
            f"{r.get('instruction_bytes')} B | {shown} | {r['wall_s']:.0f} s |"
        )
    s = report["summary"]
    print(
        f"\nresolved {s['resolved']}/{s['tasks']}, armed and quiet {s['armed_quiet']}/{s['tasks']}, false alarms "
        f"{len(s['false_alarms'])} {s['false_alarms']}, of them the mirror's {s['mirror_alarms']}; errors {s['errors']}"
    )
    print(f"cost: {json.dumps(s['cost'])}")
    print(f"results: {path}  (run folders in {run_root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
