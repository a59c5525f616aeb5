"""A finish call while the repository is as the task began: refused once, with what the failing tests say.

Seen on the embedded 1.5B model: the fix written in the reply's text and finish called in the same reply, no file
changed. Such a finish cannot resolve anything (the task's tests failed at its start, and nothing has changed
since), so the refusal can only cost a turn. Only the first such call is refused: a second one ends the work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bugsweep.agent import prompts

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentRun
    from bugsweep.agent.tools import Toolbox, ToolOutcome

#: What git reports of the work tree: tracked changes against HEAD, and every path git status lists (untracked
#: files included). Caches a test run leaves (bytecode, pytest's cache) are not changes.
_STATUS = (
    "git -c safe.directory='*' -c core.quotepath=off status --porcelain -uall"
    " | grep -v -e '__pycache__/' -e '\\.pyc$' -e '\\.pytest_cache/'"
    "; git -c safe.directory='*' diff HEAD --binary"
)
_FINGERPRINT = (
    f"git -c safe.directory='*' rev-parse --verify -q HEAD >/dev/null && {{ {_STATUS}; }} | sha256sum"
)


def fingerprint(toolbox: Toolbox) -> str | None:
    """A digest of the repository's changes against its commit; None when git cannot say (no repository, no git):
    then no finish is refused for this reason."""
    check = toolbox.sandbox.exec(_FINGERPRINT, timeout=60, stdin="")
    digest = check.stdout.split()[0] if check.ok and check.stdout.strip() else None
    return digest if digest and len(digest) == 64 else None


def refuse_unchanged_finish(
    run: AgentRun, outcome: ToolOutcome, at_start: str | None, failures: str | None
) -> bool:
    """Turn `outcome` (a finish call) into the refusal when the repository is unchanged since `at_start`; True when
    it did."""
    if at_start is None or fingerprint(run.toolbox) != at_start:
        return False
    run.trajectory.add("finish_refused", turn=run.turn, reason="nothing changed")
    outcome.finished, outcome.ok, outcome.summary = False, False, ""
    outcome.content = prompts.finish_unchanged(run.test_command or "", failures)
    return True
