"""Building a task from a screened commit: setup and test commands detected from the layout, the test patch, and
the TaskSpec."""

from __future__ import annotations

import configparser
import functools
import re
import shlex
import subprocess
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bugsweep.grading.testfiles import RUNNER_CONFIG_NAMES, SECTIONED_CONFIG_NAMES, runner_sections_changed
from bugsweep.mining.extras import (
    PLAIN_REQUIREMENT,
    TEST_GROUP_NAMES,
    declared_extras,
    imported_extras,
    imported_requirements,
    pyproject_test_group,
    requirement_lines,
    runtime_requirements,
    setup_py_keyword,
    tool_groups,
)
from bugsweep.mining.history import _git
from bugsweep.mining.records import Commit, Screened
from bugsweep.spec import TaskSpec

#: Files that, when present, hold the test dependencies (first match wins).
TEST_REQUIREMENTS = [
    "requirements/tests.txt", "requirements/test.txt", "requirements/testing.txt", "requirements-test.txt",
    "requirements-tests.txt", "requirements_test.txt", "test-requirements.txt", "tests/requirements.txt",
    "requirements/dev.txt", "requirements-dev.txt", "dev-requirements.txt",
]  # fmt: skip


@dataclass
class Commands:
    setup: str | None
    test: str | None
    why: list[str] = field(default_factory=list)


def _show(repo: Path, commit: str, path: str) -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, text=True, errors="replace"
    )
    return proc.stdout if proc.returncode == 0 else None


def _toml(text: str) -> dict[str, Any]:
    """pyproject.toml's tables ({} when there is none or it does not parse)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}


#: tox's substitution of an environment variable, with the value it takes when the variable is unset: attrs' 2021
#: `extras = {env:TOX_AP_TEST_EXTRAS:tests}` installs the `tests` extra.
_TOX_ENV = re.compile(r"\{env:[^:{}]+(?::(?P<default>[^{}]*))?\}")


def _tox_extra(text: str) -> str | None:
    """The extras tox installs for its tests ([testenv] extras = tests, or dev, or several: "dev,docs"), whatever
    their names: tox's test environment is the project's own statement of what its tests need."""
    cfg = configparser.ConfigParser(interpolation=None)
    try:
        cfg.read_string(text)
    except configparser.Error:
        return None
    if not cfg.has_option("testenv", "extras"):
        return None
    extras = _TOX_ENV.sub(lambda found: found["default"] or "", cfg.get("testenv", "extras"))
    listed = [e for e in re.split(r"[\s,]+", extras) if re.fullmatch(r"[\w.-]+", e)]
    return ",".join(listed) or None


#: A test extra declared as a literal in setup.py: `"tests": [` inside extras_require or a dict built for it, or
#: set in one (`EXTRAS_REQUIRE["tests"] = EXTRAS_REQUIRE["tests_no_zope"] + [...]`: attrs).
_SETUP_PY_EXTRA = re.compile(r"""["'](tests|test|testing)["']\s*(:\s*\[|\]\s*=[^=])""")


def _setup_py_tests_require(text: str) -> list[str]:
    """The requirements of setup.py's `tests_require` (for `setup.py test`, which pip never installs): a literal
    list, or a module-level name bound to one (python-fire's `tests_require=TEST_DEPENDENCIES`: mock, hypothesis);
    [] when setup.py does not parse or computes them."""
    found = setup_py_keyword(text, "tests_require")
    return list(found) if isinstance(found, list | tuple) and all(isinstance(r, str) for r in found) else []


def project_extras(repo: Path, commit: str) -> dict[str, list[str]]:
    """The project's extras at `commit`, name -> its requirements (bugsweep.mining.extras.declared_extras)."""
    pyproject, setup_cfg, setup_py = (
        _show(repo, commit, n) or "" for n in ("pyproject.toml", "setup.cfg", "setup.py")
    )
    return declared_extras(_toml(pyproject), setup_cfg, setup_py)


def _tree_matches(repo: Path, commit: str, *patterns: str) -> bool:
    """Whether a Python file of the tree at `commit` has lines matching each of `patterns` (git grep -E --all-match:
    0 found, 1 none)."""
    each = [arg for pattern in patterns for arg in ("-e", pattern)]
    proc = subprocess.run(
        ["git", "-C", str(repo), "grep", "-q", "-E", "--all-match", *each, commit, "--", "*.py"],
        capture_output=True,
    )
    return proc.returncode == 0


#: An import of pkg_resources, which setuptools 82 removed.
_IMPORTS_PKG_RESOURCES = r"^\s*(import|from) pkg_resources"

#: A setup.py that has setuptools run 2to3 over the code at build time (`use_2to3=True`, `use_2to3=version_info >=
#: (3,)`, `setupargs['use_2to3'] = True`), which setuptools 58 removed: every build of it fails ("use_2to3 is
#: invalid"; simpleeval 2013-2018, parsimonious 2012-2017, isodate 2012-2017).
_USES_2TO3 = re.compile(r"\buse_2to3\b(?!['\"]?\]?\s*[=:]\s*False\b)")

#: A requirement line that pins pytest (or its old `py` library) below what runs on Python 3.11: pytest < 7, py < 1.11
#: (`pytest==3.0.7`, `pytest<4`, `pytest>=3.6,<4`: markdown-it-py's 2020 `testing` extra).
_OLD_PYTEST_PIN = re.compile(
    r"^\s*(pytest\s*(==|<=|<|~=)\s*[0-6](\.|\s*(,|;|$))|pytest\s*<\s*7(\.0)*\s*(,|;|$)|"
    r"pytest\s*[<>=!~][^\n;#]*,\s*<\s*([0-6]|7(\.0)*)(\.\d+)*\s*(,|;|$)|py\s*(==|<=|<|~=)\s*1\.([0-9]|10)\b)",
    re.M | re.I,
)

#: The pylib `py` imported and used for what pytest's stand-in for it lacks (py.test, py.std, py.builtin, ...):
#: pytest depended on py until 7.2, and since then ships a `py` module with py.path and py.error only (six's
#: 2013-2019 test_six.py: `py.test.raises`, "module 'py' has no attribute 'test'"; pytest-mock's 2015-2020 tests:
#: `import py.code`; every commit's tests unrunnable).
_USES_PYLIB = (r"^\s*(import|from)\s+py([.\s]|$)", r"\bpy\.(test|std|builtin|io|code|log|process|xml)\b")

#: A pytest plugin pinned by a requirement line (its name, the operator, the version): pinned beside an old pytest,
#: it is a release made for that pytest (hyperlink's 2017 requirements-test.txt: pytest==2.9.2, pytest-cov==2.3.0,
#: whose `type='int'` options today's pytest cannot parse).
_PINNED_PLUGIN = re.compile(r"^\s*(pytest-[A-Za-z0-9_.-]+)\s*(==|<=|<|~=)\s*([\w.*]+)", re.M | re.I)


def _newer_plugins(pinned: str) -> list[str]:
    """Requirements for the pytest plugins `pinned` pins, from the pinned release on: installed with `--upgrade`,
    uv and pip take the newest that fits the pytest installed with them, and the pinned one where no later release
    was made (pydocstyle's 2016-2019 requirements/tests.txt: pytest-pep8==1.0.6, its last)."""
    return [f"{name}>={version.removesuffix('.*')}" for name, _op, version in _PINNED_PLUGIN.findall(pinned)]


#: A pytest hook that takes a py.path argument (`path`, `startdir`): deprecated in pytest 7, an error in pytest 9,
#: which refuses to load it (boltons' 2020-2021 conftest.py: every test run an error).
_PY_PATH_HOOK = (
    r"def pytest_(ignore_collect|collect_file|pycollect_makemodule|report_header|report_collectionfinish)"
    r"\([^)]*\b(path|startdir)\b"
)


#: A pin of PyYAML older than 6.0.1: no wheel for today's Python, and its source does not build with Cython 3
#: ("'build_ext' object has no attribute 'cython_sources'"), which lost deepdiff's 2022 fixes (pyyaml==5.4.1).
_CYTHON_3_BREAKS = re.compile(
    r"^\s*pyyaml\s*((==|~=)\s*([0-5]\.|6\.0(\.0)?(?![.\d]))|(<|<=)\s*6(\.0)?(?![.\d]))", re.M | re.I
)
#: Where the setup writes the build constraints it sets (the sandbox's own /tmp).
BUILD_CONSTRAINTS = "/tmp/bugsweep-build-constraints.txt"
#: A pinned version the package index does not have (never published, or none for this Python): pip's last line
#: and uv's resolver message (deepdiff's 2025 requirements-dev.txt pins types-setuptools==75.8.0, never on PyPI).
_UNAVAILABLE_PIN = re.compile(
    r"(?:No matching distribution found for|there is no version of) "
    r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[A-Za-z0-9,._-]*\])?==(\d+(?:\.[0-9A-Za-z]+)*)\b"
)
#: A type-stub package the index has no release of at all (isort's 2023 Poetry dev dependencies name
#: types-pkg-resources, every release of which was yanked): stubs only serve type checkers, never a test run.
#: pip's last line, and uv's resolver message ("... was yanked ... and you require types-pkg-resources, ...").
_UNAVAILABLE_STUBS = re.compile(
    r"(?:No matching distribution found for|was yanked .* and you require) (types-[A-Za-z0-9._-]+)(?=[\s,]|$)",
    re.M,
)
#: Where a setup whose pins were relaxed writes uv's overrides (the sandbox's own /tmp).
OVERRIDES = "/tmp/bugsweep-overrides.txt"


def unavailable_pins(setup_output: str) -> list[str]:
    """The pins (NAME==VERSION) a failed setup's output says the package index has no distribution for, and the
    type-stub packages (NAME) it has no release of."""
    pins = {f"{name}=={version}" for name, version in _UNAVAILABLE_PIN.findall(setup_output)}
    return sorted(pins | set(_UNAVAILABLE_STUBS.findall(setup_output)))


def relax_pins(setup: str, pins: Sequence[str]) -> str:
    """`setup` with each pin the index does not have (NAME==V) replaced by the releases of V's major version from V
    on, the nearest the index has to what was meant (types-setuptools==75.8.0 -> >=75.8.0,<76), and each stub
    package it has no release of (NAME) left out (a marker no platform has), as overrides of `uv pip install`
    (UV_OVERRIDE: they replace the project's own requirement on that name)."""
    lines = []
    for pin in pins:
        name, _, version = pin.partition("==")
        if not version:
            lines.append(f'{name} ; sys_platform == "never"')
            continue
        lines.append(f"{name}>={version},<{int(version.split('.')[0]) + 1}")
    body = "\\n".join(lines)  # printf's newlines: names and versions hold no quote, backslash or %
    return f"printf '{body}\\n' > {OVERRIDES} && export UV_OVERRIDE={OVERRIDES} && {setup}"


def dated_setup(setup: str, date: str) -> str:
    """`setup` installing only what the package index had at `date` (a commit's ISO 8601 time): uv's
    UV_EXCLUDE_NEWER, read by the `uv pip install` the setup's `pip install` runs as. Today's releases of a
    dependency can break a commit's code (pint's June 2024 commits and flexparser 0.4 of November 2024: "cannot
    inherit frozen dataclass from a non-frozen one" at import)."""
    when = datetime.fromisoformat(date).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"export UV_EXCLUDE_NEWER={when} && {setup}"


#: What setuptools 58 and later say of a setup.py that asks for 2to3 (`use_2to3`), the project's or a pinned
#: dependency's (python-nameparser's 2014-2019 dev-requirements.txt: ipdb==0.9.0).
USES_2TO3_REFUSED = "use_2to3 is invalid"


def adapted_setup(setup: str, constraints: Sequence[str], relaxed: Sequence[str]) -> str:
    """`setup` as a validation ran it last: its builds constrained (`constrain_builds`), then the pins the index
    does not have relaxed (`relax_pins`)."""
    constrained = functools.reduce(constrain_builds, constraints, setup)
    return relax_pins(constrained, relaxed) if relaxed else constrained


def constrain_builds(setup: str, requirement: str) -> str:
    """`setup` with `requirement` (`setuptools<58`) among the build constraints of the packages it builds: in the
    constraints file the setup writes already (BUILD_CONSTRAINTS), or in one it now writes first."""
    written = re.compile(rf"printf '([^']*)' > {re.escape(BUILD_CONSTRAINTS)}")
    if written.search(setup):
        return written.sub(lambda m: f"printf '{m[1]}{requirement}\\n' > {BUILD_CONSTRAINTS}", setup, count=1)
    return (
        f"printf '{requirement}\\n' > {BUILD_CONSTRAINTS} && "
        f"export UV_BUILD_CONSTRAINT={BUILD_CONSTRAINTS} PIP_BUILD_CONSTRAINT={BUILD_CONSTRAINTS} && {setup}"
    )


_INCLUDE = re.compile(r"^\s*(-r|-c|--requirement|--constraint)[\s=]*(\S+)", re.M)


def _requirements_text(repo: Path, commit: str, path: str, depth: int = 3) -> str:
    """A requirements file's text at `commit`, with the files it includes (`-r other.txt`, `-c ...`, relative to
    it) appended, `depth` levels down (deepdiff's requirements-dev.txt pins PyYAML through `-r requirements-cli.txt`)."""
    text = _show(repo, commit, path) or ""
    if depth:
        for found in _INCLUDE.finditer(text):
            included = (Path(path).parent / found[2]).as_posix()
            if ".." not in included.split("/"):
                text += "\n" + _requirements_text(repo, commit, included.removeprefix("./"), depth - 1)
    return text


def _tox_deps(text: str) -> list[str]:
    """The plain requirements of tox.ini's [testenv] deps (factor-conditional and templated lines left out, and the
    requirements files it names: at an old commit they pin what today's Python cannot run, such as pytest 6.2, whose
    assertion rewriting fails on Python 3.11, which lost arrow's 2020 fixes)."""
    cfg = configparser.ConfigParser(interpolation=None)
    try:
        cfg.read_string(text)
    except configparser.Error:
        return []
    if not cfg.has_option("testenv", "deps"):
        return []
    lines = [line.strip() for line in cfg.get("testenv", "deps").splitlines()]
    return [line for line in lines if line and "{" not in line and PLAIN_REQUIREMENT.match(line)]


#: The pytest configuration files in the order pytest looks for them, with the section that holds its options.
_PYTEST_CONFIGS = (
    ("pytest.ini", "pytest"),
    ("pyproject.toml", ""),
    ("tox.ini", "pytest"),
    ("setup.cfg", "tool:pytest"),
)
#: A pytest-cov option (`--cov`, `--cov=pkg`, `--cov-report ...`, `--no-cov`).
_COV_OPTION = re.compile(r"(^|\s|[\"'])--(no-)?cov(\b|-)")


def _pytest_addopts(text: Callable[[str], str]) -> str:
    """The `addopts` of the pytest configuration pytest would read (the first file that has a pytest section),
    from `text(name)` (a file of the tree, "" when absent); "" when none has it."""
    for name, section in _PYTEST_CONFIGS:
        data = text(name)
        if not data:
            continue
        try:
            if name == "pyproject.toml":
                options = tomllib.loads(data).get("tool", {}).get("pytest", {}).get("ini_options")
                if options is None:
                    continue
                addopts = options.get("addopts", "")
                return " ".join(addopts) if isinstance(addopts, list) else str(addopts)
            cfg = configparser.RawConfigParser(strict=False, interpolation=None)
            cfg.read_string(data)
        except (tomllib.TOMLDecodeError, configparser.Error, AttributeError):
            continue
        if cfg.has_section(section):
            return cfg.get(section, "addopts", fallback="")
    return ""


#: A requirements file's line that installs the project itself (`-e .[full]`, `.`) or pytest.
_DEVELOPMENT_LINE = re.compile(r"^\s*(-e\s+|--editable[\s=]+)?\.(\[[\w,\s-]*\])?\s*$|^\s*pytest\b(?!-)", re.M)


def _dev_requirements(text: Callable[[str], str]) -> str | None:
    """requirements.txt when it lists what a developer of the project installs: the project itself (`-e .[full]`)
    or pytest, as starlette's does (with httpx, which its tests need, only in the `full` extra); None when it lists
    only what the code needs, or there is none."""
    return "requirements.txt" if _DEVELOPMENT_LINE.search(text("requirements.txt")) else None


def _requirement_lists(
    text: Callable[[str], str], names: set[str], pyproject: dict[str, Any]
) -> list[tuple[str, list[str]]]:
    """Every list of development or test requirements the project keeps, (where, its requirements): pyproject.toml's
    dependency groups (PEP 735's, PDM's, Poetry's), tox.ini's [testenv] deps, the requirements files of
    TEST_REQUIREMENTS, setup.py's tests_require, then the project's extras whatever their names (sqlglot's tests
    import duckdb, which only its `dev` extra in setup.py installs: held-out-40 lost 20 of its 34 fixes to that)."""
    groups = pyproject.get("dependency-groups", {}) or {}
    lists = [(f"pyproject.toml's dependency group {name!r}", [r for r in listed if isinstance(r, str)])
             for name, listed in groups.items() if isinstance(listed, list)]  # fmt: skip
    lists += [(f"pyproject.toml's {name!r} development dependencies", listed)
              for name, listed in tool_groups(pyproject.get("tool", {}) or {}).items()]  # fmt: skip
    lists.append(("tox.ini's [testenv] deps", _tox_deps(text("tox.ini"))))
    paths = [*TEST_REQUIREMENTS, *filter(None, [_dev_requirements(text)])]
    lists += [(path, requirement_lines(text(path))) for path in paths if path in names]
    lists.append(("setup.py's tests_require", _setup_py_tests_require(text("setup.py"))))
    extras = declared_extras(pyproject, text("setup.cfg"), text("setup.py"))
    return [*lists, *((f"the extra {name!r}", listed) for name, listed in extras.items())]


def detect_commands(repo: Path, commit: str, test_files: Sequence[str]) -> Commands:
    """Setup and test commands for common Python layouts, read from the tree at `commit`.

    - pyproject.toml with [project] or [build-system], or setup.py: `pip install -e .`, with the
      `tests`/`test`/`testing` extra when pyproject.toml or setup.cfg names one, else the extras tox.ini's
      [testenv] installs, whatever their names (`{env:VAR:default}` read as its default), else such an extra
      setup.py's extras_require names or sets; and the extras the changed tests import (imported_extras);
    - then the test dependencies where the project keeps them: a requirements file (TEST_REQUIREMENTS, else a
      requirements.txt that installs the project itself or pytest: _dev_requirements), a
      `tests`/`test`/`testing` dependency group in pyproject.toml (PEP 735's, else PDM's or Poetry's: tool_groups),
      tox.ini's [testenv] deps, or (without a test
      extra) setup.py's `tests_require`, a literal list or a name bound to one; and from the project's other such
      lists, the requirements the changed tests import that the setup does not install (imported_requirements);
    - `setuptools<82` when the code imports pkg_resources (setuptools 82 removed it; older environments had it);
    - setuptools < 58 for the builds of the setup, and `pip install .` for `pip install -e .` (those have no editable
      install), when setup.py asks setuptools to run 2to3 (`use_2to3`, removed in setuptools 58) and keeps no
      `package_dir` (the tests import the code from the repository's root, before the installed copy);
    - Cython < 3 for the builds of the setup (pip's and uv's build constraints) when those test requirements or the
      project's metadata pin a PyYAML older than 6.0.1, whose source does not build with Cython 3;
    - pytest 7.4-8 (and py 1.11) when those test requirements pin a pytest older than 7 or a py older than 1.11,
      which do not run on Python 3.11 (boltons' 2020 requirements-test.txt: pytest==3.0.7, py<1.6.0); `pytest<9`
      when a pytest hook of the tree takes a py.path argument (pytest 9 will not load it);
    - py 1.11 when a Python file imports py and uses more of it than pytest's stand-in for it has (py.test, py.std:
      pytest installed the py library until 7.2);
    - pytest-cov when the project's pytest configuration passes its options (`addopts = --cov=pkg ...`): without it
      pytest stops at a usage error (arrow's 2020 commits, whose pytest-cov came from a requirements file);
    - tests run with `python -m pytest -q <changed test modules>` (pytest also runs unittest-style tests, and
      gives per-test results the grader reads), so the setup ends with `pip install pytest`.
    """
    names = set(_git(repo, "ls-tree", "-r", "--name-only", commit).split("\n"))

    @functools.cache
    def text(name: str) -> str:
        """A file of the tree at `commit` ("" when it has none): each read once."""
        return (_show(repo, commit, name) or "") if name in names else ""

    why: list[str] = []
    steps: list[str] = []
    pyproject = text("pyproject.toml")
    pyproject_data = _toml(pyproject)  # read once, for the test group and the extras
    group, group_where = pyproject_test_group(pyproject_data)
    declared = declared_extras(pyproject_data, text("setup.cfg"))  # setup.py's: below, after tox.ini's
    extra = next((g for g in TEST_GROUP_NAMES if g in declared), None)
    if extra is None and "tox.ini" in names:
        extra = _tox_extra(text("tox.ini"))
    if extra is None and "setup.py" in names:
        setup_py = text("setup.py")
        found = _SETUP_PY_EXTRA.search(setup_py) if "extras_require" in setup_py else None
        extra = found[1] if found else None
    tests = [text(f) for f in test_files]
    imported = [name for name in imported_extras(declared, tests) if name not in (extra or "").split(",")]
    if imported:
        why.append(f"the changed tests import what the extras {', '.join(imported)} install")
    extras = ",".join([extra, *imported] if extra else imported)  # the test extra's name, then those
    installable = "setup.py" in names or bool(
        pyproject and re.search(r"^\[(project|build-system)\]", pyproject, re.M)
    )
    build_constraints: list[str] = []
    setup_py = text("setup.py")
    if installable and _USES_2TO3.search(setup_py) and "package_dir" not in setup_py:
        # setuptools < 58 builds it, but has no editable install (PEP 660 came with setuptools 64): a copy is
        # installed, for its dependencies; `python -m pytest` in the repository imports the code from the
        # repository's root, before that copy (not so for a src/ layout, `package_dir`: left as it was)
        steps.append(f"pip install '.[{extras}]'" if extras else "pip install .")
        build_constraints.append("setuptools<58")
        why.append(
            "setup.py has setuptools run 2to3 (use_2to3), which setuptools 58 removed: setuptools < 58 for "
            "builds, and pip install . (no editable install there); the tests import the code from the "
            "repository's root"
        )
    elif installable:
        steps.append(f"pip install -e '.[{extras}]'" if extras else "pip install -e .")
        why.append(
            "setup.py/pyproject.toml: pip install -e ." + (f" with the [{extras}] extra" if extras else "")
        )
    reqs = next((r for r in TEST_REQUIREMENTS if r in names), None) or _dev_requirements(text)
    pinned = ""  # the test requirements installed, as text
    if reqs:
        steps.append(f"pip install -r {reqs}")
        why.append(f"test requirements in {reqs}")
        pinned = _requirements_text(repo, commit, reqs)
    else:  # the first place that lists them, read only until one does
        deps, where = group, group_where
        if not deps and "tox.ini" in names:
            deps, where = _tox_deps(text("tox.ini")), "tox.ini [testenv] deps"
        if not deps and installable and not extra:
            deps, where = _setup_py_tests_require(setup_py), "setup.py's tests_require"
        if deps:
            steps.append("pip install " + " ".join(shlex.quote(r) for r in deps))
            why.append(where)
            pinned = "\n".join(deps)
    own = [path.split("/")[-2] if path.endswith("/__init__.py") else path[:-3] for path in names
           if re.fullmatch(r"(src/)?[\w.-]+/__init__\.py|[\w-]+\.py", path)]  # fmt: skip
    installed = [
        *requirement_lines(pinned),
        *own,
        *(r for e in extras.split(",") if e for r in declared.get(e, [])),
    ]
    installed += runtime_requirements(pyproject_data, text("setup.cfg"), setup_py)
    # and the project itself, by its distribution's name (an extra `cov = ["c[tests]"]` names it)
    project = pyproject_data.get("project", {}).get("name") or setup_py_keyword(setup_py, "name")
    installed += [project] if isinstance(project, str) else []
    if wanted := imported_requirements(_requirement_lists(text, names, pyproject_data), tests, installed):
        steps.append("pip install " + " ".join(shlex.quote(r) for r, _ in wanted))
        why += [
            f"{where} lists {r.split(';')[0].strip()}, which the changed tests import" for r, where in wanted
        ]
    metadata = "\n".join(text(name) for name in ("setup.py", "setup.cfg", "pyproject.toml"))
    if _CYTHON_3_BREAKS.search(pinned) or _CYTHON_3_BREAKS.search(re.sub(r"[\"',\[\]]", "\n", metadata)):
        build_constraints.append("cython<3")
        why.append(
            "a PyYAML older than 6.0.1 is pinned, whose source does not build with Cython 3: Cython < 3 for builds"
        )
    # the requirement strings of setup.py's, setup.cfg's and pyproject.toml's lists (a test extra's), one a line
    listed = re.sub(r"[\"'\[\]]", "\n", metadata)
    old_pytest = bool(_OLD_PYTEST_PIN.search(pinned) or _OLD_PYTEST_PIN.search(listed))
    if old_pytest:
        plugins = _newer_plugins(f"{pinned}\n{listed}")
        upgrade = "--upgrade " if plugins else ""  # a plugin's pinned release, installed already, is upgraded
        steps.append(
            f"pip install {upgrade}'pytest>=7.4,<9' 'py>=1.11'" + "".join(f" '{p}'" for p in plugins)
        )
        why.append(
            "the test requirements (or the project's metadata) pin a pytest (or py) that does not run on today's "
            "Python: pytest 7.4-8"
            + (", and the newest releases of the pytest plugins pinned with it" if plugins else "")
        )
    elif _tree_matches(repo, commit, _PY_PATH_HOOK):
        steps.append("pip install 'pytest<9'")
        why.append("a pytest hook takes a py.path argument, which pytest 9 refuses")
    if not old_pytest and _tree_matches(repo, commit, *_USES_PYLIB):
        steps.append("pip install 'py>=1.11'")
        why.append("the code uses the py library (py.test, ...), which pytest installed until 7.2")
    if _COV_OPTION.search(_pytest_addopts(text)):
        steps.append("pip install pytest-cov")
        why.append("the pytest configuration passes pytest-cov's options (--cov) in addopts")
    if _tree_matches(repo, commit, _IMPORTS_PKG_RESOURCES):
        steps.append("pip install 'setuptools<82'")
        why.append("the code imports pkg_resources, which setuptools 82 removed")
    test = "python -m pytest -q " + " ".join(shlex.quote(t) for t in test_files) if test_files else None
    if test:
        if not re.search(r"(^|\s|')pytest([\s<>=!~']|$)", " ".join(steps)):
            steps.append(
                "pip install pytest"
            )  # the task's own environment has no test runner until its setup
        why.append("pytest on the changed test modules")
    setup = " && ".join(steps)
    if setup:
        setup = functools.reduce(constrain_builds, build_constraints, setup)
    return Commands(setup=setup or None, test=test, why=why)


def runner_config_changes(repo: Path, commit: Commit) -> list[str]:
    """The test-runner configuration the commit changed, which the grader protects (tox.ini, pytest.ini; the
    runner sections of setup.cfg or pyproject.toml): it goes into the task's test patch, with the test files, so
    that the fix's own patch does not touch what a grade may not count (schema's 2018 fix changed its tox.ini)."""
    found = []
    for _status, path in commit.changes:
        name = path.rsplit("/", 1)[-1]
        if name in RUNNER_CONFIG_NAMES:
            found.append(path)
        elif name in SECTIONED_CONFIG_NAMES:
            old, new = ((_show(repo, sha, path) or "").encode() for sha in (commit.parents[0], commit.sha))
            if runner_sections_changed(name, old, new):
                found.append(path)
    return found


def test_patch(repo: Path, commit: Commit, test_files: Sequence[str]) -> str:
    """The commit's changes to its test files, as a diff that applies to its parent."""
    return _git(repo, "diff", "--binary", "--no-renames", commit.parents[0], commit.sha, "--", *test_files)


def fix_patch(repo: Path, commit: Commit, test_files: Sequence[str]) -> str:
    """The commit's other changes (the fix without its tests; SWE-bench's gold patch), as a diff on its parent."""
    excluded = [f":(exclude,literal){path}" for path in test_files]
    return _git(repo, "diff", "--binary", "--no-renames", commit.parents[0], commit.sha, "--", ".", *excluded)


#: Folder names that say nothing about the project (a mirror's `repo/`, a `src/` checkout).
GENERIC_DIR_NAMES = {"repo", "repository", "src", "source", "checkout", "git", "work"}


def default_prefix(repo_name: str) -> str:
    """The project's name for instance ids: the last meaningful part of the path or URL, without `.git`."""
    parts = [p.removesuffix(".git") for p in re.split(r"[/:]", repo_name.rstrip("/")) if p]
    while len(parts) > 1 and parts[-1].lower() in GENERIC_DIR_NAMES | {""}:
        parts.pop()
    return re.sub(r"[^A-Za-z0-9]+", "-", parts[-1] if parts else "").strip("-") or "repo"


def build_task(
    repo: Path,
    screened: Screened,
    *,
    repo_name: str,
    test_command: str | None = None,
    setup_command: str | None = None,
    task_prefix: str | None = None,
) -> TaskSpec:
    """The task for a screened commit: parent + test_patch, task text = the message's first line."""
    c = screened.commit
    detected = detect_commands(repo, c.sha, screened.runnable_tests)
    files = " ".join(shlex.quote(t) for t in screened.runnable_tests)
    test = test_command.replace("{test_files}", files) if test_command else detected.test
    setup = detected.setup if setup_command is None else (setup_command or None)
    tests = [*screened.test_files, *runner_config_changes(repo, c)]  # the test patch's files, not the fix's
    return TaskSpec(
        instance_id=f"{task_prefix or default_prefix(repo_name)}-{c.sha[:10]}",
        repo=repo_name,
        base_commit=c.parents[0],
        problem_statement=c.subject,
        test_command=test or "",
        setup_command=setup,
        test_patch=test_patch(repo, c, tests),
        test_files=sorted(screened.test_files),
        fix_commit=c.sha,
        patch=fix_patch(repo, c, tests),
        created_at=c.date,
        screen_rule=screened.rule or None,
        screen_reason=screened.why_fix or None,
    )
