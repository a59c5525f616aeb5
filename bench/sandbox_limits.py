"""The local sandbox's start-up and per-command cost, this tree against an older commit, side by side in one run:
first written for the cost of the limits (disk quota, setup network, seccomp filter, hidden host paths; `--before`
defaults to the commit before them), then for start-up speed-ups of the sandbox since removed (issue #24 item 6;
bench/README.md).

The "before" code is a git worktree of `--before` made in a temporary folder; each version runs in its own
long-lived Python process (PYTHONPATH pointing at its tree), and the parent asks them for one sample at a time,
alternately, so both see the same machine load. One sample:
- create_to_first_output: `LocalProvider.create(repo)` then `exec("echo ready")` until its output is back;
- create: create() alone; first_command: that first `exec("echo ready")`; warm_command: the median of 5 later
  `exec("true")` run back to back; idle_command: `exec("true")` after 0.25 s without a command (an agent's
  commands come seconds apart); setup_command: `exec("true", network=True)` (before the limits: the host's network shared;
  with them: a new namespace with slirp4netns and its routes); release: release().
The repository is the demo repository (bugsweep/demo_repo) made a git repository once.

`--docker IMAGE` also times `docker run --rm --network none IMAGE echo ready` until its output is back, one run
per round between the two versions' samples (so all three see the same load): the side-by-side figure for the
goal of "create to first output within 1/30 of docker run". It needs a running Docker daemon and an image with a
shell (made here with `debootstrap --variant=minbase bookworm DIR` and `tar -C DIR -c . | docker import - NAME`).

`--tmpfs-check` also writes 300 MB into a tmpfs and into a loop-mounted ext4 from inside a 256 MiB memory cgroup:
what a tmpfs quota would cost in memory (the reason the quota is an ext4 image).

Usage: python bench/sandbox_limits.py [--samples 40] [--before COMMIT] [--docker IMAGE] [--tmpfs-check] [--json F]
Needs: Linux, root, bubblewrap, slirp4netns, mkfs.ext4, git.
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

ROOT = Path(__file__).resolve().parents[1]
DOCKER_RUN_MS = 578.0  # `docker run --rm --network none true` on these machines (shared/notes/local-infra.md)
WARM_COMMANDS = 5
MEASURES = (
    "create_to_first_output", "create", "first_command", "warm_command", "idle_command", "setup_command", "release",
)  # fmt: skip
IDLE_S = 0.25


def child(repo: str, state: str) -> None:
    """Runs in the version under test (its PYTHONPATH): one sample per line read from stdin, one JSON line out."""
    from bugsweep.sandbox.base import RepoSource
    from bugsweep.sandbox.local import LocalProvider
    from bugsweep.settings import SandboxSettings

    provider = LocalProvider(
        SandboxSettings(), cache_dir=Path(state) / "cache", state_dir=Path(state) / "state"
    )
    source = RepoSource(repo)
    provider.create(source).release()  # one-off costs of a process stay out of the samples
    print("ready", flush=True)
    for _ in sys.stdin:
        t0 = time.perf_counter()
        sandbox = provider.create(source)
        t1 = time.perf_counter()
        assert sandbox.exec("echo ready").stdout == "ready\n"
        t2 = time.perf_counter()
        warm = []
        for _ in range(WARM_COMMANDS):
            t = time.perf_counter()
            sandbox.exec("true")
            warm.append(time.perf_counter() - t)
        time.sleep(IDLE_S)
        t = time.perf_counter()
        sandbox.exec("true")
        idle = time.perf_counter() - t
        t3 = time.perf_counter()
        assert sandbox.exec("true", network=True).ok
        t4 = time.perf_counter()
        sandbox.release()
        t5 = time.perf_counter()
        sample = {"create_to_first_output": t2 - t0, "create": t1 - t0, "first_command": t2 - t1,
                  "warm_command": statistics.median(warm), "idle_command": idle, "setup_command": t4 - t3, "release": t5 - t4}  # fmt: skip
        print(json.dumps(sample), flush=True)


class Version:
    """A long-lived child process running one version of the code, driven one sample at a time."""

    def __init__(self, tree: Path, repo: Path, state: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(repo), str(state)],
            env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready", tree

    def sample(self) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the child of {self.proc.args} ended")
        return dict(json.loads(line))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=120)


def summary(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {key: stats_ms([s[key] * 1000 for s in samples]) for key in MEASURES}


def stats_ms(values: list[float]) -> dict[str, float]:
    """Median and interquartile range of `values` (ms)."""
    q = statistics.quantiles(values, n=4)
    return {
        "median_ms": round(statistics.median(values), 1),
        "p25_ms": round(q[0], 1),
        "p75_ms": round(q[2], 1),
    }


def tmpfs_check(work: Path) -> dict[str, object]:
    """300 MB written by a process in a 256 MiB memory cgroup: to a tmpfs, and to a loop-mounted ext4."""
    from bugsweep.sandbox.local import disk

    own = next(
        line.split(":", 2)[2]
        for line in Path("/proc/self/cgroup").read_text().splitlines()
        if ":memory:" in line
    )
    group = Path("/sys/fs/cgroup/memory") / own.lstrip("/") / f"bench-tmpfs-{os.getpid()}"
    results: dict[str, object] = {}
    for kind in ("tmpfs", "ext4"):
        target = work / kind
        target.mkdir()
        if kind == "tmpfs":
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", str(target)], check=True)
        else:
            assert disk.WritableDisk.create(target, 1 << 30, work / "templates") is not None
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(256 << 20))
        try:
            proc = subprocess.run(
                ["sh", "-c", f'echo $$ > {group}/cgroup.procs && dd if=/dev/zero of={target}/f bs=1M count=300 status=none; '
                 f'echo rc=$?; grep -E "^(total_)?(cache|shmem|rss) " {group}/memory.stat'],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            results[kind] = {
                "exit": proc.returncode,
                "output": proc.stdout.strip().replace("\n", "; "),
                "oom_kills": (group / "memory.oom_control").read_text().split("oom_kill ")[-1].strip(),
                "max_usage_mib": int((group / "memory.max_usage_in_bytes").read_text()) >> 20,
            }
        finally:
            subprocess.run(["rm", "-f", f"{target}/f"], check=False)
            group.rmdir()
            if kind == "tmpfs":
                subprocess.run(["umount", str(target)], check=True)
            else:
                disk.empty_and_unmount(target)
                disk.image_path(target).unlink()
    return results


def docker_run_ms(image: str) -> float:
    """One `docker run --rm --network none IMAGE echo ready`, to its output, in ms."""
    t0 = time.perf_counter()
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "echo", "ready"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    elapsed = (time.perf_counter() - t0) * 1000
    if out.stdout != "ready\n":
        raise SystemExit(f"docker run {image} failed: {out.stderr.strip()}")
    return elapsed


def docker_results(docker_ms: list[float], after: dict[str, dict[str, float]]) -> dict[str, object]:
    docker = stats_ms(docker_ms)
    return {
        "docker_run_measured": docker,
        "create_to_first_output_as_share_of_measured_docker_run": round(
            after["create_to_first_output"]["median_ms"] / docker["median_ms"], 3
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--before", default="6ad8f3d", help="the code without the limits (a commit)")
    parser.add_argument("--tmpfs-check", action="store_true")
    parser.add_argument("--docker", metavar="IMAGE", help="time `docker run` of this image side by side")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1])
        return

    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        work = Path(tmp)
        before_tree = work / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(before_tree), args.before],
            check=True,
        )
        try:
            repo = work / "repo"
            subprocess.run(["cp", "-a", str(ROOT / "bugsweep" / "demo_repo"), str(repo)], check=True)
            for cmd in (
                ["init", "-q", "-b", "main"],
                ["add", "-A"],
                ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "demo"],
            ):
                subprocess.run(["git", "-C", str(repo), *cmd], check=True)
            versions = {
                "before": Version(before_tree, repo, work / "state-before"),
                "after": Version(ROOT, repo, work / "state-after"),
            }
            samples: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            docker_ms: list[float] = []
            load_at_start = os.getloadavg()
            try:
                for i in range(args.samples):  # alternating, and which goes first alternates too
                    for name in ("before", "after") if i % 2 == 0 else ("after", "before"):
                        samples[name].append(versions[name].sample())
                    if args.docker:
                        docker_ms.append(docker_run_ms(args.docker))
            finally:
                for version in versions.values():
                    version.close()
            before, after = summary(samples["before"]), summary(samples["after"])
            results: dict[str, object] = {
                "before_commit": args.before,
                "samples_per_version": len(samples["before"]),
                "before": before,
                "after": after,
                "ratio_after_vs_before": {
                    k: round(after[k]["median_ms"] / before[k]["median_ms"], 2) for k in MEASURES
                },
                "docker_run_ms_from_notes": DOCKER_RUN_MS,
                "create_to_first_output_as_share_of_docker_run": round(
                    after["create_to_first_output"]["median_ms"] / DOCKER_RUN_MS, 3
                ),
                **(docker_results(docker_ms, after) if docker_ms else {}),
                "load_average_at_start": load_at_start,
                "load_average_at_end": os.getloadavg(),
            }
            if args.tmpfs_check:
                results["tmpfs_vs_ext4_in_a_256MiB_memory_cgroup"] = tmpfs_check(work)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before_tree)], check=False
            )
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
