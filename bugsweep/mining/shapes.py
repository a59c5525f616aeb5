"""Whether a change's shape reads like a fix or a feature (bugsweep/mining/change.py reads the shape; the screen,
screening.read_commit, decides with it and the words)."""

from __future__ import annotations

from collections.abc import Sequence

from bugsweep.mining.change import ChangeShape

#: A change that reads like a fix is small: source lines added plus removed, at most (what an issue reference opening
#: the subject, "Issue 1214: Update __eq__ ...", or a weak word, "Handle ...", needs as backing).
MAX_FIX_LINES = 80
#: ... and touches few existing functions: a clean-up or a linter's pass touches many a little.
MAX_FIX_FUNCTIONS = 3


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


def fix_shape(shape: ChangeShape, *, new_test: bool = False) -> tuple[str | None, str]:
    """(why the change reads as a fix, or None; else why not): existing functions changed, no new public names,
    tests asserting on existing names (with `new_test`, one the commit adds: a changed expectation of an existing
    test is what a deliberate change of behaviour makes too), and a small source change (MAX_FIX_FUNCTIONS
    functions, MAX_FIX_LINES lines). The shape backs words; alone it makes no fix (issue 37's round 17: over
    eight held-out sets, the wordless changes `bugsweep mine` kept were 32 fixes, 9 not-fixes and 10 borderline)."""
    if shape.added_names:
        return None, f"it adds new public names ({listed(shape.added_names)})"
    if not shape.changed_functions:
        return None, "it changes no existing function"
    if len(shape.changed_functions) > MAX_FIX_FUNCTIONS:
        return None, (
            f"it changes {len(shape.changed_functions)} existing functions (over {MAX_FIX_FUNCTIONS}: "
            "a clean-up rather than a fix)"
        )
    if shape.source_lines > MAX_FIX_LINES:
        return None, f"its source change is large ({shape.source_lines} lines, over {MAX_FIX_LINES})"
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
