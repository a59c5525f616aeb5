"""The mining screen judges the change as well as the words: real git repositories built here, no sandbox.

Each test commits a change the way a project would and screens that commit with the repository given, as
`bugsweep mine` does; what is checked is what a user sees: kept for the sandbox or rejected, and the reason.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bugsweep.mining import Rejection, RejectReason, Screened, scan_history, screen
from tests.support.repos import commit_all, make_repo, write_files

NUMBERS = '''def fmt(n):
    """n as text, with its sign."""
    sign = "-" if n < 0 else ""
    return sign + str(n)


def total(values):
    return sum(values)
'''
TEST_NUMBERS = "from numbers_ import total\n\n\ndef test_total():\n    assert total([1, 2]) == 3\n"
PYPROJECT = '[tool.pytest.ini_options]\npythonpath = ["."]\n'


def numbers_repo(root: Path) -> Path:
    return make_repo(
        root, {"numbers_.py": NUMBERS, "tests/test_numbers.py": TEST_NUMBERS, "pyproject.toml": PYPROJECT}
    )


def screened(repo: Path, files: dict[str, str], message: str) -> Screened | Rejection:
    """Commit `files` with `message` and screen that commit as `bugsweep mine` does (the repository given)."""
    write_files(repo, files)
    sha = commit_all(repo, message)
    (commit,) = scan_history(repo, shas=[sha])
    return screen(commit, repo=repo)


def new_feature(repo: Path) -> dict[str, str]:
    """A change adding a public class and function, with tests that test only those."""
    return {
        "numbers_.py": NUMBERS
        + "\n\nclass ParsedException:\n    def __init__(self, text):\n        self.text = text\n\n\n"
        + "def parse_exception(text):\n    return ParsedException(text.strip())\n",
        "tests/test_parsed.py": "from numbers_ import parse_exception\n\n\n"
        "def test_parse_exception():\n    assert parse_exception(' boom ').text == 'boom'\n",
    }


def test_a_feature_naming_its_new_exception_like_class_is_not_a_fix(tmp_path: Path) -> None:
    repo = numbers_repo(tmp_path / "repo")
    # Words alone took "ParsedException" for an exception being fixed; the change shows a new class and its tests.
    result = screened(repo, new_feature(repo), "Keep tracebacks as ParsedException records")
    assert isinstance(result, Rejection) and result.reason == RejectReason.NOT_A_FIX
    assert result.detail == (
        "a feature or refactor: it adds new public names (ParsedException, parse_exception) and its tests "
        "(test_parse_exception) assert nothing about code that existed before"
    )


def test_a_feat_commit_naming_an_exception_is_not_a_fix(tmp_path: Path) -> None:
    repo = numbers_repo(tmp_path / "repo")
    result = screened(repo, new_feature(repo), "feat: ParsedException for tracebacks\n\nNo more KeyError.")
    assert isinstance(result, Rejection) and result.reason == RejectReason.NOT_A_FIX
    assert result.detail == "a 'feat' commit whose subject does not say fix"


@pytest.mark.parametrize("subject", ["Issue #12: Add parse_exception()", "Fix #131: Add parse_exception()"])
def test_an_issue_numbered_add_with_new_names_is_a_feature(tmp_path: Path, subject: str) -> None:
    repo = numbers_repo(tmp_path / "repo")
    result = screened(repo, new_feature(repo), subject)
    assert isinstance(result, Rejection) and result.reason == RejectReason.NOT_A_FIX
    assert result.detail == (
        "a feature: the subject says 'Add' and the change adds new public names (ParsedException, parse_exception)"
    )


def test_a_fix_without_a_fix_word_is_tried(tmp_path: Path) -> None:
    repo = numbers_repo(tmp_path / "repo")
    result = screened(
        repo,
        {
            "numbers_.py": NUMBERS.replace("sign + str(n)", "sign + str(abs(n))"),
            "tests/test_numbers.py": TEST_NUMBERS.replace("import total", "import fmt, total")
            + "\n\ndef test_fmt_negative():\n    assert fmt(-1) == '-1'\n",
        },
        "Stop printing two minus signs",
    )
    assert isinstance(result, Screened), result
    assert result.why_fix == (
        "no fix word, but the change reads like a fix: it changes existing code (fmt, 2 lines, no new public "
        "names) and tests assert on it (test_fmt_negative)"
    )


def test_wordless_changes_that_are_not_fixes_say_why(tmp_path: Path) -> None:
    repo = numbers_repo(tmp_path / "repo")
    big = NUMBERS.replace(
        "return sum(values)", "result = 0\n" + "    result += 0\n" * 45 + "    return sum(values)"
    )
    result = screened(
        repo,
        {"numbers_.py": big, "tests/test_numbers.py": TEST_NUMBERS.replace("[1, 2]) == 3", "[2, 2]) == 4")},
        "Sum the values step by step",
    )
    assert isinstance(result, Rejection)
    assert result.detail == (
        "no fix word in the message (fix, bug, error, crash, ...), and its source change is large (46 lines, over 40)"
    )
    result = screened(
        repo,
        {"numbers_.py": NUMBERS.replace("return sum(values)", "return sum(values, 0)")},
        "Improve total() for long lists",
    )
    assert isinstance(result, Rejection) and result.reason == RejectReason.NO_TEST_CHANGE
    result = screened(
        repo,
        {
            "numbers_.py": NUMBERS.replace("return sum(values)", "return sum(list(values))"),
            "tests/test_numbers.py": TEST_NUMBERS
            + "\n\ndef test_total_tuple():\n    assert total((1,)) == 1\n",
        },
        "Improve total() for tuples",
    )
    assert isinstance(result, Rejection)
    assert result.detail == "no fix word in the message, and the subject says 'Improve'"


def test_a_real_exception_still_makes_a_fix(tmp_path: Path) -> None:
    repo = numbers_repo(tmp_path / "repo")
    result = screened(
        repo,
        {
            "numbers_.py": NUMBERS.replace("return sum(values)", "return sum(values or [])"),
            "tests/test_numbers.py": TEST_NUMBERS
            + "\n\ndef test_total_none():\n    assert total(None) == 0\n",
        },
        "total(None) raised TypeError",
    )
    assert isinstance(result, Screened) and result.why_fix == "the message says 'TypeError'"


# The corpus: the 15 real fixes of bench/real_bugs.jsonl, screened in their own histories when a bare clone of each
# project is at /work/.mirror/OWNER+NAME/repo (bench/README.md, "The screen, measured"). Every one must still pass.
MIRROR = Path("/work/.mirror")
CORPUS = [
    json.loads(line)
    for line in (Path(__file__).parents[1] / "bench" / "real_bugs.jsonl").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]


@pytest.mark.parametrize("task", CORPUS, ids=[t["instance_id"] for t in CORPUS])
def test_the_corpus_fixes_still_pass(task: dict[str, str]) -> None:
    git_dir = MIRROR / task["repo"].removeprefix("https://github.com/").replace("/", "+") / "repo"
    if not git_dir.exists():
        pytest.skip(f"no clone of {task['repo']} at {git_dir}")
    (commit,) = scan_history(git_dir, shas=[task["fix_commit"]])
    result = screen(commit, repo=git_dir)
    assert isinstance(result, Screened), result


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")
def test_a_fix_without_a_fix_word_is_kept_by_mine_and_a_feature_is_not(tmp_path: Path) -> None:
    """End to end, as `bugsweep mine` runs (real local sandbox, real pytest): the wordless fix becomes a task with
    its test in FAIL_TO_PASS; the feature that names an exception-like class is rejected before any sandbox."""
    from bugsweep.mining import mine
    from bugsweep.sandbox import get_provider

    repo = numbers_repo(tmp_path / "repo")
    write_files(repo, {
        "numbers_.py": NUMBERS.replace("sign + str(n)", "sign + str(abs(n))"),
        "tests/test_numbers.py": TEST_NUMBERS.replace("import total", "import fmt, total")
        + "\n\ndef test_fmt_negative():\n    assert fmt(-1) == '-1'\n",
    })  # fmt: skip
    fixed = commit_all(repo, "Stop printing two minus signs")
    write_files(repo, new_feature(repo))
    feature = commit_all(repo, "Keep tracebacks as ParsedException records")

    result = mine(str(repo), provider=get_provider("local"), runs=1, setup_command="pip install pytest")
    assert [t.fix_commit for t in result.tasks] == [fixed]
    assert result.tasks[0].FAIL_TO_PASS == ["tests/test_numbers.py::test_fmt_negative"]
    assert [(r.commit, r.reason) for r in result.rejected if r.commit == feature] == [
        (feature, RejectReason.NOT_A_FIX)
    ]
