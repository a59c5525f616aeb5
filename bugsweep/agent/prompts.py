"""Every piece of text the model reads: the system prompt, the first user message, the error messages and the nudge;
the tools' own descriptions are declared with the tools (tool_specs.py: `TOOLS`). Kept together because it is tuned
as a whole.

Written for small open models (a 1.5B model on a laptop must do well with it), which copy whatever they see: no
placeholder paths or commands, no example dialogue, no magic strings. Each error says what went wrong and what to
do next, in words the model can act on directly.

Tuned against the embedded Qwen2.5-Coder-1.5B (temperature 0, local sandbox) on two one-line bugs: the calc repo
(add subtracts) and a package whose __init__ re-exports a module with a word-count bug. What it did, and the change:
- read the test, tried to edit it, then called finish with the refusal text as its summary ("finish when you cannot
  make progress" invited that): finish is now "after the tests pass" (the refusal also named the file that defines
  what the test imports under the small-model policy; removed after the run on real tasks, where it changed no
  outcome);
- read one line (start_line=end_line=1) and edited blind: a file that fits in the cap is now returned whole (under
  the small-model policy);
- wrote `old` with the function's two lines joined on one line, four times in a row: the tools say that `old`
  differs only in whitespace (applying such a match under the small-model policy changed no outcome on real tasks
  and was removed), and an edit that would break Python syntax is refused;
- edited, then finished without running the tests: a successful edit now names the test command as the next step;
- replaced only a `def` line, was refused for the syntax error, took the would-be file shown in the refusal for the
  real one, and repeated the edit with old == new until max_turns: the refusal now shows the file as it still is,
  and old == new is only reported when old is actually in the file (else "not found" shows the real lines).
With these, both tasks were resolved (7 turns, 1-2 minutes each), with the tests run before finish. Replies at
temperature 0 still vary between runs (the server's prompt cache), so a single run proves little.

On the demo's leap-year bug, which needs a new rule rather than a flipped operator, none of that was enough: the
model found the line but wrote a wrong rule inside edit_file's JSON, while as a plain ```python block it wrote the
right one (5 of 5). The whole-function requests below (rewrite.py) come from that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bugsweep.agent.tool_specs import ARGUMENT_SHAPES, TOOL_NAMES, TOOLS, ToolLimits

if TYPE_CHECKING:
    from bugsweep.agent.rewrite import FunctionSpan

REPO_DIR = "/workspace/repo"

NUDGE = "Continue with a tool call, or call finish."

ELIDED_OUTPUT = "[output elided to fit the context window]"


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def system_prompt(repo_dir: str = REPO_DIR) -> str:
    """Short and concrete: where the code is, what the tools are for, the order of work, and the one hard rule."""
    tools = "\n".join(f"- {tool.name}: {tool.purpose}" for tool in TOOLS)
    return f"""\
You are a careful software engineer fixing a bug in a code repository.
The repository is at {repo_dir}. You work only by calling tools:
{tools}
Work in this order:
1. Run the tests to see which test fails and why.
2. Find the function or class that the failing test calls, and read the file that defines it.
3. Edit that file to fix the bug.
4. Run the tests again. When they pass, call finish.
Test files cannot be edited: the bug is in the code under test. There is no network access."""


def first_user_message(
    task: str,
    test_command: str | None,
    repo_dir: str = REPO_DIR,
    files: list[str] | None = None,
    more: int = 0,
) -> str:
    """The task as the user states it, the command that checks the fix, and the repository's files.

    The file list saves a small model the turns it would spend finding its way (and the wrong guesses).
    """
    text = f"Task: {task.strip()}"
    if test_command:
        text += f"\n\nThe tests run with this command in {repo_dir}:\n{test_command.strip()}"
    if files:
        text += f"\n\nFiles in {repo_dir}:\n" + "\n".join(files)
        if more:
            text += f"\n({more} more files not listed)"
    return text


def tool_schemas(
    command_timeout_s: float,
    output_tail_chars: int,
    read_file_max_chars: int,
    repo_dir: str = REPO_DIR,
    short_files_whole: bool = False,
) -> list[dict[str, Any]]:
    """The tools as OpenAI function tools (TOOLS). Descriptions state the limits the model will run into, and what
    read_file does: a policy that returns short files whole whatever the range (small-model) says so; plain returns
    the range asked for."""
    limits = ToolLimits(
        command_timeout_s, output_tail_chars, read_file_max_chars, repo_dir, short_files_whole
    )
    return [tool.schema(limits) for tool in TOOLS]


# -- argument errors (a reply whose tool call cannot be used) -------------------------------------------------

_SHELL_NAMES = {
    "bash",
    "shell",
    "sh",
    "execute",
    "execute_bash",
    "exec",
    "terminal",
    "cmd",
    "command",
    "python",
}


def bad_json_arguments(tool: str, sent: str, problem: str) -> str:
    start = sent[:200] + ("..." if len(sent) > 200 else "")
    return (
        f"Error: the arguments of {tool} are not valid JSON ({problem}). You sent: {start!r}\n"
        f"The arguments of {tool} must be {ARGUMENT_SHAPES[tool]}. Call {tool} again with valid JSON."
    )


def missing_argument(tool: str, names: list[str]) -> str:
    keys = " and ".join(f'"{n}"' for n in names)
    return (
        f"Error: {tool} needs {keys}. Its arguments must be {ARGUMENT_SHAPES[tool]}. "
        f"Call {tool} again with {'them' if len(names) > 1 else 'it'}."
    )


def wrong_argument_type(tool: str, name: str, expected: str) -> str:
    return f'Error: "{name}" of {tool} must be {expected}. Call {tool} again.'


def unknown_tool(name: str) -> str:
    hint = " To run a shell command, call run." if name.lower() in _SHELL_NAMES else ""
    return f"Error: there is no tool named {name[:60]!r}. The tools are {_listed(TOOL_NAMES)}.{hint}"


# -- a full disk ---------------------------------------------------------------------------------------------

#: Said with every tool's answer while the sandbox's disk is full (tools.py).
DISK_FULL = (
    "The sandbox's disk is full: writing fails with 'No space left on device'. Delete files you do not "
    "need (large outputs, build folders, files in /tmp) before you go on, and write less output to files."
)


def disk_full_error(tool: str) -> str:
    """A tool that had to write into the sandbox found its disk full."""
    what = {
        "edit_file": "the edit was not made, the file is left as it was",
        "run": "the command did not run",
    }.get(tool, f"{tool} failed")
    return f"Error: {what}.\n{DISK_FULL}"


# -- run -----------------------------------------------------------------------------------------------------


def run_result(
    exit_code: int | None,
    output: str,
    cut: bool,
    timed_out: bool,
    timeout_s: float,
    oom: bool,
    disk_full: bool = False,
    too_much_output: bool = False,
) -> str:
    if timed_out:
        head = (
            f"The command timed out after {timeout_s:g} seconds and was stopped. "
            "Run something shorter, for example a single test."
        )
    elif oom:
        head = "The command was killed: it ran out of memory."
    elif exit_code is None:
        head = "The command was killed."
    else:
        head = f"Exit code: {exit_code}"
    if too_much_output:
        head += (
            "\nThe command wrote more output than is kept (a gigabyte), so its output was closed and its next "
            "write failed. Write less: pipe long output through tail or grep."
        )
    if disk_full:
        head += "\n" + DISK_FULL
    if cut:
        head += f"\n[output cut: these are the last {len(output)} characters]"
    return f"{head}\n{output}" if output.strip() else f"{head}\n(no output)"


# -- paths ---------------------------------------------------------------------------------------------------


def path_outside_repo(path: str, repo_dir: str = REPO_DIR) -> str:
    return (
        f"Error: {path!r} is outside the repository. Only files under {repo_dir} can be read or edited; "
        f"give the path relative to {repo_dir}."
    )


def no_such_file(path: str) -> str:
    return f"Error: there is no file {path!r}. Call run with ls or find to see which files exist."


def is_a_directory(path: str) -> str:
    return f"Error: {path!r} is a directory, not a file. Call run with ls to see what it contains."


def not_text(path: str) -> str:
    return f"Error: {path!r} is not a text file and cannot be read or edited with these tools."


# -- read_file -----------------------------------------------------------------------------------------------


def read_header(path: str, first: int, last: int, total: int) -> str:
    if total == 0:
        return f"{path} is empty."
    if first == 1 and last == total:
        return f"{path} ({total} lines):"
    return f"{path}, lines {first}-{last} of {total}:"


def read_cut(next_line: int, max_chars: int) -> str:
    return (
        f"[cut here: only {max_chars} characters are shown at a time. "
        f"To read on, call read_file with start_line {next_line}.]"
    )


def bad_line_range(path: str, total: int) -> str:
    return f"Error: {path} has {total} lines; start_line must be between 1 and {total}, and end_line not below it."


# -- edit_file -----------------------------------------------------------------------------------------------


def protected_file(path: str) -> str:
    return (
        f"Error: {path} is a test file and cannot be edited. The test describes the correct behaviour; "
        "the bug is in the code under test. Find the file that defines the code the test calls and fix the bug "
        "there."
    )


def file_exists_not_empty(path: str) -> str:
    return (
        f"Error: {path} already exists and is not empty, so it was not overwritten. To change it, "
        "call edit_file with old set to the exact text to replace, copied from read_file."
    )


def old_equals_new(path: str) -> str:
    return f"Error: old and new are the same, so {path} was not changed. Put the corrected text in new."


def old_not_found(path: str, closest: str, whitespace_only: bool = False) -> str:
    """`old` is in the file nowhere as written: where it is most alike, and whether it differs from the file only
    in whitespace."""
    text = f"Error: The text in old was not found in {path}, so nothing was changed."
    if whitespace_only:
        text += " It differs from the file only in spaces, indentation or line breaks."
    if not closest:
        return text + f" Call read_file on {path} and copy the exact text to replace into old."
    return (
        f"{text}\nThe {path} text most like old is at {closest}\n"
        "To change those lines, copy them exactly into old and call edit_file again."
    )


def failed_edit_note(error: str) -> str:
    """Stands in for a failed edit_file call that was taken out of the conversation (see loop.py)."""
    return f"Your last edit_file call failed and changed nothing. {error.removeprefix('Error: ')}"


def repeated_failure(tool: str, first_turn: int, error: str) -> str:
    """An identical failed call, again: small models repeat one until the turn limit if nothing changes."""
    return (
        f"{error}\nThis is the same {tool} call as in turn {first_turn}, and it failed in the same way again. "
        "Repeating it will not work. Do something different: look at the error above, change the arguments, "
        "or use another tool."
    )


def old_not_unique(path: str, count: int, lines: list[int]) -> str:
    where = ", ".join(str(n) for n in lines[:10])
    return (
        f"Error: the text in old occurs {count} times in {path} (at lines {where}), so nothing was changed. "
        "Include more of the surrounding lines in old so that it matches exactly one place."
    )


def _check_step(test_command: str | None) -> str:
    """The next step after a successful edit: a small model otherwise finishes without running the tests."""
    if test_command:
        return f"Run the tests to check the fix: {test_command.strip()}"
    return "Run the tests to check the fix."


def edit_done(path: str, first: int, last: int, snippet: str, test_command: str | None = None) -> str:
    return (
        f"Edited {path}. Lines {first}-{last} changed; with the lines around them the file now reads:\n"
        f"{snippet}\n{_check_step(test_command)}"
    )


def edit_breaks_syntax(path: str, message: str, numbered: str) -> str:
    return (
        f"Error: the edit was not made: with it, {path} would no longer be valid Python ({message}). "
        f"The file is unchanged; around that place it still reads (line number, then |, then the line):\n"
        f"{numbered}\n"
        "Put every line you want to change into old, copied exactly, and all of their replacement lines, "
        "with the same indentation, into new. Then call edit_file again."
    )


def file_created(path: str, lines: int) -> str:
    return f"Created {path} ({lines} lines)."


# -- finish --------------------------------------------------------------------------------------------------


def finished(summary: str) -> str:
    return "Finished." if not summary else f"Finished: {summary[:200]}"


# -- recovered text tool calls -------------------------------------------------------------------------------


def unreadable_text_call(sent: str) -> str:
    """For a reply that wrote a tool call as text which does not parse: better than the bare nudge, because it
    says what was wrong."""
    start = sent[:200] + ("..." if len(sent) > 200 else "")
    return (
        f"Error: your tool call could not be read: it is not valid JSON with a tool name and its arguments. "
        f"You sent: {start!r}\nCall the tool again with valid JSON arguments, or call finish."
    )


def recovered_result(tool: str, content: str) -> str:
    """A tool result sent back as a user message (the call was written as text, so there is no tool_call_id)."""
    return f"Result of {tool}:\n{content}"


# -- whole-function edits (the small-model policy: small_model/, rewrite.py) ---------------------------------


def rewrite_request(
    name: str,
    path: str,
    first: int,
    last: int,
    source: str | None = None,
    caller: str | None = None,
    failures: str | None = None,
    stuck: bool = False,
) -> str:
    """Sent in place of an edit_file call inside one function. Measured wording (bench/README.md): the model's own
    call is not shown again, and the function is shown only when its file was not read in this run. With `caller`:
    the model wrote the function its edit was in (`caller`) back unchanged, so the request moves to the function
    of the same file that `caller` calls. With `failures`: what the last failing test run said
    (focus.failure_digest), next to the code it is about. With `stuck`: no edit_file call; the same failing test
    run came back unchanged, and `name` is where its traceback ends."""
    where = f"{path}, lines {first}-{last}"
    shown = f"It now reads:\n```python\n{source}\n```\n" if source is not None else ""
    if failures:
        shown += f"The failing tests say:\n```\n{failures}\n```\n"
    if stuck:  # after a test run repeated with nothing changed: where the failing tests' traceback ends
        head = f"The failing tests' traceback ends in the function {name} ({where}). "
        what = f"the whole corrected {name} function, from its def line to its end"
    elif caller is None:
        head = f"Your edit_file call changes the function {name} ({where}). "
        what = f"the whole corrected {name} function, from its def line to its end"
    else:
        head = (
            f"Your edit_file call changes {caller}, but the wrong result comes from a function that {caller} "
            "calls. "
        )
        what = f"the whole corrected {name} function ({where}), from its def line to its end"
    return (
        f"{head}{shown}Instead of a tool call, reply with {what}, in a ```python block. "
        f"It will replace lines {first}-{last} of {path}."
    )


def tests_pass_after_edit(test_command: str) -> str:
    return f"Then the tests ran ({test_command.strip()}) and passed. If that fixes the task, call finish."


def rewrite_unusable(problem: str, span: FunctionSpan) -> str:
    return (
        f"Error: {span.path} was not changed: {problem}. Reply with the whole corrected {span.name} function, "
        f"from its def line to its end, in one ```python block, or call a tool."
    )


def rewrite_unchanged(span: FunctionSpan, called: Sequence[tuple[str, int]] = ()) -> str:
    text = f"Error: your {span.name} is the same as the one in {span.path}, so nothing was changed."
    if called:
        names = ", ".join(f"{name} (line {line})" for name, line in called)
        text += (
            f" {span.name} calls {names} of {span.path}: if the wrong result comes from there, "
            "read that function and fix it instead."
        )
    else:
        text += " Find the line that gives the wrong result, and fix that line."
    return text


def function_gone(name: str, path: str) -> str:
    return f"Error: {path} no longer defines {name}, so nothing was changed. Read {path} again."


def function_rewritten(span: FunctionSpan, last: int, snippet: str, test_command: str | None = None) -> str:
    return (
        f"Replaced {span.name} in {span.path} (lines {span.first}-{span.last}) with your version. "
        f"Lines {span.first}-{last} of {span.path} now read:\n{snippet}\n{_check_step(test_command)}"
    )


# -- notes of the small-model policy (small_model/) ----------------------------------------------------------

REPEAT_SAME = (
    "Note: this is the same command as in turn {turn}, and its output is the same: nothing it checks has changed "
    "since. Running it again will not help. Change the code first: read the function the failing test calls, "
    "then edit it."
)
REPEAT_CHANGED = (
    "Note: this is the same command as in turn {turn}. What is new in its output since then:\n{lines}"
)
UNREAD_FILE = (
    "Error: The text in old was not found in {path}, so nothing was changed. You have not read {path}: edit only "
    "text you have read. The part of {path} most like your old is at {closest}\n"
    "To change those lines, copy them exactly into old and call edit_file again."
)
