"""Which files are test files, and which changes touch the test infrastructure.

`is_test_file` is one answer shared by `edit_file` (which refuses them) and the grader; `protected_reason` is the
grader's wider one: test files, conftest.py, test-runner configuration, start-up hooks (sitecustomize, .pth),
packaging metadata (`*.dist-info`, `*.egg-info`, `*.egg-link`, `entry_points.txt`, in any letter case), modules that
would shadow the standard library, the test runner or bugsweep's probe, and what the test command runs.

Patterns use .gitignore syntax (pathspec): a pattern without a slash matches at any depth (`conftest.py`,
`test_*.py`), one with a slash is anchored at the repository root (`tests/**`).
"""

from __future__ import annotations

import configparser
import os
import shlex
import sys
import tomllib
from collections.abc import Iterable
from functools import lru_cache

import pathspec

from bugsweep.grading import probe


@lru_cache(maxsize=64)
def _spec(patterns: tuple[str, ...]) -> pathspec.PathSpec:
    return pathspec.GitIgnoreSpec.from_lines(patterns)


def is_test_file(path: str, patterns: Iterable[str], extra: Iterable[str] = ()) -> bool:
    """True when `path` (relative to the repo root, forward slashes) is a protected test file."""
    rel = path.lstrip("./") if path.startswith("./") else path
    if rel in set(extra):
        return True
    return _spec(tuple(patterns)).match_file(rel)


# -- the test infrastructure: what a change may not touch for its grade to count -------------------------------

#: Test-runner configuration files, protected whole wherever they are (pytest reads the nearest one).
RUNNER_CONFIG_NAMES = frozenset({"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini"})
#: Configuration files where only the test-runner sections are protected (compared parsed, so that e.g. a new
#: dependency in pyproject.toml still counts as part of a fix).
SECTIONED_CONFIG_NAMES = frozenset({"setup.cfg", "pyproject.toml"})
#: Files Python itself runs at start-up when they are on sys.path.
STARTUP_NAMES = frozenset({"sitecustomize.py", "usercustomize.py"})
#: Modules of the test runners (and what they import first): a new file or package of that name anywhere can
#: replace the runner.
RUNNER_MODULES = frozenset(
    {
        "pytest",
        "_pytest",
        "pluggy",
        "py",
        "unittest",
        "nose",
        "nose2",
        "iniconfig",
        "xdist",
        "doctest",
        *probe.MODULES,
    }
)
#: Packaging metadata, in any letter case: where Python's metadata lookup finds entry points (a pytest11 plugin) and
#: installs are recorded. What the task's setup made is part of the task state; a change may not add or alter it.
PACKAGING_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")
PACKAGING_NAMES = frozenset({"entry_points.txt"})
_MODULE_SUFFIXES = (".py", ".pyc", ".pyi", ".pth")


def protected_reason(
    path: str,
    *,
    patterns: Iterable[str],
    extra: Iterable[str] = (),
    test_command: str = "",
    old: bytes | None = None,
    new: bytes | None = None,
    task_paths: frozenset[str] = frozenset(),
    importable: frozenset[str] = frozenset(),
    import_roots: frozenset[str] = frozenset(),
) -> str | None:
    """Why a change to `path` may not count towards a grade, or None when it may.

    `old`/`new` are the file's bytes in the task state and after the change (None: absent); `task_paths` is every
    path of the task state (for "is this new" and "does the test command name it"). `importable` is every
    top-level module name the task's environment provides (`IMPORTABLE_SCRIPT`), `import_roots` the folders the
    test run puts first on sys.path (`import_roots`): a new module there with such a name replaces the real one
    for the test process, e.g. a package that pytest imports at start-up, loading a plugin of its own.
    """
    rel = path[2:] if path.startswith("./") else path
    parts = rel.split("/")
    name = parts[-1]
    if is_test_file(rel, patterns, extra):
        return "test file"
    if rel in _folders(_protected_files(task_paths, tuple(patterns), tuple(extra))):
        return "holds test files"
    if name in RUNNER_CONFIG_NAMES:
        return "test-runner configuration"
    if runner_sections_changed(name, old, new):
        return "test-runner section of " + name
    if name in STARTUP_NAMES or name.lower().endswith(".pth"):
        return "run by Python at start-up"
    if name.lower() in PACKAGING_NAMES or any(p.lower().endswith(PACKAGING_SUFFIXES) for p in parts):
        return "packaging metadata (entry points: a plugin the test runner would load)"
    if rel in _command_files(test_command, task_paths):
        return "run by the test command"
    existing = _folders(task_paths) | task_paths
    shadows = sys.stdlib_module_names | RUNNER_MODULES | importable
    for root in sorted(import_roots | {""}, key=len, reverse=True):
        depth = root.count("/") + 1 if root else 0
        if root and not rel.startswith(root + "/"):
            continue
        if len(parts) <= depth:
            continue
        top = parts[depth]
        suffix = next((s for s in _MODULE_SUFFIXES if top.endswith(s)), "")
        module = top[: -len(suffix)] if suffix else top
        is_new = "/".join(parts[: depth + 1]) not in existing
        if is_new and (len(parts) > depth + 1 or suffix) and module in shadows:
            where = f"the folder {root}/" if root else "the repository root"
            source = "the task's environment" if module in importable else "Python or the test runner"
            return f"shadows the module {module!r} ({source} has one) from {where}"
    for i, part in enumerate(parts):
        module = (
            part[: -len(s)] if (s := next((x for x in _MODULE_SUFFIXES if part.endswith(x)), "")) else part
        )
        is_module = s or i < len(parts) - 1
        prefix = "/".join(parts[: i + 1])
        if is_module and module in RUNNER_MODULES and prefix not in existing:
            return f"shadows the test runner's module {module!r}"
    return None


#: Run with the task's interpreter in the regrade's fresh sandbox, before the change is applied, as
#: `python -I -c SCRIPT REPO`: every top-level module name importable from the task's environment (the standard
#: library, its site-packages, what .pth files add), except what lives in the repository itself.
IMPORTABLE_SCRIPT = """
import os, sys
repo = os.path.realpath(sys.argv[1])
names = set(getattr(sys, "stdlib_module_names", ())) | set(sys.builtin_module_names)
for entry in sys.path:
    real = os.path.realpath(entry or ".")
    if real == repo or real.startswith(repo + os.sep) or not os.path.isdir(real):
        continue
    for name in os.listdir(real):
        if name.endswith((".dist-info", ".egg-info", ".egg-link", ".pth")):
            continue
        base = name.split(".")[0]
        if base.isidentifier():
            names.add(base)
print(" ".join(sorted(names)))
"""


def import_roots(
    task_paths: frozenset[str], patterns: Iterable[str], extra: Iterable[str] = ()
) -> frozenset[str]:
    """Folders a test run puts first on sys.path: the repository root, `src`, and every folder holding test files
    (pytest inserts a test file's folder; unittest's discovery its start folder)."""
    tests = _protected_files(task_paths, tuple(patterns), tuple(extra))
    return frozenset({"", "src"} | {p.rpartition("/")[0] for p in tests})


@lru_cache(maxsize=8)
def _protected_files(
    task_paths: frozenset[str], patterns: tuple[str, ...], extra: tuple[str, ...]
) -> frozenset[str]:
    """The task state's test files (to refuse a change that replaces a folder holding them by a file or link)."""
    return frozenset(p for p in task_paths if is_test_file(p, patterns, extra))


@lru_cache(maxsize=16)
def _folders(paths: frozenset[str]) -> frozenset[str]:
    """Every folder that holds one of `paths`."""
    return frozenset(p.rsplit("/", i)[0] for p in paths for i in range(1, p.count("/") + 1))


def runner_sections_changed(name: str, old: bytes | None, new: bytes | None) -> bool:
    """Whether a change of setup.cfg or pyproject.toml (`name`) changes its test-runner sections."""
    return name in SECTIONED_CONFIG_NAMES and _runner_sections(name, old) != _runner_sections(name, new)


def _runner_sections(name: str, data: bytes | None) -> object:
    """The parsed test-runner sections of setup.cfg or pyproject.toml (a missing file has none); a marker when the
    file cannot be parsed."""
    text = (data or b"").decode("utf-8", errors="replace")
    try:
        if name == "pyproject.toml":
            tool = tomllib.loads(text).get("tool", {})
            return {k: tool.get(k) for k in ("pytest", "tox", "nox", "coverage")}
        parser = configparser.RawConfigParser(strict=False, interpolation=None)
        parser.read_string(text)
        return {
            s: dict(parser.items(s))
            for s in parser.sections()
            if s in ("pytest", "tool:pytest", "tox:tox") or s.startswith(("testenv", "coverage:"))
        }
    except (tomllib.TOMLDecodeError, configparser.Error, AttributeError, ValueError):
        return ("unparsable", data)


def _command_files(test_command: str, task_paths: frozenset[str]) -> set[str]:
    """Files the test command runs: paths it names, and the Makefile, tox.ini or noxfile.py it goes through."""
    try:
        words = shlex.split(test_command)
    except ValueError:
        words = test_command.split()
    found: set[str] = set()
    for word in words:
        for token in (word, *word.split("=")[1:]):
            token = token[2:] if token.startswith("./") else token
            if token in task_paths:
                found.add(token)
    programs = {os.path.basename(w) for w in words}
    if "make" in programs or "gmake" in programs:
        found |= {"Makefile", "makefile", "GNUmakefile"} | {p for p in task_paths if p.endswith(".mk")}
    if "tox" in programs:
        found |= {"tox.ini", "setup.cfg", "pyproject.toml"}
    if "nox" in programs:
        found.add("noxfile.py")
    return found
