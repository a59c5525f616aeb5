"""Sandbox start-up and per-command overhead: the local backend against the Runtime backend on the fake Runtime
server, in one run.

What it measures, per backend, interleaved (local, runtime, local, runtime, ...) so that machine load hits both:
- create to first output: `provider.create(repo)` (the repository put in place) then `exec("echo ready")`, until
  that output is back;
- per command: the wall time of `exec("true")`, whole answer and streamed (full_output=True);
- for Runtime, the command's own duration as the API measured it (durationMs), so that wall - duration is our side
  of a call: the SDK, HTTP on 127.0.0.1 and the fake's routing;
- release.

The Runtime rows run against tests.support.fake_runtime_api (a local stand-in; its commands run under bubblewrap
like the local backend's), so they measure our client and protocol overhead, NOT Runtime's servers or network.

Usage: python bench/sandbox_runtime.py [--sandboxes 15] [--commands 40] [--json results.json]
Needs: bubblewrap; root for the local backend's overlayfs and cgroups (else its fallbacks are measured).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bugsweep.sandbox.base import RepoSource, Sandbox
from bugsweep.sandbox.local import LocalProvider
from bugsweep.sandbox.runtime import RuntimeProvider, RuntimeSettings
from bugsweep.settings import SandboxSettings
from tests.support.fake_runtime_api import FakeRuntime
from tests.support.repos import make_repo


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return (time.perf_counter() - start) * 1000, value


def one_sandbox(create: Callable[[], Sandbox], commands: int, samples: dict[str, list[float]]) -> None:
    def first() -> Sandbox:
        sbx = create()
        assert sbx.exec("echo ready").stdout == "ready\n"
        return sbx

    ms, sbx = timed(first)
    samples["create_to_first_output_ms"].append(ms)
    try:
        for _ in range(commands):
            ms, result = timed(lambda: sbx.exec("true"))
            assert result.ok
            samples["command_ms"].append(ms)
            samples["command_minus_duration_ms"].append(ms - result.duration_s * 1000)
            ms, result = timed(lambda: sbx.exec("true", full_output=True))
            assert result.ok
            samples["streamed_command_ms"].append(ms)
    finally:
        ms, _ = timed(sbx.release)
        samples["release_ms"].append(ms)


def summary(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"median": statistics.median(values), "p25": q[0], "p75": q[2], "n": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sandboxes", type=int, default=15, help="sandboxes per backend")
    parser.add_argument("--commands", type=int, default=40, help="commands of each kind per sandbox")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    keys = (
        "create_to_first_output_ms",
        "command_ms",
        "command_minus_duration_ms",
        "streamed_command_ms",
        "release_ms",
    )
    samples: dict[str, dict[str, list[float]]] = {b: {k: [] for k in keys} for b in ("local", "runtime")}
    with tempfile.TemporaryDirectory() as tmp, FakeRuntime() as fake:
        repo = make_repo(Path(tmp) / "calc")
        settings = SandboxSettings()
        local = LocalProvider(settings, cache_dir=Path(tmp) / "cache")
        runtime = RuntimeProvider(
            settings,
            RuntimeSettings(api_key=fake.api_key, api_url=fake.url),  # type: ignore[call-arg]
            cache_dir=Path(tmp) / "cache",
        )
        source = RepoSource(str(repo))
        one_sandbox(lambda: local.create(source), 2, {k: [] for k in keys})  # warm-up, not counted
        one_sandbox(lambda: runtime.create(source), 2, {k: [] for k in keys})
        for _ in range(args.sandboxes):
            one_sandbox(lambda: local.create(source), args.commands, samples["local"])
            one_sandbox(lambda: runtime.create(source), args.commands, samples["runtime"])
        runtime.close()

    results = {backend: {k: summary(v) for k, v in rows.items()} for backend, rows in samples.items()}
    print(f"{args.sandboxes} sandboxes x {args.commands} commands per backend; medians (p25-p75), ms")
    print("| measure | local | runtime (fake server) | runtime / local |")
    print("| --- | --- | --- | --- |")
    for key in keys:
        loc, rt = results["local"][key], results["runtime"][key]
        ratio = rt["median"] / loc["median"] if loc["median"] > 0 else float("nan")
        print(
            f"| {key} | {loc['median']:.1f} ({loc['p25']:.1f}-{loc['p75']:.1f}) "
            f"| {rt['median']:.1f} ({rt['p25']:.1f}-{rt['p75']:.1f}) | {ratio:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
