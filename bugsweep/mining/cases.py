"""Definitions and assignments of a module's syntax tree, as the reading of a change needs them."""

from __future__ import annotations

import ast

Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def assignments(body: list[ast.stmt]) -> dict[str, ast.expr]:
    """Names a body's assignments set (`NAME = ...`, `NAME: T = ...`) -> the value (the last assignment wins)."""
    found: dict[str, ast.expr] = {}
    for node in body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {t.id: node.value for t in targets if isinstance(t, ast.Name)}
    return found
