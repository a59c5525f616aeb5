"""`deploy()`: create the work pool if it is missing, then deploy everything prefect.yaml lists."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bugsweep.errors import ConfigError, InfraError

#: The deployments prefect.yaml defines, as FLOW/DEPLOYMENT.
DEPLOYMENTS = ("solve-bug/solve-bug", "sweep/nightly-sweep")
PROJECT_DIR = Path(__file__).resolve().parent.parent


@dataclass
class DeployResult:
    pool: str
    pool_created: bool
    deployments: list[str] = field(default_factory=list)
    output: str = ""


def _prefect(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "prefect", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PREFECT_CLI_PROMPT": "false"},
        )
    except subprocess.TimeoutExpired as exc:
        raise InfraError(f"`prefect {' '.join(args)}` did not finish in {timeout:.0f} s") from exc


def ensure_work_pool(name: str, pool_type: str = "process", cwd: Path = PROJECT_DIR) -> bool:
    """Create the work pool unless it exists. Returns True when it was created."""
    if _prefect(["work-pool", "inspect", name], cwd).returncode == 0:
        return False
    created = _prefect(["work-pool", "create", name, "--type", pool_type], cwd)
    if created.returncode != 0:
        raise _failure(f"could not create the {pool_type} work pool {name!r}", created)
    return True


def deploy(
    pool: str = "bugsweep",
    pool_type: str = "process",
    project_dir: Path = PROJECT_DIR,
    prefect_file: str = "prefect.yaml",
) -> DeployResult:
    """Create `pool` if needed and deploy every deployment of `prefect_file` onto it.

    Run from the project folder: process workers run the flows from the folder recorded here.
    """
    if not (project_dir / prefect_file).is_file():
        raise ConfigError(f"no {prefect_file} in {project_dir}: run from the bugsweep project folder")
    result = DeployResult(pool=pool, pool_created=ensure_work_pool(pool, pool_type, project_dir))
    # One deployment at a time: with --all, Prefect ignores --pool.
    for full_name in DEPLOYMENTS:
        name = full_name.split("/", 1)[1]
        done = _prefect(
            ["--no-prompt", "deploy", "--name", name, "--pool", pool, "--prefect-file", prefect_file],
            project_dir,
        )
        if done.returncode != 0:
            raise _failure(f"`prefect deploy --name {name}` failed", done)
        result.deployments.append(full_name)
        result.output += done.stdout
    return result


def worker_command(pool: str) -> str:
    """The command that starts a worker for `pool` (run it on every machine that should take runs)."""
    return f"prefect worker start --pool {pool}"


def _failure(what: str, done: subprocess.CompletedProcess[str]) -> Exception:
    text = (done.stdout + "\n" + done.stderr).strip()[-2000:]
    if "Connect" in text or "connection" in text.lower():
        return InfraError(f"{what}: the Prefect API is not reachable (is PREFECT_API_URL right?)\n{text}")
    return ConfigError(f"{what}:\n{text}")
