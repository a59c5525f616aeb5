"""Lookups in the repository that the small-model policy adds to the plain tools' answers: the code a test file
imports (named when an edit to the test file is refused, and in the focused first prompt) and the other files that
hold an edit's `old` (a small model often copies it from the test). Each is a grep or a file check in the sandbox;
none changes a file.
"""

from __future__ import annotations

import posixpath
import re
import shlex

from bugsweep.agent.tools import Toolbox


def code_under_test(toolbox: Toolbox, real: str, rel: str, prefer: str = "") -> tuple[list[str], list[str]]:
    """(names, files): what a Python test file imports and the repository files that define it (at most
    three, test files excluded). Named in the refusal of an edit to a test file, so that a small model knows
    where to go next.

    First the definitions (`def NAME` / `class NAME`) of the names it imports with `from ... import`, found with
    grep inside the sandbox: a package's __init__ that only re-exports is not where the bug is. Files that
    define a name found in `prefer` (say, the failing statements) come first. Failing that, the files its
    imports resolve to.
    """
    if not rel.endswith(".py"):
        return [], []
    try:
        source = toolbox.sandbox.files.read_text(real)
    except Exception:
        return [], []
    imported = [
        name.strip()
        for m in _IMPORT.finditer(source)
        if m.group(1) != "__future__"
        for name in (m.group(2) or "").strip("()").split(",")
        if name.strip().isidentifier() and not name.strip().startswith("test")
    ]
    # Up to 40 names: seen on prettytable, the names from the standard library and pytest plugins came first
    # and a cap of 12 left out PrettyTable, the class under test.
    imported = list(dict.fromkeys(imported))[:40]
    if imported:
        alternatives = "|".join(imported)
        grep = (
            "grep -rnE --include='*.py' "
            + shlex.quote(rf"^[[:space:]]*(async[[:space:]]+)?(def|class)[[:space:]]+({alternatives})\b")
            + " . | head -50"
        )
        result = toolbox.sandbox.exec(grep, timeout=60, stdin="")
        defined: dict[str, set[str]] = {}
        for line in result.stdout.split("\n"):
            path = line.split(":", 1)[0].removeprefix("./")
            if path and line.count(":") >= 2 and not toolbox.is_protected(path):
                names = set(re.findall(r"\w+", line.split(":", 2)[2])) & set(imported)
                defined.setdefault(path, set()).update(names)
        if defined:
            wanted = set(re.findall(r"\w+", prefer))
            return imported, sorted(defined, key=lambda path: not defined[path] & wanted)[:3]
    return imported, imported_module_files(toolbox, source, rel)


def imported_module_files(toolbox: Toolbox, source: str, rel: str) -> list[str]:
    """Repository files that the imports of `source` resolve to (at most three, test files excluded)."""
    candidates: list[str] = []
    here = posixpath.dirname(rel)
    for match in _IMPORT.finditer(source):
        module, names = match.group(1) or match.group(3), (match.group(2) or "").strip("()")
        dots = len(module) - len(module.lstrip("."))
        base = module.lstrip(".").replace(".", "/")
        if dots:
            up = here
            for _ in range(dots - 1):
                up = posixpath.dirname(up)
            roots = [posixpath.join(up, base) if base else up]
        else:
            roots = [base, f"src/{base}"]
        for root in roots:
            candidates += [f"{root}.py", f"{root}/__init__.py"]
            candidates += [f"{root}/{n.strip()}.py" for n in names.split(",") if n.strip().isidentifier()]
    found: list[str] = []
    for path in dict.fromkeys(posixpath.normpath(c) for c in candidates if c):
        if path.startswith("..") or toolbox.is_protected(path) or (path.endswith("/__init__.py") and found):
            continue
        if toolbox.sandbox.files.exists(posixpath.join(toolbox.workdir, path)):
            found.append(path)
        if len(found) == 3:
            break
    return found


#: `from m import a, b`, `from m import (a,\n    b,\n)` (names over several lines: seen on prettytable, whose tests
#: import a dozen names so) and `import m`: group 1 the module of a from-import, 2 its names, 3 a plain import's.
_IMPORT = re.compile(
    r"^\s*(?:from\s+([\w.]+)\s+import\s+(\([\w\s,#]*\)|[\w ,]+)|import\s+([\w.]+))", re.MULTILINE
)
