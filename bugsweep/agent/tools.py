"""The four tools the model calls: run, read_file, edit_file and finish, plain.

Each tool is declared once, in tool_specs.TOOLS (its name, description, arguments, which are required, how they are
spelled): the schemas sent to the model, the checks `Toolbox.call` makes and the system prompt's list are made
from it, and Toolbox has one method per tool, of its name, taking exactly its arguments.

edit_file replaces exactly one exact occurrence of `old`; otherwise nothing changes and the answer says precisely
why (found nowhere: the closest lines, and whether `old` differs from them only in whitespace; found several times:
how many and at which lines; an edit that would break Python syntax: where). read_file shows the lines asked for.
Help beyond that for weak models (whole-function edits, the region of a file never read) is the small-model
policy's (small_model/), which acts on the `problem` these answers carry.

Everything happens inside the sandbox through its interface (`exec`, `files`), so the same tools work on the local
bubblewrap sandbox and on Runtime microVMs. The tools never raise for a mistake of the model: every mistake comes back
as a ToolOutcome whose text (from prompts.py) tells the model what to do next. A full disk is the model's too (its
commands filled it): a write that fails for it is answered with what to delete, and while the disk is full every
answer says so. Failures of the sandbox itself (SandboxGone, SandboxError) do propagate: they are infrastructure
failures, not the model's.
"""

from __future__ import annotations

import errno
import json
import posixpath
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bugsweep.agent import prompts
from bugsweep.agent.rewrite import FunctionSpan
from bugsweep.agent.text import (
    closest_lines,
    loose_matches,
    new_syntax_error,
    numbered,
    occurrences,
    snippet,
    split_lines,
)
from bugsweep.agent.tool_specs import TOOLS_BY_NAME
from bugsweep.grading.testfiles import is_test_file
from bugsweep.sandbox.base import Sandbox, tail
from bugsweep.settings import AgentSettings

__all__ = ["ToolOutcome", "Toolbox", "closest_lines", "disk_is_full", "parse_arguments", "short"]


@dataclass
class ToolOutcome:
    """What one tool call produced: the text for the model plus what the loop and the progress line need."""

    content: str
    """The text that goes back to the model."""
    ok: bool = True
    """False when the call failed (bad arguments, refused edit, missing file)."""
    format_error: bool = False
    """True when the call itself was unusable (unknown tool, bad JSON, missing argument)."""
    short_arg: str = ""
    """The command cut to ~80 characters, or the path: what a progress line shows."""
    exit_code: int | None = None
    """Exit code of `run` (None for other tools and for a command that timed out)."""
    timed_out: bool = False
    finished: bool = False
    summary: str = ""
    arguments: dict[str, Any] | None = None
    """The parsed arguments, for the trajectory."""
    callees: list[FunctionSpan] | None = None
    """Whole-function edits only: set when the model wrote the function back unchanged, to the functions of the same
    file that it calls (where the wrong result must come from)."""
    problem: str | None = None
    """What a policy may act on: "old_not_found", "test_file" (edit_file) or "bad_line_range" (read_file)."""

    def record(self) -> dict[str, Any]:
        """What a trajectory's tool event says of the outcome."""
        return {
            "ok": self.ok,
            "format_error": self.format_error,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
        }


def disk_is_full(exc: OSError) -> bool:
    """Whether a write into the sandbox failed because its disk (its quota) is full."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def short(text: str, limit: int = 80) -> str:
    """One line of at most `limit` characters, for progress output."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def parse_arguments(raw: str | dict[str, Any] | None) -> tuple[dict[str, Any] | None, str | None]:
    """JSON arguments to a dict; (None, problem) when they are not a JSON object.

    An empty string counts as no arguments, arguments encoded twice (a JSON string holding JSON, which some
    small models send) are decoded once more, and raw line breaks or tabs inside strings are accepted
    (strict=False): small models often write a multi-line `old` that way, and the meaning is unambiguous.
    """
    if isinstance(raw, dict):
        return raw, None
    if raw is None or not raw.strip():
        return {}, None
    try:
        value = json.loads(raw, strict=False)
        if isinstance(value, str):
            value = json.loads(value, strict=False)
    except json.JSONDecodeError as exc:
        return None, f"{exc.msg} at character {exc.pos}"
    if not isinstance(value, dict):
        return None, "not a JSON object"
    return value, None


class Toolbox:
    """The tools bound to one sandbox and one set of agent settings: one method per tool of tool_specs.TOOLS."""

    def __init__(
        self,
        sandbox: Sandbox,
        settings: AgentSettings,
        *,
        protected_paths: Iterable[str] = (),
        time_left: Callable[[], float | None] = lambda: None,
        test_command: str | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.settings = settings
        self.workdir = posixpath.normpath(sandbox.workdir)
        self.protected_paths = tuple(protected_paths)
        self.time_left = time_left
        self.test_command = test_command
        """Named after each successful edit as the next step (a small model otherwise finishes untested)."""
        self.seen: dict[str, tuple[int, int]] = {}
        """Line ranges shown by read_file, by repo-relative path: whether the model has seen a function."""
        self.disk_full = False
        """Whether the sandbox's disk was full at the last command or write of a tool."""

    def schemas(self, short_files_whole: bool = False) -> list[dict[str, Any]]:
        s = self.settings
        return prompts.tool_schemas(
            s.command_timeout_s, s.output_tail_chars, s.read_file_max_chars, self.workdir, short_files_whole
        )

    # -- dispatch ----------------------------------------------------------------------------------------------
    def call(self, name: str, raw_arguments: str | dict[str, Any] | None) -> ToolOutcome:
        """Run one tool call; never raises for the model's mistakes."""
        tool = TOOLS_BY_NAME.get(name)
        if tool is None:
            return ToolOutcome(
                prompts.unknown_tool(name), ok=False, format_error=True, short_arg=short(name, 40)
            )
        args, problem = parse_arguments(raw_arguments)
        if args is None:
            sent = raw_arguments if isinstance(raw_arguments, str) else json.dumps(raw_arguments)
            return ToolOutcome(
                prompts.bad_json_arguments(name, sent, problem or "unreadable"), ok=False, format_error=True
            )
        missing = [k for k in tool.required if k not in args or args[k] is None]
        if missing:
            return ToolOutcome(
                prompts.missing_argument(name, missing), ok=False, format_error=True, arguments=args
            )
        for argument in tool.arguments:
            value = args.get(argument.name)
            if argument.kind == "string" and value is not None and not isinstance(value, str):
                return ToolOutcome(
                    prompts.wrong_argument_type(name, argument.name, "a string"),
                    ok=False,
                    format_error=True,
                    arguments=args,
                )
        try:
            # integer arguments are read leniently by the tool itself ("3" is line 3)
            given = {a.name: args[a.name] for a in tool.arguments if args.get(a.name) is not None}
            outcome = getattr(self, name)(**given)
        except OSError as exc:
            if not disk_is_full(exc):
                raise
            self.disk_full = True
            outcome = ToolOutcome(
                prompts.disk_full_error(name),
                ok=False,
                short_arg=short(str(args.get("path") or args.get("command"))),
            )
        if self.disk_full and not outcome.finished and prompts.DISK_FULL not in outcome.content:
            outcome.content += "\n" + prompts.DISK_FULL
        outcome.arguments = args
        return outcome

    # -- finish ------------------------------------------------------------------------------------------------
    def finish(self, summary: str | None = None) -> ToolOutcome:
        """End the work. The summary is recorded, never used for grading."""
        summary = summary or ""
        return ToolOutcome(
            prompts.finished(summary), finished=True, summary=summary, short_arg=short(summary)
        )

    # -- run ---------------------------------------------------------------------------------------------------
    def write_file(self, real: str, data: str) -> None:
        """Write a file of the repository; for Python source, also remove its compiled bytecode.

        Python trusts a .pyc whose recorded source mtime (whole seconds) and size match the file: an edit that
        keeps the size, made in the same second as the run that compiled it, was otherwise not seen by the next
        test run (seen with a scripted model, `- b` to `+ b`). The grade never reads bytecode (bugsweep/grading/cleanroom.py).
        """
        self.sandbox.files.write(real, data)
        if real.endswith(".py"):
            folder, name = posixpath.split(real)
            stale = f"{folder}/__pycache__/{name[:-3]}."
            self.sandbox.exec(f"rm -f -- {shlex.quote(stale)}*.pyc", timeout=30, stdin="")

    def write_if_room(self, real: str, data: str) -> bool:
        """write_file; False, with the file left as it was, when the sandbox's disk is full (for the writes a policy
        makes outside a tool call, which must not end the run)."""
        try:
            self.write_file(real, data)
        except OSError as exc:
            if not disk_is_full(exc):
                raise
            self.disk_full = True
            return False
        return True

    def run(self, command: str) -> ToolOutcome:
        timeout = self.settings.command_timeout_s
        left = self.time_left()
        if left is not None:
            # The wall-clock budget holds even inside a long command.
            timeout = max(1.0, min(timeout, left))
        # stdin="" so that a command waiting for input sees end-of-file instead of hanging until the timeout.
        result = self.sandbox.exec(command, timeout=timeout, stdin="")
        self.disk_full = result.disk_full
        output, cut = tail(result.output, self.settings.output_tail_chars)
        text = prompts.run_result(
            result.exit_code,
            output,
            cut or result.truncated,
            result.timed_out,
            timeout,
            result.out_of_memory,
            result.disk_full,
            result.too_much_output,
        )
        return ToolOutcome(
            text,
            ok=result.ok,
            short_arg=short(command),
            exit_code=None if result.timed_out else result.exit_code,
            timed_out=result.timed_out,
        )

    # -- paths -------------------------------------------------------------------------------------------------
    def _inside(self, path: str, root: str) -> bool:
        return path == root or path.startswith(root.rstrip("/") + "/")

    def resolve(self, path: str) -> tuple[str, str, str, bool] | ToolOutcome:
        """(real absolute path, path relative to the repo, kind, parent exists) or a refusal.

        Checked twice: lexically (`..`, absolute paths elsewhere), then with `realpath -m` inside the sandbox,
        so that a symlink in the repository cannot lead the tools outside it. kind is file, dir, other or missing.
        """
        raw = path.strip()
        if not raw or "\0" in raw:
            return ToolOutcome(prompts.no_such_file(path), ok=False, short_arg=short(path))
        if raw.startswith(prompts.REPO_DIR + "/") and self.workdir != prompts.REPO_DIR:
            raw = self.workdir + raw[len(prompts.REPO_DIR) :]
        joined = posixpath.normpath(raw if raw.startswith("/") else posixpath.join(self.workdir, raw))
        if not self._inside(joined, self.workdir) or joined == self.workdir:
            return ToolOutcome(prompts.path_outside_repo(path, self.workdir), ok=False, short_arg=short(path))
        script = (
            f"realpath -m -- {shlex.quote(self.workdir)}; p=$(realpath -m -- {shlex.quote(joined)}); "
            'printf "%s\\n" "$p"; '
            'if [ -d "$p" ]; then echo dir; elif [ -f "$p" ]; then echo file; '
            'elif [ -e "$p" ]; then echo other; else echo missing; fi; '
            'if [ -d "$(dirname -- "$p")" ]; then echo parent; else echo noparent; fi'
        )
        result = self.sandbox.exec(script, timeout=30, stdin="")
        self.disk_full = result.disk_full
        lines = result.stdout.rstrip("\n").split("\n")
        if result.exit_code != 0 or len(lines) != 4:
            # realpath failed (e.g. a symlink loop): refuse rather than guess.
            return ToolOutcome(prompts.no_such_file(path), ok=False, short_arg=short(path))
        real_root, real, kind, parent = lines
        if not self._inside(real, real_root) or real == real_root:
            return ToolOutcome(prompts.path_outside_repo(path, self.workdir), ok=False, short_arg=short(path))
        rel = posixpath.relpath(real, real_root)
        return real, rel, kind, parent == "parent"

    def list_files(self, limit: int = 80) -> tuple[list[str], int]:
        """The repository's files (git ls-files, else find), shallowest first, and how many more were left out."""
        result = self.sandbox.exec(
            "git ls-files 2>/dev/null || find . -type f -not -path './.git/*' | sed 's|^./||'",
            timeout=60,
            stdin="",
        )
        if result.exit_code != 0:
            return [], 0
        paths = sorted((p for p in result.stdout.split("\n") if p), key=lambda p: (p.count("/"), p))
        return paths[:limit], max(len(paths) - limit, 0)

    def is_protected(self, *rel_paths: str) -> bool:
        return any(is_test_file(p, self.settings.protected_globs, self.protected_paths) for p in rel_paths)

    # -- read_file ---------------------------------------------------------------------------------------------
    def existing_file(self, path: str) -> tuple[str, str] | ToolOutcome:
        """(real path, repo-relative path) of an existing regular file, or the refusal to give the model."""
        resolved = self.resolve(path)
        if isinstance(resolved, ToolOutcome):
            return resolved
        real, rel, kind, _ = resolved
        return self._refuse_kind(kind, rel) or (real, rel)

    def read_file(self, path: str, start_line: Any = None, end_line: Any = None) -> ToolOutcome:
        found = self.existing_file(path)
        if isinstance(found, ToolOutcome):
            return found
        real, rel = found
        try:
            text = self.sandbox.files.read_text(real)
        except UnicodeDecodeError:
            return ToolOutcome(prompts.not_text(rel), ok=False, short_arg=rel)
        if "\x00" in text:
            return ToolOutcome(prompts.not_text(rel), ok=False, short_arg=rel)
        lines = split_lines(text)
        total = len(lines)
        try:
            first = int(start_line) if start_line not in (None, "") else 1
            last = int(end_line) if end_line not in (None, "") else total
        except (TypeError, ValueError):
            return ToolOutcome(
                prompts.wrong_argument_type("read_file", "start_line", "a whole number"),
                ok=False,
                short_arg=rel,
            )
        if total == 0:
            return ToolOutcome(prompts.read_header(rel, 0, 0, 0), short_arg=rel)
        limit = self.settings.read_file_max_chars
        last = min(last, total)
        if first < 1 or first > total or last < first:
            return ToolOutcome(
                prompts.bad_line_range(rel, total), ok=False, short_arg=rel, problem="bad_line_range"
            )
        shown: list[str] = []
        size = 0
        cut_at: int | None = None
        for number in range(first, last + 1):
            line = lines[number - 1]
            if size + len(line) > limit:
                if not shown:  # one enormous line: show its start rather than nothing
                    shown.append(line[:limit] + "\n")
                    number += 1
                cut_at = number
                break
            shown.append(line)
            size += len(line)
        shown_last = (cut_at - 1) if cut_at else last
        body = "".join(shown)
        if not body.endswith("\n"):
            body += "\n"
        text_out = prompts.read_header(rel, first, shown_last, total) + "\n" + body
        if cut_at and cut_at <= total:
            text_out += prompts.read_cut(cut_at, limit)
        short_arg = rel if (first, last) == (1, total) else f"{rel}:{first}-{shown_last}"
        self.seen[rel] = (first, shown_last)
        return ToolOutcome(text_out.rstrip("\n"), short_arg=short_arg)

    def _refuse_kind(self, kind: str, rel: str) -> ToolOutcome | None:
        if kind == "missing":
            return ToolOutcome(prompts.no_such_file(rel), ok=False, short_arg=rel)
        if kind == "dir":
            return ToolOutcome(prompts.is_a_directory(rel), ok=False, short_arg=rel)
        if kind != "file":
            return ToolOutcome(prompts.not_text(rel), ok=False, short_arg=rel)
        return None

    # -- edit_file ---------------------------------------------------------------------------------------------
    def edit_file(self, path: str, old: str, new: str) -> ToolOutcome:
        resolved = self.resolve(path)
        if isinstance(resolved, ToolOutcome):
            return resolved
        real, rel, kind, parent_exists = resolved
        lexical_rel = posixpath.relpath(
            posixpath.normpath(path if path.startswith("/") else posixpath.join(self.workdir, path)),
            self.workdir,
        )
        if self.is_protected(rel, lexical_rel):
            return ToolOutcome(prompts.protected_file(rel), ok=False, short_arg=rel, problem="test_file")
        if old == "":
            return self._create(real, rel, kind, parent_exists, new)
        refusal = self._refuse_kind(kind, rel)
        if refusal:
            return refusal
        try:
            content = self.sandbox.files.read_text(real)
        except UnicodeDecodeError:
            return ToolOutcome(prompts.not_text(rel), ok=False, short_arg=rel)
        if "\x00" in content or "\ufffd" in content:
            # Binary, or not UTF-8 (a sandbox may decode with errors="replace"): writing it back would lose bytes.
            return ToolOutcome(prompts.not_text(rel), ok=False, short_arg=rel)
        spans = [(i, i + len(old)) for i in occurrences(content, old)]
        if not spans:
            closest = closest_lines(content, old)
            loose = bool(loose_matches(content, old))
            return ToolOutcome(
                prompts.old_not_found(rel, closest, whitespace_only=loose),
                ok=False,
                short_arg=rel,
                problem="old_not_found",
            )
        if len(spans) > 1:
            lines = [content.count("\n", 0, i) + 1 for i, _ in spans]
            return ToolOutcome(prompts.old_not_unique(rel, len(spans), lines), ok=False, short_arg=rel)
        if old == new:
            # Checked only after the match: when old is not in the file, "not found" with the real lines tells the
            # model more (a model that believes its edit was made repeats it with old == new).
            return ToolOutcome(prompts.old_equals_new(rel), ok=False, short_arg=rel)
        return self.apply_edit(real, rel, content, *spans[0], new)

    def apply_edit(self, real: str, rel: str, content: str, start: int, end: int, new: str) -> ToolOutcome:
        """Replace content[start:end] with `new` and write the file, unless that breaks Python syntax."""
        updated = content[:start] + new + content[end:]
        first = updated.count("\n", 0, start) + 1
        last = first + max(new.count("\n") - (1 if new.endswith("\n") else 0), 0)
        if rel.endswith(".py"):
            broken = new_syntax_error(content, updated, rel)
            if broken is not None:
                # Show the file as it still is, around the place of the edit: showing the would-be file made a
                # small model believe the edit had been made.
                old_first = content.count("\n", 0, start) + 1
                old_last = old_first + content.count("\n", start, end)
                shown = numbered(content, old_first - 2, old_last + 2)
                return ToolOutcome(prompts.edit_breaks_syntax(rel, broken[1], shown), ok=False, short_arg=rel)
        if not self.write_if_room(real, updated):
            return ToolOutcome(prompts.disk_full_error("edit_file"), ok=False, short_arg=rel)
        text = prompts.edit_done(rel, first, last, snippet(updated, first, last), self.test_command)
        return ToolOutcome(text, short_arg=rel)

    def _create(self, real: str, rel: str, kind: str, parent_exists: bool, new: str) -> ToolOutcome:
        if kind == "dir":
            return ToolOutcome(prompts.is_a_directory(rel), ok=False, short_arg=rel)
        if kind == "file":
            try:
                existing = self.sandbox.files.read_text(real)
            except UnicodeDecodeError:
                existing = "x"
            if existing.strip():
                return ToolOutcome(prompts.file_exists_not_empty(rel), ok=False, short_arg=rel)
        elif kind != "missing":
            return ToolOutcome(prompts.not_text(rel), ok=False, short_arg=rel)
        if not parent_exists:
            self.sandbox.exec(f"mkdir -p -- {shlex.quote(posixpath.dirname(real))}", timeout=30, stdin="")
        try:
            self.write_file(real, new)
        except OSError as exc:
            if kind == "missing" and disk_is_full(exc):  # no empty file is left where there was none
                self.sandbox.exec(f"rm -f -- {shlex.quote(real)}", timeout=30, stdin="")
            raise
        return ToolOutcome(prompts.file_created(rel, len(new.splitlines())), short_arg=rel)
