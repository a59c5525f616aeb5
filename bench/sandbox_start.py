"""Sandbox start to first command output: the local sandbox against a plain subprocess on the same host.

One sample of the local sandbox is `LocalProvider.create(RepoSource(repo))` followed by `exec("echo ready")`,
timed from the start of create() until the output is back; release() runs after the clock stops. One sample of
the baseline is `subprocess.run(["bash", "-c", "echo ready"])`. The two alternate within one run, so both see the
same machine load. The repository is generated: a git repository of about 50 MB (text files in folders, one commit),
built once under a temporary folder. The medians are compared with the 221 ms that Runtime states for its sandbox
start, and with the 50 ms target.

Also reported, from the same samples: create() alone, the first exec, a later exec in a warm sandbox, release().

Usage: python bench/sandbox_start.py [--runs 50] [--size-mb 50] [--json results.json]
Needs: Linux, root, bubblewrap.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bugsweep.sandbox.base import RepoSource
from bugsweep.sandbox.local import LocalProvider
from bugsweep.settings import SandboxSettings
from tests.support.repos import commit_all, git

RUNTIME_STATED_MS = 221.0
TARGET_MS = 50.0


def make_big_repo(path: Path, size_mb: int) -> Path:
    """A git repo of about `size_mb` MB of text in 100 folders (files of 25 KB), one commit."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    rng = random.Random(0)
    words = [f"word{i}" for i in range(5000)]
    file_size = 25_000
    for i in range(size_mb * 1_000_000 // file_size):
        folder = path / f"pkg{i % 100}"
        folder.mkdir(exist_ok=True)
        text = []
        n = 0
        while n < file_size:
            line = " ".join(rng.choices(words, k=8)) + "\n"
            text.append(line)
            n += len(line)
        (folder / f"mod{i}.py").write_text("".join(text))
    commit_all(path, "a big repository")
    return path


def tree_mb(path: Path, *, skip_git: bool = False) -> float:
    total = 0
    for root, dirs, files in os.walk(path):
        if skip_git and ".git" in dirs:
            dirs.remove(".git")
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_size
    return total / 1e6


def ms(seconds: list[float]) -> dict[str, float]:
    q = statistics.quantiles(seconds, n=4)
    return {
        "median_ms": round(statistics.median(seconds) * 1000, 2),
        "p25_ms": round(q[0] * 1000, 2),
        "p75_ms": round(q[2] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--size-mb", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp:
        work = Path(tmp)
        repo = make_big_repo(work / "repo", args.size_mb)
        provider = LocalProvider(SandboxSettings(), cache_dir=work / "cache", state_dir=work / "state")
        source = RepoSource(str(repo))
        provider.create(source).release()  # one-off costs (bwrap check, stale sweep) stay out of the samples

        start_s, create_s, first_exec_s, warm_exec_s, release_s, plain_s = [], [], [], [], [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run(["bash", "-c", "echo ready"], capture_output=True, check=True)
            plain_s.append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            sandbox = provider.create(source)
            t1 = time.perf_counter()
            result = sandbox.exec("echo ready")
            t2 = time.perf_counter()
            assert result.stdout == "ready\n", result
            sandbox.exec("echo ready")
            t3 = time.perf_counter()
            sandbox.release()
            t4 = time.perf_counter()
            start_s.append(t2 - t0)
            create_s.append(t1 - t0)
            first_exec_s.append(t2 - t1)
            warm_exec_s.append(t3 - t2)
            release_s.append(t4 - t3)

        start, plain = ms(start_s), ms(plain_s)
        results = {
            "runs": args.runs,
            "repo_mb": round(tree_mb(repo), 1),
            "worktree_mb_without_git": round(tree_mb(repo, skip_git=True), 1),
            "repo_files": sum(len(f) for _, _, f in os.walk(repo)),
            "local_create_to_first_output": start,
            "plain_subprocess_bash_echo": plain,
            "local_create_only": ms(create_s),
            "local_first_exec": ms(first_exec_s),
            "local_warm_exec": ms(warm_exec_s),
            "local_release": ms(release_s),
            "ratio_local_vs_subprocess": round(start["median_ms"] / plain["median_ms"], 1),
            "runtime_stated_ms": RUNTIME_STATED_MS,
            "ratio_runtime_vs_local": round(RUNTIME_STATED_MS / start["median_ms"], 1),
            "target_ms": TARGET_MS,
            "meets_target": start["median_ms"] < TARGET_MS,
            "load_average": os.getloadavg(),
        }
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
