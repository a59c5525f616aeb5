"""Whole-function edits: the model writes the corrected function as plain code instead of inside JSON arguments.

Why: small models reason far worse about code they write inside a tool call's JSON than about code they write as
text. Measured on the embedded Qwen2.5-Coder-1.5B (bench/README.md, "whole-function edits"): at the point where it
had read the buggy function, its edit_file calls carried a correct fix in about 1 of 5 samples, while asked in one
sentence for the whole corrected function in a ```python block it wrote a correct one in 5 of 5.

So under the `small-model` policy (small_model/) an edit_file call whose `old` lies inside one Python function
is first tried as sent, and kept when the tests pass with it (asked for the whole function after a right one-line
fix, the model copied the function unchanged). Otherwise it is undone and used to find *where* to edit, not *what*
to write: the policy takes the call out of the conversation (the model would copy its own `new` again), asks for
the whole function as a code block, and the code block of the next reply replaces the function. A function written
back unchanged moves the request to the one function of the file that it calls. Everything in this module is pure
text-in, text-out, so it is tested without a model or a sandbox; the policy (small_model/whole_function.py) does
the asking.
"""

from __future__ import annotations

import ast
import keyword
import re
import textwrap
from dataclasses import dataclass

#: Functions longer than this are edited with old/new as usual: rewriting them whole costs more than it helps.
MAX_FUNCTION_LINES = 80

_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:^[ \t]*```|\Z)", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class FunctionSpan:
    """One function definition in a file: where it is and what it says now."""

    path: str
    """Repository-relative path of the file."""
    name: str
    first: int
    """First line (1-based), decorators included."""
    last: int
    """Last line (1-based), inclusive."""
    indent: str
    """The indentation of its `def` line (a method's is the class body's)."""
    source: str
    """The lines first..last as they are in the file."""


_Function = ast.FunctionDef | ast.AsyncFunctionDef


def _top(node: _Function) -> int:
    """A definition's first line: its first decorator's, or the `def` line."""
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])


def _span(source: str, path: str, node: _Function, max_lines: int) -> FunctionSpan | None:
    """The FunctionSpan of a parsed definition; None when it is longer than `max_lines`."""
    top, last = _top(node), node.end_lineno or node.lineno
    if last - top + 1 > max_lines:
        return None
    lines = source.split("\n")
    def_line = lines[node.lineno - 1]
    return FunctionSpan(
        path=path,
        name=node.name,
        first=top,
        last=last,
        indent=def_line[: len(def_line) - len(def_line.lstrip())],
        source="\n".join(lines[top - 1 : last]),
    )


def _functions(source: str) -> list[_Function] | None:
    """Every function definition in `source` (methods and nested ones included); None when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    return [node for node in ast.walk(tree) if isinstance(node, _Function) and node.end_lineno is not None]


def enclosing_function(
    source: str, path: str, start: int, end: int, max_lines: int = MAX_FUNCTION_LINES
) -> FunctionSpan | None:
    """The innermost function whose lines hold the characters source[start:end]; None when the text is not inside
    one function (module level, several functions, a class body), the file does not parse, or the function is
    longer than `max_lines`."""
    first_line = source.count("\n", 0, start) + 1
    last_line = source.count("\n", 0, max(end - 1, start)) + 1
    best: _Function | None = None
    for node in _functions(source) or []:
        assert node.end_lineno is not None
        if (
            _top(node) <= first_line
            and last_line <= node.end_lineno
            and (best is None or node.lineno > best.lineno)
        ):
            best = node
    return None if best is None else _span(source, path, best, max_lines)


_DEF_NAME = re.compile(r"\bdef\s+(\w+)\s*\(")


_WORD = re.compile(r"[A-Za-z_]\w*|\d+")


def function_meant(
    source: str, path: str, old: str, *, found_nowhere: bool, max_lines: int = MAX_FUNCTION_LINES
) -> FunctionSpan | None:
    """The one function an edit_file `old` means when it does not match exactly one place of the file.

    Seen on the 1.5B model editing a file it had not read (bench/README.md): `old` was the function's name alone
    (found twice: the def and a call), a line it had imagined, or the function copied with a changed docstring.
    Its meaning is still clear, in this order: the first function `old` defines (`def name(`); the one function
    of the file whose name `old` uses; and, when `old` is found nowhere, the one function whose source holds the
    most of `old`'s words and numbers (at least 60% of them, strictly more than any other). None otherwise, or
    when that function is defined twice or is longer than `max_lines`.
    """
    functions = _functions(source) or []
    by_name: dict[str, list[_Function]] = {}
    for node in functions:
        by_name.setdefault(node.name, []).append(node)

    def only(name: str) -> FunctionSpan | None:
        nodes = by_name.get(name, [])
        return _span(source, path, nodes[0], max_lines) if len(nodes) == 1 else None

    defined = _DEF_NAME.findall(old)
    if defined:
        return only(defined[0])
    named = {word for word in _WORD.findall(old) if word in by_name}
    if len(named) == 1:
        return only(named.pop())
    words = {w for w in _WORD.findall(old) if not keyword.iskeyword(w)}
    if not found_nowhere or len(words) < 2:
        return None
    lines = source.split("\n")
    scores = sorted(
        (
            (
                len(words & set(_WORD.findall("\n".join(lines[_top(node) - 1 : node.end_lineno]))))
                / len(words),
                i,
            )
            for i, node in enumerate(functions)
        ),
        reverse=True,
    )
    if not scores or scores[0][0] < 0.6 or (len(scores) > 1 and scores[1][0] == scores[0][0]):
        return None
    best = functions[scores[0][1]]
    return only(best.name)


def called_functions(
    source: str, span: FunctionSpan, max_lines: int = MAX_FUNCTION_LINES
) -> list[FunctionSpan]:
    """The functions of `source` (up to `max_lines` long) that the function of `span` calls, by name or as a
    method (`name(...)`, `obj.name(...)`), in file order; the function itself is left out."""
    functions = _functions(source) or []
    here = next((f for f in functions if f.name == span.name and _top(f) == span.first), None)
    if here is None:
        return []
    called = {
        call.func.id if isinstance(call.func, ast.Name) else call.func.attr
        for statement in here.body
        for call in ast.walk(statement)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name | ast.Attribute)
    }
    spans = [
        _span(source, span.path, f, max_lines)
        for f in sorted(functions, key=_top)
        if f.name in called and f.name != span.name
    ]
    return [s for s in spans if s is not None]


def code_blocks(text: str) -> list[str]:
    """The fenced code blocks of a reply (```python, ```py or a bare ```), in order. The last one may be unclosed:
    llama.cpp's tool-call parser can swallow a closing fence at the very end of a reply."""
    return [m.group(1) for m in _BLOCK.finditer(text or "")]


class RewriteError(ValueError):
    """The reply holds no usable version of the function; the message says what to send instead."""


def function_from_reply(text: str, name: str) -> str:
    """The definition of `name` (decorators included, dedented) from the first code block of `text` that has it.

    Anything else in the block (imports, other functions, a class around a method) is left out: only the one
    function is replaced. Raises RewriteError when no block defines `name` or the block is not valid Python.
    """
    blocks = code_blocks(text)
    if not blocks:
        raise RewriteError("your reply had no ```python code block")
    problem = f"no code block in your reply defines {name}"
    for block in blocks:
        code = textwrap.dedent(block)
        if not re.search(rf"\bdef\s+{re.escape(name)}\s*\(", code):
            continue
        try:
            tree = ast.parse(code)
        except SyntaxError as exc:
            problem = f"the code block is not valid Python (line {exc.lineno}: {exc.msg})"
            continue
        for node in ast.walk(tree):
            if isinstance(node, _Function) and node.name == name:
                lines = code.split("\n")[_top(node) - 1 : node.end_lineno]
                return textwrap.dedent("\n".join(lines))
    raise RewriteError(problem)


def keep_docstring(original: str, function: str) -> str:
    """`function` (dedented code of one definition) with what the model left out of `original` (the definition it
    replaces) put back: its docstring, when `function` has none, and its annotated signature, when `function`
    has the same parameters without any annotation.

    Seen on the 1.5B model: its version of a function is the right code without the docstring and type hints the
    function had, so the patch also deleted them. A definition whose body starts on its `def` line, or either
    version not parsing as one function, leaves `function` as it is.
    """
    dedented = textwrap.dedent(original)
    old_node, new_node = _only_function(dedented), _only_function(function)
    if old_node is None or new_node is None:
        return function
    if new_node.body[0].lineno == new_node.lineno or old_node.body[0].lineno == old_node.lineno:
        return function
    old_lines, new_lines = dedented.split("\n"), function.split("\n")
    if _unannotated_twin(old_node, new_node):
        header = old_lines[old_node.lineno - 1 : old_node.body[0].lineno - 1]
        new_lines[new_node.lineno - 1 : new_node.body[0].lineno - 1] = header
        function = "\n".join(new_lines)
        new_node = _only_function(function)
        assert new_node is not None
    if ast.get_docstring(new_node) is not None or ast.get_docstring(old_node) is None:
        return function
    new_lines = function.split("\n")
    doc = old_node.body[0]
    doc_lines = old_lines[doc.lineno - 1 : doc.end_lineno]
    old_indent = _indent_of(old_lines[doc.lineno - 1])
    new_indent = _indent_of(new_lines[new_node.body[0].lineno - 1])
    moved = [
        new_indent + line[len(old_indent) :] if line.startswith(old_indent) else line for line in doc_lines
    ]
    at = new_node.body[0].lineno - 1
    return "\n".join([*new_lines[:at], *moved, *new_lines[at:]])


def _unannotated_twin(old: _Function, new: _Function) -> bool:
    """Whether `new` has the same name and parameters as `old`, none annotated, while `old` has annotations."""

    def params(node: _Function) -> list[ast.arg]:
        a = node.args
        return [
            *a.posonlyargs,
            *a.args,
            *([a.vararg] if a.vararg else []),
            *a.kwonlyargs,
            *([a.kwarg] if a.kwarg else []),
        ]

    def annotated(node: _Function) -> bool:
        return node.returns is not None or any(p.annotation is not None for p in params(node))

    same = (
        old.name == new.name
        and type(old) is type(new)
        and [p.arg for p in params(old)] == [p.arg for p in params(new)]
        and [ast.dump(d) for d in old.args.defaults] == [ast.dump(d) for d in new.args.defaults]
        and [ast.dump(d) if d else None for d in old.args.kw_defaults]
        == [ast.dump(d) if d else None for d in new.args.kw_defaults]
        and bool(old.args.vararg) == bool(new.args.vararg)
        and bool(old.args.kwarg) == bool(new.args.kwarg)
        and len(old.args.posonlyargs) == len(new.args.posonlyargs)
        and len(old.args.kwonlyargs) == len(new.args.kwonlyargs)
    )
    return same and annotated(old) and not annotated(new)


def _only_function(code: str) -> _Function | None:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], _Function):
        return None
    return tree.body[0]


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def splice(source: str, span: FunctionSpan, function: str) -> str:
    """`source` with the lines of `span` replaced by `function` (dedented code), indented like the original."""
    lines = source.split("\n")
    new_lines = [span.indent + line if line.strip() else "" for line in function.rstrip("\n").split("\n")]
    return "\n".join([*lines[: span.first - 1], *new_lines, *lines[span.last :]])


def current_span(source: str, span: FunctionSpan) -> FunctionSpan | None:
    """`span` found again in the file as it is now (the model may have edited it since the request); None when
    the function is gone or no longer parses."""
    candidates = [node for node in _functions(source) or [] if node.name == span.name]
    if not candidates:
        return None
    node = min(candidates, key=lambda n: abs(n.lineno - span.first))
    return _span(source, span.path, node, max_lines=10**6)
