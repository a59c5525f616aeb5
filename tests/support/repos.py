"""Small git repositories with a real bug and a failing test, built on demand for tests and benchmarks."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

from bugsweep.sandbox.base import Sandbox

BUGGY_CALC = {
    "calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "tests/test_calc.py": (
        "from calc import add, mul\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_mul():\n    assert mul(2, 3) == 6\n"
    ),
    "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\n',
}

#: The one-line fix for BUGGY_CALC, as (path, old, new).
CALC_FIX = ("calc.py", "return a - b", "return a + b")


#: The setup of a test task: its environment gets the test runner from the setup, like any task's (the first run
#: builds the environment layer, every later one reuses it).
PYTEST_SETUP = "pip install pytest"


def with_pytest(sandbox: Sandbox) -> Sandbox:
    """`sandbox` after PYTEST_SETUP (for tests that run pytest in a sandbox without the pipeline's setup step)."""
    result, _ = sandbox.setup_environment(PYTEST_SETUP)
    if result is not None and not result.ok:
        sandbox.release()
        raise RuntimeError(f"{PYTEST_SETUP!r} failed in the sandbox: {result.output[-800:]}")
    return sandbox


def git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(repo),
    }
    out = subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def make_repo(path: Path, files: dict[str, str] | None = None, message: str = "initial") -> Path:
    """A git repository at `path` holding `files` (default: BUGGY_CALC) in one commit on branch main."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    write_files(path, BUGGY_CALC if files is None else files)
    commit_all(path, message)
    return path


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def make_wheel(folder: Path, name: str, module_text: str) -> Path:
    """A minimal pure-Python wheel (`NAME-1.0-py3-none-any.whl`, one module `NAME.py`), so an install needs neither
    the network nor a build backend."""
    dist = f"{name}-1.0.dist-info"
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    files = {
        f"{name}.py": module_text,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as zf:
        for rel, text in files.items():
            zf.writestr(rel, text)
        zf.writestr(f"{dist}/RECORD", "".join(f"{rel},,\n" for rel in files) + f"{dist}/RECORD,,\n")
    return wheel
