"""The four tools' own logic: edits, reads, refusals, argument errors, text tool-call recovery.

Real parts: files on disk, bash, realpath, git repos from tests.support.repos. Stand-in: `DirSandbox` runs commands
with plain subprocess in a temporary folder (no isolation), because these tests are about what the tools tell the
model, not about the sandbox; tests/test_agent_loop.py runs the loop on the real local sandbox.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bugsweep.agent import prompts, tool_specs
from bugsweep.agent.loop import AgentRun
from bugsweep.agent.model import ToolCall, recover_text_tool_calls
from bugsweep.agent.small_model import SmallModelPolicy
from bugsweep.agent.small_model.lookups import code_under_test
from bugsweep.agent.tools import Toolbox, ToolOutcome, closest_lines
from bugsweep.agent.trajectory import Trajectory
from bugsweep.agent.types import AgentProgress
from bugsweep.sandbox.base import ExecResult, tail
from bugsweep.settings import AgentSettings
from tests.support.repos import make_repo


class _DirFiles:
    def read_text(self, path: str) -> str:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:  # as the local sandbox decodes
            return f.read()

    def write(self, path: str, data: str | bytes) -> None:
        with open(path, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)


class DirSandbox:
    """Stand-in sandbox: bash via subprocess in a host folder. NOT isolated; for tool-logic tests only."""

    def __init__(self, root: Path) -> None:
        self.id = "dir-" + root.name
        self.workdir = str(root)
        self.files = _DirFiles()

    def exec(
        self, command, *, timeout=300.0, cwd=None, env=None, network=False, full_output=False, stdin=None
    ):
        started = time.monotonic()
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd or self.workdir,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(stdin or "", timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return ExecResult(None, out, err, timed_out=True, duration_s=time.monotonic() - started)
        limit = 64 * 1024
        out_t, cut1 = (out, False) if full_output else tail(out, limit)
        err_t, cut2 = (err, False) if full_output else tail(err, limit)
        return ExecResult(
            proc.returncode, out_t, err_t, truncated=cut1 or cut2, duration_s=time.monotonic() - started
        )

    def release(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
def box(repo: Path) -> Toolbox:
    return Toolbox(DirSandbox(repo), AgentSettings())


def args(**kw: object) -> str:
    return json.dumps(kw)


class SmallModelTools:
    """The tools as the small-model policy answers them: the plain tool runs, then the policy's after_tool hook
    (no model, no loop). `trajectory` holds what the policy recorded."""

    def __init__(self, box: Toolbox) -> None:
        self.box, self.policy, self.trajectory = box, SmallModelPolicy(), Trajectory()
        self.run = AgentRun(
            task="",
            model=None,  # type: ignore[arg-type]  # the hook never asks the model
            settings=box.settings,
            policy=self.policy,
            toolbox=box,
            trajectory=self.trajectory,
            progress=AgentProgress(),
        )

    def call(self, name: str, arguments: str) -> ToolOutcome:
        return self.policy.after_tool(
            self.run, ToolCall("c1", name, arguments), self.box.call(name, arguments)
        )


def small(box: Toolbox) -> SmallModelTools:
    return SmallModelTools(box)


# -- edit_file -----------------------------------------------------------------------------------------------


def test_edit_replaces_exactly_one_occurrence(box: Toolbox, repo: Path) -> None:
    out = box.call("edit_file", args(path="calc.py", old="return a - b", new="return a + b"))
    assert out.ok, out.content
    assert "return a + b" in (repo / "calc.py").read_text()
    assert out.content.startswith("Edited calc.py")
    assert "return a + b" in out.content  # the model sees the result of its edit
    assert out.content.endswith("Run the tests to check the fix.")


def test_edit_names_the_test_command_as_the_next_step(repo: Path) -> None:
    box = Toolbox(DirSandbox(repo), AgentSettings(), test_command="python -m pytest -q")
    out = box.call("edit_file", args(path="calc.py", old="a - b", new="a + b"))
    assert out.content.endswith("Run the tests to check the fix: python -m pytest -q")


def test_an_edit_is_seen_by_the_next_run_even_when_python_cached_the_file_in_the_same_second(
    box: Toolbox, repo: Path
) -> None:
    """Python reuses a .pyc whose recorded mtime (whole seconds) and size match the source. Seen in CI: a scripted
    edit of the same size, made in the same second as the test run that compiled the file, was not run by the
    next test run. Pinning the mtime makes that same second certain here."""
    same_second = "touch -d @1500000000 calc.py && PYTHONDONTWRITEBYTECODE= python -c 'import calc; print(calc.add(2, 3))'"
    assert box.run(same_second).content.rstrip().endswith("-1")
    assert box.call("edit_file", args(path="calc.py", old="a - b", new="a + b")).ok
    assert box.run(same_second).content.rstrip().endswith("5")


def test_edit_accepts_absolute_path_inside_repo(box: Toolbox, repo: Path) -> None:
    out = box.call("edit_file", args(path=f"{repo}/calc.py", old="a - b", new="a + b"))
    assert out.ok, out.content


def test_edit_old_not_found_shows_closest_lines_as_they_are(box: Toolbox, repo: Path) -> None:
    out = box.call("edit_file", args(path="calc.py", old="return a-b", new="return a + b"))
    assert not out.ok and not out.format_error
    assert "not found in calc.py" in out.content
    # the line range, then the lines exactly as in the file (no "2|" prefixes for a small model to copy into old)
    assert "lines 1-3:\ndef add(a, b):\n    return a - b\n" in out.content
    assert "|" not in out.content
    assert "copy them exactly into old" in out.content
    assert (repo / "calc.py").read_text().count("a - b") == 1  # unchanged


def test_plain_edit_file_says_only_that_old_is_not_there_and_the_closest_lines(box: Toolbox) -> None:
    """Plain means plain: no lookups in other files for the model, and a refused test file is only refused."""
    out = box.call(
        "edit_file", args(path="calc.py", old="assert add(2, 3) == 5", new="assert add(2, 3) == 6")
    )
    assert out.content.startswith("Error: The text in old was not found in calc.py, so nothing was changed.")
    assert "test file" not in out.content and "The test calls" not in out.content
    refused = box.call("edit_file", args(path="tests/test_calc.py", old="== 5", new="== -1"))
    assert "is a test file" in refused.content and "calc.py" not in refused.content.split("edited.", 1)[1]


def test_the_class_under_test_is_found_after_many_other_imported_names(tmp_path: Path) -> None:
    """Seen on prettytable: the standard library's and a plugin's names came first, and a cap of 12 names left
    out PrettyTable, so the package's __init__ was named instead of the module defining the class."""
    others = ", ".join(f"NAME_{i}" for i in range(14))
    files = {
        "src/table/__init__.py": "from .table import Table\n",
        "src/table/table.py": "class Table:\n    pass\n",
        "tests/test_table.py": f"from __future__ import annotations\nfrom math import e, pi, sqrt\n"
        f"from table import (\n    {others},\n    Table,\n)\n\n\ndef test_it():\n    assert Table()\n",
    }
    box = Toolbox(DirSandbox(make_repo(tmp_path / "table", files)), AgentSettings())
    test = str(tmp_path / "table" / "tests" / "test_table.py")
    assert code_under_test(box, test, "tests/test_table.py")[1] == ["src/table/table.py"]


def test_the_code_under_test_that_the_failing_statement_calls_comes_first(tmp_path: Path) -> None:
    """Seen on attrs: the test imported from two modules, grep listed the one with the exception classes first,
    and the model read and edited that one; the failing statement called a function of the other."""
    files = {
        "pkg/__init__.py": "",
        "pkg/errors.py": "class Frozen(Exception):\n    pass\n",
        "pkg/make.py": "def is_class_var(annot):\n    return False\n",
        # names over several lines, in parentheses (seen on prettytable: they were missed, and the package's
        # __init__ named instead of the module defining them)
        "tests/test_make.py": "from pkg.errors import Frozen\nfrom pkg.make import (\n    is_class_var,\n)\n\n\n"
        "def test_it():\n    assert is_class_var('x')\n",
    }
    repo = make_repo(tmp_path / "pkgrepo", files)
    box = Toolbox(DirSandbox(repo), AgentSettings())
    test = str(repo / "tests" / "test_make.py")
    _, plain = code_under_test(box, test, "tests/test_make.py")
    assert sorted(plain) == ["pkg/errors.py", "pkg/make.py"]
    _, ranked = code_under_test(box, test, "tests/test_make.py", prefer="assert is_class_var('x')")
    assert ranked[0] == "pkg/make.py" and sorted(ranked) == sorted(plain)


JOINED = args(path="calc.py", old="def add(a, b): return a - b", new="def add(a, b): return a + b")


def test_plain_edit_file_refuses_an_old_that_matches_only_loosely_and_says_why(
    box: Toolbox, repo: Path
) -> None:
    """Plain means plain: an `old` that differs from the file in whitespace is not applied for the model; the
    error says that it differs only in whitespace and shows the lines as they are."""
    before = (repo / "calc.py").read_text()
    out = box.call("edit_file", JOINED)
    assert not out.ok and not out.format_error
    assert "was not found in calc.py, so nothing was changed" in out.content
    assert "differs from the file only in spaces, indentation or line breaks" in out.content
    assert "def add(a, b):\n    return a - b" in out.content
    assert (repo / "calc.py").read_text() == before


def test_edit_that_breaks_python_syntax_is_refused(box: Toolbox, repo: Path) -> None:
    before = (repo / "calc.py").read_text()
    out = box.call(
        "edit_file", args(path="calc.py", old="    return a - b", new="  return a + b\n    x = (1")
    )
    assert not out.ok
    assert "calc.py would no longer be valid Python" in out.content and "The file is unchanged" in out.content
    assert "2|    return a - b" in out.content  # the lines as they still are, not as they would have been
    assert (repo / "calc.py").read_text() == before


def test_old_equal_to_new_but_absent_reports_not_found(box: Toolbox) -> None:
    """A model that believes an edit was made repeats it with old == new: show it the real lines instead."""
    out = box.call("edit_file", args(path="calc.py", old="return a + b", new="return a + b"))
    assert (
        "was not found in calc.py" in out.content
        and "lines 1-3:\ndef add(a, b):\n    return a - b" in out.content
    )
    same = box.call("edit_file", args(path="calc.py", old="return a - b", new="return a - b"))
    assert "old and new are the same" in same.content


def test_non_python_files_are_not_syntax_checked(box: Toolbox, repo: Path) -> None:
    out = box.call("edit_file", args(path="pyproject.toml", old='pythonpath = ["."]', new="pythonpath = [(("))
    assert out.ok, out.content


def test_edit_several_matches_says_how_many_and_where(box: Toolbox, repo: Path) -> None:
    out = box.call("edit_file", args(path="calc.py", old="(a, b):", new="(a, b, c):"))
    assert not out.ok
    assert "occurs 2 times" in out.content and "lines 1, 5" in out.content
    assert "more of the surrounding lines" in out.content
    assert "(a, b, c)" not in (repo / "calc.py").read_text()


def test_edit_with_empty_old_creates_file_and_parents(box: Toolbox, repo: Path) -> None:
    out = box.call("edit_file", args(path="pkg/util.py", old="", new="X = 1\n"))
    assert out.ok, out.content
    assert (repo / "pkg/util.py").read_text() == "X = 1\n"


def test_edit_with_empty_old_refuses_to_overwrite_a_file_with_content(box: Toolbox, repo: Path) -> None:
    before = (repo / "calc.py").read_text()
    out = box.call("edit_file", args(path="calc.py", old="", new="oops\n"))
    assert not out.ok
    assert "already exists and is not empty" in out.content
    assert (repo / "calc.py").read_text() == before


def test_edit_refuses_test_files(box: Toolbox, repo: Path) -> None:
    for path in ("tests/test_calc.py", "conftest.py", "pkg/test_more.py", "src/x_test.py"):
        out = box.call("edit_file", args(path=path, old="", new="x"))
        assert not out.ok, path
        assert "is a test file" in out.content and "the bug is in the code under test" in out.content
    assert not (repo / "conftest.py").exists()
    assert "assert add(2, 3) == 5" in (repo / "tests/test_calc.py").read_text()


def test_the_code_under_test_is_past_a_re_exporting_package_in_the_defining_module(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "pkgrepo",
        {
            "textstats/__init__.py": "from .core import word_count\n",
            "textstats/core.py": "def word_count(text):\n    return len(text.split(' '))\n",
            "tests/test_core.py": "from textstats import word_count\n\n\ndef test_wc():\n    assert word_count('a  b') == 2\n",
        },
    )
    box = Toolbox(DirSandbox(repo), AgentSettings())
    test = str(repo / "tests" / "test_core.py")
    assert code_under_test(box, test, "tests/test_core.py") == (["word_count"], ["textstats/core.py"])


def test_the_code_under_test_of_a_plain_import_is_the_module_file(tmp_path: Path) -> None:
    files = {
        "calc.py": "def add(a, b):\n    return a - b\n",
        "test_calc.py": "import calc\n\n\ndef test_add():\n    assert calc.add(1, 1) == 2\n",
    }
    repo = make_repo(tmp_path / "plain", files)
    box = Toolbox(DirSandbox(repo), AgentSettings())
    assert code_under_test(box, str(repo / "test_calc.py"), "test_calc.py")[1] == ["calc.py"]


def test_list_files_shallowest_first(box: Toolbox) -> None:
    files, more = box.list_files(limit=2)
    assert files == ["calc.py", "pyproject.toml"] and more == 1


def test_edit_refuses_a_symlink_to_a_test_file(box: Toolbox, repo: Path) -> None:
    (repo / "alias.py").symlink_to(repo / "tests/test_calc.py")
    out = box.call("edit_file", args(path="alias.py", old="== 5", new="== -1"))
    assert not out.ok and "is a test file" in out.content


def test_protected_paths_from_the_task_are_refused(repo: Path) -> None:
    box = Toolbox(DirSandbox(repo), AgentSettings(), protected_paths=["calc.py"])
    out = box.call("edit_file", args(path="calc.py", old="a - b", new="a + b"))
    assert not out.ok and "is a test file" in out.content


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "sub/../../outside.txt", "/tmp"])
def test_paths_leaving_the_repo_are_refused(box: Toolbox, repo: Path, path: str) -> None:
    (repo.parent / "outside.txt").write_text("secret\n")
    for out in (
        box.call("read_file", args(path=path)),
        box.call("edit_file", args(path=path, old="secret", new="changed")),
    ):
        assert not out.ok
        assert "outside the repository" in out.content
        assert "secret" not in out.content.split("\n", 1)[-1]
    assert (repo.parent / "outside.txt").read_text() == "secret\n"


def test_symlink_pointing_out_of_the_repo_is_refused(box: Toolbox, repo: Path) -> None:
    (repo.parent / "outside.txt").write_text("secret\n")
    (repo / "link.txt").symlink_to(repo.parent / "outside.txt")
    (repo / "linkdir").symlink_to(repo.parent)
    for path in ("link.txt", "linkdir/outside.txt"):
        read = box.call("read_file", args(path=path))
        assert not read.ok and "outside the repository" in read.content and "secret" not in read.content
        edit = box.call("edit_file", args(path=path, old="secret", new="changed"))
        assert not edit.ok and "outside the repository" in edit.content
    assert (repo.parent / "outside.txt").read_text() == "secret\n"


# -- read_file -----------------------------------------------------------------------------------------------


def test_read_file_returns_content(box: Toolbox) -> None:
    out = box.call("read_file", args(path="calc.py"))
    assert out.ok
    assert out.content.splitlines()[0] == "calc.py (6 lines):"
    assert "    return a - b" in out.content


def test_read_file_line_range_of_a_long_file(repo: Path) -> None:
    (repo / "long.py").write_text("".join(f"v{i} = {i}\n" for i in range(1, 4001)))
    box = Toolbox(DirSandbox(repo), AgentSettings())
    out = box.call("read_file", args(path="long.py", start_line=3000, end_line=3001))
    assert out.ok
    assert out.content.splitlines() == ["long.py, lines 3000-3001 of 4000:", "v3000 = 3000", "v3001 = 3001"]


def test_a_short_file_is_read_whole_whatever_the_range_under_small_model_only(box: Toolbox) -> None:
    one_line = args(path="calc.py", start_line=1, end_line=1)
    out = small(box).call("read_file", one_line)
    assert out.content.splitlines()[0] == "calc.py (6 lines):" and "return a - b" in out.content
    plain = box.call("read_file", one_line)
    assert plain.content == "calc.py, lines 1-1 of 6:\ndef add(a, b):"


def test_read_file_is_capped_and_says_where_to_go_on(repo: Path) -> None:
    (repo / "big.py").write_text("".join(f"x{i} = {i}\n" for i in range(5000)))
    box = Toolbox(DirSandbox(repo), AgentSettings(read_file_max_chars=20000))
    out = box.call("read_file", args(path="big.py"))
    assert out.ok
    assert len(out.content) < 20000 + 400
    assert "only 20000 characters are shown" in out.content
    next_line = int(out.content.rsplit("start_line ", 1)[1].split(".")[0])
    shown_last = out.content.splitlines()[-2]
    assert (
        shown_last == f"x{next_line - 2} = {next_line - 2}"
    )  # the next read starts right after the last line shown
    more = box.call("read_file", args(path="big.py", start_line=next_line))
    assert more.content.splitlines()[1] == f"x{next_line - 1} = {next_line - 1}"


def test_read_file_missing_and_directory(box: Toolbox) -> None:
    missing = box.call("read_file", args(path="nope.py"))
    assert not missing.ok and "there is no file 'nope.py'" in missing.content
    folder = box.call("read_file", args(path="tests"))
    assert not folder.ok and "is a directory" in folder.content


# -- arguments and unknown tools -----------------------------------------------------------------------------


def test_bad_json_quotes_what_was_sent_and_describes_valid_arguments(box: Toolbox) -> None:
    sent = '{"command": "pytest -q'
    out = box.call("run", sent)
    assert out.format_error
    assert "not valid JSON" in out.content
    assert repr(sent) in out.content
    assert '"command"' in out.content and "Call run again" in out.content


def test_bad_json_quote_is_cut_to_its_start(box: Toolbox) -> None:
    out = box.call("edit_file", '{"path": "calc.py", "old": ' + "x" * 1000)
    assert out.format_error and "x" * 150 in out.content and "x" * 300 not in out.content


def test_double_encoded_arguments_are_accepted(box: Toolbox) -> None:
    out = box.call("read_file", json.dumps(json.dumps({"path": "calc.py"})))
    assert out.ok, out.content


def test_raw_line_breaks_inside_json_strings_are_accepted(box: Toolbox, repo: Path) -> None:
    raw = '{"path": "calc.py", "old": "def add(a, b):\n    return a - b", "new": "def add(a, b):\n    return a + b"}'
    assert "\n" in raw  # a real line break inside the JSON string, not the escape
    out = box.call("edit_file", raw)
    assert out.ok, out.content
    assert "return a + b" in (repo / "calc.py").read_text()


def test_missing_argument_is_a_format_error(box: Toolbox) -> None:
    out = box.call("edit_file", args(path="calc.py", old="a - b"))
    assert out.format_error
    assert 'edit_file needs "new"' in out.content


def test_wrong_argument_type(box: Toolbox) -> None:
    out = box.call("run", args(command=["ls", "-l"]))
    assert out.format_error and '"command" of run must be a string' in out.content


def test_unknown_tool_lists_the_four_tools(box: Toolbox) -> None:
    out = box.call("bash", args(command="ls"))
    assert out.format_error
    assert "run, read_file, edit_file and finish" in out.content
    assert "To run a shell command, call run." in out.content


def test_finish_ends_with_summary(box: Toolbox) -> None:
    out = box.call("finish", args(summary="fixed add"))
    assert out.finished and out.summary == "fixed add"
    assert box.call("finish", "{}").finished  # a bare finish still ends the run


# -- run (on the stand-in; the real sandbox is exercised in test_agent_loop.py) -----------------------------


def test_run_reports_exit_code_and_tail(repo: Path) -> None:
    box = Toolbox(DirSandbox(repo), AgentSettings(output_tail_chars=100))
    out = box.call("run", args(command="seq 1 1000; exit 3"))
    assert out.exit_code == 3 and not out.ok
    assert out.content.startswith("Exit code: 3\n[output cut: these are the last 100 characters]")
    assert out.content.endswith("1000\n")
    assert "\n1\n" not in out.content


# -- closest lines and text tool-call recovery ---------------------------------------------------------------


def test_closest_lines_finds_the_similar_block() -> None:
    content = "".join(f"line {i}\n" for i in range(1, 200)) + "def total(items):\n    return sum(items) - 1\n"
    found = closest_lines(content, "def total(items):\n    return sum(item) - 1")
    assert found.startswith("lines 199-201:\n")
    assert "\ndef total(items):\n    return sum(items) - 1" in found


def test_closest_lines_empty_when_nothing_is_similar() -> None:
    assert closest_lines("aaaa\nbbbb\n", "zzzzzzzzzzzz qqqqq") == ""


def test_recover_fenced_json_tool_call() -> None:
    text = 'I will run the tests.\n```json\n{"name": "run", "arguments": {"command": "pytest -q"}}\n```'
    [call] = recover_text_tool_calls(text)
    assert call.name == "run" and json.loads(call.arguments) == {"command": "pytest -q"} and call.recovered


def test_recover_tool_call_tags_and_parameters_key() -> None:
    text = (
        '<tool_call>\n{"name": "read_file", "parameters": {"path": "calc.py"}}\n</tool_call>\n'
        '<tool_call>{"name": "finish", "arguments": "{\\"summary\\": \\"done\\"}"}'
    )
    calls = recover_text_tool_calls(text)
    assert [c.name for c in calls] == ["read_file", "finish"]
    assert json.loads(calls[1].arguments) == {"summary": "done"}


def test_ordinary_json_in_a_reply_is_not_a_tool_call() -> None:
    assert recover_text_tool_calls('```json\n{"name": "mypkg", "version": "1.0"}\n```') == []
    assert recover_text_tool_calls("no code here") == []


def test_prompts_have_no_placeholders() -> None:
    """Small models copy placeholders verbatim: the model-facing text must not contain any."""
    text = prompts.system_prompt() + json.dumps(prompts.tool_schemas(300, 6000, 20000))
    text += "".join(tool_specs.ARGUMENT_SHAPES.values())
    for marker in ("/path/to", "<", "your_", "example.py", "foo", "TODO", "..."):
        assert marker not in text, marker


def test_binary_files_are_neither_shown_nor_rewritten(box: Toolbox, repo: Path) -> None:
    blob = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"
    (repo / "logo.png").write_bytes(blob)
    assert "not a text file" in box.call("read_file", args(path="logo.png")).content
    assert "not a text file" in box.call("edit_file", args(path="logo.png", old="PNG", new="GIF")).content
    assert (repo / "logo.png").read_bytes() == blob


def test_read_files_description_says_what_each_policy_does_with_a_range() -> None:
    from bugsweep.agent import prompts

    def described(whole: bool) -> str:
        (read,) = [t for t in prompts.tool_schemas(30, 6000, 20000, short_files_whole=whole)
                   if t["function"]["name"] == "read_file"]  # fmt: skip
        return str(read["function"]["description"])

    assert "the lines from start_line to end_line" in described(False)
    assert "A file of up to 20000 characters is returned whole." in described(True)


def test_each_tool_is_declared_once_and_the_model_the_loop_and_the_prompt_agree(box: Toolbox) -> None:
    """The schema sent to the model, the required arguments and types the loop checks, the tool the loop runs,
    the system prompt's list and the error messages are all made from tool_specs.TOOLS: a tool added (or an argument
    made required) in one place only fails here."""
    import inspect
    import re

    names = [tool.name for tool in tool_specs.TOOLS]
    schemas = {s["function"]["name"]: s["function"] for s in prompts.tool_schemas(300, 6000, 20000)}
    assert list(schemas) == names == list(tool_specs.TOOL_NAMES) == list(tool_specs.ARGUMENT_SHAPES)
    assert re.findall(r"^- (\w+): ", prompts.system_prompt(), re.M) == names, "the prompt lists every tool"
    listed = prompts.unknown_tool("nope")
    assert all(f"{name}" in listed for name in names), listed
    for tool in tool_specs.TOOLS:
        schema = schemas[tool.name]["parameters"]
        assert list(schema["properties"]) == [a.name for a in tool.arguments]
        assert schema["required"] == tool.required
        method = getattr(Toolbox, tool.name)  # the tool the loop runs for this name
        parameters = list(inspect.signature(method).parameters.values())[1:]
        assert [p.name for p in parameters] == [a.name for a in tool.arguments], tool.name
        assert [p.name for p in parameters if p.default is inspect.Parameter.empty] == tool.required, (
            tool.name
        )
        for missing in tool.required:
            sent = {a.name: "x" for a in tool.arguments if a.required and a.name != missing}
            outcome = box.call(tool.name, sent)
            assert outcome.format_error and f'"{missing}"' in outcome.content, (tool.name, missing)
        for argument in (a for a in tool.arguments if a.kind == "string"):
            sent = {**{a.name: "x" for a in tool.arguments if a.required}, argument.name: 3}
            outcome = box.call(tool.name, sent)
            assert (
                outcome.format_error
                and f'"{argument.name}" of {tool.name} must be a string' in outcome.content
            )
    finished = box.call("finish", {})
    assert finished.finished and not finished.format_error, "finish's summary is optional, as its schema says"
