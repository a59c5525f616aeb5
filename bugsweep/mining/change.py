"""What a commit changed in its Python code, read from git without running anything: the shape the screen judges.

A fix changes existing functions and adds or changes tests that check them; a feature adds new public names and
tests that call those. `read_change` parses the Python source and test files of a commit at its parent and at the
commit (the standard library's `ast`) and names those parts. Files it cannot parse (not Python, or Python 2) leave
the shape unknown: the screen then judges by the words alone.
"""

from __future__ import annotations

import ast
import builtins
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bugsweep.mining.records import Commit

#: Python files read per commit at most; a commit touching more is a sweeping change whose shape says little.
MAX_FILES = 40
#: Builtin exception names ("OSError", "KeyError", ...): a mention of one in a message is a real exception.
BUILTIN_EXCEPTIONS = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
)
#: Calls whose first argument is an exception the test expects (pytest.raises, assertRaises, ...).
RAISES_CALLS = {"raises", "assertRaises", "assertRaisesRegex", "assertRaisesRegexp", "failUnlessRaises"}
#: Calls and statements that make a test line an assertion.
ASSERT_CALL_PREFIXES = ("assert", "fail", "raises", "warns", "expect", "check")


@dataclass
class ChangeShape:
    """The parts of a commit's Python change that tell a fix from a feature."""

    added_names: list[str] = field(default_factory=list)
    """New public functions, classes and methods in source files (`Class.method`), not there before anywhere."""
    changed_functions: list[str] = field(default_factory=list)
    """Functions, methods and module-level constants of source files that existed before and whose code changed."""
    source_lines: int = 0
    """Lines added plus lines removed in source files."""
    new_tests: list[str] = field(default_factory=list)
    """Test functions the commit added."""
    changed_tests: list[str] = field(default_factory=list)
    """Test functions that existed before and whose code (decorators included) changed."""
    tests_on_new_names: list[str] = field(default_factory=list)
    """Of the new and changed tests, those that use a name the commit added."""
    asserting_tests: list[str] = field(default_factory=list)
    """Of the new and changed tests, those holding an assertion (assert, pytest.raises, self.assert*...)."""
    raised_or_caught: set[str] = field(default_factory=set)
    """Exception names raised, caught or expected by a test in the changed files, before or after."""

    @property
    def tests_on_existing_names(self) -> list[str]:
        """New or changed tests that assert something without using any added name: existing behaviour."""
        on_new = set(self.tests_on_new_names)
        return [t for t in self.asserting_tests if t not in on_new]

    def is_exception(self, word: str) -> bool:
        """A real exception mention: a builtin exception, or one the code raises or catches that the commit did not
        add (a class such as `ParsedException` that the commit defines is a new name, not an exception fixed)."""
        if word in BUILTIN_EXCEPTIONS:
            return True
        added = {name.rsplit(".", 1)[-1] for name in self.added_names}
        return word in self.raised_or_caught and word not in added


def _git_show(repo: Path, rev: str, path: str) -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(repo), "show", f"{rev}:{path}"], capture_output=True, text=True, errors="replace"
    )
    return proc.stdout if proc.returncode == 0 else None


def _numstat(repo: Path, base: str, sha: str, paths: Sequence[str]) -> int:
    if not paths:
        return 0
    proc = subprocess.run(
        ["git", "-C", str(repo), "diff", "--numstat", "--no-renames", base, sha, "--", *paths],
        capture_output=True,
        text=True,
        errors="replace",
    )
    total = 0
    for line in proc.stdout.splitlines():
        added, removed, _ = [*line.split("\t", 2), "", ""][:3]
        total += int(added) if added.isdigit() else 0
        total += int(removed) if removed.isdigit() else 0
    return total


def _functions(
    tree: ast.Module,
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]]:
    """Top-level functions and classes, and the methods and nested classes of classes, by qualified name."""

    def walk(
        body: list[ast.stmt], prefix: str
    ) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]]:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                yield prefix + node.name, node
                if isinstance(node, ast.ClassDef):
                    yield from walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(
                node, ast.If | ast.Try
            ):  # definitions under `if sys.version_info ...` / `try: import`
                yield from walk(node.body, prefix)
                yield from walk(node.orelse, prefix)

    yield from walk(tree.body, "")


def _is_public(qualified: str) -> bool:
    return not any(part.startswith("_") for part in qualified.split("."))


def _own_code(node: ast.AST) -> str:
    """A definition's code without the bodies of the methods it holds (those are compared on their own)."""
    if isinstance(node, ast.ClassDef):
        kept = [
            n for n in node.body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ]
        parts: list[ast.AST] = [*node.bases, *node.keywords, *kept, *node.decorator_list]
        return "\n".join(ast.dump(part) for part in parts)
    return ast.dump(node)


def _module_settings(tree: ast.Module) -> dict[str, str]:
    """A module's top-level assignments (constants, compiled patterns, tables) by the name they set."""
    settings: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id != "__all__":
                    settings[target.id] = ast.dump(node.value)
    return settings


def _names_used(node: ast.AST) -> set[str]:
    used: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            used.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            used.add(sub.attr)
        elif isinstance(sub, ast.alias):
            used.add(sub.asname or sub.name.rsplit(".", 1)[-1])
    return used


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _asserts(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assert):
            return True
        if isinstance(sub, ast.Call) and _call_name(sub).lower().startswith(ASSERT_CALL_PREFIXES):
            return True
    return False


def _exception_names(tree: ast.Module) -> set[str]:
    def name_of(node: ast.AST | None) -> Iterator[str]:
        if isinstance(node, ast.Call):
            node = node.func
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.Tuple):
            for element in node.elts:
                yield from name_of(element)

    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            found.update(name_of(node.exc))
        elif isinstance(node, ast.ExceptHandler):
            found.update(name_of(node.type))
        elif isinstance(node, ast.Call) and _call_name(node) in RAISES_CALLS and node.args:
            found.update(name_of(node.args[0]))
    return found


def _parse(text: str | None) -> ast.Module | None:
    if text is None:
        return ast.Module(body=[], type_ignores=[])  # the file did not exist on this side
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def read_change(
    repo: Path, commit: Commit, source_files: Sequence[str], test_files: Sequence[str]
) -> ChangeShape | None:
    """The shape of `commit`'s change against its first parent, or None when it cannot be read: a source file that
    is not Python (or does not parse), or more than MAX_FILES files."""
    if not commit.parents:
        return None
    base = commit.parents[0]
    py_sources = [p for p in source_files if p.endswith(".py")]
    py_tests = [p for p in test_files if p.endswith(".py")]
    if len(py_sources) != len(source_files) or len(py_sources) + len(py_tests) > MAX_FILES:
        return None
    trees: dict[str, tuple[ast.Module, ast.Module]] = {}
    for path in [*py_sources, *py_tests]:
        before, after = _parse(_git_show(repo, base, path)), _parse(_git_show(repo, commit.sha, path))
        if before is None or after is None:
            return None
        trees[path] = (before, after)

    shape = ChangeShape(source_lines=_numstat(repo, base, commit.sha, py_sources))
    before_names: set[str] = set()
    after_defs: dict[str, str] = {}
    before_defs: dict[str, str] = {}
    for path in py_sources:
        before, after = trees[path]
        for name, node in _functions(before):
            before_names.add(name.rsplit(".", 1)[-1])
            before_defs[f"{path}:{name}"] = _own_code(node)
        for name, node in _functions(after):
            after_defs[f"{path}:{name}"] = _own_code(node)
    for path in py_sources:
        before, after = trees[path]
        old_settings, new_settings = _module_settings(before), _module_settings(after)
        shape.changed_functions += [
            name for name, code in new_settings.items() if name in old_settings and old_settings[name] != code
        ]
    for key, code in after_defs.items():
        name = key.split(":", 1)[1]
        if key in before_defs:
            if before_defs[key] != code:
                shape.changed_functions.append(name)
        elif _is_public(name) and name.rsplit(".", 1)[-1] not in before_names:
            shape.added_names.append(name)
    added_short = {name.rsplit(".", 1)[-1] for name in shape.added_names}

    for path in py_tests:
        before, after = trees[path]
        old = {name: ast.dump(node) for name, node in _functions(before)}
        for name, node in _functions(after):
            short = name.rsplit(".", 1)[-1]
            if not short.startswith("test") or isinstance(node, ast.ClassDef):
                continue
            if name not in old:
                shape.new_tests.append(name)
            elif old[name] != ast.dump(node):
                shape.changed_tests.append(name)
            else:
                continue
            if _names_used(node) & added_short:
                shape.tests_on_new_names.append(name)
            if _asserts(node):
                shape.asserting_tests.append(name)
    for before, after in trees.values():
        shape.raised_or_caught |= _exception_names(before) | _exception_names(after)
    return shape
