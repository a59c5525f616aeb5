"""The comparison report as one self-contained HTML page (bugsweep.report builds the report and its tables)."""

from __future__ import annotations

import html

from bugsweep.report import (
    ATTEMPTS_NOTE,
    EXIT_CODE_NOTE,
    RESOURCE_NOTE,
    RUN_COLUMNS,
    ComparisonReport,
    attempts_of,
    pair_rows,
    percent,
    policy_note,
    resource_rows,
    summary_rows,
    task_rows,
    verdict_cell,
)

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:70rem;color:#1b1f24;padding:0 1rem}
table{border-collapse:collapse;margin:1rem 0;font-size:.9rem}
th,td{border:1px solid #d0d7de;padding:.3rem .6rem;text-align:right}
th:first-child,td:first-child{text-align:left}
th{background:#f6f8fa}
td.ok{background:#dafbe1}td.part{background:#fff8c5}td.no{background:#ffebe9}
.note{color:#57606a;font-size:.85rem}
"""


def _html_table(header: list[str], rows: list[list[str]], classes: list[list[str]] | None = None) -> str:
    out = ["<table><thead><tr>", *(f"<th>{html.escape(h)}</th>" for h in header), "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        out.append("<tr>")
        for j, cell in enumerate(row):
            cls = classes[i][j] if classes else ""
            out.append(
                f'<td class="{cls}">{html.escape(cell)}</td>' if cls else f"<td>{html.escape(cell)}</td>"
            )
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def render_chart_svg(report: ComparisonReport) -> str:
    """Horizontal bars: each model's resolve rate with its 95% interval as a whisker. Inline SVG, no scripts."""
    bar_h, gap, label_w, plot_w = 26, 14, 200, 520
    height = 40 + len(report.models) * (bar_h + gap) + 30
    width = label_w + plot_w + 190  # room for "100% (72%-100%)" right of the bars
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="Resolve rate per model with 95% confidence interval" font-family="sans-serif" font-size="13">'
    ]
    x0 = label_w
    top = 30
    for pct in (0, 25, 50, 75, 100):
        x = x0 + plot_w * pct / 100
        parts.append(f'<line x1="{x:.1f}" y1="{top - 8}" x2="{x:.1f}" y2="{height - 30}" stroke="#d0d7de"/>')
        parts.append(f'<text x="{x:.1f}" y="{height - 12}" text-anchor="middle" fill="#57606a">{pct}%</text>')
    for i, s in enumerate(report.models):
        y = top + i * (bar_h + gap)
        parts.append(
            f'<text x="{x0 - 10}" y="{y + bar_h * 0.68:.1f}" text-anchor="end">{html.escape(s.model[:28])}</text>'
        )
        parts.append(
            f'<rect x="{x0}" y="{y}" width="{plot_w * s.rate:.1f}" height="{bar_h}" fill="#54aeff">'
            f"<title>{html.escape(s.model)}: {s.resolved}/{s.graded} resolved</title></rect>"
        )
        lo, hi = x0 + plot_w * s.ci_low, x0 + plot_w * s.ci_high
        mid = y + bar_h / 2
        parts.append(
            f'<line x1="{lo:.1f}" y1="{mid}" x2="{hi:.1f}" y2="{mid}" stroke="#1b1f24" stroke-width="2"/>'
        )
        for x in (lo, hi):
            parts.append(
                f'<line x1="{x:.1f}" y1="{y + 5}" x2="{x:.1f}" y2="{y + bar_h - 5}" stroke="#1b1f24" stroke-width="2"/>'
            )
        parts.append(
            f'<text x="{x0 + plot_w + 8}" y="{y + bar_h * 0.68:.1f}">{percent(s.rate)} ({percent(s.ci_low)}-{percent(s.ci_high)})</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _rate_class(resolved: int, graded: int) -> str:
    if graded == 0:
        return ""
    return "ok" if resolved == graded else "no" if resolved == 0 else "part"


def render_page(report: ComparisonReport) -> str:
    """One self-contained page: inline CSS and an inline SVG chart; nothing is loaded from anywhere."""
    th, tr = task_rows(report)
    models = [s.model for s in report.models]
    classes = [
        ["", *(_rate_class(row.cells[m].resolved, row.cells[m].graded) for m in models)]
        for row in report.tasks
    ]
    body = [
        "<h1>Model comparison</h1>",
        f'<p class="note">{len(report.tasks)} tasks, {report.runs_per_task} run(s) per task and model, '
        f"generated {html.escape(report.generated_at)}."
        + (
            f" Wall time {report.wall_s:.1f} s for runs that add up to {report.sum_run_wall_s:.1f} s."
            if report.wall_s is not None
            else ""
        )
        + "</p>",
        f"<p><strong>{html.escape(policy_note(report))}</strong></p>",
        "<h2>Resolve rate</h2>",
        render_chart_svg(report),
        _html_table(*summary_rows(report)),
        '<p class="note">Rate: resolved over graded runs (runs that could not be run left out); 95% Wilson interval.</p>',
    ]
    if attempts_of(report) > 1:
        body.append(f'<p class="note">{html.escape(ATTEMPTS_NOTE.format(n=attempts_of(report)))}</p>')
    if report.pairs:
        body += [
            "<h2>Paired differences (per task)</h2>",
            _html_table(*pair_rows(report)),
            '<p class="note">Per task, the difference of the two resolve rates; mean over tasks, percentile '
            "bootstrap CI over tasks, exact two-sided sign test over the tasks where the models differ.</p>",
        ]
    body += ["<h2>Per task (resolved/graded runs)</h2>", _html_table(th, tr, classes)]
    if report.resources:
        body += [
            "<h2>Resource use per task</h2>",
            _html_table(*resource_rows(report)),
            f'<p class="note">{html.escape(RESOURCE_NOTE)}</p>',
        ]
    bare = [[r.model, r.instance_id, str(r.run)] for r in report.records if r.exit_code_only]
    if bare:
        body += ["<h2>Resolved on the exit code alone</h2>", f'<p class="note">{EXIT_CODE_NOTE}</p>']
        body.append(_html_table(RUN_COLUMNS, bare))
    flagged = [r for r in report.records if r.suspicious]
    if flagged:
        rows = [[r.model, r.instance_id, str(r.run), verdict_cell(r), r.suspicious[0]] for r in flagged]
        body += [
            "<h2>Held for review and other suspicious runs</h2>",
            _html_table(["model", "task", "run", "verdict", "first signal"], rows),
        ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>bugsweep model comparison</title>'
        f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )
