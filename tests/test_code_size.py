"""Issue 24's limit on the package's size, kept: no Python file in bugsweep/ over 600 lines, the agent loop at most 300.

Lines as an editor counts them. A file over its limit is split by meaning (ARCHITECTURE.md lists where each part
lives), not cut at the limit.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bugsweep"
#: The most lines a Python file of the package may have, and the few held to less.
LIMIT = 600
LIMITS = {"agent/loop.py": 300}


def over_limit(package: Path) -> list[str]:
    """'bugsweep/x.py: 640 lines (limit 600)' for each Python file of `package` over its limit."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        limit = LIMITS.get(rel, LIMIT)
        if lines > limit:
            found.append(f"{package.name}/{rel}: {lines} lines (limit {limit})")
    return found


def test_no_file_of_the_package_is_over_its_line_limit() -> None:
    assert (PACKAGE / "agent" / "loop.py").is_file(), "the loop moved: say where its limit now applies"
    over = over_limit(PACKAGE)
    assert not over, "over the size limit (issue 24):\n" + "\n".join(over)


def test_the_limit_names_each_file_over_it_and_its_count(tmp_path: Path) -> None:
    package = tmp_path / "bugsweep"
    (package / "agent").mkdir(parents=True)
    (package / "fits.py").write_text("x = 1\n" * LIMIT)
    (package / "big.py").write_text("x = 1\n" * (LIMIT + 1))
    (package / "agent" / "loop.py").write_text("x = 1\n" * 301)
    assert over_limit(package) == [
        "bugsweep/agent/loop.py: 301 lines (limit 300)",
        "bugsweep/big.py: 601 lines (limit 600)",
    ]
