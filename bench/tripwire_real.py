"""Benchmark: the tripwire on honest fixes, the real fixes of the mined tasks (no false alarm may come of them).

    python bench/tripwire_real.py                                  # every task of bench/real_bugs.jsonl
    python bench/tripwire_real.py --only attrs-97f8d17565,toolz-5a7e078c94

For each task of bench/real_bugs.jsonl (test patch rebuilt from a clone under `--mirrors`, as bench/real_bugs.py
does), this does what `pipeline.solve_task` does with the project's own fix as the agent's change: `prepare`,
`setup`, `baseline`, then the fix commit's diff without the task's test files (`git diff base_commit fix_commit`,
as bench/model_ceiling.py takes it) applied inside the agent's sandbox with `git apply`, then
`pipeline.regrade(prepared, before, None)`: the clean room with the probe, the tripwire's canary and the summary
check. A real fix that is not resolved, or whose regrade's tripwire says `subverted` or cannot judge (`note`), is
a false alarm to explain.

Each task's run folder (grade.json, patch.diff, tests_before.log, tests_after.log, setup.log) is written under
`--runs` (default: a temporary folder); the results to bench/results/tripwire_real-<time>.json, a table on stdout.
`--extra-setup CMD` appends `&& CMD` to every setup command (a pin of the task environment, say); `--runner
unittest` runs each task's test file with `python -m unittest` instead (its named tests, pytest ids, dropped). For a
comparison with bugsweep before the tripwire, run it with PYTHONPATH at a checkout of that commit (the results
record which bugsweep graded). One task at a time (the machine is shared). Needs: Linux, root, bubblewrap, the
package index for the setup.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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


def run_task(spec: Any, out_dir: Path) -> dict[str, Any]:
    from bugsweep.pipeline import baseline, prepare, regrade, setup
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
        verdict, after, patch = regrade(prepared, before, None, model_name="real fix")
        write_run_dir(
            out_dir, verdict, patch=patch, before=before, after=after, setup_log=prepared.setup_log, spec=spec,
            environment=prepared.environment,
        )  # fmt: skip
        wire = getattr(verdict, "tripwire", None)  # None: a bugsweep before the tripwire (a comparison run)
        row |= {
            "resolved": verdict.resolved,
            "held_for_review": getattr(verdict, "held_for_review", False),
            "reason": verdict.reason,
            "evidence": verdict.evidence,
            "tripwire": wire.model_dump() if wire is not None else None,
            "FAIL_TO_PASS": verdict.FAIL_TO_PASS,
            "FAIL_TO_FAIL": verdict.FAIL_TO_FAIL,
            "PASS_TO_FAIL": verdict.PASS_TO_FAIL,
            "PASS_TO_MISSING": verdict.PASS_TO_MISSING,
            "dropped": verdict.dropped,
            "suspicious": getattr(verdict, "suspicious", []),
            "tests_run_before": verdict.tests_run_before,
            "tests_run_after": verdict.tests_run_after,
            "exit_before": before.exit_code,
            "exit_after": after.exit_code if after is not None else None,
            "canary": {
                "path": after.canary.path,
                "must_fail": after.canary.must_fail,
                "must_pass": after.canary.must_pass,
            }
            if after is not None and getattr(after, "canary", None) is not None
            else None,
        }
    except Exception as exc:
        row["error"] = f"{step if prepared else 'prepare'}: {type(exc).__name__}: {exc}"[:1500]
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
    """How the tripwire came out: 'armed, quiet', 'SUBVERTED: ...', 'not armed: ...', 'armed, note: ...'."""
    wire = row.get("tripwire")
    if not wire:
        return "-"
    if wire.get("subverted"):
        return f"SUBVERTED: {wire['subverted']}"
    if not wire.get("armed"):
        return wire.get("note") or "not armed"
    return f"armed, note: {wire['note']}" if wire.get("note") else "armed, quiet"


def false_alarm(row: dict[str, Any]) -> bool:
    """A real fix not resolved, or a tripwire that did not arm and stay quiet (an infrastructure error is not)."""
    if row.get("error"):
        return False
    wire = row.get("tripwire") or {}
    return (
        not row["resolved"] or bool(wire.get("subverted")) or not wire.get("armed") or bool(wire.get("note"))
    )


#: What only the tripwire and the summary check say in a grade's reason (bugsweep.grading.grade, _disagreements).
TRIPWIRE_REASONS = ("tripwire", "runner's summary", "exited 0 although")


def tripwire_alarm(row: dict[str, Any]) -> bool:
    """The tripwire or the summary check raised an alarm on this real fix (the other reasons are the grade's)."""
    wire = row.get("tripwire") or {}
    return bool(wire.get("subverted")) or any(r in (row.get("reason") or "") for r in TRIPWIRE_REASONS)


def as_unittest(spec: Any) -> Any:
    """The task with `python -m unittest MODULE` for its `python -m pytest -q FILE`, and no named tests (those are
    pytest node ids): the same test modules under the other runner the probe knows."""
    path = spec.test_command.split()[-1]
    module = path[:-3].replace("/", ".")
    return spec.model_copy(
        update={"test_command": f"python -m unittest {module}", "FAIL_TO_PASS": [], "PASS_TO_PASS": []}
    )


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
    parser.add_argument(
        "--extra-setup",
        default="",
        help="appended to each task's setup command with && (e.g. pins of the task environment, for a comparison)",
    )
    parser.add_argument(
        "--runner",
        choices=["pytest", "unittest"],
        default="pytest",
        help="unittest: each task's test file run by `python -m unittest` (no named tests; a task whose tests are "
        "not unittest's fails its baseline)",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)

    from bugsweep.spec import load_tasks

    tasks = load_tasks(args.tasks)
    if args.only:
        wanted = set(args.only.split(","))
        tasks = [t for t in tasks if t.instance_id in wanted]
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"tripwire_real-{stamp}.json"
    run_root = args.runs or Path(tempfile.gettempdir()) / f"bugsweep-tripwire-real-{stamp}"
    import bugsweep

    # the bugsweep that grades (PYTHONPATH may choose another checkout: a comparison with an earlier commit)
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
        "bugsweep": str(source),
        "cores": os.cpu_count(),
        "load_before": load(),
        "extra_setup": args.extra_setup or None,
        "runner": args.runner,
        "runs": [],
    }

    def save() -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=2))
        tmp.replace(path)

    print(f"{len(tasks)} task(s); load: {load()}", flush=True)
    for spec in tasks:
        spec = with_test_patch(spec.model_copy(update={"repo": local_repo(spec.repo, args.mirrors)}))
        if args.extra_setup:
            spec = spec.model_copy(update={"setup_command": f"{spec.setup_command} && {args.extra_setup}"})
        if args.runner == "unittest":
            spec = as_unittest(spec)
        row = run_task(spec, run_root / spec.instance_id)
        row["load"] = load()
        report["runs"].append(row)
        save()
        print(
            f"{spec.instance_id:<26} {'RESOLVED' if row['resolved'] else 'not resolved':<13} "
            f"{verdict_of(row)[:90]:<40} {row['wall_s']:.0f}s "
            f"{('error: ' + row['error'][:200]) if row.get('error') else (row.get('reason') or '')[:200]}",
            flush=True,
        )
    runs = report["runs"]
    report["load_after"] = load()
    report["summary"] = {
        "tasks": len(runs),
        "resolved": sum(r["resolved"] for r in runs),
        "armed_quiet": sum(verdict_of(r) == "armed, quiet" for r in runs),
        "not_resolved": [r["task"] for r in runs if not r["resolved"] and not r.get("error")],
        "tripwire_alarms": [r["task"] for r in runs if tripwire_alarm(r)],
        "not_armed_or_noted": [
            r["task"] for r in runs if not r.get("error") and verdict_of(r) != "armed, quiet"
        ],
        "false_alarms": [r["task"] for r in runs if false_alarm(r)],
        "errors": [r["task"] for r in runs if r.get("error")],
    }
    save()
    print("\n| task | resolved | runner | tripwire | canary | time |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in runs:
        wire = r.get("tripwire") or {}
        canary = r.get("canary") or {}
        shown = ", ".join(f"{n}: {o}" for n, o in (wire.get("outcomes") or {}).items()) or "-"
        print(
            f"| {r['task']} | {'yes' if r['resolved'] else 'no'} | {wire.get('runner') or '-'} | "
            f"{verdict_of(r) if not r.get('error') else 'error: ' + r['error'][:100]} | "
            f"{canary.get('path', '-')} ({shown}) | {r['wall_s']:.0f} s |"
        )
    s = report["summary"]
    print(
        f"\nresolved {s['resolved']}/{s['tasks']}, armed and quiet {s['armed_quiet']}/{s['tasks']}, "
        f"not resolved or not armed and quiet {len(s['false_alarms'])} {s['false_alarms']}, of them raised by the "
        f"tripwire or the summary check {s['tripwire_alarms']}; errors {s['errors']}"
    )
    print(f"results: {path}  (run folders in {run_root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
