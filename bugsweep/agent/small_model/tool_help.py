"""Help with the plain tools' answers: what the small-model policy does after a read_file or edit_file call ran.

The plain tools (tools.py) do exactly what they are asked and say precisely why they did not. Each step below takes
their answer and does more, for a model that copies text loosely, reads one line at a time or reads files too long
for its window; each change to a file or to an answer is recorded in the trajectory (an event named after it).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from bugsweep.agent import prompts
from bugsweep.agent.focus import normalised_matches
from bugsweep.agent.model import ToolCall
from bugsweep.agent.rewrite import outline
from bugsweep.agent.small_model.common import Notes, repo_file
from bugsweep.agent.small_model.lookups import code_under_test, files_containing
from bugsweep.agent.text import closest_lines, definitions_named_in, loose_matches
from bugsweep.agent.tools import ToolOutcome, parse_arguments

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentRun

_WORDS = re.compile(r"[A-Za-z_]\w*")
#: At most this many outline entries (those named in the failing tests first).
OUTLINE_MAX_ENTRIES = 60


def _edit_arguments(call: ToolCall) -> tuple[str, str, str] | None:
    args, _ = parse_arguments(call.arguments)
    if args is None or not all(isinstance(args.get(k), str) for k in ("path", "old", "new")):
        return None
    return args["path"], args["old"], args["new"]


def help_with_edit(run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
    """A refused edit_file call: for a test file, name the code under test; for an `old` found nowhere, apply
    the edit where it matches once whitespace (or quotes) are ignored, or say more of where the text is."""
    edit = _edit_arguments(call)
    if outcome.problem != "old_not_found" or edit is None or not edit[1].strip():
        return outcome
    path, old, new = edit
    found = repo_file(run.toolbox, path)
    if found is None:
        return outcome
    real, rel, content = found
    # A 1.5B model wrote old as one line for a two-line function, four times in a row; the only such place is
    # the edit it meant. Only the amount and kind of whitespace may differ (text.loose_matches).
    return _where_old_is(run, outcome, rel, content, old)


def _answer(outcome: ToolOutcome, content: str) -> ToolOutcome:
    return replace(outcome, content=content, problem=None)


def _edit_normalised(
    run: AgentRun, path: str, rel: str, content: str, old: str, new: str
) -> ToolOutcome | None:
    """Apply the edit where `old` matches once quotes and whitespace are normalised (seen on real bugs:
    typographic quotes, spacing around operators), and say so; None when it matches no single place."""
    spans = normalised_matches(content, old)
    if len(spans) != 1:
        return None
    start, end = spans[0]
    applied = run.toolbox.call("edit_file", {"path": path, "old": content[start:end], "new": new})
    if not applied.ok:
        return None
    line = content.count("\n", 0, start) + 1
    run.trajectory.add("edit_normalised", turn=run.turn, path=rel, line=line)
    note = prompts.EDIT_NORMALISED.format(path=rel, line=line)
    return replace(applied, content=note + "\n" + applied.content)


def _where_old_is(run: AgentRun, outcome: ToolOutcome, rel: str, content: str, old: str) -> ToolOutcome:
    """An `old` found nowhere: for a file the model never read, the region of it most like `old`, with more
    context (seen: three "old text not found" in a row on an unread file); else the other files that hold it,
    and for text copied from a test the definitions in this file of what the test calls (a 1.5B model sent the
    failing assertion as `old`, and the lines that merely looked alike sent it to a call site)."""
    toolbox = run.toolbox
    if rel not in toolbox.seen:
        closest = closest_lines(content, old, context=6, max_lines=40)
        if closest:
            toolbox.seen[rel] = _range_of(closest)
            run.trajectory.add("unread_file_region", turn=run.turn, path=rel)
            return _answer(outcome, prompts.UNREAD_FILE.format(path=rel, closest=closest))
    return outcome
    elsewhere = files_containing(toolbox, old, exclude=rel)
    if not elsewhere:
        return outcome
    tests = [f for f in elsewhere if toolbox.is_protected(f)]
    others = [f for f in elsewhere if f not in tests]
    run.trajectory.add("old_found_elsewhere", turn=run.turn, path=rel, files=elsewhere)
    definitions = definitions_named_in(content, old) if tests else []
    if definitions:
        return _answer(outcome, prompts.old_from_test(rel, tests, definitions))
    return _answer(outcome, prompts.old_not_found(rel, closest_lines(content, old), others, tests))


def _range_of(closest: str) -> tuple[int, int]:
    """The line range in a closest_lines header ("lines 12-20:" or "line 7:")."""
    numbers = closest.split(":", 1)[0].split()[-1].split("-")
    return int(numbers[0]), int(numbers[-1])


def _name_code_under_test(run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
    """The refusal of an edit to a test file names what the test imports and the files that define it (found
    with grep): seen on the 1.5B model, it edited the package's re-exporting __init__ instead."""
    edit = _edit_arguments(call)
    resolved = run.toolbox.resolve(edit[0]) if edit is not None else None
    if resolved is None or isinstance(resolved, ToolOutcome) or resolved[2] != "file":
        return outcome
    real, rel, _, _ = resolved
    names, code = code_under_test(run.toolbox, real, rel)
    if not code:
        return outcome
    return _answer(outcome, prompts.protected_file(rel, names, code))


def read_help(run: AgentRun, notes: Notes, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
    """A read_file call with a range of a file that fits comes back whole; one without a range of a long Python
    file comes back as its outline."""
    args, _ = parse_arguments(call.arguments)
    if not args or outcome.format_error:
        return outcome
    found = repo_file(run.toolbox, str(args.get("path", "")))
    if found is None:
        return outcome
    ranged = any(args.get(k) not in (None, "") for k in ("start_line", "end_line"))
    if ranged:
        return _read_whole(run, args, outcome, found[1], found[2])
    return outcome


def _read_whole(
    run: AgentRun, args: dict[str, Any], outcome: ToolOutcome, rel: str, text: str
) -> ToolOutcome:
    """A file that fits is shown whole whatever the range: small models ask for one line and then lack the lines
    around it (seen on the 1.5B model: start_line=end_line=1, then an edit made blind)."""
    if (
        not (outcome.ok or outcome.problem == "bad_line_range")
        or len(text) > run.toolbox.settings.read_file_max_chars
    ):
        return outcome
    whole = run.toolbox.read_file(str(args["path"]))
    if whole.content == outcome.content:
        return outcome
    run.trajectory.add("read_whole", turn=run.turn, path=rel)
    whole.arguments = outcome.arguments
    return whole


def _outline_long_read(run: AgentRun, notes: Notes, outcome: ToolOutcome, rel: str, text: str) -> ToolOutcome:
    """A read without a range of a Python file longer than read_file shows at once (read_file_max_chars)
    comes back as its outline: classes and functions with their lines (those the failing tests name first),
    and how to read a part.

    Seen on real bugs (prettytable, bench/README.md): read_file of a 2,602-line file without a range, four
    times in 12 turns; each answer (20,000 characters, ~6k tokens) overflowed the 8k window, so the loop
    elided the older messages, the model lost what it had read, and read the whole file again.
    """
    if not rel.endswith(".py") or len(text) <= run.toolbox.settings.read_file_max_chars:
        return outcome
    entries = outline(text)
    if not entries:
        return outcome
    named = set(_WORDS.findall(notes.failures or ""))
    first = [e for e in entries if e[2].rsplit(" ", 1)[-1].rsplit(".", 1)[-1] in named]
    rest = [e for e in entries if e not in first][: max(OUTLINE_MAX_ENTRIES - len(first), 0)]
    shown = sorted(first + rest)
    lines = [f"lines {a}-{b}: {what}" for a, b, what in shown]
    run.toolbox.seen.pop(rel, None)  # none of its code was shown
    run.trajectory.add("read_outlined", turn=run.turn, path=rel, chars=len(text), entries=len(shown))
    total = text.count("\n") + (0 if text.endswith("\n") else 1)
    return replace(
        outcome,
        content=prompts.read_outline(rel, total, len(text), lines, len(entries) - len(shown)),
    )
