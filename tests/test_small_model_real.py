"""The `small-model` policy's help for real repositories (bugsweep/agent/small_model/, focus.py).

Real parts: HTTP to tests.support.scripted_model on 127.0.0.1, the local sandbox (bubblewrap) with a real git repo
and pytest inside it, the trajectory on disk. Stand-in: the model (a scripted stand-in: a script of replies, not a
model). Each test checks what the model is sent, as a user reading the conversation would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from bugsweep.agent.focus import (
    FIRST_PROMPT_MAX_CHARS,
    failure_digest,
    focus_test_output,
    normalised_matches,
    what_is_new,
)
from bugsweep.agent.loop import run_agent
from bugsweep.agent.model import ChatModel
from bugsweep.agent.trajectory import load
from bugsweep.sandbox import RepoSource, Sandbox, get_provider
from bugsweep.sandbox.local import LocalProvider
from bugsweep.settings import AgentSettings, ModelSettings, SandboxSettings
from tests.support.repos import BUGGY_CALC, make_repo, with_pytest
from tests.support.scripted_model import ScriptedModelServer, text_reply, tool_call

SMALL = AgentSettings(policy="small-model")
TEST_COMMAND = "python -m pytest -q"


def sandbox_for(repo: Path) -> Iterator[Sandbox]:
    sbx = get_provider("local").create(RepoSource(str(repo)))
    with with_pytest(sbx):
        yield sbx


@pytest.fixture
def sandbox(buggy_repo: Path) -> Iterator[Sandbox]:
    yield from sandbox_for(buggy_repo)


def solve(
    server: ScriptedModelServer, sandbox: Sandbox, tmp_path: Path, settings: AgentSettings = SMALL
) -> Any:
    model = ChatModel(
        ModelSettings(base_url=server.base_url, model="scripted", api_key=SecretStr("k")),
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
    )
    return run_agent(
        task="add() returns the wrong result. Fix it.",
        sandbox=sandbox,
        model=model,
        settings=settings,
        trajectory_path=tmp_path / "run" / "trajectory.json",
        test_command=TEST_COMMAND,
    )


def last_tool_text(request: dict[str, Any]) -> str:
    return str([m for m in request["messages"] if m["role"] == "tool"][-1]["content"])


FINISH = tool_call("finish", summary="done")


# -- pure helpers ------------------------------------------------------------------------------------------------


PYTEST_OUTPUT = (
    "tests/test_a.py ........................................................ [ 50%]\n"
    "tests/test_b.py .......................................F................ [100%]\n"
    "=================================== FAILURES ===================================\n"
    "___________________________________ test_add ___________________________________\n"
    "    def test_add():\n>       assert add(2, 3) == 5\nE       assert -1 == 5\n\n"
    "tests/test_b.py:5: AssertionError\n"
    "=========================== short test summary info ============================\n"
    "FAILED tests/test_b.py::test_add - assert -1 == 5\n"
    "1 failed, 111 passed in 0.20s\n"
)


def test_focused_output_keeps_the_failure_and_drops_the_dots() -> None:
    focused = focus_test_output(PYTEST_OUTPUT)
    assert focused is not None
    assert "assert -1 == 5" in focused and "FAILED tests/test_b.py::test_add" in focused
    assert "......" not in focused
    assert focus_test_output("3 passed in 0.1s\n") is None  # nothing failed: the output stays as it is


def test_the_failure_digest_is_each_failing_statement_and_its_explanation_once() -> None:
    assert failure_digest(PYTEST_OUTPUT) == "assert add(2, 3) == 5\nassert -1 == 5"
    twice = PYTEST_OUTPUT.replace(
        "FAILURES =", "FAILURES =\n>   assert add(2, 3) == 5\nE   assert -1 == 5\n", 1
    )
    assert failure_digest(twice) == "assert add(2, 3) == 5\nassert -1 == 5"  # each line once
    many = "== FAILURES ==\n" + "".join(f"E   line {i}\n" for i in range(20))
    assert failure_digest(many, max_lines=3) == "line 0\nline 1\nline 2\n[... 17 more lines]"
    assert failure_digest("3 passed in 0.1s\n") is None


def test_normalised_matching_and_what_is_new() -> None:
    content = "def greet(name):\n    return 'hello, ' + name\n"
    assert normalised_matches(content, 'return "hello, "  +  name') == [(21, 44)]
    assert content[21:44] == "return 'hello, ' + name"
    assert normalised_matches(content, "return 'bye'") == []
    assert what_is_new("a\nb\nc", "a\nb\nd\ne") == ["d", "e"]


# -- through the loop --------------------------------------------------------------------------------------------


def test_first_prompt_stays_small_on_a_repository_of_1000_files(scripted_model, tmp_path: Path) -> None:
    """The plain first message lists the repository's files; small-model's holds the failing test and its
    traceback instead, under FIRST_PROMPT_MAX_CHARS, on a repository of 1,000 files."""
    files = dict(BUGGY_CALC)
    files.update({f"pkg/sub{i // 100}/module_{i:04d}.py": f"X = {i}\n" for i in range(997)})
    repo = make_repo(tmp_path / "big", files)
    assert len(files) == 1000
    for settings in (AgentSettings(policy="plain"), SMALL):
        server = scripted_model([FINISH])
        for sbx in sandbox_for(repo):
            solve(server, sbx, tmp_path / settings.policy, settings)  # type: ignore[operator]
        first = server.requests[0]["messages"][1]["content"]
        if settings.policy == "plain":
            assert "pkg/sub0/module_0000.py" in first  # the file list
            plain_size = len(first)
            continue
        assert len(first) <= FIRST_PROMPT_MAX_CHARS, len(first)
        assert len(first) < plain_size, (len(first), plain_size)
        assert "module_0000" not in first
        assert "tests/test_calc.py::test_add" in first  # the failing test, named
        assert "assert add(2, 3) == 5" in first  # and its failing assertion
        assert "Files that matter here:\ncalc.py\ntests/test_calc.py" in first  # the code under test first
        events = load(tmp_path / "small-model" / "run" / "trajectory.json")
        assert any(e.get("type") == "first_prompt_focused" for e in events)


def test_a_repeated_command_is_answered_with_what_is_new(
    scripted_model, sandbox: Sandbox, tmp_path: Path
) -> None:
    run_tests = tool_call("run", command=TEST_COMMAND)
    show = tool_call("run", command="cat calc.py")
    fix = tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")
    server = scripted_model(
        [run_tests, run_tests, show, tool_call("read_file", path="calc.py"), fix, show, FINISH]
    )
    solve(server, sandbox, tmp_path)
    first, again = last_tool_text(server.requests[1]), last_tool_text(server.requests[2])
    assert "same command" not in first
    assert again.endswith(
        "Note: this is the same command as in turn 1, and its output is the same: nothing it checks has changed "
        "since. Running it again will not help. Change the code first: read the function the failing test calls, "
        "then edit it."
    )
    after_fix = last_tool_text(server.requests[6])
    assert "same command as in turn 3. What is new in its output since then:\n    return a + b" in after_fix
    # the test output the model sees is focused on the failure
    assert "[test output focused on the failures]" in first and "assert -1 == 5" in first


def test_an_edit_to_an_unread_file_gets_the_region_most_like_its_old(
    scripted_model, sandbox: Sandbox, tmp_path: Path
) -> None:
    # An `old` that means no one function (its words are in both of calc.py's); one that does is asked for whole
    # (tests/test_agent_loop.py, test_an_edit_whose_old_matches_nowhere_asks_for_the_function_it_means).
    wrong = tool_call("edit_file", path="calc.py", old="result = a-b", new="result = a+b")
    server = scripted_model([wrong, FINISH])
    solve(server, sandbox, tmp_path)
    text = server.requests[1]["messages"][-1][
        "content"
    ]  # the failed call's note (it leaves the conversation)
    assert "The text in old was not found in calc.py, so nothing was changed." in text
    assert "You have not read calc.py" in text
    assert "def add(a, b):\n    return a - b" in text  # the real lines, to copy
    assert sandbox.files.read_text("/workspace/repo/calc.py") == BUGGY_CALC["calc.py"]


def test_a_full_context_window_keeps_the_failing_assertion(
    scripted_model, sandbox: Sandbox, tmp_path: Path
) -> None:
    """When the endpoint says the conversation no longer fits its 8k window, the oldest tool outputs are elided;
    the failing assertion stays, since small-model's first message holds it and first messages are never elided."""
    too_long = {
        "status": 400,
        "body": {"error": {"message": "This model's maximum context length is 8192 tokens"}},
    }
    server = scripted_model(
        [tool_call("run", command="seq 1 2000"), tool_call("run", command="seq 5000 7000"), too_long, FINISH]
    )
    result = solve(server, sandbox, tmp_path)
    assert result.stop_reason == "finished"
    retried = server.requests[3]["messages"]
    assert (
        "assert add(2, 3) == 5" in retried[1]["content"]
        and "tests/test_calc.py::test_add" in retried[1]["content"]
    )
    tool_texts = [m["content"] for m in retried if m["role"] == "tool"]
    assert (
        "2000" not in tool_texts[0] and "7000" in tool_texts[1]
    )  # the oldest output went, the newest stayed


def test_under_the_plain_policy_finish_ends_the_run_whatever_the_tests(
    scripted_model, sandbox: Sandbox, tmp_path: Path
) -> None:
    server = scripted_model([FINISH, FINISH])
    result = solve(server, sandbox, tmp_path, settings=AgentSettings(policy="plain"))
    assert result.stop_reason == "finished" and result.turns == 1


RAISING_CALC = {
    **BUGGY_CALC,
    "calc.py": "def add(a, b):\n    return a + None\n\n\ndef mul(a, b):\n    return a * b\n",
}


def test_a_test_run_repeated_with_nothing_changed_asks_for_the_function_where_the_traceback_ends(
    scripted_model, tmp_path: Path
) -> None:
    """Seen on real bugs (cachetools, bench/README.md): the same failing test run ten times in a row to the end of
    the turns, each answered with the note that nothing had changed. The traceback ended in the function the real
    fix changed; asked for it whole, the model could write the fix. So the second identical run is followed by
    that request (once per function)."""
    repo = make_repo(tmp_path / "raising", RAISING_CALC)
    run_tests = tool_call("run", command=TEST_COMMAND)
    server = scripted_model(
        [run_tests, run_tests, text_reply("```python\ndef add(a, b):\n    return a + b\n```"), FINISH]
    )
    for sbx in sandbox_for(repo):
        result = solve(server, sbx, tmp_path)
        assert sbx.files.read_text("/workspace/repo/calc.py").startswith("def add(a, b):\n    return a + b\n")
    assert result.stop_reason == "finished"
    assert server.requests[1]["messages"][-1]["role"] == "tool", "the first run: no request"
    sent = server.requests[2]["messages"]
    assert sent[-2]["role"] == "tool" and "same command as in turn 1" in sent[-2]["content"]
    assert sent[-1]["role"] == "user" and sent[-1]["content"].startswith(
        "The failing tests' traceback ends in the function add (calc.py, lines 1-2). It now reads:\n"
        "```python\ndef add(a, b):\n    return a + None\n```"
    )
    asked = [e for e in load(tmp_path / "run" / "trajectory.json") if e["type"] == "rewrite_requested"]
    assert [(e["function"], e["stuck"]) for e in asked] == [("add", True)]


def test_a_repeated_run_whose_traceback_ends_in_a_test_asks_for_nothing(
    scripted_model, sandbox: Sandbox, tmp_path: Path
) -> None:
    run_tests = tool_call("run", command=TEST_COMMAND)
    server = scripted_model([run_tests, run_tests, FINISH, FINISH])
    solve(server, sandbox, tmp_path)
    assert (
        server.requests[2]["messages"][-1]["role"] == "tool"
    )  # an assertion in the test: no function to ask for
    assert not [e for e in load(tmp_path / "run" / "trajectory.json") if e["type"] == "rewrite_requested"]


def test_a_whole_function_written_on_a_full_disk_is_answered_with_what_to_delete(
    scripted_model, buggy_repo: Path, tmp_path: Path
) -> None:
    """The policy writes files outside a tool call (the function from a code block, a tried edit put back): on a
    full disk that is a message to the model, not a crash of the run. A 64 MiB quota, filled by the model (the
    scripted server, a stand-in, not a model)."""
    settings = SandboxSettings(disk_mib=64)
    provider = LocalProvider(settings, cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")
    padded = "```python\ndef add(a, b):\n" + "    # a long comment\n" * 60_000 + "    return a + b\n```"
    server = scripted_model(
        [
            tool_call("run", command="cat /dev/zero > /tmp/fill; true"),
            tool_call("edit_file", path="calc.py", old="return a - b", new="return a - b + 0"),
            text_reply(padded),  # the whole function, asked for: about 1 MiB, more than the disk has left
            tool_call("run", command="rm /tmp/fill"),
            FINISH,
            FINISH,
        ]
    )
    with with_pytest(provider.create(RepoSource(str(buggy_repo)))) as sbx:
        result = solve(server, sbx, tmp_path, AgentSettings(policy="small-model", rewrite_samples=0))
        assert "return a - b\n" in sbx.files.read_text("/workspace/repo/calc.py"), (
            "the tried edit was put back"
        )
    assert result.stop_reason == "finished"
    answer = server.requests[3]["messages"][-1]
    assert answer["role"] == "user" and answer["content"].startswith("Error: the edit was not made")
    assert "Delete files" in answer["content"]
