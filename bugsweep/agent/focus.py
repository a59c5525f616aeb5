"""Pure text helpers of the `small-model` policy for real repositories: a first prompt built from the failing tests,
test output cut down to its failures, what is new in a repeated command's output, and where an edit's `old` matches
once quotes and whitespace are normalised. No sandbox, no model: tested on strings.

Each answers a failure seen when the embedded 1.5B model worked on real bug fixes (bench/README.md, "Real bugs"):
a first prompt of thousands of tokens (the whole file list) before the first reply; test output that is mostly
passing dots; the same test command run again and again with the same result; and `old` texts that differ from the
file only in their quotes or spacing.
"""

from __future__ import annotations

import difflib
import re

from bugsweep.agent.text import loose_matches

#: The first prompt stays under this many characters whatever the repository's size.
FIRST_PROMPT_MAX_CHARS = 2500
#: Test output shown back to the model, at most (the failures first).
FOCUSED_OUTPUT_MAX_CHARS = 3000

_SECTION = re.compile(r"^=+ (FAILURES|ERRORS) =+$", re.MULTILINE)
_SUMMARY = re.compile(r"^=+ short test summary info =+$", re.MULTILINE)
_FAILED_ID = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)
_PROGRESS = re.compile(r"^(\S+\.py )?[.sxXEF]+\s*(\[\s*\d+%\])?$")
_FILE_IN_TRACEBACK = re.compile(r"^([\w./-]+\.py):\d+", re.MULTILINE)


def failing_tests(output: str) -> list[str]:
    """The node ids pytest names in its short summary (FAILED/ERROR lines)."""
    return list(dict.fromkeys(_FAILED_ID.findall(output)))


def focus_test_output(output: str, limit: int = FOCUSED_OUTPUT_MAX_CHARS) -> str | None:
    """pytest output cut down to its failures: the FAILURES/ERRORS sections and the short summary, without the
    progress lines of passing tests. None when the output has no failure section (nothing to focus on)."""
    section = _SECTION.search(output)
    if section is None:
        return None
    body = output[section.start() :]
    summary = _SUMMARY.search(body)
    tail = body[summary.start() :] if summary else ""
    failures = body[: summary.start()] if summary else body
    failures = "\n".join(
        line for line in failures.split("\n") if not _PROGRESS.match(line.strip()) or not line
    )
    room = max(limit - len(tail) - 60, limit // 2)
    if len(failures) > room:
        failures = failures[:room].rstrip() + "\n[... more of the failures left out ...]\n"
    return (failures + ("\n" if not failures.endswith("\n") else "") + tail[: limit // 2]).strip("\n")


_FRAME = re.compile(r'^([\w./-]+\.py):(\d+)|File "([^"\n]+\.py)", line (\d+)', re.MULTILINE)


def traceback_frames(output: str, repo_dir: str) -> list[tuple[str, int]]:
    """(path, line) of every frame of a traceback in `output`, in order: pytest's `path:LINE: Error` lines and
    Python's `File "path", line LINE`. Paths under `repo_dir` are made relative to it; others are kept as written."""
    frames = []
    for m in _FRAME.finditer(output):
        path, line = (m[1], m[2]) if m[1] else (m[3], m[4])
        path = path.removeprefix(repo_dir.rstrip("/") + "/").removeprefix("./")
        frames.append((path, int(line)))
    return frames


def files_in_traceback(output: str, repo_files: set[str]) -> list[str]:
    """Repository files named in a traceback, in order of appearance."""
    found = [f.removeprefix("./") for f in _FILE_IN_TRACEBACK.findall(output)]
    return [f for f in dict.fromkeys(found) if f in repo_files]


def first_prompt(
    task: str,
    test_command: str | None,
    repo_dir: str,
    failing: list[str],
    failure_text: str,
    files: list[str],
    limit: int = FIRST_PROMPT_MAX_CHARS,
) -> str:
    """The task, the test command, the failing tests and their traceback, and a few files: bounded by `limit`."""
    text = f"Task: {task.strip()}"
    if test_command:
        text += f"\n\nThe tests run with this command in {repo_dir}:\n{test_command.strip()}"
    if failing:
        shown = failing[:10]
        more = f"\n({len(failing) - 10} more)" if len(failing) > 10 else ""
        text += "\n\nThese tests fail now and must pass after your fix:\n" + "\n".join(shown) + more
    if files:
        text += "\n\nFiles that matter here:\n" + "\n".join(files[:15])
    room = limit - len(text) - 80
    if failure_text and room > 200:
        body = failure_text if len(failure_text) <= room else "[...]\n" + failure_text[-room:]
        text += f"\n\nHow they fail now:\n{body}"
    return text[:limit]


#: What differs between two runs of the same command without saying anything: durations, addresses.
_VOLATILE = re.compile(r"\b\d+(\.\d+)?s\b|0x[0-9a-fA-F]+")


def same_output(before: str, after: str) -> bool:
    """Whether two outputs of one command say the same (durations and memory addresses aside)."""
    return _VOLATILE.sub("#", before) == _VOLATILE.sub("#", after)


def what_is_new(before: str, after: str, max_lines: int = 15) -> list[str]:
    """Lines of `after` that were not in `before` (a repeated command's output), durations and addresses aside:
    at most max_lines."""
    before, after = _VOLATILE.sub("#", before), _VOLATILE.sub("#", after)
    diff = difflib.ndiff(before.split("\n"), after.split("\n"))
    new = [line[2:] for line in diff if line.startswith("+ ") and line[2:].strip()]
    return new[:max_lines]


def normalised_matches(content: str, old: str) -> list[tuple[int, int]]:
    """Where `old` matches once quotes ('"`) are treated as one character and runs of whitespace may differ.

    Quote characters map to one character of the same length, so the spans found are spans of `content`.
    """
    table = str.maketrans({"'": '"', "`": '"', "\u2018": '"', "\u2019": '"', "\u201c": '"', "\u201d": '"'})
    return loose_matches(content.translate(table), old.translate(table))


#: Lines of the failures digest shown with a request for a whole function.
DIGEST_MAX_LINES = 12


def failure_digest(output: str, max_lines: int = DIGEST_MAX_LINES) -> str | None:
    """What pytest's failures say, in a few lines: each failing statement (`>` lines) and its explanation (`E`
    lines: the values, `where True = is_leap_year(1900)`), each line once, in order. None when the output has no
    failure section.

    Seen on the 1.5B model: asked for a whole function while the failing assertion was many messages back, it
    wrote the function back unchanged; the expectation next to the code is what a fix needs.
    """
    section = _SECTION.search(output)
    if section is None:
        return None
    summary = _SUMMARY.search(output, section.end())
    body = output[section.end() : summary.start() if summary else len(output)]
    lines: list[str] = []
    for line in body.split("\n"):
        if line.startswith(">") or line.startswith("E "):
            text = line[1:].strip()
            if text and text not in lines:
                lines.append(text)
    if not lines:
        return None
    more = len(lines) - max_lines
    return "\n".join(lines[:max_lines]) + (f"\n[... {more} more lines]" if more > 0 else "")
