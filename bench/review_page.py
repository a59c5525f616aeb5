"""The review page of a long run: its size, the time to load it and the time to open its task, in Chromium.

A synthetic run folder whose agent ran N turns (tests/support/trajectories.py: each turn a reply, a tool call and
its result of ~4,000 characters, as real failing pytest runs and file reads give) is turned into a page with
`bugsweep review` (the real command). Then, in Debian's Chromium driven by Playwright (a fresh page each time):
- load: from `page.goto(file://...)` to the `load` event;
- open: from clicking the task's summary to its N turns in the DOM (the timeline is rendered from its JSON only
  then), measured inside the page (performance.now() around the click and a wait for the last turn's element);
- layout: the first paint of the opened task, measured as the time `page.screenshot()` of the viewport takes.
Medians of `--repeat` runs.

With `--runs N`, the page is a sweep's of N such runs (the same folder under N task names): load then parses N
trajectories' JSON only as text, and opening one task renders that task's turns alone.

Usage: python bench/review_page.py [--turns 200] [--runs 1] [--repeat 5]
Needs: /usr/bin/chromium (apt-get install chromium) and the `playwright` package (no browser download).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.trajectories import write_long_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="bench-review-") as tmp:
        if args.runs == 1:
            folder = write_long_run(Path(tmp) / "run", turns=args.turns)
        else:
            folder = Path(tmp) / "sweep"
            for n in range(args.runs):
                write_long_run(folder / f"task-{n:03d}" / "model" / "config", args.turns, f"task-{n:03d}")
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bugsweep.cli", "review", str(folder)], check=True, cwd=ROOT)
        build_s = time.perf_counter() - started
        page_file = folder / "review.html"
        loads, opens, paints = [], [], []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            for _ in range(args.repeat):
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                started = time.perf_counter()
                page.goto(page_file.as_uri(), wait_until="load")
                loads.append(time.perf_counter() - started)
                opened_ms = page.evaluate(
                    """(turns) => new Promise(resolve => {
                        const t0 = performance.now();
                        document.querySelector('details.task > summary').click();
                        const check = () => document.querySelectorAll('details[open] .timeline .turn').length === turns
                            ? resolve(performance.now() - t0) : requestAnimationFrame(check);
                        check();
                    })""",
                    args.turns,
                )
                opens.append(opened_ms / 1000)
                started = time.perf_counter()
                page.screenshot()
                paints.append(time.perf_counter() - started)
                page.close()
            browser.close()
        trajectory = sum(p.stat().st_size for p in folder.rglob("trajectory.json"))
        size = page_file.stat().st_size
    print(
        f"{args.runs} run(s) of {args.turns} turns; trajectory.json {trajectory / 1e6:.2f} MB; page {size / 1e6:.2f} MB"
    )
    print(f"bugsweep review (whole command): {build_s:.2f} s")
    for name, values in (("load", loads), ("open the task", opens), ("screenshot after opening", paints)):
        print(f"{name}: median {statistics.median(values) * 1000:.0f} ms (of {len(values)}: "
              f"{', '.join(f'{v * 1000:.0f}' for v in values)})")  # fmt: skip


if __name__ == "__main__":
    main()
