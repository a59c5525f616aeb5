"""Benchmark: what the model can fix when it is shown exactly where the fix goes (the real-bug tasks' ceiling).

    python bench/model_ceiling.py                      # every task of bench/real_bugs.jsonl, the embedded model
    python bench/model_ceiling.py --only marshmallow-8f493e66b3 --samples 5

No agent here and no harness decisions: for each task of bench/real_bugs.jsonl, the sandbox is prepared as for the
agents (test patch applied, setup run, tests failing), and the model is asked, in one message per place, for the
code that the project's real fix changed. The places come from the fix commit itself (an oracle no agent has): each
hunk of the fix's source diff, widened to its whole function when that function is at most `--max-function-lines`
(100), else to the hunk's lines with `--context` lines on each side (module level too). The message holds the task's
subject, the failing tests, what they say (the harness's own failure digest, focus.failure_digest), and that code;
the model replies with it corrected in a ```python block, which replaces it. Then the task's test command runs; when
it passes, the change is graded by `pipeline.regrade` (the clean room, as for the agents), and that verdict counts.

Attempt 0 is at temperature 0; attempts 1..`--samples` at `--temperature` (seeds 1, 2, ...), each from the original
files. A task counts as fixed at the first attempt the grader resolves.

What it measures: an upper bound on what any harness can get from this model on these tasks by localisation and
prompting alone. A harness does not know the fix's place; if the model cannot write the fix when shown the place,
the failing assertion and the task, no steering of an agent around it will. Results: bench/results/
model_ceiling-<time>.json and a table on stdout. One task at a time; stop with Ctrl-C or SIGTERM (what was measured
is kept).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_bugs import DEFAULT_TASKS, ROOT, load, local_repo, with_test_patch

SYSTEM = "You are a careful software engineer fixing a bug in a Python project."
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", re.MULTILINE)


@dataclass
class Place:
    """Lines first..last (1-based, inclusive) of `path` that the fix changed, widened as described above."""

    path: str
    first: int
    last: int
    function: str | None  # the function's name when the place is a whole function


def fix_places(spec: Any, max_function_lines: int, context: int, read: Any) -> list[Place]:
    """The places the real fix changed in code files (not its test files), read from the clone's diff."""
    from bugsweep.agent.rewrite import enclosing_function

    diff = subprocess.run(
        ["git", "-C", spec.repo, "diff", "-U0", "--no-renames", spec.base_commit, spec.fix_commit, "--", "*.py",
         *(f":!{t}" for t in spec.test_files)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    places: list[Place] = []
    for section in re.split(r"^diff --git ", diff, flags=re.MULTILINE)[1:]:
        m = re.search(r"^--- a/(.+)$", section, re.MULTILINE)
        if not m or "/tests/" in f"/{m[1]}" or Path(m[1]).name.startswith("test_"):
            continue
        path = m[1]
        text = read(path)
        lines = text.split("\n")
        offsets = [0]
        for line in lines:
            offsets.append(offsets[-1] + len(line) + 1)
        for hunk in _HUNK.finditer(section):
            start, count = int(hunk[1]), int(hunk[2]) if hunk[2] is not None else 1
            first, last = (start, start) if count == 0 else (start, start + count - 1)
            first, last = max(first, 1), min(last, len(lines))
            span = enclosing_function(text, path, offsets[first - 1], offsets[last] - 1, max_function_lines)
            place = (
                Place(path, span.first, span.last, span.name)
                if span is not None
                else Place(path, max(1, first - context), min(len(lines), last + context), None)
            )
            if (
                places and places[-1].path == path and place.first <= places[-1].last
            ):  # overlapping: one place
                prev = places[-1]
                same = prev.function if prev.function == place.function else None  # else: plain lines
                places[-1] = Place(path, prev.first, max(prev.last, place.last), same)
            else:
                places.append(place)
    return places


def ask(client: Any, model: str, spec: Any, failing: list[str], says: str, place: Place, code: str,
        temperature: float, seed: int) -> tuple[str, int, int]:  # fmt: skip
    what = f"the whole {place.function} function" if place.function else "all of these lines"
    user = (
        f"Task: {spec.problem_statement}\n\nThese tests fail and must pass after the fix:\n"
        + "\n".join(failing)
        + f"\n\nThey say:\n```\n{says}\n```\n\nThe bug is in {place.path}, lines {place.first}-{place.last}:\n"
        f"```python\n{code}\n```\nReply with {what} corrected, in one ```python block, with the same indentation."
    )
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        temperature=temperature,
        seed=seed,
        max_tokens=2048,
    )
    usage = reply.usage
    return reply.choices[0].message.content or "", usage.prompt_tokens, usage.completion_tokens


def replacement(reply: str, place: Place, code: str) -> str | None:
    """The code that replaces the place, from the reply's code block; None when there is no usable one."""
    from bugsweep.agent.rewrite import (
        FunctionSpan,
        RewriteError,
        code_blocks,
        function_from_reply,
        keep_docstring,
        splice,
    )

    if place.function:
        try:
            function = function_from_reply(reply, place.function)
        except RewriteError:
            return None
        def_line = next((x for x in code.split("\n") if x.lstrip().startswith(("def ", "async def "))), "")
        indent = def_line[: len(def_line) - len(def_line.lstrip())]
        span = FunctionSpan(place.path, place.function, 1, code.count("\n") + 1, indent, code)
        return splice(code, span, keep_docstring(code, function)).rstrip("\n")
    blocks = code_blocks(reply)
    if not blocks:
        return None
    block = blocks[0].rstrip("\n")

    def indent(text: str) -> int:
        widths = [len(x) - len(x.lstrip()) for x in text.split("\n") if x.strip()]
        return min(widths) if widths else 0

    shift = indent(code) - indent(block)
    if shift > 0:
        block = "\n".join((" " * shift + x) if x.strip() else x for x in block.split("\n"))
    return block


def attempt(prepared: Any, spec: Any, places: list[Place], originals: dict[str, str], client: Any, model: str,
            failing: list[str], says: str, temperature: float, seed: int) -> dict[str, Any]:  # fmt: skip
    """Ask for every place, write the answers, run the tests. Returns what happened (files left as written)."""
    from bugsweep.grading import run_tests

    sandbox = prepared.sandbox
    texts = dict(originals)
    row: dict[str, Any] = {
        "temperature": temperature,
        "seed": seed,
        "prompt_tokens": 0,
        "completion_tokens": 0,
    }
    unusable = 0
    # Bottom-up within a file, so that earlier places keep their line numbers.
    for place in sorted(places, key=lambda p: (p.path, -p.first)):
        lines = texts[place.path].split("\n")
        code = "\n".join(lines[place.first - 1 : place.last])
        reply, prompt_tokens, completion_tokens = ask(
            client, model, spec, failing, says, place, code, temperature, seed
        )
        row["prompt_tokens"] += prompt_tokens
        row["completion_tokens"] += completion_tokens
        new = replacement(reply, place, code)
        if new is None:
            unusable += 1
            continue
        texts[place.path] = "\n".join([*lines[: place.first - 1], *new.split("\n"), *lines[place.last :]])
    changed = [p for p in texts if texts[p] != originals[p]]
    for path in changed:
        sandbox.files.write(f"{sandbox.workdir}/{path}", texts[path])
    sandbox.exec("find . -name '*.pyc' -delete", timeout=60)
    row |= {"unusable_replies": unusable, "files_changed": len(changed)}
    if not changed:
        row["tests_exit_code"] = None
        return row
    after = run_tests(sandbox, spec.test_command, timeout=600)
    row["tests_exit_code"] = after.exit_code
    row["diff"] = sandbox.exec("git diff", timeout=60).output[-3000:]
    return row


def run_task(spec: Any, client: Any, model: str, samples: int, temperature: float, max_function_lines: int,
             context: int) -> dict[str, Any]:  # fmt: skip
    from bugsweep.agent.focus import failing_tests, failure_digest, focus_test_output
    from bugsweep.pipeline import baseline, prepare, regrade, setup
    from bugsweep.sandbox import get_provider

    started = time.monotonic()
    row: dict[str, Any] = {"task": spec.instance_id, "resolved_at": None, "attempts": []}
    prepared = prepare(spec, get_provider("local"), labels={"purpose": "bench", "task": spec.instance_id})
    try:
        setup(prepared)
        before = baseline(prepared)
        sandbox = prepared.sandbox

        def read(path: str) -> str:
            return sandbox.files.read_text(f"{sandbox.workdir}/{path}")

        places = fix_places(spec, max_function_lines, context, read)
        row["places"] = [asdict(p) for p in places]
        originals = {p.path: read(p.path) for p in places}
        failing = failing_tests(before.log) or list(spec.FAIL_TO_PASS)
        says = failure_digest(before.log) or focus_test_output(before.log) or before.log[-1500:]
        for n in range(samples + 1):
            temp, seed = (0.0, 0) if n == 0 else (temperature, n)
            tried = attempt(prepared, spec, places, originals, client, model, failing, says, temp, seed)
            if tried["tests_exit_code"] == 0:
                verdict, _, _ = regrade(prepared, before, None, model_name=model)
                tried["resolved"] = verdict.resolved
            else:
                tried["resolved"] = False
            row["attempts"].append(tried)
            print(
                f"  attempt {n} (temperature {temp}): tests exit {tried['tests_exit_code']}, "
                f"resolved={tried['resolved']}, tokens {tried['prompt_tokens']}+{tried['completion_tokens']}",
                flush=True,
            )
            if tried["resolved"]:
                row["resolved_at"] = n
                break
            for path, text in originals.items():  # the next attempt starts from the original files
                sandbox.files.write(f"{sandbox.workdir}/{path}", text)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
    finally:
        prepared.sandbox.release()
    row["wall_s"] = round(time.monotonic() - started, 1)
    return row


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=Path, default=DEFAULT_TASKS)
    parser.add_argument("--only", default=None, help="comma-separated instance ids")
    parser.add_argument("--samples", type=int, default=3, help="attempts after the first, at --temperature")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max-function-lines", type=int, default=100)
    parser.add_argument("--context", type=int, default=6, help="lines around a hunk not shown as a function")
    parser.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)

    import openai

    from bugsweep.embedded.server import ensure_embedded_model
    from bugsweep.spec import load_tasks

    tasks = load_tasks(args.tasks)
    if args.only:
        wanted = set(args.only.split(","))
        tasks = [t for t in tasks if t.instance_id in wanted]
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"model_ceiling-{stamp}.json"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    report: dict[str, Any] = {
        "started": stamp, "commit": commit.stdout.strip(), "samples": args.samples,
        "temperature": args.temperature, "max_function_lines": args.max_function_lines, "context": args.context,
        "load_before": load(), "tasks": [],
    }  # fmt: skip
    print(f"{len(tasks)} task(s), 1 + {args.samples} attempts each; load: {load()}", flush=True)
    with ensure_embedded_model(progress=lambda m: print(m, flush=True)) as endpoint:
        client = openai.OpenAI(base_url=endpoint.base_url, api_key="none", timeout=900)
        report["model"] = endpoint.model
        for spec in tasks:
            spec = with_test_patch(spec.model_copy(update={"repo": local_repo(spec.repo, args.mirrors)}))
            print(f"{spec.instance_id}", flush=True)
            row = run_task(
                spec, client, endpoint.model, args.samples, args.temperature, args.max_function_lines,
                args.context,
            )  # fmt: skip
            row["load"] = load()
            report["tasks"].append(row)
            path.write_text(json.dumps(report, indent=2))
            places = ", ".join(f"{p['path']}:{p['first']}-{p['last']}" for p in row.get("places", []))
            print(
                f"{spec.instance_id:<28} {'FIXED at attempt ' + str(row['resolved_at']) if row['resolved_at'] is not None else 'not fixed':<20} "
                f"places: {places} wall={row['wall_s']:.0f}s {row.get('error', '')}",
                flush=True,
            )
    report["load_after"] = load()
    fixed = [r for r in report["tasks"] if r["resolved_at"] is not None]
    report["summary"] = {
        "tasks": len(report["tasks"]),
        "fixed_at_temperature_0": sum(1 for r in fixed if r["resolved_at"] == 0),
        "fixed_within_all_attempts": len(fixed),
        "errors": sum(1 for r in report["tasks"] if r.get("error")),
    }
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["summary"]))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
