"""What a worker image is made of: the project's wheel and the Docker image of docs/pipeline.md ("Scale out").

Real parts: pip and hatchling build the wheel from this checkout; `docker build` builds the repository's
Dockerfile where a Docker daemon answers (the test is skipped, saying why, where none does).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
#: The packages `bugsweep deploy` and a worker import: the flows, their steps, the blocks and the deployer.
PIPELINE_PACKAGES = {"bugsweep", "flows", "tasks", "blocks", "deployments"}


def test_the_wheel_holds_every_package_the_pipeline_imports(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(PROJECT)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("bugsweep-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names if "/" in name and ".dist-info" not in name}
    assert top >= PIPELINE_PACKAGES, f"missing from the wheel: {PIPELINE_PACKAGES - top}"
    assert "deployments/deploy.py" in names and "flows/solve_bug.py" in names
    # `bugsweep review`'s template, style and script are package data
    for asset in ("page.html.j2", "page.css", "page.js"):
        assert f"bugsweep/review/templates/{asset}" in names
    # prefect.yaml is not in the wheel: `bugsweep deploy` runs in the project folder, as the docs say.
    assert not any(name.endswith("prefect.yaml") for name in names)

    # The code a grade names (runconfig.code_digest) is the same for the wheel, imported from where it is unpacked
    # (as pip installs it), and for this checkout (installed editable): exact either way.
    from bugsweep.runconfig import code_digest

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    shown = subprocess.run(
        [sys.executable, "-c", "import bugsweep, bugsweep.runconfig as r; print(bugsweep.__file__, r.code_digest())"],
        env={**env, "PYTHONPATH": str(site)}, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    imported_from, digest = shown.stdout.split()
    assert Path(imported_from).is_relative_to(site), "the wheel's bugsweep was imported"
    assert digest == code_digest(), "the wheel and the editable checkout name the same code"


def docker_unavailable() -> str | None:
    """Why the image cannot be built here, or None."""
    if shutil.which("docker") is None:
        return "no docker command on this machine"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "the Docker daemon did not answer `docker info` within 30 s"
    if info.returncode != 0:
        return f"no Docker daemon answers `docker info`: {(info.stderr or info.stdout).strip()[-200:]}"
    return None


def test_the_docker_image_of_the_docs_builds_and_holds_the_project() -> None:
    """The Dockerfile docs/pipeline.md builds: the CLI runs, the flows and the deployer import, prefect.yaml is in
    the working folder (`bugsweep deploy` runs there), and the local sandbox's programs are installed."""
    reason = docker_unavailable()
    if reason:
        pytest.skip(f"cannot build the Docker image: {reason}")
    tag = f"bugsweep-test:{uuid.uuid4().hex[:8]}"
    base = os.environ.get("BUGSWEEP_TEST_DOCKER_BASE")  # a local Python 3.11 image where no registry answers
    build = ["docker", "build", "-t", tag, *(["--build-arg", f"BASE={base}"] if base else []), str(PROJECT)]
    try:
        subprocess.run(build, check=True, timeout=1800)
        check = (
            "import pathlib, shutil, flows.solve_bug, flows.sweep, deployments, prefect_aws; "
            "assert pathlib.Path('prefect.yaml').is_file(); "
            "assert all(shutil.which(p) for p in ('bwrap', 'git', 'slirp4netns', 'ip', 'mkfs.ext4', 'nsenter'))"
        )
        subprocess.run(["docker", "run", "--rm", tag, "python", "-c", check], check=True, timeout=300)
        shown = subprocess.run(
            ["docker", "run", "--rm", tag, "bugsweep", "deploy", "--help"],
            check=True, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert "work pool" in shown.stdout
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
