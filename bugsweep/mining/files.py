"""Which files of a commit are its tests and which its source code, as mining reads them (a change to docs, a
changelog, CI configuration or packaging alone is no fix)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from bugsweep.grading.testfiles import is_test_file
from bugsweep.settings import DEFAULT_TEST_GLOBS

#: Single-module test suites of older projects (`tests.py`), counted as test files too when mining.
LONE_TEST_MODULES = {"tests.py", "test.py"}
#: Test-file patterns used to split a commit: the agent's protected globs plus the lone test modules.
MINING_TEST_GLOBS = [*DEFAULT_TEST_GLOBS, *sorted(LONE_TEST_MODULES)]
#: File endings that count as source code (a change to docs, changelogs or CI configuration alone is no fix).
SOURCE_SUFFIXES = {
    ".py", ".pyx", ".pxd", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go", ".js", ".ts", ".java", ".rb",
}  # fmt: skip
#: Top-level folders whose files are not the code under test (docs, examples, benchmarks, CI, scripts).
NOT_SOURCE_DIRS = {
    "docs", "doc", "examples", "example", "benchmarks", "benchmark", "bench", ".github", "misc", "scripts",
    "tools", "ci", "ci_tools",
}  # fmt: skip
#: Folders whose files are tests or test support.
TEST_FOLDERS = frozenset({"test", "tests", "testing"})
#: Source files that are packaging or tooling, not the code under test.
NOT_SOURCE_NAMES = {"setup.py", "noxfile.py", "tasks.py", "fabfile.py", "conftest.py", "docs/conf.py"}


def is_source_file(path: str, test_globs: Sequence[str] = MINING_TEST_GLOBS) -> bool:
    p = PurePosixPath(path)
    if is_test_file(path, test_globs) or path in NOT_SOURCE_NAMES or p.name in NOT_SOURCE_NAMES:
        return False
    if p.parts and p.parts[0] in NOT_SOURCE_DIRS:
        return False
    if any(part in TEST_FOLDERS for part in p.parts[:-1]):
        return False  # test support (`test/common.py`, `testing/helpers.py`), not the code under test
    return p.suffix in SOURCE_SUFFIXES


def is_runnable_test(path: str) -> bool:
    """A test module pytest runs when named: `test_*.py`, `*_test.py`, a lone `tests.py`, or `*_tests.py` in a
    tests folder (mkdocs' `mkdocs/tests/config/config_tests.py`, which its unittest discovery finds by `*tests.py`;
    pytest collects a module named on its command line whatever its name)."""
    p = PurePosixPath(path)
    name = p.name
    in_tests = any(part in TEST_FOLDERS for part in p.parts[:-1])
    return name.endswith(".py") and (
        name.startswith("test_")
        or name.endswith("_test.py")
        or name in LONE_TEST_MODULES
        or (in_tests and name.endswith("_tests.py"))
    )
