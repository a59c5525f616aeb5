"""The project's extras that its tests need: a module a test could not import, which one of its extras installs.

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
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import re
from collections.abc import Sequence
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
    found = setup_py_keyword(setup_py, "extras_require") if "extras_require" in setup_py else None
    if isinstance(found, dict):
        for name, requirements in found.items():
            if isinstance(name, str) and isinstance(requirements, list | tuple):
                extras.setdefault(name, [str(r) for r in requirements])
    return extras


def setup_py_keyword(text: str, keyword: str) -> object | None:
    """The literal value setup.py passes as `keyword=` to a call, or that of the module-level name it passes
    (python-fire's `tests_require=TEST_DEPENDENCIES`); None when setup.py does not parse, passes none or computes
    it."""
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
                return ast.literal_eval(value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return None
    return None


def extras_providing(extras: dict[str, list[str]], modules: Sequence[str]) -> list[str]:
    """The extras one of whose requirements is named like one of `modules` (its whole name, or the part before its
    first dot: `ruamel.yaml` provides `ruamel`), in their declared order."""
    wanted = {normal_name(module) for module in modules}
    found = []
    for extra, requirements in extras.items():
        names = [m.group(1) for r in requirements if (m := _NAME.match(r))]
        if any(normal_name(n) in wanted or normal_name(n.split(".")[0]) in wanted for n in names):
            found.append(extra)
    return found


def with_extras(setup: str, extras: Sequence[str]) -> str:
    """The setup command, then the project installed (editable, as the setups bugsweep writes do) with `extras`."""
    return f"{setup} && pip install -e '.[{','.join(extras)}]'"
