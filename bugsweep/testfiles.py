"""Which files are test files. One answer shared by `edit_file` (which refuses them) and the grader (which restores them).

Patterns use .gitignore syntax (pathspec): a pattern without a slash matches at any depth (`conftest.py`,
`test_*.py`), one with a slash is anchored at the repository root (`tests/**`).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import pathspec


@lru_cache(maxsize=64)
def _spec(patterns: tuple[str, ...]) -> pathspec.PathSpec:
    return pathspec.GitIgnoreSpec.from_lines(patterns)


def is_test_file(path: str, patterns: Iterable[str], extra: Iterable[str] = ()) -> bool:
    """True when `path` (relative to the repo root, forward slashes) is a protected test file."""
    rel = path.lstrip("./") if path.startswith("./") else path
    if rel in set(extra):
        return True
    return _spec(tuple(patterns)).match_file(rel)
