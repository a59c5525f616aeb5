"""What a commit changed, read from git without running anything: the shape the screen judges.

A fix changes existing functions and adds or changes tests that check them; a feature adds new public names and
tests that call those. `read_change` reads every file of a commit at its parent and at the commit:
- Python source files and stubs (`.pyi`), parsed with the standard library's `ast` (Python 3.12's type parameters
  too: bugsweep.mining.syntax): new public names (functions, classes, methods, class and module attributes,
  parameters of existing functions, a public class's `__init__` included), existing functions whose code changed
  (docstrings, comments, formatting, type annotations and statements that serve type checkers only set aside:
  typing imports, TypeVars, type aliases, `if TYPE_CHECKING:` blocks), the lines changed;
- test files: the tests added or changed (a test reading a table of cases its module or class changed, as
  `@pytest.mark.parametrize(..., CASES)` does, is changed), which of them assert (directly or through a helper of
  their module) and which use a new name;
- changelog entries (towncrier fragments, reno notes, the added lines of CHANGES / CHANGELOG / NEWS / HISTORY, by
  their first word or the section heading they are under, Markdown or reStructuredText): what kind of change the
  project says it is (a fix, a feature, a removal);
- documentation, changelogs and project tooling (CI, packaging, linters) change no behaviour; other files that
  ship with the code (data, translations) may.
Source files in another language, Python that does not parse, or more than MAX_FILES Python files cannot be read:
`ChangeShape.unreadable` names them, and the screen then says it judged by the words alone.
"""

from __future__ import annotations

import ast
import builtins
import copy
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from bugsweep.mining.cases import Definition, assignments, grown_cases, tables
from bugsweep.mining.changelog import changelog_kinds, is_changelog
from bugsweep.mining.records import Commit
from bugsweep.mining.syntax import parse_newer

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
#: Calls and statements that make a test line an assertion (leading underscores set aside: `self._assert_range`).
ASSERT_CALL_PREFIXES = ("assert", "fail", "raises", "warns", "expect", "check")
#: Suffixes of files that hold no code: documentation, text, configuration.
TEXT_SUFFIXES = {
    ".rst", ".md", ".txt", ".html", ".css", ".cfg", ".ini", ".toml", ".yaml", ".yml", ".json", ".lock", ".in",
    ".svg", ".png", ".jpg", ".gif", ".ico", ".bib", ".tex", ".ipynb",
}  # fmt: skip
#: Folders of documentation, examples, CI and tooling: nothing there is the code under test.
TOOLING_DIRS = {"docs", "doc", "examples", "example", "benchmarks", "benchmark", "bench", ".github", ".circleci",
                "ci", "ci_tools", "scripts", "tools", "misc", "releasenotes", "changelog", "changelog.d",
                "newsfragments"}  # fmt: skip
#: Top-level files of the project itself (packaging, CI, linters), not of the code under test.
TOOLING_NAMES = {
    "setup.py", "setup.cfg", "pyproject.toml", "tox.ini", "noxfile.py", "Makefile", "MANIFEST.in", "uv.lock",
    ".pre-commit-config.yaml", ".gitignore", ".flake8", ".coveragerc", ".editorconfig", ".mergify.yml",
    ".travis.yml", "appveyor.yml", "azure-pipelines.yml", ".readthedocs.yml", ".readthedocs.yaml", "mkdocs.yml",
    "conftest.py", "LICENSE", "AUTHORS", "CONTRIBUTORS", "HOWTOPUBLISH",
}  # fmt: skip


@dataclass
class ChangeShape:
    """The parts of a commit's change that tell a fix from a feature."""

    added_names: list[str] = field(default_factory=list)
    """New public names in source files and stubs: functions, classes, methods (`Class.method`), class and module
    attributes that are not constants, and parameters of existing functions (`func(param)`)."""
    changed_functions: list[str] = field(default_factory=list)
    """Functions, methods and module-level constants of source files that existed before and whose code changed
    (docstrings, comments, formatting and type annotations set aside)."""
    source_lines: int = 0
    """Lines added plus lines removed in Python source files (stubs not counted)."""
    code_changed: bool = True
    """False when no Python source changed once docstrings, comments, formatting and type annotations are set
    aside, and no other file that ships with the code changed."""
    only_annotations: bool = False
    """Of a change without code changed: its source files' type annotations changed."""
    new_tests: list[str] = field(default_factory=list)
    """Test functions the commit added."""
    changed_tests: list[str] = field(default_factory=list)
    """Test functions that existed before and whose code (decorators included) changed."""
    grown_tests: list[str] = field(default_factory=list)
    """Of the changed tests, those that only gained cases (new test nodes for pytest: bugsweep/mining/cases.py)."""
    tests_on_new_names: list[str] = field(default_factory=list)
    """Of the new and changed tests, those that use a name the commit added."""
    asserting_tests: list[str] = field(default_factory=list)
    """Of the new and changed tests, those holding an assertion (assert, pytest.raises, self.assert*..., or a call
    of a helper of their module that asserts)."""
    raised_or_caught: set[str] = field(default_factory=set)
    """Exception names raised, caught or expected by a test in the changed files, before or after (read from
    `unread_exceptions` when `is_exception` first needs them: walking whole trees is most of a big file's cost)."""
    unread_exceptions: list[ast.Module] = field(default_factory=list, repr=False, compare=False)
    changelog: dict[str, list[str]] = field(default_factory=dict)
    """What the change's changelog entries say it is: kind ('fix', 'feature', 'removal') -> the files saying it."""
    unreadable: list[str] = field(default_factory=list)
    """Files the screen cannot read (a source file in another language, Python that does not parse), or why the
    change was not read (more than MAX_FILES Python files): the shape above is then unknown."""

    @property
    def readable(self) -> bool:
        return not self.unreadable

    @property
    def added_definitions(self) -> list[str]:
        """The new public names that are not parameters of existing functions."""
        return [name for name in self.added_names if not name.endswith(")")]

    @property
    def tests_on_existing_names(self) -> list[str]:
        """New or changed tests that assert something without using any added name: existing behaviour."""
        on_new = set(self.tests_on_new_names)
        return [t for t in self.asserting_tests if t not in on_new]

    @property
    def changelog_kind(self) -> str | None:
        """The one kind of change the changelog entries say (None: none, or several)."""
        return next(iter(self.changelog)) if len(self.changelog) == 1 else None

    def is_exception(self, word: str) -> bool:
        """A real exception mention: a builtin exception, or one the code raises or catches that the commit did not
        add (a class such as `ParsedException` that the commit defines is a new name, not an exception fixed)."""
        if word in BUILTIN_EXCEPTIONS:
            return True
        for tree in self.unread_exceptions:
            self.raised_or_caught |= _exception_names(tree)
        self.unread_exceptions = []
        added = {name.rsplit(".", 1)[-1] for name in self.added_names}
        return word in self.raised_or_caught and word not in added


def _git_show(repo: Path, rev: str, path: str) -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(repo), "show", f"{rev}:{path}"], capture_output=True, text=True, errors="replace"
    )
    return proc.stdout if proc.returncode == 0 else None


def _diff(repo: Path, base: str, sha: str, paths: Sequence[str], *args: str) -> str:
    if not paths:
        return ""
    return subprocess.run(
        ["git", "-C", str(repo), "diff", "--no-renames", *args, base, sha, "--", *paths],
        capture_output=True,
        text=True,
        errors="replace",
    ).stdout


def _numstat(repo: Path, base: str, sha: str, paths: Sequence[str]) -> tuple[int, int]:
    """(lines added, lines removed) in `paths`."""
    counts = [0, 0]
    for line in _diff(repo, base, sha, paths, "--numstat").splitlines():
        for side, count in enumerate(line.split("\t", 2)[:2]):
            counts[side] += int(count) if count.isdigit() else 0
    return counts[0], counts[1]


def _functions(tree: ast.Module) -> Iterator[tuple[str, Definition]]:
    """Top-level functions and classes, and the methods and nested classes of classes, by qualified name."""

    def walk(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, Definition]]:
        for node in body:
            if isinstance(node, Definition):
                yield prefix + node.name, node
                if isinstance(node, ast.ClassDef):
                    yield from walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.If | ast.Try):  # under `if sys.version_info ...` / `try: import`
                yield from walk(node.body, prefix)
                yield from walk(node.orelse, prefix)

    yield from walk(tree.body, "")


def _is_public(qualified: str) -> bool:
    return not any(part.startswith("_") for part in qualified.split("."))


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _takes_public_arguments(qualified: str) -> bool:
    """Whether callers pass arguments to this function: a public one, or a special method of a public class
    (`Client.__init__`, `Client.__call__`: a new parameter there is a new parameter of `Client(...)`)."""
    owner, _, short = qualified.rpartition(".")
    return _is_public(qualified) or (bool(owner) and _is_dunder(short) and _is_public(owner))


#: Modules whose imports serve type annotations only.
TYPING_MODULES = {"typing", "typing_extensions", "__future__"}
#: Calls that make a name for type checkers only (`T = TypeVar("T")`).
TYPING_CALLS = {"TypeVar", "ParamSpec", "TypeVarTuple", "NewType", "TypeAliasType"}


def _dotted_last(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _typing_only(node: ast.AST) -> bool:
    """A statement that serves type checkers only: an import from typing, a TypeVar (or NewType, ParamSpec, ...)
    made, a type alias declared (`X: TypeAlias = ...`, `type X = ...`), an `if TYPE_CHECKING:` block."""
    if isinstance(node, ast.Import):
        return all(alias.name.split(".")[0] in TYPING_MODULES for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] in TYPING_MODULES
    if (
        isinstance(node, ast.Assign | ast.AnnAssign)
        and isinstance(node.value, ast.Call)
        and _dotted_last(node.value.func) in TYPING_CALLS
    ):
        return True
    if isinstance(node, ast.AnnAssign) and _dotted_last(node.annotation) == "TypeAlias":
        return True
    if type(node).__name__ == "TypeAlias":  # `type X = ...` (Python 3.12)
        return True
    return isinstance(node, ast.If) and _dotted_last(node.test) == "TYPE_CHECKING" and not node.orelse


class _Behaviour(ast.NodeTransformer):
    """A copy of a tree without what does not change behaviour: docstrings and, with `annotations`, type
    annotations and statements that serve type checkers only (`_typing_only`); comments and formatting are not in
    the tree at all."""

    def __init__(self, annotations: bool) -> None:
        self.annotations = annotations

    def generic_visit(self, node: ast.AST) -> ast.AST:
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | Definition)
            and isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
        if self.annotations:
            for name in ("body", "orelse", "finalbody"):
                statements = getattr(node, name, None)
                if isinstance(statements, list) and any(_typing_only(n) for n in statements):
                    kept = [n for n in statements if not _typing_only(n)]
                    setattr(node, name, kept or ([ast.Pass()] if name == "body" else []))
            if isinstance(node, ast.arg):
                node.annotation = None
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                node.returns = None
        return super().generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if not self.annotations:
            return self.generic_visit(node)
        if node.value is None:
            return None  # a declaration only: `name: int`
        return self.generic_visit(ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno))


def _stripped(tree: ast.Module, annotations: bool = True) -> ast.Module:
    """A copy of `tree` without docstrings and (with `annotations`) type annotations."""
    result = _Behaviour(annotations).visit(copy.deepcopy(tree))
    assert isinstance(result, ast.Module)
    return result


def _own_code(node: ast.AST) -> str:
    """A definition's code without the bodies of the methods it holds (those are compared on their own)."""
    if isinstance(node, ast.ClassDef):
        kept = [n for n in node.body if not isinstance(n, Definition)]
        parts: list[ast.AST] = [*node.bases, *node.keywords, *kept, *node.decorator_list]
        return "\n".join(ast.dump(part) for part in parts)
    return ast.dump(node)


def _assigned(body: list[ast.stmt]) -> dict[str, str]:
    """Names a body's assignments set (constants, compiled patterns, tables, attributes) -> the value's code; type
    aliases and TypeVars (`_typing_only`) serve type checkers, and `type X = ...` is no assignment on Python 3.12."""
    kept = assignments([node for node in body if not _typing_only(node)])
    return {name: ast.dump(value) for name, value in kept.items() if name != "__all__"}


def _is_metadata(name: str) -> bool:
    """Module metadata (`__version__`, `__version_info__`, `__author__`): no behaviour."""
    short = name.rsplit(".", 1)[-1]
    return short.startswith("__") and short.endswith("__")


def _is_constant_name(name: str) -> bool:
    return name.isupper() or name.startswith("_")


def _parameters(node: ast.AST) -> list[str]:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return []
    a = node.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if p is not None]


def _names_used(node: ast.AST) -> set[str]:
    used: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            used.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            used.add(sub.attr)
        elif isinstance(sub, ast.alias):
            used.add(sub.asname or sub.name.rsplit(".", 1)[-1])
        elif isinstance(sub, ast.keyword) and sub.arg:
            used.add(sub.arg)
    return used


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _asserts(node: ast.AST, helpers: frozenset[str] = frozenset()) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assert):
            return True
        if isinstance(sub, ast.Call):
            name = _call_name(sub)
            if name.lstrip("_").lower().startswith(ASSERT_CALL_PREFIXES) or name in helpers:
                return True
    return False


def _asserting_helpers(tree: ast.Module) -> frozenset[str]:
    """Functions of a test module that are not tests and assert (`_assert_range`, `check_table`, a fixture that
    compares): a test calling one asserts too. Helpers calling helpers are followed."""
    candidates = {
        name.rsplit(".", 1)[-1]: node
        for name, node in _functions(tree)
        if not isinstance(node, ast.ClassDef) and not name.rsplit(".", 1)[-1].startswith("test")
    }
    found: set[str] = set()
    while True:
        more = {n for n, node in candidates.items() if n not in found and _asserts(node, frozenset(found))}
        if not more:
            return frozenset(found)
        found |= more


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
        return parse_newer(text)
    except (SyntaxError, ValueError):
        return None


def file_role(path: str, is_test: bool, is_source: bool) -> str:
    """What a changed file is to the screen: 'test', 'python' (a source file), 'stub', 'changelog', 'other source'
    (another language), 'text' (documentation, changelogs, project tooling: no behaviour) or 'data' (anything
    else, which ships with the code and may change what it does)."""
    p = PurePosixPath(path)
    if is_test:
        return "test"
    if is_changelog(path):
        return "changelog"
    if is_source:
        return "python" if p.suffix == ".py" else "stub" if p.suffix == ".pyi" else "other source"
    if (
        p.suffix.lower() in TEXT_SUFFIXES
        or p.name in TOOLING_NAMES
        or p.name.startswith(("README", "LICENSE", "requirements"))
        or (p.parts and p.parts[0] in TOOLING_DIRS)
        or p.suffix == ".py"  # Python outside the code under test: packaging, docs, examples, tooling
    ):
        return "text"
    return "data"


def _changelog_kinds(repo: Path, base: str, sha: str, path: str) -> set[str]:
    """What a changed changelog file says the change is (changelog.changelog_kinds), read from git."""
    return changelog_kinds(
        path, lambda: _git_show(repo, sha, path) or "", lambda: _diff(repo, base, sha, [path], "-U0")
    )


def read_change(
    repo: Path,
    commit: Commit,
    source_files: Sequence[str],
    test_files: Sequence[str],
    other_files: Sequence[str] = (),
) -> ChangeShape | None:
    """The shape of `commit`'s change against its first parent (None for a root commit). `other_files` are the
    changed files that are neither tests nor source files (docs, changelogs, configuration, data)."""
    if not commit.parents:
        return None
    base = commit.parents[0]
    shape = ChangeShape()
    roles = {p: file_role(p, False, True) for p in source_files} | {
        p: file_role(p, False, False) for p in other_files
    }
    for path, role in roles.items():
        if role == "changelog":
            for kind in _changelog_kinds(repo, base, commit.sha, path):
                shape.changelog.setdefault(kind, []).append(path)
    py_sources = [p for p in source_files if roles[p] == "python"]
    stubs = [p for p in source_files if roles[p] == "stub"]
    py_tests = [p for p in test_files if p.endswith(".py")]
    shape.unreadable = [p for p in source_files if roles[p] == "other source"]
    if len(py_sources) + len(stubs) + len(py_tests) > MAX_FILES:
        shape.unreadable.append(f"more than {MAX_FILES} Python files")
    if shape.unreadable:
        return shape
    trees: dict[str, tuple[ast.Module, ast.Module]] = {}
    lines: dict[str, tuple[list[str], list[str]]] = {}
    for path in [*py_sources, *stubs, *py_tests]:
        texts = _git_show(repo, base, path), _git_show(repo, commit.sha, path)
        lines[path] = ((texts[0] or "").splitlines(), (texts[1] or "").splitlines())
        try:
            before, after = _parse(texts[0]), _parse(texts[1])
        except (RecursionError, MemoryError):  # a generated table deeper than the parser builds
            shape.unreadable.append(f"{path} (nested too deeply to read)")
            continue
        if before is None or after is None:
            shape.unreadable.append(f"{path} (does not parse)")
            continue
        trees[path] = (before, after)
    if shape.unreadable:
        return shape

    added, removed = _numstat(repo, base, commit.sha, py_sources)
    shape.source_lines = added + removed
    try:
        _read_sources(shape, {p: trees[p] for p in py_sources}, {p: trees[p] for p in stubs}, lines)
        data = [p for p, role in roles.items() if role == "data"]
        if not shape.changed_functions and not shape.added_names and not data:
            pairs = [trees[p] for p in py_sources]
            shape.code_changed = any(ast.dump(_stripped(b)) != ast.dump(_stripped(a)) for b, a in pairs)
            shape.only_annotations = not shape.code_changed and any(
                ast.dump(_stripped(b, annotations=False)) != ast.dump(_stripped(a, annotations=False))
                for b, a in pairs
            )
        _read_tests(shape, {p: (*trees[p], *lines[p]) for p in py_tests})
    except RecursionError:  # parsed, but deeper than the ast module walks (idna's 2013 generated idnadata.py)
        deep = [path for path, pair in trees.items() if not _walkable(pair)] or list(trees)
        return ChangeShape(
            changelog=shape.changelog, unreadable=[f"{p} (nested too deeply to read)" for p in deep]
        )
    shape.unread_exceptions = [tree for pair in trees.values() for tree in pair]
    return shape


def _walkable(trees: tuple[ast.Module, ...]) -> bool:
    """Whether the ast module walks these trees within Python's recursion limit."""
    try:
        return all(ast.dump(tree) for tree in trees)
    except RecursionError:
        return False


def _read_sources(
    shape: ChangeShape,
    sources: dict[str, tuple[ast.Module, ast.Module]],
    stubs: dict[str, tuple[ast.Module, ast.Module]],
    lines: dict[str, tuple[list[str], list[str]]],
) -> None:
    """New public names (from source files and stubs) and changed functions and attributes (from source files)."""
    before_names: set[str] = set()
    before_defs: dict[str, Definition] = {}
    after_defs: dict[str, Definition] = {}
    for path, (before, after) in [*sources.items(), *stubs.items()]:
        for name, node in _functions(before):
            before_names.add(name.rsplit(".", 1)[-1])
            before_defs[f"{path}:{name}"] = node
        for name, node in _functions(after):
            after_defs[f"{path}:{name}"] = node
        old_attrs, new_attrs = _attributes(before), _attributes(after)
        before_names.update(n.rsplit(".", 1)[-1] for n in old_attrs)
        for name in new_attrs.keys() - old_attrs.keys():
            short = name.rsplit(".", 1)[-1]
            if _is_public(name) and not _is_constant_name(short) and name not in shape.added_names:
                shape.added_names.append(name)
        if path in sources:
            # (an assigned value holds no docstring or annotation: nothing to strip first)
            shape.changed_functions += [
                name
                for name, code in new_attrs.items()
                if name in old_attrs and old_attrs[name] != code and not _is_metadata(name)
            ]
    for key, node in after_defs.items():
        path, name = key.split(":", 1)
        old = before_defs.get(key)
        if old is None:
            owner, _, short = name.rpartition(".")
            if short in before_names:
                # a new override in a class that existed: the behaviour of an existing name changes
                if path in sources and f"{path}:{owner}" in before_defs:
                    shape.changed_functions.append(name)
            elif _is_public(name) and name not in shape.added_names:
                shape.added_names.append(name)
            continue
        if (
            path in sources
            and _lines_of(lines[path][0], old) != _lines_of(lines[path][1], node)
            and _own_code(old) != _own_code(node)
            and _stripped_code(old) != _stripped_code(node)
        ):
            shape.changed_functions.append(name)
        if _takes_public_arguments(name):
            for param in _parameters(node):
                added = f"{name}({param})"
                if (
                    param not in _parameters(old)
                    and not param.startswith("_")
                    and added not in shape.added_names
                ):
                    shape.added_names.append(added)


def _stripped_code(node: Definition) -> str:
    """A definition's own code without docstrings and type annotations."""
    return _own_code(_stripped(ast.Module(body=[node], type_ignores=[])).body[0])


def _attributes(tree: ast.Module) -> dict[str, str]:
    """Module-level and class-level assignments by qualified name (`NAME`, `Class.attr`) -> the value's code."""
    found = _assigned(tree.body)
    for name, node in _functions(tree):
        if isinstance(node, ast.ClassDef):
            found |= {f"{name}.{attr}": code for attr, code in _assigned(node.body).items()}
    return found


def _lines_of(lines: list[str], node: Definition) -> list[str]:
    """A definition's source lines, its decorators included."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return lines[first - 1 : node.end_lineno]


def _read_tests(
    shape: ChangeShape, tests: dict[str, tuple[ast.Module, ast.Module, list[str], list[str]]]
) -> None:
    """Tests added and changed (the trees and source lines of each test file before and after)."""
    added_short = {name.rsplit(".", 1)[-1].split("(")[-1].rstrip(")") for name in shape.added_names}
    for before, after, old_lines, new_lines in tests.values():
        helpers = _asserting_helpers(after)
        old = dict(_functions(before))
        # tables of cases a test module or class holds (`CASES = [(input, expected), ...]`, read by
        # `@pytest.mark.parametrize(..., CASES)` or a loop): a test reading a changed one is a changed test
        old_tables, new_tables = _attributes(before), _attributes(after)
        changed_tables = {n.rsplit(".", 1)[-1] for n, code in new_tables.items() if old_tables.get(n) != code}
        case_tables: tuple[dict[str, ast.expr], dict[str, ast.expr]] | None = None  # read once a test changed
        for name, node in _functions(after):
            short = name.rsplit(".", 1)[-1]
            if not short.startswith("test") or isinstance(node, ast.ClassDef):
                continue
            if name not in old:
                shape.new_tests.append(name)
            elif (
                # the same lines are the same code; other lines may be only other formatting
                _lines_of(old_lines, old[name]) != _lines_of(new_lines, node)
                and ast.dump(old[name]) != ast.dump(node)
            ) or (changed_tables and _names_used(node) & changed_tables):
                shape.changed_tests.append(name)
            else:
                continue
            used = _names_used(node)
            if name in old:  # a changed test: did it only gain cases?
                case_tables = case_tables or (tables(before), tables(after))
                if grown_cases(old[name], node, used, *case_tables):
                    shape.grown_tests.append(name)
            if used & added_short:
                shape.tests_on_new_names.append(name)
            if _asserts(node, helpers):
                shape.asserting_tests.append(name)
