"""PYTEST_DONT_REWRITE (pytest: loaded by the probe before pytest starts; never rewrite it)

bugsweep's statement, compiled into the test functions the instruction names (bugsweep_probe.py says what it is
for). Loaded by the probe from beside it, in both runs of the regrade's pair alike; the instruction names each
function (its file and qualified name) and the line its test failed at before (0: it passed).

Where it goes: after the function's body, and before each `return` of the function's own (not of the functions it
defines), so it runs only when the body completes normally: never in a `finally` (then it would be what a failing
body's report shows) and never first (then the test would not call the code under test before it). Its style is
the test's own: `self.assertX(...)` for a unittest-style test that asserts with `assertX` (at its failing line,
else its first assertion), a plain `assert` otherwise and always in a class that cannot be a TestCase (`plain_class`:
a pytest-style class whose `self.assert_same(...)` is a helper of its own, and which has no `assertEqual`); so that code that neutralises the test's own assertions
neutralises it too. Its statements carry the line number of the function's `def` line, where none of the body's
code runs (but in a test written on one line): the probe answers (and records that the body reached its end) only
for calls of its own made from there, in a code object compiled here.

Both ways a test module is compiled are hooked the same way: Python's source loader (unittest, helper modules,
pytest with --assert=plain) and pytest's assertion rewriting (whose cached bytecode of that file is not read).
"""

from __future__ import annotations

import ast
import os
import sys

PROBE = "bugsweep_probe"
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_RETURNED = "_bugsweep_returned"


def _blocks(node):
    """The statement lists directly inside a compound statement that is not a definition."""
    if isinstance(node, _SCOPES):
        return
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list):
            yield block
    for handler in getattr(node, "handlers", None) or ():
        yield handler.body
    for case in getattr(node, "cases", None) or ():
        yield case.body


def _statements(body):
    for node in body:
        yield node
        for block in _blocks(node):
            yield from _statements(block)


def definitions(body, prefix=""):
    """Qualified name -> every function definition of that name in `body` (a module's): `Class.test_x`,
    `f.<locals>.g`, `f.<locals>.C.m`, as Python names them. One walk of the module."""
    found: dict = {}
    for node in _statements(body):
        if isinstance(node, _DEFS):
            name = prefix + node.name
            found.setdefault(name, []).append(node)
            inner = definitions(node.body, name + ".<locals>.")
        elif isinstance(node, ast.ClassDef):
            inner = definitions(node.body, prefix + node.name + ".")
        else:
            continue
        for qualname, nodes in inner.items():
            found.setdefault(qualname, []).extend(nodes)
    return found


def _own_nodes(function):
    """The nodes of the function's own scope, in source order."""
    pending = list(reversed(function.body))
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, _SCOPES):
            pending.extend(reversed(list(ast.iter_child_nodes(node))))


def style(function, line, known):
    """'assert', or the unittest assertion method the test asserts with (at `line` where it failed, else first)."""
    args = function.args.args
    owner = args[0].arg if args else None

    def of(node):
        if isinstance(node, ast.Assert):
            return "assert"
        if (
            owner
            and isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == owner
            and node.func.attr.startswith("assert")
        ):
            return node.func.attr if node.func.attr in known else "assertEqual"
        return None

    nodes = list(_own_nodes(function))
    if line:
        at = [n for n in nodes if getattr(n, "lineno", None) == line]
        for node in at:
            for inner in ast.walk(node):
                found = of(inner)
                if found:
                    return found
    for node in nodes:
        found = of(node)
        if found:
            return found
    return "assert"


def _classes(body):
    """Name -> the class definitions of that name at this level of `body` (its if/try blocks included)."""
    found: dict = {}
    for node in _statements(body):
        if isinstance(node, ast.ClassDef):
            found.setdefault(node.name, []).append(node)
    return found


def plain_class(tree, qualname):
    """Whether the method `qualname` belongs to a class that cannot be a unittest TestCase: its bases, and theirs
    among the module's own classes, are `object` or none (a pytest-style class: `self.assert_same(...)` there is a
    helper of its own, and the class has no `assertEqual`)."""
    parts = qualname.split(".")
    if len(parts) < 2 or "<locals>" in parts:
        return False
    top = _classes(tree.body)
    scope, chain = top, []
    for name in parts[:-1]:
        found = scope.get(name)
        if not found or len(found) != 1:
            return False
        chain.append(found[0])
        scope = _classes(found[0].body)

    def plain(node, seen):
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id == "object":
                continue
            known = top.get(base.id) if isinstance(base, ast.Name) and base.id not in seen else None
            if not known or len(known) != 1 or not plain(known[0], seen | {base.id}):
                return False
        return not node.keywords  # a metaclass could give it anything

    return plain(chain[-1], {chain[-1].name})


def _probe_call(attr, args):
    probe = ast.Call(
        func=ast.Name(id="__import__", ctx=ast.Load()), args=[ast.Constant(value=PROBE)], keywords=[]
    )
    return ast.Call(func=ast.Attribute(value=probe, attr=attr, ctx=ast.Load()), args=args, keywords=[])


def _assertion(kind, owner):
    if kind == "assert":
        message = ast.Constant(value="bugsweep: the mirror run's false assertion")
        return ast.Assert(test=_probe_call("expect", []), msg=message)
    args: list[ast.expr] = [
        ast.Starred(value=_probe_call("expect_args", [ast.Constant(value=kind)]), ctx=ast.Load())
    ]
    method = ast.Attribute(value=ast.Name(id=owner, ctx=ast.Load()), attr=kind, ctx=ast.Load())
    return ast.Expr(value=ast.Call(func=method, args=args, keywords=[]))


def _at(node, line):
    for inner in ast.walk(node):
        if "lineno" in inner._attributes:
            for name, value in (
                ("lineno", line),
                ("col_offset", 0),
                ("end_lineno", line),
                ("end_col_offset", 0),
            ):
                setattr(inner, name, value)
    return node


class _Returns(ast.NodeTransformer):
    """Before each `return` of the function's own scope: the assertion (after the returned value is evaluated)."""

    def __init__(self, make):
        self.make = make

    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

    def visit_Return(self, node):
        if node.value is None:
            return [self.make(), node]
        keep = ast.copy_location(
            ast.Assign(targets=[ast.Name(id=_RETURNED, ctx=ast.Store())], value=node.value), node
        )
        keep.targets[0] = ast.copy_location(keep.targets[0], node)
        back = ast.copy_location(
            ast.Return(value=ast.copy_location(ast.Name(id=_RETURNED, ctx=ast.Load()), node)), node
        )
        return [keep, self.make(), back]


def inject(tree, qualname, line, known, index=None):
    """Add the statement to every definition of `qualname` in `tree` (`index`: its `definitions`, when known: then
    the caller fixes the tree's missing locations once). Returns (style, the definitions, the lines the statements carry: each its function's `def` line), or None when
    there is no such function."""
    functions = (definitions(tree.body) if index is None else index).get(qualname)
    if not functions:
        return None
    kinds, lines = [], set()
    plain = plain_class(tree, qualname)
    for function in functions:
        sentinel = function.lineno
        lines.add(sentinel)
        kind = "assert" if plain else style(function, line, known)
        kinds.append(kind)
        args = function.args.args
        owner = args[0].arg if args else "self"

        def make(kind=kind, owner=owner, sentinel=sentinel):
            return _at(_assertion(kind, owner), sentinel)

        transformer = _Returns(make)
        body = []
        for statement in function.body:
            result = transformer.visit(statement)
            body.extend(result if isinstance(result, list) else [result])
        body.append(make())
        function.body = body
    if index is None:
        ast.fix_missing_locations(tree)
    return kinds[0], functions, lines


def _first_line(function):
    return min([function.lineno] + [d.lineno for d in function.decorator_list])


def codes_of(code, wanted):
    """{key: [code objects]} for the functions compiled into a module's code object, `wanted` mapping each
    function's (name, first line) to its key."""
    found: dict = {}
    pending = [code]
    while pending:
        current = pending.pop()
        key = wanted.get((current.co_name, current.co_firstlineno))
        if key is not None:
            found.setdefault(key, []).append(current)
        pending.extend(c for c in current.co_consts if hasattr(c, "co_consts"))
    return found


class _Target:
    """The files and functions to compile with the statement; records what was done, registers the code made."""

    def __init__(self, targets, record, register):
        self.targets = targets
        self.files = {os.path.realpath(f): f for f in targets}  # real path -> the instruction's name
        self.names = {os.path.basename(f) for f in self.files}
        self.record, self.register = record, register
        probe = sys.modules.get(PROBE)
        self.known = frozenset(getattr(probe, "_ARGS", {}))

    def file_of(self, path):
        """The instruction's name of the file at `path`, or None when it names none there."""
        if not path or os.path.basename(str(path)) not in self.names:
            return None
        return self.files.get(os.path.realpath(str(path)))

    def inject(self, tree, file):
        """The statement into each function of `file` the instruction names. Returns what `found` needs, or None
        when none of them is there."""
        index = definitions(tree.body)
        wanted, lines = {}, {}
        for qualname, line in sorted(self.targets[file].items()):
            done = inject(tree, qualname, line, self.known, index)
            if done is None:
                self.record("inj-miss", file, qualname)
                continue
            kind, functions, at = done
            self.record("inj", file, qualname, kind)
            for function in functions:
                wanted[(function.name, _first_line(function))] = (file, qualname)
            lines[(file, qualname)] = at
        if not lines:
            return None
        ast.fix_missing_locations(tree)
        return wanted, lines

    def found(self, code, pending):
        wanted, lines = pending
        codes = codes_of(code, wanted)
        for key, at in lines.items():
            self.register(key, codes.get(key, ()), at)


def hook_source_loader(targets, record, register):
    """Python's source loader compiles the named files with the statement (and never from their cached bytecode)."""
    from importlib.machinery import SourceFileLoader

    target = _Target(targets, record, register)
    original = SourceFileLoader.get_code

    def get_code(self, fullname):
        try:
            path = self.get_filename(fullname)
        except ImportError:
            path = None
        file = target.file_of(path)
        if file is not None:
            source = self.get_data(path)
            tree = ast.parse(source, filename=path)
            pending = target.inject(tree, file)
            if pending is not None:
                code = compile(tree, path, "exec", dont_inherit=True)
                target.found(code, pending)
                return code
        return original(self, fullname)

    SourceFileLoader.get_code = get_code  # type: ignore[method-assign]


def hook_pytest(targets, record, register):
    """pytest's assertion rewriting does the same for the test modules it compiles itself."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return
    target = _Target(targets, record, register)
    pending = []
    original_rewrite, original_test, original_read = (
        rewrite.rewrite_asserts,
        rewrite._rewrite_test,
        rewrite._read_pyc,
    )

    def rewrite_asserts(mod, *args, **kwargs):
        path = kwargs.get("module_path") or next((a for a in args if isinstance(a, str)), None)
        file = target.file_of(path)
        if file is not None:
            done = target.inject(mod, file)
            if done is not None:
                pending.append(done)
        return original_rewrite(mod, *args, **kwargs)

    def _rewrite_test(fn, *args, **kwargs):
        result = original_test(fn, *args, **kwargs)
        while pending:
            target.found(result[-1], pending.pop())
        return result

    def _read_pyc(source, *args, **kwargs):
        return None if target.file_of(source) is not None else original_read(source, *args, **kwargs)

    rewrite.rewrite_asserts = rewrite_asserts
    rewrite._rewrite_test = _rewrite_test
    rewrite._read_pyc = _read_pyc
