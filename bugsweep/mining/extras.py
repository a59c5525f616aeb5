"""What a project's tests need: a module a test could not import, which one of its extras installs.

Some projects keep what their tests import in an extra of any name, and install it in their CI by hand:
construct's tests import `arrow`, `numpy`, `lz4` and `cryptography`, which its `extras` extra lists
(`pip install -e .[extras]`), and without them a test module does not import ("No module named 'arrow'"), at the
fix as at its parent (issue 37's held-out-33: four of construct's ten fixes lost so). A candidate whose
environment failed so is validated again with those extras installed (bugsweep.mining.validation), and kept so,
its task's setup command installs them too.

The extras are read at the commit (bugsweep.mining.building.project_extras): pyproject.toml's
`[project.optional-dependencies]`, setup.cfg's `[options.extras_require]`, setup.py's `extras_require=` (a literal
dict, or a name bound to one). An extra provides a module when one of its requirements is named like it (`arrow`,
`ruamel.yaml` for `ruamel`).

The project's other lists of development requirements are read here too (bugsweep.mining.building.detect_commands
picks the one the setup installs): its dependency groups (PEP 735's, PDM's, Poetry's), and, from any list, the
requirements the changed tests import (`imported_requirements`).
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

from bugsweep.grading import TestRun
from bugsweep.mining.syntax import parse_newer

#: What Python says of a module it could not find, in a test run's log.
_MISSING = re.compile(r"No module named '([\w.]+)'")
#: A requirement's distribution name: what comes before its extras, version or marker.
_NAME = re.compile(r"^\s*([A-Za-z0-9][\w.-]*)")


def missing_modules(runs: Sequence[TestRun]) -> list[str]:
    """The top-level modules the runs could not import, sorted."""
    return sorted({name.split(".")[0] for run in runs for name in _MISSING.findall(run.log)})


def normal_name(name: str) -> str:
    """A distribution or module name as packaging compares them: lower case, runs of `-`, `_` and `.` as one `_`."""
    return re.sub(r"[-_.]+", "_", name).lower()


def declared_extras(pyproject: dict[str, Any], setup_cfg: str, setup_py: str = "") -> dict[str, list[str]]:
    """The project's extras, name -> its requirements as declared: pyproject.toml's (its tables), then setup.cfg's,
    then setup.py's (`setup_py_keyword`)."""
    extras: dict[str, list[str]] = {}
    optional = pyproject.get("project", {}).get("optional-dependencies", {})
    if isinstance(optional, dict):
        extras |= {str(k): [str(r) for r in v] for k, v in optional.items() if isinstance(v, list)}
    cfg = configparser.ConfigParser(interpolation=None)
    with contextlib.suppress(configparser.Error):
        cfg.read_string(setup_cfg)
    if cfg.has_section("options.extras_require"):
        for name, value in cfg.items("options.extras_require"):
            extras.setdefault(name, [line for line in re.split(r"[\n;]", value) if line.strip()])
    found = (
        setup_py_keyword(setup_py, "extras_require", lenient=True) if "extras_require" in setup_py else None
    )
    if isinstance(found, dict):
        for name, requirements in found.items():
            if isinstance(name, str) and isinstance(requirements, list | tuple):
                extras.setdefault(name, [str(r) for r in requirements])
    return extras


def setup_py_keyword(text: str, keyword: str, *, lenient: bool = False) -> object | None:
    """The literal value setup.py passes as `keyword=` to a call, or that of the module-level name it passes
    (python-fire's `tests_require=TEST_DEPENDENCIES`); None when setup.py does not parse, passes none or computes
    it. `lenient`: a dict or list of which only some items are computed keeps its literal items (sqlglot's
    extras_require holds `f"sqlglotc=={version}"` in one extra, its test requirements in another)."""
    try:
        tree = parse_newer(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    bound = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == keyword:
            value = bound.get(node.value.id, node.value) if isinstance(node.value, ast.Name) else node.value
            try:
                return _literal(value, lenient)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return None
    return None


def _literal(node: ast.expr, lenient: bool) -> object:
    """ast.literal_eval of `node`; `lenient`, the literal items of a dict or list that also has computed ones."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        if not lenient or not isinstance(node, ast.Dict | ast.List | ast.Tuple):
            raise
    if isinstance(node, ast.Dict):
        found: dict[object, object] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is not None:  # not a `**mapping`
                with contextlib.suppress(ValueError):
                    found[ast.literal_eval(key)] = _literal(value, lenient)
        return found
    items = []
    for item in node.elts:
        with contextlib.suppress(ValueError):
            items.append(_literal(item, lenient))
    return items


def _named_like(name: str, modules: set[str]) -> bool:
    """Whether a distribution `name` is named like one of `modules` (normal names): its whole name, or the part
    before its first dot (`ruamel.yaml` provides `ruamel`)."""
    return normal_name(name) in modules or normal_name(name.split(".")[0]) in modules


def extras_providing(extras: dict[str, list[str]], modules: Sequence[str]) -> list[str]:
    """The extras one of whose requirements is named like one of `modules` (_named_like), in their declared
    order."""
    wanted = {normal_name(module) for module in modules}
    found = []
    for extra, requirements in extras.items():
        names = [m.group(1) for r in requirements if (m := _NAME.match(r))]
        if any(_named_like(n, wanted) for n in names):
            found.append(extra)
    return found


def with_extras(setup: str, extras: Sequence[str]) -> str:
    """The setup command, then the project installed (editable, as the setups bugsweep writes do) with `extras`."""
    return f"{setup} && pip install -e '.[{','.join(extras)}]'"


#: Names of the extra / dependency group / tox section that holds test dependencies.
TEST_GROUP_NAMES = ("tests", "test", "testing")
PLAIN_REQUIREMENT = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?\s*([<>=!~]=?\s*[\w.*+!-]+\s*,?\s*)*$"
)


def pyproject_test_group(data: dict[str, Any]) -> tuple[list[str], str]:
    """(the test dependency group's requirements, where that group is) from pyproject.toml's tables: a PEP 735
    group, else one of PDM's or Poetry's own tables (tool_groups)."""
    groups = data.get("dependency-groups", {}) or {}
    if name := next((g for g in TEST_GROUP_NAMES if g in groups), None):
        group = [r for r in groups[name] if isinstance(r, str)]  # {include-group = ...} tables are left out
        return group, "the test dependency group in pyproject.toml"
    by_tool = tool_groups(data.get("tool", {}) or {})
    if name := next((g for g in (*TEST_GROUP_NAMES, "dev") if by_tool.get(g)), None):
        return by_tool[name], f"the {name!r} development dependencies in pyproject.toml"
    return [], ""


def tool_groups(tool: dict[str, Any]) -> dict[str, list[str]]:
    """The development dependencies PDM (`[tool.pdm.dev-dependencies] test = [...]`) and Poetry
    (`[tool.poetry.group.test.dependencies]`, before 1.2 `[tool.poetry.dev-dependencies]`, its `dev` group) keep
    in tables of their own, by group (cattrs kept hypothesis there, 2021-2024). Poetry's version constraints
    (`^6.9`, which pip does not read) are left out, and so are its path, git and URL dependencies."""
    groups: dict[str, list[str]] = {}
    pdm = (tool.get("pdm", {}) or {}).get("dev-dependencies", {}) or {}
    for name, listed in pdm.items():
        if isinstance(listed, list):
            groups[name] = [r for r in listed if isinstance(r, str) and PLAIN_REQUIREMENT.match(r)]
    poetry = tool.get("poetry", {}) or {}
    tables = {name: (g or {}).get("dependencies", {}) for name, g in (poetry.get("group", {}) or {}).items()}
    if isinstance(poetry.get("dev-dependencies"), dict):
        tables.setdefault("dev", poetry["dev-dependencies"])
    for name, table in tables.items():
        if name in groups or not isinstance(table, dict):
            continue
        groups[name] = []
        for package, spec in table.items():
            if package == "python" or (isinstance(spec, dict) and {"path", "git", "url"} & spec.keys()):
                continue
            wanted = spec.get("extras", []) if isinstance(spec, dict) else []
            groups[name].append(f"{package}[{','.join(wanted)}]" if wanted else package)
    return groups


def imported_modules(tests: Sequence[str]) -> set[str]:
    """The modules the test sources import (absolute imports; each part of a dotted name), by normal_name."""
    modules: set[str] = set()
    for source in tests:
        try:
            tree = parse_newer(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules.update(normal_name(part) for alias in node.names for part in alias.name.split("."))
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.update(normal_name(part) for part in node.module.split("."))
    return modules


def imported_extras(extras: Iterable[str], tests: Sequence[str]) -> list[str]:
    """The extras named as a module the test modules import (a part of a dotted name counts): cattrs' tests import
    `bson` and `cattrs.preconf.pyyaml`, libraries its extras of those names install, and do not import without
    them. By name only: an extra's requirements name the project itself (`cov = ["attrs[tests]", ...]`), or pytest
    and hypothesis, which every test module imports."""
    modules = imported_modules(tests)
    return [name for name in extras if normal_name(name) in modules]


def runtime_requirements(pyproject: dict[str, Any], setup_cfg: str, setup_py: str = "") -> list[str]:
    """The project's own requirements, which `pip install -e .` installs: pyproject.toml's `[project]
    dependencies`, setup.cfg's `install_requires`, setup.py's `install_requires=` (a literal list)."""
    found = list(pyproject.get("project", {}).get("dependencies", []) or [])
    cfg = configparser.ConfigParser(interpolation=None)
    with contextlib.suppress(configparser.Error):
        cfg.read_string(setup_cfg)
    if cfg.has_option("options", "install_requires"):
        found += [line for line in re.split(r"[\n;]", cfg.get("options", "install_requires")) if line.strip()]
    listed = setup_py_keyword(setup_py, "install_requires") if "install_requires" in setup_py else None
    return [str(r) for r in [*found, *(listed if isinstance(listed, list | tuple) else [])]]


def requirement_lines(text: str) -> list[str]:
    """The requirements of a requirements file's text: no comments, options (`-r`, `-e`, `--hash`) or URLs."""
    lines = (line.split(" #")[0].strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith(("#", "-")) and "://" not in line]


def imported_requirements(
    lists: Sequence[tuple[str, Sequence[str]]], tests: Sequence[str], installed: Iterable[str]
) -> list[tuple[str, str]]:
    """(requirement, where the project lists it) for each module the changed tests import that the setup would not
    install, when one of the project's other lists of development or test requirements (`lists`: where, its
    requirements) names a distribution like it (_named_like). isort's and
    pdoc's tests import `hypothesis`, which they list only in a PEP 735 group named `dev`; faker's import
    `freezegun`, which its tox.ini installs and its dev-requirements.txt (lint tools) does not (issue 37's
    held-out-35: four fixes lost to "No module named ..."). `installed`: the names the setup installs already (the
    chosen test requirements, the project's own, the project's own modules); pytest is every setup's."""
    modules = imported_modules(tests) - {"pytest", "py"}
    have = {normal_name(m.group(1)) for r in installed if (m := _NAME.match(r))}
    found: list[tuple[str, str]] = []
    for where, requirements in lists:
        for requirement in requirements:
            name = m.group(1) if (m := _NAME.match(requirement)) else ""
            if name and normal_name(name) not in have and _named_like(name, modules):
                found.append((requirement.strip(), where))
                have.add(normal_name(name))
    return found
