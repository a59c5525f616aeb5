"""docs/first-night.md, run as written: every ```bash block of the page, in order, as one bash script.

Real parts: SeaweedFS (`weed mini`) and `prefect server start` as the page starts them, `bugsweep blocks create`,
`bugsweep mine`, `bugsweep deploy`, `bugsweep worker` (a process worker), `bugsweep run --watch`, `bugsweep
review` of the night in S3, the local sandbox. The page's commands run as written: its ports and its folder are
chosen through the variables its first step declares (S3_PORT, PREFECT_PORT, WEED_PORT, NIGHT_DIR), set here to
free ones. What the test changes, and only by replacing the text below: the model endpoint (the scripted stand-in:
real HTTP, it finishes at once, so each task is graded "not resolved") and the repository to mine (a local one
with real fix commits), the two values a team puts in for its own.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.scripted_model import ScriptedModelServer, tool_call

pytestmark = [pytest.mark.prefect, pytest.mark.s3]

PROJECT = Path(__file__).resolve().parent.parent
PAGE = PROJECT / "docs" / "first-night.md"
#: SeaweedFS's own ports: WEED_PORT to WEED_PORT + 8, as the page says.
WEED_PORTS = 9


def page_script() -> str:
    return "\n".join(re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S))


def replace(script: str, old: str, new: str) -> str:
    assert old in script, f"docs/first-night.md no longer says {old!r}: update this test with the page"
    return script.replace(old, new)


def free_run(count: int) -> int:
    """The first of `count` consecutive loopback ports that are free now, below the range the kernel hands out
    to outgoing connections (so none of them is taken by one in the meantime)."""
    import random

    for _ in range(200):
        first = random.randrange(20000, 30000 - count)
        socks = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports")


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (`ss`, iproute2)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if f"pid={pid}," in line}


def pid_of(command: str, marker: str) -> int:
    """The process running `command` whose command line holds `marker`."""
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if (
            cmdline
            and Path(os.fsdecode(cmdline[0])).name == command
            and marker.encode() in b" ".join(cmdline)
        ):
            return int(entry.name)
    raise AssertionError(f"no {command} process with {marker} in its command line")


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

    from tests.support.seaweed import free_ports, remove_grpc_sockets
    from tests.test_mining import build_history

    repo = tmp_path / "your-app"
    build_history(repo)
    model = ScriptedModelServer([tool_call("finish", summary="looked")] * 50).start()
    s3_port, prefect_port = free_ports(2)
    weed_port = free_run(WEED_PORTS)
    night = tmp_path / "night"
    script = page_script()
    script = replace(
        script,
        "export LLM_BASE_URL=https://api.deepseek.com/v1 LLM_MODEL=deepseek-chat LLM_API_KEY=sk-your-key",
        f"export LLM_BASE_URL={model.base_url} LLM_MODEL=scripted-model LLM_API_KEY=sk-first-night-key",
    )
    script = replace(script, "https://github.com/your-org/your-app.git", str(repo))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "AWS_", "LLM_", "BUGSWEEP_"))}
    env.update(HOME=str(tmp_path), COLUMNS="200", PATH=f"{Path(sys.executable).parent}:{env['PATH']}")
    # the temporary folders the worker's flow runs make (Prefect's), and SeaweedFS's log files, in the test's folder
    (tmp_path / "tmp").mkdir()
    env.update(TMPDIR=str(tmp_path / "tmp"))
    env.update(
        S3_PORT=str(s3_port), PREFECT_PORT=str(prefect_port), WEED_PORT=str(weed_port), NIGHT_DIR=str(night)
    )
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
        # the S3 server listens on the ports the page names, and on no other
        weed = pid_of("weed", str(night))
        named = {s3_port, *range(weed_port, weed_port + WEED_PORTS)}
        assert listening_ports(weed) == named, (sorted(listening_ports(weed)), sorted(named))
        # and keeps its files in the night's folder: its S3 gateway's socket is not left in /tmp when it stops
        assert (night / "s3" / "s3.sock").is_socket()
        assert not Path(f"/tmp/seaweedfs-s3-{s3_port}.sock").exists()
        # `bugsweep run --watch`: the run's page, its states, and the night in one line; nothing else
        started = re.search(
            r"^flow run \S+ of sweep/nightly-sweep: http://127\.0\.0\.1:\d+/runs/", output, re.M
        )
        assert started, output[-3000:]
        watched = output[started.start() :].split("\nwrote ")[0].strip().splitlines()
        assert len(watched) <= 7, "\n".join(watched)  # the run, Scheduled (Late), Pending, Running, the end
        assert re.fullmatch(
            r"Completed: sweep nightly COMPLETED: (\d+) task\(s\) graded: 0 resolved, \1 not resolved, 0 held for "
            r"review, 0 could not run",
            watched[-1],
        ), watched
        # the morning's review page, made from the bucket as the page says
        assert (night / "nightly.html").is_file() and "not resolved" in (night / "nightly.html").read_text()
        # quiet on success: no stray shell errors or tracebacks from the commands or the worker running the night
        worker_log = (night / "worker.log").read_text(errors="replace")
        for text, where in ((output, "the walkthrough's output"), (worker_log, "the worker's log")):
            for noise in ("command not found", "Traceback (most recent call last)"):
                assert noise not in text, (
                    f"{noise!r} in {where}:\n" + text[max(0, text.find(noise) - 2000) :][:4000]
                )
        s3 = boto3.client(
            "s3", endpoint_url=f"http://127.0.0.1:{s3_port}", aws_access_key_id="bugsweep",
            aws_secret_access_key="change-this-secret", region_name="us-east-1",
        )  # fmt: skip
        listed = s3.list_objects_v2(Bucket="bugsweep", Prefix="runs/nightly/").get("Contents", [])
        assert [o["Key"] for o in listed if o["Key"].endswith("/grade.json")], listed
    finally:
        if shell.returncode is None:
            shell.kill()
        stop_group(shell.pid)  # the servers and the worker the page left running
        model.stop()
        # the admin server's gRPC sockets, which (unlike the S3 gateway's) the page's servers leave in /tmp
        remove_grpc_sockets(range(weed_port, weed_port + WEED_PORTS))
