"""Judging a candidate from its test runs at the task state and at the fix commit (no sandbox here)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from bugsweep.grading import TestRun
from bugsweep.mining.records import RejectReason


@dataclass
class Verdict:
    """What the test runs say about a candidate."""

    reason: RejectReason | None
    detail: str = ""
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)
    environments: list[str] = field(default_factory=list)
    """How each state's task environment came about, in the order they ran (the task state, then the fix commit):
    'built' (the setup ran), 'reused' (a finished setup was reused), 'no setup'."""


def _status(run: TestRun, test_id: str) -> str:
    outcome = (run.tests or {}).get(test_id, "missing")
    return "pass" if outcome == "passed" else "skip" if outcome == "skipped" else "fail"


def _stable(runs: Sequence[TestRun], ids: set[str]) -> tuple[dict[str, str], set[str]]:
    """The status of each test that came out the same in every run, and the tests that did not."""
    stable: dict[str, str] = {}
    flaky: set[str] = set()
    for t in ids:
        seen = {_status(r, t) for r in runs}
        if len(seen) == 1:
            stable[t] = seen.pop()
        else:
            flaky.add(t)
    return stable, flaky


def _all_ids(runs: Sequence[TestRun]) -> set[str]:
    return {t for r in runs for t in (r.tests or {})}


def judge(before: Sequence[TestRun], after: Sequence[TestRun]) -> Verdict:
    """Decide from the runs at the task state (`before`) and at the fix commit (`after`, may be empty if stopped early).

    Per test when JUnit results exist (pytest); by exit code otherwise.
    """
    if any(r.timed_out for r in (*before, *after)):
        return Verdict(RejectReason.TIMED_OUT, "a test run timed out")
    no_results = next((r for r in before if r.tests is None), None)
    if no_results is not None and after and all(r.tests is not None for r in after):
        # pytest ran to the end at the fix but not at the task state: the run there was killed (an endless loop
        # at the memory limit, a crash) before it wrote its results, so no test can be named FAIL_TO_PASS.
        code = no_results.exit_code
        how = (
            f"was killed (exit {code}: out of memory, or a signal)"
            if code is not None and (code < 0 or code >= 128)
            else f"exited {code}"
        )
        return Verdict(
            RejectReason.NO_TEST_RESULTS,
            f"the test run at the task state {how} before pytest wrote its results: no test to name FAIL_TO_PASS",
        )
    if all(r.tests is not None for r in (*before, *after)):
        return _judge_tests(before, after)
    return _judge_exit_codes(before, after)


def _judge_tests(before: Sequence[TestRun], after: Sequence[TestRun]) -> Verdict:
    ids = _all_ids(before) | _all_ids(after)
    st_before, flaky_before = _stable(before, ids)
    failing = {t for t, s in st_before.items() if s == "fail"}
    if not after:
        if flaky_before and not failing:
            return Verdict(
                RejectReason.FLAKY, _ids("flaky at the task state", flaky_before), flaky=sorted(flaky_before)
            )
        return Verdict(RejectReason.TESTS_PASS_AT_PARENT, "every changed test passed at the task state")
    # Only tests the fix commit's runs report: a collection error before the fix shows up as a pseudo-test that
    # no longer exists after it.
    st_after, flaky_after = _stable(after, _all_ids(after))
    flaky = flaky_before | flaky_after
    still_failing = {t for t, s in st_after.items() if s == "fail" and t not in flaky}
    fail_to_pass = sorted(t for t in failing if st_after.get(t) == "pass" and t not in flaky)
    pass_to_pass = sorted(
        t for t, s in st_before.items() if s == "pass" and st_after.get(t) == "pass" and t not in flaky
    )
    if still_failing:
        return Verdict(
            RejectReason.TESTS_FAIL_AT_FIX,
            _ids("failing at the fix commit", still_failing),
            flaky=sorted(flaky),
        )
    if not fail_to_pass:
        if flaky:
            return Verdict(RejectReason.FLAKY, _ids("flaky", flaky), flaky=sorted(flaky))
        return Verdict(
            RejectReason.TESTS_PASS_AT_PARENT, "no test failed at the task state and passed at the fix"
        )
    return Verdict(None, fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass, flaky=sorted(flaky))


def _judge_exit_codes(before: Sequence[TestRun], after: Sequence[TestRun]) -> Verdict:
    b = {r.passed for r in before}
    if b == {True}:
        return Verdict(RejectReason.TESTS_PASS_AT_PARENT, "the test command exited 0 at the task state")
    if len(b) > 1:
        return Verdict(
            RejectReason.FLAKY, "the test command passed in some runs at the task state and failed in others"
        )
    if not after:
        return Verdict(RejectReason.TESTS_PASS_AT_PARENT, "stopped before the fix commit")
    a = {r.passed for r in after}
    if len(a) > 1:
        return Verdict(
            RejectReason.FLAKY, "the test command passed in some runs at the fix commit and failed in others"
        )
    if a == {False}:
        return Verdict(RejectReason.TESTS_FAIL_AT_FIX, "the test command failed at the fix commit")
    return Verdict(None)


def _is_collection_error(test_id: str) -> bool:
    """pytest reports a module that does not import as one pseudo-test named after the module (`tests.py::tests`)."""
    path, _, name = test_id.partition("::")
    return bool(name) and name.replace(".", "/") == path.removesuffix(".py")


def _ids(what: str, ids: set[str], limit: int = 4) -> str:
    broken = sorted(t for t in ids if _is_collection_error(t))
    if broken:
        what += f" ({', '.join(t.partition('::')[0] for t in broken)} could not be imported or collected)"
    shown = sorted(ids)[:limit]
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return f"{what}: {', '.join(shown)}{more}"


def deselect(test_command: str, flaky: Sequence[str]) -> str:
    """The pytest command with flaky tests deselected, so grading never depends on them."""
    return test_command + "".join(f" --deselect {shlex.quote(t)}" for t in flaky)
