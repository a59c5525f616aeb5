"""The command line's help as a person reads it, and the commands it names (the docs': tests/test_docs.py).

Real parts: the `bugsweep` command line (typer/click), run in-process with click's test runner (its output is not
a terminal, as in a log or a pipe). No stand-ins.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from bugsweep.cli import app


def commands() -> dict[tuple[str, ...], Any]:
    """Every command and group of `bugsweep` (typer's own click: duck-typed), by its path of names."""
    found: dict[tuple[str, ...], Any] = {}

    def walk(path: tuple[str, ...], command: Any) -> None:
        found[path] = command
        if is_group(command):
            for name, sub in command.commands.items():
                walk((*path, name), sub)

    walk((), typer.main.get_command(app))
    return found


def is_group(command: Any) -> bool:
    return isinstance(getattr(command, "commands", None), dict)


@pytest.mark.parametrize("columns", ["40", "200"])
def test_help_shows_every_option_whole_at_any_width_outside_a_terminal(columns: str) -> None:
    """Outside a terminal (a pipe, a log) and in a narrow one, no option name is cut ("--max-total-toke…")."""
    runner = CliRunner()
    for path, command in commands().items():
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": columns})
        shown = " ".join(path) or "bugsweep"
        assert result.exit_code == 0, f"{shown} --help: {result.output}"
        assert "…" not in result.output, f"{shown} --help cuts something:\n{result.output}"
        for param in command.params:
            for name in [*param.opts, *param.secondary_opts]:
                if name.startswith("-"):
                    assert re.search(rf"(^|[\s,]){re.escape(name)}([\s,=]|$)", result.output, re.M), (
                        f"{shown} --help at {columns} columns does not show {name} whole:\n{result.output}"
                    )


def named_commands(text: str) -> list[tuple[str, ...]]:
    """The `bugsweep COMMAND [SUBCOMMAND]` a text names in its code: backticked spans and fenced blocks."""
    fence = re.compile(r"^\s*```.*?^\s*```", flags=re.S | re.M)  # a fence opens and closes a line
    blocks, prose = fence.findall(text), fence.sub("", text)
    code = [re.sub(r"(^|\s)#.*$", "", line) for block in blocks for line in block.splitlines()]  # no comments
    code += [span for line in prose.splitlines() for span in re.findall(r"`[^`]+`", line)]
    named = []
    for block in code:
        for match in re.finditer(
            r"(?:^|[\s(`$])bugsweep ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", block, flags=re.M
        ):
            named.append(tuple(word for word in match.groups() if word))
    return named


def test_every_command_the_help_names_exists() -> None:
    """`sweep --help` once named `bugsweep grow`, which never existed: every `bugsweep COMMAND` (and every
    subcommand of a group) a help text names is one a user can run."""
    known = commands()
    runner = CliRunner()
    texts = {f"`{' '.join(path)} --help`": runner.invoke(app, [*path, "--help"]).output for path in known}
    missing = []
    for where, text in texts.items():
        for named in named_commands(text):
            command = known.get(named[:1])
            if command is None:
                missing.append(f"{where}: bugsweep {named[0]}")
            elif is_group(command) and len(named) > 1 and named[:2] not in known:
                missing.append(f"{where}: bugsweep {' '.join(named)}")
    assert missing == [], "commands named that do not exist:\n" + "\n".join(sorted(set(missing)))
    assert len(texts) > 20 and ("sweep",) in known and ("sandboxes", "cleanup") in known
