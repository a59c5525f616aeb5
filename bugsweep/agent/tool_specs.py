"""The four tools declared once (`TOOLS`): the schemas, the loop's argument checks and the prompt's list come from here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class ToolLimits:
    """What the tools' descriptions state: the limits the model will run into, where the repository is, and
    whether read_file returns short files whole (a policy's choice)."""

    command_timeout_s: float
    output_tail_chars: int
    read_file_max_chars: int
    repo_dir: str
    short_files_whole: bool = False


@dataclass(frozen=True)
class Argument:
    name: str
    kind: Literal["string", "integer"]
    describe: Callable[[ToolLimits], str]
    required: bool = True


@dataclass(frozen=True)
class Tool:
    """One tool: its name, the line the system prompt lists it with, its description for the model, its
    arguments (the schema and the required ones are made from them, and the loop checks the same), and how its
    arguments are spelled, in words, for the error messages. Toolbox has a method of the tool's name taking exactly
    these arguments (bugsweep/agent/tools.py)."""

    name: str
    purpose: str
    describe: Callable[[ToolLimits], str]
    arguments: tuple[Argument, ...]
    shape: str
    """How the arguments are spelled, for error messages: described in words, so nothing can be copied blindly."""

    @property
    def required(self) -> list[str]:
        return [a.name for a in self.arguments if a.required]

    def schema(self, limits: ToolLimits) -> dict[str, Any]:
        """The tool as an OpenAI function tool."""
        properties = {a.name: {"type": a.kind, "description": a.describe(limits)} for a in self.arguments}
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.describe(limits),
                "parameters": {"type": "object", "properties": properties, "required": self.required},
            },
        }


def _read_file(t: ToolLimits) -> str:
    if t.short_files_whole:
        return (
            f"Read a text file of the repository. A file of up to {t.read_file_max_chars} characters is returned "
            "whole. A longer file is cut there; then start_line and end_line choose the part to read."
        )
    return (
        f"Read a text file of the repository: the lines from start_line to end_line, or without them the whole "
        f"file, cut at {t.read_file_max_chars} characters."
    )


def _file_path(t: ToolLimits) -> str:
    return f"File path, relative to {t.repo_dir}."


#: The four tools, in the order the model sees them. Everything the model and the loop know of a tool is made from
#: here: the system prompt's list, the tool schemas, the required arguments, the argument types the loop checks,
#: the error messages' spelling of the arguments, and the list of names an unknown tool is answered with.
TOOLS: tuple[Tool, ...] = (
    Tool(
        "run",
        "run a bash command in the repository and see its exit code and output.",
        lambda t: (
            f"Run a bash command in {t.repo_dir} and return its exit code and the last {t.output_tail_chars} "
            f"characters of its output. Each call starts a new shell in {t.repo_dir}, so `cd` does not carry over. "
            f"A command is stopped after {t.command_timeout_s:g} seconds. There is no network access."
        ),
        (Argument("command", "string", lambda t: "The bash command to run."),),
        'a JSON object with the key "command" holding the bash command as a string',
    ),
    Tool(
        "read_file",
        "read a file of the repository.",
        _read_file,
        (
            Argument("path", "string", _file_path),
            Argument(
                "start_line",
                "integer",
                lambda t: "For a long file: first line to read (1 is the first line). Optional.",
                required=False,
            ),
            Argument(
                "end_line",
                "integer",
                lambda t: "For a long file: last line to read. Optional.",
                required=False,
            ),
        ),
        'a JSON object with the key "path" holding the file path as a string '
        '(optional integer keys "start_line" and "end_line")',
    ),
    Tool(
        "edit_file",
        "replace an exact piece of text in a file, or create a new file.",
        lambda t: (
            "Replace one exact piece of text in a file. `old` must match the file exactly, including spaces, "
            "indentation and line breaks, and must occur exactly once. With an empty `old`, create a new file "
            "that contains `new`. Test files cannot be edited."
        ),
        (
            Argument("path", "string", _file_path),
            Argument(
                "old",
                "string",
                lambda t: "The exact text to replace, copied from the file. Empty to create a new file.",
            ),
            Argument("new", "string", lambda t: "The text to put in its place."),
        ),
        'a JSON object with the string keys "path", "old" and "new"; '
        'line breaks inside the strings are written as \\n and quotes as \\"',
    ),
    Tool(
        "finish",
        "end the work when the bug is fixed.",
        lambda t: "End the work. Call it after the tests pass.",
        # Optional: the grade never reads it, and a finish without it ends the run all the same.
        (Argument("summary", "string", lambda t: "What was wrong and what you changed.", required=False),),
        'a JSON object with the key "summary" holding a short text',
    ),
)
TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}
TOOL_NAMES = tuple(TOOLS_BY_NAME)
ARGUMENT_SHAPES = {tool.name: tool.shape for tool in TOOLS}
