"""Fixes of code no release had yet, told from fixes of regressions by running the fix's tests on the release.

Real parts: real git repositories built by the test (tests.support.repos), with real tags; the real local sandbox
(bubblewrap + overlayfs) running real pytest, as `bugsweep mine` runs it. No stand-ins.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bugsweep.mining import RejectReason, mine
from bugsweep.mining.releases import last_release, unreleased
from tests.support.repos import commit_all, git, make_repo, write_files

PYPROJECT = '[tool.pytest.ini_options]\npythonpath = ["."]\n'
#: Released in v1.0: add() and div() (div floors, a bug as old as the release).
RELEASED = "def add(a, b):\n    return a + b\n\n\ndef div(a, b):\n    return a // b\n"
TEST_ADD = "from calc import add\n\n\ndef test_add_small():\n    assert add(1, 1) == 2\n"


def release_history(root: Path) -> dict[str, str]:
    """v1.0 releases add() and div(); after it, a rewrite of add() breaks it, and a new mul() comes with a bug.
    Then three fixes, newest last: of the regression, of the unreleased mul(), and of div()'s old bug."""
    repo = make_repo(root, {"calc.py": RELEASED, "tests/test_calc.py": TEST_ADD, "pyproject.toml": PYPROJECT})
    git(repo, "tag", "v1.0")
    git(repo, "tag", "before-docs")  # not a release: no version number in it
    shas = {"v1.0": git(repo, "rev-parse", "HEAD")}
    broken = RELEASED.replace("return a + b", "total = a\n    total -= b\n    return total")
    write_files(repo, {"calc.py": broken + "\n\ndef mul(a, b):\n    return a + b\n"})
    shas["rewrite"] = commit_all(repo, "Rewrite add() and add mul()")

    fixed_add = RELEASED.replace("return a + b", "total = a\n    total += b\n    return total")
    tests = TEST_ADD + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    write_files(repo, {"calc.py": fixed_add + "\n\ndef mul(a, b):\n    return a + b\n", "tests/test_calc.py": tests})
    shas["regression"] = commit_all(repo, "Fix add() returning the difference")

    write_files(repo, {
        "calc.py": fixed_add + "\n\ndef mul(a, b):\n    return a * b\n",
        "tests/test_mul.py": "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n",
    })  # fmt: skip
    shas["unreleased"] = commit_all(repo, "Fix mul() adding instead of multiplying")

    write_files(repo, {
        "calc.py": fixed_add.replace("a // b", "a / b") + "\n\ndef mul(a, b):\n    return a * b\n",
        "tests/test_div.py": "from calc import div\n\n\ndef test_div():\n    assert div(3, 2) == 1.5\n",
    })  # fmt: skip
    shas["old_bug"] = commit_all(repo, "Fix div() flooring its result")
    return shas


def test_the_last_release_and_what_came_after_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shas = release_history(repo)
    release = last_release(repo, shas["regression"] + "^")
    assert release is not None and (release.tag, release.sha) == ("v1.0", shas["v1.0"])
    # the regression's changed lines were all written after v1.0; div()'s line is v1.0's own
    found = unreleased(repo, shas["rewrite"], shas["regression"], ["calc.py"])
    assert found is not None and found.mostly and (found.newer, found.blamed) == (1, 1)
    found = unreleased(repo, shas["unreleased"], shas["old_bug"], ["calc.py"])
    assert found is not None and not found.mostly and found.newer == 0
    # before the first release there is nothing to compare with: no check
    untagged = make_repo(tmp_path / "untagged", {"calc.py": RELEASED})
    assert last_release(untagged, "HEAD") is None
    assert unreleased(untagged, "HEAD", "HEAD", ["calc.py"]) is None


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")
def test_a_fix_of_unreleased_code_is_rejected_and_a_regression_kept(tmp_path: Path) -> None:
    """`bugsweep mine` as a user runs it: the fix of mul(), which v1.0 never had, fails on v1.0's code with its
    tests and is rejected; the fix of add(), whose tests pass on v1.0 (it worked there), is kept and says why; the
    fix of div()'s old bug is kept with no release run. --no-release-check keeps all three."""
    repo = tmp_path / "repo"
    shas = release_history(repo)
    out, report = tmp_path / "tasks.jsonl", tmp_path / "tasks.mining.json"
    command = [sys.executable, "-m", "bugsweep", "mine", str(repo), "--runs", "1", "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tasks = {json.loads(line)["fix_commit"]: json.loads(line) for line in out.read_text().splitlines()}
    assert set(tasks) == {shas["regression"], shas["old_bug"]}, proc.stdout
    assert tasks[shas["regression"]]["screen_reason"].endswith(
        "1 of the 1 source lines it changes came after v1.0, the last release before it, and its failing tests "
        "pass there: a regression since then"
    )
    assert "v1.0" not in tasks[shas["old_bug"]]["screen_reason"]
    rejected = {r["commit"]: r for r in json.loads(report.read_text())["rejected"]}
    mul = rejected[shas["unreleased"]]
    assert mul["reason"] == RejectReason.UNRELEASED.value == "fixes unreleased code"
    assert mul["detail"] == (
        "1 of the 1 source lines it changes came after v1.0, the last release before it, and its failing tests "
        "fail there too (tests/test_mul.py::test_mul): a fix of code no release had"
    )
    assert "fixes unreleased code" in proc.stdout

    from bugsweep.sandbox import get_provider

    unchecked = mine(str(repo), provider=get_provider("local"), runs=1, release_check=False)
    assert {t.fix_commit for t in unchecked.tasks} == {shas["regression"], shas["unreleased"], shas["old_bug"]}
