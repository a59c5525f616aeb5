"""Soak test of the local sandbox's limits: many whole runs at once, honest fixes mixed with abusive tasks.

`--runs` tasks (default 200), `--concurrency` at once (default 16), each a whole `pipeline.solve_task` on the real
local sandbox (the CLI's and the flows' one path: create, setup with the setup network, baseline, agent, regrade,
grade.json) against the scripted model server (a scripted stand-in, not a model; real HTTP on 127.0.0.1). The task
is the buggy `calc` repository; every fifth task is honest, the others cycle through four abuses:
- honest: the model fixes add() and finishes;
- disk: `dd` of 100 GB into /tmp (the disk quota stops it), then finish;
- fork: a fork loop (the process limit stalls it, the command timeout ends it), then finish;
- memory: a 16 GB string, then a growing list of 1 MB strings (the memory cgroup kills both), then finish;
- output: `yes` without end (the quota stops its spooled output, or the timeout), then finish.
The model's reply for each request is chosen from the task's kind and the turn (one server answers all runs).

Checks (the script exits 1 when one fails): every honest run resolves; every abusive run is graded (grade.json
without `error`); nothing is left behind (no sandbox folder, mount or loop device in the state folder, no
slirp4netns or bwrap child process, no cgroup of a sandbox it made); the free space of the state folder's file
system comes back to where it started, within 1 MiB (a folder keeps the blocks it grew to): the state folder is a file system of its own (a 64 GiB
sparse ext4 image, mounted for the soak), so other jobs on a shared machine do not move it; and the host's free disk
and available memory come back within --tolerance-mib (those, other jobs do move: the figures are reported; they
get up to 3 minutes, as the kernel frees the memory of removed cgroups lazily).

Usage: python bench/soak.py [--runs 200] [--concurrency 16] [--json results.json]
Needs: Linux, root, bubblewrap, slirp4netns, mkfs.ext4, git.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bugsweep.pipeline import solve_task
from bugsweep.sandbox.local import LocalProvider, disk
from bugsweep.settings import AgentSettings, ModelSettings, SandboxSettings
from bugsweep.spec import TaskSpec
from tests.support.leftovers import sandbox_leftovers
from tests.support.repos import PYTEST_SETUP, make_repo
from tests.support.scripted_model import ScriptedModelServer, tool_call

KINDS = ("honest", "disk", "fork", "memory", "output")
ABUSE = {
    "disk": "dd if=/dev/zero of=/tmp/fill bs=1M count=100000",
    "fork": "f() { f | f & }; f; sleep 1000",
    "memory": "python -c 'a = b\"x\" * (16 << 30)'; python -c 'a = []\nwhile True: a.append(b\"x\" * (1 << 20))'",
    "output": "yes 'endless output'",
}


def reply(body: dict[str, Any]) -> dict[str, Any]:
    """The scripted model: the task's kind is in its text, the turn is the number of replies so far."""
    messages = body.get("messages", [])
    text = " ".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")
    kind = next((k for k in KINDS if f"[soak:{k}]" in text), "honest")
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    if kind == "honest":
        steps = [
            tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b"),
            tool_call("finish", summary="add() subtracted; it adds now"),
        ]
    else:
        steps = [tool_call("run", command=ABUSE[kind]), tool_call("finish", summary=f"{kind} done")]
    return steps[min(turn, len(steps) - 1)]


def host_state(state_dir: Path) -> dict[str, Any]:
    mem = {
        line.split(":")[0]: int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
    }
    return {
        "free_disk_mib": shutil.disk_usage(state_dir).free >> 20,
        "available_memory_mib": mem["MemAvailable"] >> 10,
    }


SETTLE_S = 180


def settled_host_state(state_dir: Path, before: dict[str, Any], tolerance_mib: int) -> dict[str, Any]:
    """host_state once it is back within `tolerance_mib` of `before`, or after SETTLE_S (the figures then), with
    `waited_s`: how long that took."""
    started = time.monotonic()
    while True:
        after = host_state(state_dir)
        waited = time.monotonic() - started
        if all(before[k] - after[k] <= tolerance_mib for k in before) or waited > SETTLE_S:
            return {**after, "waited_s": round(waited, 1)}
        time.sleep(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--memory-mib", type=int, default=512)
    parser.add_argument("--disk-mib", type=int, default=256)
    parser.add_argument("--command-timeout", type=float, default=20.0)
    parser.add_argument("--tolerance-mib", type=int, default=512)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        work = Path(tmp)
        repo = make_repo(work / "calc")
        state_dir = work / "state"
        state_dir.mkdir()
        statefs = disk.WritableDisk.create(state_dir, 64 << 30, work / "statefs-template")
        assert statefs is not None, "the soak needs root and a loop device for its state file system"
        provider = LocalProvider(
            SandboxSettings(memory_mib=args.memory_mib, max_processes=256, disk_mib=args.disk_mib),
            cache_dir=work / "cache",
            state_dir=state_dir,
        )
        made: list[str] = []
        create = provider.create

        def tracked_create(*a: Any, **k: Any) -> Any:
            sandbox = create(*a, **k)
            made.append(sandbox.id)
            return sandbox

        provider.create = tracked_create  # type: ignore[method-assign]
        server = ScriptedModelServer([reply] * (args.runs * 4)).start()
        model = ModelSettings(base_url=server.base_url, model="scripted", api_key="sk-soak", max_retries=2)
        agent = AgentSettings(max_turns=4, command_timeout_s=args.command_timeout, max_wall_s=600)
        before = host_state(work)
        statefs_before = shutil.disk_usage(state_dir).free >> 20

        def one(i: int) -> dict[str, Any]:
            kind = KINDS[i % len(KINDS)]
            spec = TaskSpec(
                instance_id=f"soak-{i:03d}-{kind}",
                repo=str(repo),
                problem_statement=f"[soak:{kind}] test_add fails: add() is wrong. Fix it.",
                test_command="python -m pytest -q",
                # The task environment has only what the setup installs. The first run installs pytest through the
                # setup network (slirp4netns, routes, and back); the others reuse its layer, as a sweep does.
                setup_command=PYTEST_SETUP,
            )
            out = work / "runs" / spec.instance_id
            started = time.monotonic()
            try:
                grade = solve_task(
                    spec, provider=provider, model_settings=model, agent_settings=agent, out_dir=out,
                    raise_on_failure=False,
                )  # fmt: skip
                written = json.loads((out / "grade.json").read_text())
                return {"kind": kind, "resolved": grade.resolved, "error": grade.error, "graded": written["error"] is None,
                        "wall_s": time.monotonic() - started, "peak_disk_mib": grade.peak_disk_mib,
                        "peak_memory_mib": grade.peak_memory_mib, "cpu_s": grade.cpu_s}  # fmt: skip
            except Exception as exc:  # a crash of one run is that run's failure, reported below
                return {"kind": kind, "resolved": False, "graded": False, "error": repr(exc), "wall_s": 0.0}

        started = time.monotonic()
        with ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(one, range(args.runs)))
        wall = time.monotonic() - started
        server.stop()
        time.sleep(2)  # let the kernel finish giving back the released loop devices' page cache
        left = sandbox_leftovers(state_dir, made)
        for stale in list(
            state_dir.iterdir()
        ):  # the process's /etc copy and templates (made once, kept for reuse)
            if stale.name.startswith(("etc-", "disk-templates-")):
                shutil.rmtree(stale)
        statefs_after = shutil.disk_usage(state_dir).free >> 20
        disk.empty_and_unmount(state_dir)
        disk.image_path(state_dir).unlink()
        # The kernel gives back the memory of removed cgroups (their page cache, slab) lazily: the host's figures get
        # up to SETTLE_S to come back (at the end of one full run: 641 MiB short at once, 74 MiB 2 minutes later).
        after = settled_host_state(work, before, args.tolerance_mib)
        left += [f"loop device of {b.read_text().strip()}" for b in Path("/sys/block").glob("loop*/loop/backing_file")
                 if str(work) in b.read_text()]  # fmt: skip

    by_kind: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        mine = [r for r in results if r["kind"] == kind]
        by_kind[kind] = {
            "runs": len(mine),
            "graded": sum(r["graded"] for r in mine),
            "resolved": sum(r["resolved"] for r in mine),
            "median_wall_s": round(statistics.median([r["wall_s"] for r in mine]), 1) if mine else None,
            "max_peak_disk_mib": max((r.get("peak_disk_mib") or 0 for r in mine), default=None),
            "max_peak_memory_mib": max((r.get("peak_memory_mib") or 0 for r in mine), default=None),
            "max_cpu_s": max((r.get("cpu_s") or 0 for r in mine), default=None),
            "errors": sorted({r["error"] for r in mine if r.get("error")})[:3],
        }
    failures = []
    honest = by_kind["honest"]
    if honest["resolved"] != honest["runs"]:
        failures.append(f"honest runs resolved: {honest['resolved']}/{honest['runs']}")
    for kind in KINDS[1:]:
        if by_kind[kind]["graded"] != by_kind[kind]["runs"]:
            failures.append(f"{kind} runs graded: {by_kind[kind]['graded']}/{by_kind[kind]['runs']}")
    if left:
        failures.append(f"left behind: {left[:10]}")
    if abs(statefs_after - statefs_before) > 1:  # ext4 folders keep the blocks they grew to
        failures.append(
            f"the state file system's free MiB did not come back: {statefs_before} -> {statefs_after}"
        )
    for key in before:
        if before[key] - after[key] > args.tolerance_mib:  # (after's waited_s is not in before)
            failures.append(f"{key} did not come back: {before[key]} -> {after[key]}")
    report = {
        "runs": args.runs, "concurrency": args.concurrency, "wall_s": round(wall, 1),
        "settings": {"memory_mib": args.memory_mib, "disk_mib": args.disk_mib, "command_timeout_s": args.command_timeout},
        "by_kind": by_kind, "state_fs_free_mib_before": statefs_before, "state_fs_free_mib_after": statefs_after,
        "host_before": before, "host_after": after, "left_behind": left,
        "failures": failures, "load_average": os.getloadavg(),
    }  # fmt: skip
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
