"""Whether a change's shape reads like a fix or a feature (bugsweep/mining/change.py reads the shape; the screen,
screening.read_commit, decides with it and the words)."""

from __future__ import annotations

from collections.abc import Sequence

from bugsweep.mining.change import ChangeShape

#: A fix without a fix word must be small: source lines added plus removed, at most (40 until issue 37's round 5:
#: over 20, the six sets labelled then held 4 not-fixes for 1 fix; bench/README.md).
MAX_WORDLESS_FIX_LINES = 20
#: ... or, with an issue reference opening the subject ("Issue 1214: Update __eq__ ..."), at most this many.
MAX_ISSUE_FIX_LINES = 80
#: ... and touch few existing functions: a clean-up or a linter's pass touches many a little.
MAX_WORDLESS_FIX_FUNCTIONS = 3
#: ... and add at most this many lines: a fix changes code, a feature grows it (issue 37's round 8: over the nine
#: labelled sets, the wordless changes passed held fixes adding up to 11 lines but one (19), and 4 of their 7
#: not-fixes added 14 to 18; bench/README.md).
MAX_WORDLESS_FIX_ADDED = 12


def listed(names: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def feature_shape(shape: ChangeShape) -> str | None:
    """Why the change reads as a feature: new public names, and the tests it adds or changes test only those."""
    tests = [*shape.new_tests, *shape.changed_tests]
    if not shape.added_names or not tests or shape.tests_on_existing_names:
        return None
    return (
        f"it adds new public names ({listed(shape.added_names)}) and its tests ({listed(tests)}) "
        "assert nothing about code that existed before"
    )


def fix_shape(shape: ChangeShape, *, wordless: bool = True, new_test: bool = False) -> tuple[str | None, str]:
    """(why the change reads as a fix, or None; else why not): existing functions changed, no new public names,
    tests asserting on existing names (with `new_test`, one the commit adds: a changed expectation of an existing
    test is what a deliberate change of behaviour makes too), and a small source change (MAX_WORDLESS_FIX_FUNCTIONS
    functions; with no word backing it, MAX_WORDLESS_FIX_LINES lines, MAX_WORDLESS_FIX_ADDED of them added; else
    MAX_ISSUE_FIX_LINES lines)."""
    lines = MAX_WORDLESS_FIX_LINES if wordless else MAX_ISSUE_FIX_LINES
    if shape.added_names:
        return None, f"it adds new public names ({listed(shape.added_names)})"
    if not shape.changed_functions:
        return None, "it changes no existing function"
    if len(shape.changed_functions) > MAX_WORDLESS_FIX_FUNCTIONS:
        return None, (
            f"it changes {len(shape.changed_functions)} existing functions (over {MAX_WORDLESS_FIX_FUNCTIONS}: "
            "a clean-up rather than a fix)"
        )
    if shape.source_lines > lines:
        return None, f"its source change is large ({shape.source_lines} lines, over {lines})"
    if wordless and shape.source_added > MAX_WORDLESS_FIX_ADDED:
        return None, (
            f"it adds {shape.source_added} lines (over {MAX_WORDLESS_FIX_ADDED}: new behaviour rather than a fix)"
        )
    if not shape.tests_on_existing_names:
        return None, "no test it adds or changes asserts anything"
    new = {*shape.new_tests, *shape.grown_tests}  # a case added to a test's table is a new test for pytest
    tests = [t for t in shape.tests_on_existing_names if t in new] if new_test else []
    if new_test and not tests:
        return None, "it adds no test of existing code (it only changes what existing tests expect)"
    return (
        f"it changes existing code ({listed(shape.changed_functions)}, {shape.source_lines} "
        f"line{'' if shape.source_lines == 1 else 's'}, no new public "
        f"names) and {'new ' if new_test else ''}tests assert on it "
        f"({listed(tests or shape.tests_on_existing_names)})"
    ), ""
