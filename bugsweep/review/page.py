"""The review page: one self-contained HTML file (no server, nothing from the internet) for a run, a sweep or a
comparison.

The index lists every run with its verdict (bugsweep.grading.verdict_label) and filters by it; each run opens to
its evidence, its diff (highlighted by Pygments, its CSS embedded), its timeline and its configuration. The
template (templates/page.html.j2, with page.css and page.js beside it) ships in the wheel as package data.

Model output is untrusted: Jinja2 escapes every value it puts into the HTML, Pygments escapes the diff, the
trajectories go in as JSON made safe for a <script> element (`tojson`: <, >, & and ' escaped) and the page's script
puts them into the DOM as text only. The page's Content-Security-Policy allows no request at all and runs only its
own script (by its hash), so even markup that slipped through could neither load nor run anything.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from datetime import UTC, datetime
from importlib.resources import files
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import DiffLexer

from bugsweep.attempts import planned, resolved_at
from bugsweep.grading import Grade, verdict_label
from bugsweep.review.runs import Reviewed, RunFiles
from bugsweep.review.timeline import build_timeline

#: Verdicts in the order the filter offers them (bugsweep.grading.verdict_label's words: a grade that rests on the
#: exit code alone, without per-test evidence or the mirror's check, is shown apart).
VERDICTS = ("resolved", "resolved (exit code only)", "held for review", "not resolved", "could not run")
_PYGMENTS_CLASS = "highlight"


def verdict_class(word: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", word).strip("-")


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("bugsweep.review", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # `tojson` keeps its escaping of <, >, & and ', but not Jinja's sorting: a tool call's arguments stay in the
    # order the model wrote them (path, old, new).
    env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    return env


def _asset(name: str) -> str:
    return (files("bugsweep.review") / "templates" / name).read_text(encoding="utf-8")


def highlight_diff(patch: str) -> str:
    """The diff as HTML (Pygments' DiffLexer; every character of the patch escaped)."""
    return highlight(patch, DiffLexer(), HtmlFormatter(cssclass=_PYGMENTS_CLASS))


def _title(reviewed: Reviewed) -> str:
    location = reviewed.location.rstrip("/")
    name = location.rsplit("/", 1)[-1] or location
    if reviewed.report is not None:
        return f"Comparison {name}"
    if len(reviewed.runs) == 1 and not reviewed.runs[0].key:
        return f"Run {reviewed.runs[0].grade.instance_id}"
    return f"Sweep {name}"


def _run_view(index: int, run: RunFiles) -> dict[str, Any]:
    grade = run.grade
    word = verdict_label(grade)
    timeline = build_timeline(run.trajectory) if run.trajectory is not None else None
    task = run.task or {}
    return {
        "id": f"run-{index}",
        "key": run.key,
        "run": run.run,
        "grade": grade,
        "verdict": word,
        "verdict_class": verdict_class(word),
        "why": grade.error or grade.reason or "",
        "tokens": grade.prompt_tokens + grade.completion_tokens,
        "patch_html": highlight_diff(run.patch) if run.patch else "",
        "patch_cut": run.patch_cut,
        "has_patch": run.patch is not None,
        "logs": run.logs,
        "problem": str(task.get("problem_statement") or ""),
        "test_command": str(task.get("test_command") or ""),
        "repo": str(task.get("repo") or ""),
        "timeline": timeline,
        "turn_count": len(timeline["turns"]) if timeline else 0,
        "config_key": _config_summary(grade),
        "attempt_line": resolved_at(grade),
        "attempts": grade.attempts if planned(grade.config) > 1 else [],
    }


def _config_summary(grade: Grade) -> str:
    """The few settings a reader looks for first: model, policy, turn budget, sandbox."""
    config: dict[str, Any] = grade.config or {}

    def part(name: str) -> dict[str, Any]:
        value = config.get(name)
        return value if isinstance(value, dict) else {}

    model, agent, sandbox = part("model"), part("agent"), part("sandbox")
    parts = [
        f"model {model.get('model', grade.model or '-')}" if model or grade.model else "",
        f"temperature {model['temperature']}" if "temperature" in model else "",
        f"policy {config.get('policy') or grade.policy or '-'}",
        f"max turns {agent['max_turns']}" if "max_turns" in agent else "",
        f"{agent['attempts']} attempts" if (agent.get("attempts") or 1) > 1 else "",
        *(
            f"then {later.get('model')}"
            for later in config.get("escalate_to") or []
            if isinstance(later, dict)
        ),
        f"sandbox {sandbox['backend']}" if "backend" in sandbox else "",
        f"bugsweep {config['bugsweep_version']}" if "bugsweep_version" in config else "",
    ]
    return ", ".join(p for p in parts if p)


def _configurations(runs: list[RunFiles]) -> list[dict[str, str]]:
    seen: dict[str, dict[str, str]] = {}
    for run in runs:
        digest = run.grade.config_digest or ""
        if run.grade.config is None or digest in seen:
            continue
        seen[digest] = {
            "digest": digest or "-",
            "anchor": f"config-{digest or 'none'}",
            "summary": _config_summary(run.grade),
            "json": json.dumps(run.grade.config, indent=2, ensure_ascii=False, sort_keys=True),
        }
    return list(seen.values())


def _comparison(report: dict[str, Any] | None) -> dict[str, Any] | None:
    if report is None:
        return None
    from bugsweep.report import ComparisonReport, summary_rows

    try:
        header, rows = summary_rows(ComparisonReport.model_validate(report))
    except ValueError:
        return None
    return {"header": header, "rows": rows}


def render_page(reviewed: Reviewed) -> str:
    """The whole page as one HTML string."""
    runs = [_run_view(i, run) for i, run in enumerate(reviewed.runs, 1)]
    counts = {word: sum(1 for r in runs if r["verdict"] == word) for word in VERDICTS}
    script = _asset("page.js")
    script_hash = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    style = _asset("page.css") + "\n" + HtmlFormatter().get_style_defs(f".{_PYGMENTS_CLASS}")
    template = _environment().get_template("page.html.j2")
    return template.render(
        title=_title(reviewed),
        location=reviewed.location,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        runs=runs,
        counts=counts,
        verdicts=[(word, verdict_class(word)) for word in VERDICTS],
        configurations=_configurations(reviewed.runs),
        comparison=_comparison(reviewed.report),
        has_run_numbers=any(r["run"] is not None for r in runs),
        style=style,
        script=script,
        script_hash=script_hash,
    )
