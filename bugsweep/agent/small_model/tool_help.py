"""Help with the plain tools' answers: what the small-model policy does after a read_file or edit_file call ran.

The plain tools (tools.py) do exactly what they are asked and say precisely why they did not. The two steps below
take their answer and do more, for a model that edits files it never read or reads one line at a time; each is
recorded in the trajectory (unread_file_region, read_whole). The other help this module gave (loose and
normalised matches applied, `old` found in other files, the refusal of a test file naming the code under test,
outlines of long reads) was removed after the side-by-side run on real tasks (bench/README.md, "plain vs
small-model"): none of it changed an outcome there.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from bugsweep.agent import prompts
from bugsweep.agent.model import ToolCall
from bugsweep.agent.small_model.common import repo_file
from bugsweep.agent.text import closest_lines
from bugsweep.agent.tools import ToolOutcome, parse_arguments

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentRun


def _edit_arguments(call: ToolCall) -> tuple[str, str, str] | None:
    args, _ = parse_arguments(call.arguments)
    if args is None or not all(isinstance(args.get(k), str) for k in ("path", "old", "new")):
        return None
    return args["path"], args["old"], args["new"]


def help_with_edit(run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
    """An edit_file call whose `old` is found nowhere in a file the model never read: the region of the file
    most like `old`, with more context than the plain answer (seen: three "old text not found" in a row on an
    unread file; on cachetools-57d2e4813d it led to the function that was then fixed)."""
    edit = _edit_arguments(call)
    if outcome.problem != "old_not_found" or edit is None or not edit[1].strip():
        return outcome
    toolbox = run.toolbox
    found = repo_file(toolbox, edit[0])
    if found is None or found[1] in toolbox.seen:
        return outcome
    _, rel, content = found
    closest = closest_lines(content, edit[1], context=6, max_lines=40)
    if not closest:
        return outcome
    toolbox.seen[rel] = _range_of(closest)
    run.trajectory.add("unread_file_region", turn=run.turn, path=rel)
    return replace(outcome, content=prompts.UNREAD_FILE.format(path=rel, closest=closest), problem=None)


def _range_of(closest: str) -> tuple[int, int]:
    """The line range in a closest_lines header ("lines 12-20:" or "line 7:")."""
    numbers = closest.split(":", 1)[0].split()[-1].split("-")
    return int(numbers[0]), int(numbers[-1])


def read_help(run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
    """A read_file call with a range of a file that fits comes back whole."""
    args, _ = parse_arguments(call.arguments)
    if not args or outcome.format_error:
        return outcome
    if not any(args.get(k) not in (None, "") for k in ("start_line", "end_line")):
        return outcome  # a read without a range is already whole (or cut at the cap), as asked
    found = repo_file(run.toolbox, str(args.get("path", "")))
    if found is None:
        return outcome
    return _read_whole(run, args, outcome, found[1], found[2])


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
