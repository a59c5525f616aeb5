"""What the parts of the small-model policy share: what it has learned of the task (Notes) and how it reads a
repository file to change it or put it back."""

from __future__ import annotations

from dataclasses import dataclass, field

from bugsweep.agent.rewrite import FunctionSpan
from bugsweep.agent.tools import Toolbox, ToolOutcome


@dataclass
class Notes:
    """What the policy has learned of the task so far, for every part of it."""

    failures: str | None = None
    """What the last test output with failures said (focus.failure_digest), shown with a rewrite request."""
    sources: list[str] = field(default_factory=list)
    """The code files (not tests) named in the first prompt."""
    asked: set[tuple[str, str]] = field(default_factory=set)
    """(path, function) of every whole function asked for: an edit that changes nothing asks for each once."""


def repo_file(toolbox: Toolbox, path: str) -> tuple[str, str, str] | None:
    """(real path, repository-relative path, text) of an existing text file of the repository; None when there
    is none or it is not text."""
    found = toolbox.existing_file(path)
    if isinstance(found, ToolOutcome):
        return None
    real, rel = found
    try:
        return real, rel, toolbox.sandbox.files.read_text(real)
    except UnicodeDecodeError:
        return None


def file_text(toolbox: Toolbox, path: str) -> tuple[str, str] | None:
    """(real path, text) of a repository file, to put it back as it was; None when it cannot be read."""
    found = repo_file(toolbox, path)
    return None if found is None else (found[0], found[2])


def has_seen(toolbox: Toolbox, span: FunctionSpan) -> bool:
    """Whether the last read_file of the span's file showed the whole function."""
    first, last = toolbox.seen.get(span.path, (0, -1))
    return first <= span.first and span.last <= last
