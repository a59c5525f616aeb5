"""`bugsweep review`: the review page of a run, a sweep in S3 and a comparison, looked at in a real browser.

Real parts: the `bugsweep solve` and `bugsweep review` commands, the `sweep` flow under a Prefect test server with
the local sandbox, a SeaweedFS S3 server holding the sweep's results, Debian's Chromium driven by Playwright with
DOM assertions. Stand-ins: the scripted model server (real HTTP, scripted replies: not a model), and a synthetic
200-turn run folder (tests/support/trajectories.py) for the size and speed check.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from bugsweep.spec import TaskSpec, dump_tasks
from tests.support.repos import PYTEST_SETUP, make_repo
from tests.support.scripted_model import ScriptedModelServer, tool_call
from tests.support.trajectories import write_long_run

pytest_plugins = ["tests.support.prefect_server", "tests.support.seaweed"]

CHROMIUM = Path("/usr/bin/chromium")  # Debian's, driven by Playwright (no browser download)
BUGSWEEP = [sys.executable, "-m", "bugsweep.cli"]
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian's chromium is not installed (apt-get install chromium)"
)
#: Model output that would run or draw something if it were put into the page as markup.
HOSTILE_SUMMARY = "done </script><script>alert(1)</script>"
HOSTILE_COMMAND = "echo '<img src=x onerror=alert(2)>' && python -m pytest -q"
HOSTILE_REPLY = "Let me look.</pre></details><script>alert(3)</script><b>bold</b>"
VIEWPORT = {"width": 1280, "height": 900}
SECRET_KEY_TEXT = "bugsweep-test-secret"


def review(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BUGSWEEP, "review", *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )  # fmt: skip


@contextmanager
def browser_page(path: Path) -> Iterator[tuple[Any, list[str]]]:
    """The page open in headless Chromium; yields it and every URL it requested (each request is recorded, and only
    the page's own file is let through)."""
    from playwright.sync_api import sync_playwright

    requested: list[str] = []
    dialogs: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

            def route(r: Any) -> None:
                requested.append(r.request.url)
                r.continue_() if r.request.url == path.resolve().as_uri() else r.abort()

            page.route("**/*", route)
            page.goto(path.resolve().as_uri(), wait_until="load")
            yield page, requested
            assert dialogs == [], f"the page ran a script it was given as data: {dialogs}"
        finally:
            browser.close()


def visible_rows(page: Any) -> dict[str, str]:
    """Task -> verdict of the index rows on screen."""
    rows = page.locator("#index tbody tr:visible")
    return {
        rows.nth(i).locator("td").first.inner_text(): rows.nth(i).locator("td.verdict").inner_text()
        for i in range(rows.count())
    }


class Addresses(HTMLParser):
    """Every address the page's markup holds: attributes that load or link, and url()/@import in its styles."""

    LOADING = frozenset(
        {"src", "href", "action", "formaction", "srcset", "data", "poster", "background", "ping"}
    )

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self.in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.in_style = tag == "style"
        self.found += [f"{tag} {name}={value}" for name, value in attrs if name in self.LOADING and value
                       and not value.startswith("#")]  # fmt: skip
        if tag == "meta" and dict(attrs).get("http-equiv", "").lower() == "refresh":
            self.found.append("meta refresh")

    def handle_data(self, data: str) -> None:
        if self.in_style and ("url(" in data or "@import" in data):
            self.found.append(f"style: {data[:80]}")


def assert_loads_nothing(html: str, requested: list[str], page_file: Path) -> None:
    """No address in the markup but the page's own anchors, and the browser asked for nothing but the page."""
    assert requested == [page_file.resolve().as_uri()], requested
    parser = Addresses()
    parser.feed(html)
    assert parser.found == []


# -- a run folder from `bugsweep solve` ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def solved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real resolved run whose model wrote markup and script into its reply, a command and its summary."""
    tmp = tmp_path_factory.mktemp("solved")
    repo = make_repo(tmp / "calc")
    steps = [
        {
            "content": HOSTILE_REPLY,
            "tool_calls": [{"name": "run", "arguments": {"command": HOSTILE_COMMAND}}],
        },
        tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b"),
        tool_call("finish", summary=HOSTILE_SUMMARY),
    ]
    with ScriptedModelServer(steps) as server:
        env = {
            **os.environ,
            "LLM_BASE_URL": server.base_url,
            "LLM_MODEL": "scripted",
            "LLM_API_KEY": "sk-test-x",
        }
        done = subprocess.run(
            [*BUGSWEEP, "solve", "--repo", str(repo), "--task", "test_add fails <script>alert(4)</script>",
             "--test-command", "python -m pytest -q", "--setup-command", PYTEST_SETUP, "--out", str(tmp / "run")],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp / "run"


@needs_chromium
def test_model_output_renders_as_text_and_the_page_loads_nothing(solved_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "page" / "review.html"
    done = review(str(solved_run), "-o", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"wrote {out}" in done.stdout and "1 run: 1 resolved" in done.stdout
    html = out.read_text()
    assert "<script>alert(" not in html and "<img src=x" not in html, "model output went in as markup"

    with browser_page(out) as (page, requested):
        page.locator("#index a").first.click()  # opens the task: its timeline is rendered now
        timeline = page.locator(".timeline")
        timeline.locator(".turn").first.wait_for()
        text = timeline.inner_text()
        assert HOSTILE_SUMMARY in text and HOSTILE_REPLY in text and HOSTILE_COMMAND in text
        drawn = "main img, main b:has-text('bold'), main script:not([type='application/json'])"
        assert page.locator(drawn).count() == 0, "only the page's own elements, and its data as JSON"
        page.get_by_text("Before the first turn").click()
        assert "test_add fails <script>alert(4)</script>" in timeline.inner_text()
        page.get_by_text("The task as the model was given it").click()
        assert "<script>alert(4)</script>" in page.locator("details.task .facts").inner_text()
        assert_loads_nothing(html, requested, out)


def test_the_page_goes_into_the_run_folder_and_bad_locations_exit_2_with_one_line(
    solved_run: Path, tmp_path: Path
) -> None:
    done = review(str(solved_run))
    assert done.returncode == 0 and (solved_run / "review.html").is_file(), done.stdout + done.stderr

    missing = review(str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr, missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1 and "Traceback" not in missing.stderr

    (tmp_path / "empty" / "sub").mkdir(parents=True)
    empty = review(str(tmp_path / "empty"))
    assert empty.returncode == 2 and "no graded run in" in empty.stderr, empty.stderr

    helped = review("--help")
    assert helped.returncode == 0 and "s3://BUCKET/PREFIX" in helped.stdout and "--out" in helped.stdout


# -- a comparison ---------------------------------------------------------------------------------------------------


def test_a_comparison_shows_its_rates_and_each_run(solved_run: Path, tmp_path: Path) -> None:
    """A comparison's folder as compare-models leaves it: NAME/TASK/ENTRY/CONFIG/run-N/ and report.json on top
    (here two runs copied from the real solve, and the report bugsweep.report makes of their grades)."""
    from bugsweep.grading import Grade
    from bugsweep.report import RunRecord, build_report, write_report

    grade = Grade.model_validate_json((solved_run / "grade.json").read_text())
    folder = tmp_path / "compare-calc"
    records = []
    for run in (0, 1):
        shutil.copytree(solved_run, folder / "calc" / "entry-a" / str(grade.config_digest) / f"run-{run}")
        records.append(RunRecord.from_grade(grade, model="entry-a", run=run))
    write_report(build_report(records), folder)

    done = review(str(folder))

    assert done.returncode == 0, done.stdout + done.stderr
    html = (folder / "review.html").read_text()
    assert "<title>Comparison compare-calc" in html and "Resolve rates" in html
    assert html.count('<tr data-verdict="resolved"') == 2 and "run 1" in html


# -- a sweep in S3 --------------------------------------------------------------------------------------------------


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """Per task, by what its text asks: FIX fixes and finishes; HOLD fixes with a line that inspects its caller (a
    suspicious signal: held for review); anything else finishes at once (not resolved)."""
    task = json.dumps(body["messages"][:2])
    answered = any(m.get("role") == "tool" for m in body["messages"])
    if answered or ("FIX" not in task and "HOLD" not in task):
        return tool_call("finish", summary="done")
    new = "return a + b  # inspect.stack() would say who calls" if "HOLD" in task else "return a + b"
    return tool_call("edit_file", path="calc.py", old="return a - b", new=new)


SWEEP_VERDICTS = {
    "calc-fix": "resolved",
    "calc-hold": "held for review",
    "calc-give-up": "not resolved",
    "calc-broken-setup": "could not run",
}


#: Sweeps whose names share a beginning, in one bucket: each must see only its own runs. `nightly` (the four
#: verdicts above) runs last, after the other two have stored theirs beside it.
OTHER_SWEEPS = {"nightly-fail": ["calc-broken-setup"], "nightly-x": ["calc-fix"]}


@pytest.fixture(scope="module")
def s3_sweep(
    prefect_harness: None, seaweed: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The `sweep` flow in one new SeaweedFS bucket (BUGSWEEP_STORE_URL=s3://BUCKET/runs, as a user configures it
    without blocks): `nightly-fail` (a task that cannot run), `nightly-x` (calc-fix under another turn budget, so
    another configuration), then `nightly` on four tasks, one of each verdict."""
    from prefect.artifacts import Artifact

    from bugsweep.discover import TaskFile
    from flows.common import AgentChoices
    from flows.sweep import SweepFailed, sweep
    from tests.support.seaweed import ACCESS_KEY, SECRET_KEY

    tmp = tmp_path_factory.mktemp("sweep")
    repo = make_repo(tmp / "calc")
    text = {"calc-fix": "FIX", "calc-hold": "HOLD", "calc-give-up": "GIVE UP", "calc-broken-setup": "FIX"}
    specs = {
        task: TaskSpec(
            instance_id=task, repo=str(repo), problem_statement=f"{text[task]}: tests/test_calc.py::test_add fails",
            test_command="python -m pytest -q",
            setup_command="echo 'no such package' >&2; exit 3" if task == "calc-broken-setup" else PYTEST_SETUP,
        )
        for task in SWEEP_VERDICTS
    }  # fmt: skip
    store = seaweed.new_store(prefix="runs")
    env = {
        "BUGSWEEP_STORE_URL": f"s3://{store.bucket}/runs",
        "BUGSWEEP_STORE_ENDPOINT_URL": seaweed.endpoint_url,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "BUGSWEEP_STORE_LOCAL_DIR": str(tmp / "local"),
        "BUGSWEEP_STORE_ATTEMPTS": "2",
    }
    states = {}
    with ScriptedModelServer([answer] * 30) as server, pytest.MonkeyPatch.context() as mp:
        for name, value in {**env, "LLM_BASE_URL": server.base_url, "LLM_MODEL": "scripted-model",
                            "LLM_API_KEY": "sk-test-secret"}.items():  # fmt: skip
            mp.setenv(name, value)
        for name, tasks in [*OTHER_SWEEPS.items(), ("nightly", list(SWEEP_VERDICTS))]:
            dump_tasks([specs[t] for t in tasks], tmp / f"{name}.jsonl")
            states[name] = sweep(source=TaskFile(path=str(tmp / f"{name}.jsonl")), name=name, concurrency=2,
                                 limits=AgentChoices(max_turns=5 if name == "nightly-x" else 4), return_state=True)  # fmt: skip
        # one task of nightly could not run: it ends FAILED, the others graded
        with pytest.raises(SweepFailed):
            states["nightly"].result()
        summaries = {name: Artifact.get(f"sweep-{name}") for name in states}
        link = Artifact.get("sweep-nightly-review")
    yield {"store": store, "name": "nightly", "env": env, "summary": summaries["nightly"], "link": link,
           "tmp": tmp, "states": states, "summaries": summaries}  # fmt: skip


@pytest.mark.prefect
@pytest.mark.s3
def test_the_sweep_flow_stores_its_review_page_beside_the_results_and_links_it(
    s3_sweep: dict[str, Any],
) -> None:
    """The page is in the bucket and the link artifact and the summary link to it: a presigned link that opens
    the page from a private bucket (an anonymous GET is refused), saying until when."""
    import httpx

    store, name = s3_sweep["store"], s3_sweep["name"]
    key = f"{name}/review.html"
    assert store.exists(key), store.list(name)
    stored = store.get_bytes(key).decode()
    for task in SWEEP_VERDICTS:
        assert task in stored
    head = store.client.head_object(Bucket=store.bucket, Key=f"runs/{key}")
    assert head["ContentType"] == "text/html; charset=utf-8", "a browser opening the link shows the page"
    assert (
        httpx.get(f"{s3_sweep['env']['BUGSWEEP_STORE_ENDPOINT_URL']}/{store.bucket}/runs/{key}").status_code
        == 403
    )
    link = s3_sweep["link"]
    assert link is not None and link.type == "markdown", link  # Prefect stores a link artifact as markdown
    (url,) = re.findall(r"\]\((http[^)]+)\)", str(link.data))
    opened = httpx.get(url)
    assert opened.status_code == 200 and opened.text == stored
    assert "opens until" in str(link.data) and "opens until" in (link.description or "")
    assert f"[Review page]({url}) (opens until" in str(s3_sweep["summary"].data)
    assert SECRET_KEY_TEXT not in str(link.data) + str(s3_sweep["summary"].data)


@pytest.mark.prefect
@pytest.mark.s3
def test_sweeps_whose_names_share_a_beginning_stay_apart(s3_sweep: dict[str, Any]) -> None:
    """`nightly`, `nightly-fail` and `nightly-x` in one bucket: each summary, review page and predictions file
    holds only its own tasks, and each final state says what its night did."""
    store, states, summaries = s3_sweep["store"], s3_sweep["states"], s3_sweep["summaries"]
    for name, tasks in [*OTHER_SWEEPS.items(), ("nightly", list(SWEEP_VERDICTS))]:
        page = store.get_bytes(f"{name}/review.html").decode()
        shown = sorted(re.findall(r'<tr data-verdict="[^"]+"[^>]*>\s*<td[^>]*>\s*<a [^>]*>([^<]+)</a>', page))
        assert shown == sorted(tasks), (name, shown)
        predictions = [json.loads(line) for line in store.get_bytes(f"{name}/predictions.jsonl").splitlines()]
        assert [p["instance_id"] for p in predictions] == tasks
        summary = str(summaries[name].data)
        assert "other configuration" not in summary, f"{name}: another sweep's grade in its summary"
        for other in set(SWEEP_VERDICTS) - set(tasks):
            assert f"| {other} |" not in summary, (name, other)
    assert states["nightly-fail"].is_failed() and states["nightly-x"].is_completed()
    assert states["nightly-x"].message == (
        "sweep nightly-x COMPLETED: 1 task(s) graded: 1 resolved, 0 not resolved, 0 held for review, 0 could not run"
    )
    assert states["nightly"].message.startswith(
        "sweep nightly FAILED: 1 of 4 task(s) could not be run or stored (1 resolved, 1 not resolved, 1 held for "
        "review, 1 could not run). calc-broken-setup: failed (task): the setup command"
    ), states["nightly"].message


@pytest.mark.prefect
@pytest.mark.s3
@needs_chromium
def test_the_page_of_a_sweep_in_s3_lists_every_verdict_filters_and_opens_a_task(
    s3_sweep: dict[str, Any], tmp_path: Path
) -> None:
    store, name = s3_sweep["store"], s3_sweep["name"]
    out = tmp_path / "nightly.html"
    done = review(f"s3://{store.bucket}/runs/{name}", "-o", str(out), env=s3_sweep["env"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 runs: " in done.stdout
    html = out.read_text()

    with browser_page(out) as (page, requested):
        assert visible_rows(page) == SWEEP_VERDICTS
        page.get_by_role("button", name=re.compile(r"^resolved \(1\)")).click()
        assert visible_rows(page) == {"calc-fix": "resolved"}
        assert page.locator("details.task:visible").count() == 1
        page.get_by_role("button", name=re.compile(r"^could not run \(1\)")).click()
        assert visible_rows(page) == {"calc-broken-setup": "could not run"}
        assert "exited with 3" in page.locator("#index tbody tr:visible td.why").inner_text()
        page.get_by_role("button", name=re.compile(r"^held for review")).click()
        page.get_by_role("link", name="calc-hold").click()
        assert "inspects its caller" in page.locator("details.task[open] .evidence").inner_text()
        page.get_by_role("button", name=re.compile(r"^all \(4\)")).click()
        assert len(visible_rows(page)) == 4

        page.get_by_role("link", name="calc-fix").click()
        task = page.locator("details.task[open]", has_text="calc-fix")
        evidence = task.locator(".evidence")
        assert "Fixed: failed before, pass after (1)" in evidence.inner_text()
        assert "tests/test_calc.py::test_add" in evidence.inner_text()
        added = task.locator(
            ".patch .highlight .gi", has_text="return"
        )  # Pygments' class of an inserted line
        assert added.inner_text().startswith("+    return a + b")
        removed = task.locator(".patch .highlight .gd", has_text="return")  # ... of a deleted line
        assert removed.inner_text().startswith("-    return a - b")
        turns = task.locator(".timeline .turn")
        assert turns.count() == 2, "the fix, then finish"
        first = turns.first
        assert first.locator(".tool-name").inner_text() == "edit_file"
        assert "old: return a - b" in first.locator(".args").inner_text()
        result = first.locator("details.fold", has_text="result")
        assert result.get_attribute("open") is None, "results are folded"
        assert re.search(r"\d[\d,]* prompt \+ \d+ completion", first.locator(".tokens").inner_text())
        assert "model " in first.locator(".time").inner_text() and "$" in first.locator(".cost").inner_text()
        assert "scripted-model" in task.locator(".config").inner_text()
        task.locator(".config a").click()
        assert page.locator("#configurations details[open] pre").inner_text().count('"policy": "plain"') == 1

        task.scroll_into_view_if_needed()
        shot = tmp_path / "sweep-task.png"
        page.screenshot(path=str(shot))
        assert_screenshot(page, shot)
        assert_loads_nothing(html, requested, out)


def assert_screenshot(page: Any, shot: Path) -> None:
    """The PNG has the viewport's size and is not blank: read back in the browser (a canvas), it has many colours
    and a good share of pixels that are not background."""
    import base64

    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (VIEWPORT["width"], VIEWPORT["height"])
    measure = page.context.browser.new_page()
    stats = measure.evaluate(
        """async (src) => {
            const img = new Image(); img.src = src; await img.decode();
            const canvas = document.createElement('canvas'); canvas.width = img.width; canvas.height = img.height;
            const ctx = canvas.getContext('2d'); ctx.drawImage(img, 0, 0);
            const px = ctx.getImageData(0, 0, img.width, img.height).data;
            const colours = new Set(); let ink = 0;
            for (let i = 0; i < px.length; i += 4) {
                colours.add((px[i] << 16) | (px[i + 1] << 8) | px[i + 2]);
                if (px[i] + px[i + 1] + px[i + 2] < 600) ink++;
            }
            return {colours: colours.size, ink: ink / (px.length / 4)};
        }""",
        "data:image/png;base64," + base64.b64encode(data).decode(),
    )
    measure.close()
    assert stats["colours"] > 50 and stats["ink"] > 0.02, stats


# -- a long trajectory ----------------------------------------------------------------------------------------------


@needs_chromium
def test_a_200_turn_trajectory_opens_fast_and_its_timeline_renders_only_when_opened(tmp_path: Path) -> None:
    folder = write_long_run(tmp_path / "long", turns=200)
    done = review(str(folder))
    assert done.returncode == 0, done.stdout + done.stderr
    page_file = folder / "review.html"
    size = page_file.stat().st_size
    assert size < 1.5 * (folder / "trajectory.json").stat().st_size, (
        "the page is not much bigger than the record"
    )

    with browser_page(page_file) as (page, _):
        assert page.locator(".timeline .turn").count() == 0, (
            "nothing of the timeline is drawn before it is opened"
        )
        started = time.perf_counter()
        page.locator("details.task > summary").click()
        page.locator(".timeline .turn[data-turn='200']").wait_for()
        opened_s = time.perf_counter() - started
        assert page.locator(".timeline .turn").count() == 200
        assert page.locator(".timeline details.fold[open]", has_text="result").count() == 0
        last = page.locator(".timeline .turn[data-turn='200']")
        assert "9,000 prompt + 60 completion (4,500 cached) tokens" in last.inner_text()
        # bench/README.md: ~0.1 s here; ten times that is still a page that opens at once
        assert opened_s < 5.0, f"opening the task took {opened_s:.1f} s"
