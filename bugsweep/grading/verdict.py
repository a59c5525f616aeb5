"""The verdict: a fix counts only when the tests failed before, pass after, and nothing else says otherwise.

SWE-bench's rule on per-test results, where there are any (pytest and unittest, recorded by the probe): every test
that failed before must pass after (skipped or missing is not a pass), and no test that passed before may fail or
disappear. Without them (another runner) the exit code decides, and no fewer tests may run after than before where
the runner prints a count; `Grade.evidence` says which, and such a grade is shown apart as "exit code only".

The code under test runs in the runner's process, so what that process reports is checked against itself (its
summary line, its `FAIL:`/`FAILED` lines, its exit code, its per-test results) and against the mirror run, which it
cannot tell from the real one (bugsweep.grading.mirror). Where the tests run under pytest or unittest and the
mirror could not be armed, the grade fails closed. Code outside the tests that patches the test framework or
inspects its caller or the probe is flagged (`suspicious`, bugsweep.grading.signals): tests cannot tell such a
"fix" from a real one, so it is held for review, never resolved.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field

from bugsweep.attempts import AttemptRecord
from bugsweep.grading.mirror import Mirror
from bugsweep.grading.records import listed_failures, summary_failures
from bugsweep.grading.runs import TestRun


class Grade(BaseModel):
    """The verdict on one task, written to grade.json."""

    instance_id: str
    model: str = ""
    resolved: bool = False
    """failed_before and passes_after and tests_untouched (and the task's own FAIL_TO_PASS/PASS_TO_PASS, if given)."""
    failed_before: bool = False
    passes_after: bool = False
    tests_untouched: bool = True
    """False when the change touched the test infrastructure; those changes were dropped before the after-run."""
    touched_test_files: list[str] = Field(default_factory=list)
    """The dropped paths (test files, conftest.py, runner configuration, start-up hooks, shadowing modules, ...)."""
    dropped: dict[str, str] = Field(default_factory=dict)
    """Dropped path -> why it is protected."""
    evidence: str = ""
    """What the verdict rests on: 'per-test' (the probe's per-test results), 'exit code and test count', or 'exit
    code' (no per-test evidence: sweeps, comparisons and the review page show such a grade apart)."""
    reason: str | None = None
    """Why the attempt is not resolved, in words (None when it is, or when the task could not run at all)."""
    suspicious: list[str] = Field(default_factory=list)
    """Signals tests cannot judge ('path:line: what'): code outside the tests that patches the test framework or
    inspects its caller. A change with any is never resolved: it is held for review."""
    held_for_review: bool = False
    """The tests say fixed, but the change has `suspicious` signals: not resolved until a person has looked."""
    mirror: Mirror | None = None
    """What the mirror pair showed (bugsweep.grading.mirror); None where the after-run did not run."""
    tests_run_before: int | None = None
    tests_run_after: int | None = None
    tests_timed_out: list[str] = Field(default_factory=list)
    """Tests of the after-run stopped at the per-test time limit (`per_test_timeout_s` in `config`): each counts
    as failed."""
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    """Tests that failed before and pass after (observed)."""
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    """Tests that passed before and still pass after (observed)."""
    PASS_TO_FAIL: list[str] = Field(default_factory=list)
    """Tests the change broke (they fail or error after)."""
    PASS_TO_MISSING: list[str] = Field(default_factory=list)
    """Tests that passed before and did not pass after because they were skipped or did not run."""
    FAIL_TO_FAIL: list[str] = Field(default_factory=list)
    """Tests that failed before and did not pass after (failed, skipped, xfailed or missing)."""
    stop_reason: str | None = None
    policy: str | None = None
    """The agent policy the run was under ('plain', 'small-model': bugsweep/agent/policy.py); None when the agent
    never ran."""
    summary: str | None = None
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    """Token cost from the model's prices."""
    sandbox_cost_usd: float | None = None
    """Sandbox cost where the backend bills (Runtime); None for the local sandbox."""
    wall_s: float = 0.0
    agent_wall_s: float = 0.0
    peak_memory_mib: float | None = None
    """Resource use of the run's sandboxes (the agent's: setup, tests, agent; the regrade's), where the backend
    measures it (local): the most memory one of them held at once, page cache included."""
    cpu_s: float | None = None
    """CPU seconds of every command in them."""
    peak_disk_mib: float | None = None
    """The most disk the sandbox's writable layers held at once."""
    disk_quota_mib: float | None = None
    """The disk quota the run had (None: none)."""
    error: str | None = None
    """Why the task could not be run, if it could not."""
    failure_kind: str | None = None
    """'config', 'infra', 'task' or 'crash' when `error` is set. A grading step that fails because of what the
    agent did is not one of these: it is an unresolved attempt with its `reason`."""
    environment: dict[str, object] | None = None
    """The task's environment: python version, setup command, installer, the layer it came from and whether it was
    reused, and the sha256 of the installed package list (written beside grade.json as environment.txt)."""
    config: dict[str, object] | None = None
    """What made the run (bugsweep.runconfig.RunConfig, never a key): the model, the policy, the agent's limits,
    the sandbox and its limits, the task environment, bugsweep's version."""
    config_digest: str | None = None
    """The configuration's digest (12 hex digits of the SHA-256 of its canonical JSON): the key its results are
    stored and found again by (SWEEP/TASK/MODEL/CONFIG)."""
    attempts: list[AttemptRecord] = Field(default_factory=list)
    """Every attempt the run made at the task, in order (bugsweep.attempts: `attempts` per model of the run's
    cascade): its model, temperature, verdict, reason, stop reason, turns, tokens, cost and time. The verdict above
    is the kept attempt's, or the last attempt's when none was resolved; `turns`, the tokens, `cost_usd` and
    `agent_wall_s` are the sum over the attempts, `wall_s` the whole task's time. Empty when the agent never ran."""
    kept_attempt: int | None = None
    """The attempt this grade keeps (its patch.diff and trajectory.json are at the run folder's top): the one the
    clean room resolved; None when none was. An attempt the clean room did not resolve is never kept."""


def verdict_word(grade: Grade) -> str:
    """'resolved', 'held for review', 'could not run' or 'not resolved': one word for tables and summaries."""
    if grade.resolved:
        return "resolved"
    if grade.held_for_review:
        return "held for review"
    return "could not run" if grade.error else "not resolved"


def exit_code_only(grade: Grade) -> bool:
    """The grade rests on the exit code (and a test count) alone: no per-test evidence, no mirror."""
    return grade.evidence.startswith("exit code")


def verdict_label(grade: Grade) -> str:
    """`verdict_word`, with "(exit code only)" after a resolved grade that had no per-test evidence."""
    word = verdict_word(grade)
    return f"{word} (exit code only)" if word == "resolved" and exit_code_only(grade) else word


def grade(
    *,
    instance_id: str,
    before: TestRun,
    after: TestRun,
    dropped: dict[str, str] | None = None,
    expected_fail_to_pass: Iterable[str] = (),
    expected_pass_to_pass: Iterable[str] = (),
    expected_fail_to_fail: Iterable[str] = (),
    suspicious: Iterable[str] = (),
    mirror: Mirror | None = None,
    mirror_run: TestRun | None = None,
) -> Grade:
    """The verdict from the before-run, the after-run (the real run of the mirror pair, or the task's own command's
    run), what the mirror pair showed (`mirror`, and its run for its own consistency) and the dropped protected
    changes. Tests the task names as failing in both states (`expected_fail_to_fail`: a mined task's, where its
    command cannot leave them out, as a test module that does not import) need not pass after."""
    dropped = dict(dropped or {})
    own = after.tests
    own_failing = after.ids("failed", "error")
    failed_before = not before.passed
    # The task's own FAIL_TO_FAIL fail after too (a module that does not import, run past with pytest's
    # --continue-on-collection-errors): a run whose only failures are those, exit code 1 (tests failed), passes.
    expected_failing = set(expected_fail_to_fail)
    passes_after = after.passed or (
        after.exit_code == 1
        and not after.timed_out
        and own is not None
        and bool(own_failing)
        and own_failing <= expected_failing
    )
    reasons: list[str] = []
    verdict = Grade(
        instance_id=instance_id,
        failed_before=failed_before,
        passes_after=passes_after,
        tests_untouched=not dropped,
        touched_test_files=sorted(dropped),
        dropped=dropped,
        suspicious=list(suspicious),
        tests_run_before=len(before.tests) if before.tests is not None else before.count,
        tests_run_after=len(own) if own is not None else after.count,
        mirror=mirror,
        tests_timed_out=list(after.tests_timed_out),
    )
    if not failed_before:
        reasons.append("the tests did not fail before")
    if dropped:
        reasons.append("the change touched the test infrastructure: " + ", ".join(sorted(dropped)))
    if after.timed_out:
        reasons.append("the tests timed out after the change")
    elif not passes_after:
        reasons.append(f"the tests fail after the change (exit code {after.exit_code})")
    if after.tests_timed_out:
        reasons.append(
            f"{len(after.tests_timed_out)} test(s) ran past the per-test time limit of "
            f"{after.per_test_timeout_s or 0:g} s after the change: {', '.join(after.tests_timed_out[:5])}"
        )
    if after.tests_out_of_memory:
        reasons.append(
            f"{len(after.tests_out_of_memory)} test(s) grew past the per-test memory bound of "
            f"{after.memory_bound_bytes >> 20} MiB after the change: {', '.join(after.tests_out_of_memory[:5])}"
        )
    elif after.killed_in:
        reasons.append(
            f"the test process was killed after the change while {after.killed_in} ran (its memory)"
        )
    reasons += disagreements(after)
    if mirror_run is not None and mirror is not None and mirror.armed:
        reasons += [f"in the mirror run, {r}" for r in disagreements(mirror_run)]
    if before.tests is not None:
        verdict.evidence = "per-test"
        if own is None:
            reasons.append("the after-run gave no per-test results (the tests did not run to the end)")
        else:
            failing = before.ids("failed", "error") - expected_failing
            passing = before.ids("passed")
            passed_after = after.ids("passed")
            verdict.FAIL_TO_PASS = sorted(failing & passed_after)
            verdict.FAIL_TO_FAIL = sorted(failing - passed_after)
            verdict.PASS_TO_PASS = sorted(passing & passed_after)
            verdict.PASS_TO_FAIL = sorted(passing & own_failing)
            verdict.PASS_TO_MISSING = sorted(passing - passed_after - own_failing)
            if verdict.FAIL_TO_FAIL:
                reasons.append(f"{len(verdict.FAIL_TO_FAIL)} test(s) that failed before do not pass after")
            if verdict.PASS_TO_FAIL or verdict.PASS_TO_MISSING:
                broken = len(verdict.PASS_TO_FAIL) + len(verdict.PASS_TO_MISSING)
                reasons.append(f"{broken} test(s) that passed before fail, are skipped or are missing after")
    elif verdict.tests_run_before is not None and verdict.tests_run_after is not None:
        verdict.evidence = "exit code and test count"
        if verdict.tests_run_after < verdict.tests_run_before:
            reasons.append(
                f"fewer tests ran after ({verdict.tests_run_after}) than before ({verdict.tests_run_before})"
            )
    else:
        verdict.evidence = "exit code"
    # A task that names its own tests (mined tasks) also needs those to come out right.
    wanted = set(expected_fail_to_pass) | set(expected_pass_to_pass)
    if wanted:
        missing = wanted - after.ids("passed")
        if own is None:
            reasons.append("the task names its tests, and the after-run gave no per-test results")
        elif missing:
            reasons.append(
                f"{len(missing)} of the task's own tests do not pass after: {', '.join(sorted(missing)[:5])}"
            )
    if mirror is not None:
        if mirror.subverted:
            reasons.append(mirror.subverted)
        elif mirror.required and not mirror.armed:
            reasons.append(
                f"the mirror run could not check the test process ({mirror.note or 'not armed'}), and the tests run "
                f"under {mirror.runner or 'pytest or unittest'}: the grade cannot rest on what that process reports"
            )
    if verdict.suspicious and not reasons:
        verdict.held_for_review = True
        reasons.append(
            f"held for review: the tests pass, but the change has {len(verdict.suspicious)} suspicious signal(s) "
            "(see `suspicious`) that tests cannot judge"
        )
    verdict.resolved = not reasons
    verdict.reason = "; ".join(reasons) or None
    return verdict


def disagreements(run: TestRun) -> list[str]:
    """Where the runner's own lines (its summary, its list of failures) contradict its exit code or the probe's
    per-test results. (The mirror run's exit code is judged with its armed test: bugsweep.grading.mirror.judge.)"""
    runner = run.runner
    if run.timed_out:
        return []
    failing = run.ids("failed", "error")
    found: list[str] = []
    counted = summary_failures(run.log, runner)
    if counted is not None:
        if counted and run.exit_code == 0:
            found.append(
                f"the runner's summary reports {counted} failed test(s), yet the test process exited 0: something in "
                "the code under test changed how the process ends"
            )
        elif (
            run.tests is not None
            and runner is not None
            and counted != len(failing) + len(run.probe.load_errors)
        ):
            found.append(
                f"the runner's summary reports {counted} failed test(s) where its per-test results hold "
                f"{len(failing) + len(run.probe.load_errors)}: something in the test process changes what the runner "
                "reports"
            )
    if run.tests is not None and runner is not None:
        listed = listed_failures(run.log, runner, run.probe)
        contradicted = sorted(t for t in listed if run.tests.get(t) == "passed")
        if contradicted:
            found.append(
                f"the runner's log lists {', '.join(contradicted[:3])} as failed where its per-test results say "
                "passed: something in the test process changes what the runner reports"
            )
    return found
