"""PYTEST_DONT_REWRITE (pytest: loaded by the probe before pytest starts; never rewrite it)

The armed test's extra assertion, compiled into its function (bugsweep_probe.py says what it is for). Loaded by
the probe from beside it, in both runs of the regrade's pair alike; the instruction names the function (its file and
qualified name) and the line its test failed at before.

Where it goes: after the function's body, and before each `return` of the function's own (not of the functions it
defines), so it runs only when the body completes normally: never in a `finally` (then it would be what a failing
body's report shows) and never first (then the test would not call the code under test before it). Its style is
the test's own: `self.assertX(...)` for a unittest-style test that asserts with `assertX` (at its failing line,
else its first assertion), a plain `assert` otherwise; so that code that neutralises the test's own assertions
neutralises it too. Its statements carry the line number of the function's `def` line, where none of the body's
code runs (but in a test written on one line): the probe answers only calls of its own made from there.

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


def find(body, parts):
    """Every function definition at the qualified name `parts` (['Class', 'test_x'], ['f', '<locals>', 'g'])."""
    found = []
    name, rest = parts[0], parts[1:]
    for node in _statements(body):
        if getattr(node, "name", None) != name:
            continue
        if not rest:
            if isinstance(node, _DEFS):
                found.append(node)
        elif rest[0] == "<locals>" and isinstance(node, _DEFS) and len(rest) > 1:
            found += find(node.body, rest[1:])
        elif isinstance(node, ast.ClassDef):
            found += find(node.body, rest)
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


def inject(tree, qualname, line, known):
    """Add the assertion to every definition of `qualname` in `tree`. Returns (style, the definitions, the lines the
    assertions carry: each its function's `def` line), or None when there is no such function."""
    functions = find(tree.body, qualname.split("."))
    if not functions:
        return None
    kinds, lines = [], set()
    for function in functions:
        sentinel = function.lineno
        lines.add(sentinel)
        kind = style(function, line, known)
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
    ast.fix_missing_locations(tree)
    return kinds[0], functions, lines


def armed_codes(code, functions):
    """The code objects compiled from `functions` (by name and first line), found in a module's code object."""
    wanted = {(f.name, min([f.lineno] + [d.lineno for d in f.decorator_list])) for f in functions}
    found, pending = [], [code]
    while pending:
        current = pending.pop()
        if (current.co_name, current.co_firstlineno) in wanted:
            found.append(current)
        pending.extend(c for c in current.co_consts if hasattr(c, "co_consts"))
    return tuple(found)


class _Target:
    def __init__(self, state, record):
        self.state, self.record = state, record
        self.file = os.path.realpath(state.armed.get("file") or "")
        self.name = os.path.basename(self.file)
        probe = sys.modules.get(PROBE)
        self.known = frozenset(getattr(probe, "_ARGS", {}))

    def matches(self, path):
        return (
            bool(path)
            and os.path.basename(str(path)) == self.name
            and os.path.realpath(str(path)) == self.file
        )

    def inject(self, tree, path):
        armed = self.state.armed
        done = inject(tree, str(armed.get("qualname") or ""), int(armed.get("line") or 0), self.known)
        if done is None:
            self.record("inj-miss", str(path), armed.get("qualname"))
            return None
        kind, functions, lines = done
        self.state.lines = self.state.lines | lines
        self.record("inj", str(path), armed.get("qualname"), kind)
        return functions

    def found(self, code, functions):
        self.state.codes = tuple(self.state.codes) + armed_codes(code, functions)


def hook_source_loader(state, record):
    """Python's source loader compiles the armed file with the assertion (and never from its cached bytecode)."""
    from importlib.machinery import SourceFileLoader

    target = _Target(state, record)
    original = SourceFileLoader.get_code

    def get_code(self, fullname):
        try:
            path = self.get_filename(fullname)
        except ImportError:
            path = None
        if target.matches(path):
            source = self.get_data(path)
            tree = ast.parse(source, filename=path)
            functions = target.inject(tree, path)
            if functions is not None:
                code = compile(tree, path, "exec", dont_inherit=True)
                target.found(code, functions)
                return code
        return original(self, fullname)

    SourceFileLoader.get_code = get_code  # type: ignore[method-assign]


def hook_pytest(state, record):
    """pytest's assertion rewriting does the same for the test modules it compiles itself."""
    try:
        from _pytest.assertion import rewrite
    except ImportError:
        return
    target = _Target(state, record)
    pending = []
    original_rewrite, original_test, original_read = (
        rewrite.rewrite_asserts,
        rewrite._rewrite_test,
        rewrite._read_pyc,
    )

    def rewrite_asserts(mod, *args, **kwargs):
        path = kwargs.get("module_path") or next((a for a in args if isinstance(a, str)), None)
        if target.matches(path):
            functions = target.inject(mod, path)
            if functions is not None:
                pending.append(functions)
        return original_rewrite(mod, *args, **kwargs)

    def _rewrite_test(fn, *args, **kwargs):
        result = original_test(fn, *args, **kwargs)
        while pending:
            target.found(result[-1], pending.pop())
        return result

    def _read_pyc(source, *args, **kwargs):
        return None if target.matches(source) else original_read(source, *args, **kwargs)

    rewrite.rewrite_asserts = rewrite_asserts
    rewrite._rewrite_test = _rewrite_test
    rewrite._read_pyc = _read_pyc
