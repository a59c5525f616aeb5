"""docs/first-night.md, run as written: every ```bash block of the page, in order, as one bash script.

Real parts: SeaweedFS (`weed mini`) and `prefect server start` as the page starts them, `bugsweep blocks create`,
`bugsweep mine`, `bugsweep deploy`, `bugsweep worker` (a process worker), `prefect deployment run --watch`, the
local sandbox. What the test changes, and only by replacing the text below: the ports (free ones), the folder
(a temporary one, also as $HOME), the model endpoint (the scripted stand-in: real HTTP, it finishes at once, so
each task is graded "not resolved"), and the repository to mine (a local one with real fix commits).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.scripted_model import ScriptedModelServer, tool_call

pytestmark = [pytest.mark.prefect, pytest.mark.s3]

PROJECT = Path(__file__).resolve().parent.parent
PAGE = PROJECT / "docs" / "first-night.md"


def page_script() -> str:
    return "\n".join(re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S))


def replace(script: str, old: str, new: str) -> str:
    assert old in script, f"docs/first-night.md no longer says {old!r}: update this test with the page"
    return script.replace(old, new)


def stop_group(pgid: int) -> None:
    """SIGTERM to the process group the page's script started in (its background servers and worker are in it),
    then SIGKILL to whatever is still there after 20 s."""
    for sig, wait_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def test_the_first_night_walkthrough_runs_as_written_and_the_nightly_completes(tmp_path: Path) -> None:
    import boto3

    from tests.support.seaweed import _PORT_FLAGS, free_ports
    from tests.test_mining import build_history

    repo = tmp_path / "your-app"
    build_history(repo)
    model = ScriptedModelServer([tool_call("finish", summary="looked")] * 50).start()
    ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS)), strict=True))
    prefect_port = free_ports(1)[0]
    night = tmp_path / "night"
    script = page_script()
    script = replace(
        script,
        'export S3_PORT=8333 PREFECT_PORT=4200 NIGHT_DIR="$HOME/bugsweep-night"',
        f'export S3_PORT={ports["s3.port"]} PREFECT_PORT={prefect_port} NIGHT_DIR="{night}"',
    )
    others = " ".join(f"-{flag}={port}" for flag, port in ports.items() if flag != "s3.port")
    script = replace(script, '-s3.port="$S3_PORT"', f'-s3.port="$S3_PORT" {others}')
    script = replace(
        script,
        "export LLM_BASE_URL=https://api.deepseek.com/v1 LLM_MODEL=deepseek-chat LLM_API_KEY=sk-your-key",
        f"export LLM_BASE_URL={model.base_url} LLM_MODEL=scripted-model LLM_API_KEY=sk-first-night-key",
    )
    script = replace(script, "https://github.com/your-org/your-app.git", str(repo))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "AWS_", "LLM_", "BUGSWEEP_"))}
    env.update(HOME=str(tmp_path), COLUMNS="200", PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    shell = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script], cwd=PROJECT, env=env, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    with_logs = ""
    try:
        output, _ = shell.communicate(timeout=900)
        for log in ("prefect.log", "worker.log", "s3.log"):
            if (night / log).is_file():
                with_logs += f"\n--- {log}\n" + (night / log).read_text(errors="replace")[-3000:]
        assert shell.returncode == 0, output[-6000:] + with_logs
        assert "sk-first-night-key" not in output and "change-this-secret" not in output
        assert "S3 bucket bugsweep at" in output and "made" in output
        assert (
            "deployed sweep/nightly-sweep" in output
            and "nightly-sweep with its schedule PAUSED" not in output
        )
        assert "Flow run finished successfully in 'Completed'" in output, output[-3000:]
        # quiet on success: no stray shell errors or tracebacks from the commands or the worker running the night
        worker_log = (night / "worker.log").read_text(errors="replace")
        for text, where in ((output, "the walkthrough's output"), (worker_log, "the worker's log")):
            for noise in ("command not found", "Traceback (most recent call last)"):
                assert noise not in text, (
                    f"{noise!r} in {where}:\n" + text[max(0, text.find(noise) - 2000) :][:4000]
                )
        s3 = boto3.client(
            "s3", endpoint_url=f"http://127.0.0.1:{ports['s3.port']}", aws_access_key_id="bugsweep",
            aws_secret_access_key="change-this-secret", region_name="us-east-1",
        )  # fmt: skip
        listed = s3.list_objects_v2(Bucket="bugsweep", Prefix="runs/nightly/").get("Contents", [])
        assert [o["Key"] for o in listed if o["Key"].endswith("/grade.json")], listed
    finally:
        if shell.returncode is None:
            shell.kill()
        stop_group(shell.pid)  # the servers and the worker the page left running
        model.stop()
