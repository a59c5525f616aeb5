"""Comparison statistics and rendering (bugsweep.report). Pure computation: no stand-ins needed."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest

from bugsweep.report import (
    RunRecord,
    build_report,
    render_html,
    render_json,
    render_markdown,
    write_report,
)
from bugsweep.stats import bootstrap_mean_ci, sign_test_p, wilson_interval


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        # Known values (Newcombe 1998, Table I; and the textbook 5/10 example).
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
        (5, 10, 0.2366, 0.7634),
        (10, 10, 0.7225, 1.0),
    ],
)
def test_wilson_interval_matches_published_values(k: int, n: int, low: float, high: float) -> None:
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=5e-5)
    assert hi == pytest.approx(high, abs=5e-5)


def test_wilson_interval_without_data_is_uninformative() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_sign_test_exact_values() -> None:
    # 8 wins, 2 losses: 2 * P(X <= 2 | n=10, p=.5) = 2 * 56/1024
    assert sign_test_p(8, 2) == pytest.approx(112 / 1024)
    assert sign_test_p(5, 0) == pytest.approx(2 / 32)
    assert sign_test_p(3, 3) == 1.0
    assert sign_test_p(0, 0) == 1.0


def test_bootstrap_ci_brackets_the_mean_and_is_reproducible() -> None:
    values = [1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 1.0, 1.0]
    lo, hi = bootstrap_mean_ci(values)
    assert lo < sum(values) / len(values) < hi
    assert (lo, hi) == bootstrap_mean_ci(values)
    assert bootstrap_mean_ci([0.25, 0.25]) == (0.25, 0.25)


def _records() -> list[RunRecord]:
    """Model A resolves every task; B only t0; C's runs on t2 were lost to an endpoint outage."""
    recs = []
    for t in range(4):
        for r in range(2):
            recs.append(
                RunRecord(
                    model="A",
                    instance_id=f"t{t}",
                    run=r,
                    resolved=True,
                    turns=4,
                    wall_s=2.0,
                    prompt_tokens=100,
                    completion_tokens=10,
                    cached_tokens=5,
                    cost_usd=0.01,
                )
            )
            recs.append(
                RunRecord(model="B", instance_id=f"t{t}", run=r, resolved=t == 0, turns=1, wall_s=1.0)
            )
            infra = t == 2
            recs.append(
                RunRecord(
                    model="C",
                    instance_id=f"t{t}",
                    run=r,
                    resolved=not infra and r == 0,
                    failure_kind="infra" if infra else None,
                    error="down" if infra else None,
                )
            )
    return recs


def test_report_rates_pairs_and_per_task_cells() -> None:
    report = build_report(_records(), wall_s=3.0)
    by_model = {s.model: s for s in report.models}
    assert (by_model["A"].resolved, by_model["A"].graded, by_model["A"].rate) == (8, 8, 1.0)
    assert (by_model["B"].resolved, by_model["B"].graded) == (2, 8)
    assert by_model["B"].rate == 0.25
    # runs lost to an outage are listed but not graded
    assert (by_model["C"].graded, by_model["C"].not_graded, by_model["C"].resolved) == (6, 2, 3)
    assert by_model["A"].prompt_tokens == 800 and by_model["A"].cached_tokens == 40
    assert by_model["A"].cost_usd == pytest.approx(0.08)
    assert by_model["A"].mean_turns == 4.0

    ab = next(p for p in report.pairs if (p.a, p.b) == ("A", "B"))
    assert (ab.tasks, ab.a_better, ab.b_better, ab.ties) == (4, 3, 0, 1)
    assert ab.mean_diff == pytest.approx(0.75)
    assert ab.ci_low <= 0.75 <= ab.ci_high
    assert ab.sign_test_p == pytest.approx(0.25)
    # the pair with C only uses the tasks C has graded runs on
    ac = next(p for p in report.pairs if (p.a, p.b) == ("A", "C"))
    assert ac.tasks == 3
    assert ac.mean_diff == pytest.approx(0.5)

    row = next(r for r in report.tasks if r.instance_id == "t2")
    assert row.cells["C"].rate is None and row.cells["C"].runs == 2
    assert report.sum_run_wall_s == pytest.approx(8 * 2.0 + 8 * 1.0)
    assert report.runs_per_task == 2


def test_markdown_and_json_carry_the_numbers() -> None:
    report = build_report(_records(), wall_s=3.0)
    md = render_markdown(report)
    assert "| A | 8/8 | 100% | 68%-100% |" in md
    assert "| B | 2/8 | 25% |" in md
    assert "| t2 | 2/2 | 0/2 | 0/0 (+2 not graded) |" in md
    data = json.loads(render_json(report))
    assert [m["model"] for m in data["models"]] == ["A", "B", "C"]
    assert data["models"][1]["rate"] == 0.25
    assert len(data["records"]) == 24


def test_html_is_self_contained_with_an_inline_chart(tmp_path) -> None:
    report = build_report(_records(), wall_s=3.0)
    page = render_html(report)
    assert page.startswith("<!DOCTYPE html>")
    assert "<svg" in page and "</svg>" in page
    # nothing fetched from anywhere: no external scripts, styles, images or fonts
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert not re.search(r"<link\b", page)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
    paths = write_report(report, tmp_path / "out")
    assert {p.name for p in paths.values()} == {"report.md", "report.json", "report.html"}
    assert all(p.stat().st_size > 0 for p in paths.values())


def test_model_names_are_escaped_in_html() -> None:
    recs = [RunRecord(model="<script>alert(1)</script>", instance_id="t", resolved=True)]
    page = render_html(build_report(recs))
    assert "<script>" not in page


def test_resource_use_per_task_is_the_heaviest_run_and_is_rendered() -> None:
    """A team sizes its workers from the report: per task, the most memory, CPU and disk any run used."""
    recs = [
        RunRecord(model="A", instance_id="t0", peak_memory_mib=120.0, cpu_s=3.5, peak_disk_mib=40.0),
        RunRecord(model="B", instance_id="t0", peak_memory_mib=900.0, cpu_s=1.25, peak_disk_mib=2048.0),
        RunRecord(model="A", instance_id="t1"),  # a backend that measures nothing (Runtime)
    ]
    report = build_report(recs)
    heavy = {r.instance_id: r for r in report.resources}
    assert (heavy["t0"].peak_memory_mib, heavy["t0"].cpu_s, heavy["t0"].peak_disk_mib) == (900.0, 3.5, 2048.0)
    assert heavy["t1"].peak_memory_mib is None
    md = render_markdown(report)
    assert "| t0 | 900 | 3.5 | 2048 |" in md
    assert "| t1 | - | - | - |" in md
    assert "Resource use per task" in render_html(report)
    assert json.loads(render_json(report))["resources"][0]["peak_disk_mib"] == 2048.0


def test_run_record_takes_the_resource_fields_from_a_grade() -> None:
    from bugsweep.grading import Grade

    grade = Grade(instance_id="t", peak_memory_mib=64.0, cpu_s=2.0, peak_disk_mib=10.5, disk_quota_mib=8192.0)
    record = RunRecord.from_grade(grade, model="m", run=0)
    assert (record.peak_memory_mib, record.cpu_s, record.peak_disk_mib) == (64.0, 2.0, 10.5)


def test_the_report_says_whether_every_model_ran_under_the_same_policy() -> None:
    same = [r.model_copy(update={"policy": "plain"}) for r in _records()]
    report = build_report(same)
    assert report.policy == "plain"
    assert "Every model ran under the same agent policy: plain." in render_markdown(report)
    assert json.loads(render_json(report))["policy"] == "plain"

    mixed = [
        r.model_copy(update={"policy": "small-model" if r.model == "B" else "plain"}) for r in _records()
    ]
    report = build_report(mixed)
    assert report.policy is None
    md = render_markdown(report)
    assert "did not all run under the same agent policy (A: plain; B: small-model; C: plain)" in md
    assert "| B | 2/8 | 25% |" in md and "| small-model |" in md
    assert "did not all run under the same agent policy" in render_html(report)


def test_a_run_held_for_review_counts_as_not_resolved_and_is_listed() -> None:
    """A grade whose tests pass with `suspicious` signals is held for review (bugsweep.grading.grade): the
    comparison counts it as not resolved and lists it, in the report and in a sweep's summary."""
    from bugsweep.grading import TestRun, grade
    from tasks.steps import summary_markdown, summary_row

    def run(outcome: str, code: int) -> TestRun:
        tests = {"t::a": outcome, "t::b": "passed"}
        return TestRun(command="pytest", exit_code=code, timed_out=False, log="", duration_s=0.1, tests=tests)

    signal = "calc.py:3: replaces an assertion method: x"
    flagged = grade(instance_id="t1", before=run("failed", 1), after=run("passed", 0), suspicious=[signal])
    assert flagged.held_for_review and not flagged.resolved and flagged.passes_after
    assert flagged.reason and flagged.reason.startswith("held for review")
    clean = grade(instance_id="t2", before=run("failed", 1), after=run("passed", 0))
    assert clean.resolved and not clean.held_for_review
    flagged.model = clean.model = "m"
    records = [RunRecord.from_grade(g, model="m", run=0) for g in (flagged, clean)]
    report = build_report(records)
    assert report.models[0].resolved == 1 and report.models[0].graded == 2
    text = render_markdown(report)
    assert "## Held for review" in text and "| m | t1 | 0 | held for review | calc.py:3" in text
    assert "<td>held for review</td>" in render_html(report)
    rows = [summary_row(g, uploaded_to="") for g in (flagged, clean)]
    summary = summary_markdown("nightly", rows, "s3://b/nightly")
    assert "**1 of 2** tasks resolved" in summary and "| t1 | m | - | - | held for review |" in summary
    assert (
        "**COMPLETED: 2 task(s) graded: 1 resolved, 0 not resolved, 1 held for review, 0 could not run**"
        in summary
    )


def test_the_diff_artifact_of_an_unresolved_task_says_which_tests_failed_before() -> None:
    """What the grade says, the artifact says: a task left unresolved lists the tests that failed before (they
    failed after too), not "Failing before: -"; a fix that broke another test says so."""
    from bugsweep.grading import TestRun, grade
    from bugsweep.storage import Link
    from tasks.publish import patch_markdown

    def run(a: str, b: str, code: int) -> TestRun:
        return TestRun(command="pytest", exit_code=code, timed_out=False, log="", duration_s=0.1,
                       tests={"t::a": a, "t::b": b})  # fmt: skip

    unresolved = grade(instance_id="t1", before=run("failed", "passed", 1), after=run("failed", "failed", 1))
    assert (
        not unresolved.resolved
        and unresolved.FAIL_TO_FAIL == ["t::a"]
        and unresolved.PASS_TO_FAIL == ["t::b"]
    )
    text = patch_markdown(unresolved, "diff --git a/x b/x\n", "s3://b/runs/n/t1/m/c/patch.diff")
    assert "Failing before: `t::a`. Still failing after: all of them. Broken by the change: `t::b`." in text
    assert "Failing before: -" not in text and "Stored at `s3://b/runs/n/t1/m/c/patch.diff`." in text
    link = Link("https://s3.example/b/x?X-Amz-Signature=1", datetime(2026, 12, 11, 9, 0, tzinfo=UTC))
    linked = patch_markdown(unresolved, "+x\n", "s3://b/x", link)
    assert (
        "[the whole patch](https://s3.example/b/x?X-Amz-Signature=1) (opens until 2026-12-11 09:00 UTC)"
        in linked
    )


def test_a_grade_on_the_exit_code_alone_is_shown_apart() -> None:
    """Without per-test results (another runner) the exit code decides and no mirror run checks the test process:
    such a resolved run counts, and the comparison, the sweep's summary and the review page say what it rests on."""
    from bugsweep.grading import TestRun, grade, verdict_label
    from bugsweep.review.page import verdict_class
    from tasks.steps import summary_markdown, summary_row

    def run(code: int) -> TestRun:
        return TestRun(command="./run-tests.sh", exit_code=code, timed_out=False, log="", duration_s=0.1)

    bare = grade(instance_id="t1", before=run(1), after=run(0))
    assert bare.resolved and bare.evidence == "exit code"
    assert verdict_label(bare) == "resolved (exit code only)"
    assert verdict_class(verdict_label(bare)) == "resolved-exit-code-only"
    bare.model = "m"
    report = build_report([RunRecord.from_grade(bare, model="m", run=0)])
    assert report.models[0].exit_code_only == 1
    text = render_markdown(report)
    assert "| m | 1/1 (1 exit code only) |" in text and "## Resolved on the exit code alone" in text
    assert "Resolved on the exit code alone" in render_html(report)
    summary = summary_markdown("nightly", [summary_row(bare, uploaded_to="")], "s3://b/nightly")
    assert "| t1 | m | - | - | yes (exit code only) |" in summary
