"""Pure text helpers of the file tools: lines as editors count them, where an edit's `old` text matches, the lines
most like a wrong `old`, and whether an edit breaks Python syntax. No sandbox, no model: tested on strings.
"""

from __future__ import annotations

import difflib
import re


def split_lines(text: str) -> list[str]:
    """Lines split on "\n" only, ends kept: str.splitlines also splits on form feeds and other separators, which
    would make our line numbers disagree with editors, grep -n and tracebacks."""
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def loose_matches(content: str, old: str) -> list[tuple[int, int]]:
    """Where `old` matches when runs of whitespace may differ (spaces for a line break and indentation, say).

    Small models often join or re-indent the lines they copy; a single such match is still the edit they meant.
    Only the amount and kind of whitespace may differ, never whether there is any.
    """
    words = old.split()
    if not words:
        return []
    pattern = re.compile(r"\s+".join(re.escape(w) for w in words))
    return [m.span() for m in pattern.finditer(content)]


def new_syntax_error(before: str, after: str, filename: str) -> tuple[int, str] | None:
    """(line, message) when `after` is not valid Python but `before` was; None otherwise.

    Checked with the host's own compiler: a file that uses syntax newer than the host's Python already fails
    `before`, and then no edit is blocked.
    """
    try:
        compile(before, filename, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    try:
        compile(after, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return exc.lineno or 1, f"{type(exc).__name__}: {exc.msg}"
    except ValueError as exc:
        return 1, str(exc)
    return None


def numbered(text: str, first: int, last: int) -> str:
    lines = [line.rstrip("\n") for line in split_lines(text)]
    first, last = max(first, 1), min(last, len(lines))
    width = len(str(last))
    return "\n".join(f"{n:>{width}}|{lines[n - 1]}" for n in range(first, last + 1))


def occurrences(text: str, part: str) -> list[int]:
    found, start = [], text.find(part)
    while start != -1:
        found.append(start)
        start = text.find(part, start + 1)
    return found


def snippet(text: str, first: int, last: int, context: int = 2, max_lines: int = 30) -> str:
    """The edited lines with a little context, without line numbers (small models copy line numbers into `old`)."""
    lines = [line.rstrip("\n") for line in split_lines(text)]
    lo, hi = max(first - 1 - context, 0), min(last + context, len(lines))
    chosen = lines[lo:hi]
    if len(chosen) > max_lines:
        chosen = [*chosen[:max_lines], "..."]
    return "\n".join(chosen)


def closest_lines(content: str, old: str, context: int = 1, max_lines: int = 20) -> str:
    """The lines of `content` most like `old`, as "lines 12-14:" then the lines as they are; empty when nothing is
    close.

    Slides a window the height of `old` over the file and scores each with difflib; quick_ratio picks the
    candidates first so that a long file stays cheap.
    """
    file_lines = [line.rstrip("\n") for line in split_lines(content)]
    wanted = old.strip("\n").split("\n")
    if not file_lines or not wanted:
        return ""
    height = min(len(wanted), len(file_lines))
    target = "\n".join(line.strip() for line in wanted)
    scored: list[tuple[float, int, difflib.SequenceMatcher[str]]] = []
    for i in range(len(file_lines) - height + 1):
        window = "\n".join(line.strip() for line in file_lines[i : i + height])
        matcher = difflib.SequenceMatcher(None, window, target, autojunk=False)
        scored.append((matcher.quick_ratio(), i, matcher))
    scored.sort(key=lambda item: -item[0])
    best_ratio, best_index = 0.0, 0
    for _, i, matcher in scored[:25]:
        ratio = matcher.ratio()
        if ratio > best_ratio:
            best_ratio, best_index = ratio, i
    if best_ratio < 0.3:
        return ""
    lo = max(best_index - context, 0)
    hi = min(best_index + height + context, len(file_lines), lo + max_lines)
    # Plain lines under a header, not "12|text": a small model copied the number prefixes into old.
    header = f"line {lo + 1}" if hi == lo + 1 else f"lines {lo + 1}-{hi}"
    return header + ":\n" + "\n".join(file_lines[n - 1] for n in range(lo + 1, hi + 1))


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
