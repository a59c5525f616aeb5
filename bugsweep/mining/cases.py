"""Cases added to a test: what pytest collects as new tests although no test function is new.

A case added to `@pytest.mark.parametrize(...)`'s list, or to a table of cases a test module or class holds
(`CASES = [(input, expected), ...]`) and a test reads, is a new test node (`test_x[case]`) for pytest; the cases
that were there are unchanged. A changed case, or any other change, is a change of what an existing test expects.
"""

from __future__ import annotations

import ast

Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def only_adds_cases(before: ast.AST, after: ast.AST) -> bool:
    """Whether `after` is `before` with items added to its list, tuple or set literals and nothing else changed
    (the items that were there are kept, in order)."""
    if type(before) is not type(after):
        return False
    if isinstance(before, ast.List | ast.Tuple | ast.Set):
        assert isinstance(after, ast.List | ast.Tuple | ast.Set)
        kept = iter(ast.dump(item) for item in after.elts)
        return all(ast.dump(item) in kept for item in before.elts)
    for name, value in ast.iter_fields(before):
        other = getattr(after, name, None)
        if isinstance(value, list):
            if not isinstance(other, list) or len(other) != len(value):
                return False
            if not all(_same_or_more(a, b) for a, b in zip(value, other, strict=True)):
                return False
        elif not _same_or_more(value, other):
            return False
    return True


def _same_or_more(before: object, after: object) -> bool:
    if isinstance(before, ast.AST) and isinstance(after, ast.AST):
        return only_adds_cases(before, after)
    return before == after


def assignments(body: list[ast.stmt]) -> dict[str, ast.expr]:
    """Names a body's assignments set (`NAME = ...`, `NAME: T = ...`) -> the value (the last assignment wins)."""
    found: dict[str, ast.expr] = {}
    for node in body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {t.id: node.value for t in targets if isinstance(t, ast.Name)}
    return found


def tables(tree: ast.Module) -> dict[str, ast.expr]:
    """Module-level and class-level assignments (`CASES = [...]`, `Class.CASES = [...]`) by name -> their value."""
    found = assignments(tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found |= {f"{node.name}.{name}": value for name, value in assignments(node.body).items()}
    return found


def grown_cases(
    old: Definition,
    new: Definition,
    read: set[str],
    old_tables: dict[str, ast.expr],
    new_tables: dict[str, ast.expr],
) -> bool:
    """Whether a changed test only gained cases: its body is the same (a list grown in an assertion is a changed
    expectation), its decorators gained items only, and every table of its module it reads (`read`, short names;
    the module's `tables` before and after) that changed gained items only."""
    if [ast.dump(n) for n in old.body] != [ast.dump(n) for n in new.body] or len(old.decorator_list) != len(
        new.decorator_list
    ):
        return False
    if not all(only_adds_cases(a, b) for a, b in zip(old.decorator_list, new.decorator_list, strict=True)):
        return False
    return not any(
        name.rsplit(".", 1)[-1] in read
        and (was := old_tables.get(name)) is not None
        and ast.dump(was) != ast.dump(value)
        and not only_adds_cases(was, value)
        for name, value in new_tables.items()
    )
