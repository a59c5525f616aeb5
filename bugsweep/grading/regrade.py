"""The clean-room regrade: the agent's change, read from outside its sandbox, graded in fresh sandboxes.

1. The change (bugsweep.grading.cleanroom, read by the pipeline) loses every protected path
   (bugsweep.grading.testfiles.protected_reason); the rest is written into fresh sandboxes made on the task state,
   with nothing of the agent's.
2. The probe goes into each fresh sandbox's task environment (bugsweep.grading.harness), which also says which
   modules and pytest plugins the environment had before the change.
3. The tests run: as the mirror pair (bugsweep.grading.mirror) where the baseline showed pytest or unittest and
   failing tests to mirror, both runs at once, one of them the mirror at random; plus the task's own command in a
   sandbox of its own where the pair runs bugsweep's command; otherwise the task's command alone.
4. The verdict (bugsweep.grading.verdict) reads the real run, the mirror and the dropped changes.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bugsweep.errors import InfraError
from bugsweep.grading import cleanroom, harness
from bugsweep.grading.mirror import PairPlan, judge, plan_pair
from bugsweep.grading.runs import TestRun, run_tests
from bugsweep.grading.signals import suspicious_signals
from bugsweep.grading.testfiles import import_roots, protected_reason
from bugsweep.grading.verdict import Grade, grade
from bugsweep.sandbox.base import Sandbox
from bugsweep.spec import TaskSpec


@dataclass
class Regraded:
    """What the regrade made: the grade, the run the verdict read (None: the change could not be applied), the
    mirror run, and patch.diff."""

    grade: Grade
    after: TestRun | None
    mirror: TestRun | None
    patch: str


def regrade_change(
    spec: TaskSpec,
    *,
    task_paths: frozenset[str],
    changes: list[cleanroom.Change],
    new: dict[str, bytes],
    before: TestRun,
    make_sandbox: Callable[[], Sandbox],
    protected_globs: Iterable[str],
    per_test_timeout: float | None,
    timeout: float,
    measured: list[Sandbox],
) -> Regraded:
    """Grade `changes` (the new bytes of each path in `new`) against the baseline `before`. `make_sandbox` gives a
    fresh sandbox in the task state (called once per run); each is appended to `measured` and released here.
    Raises cleanroom.ChangeRefused when the change cannot be applied (the model's failure)."""
    with contextlib.ExitStack() as stack:

        def fresh(
            known: harness.EnvFacts | None = None,
        ) -> tuple[Sandbox, cleanroom.TreeAccess, harness.EnvFacts]:
            sandbox = stack.enter_context(make_sandbox())
            measured.append(sandbox)
            tree = cleanroom.tree_access(sandbox)
            if tree is None:
                raise InfraError(f"the sandbox {sandbox.id} gives no access to its files from outside")
            return (
                sandbox,
                tree,
                harness.install_probe(sandbox) if known is None else harness.copy_probe(sandbox, known),
            )

        first, first_tree, facts = fresh()
        plan = plan_pair(before, spec.test_command, root=first.workdir, fail_to_fail=spec.FAIL_TO_FAIL)
        old = {c.path: first_tree.read(c.path, c.old, check=False) for c in changes if c.old}
        roots = import_roots(task_paths, protected_globs, spec.test_files)
        dropped = {}
        for change in changes:
            why = protected_reason(
                change.path,
                patterns=protected_globs,
                extra=spec.test_files,
                test_command=spec.test_command,
                old=old.get(change.path),
                new=new.get(change.path),
                task_paths=task_paths,
                importable=facts.modules,
                import_roots=roots,
            )
            if why:
                dropped[change.path] = why
        kept = [c for c in changes if c.path not in dropped]
        patch = cleanroom.render_patch(changes, old, new)
        first_tree.apply(kept, new)
        runs: dict[str, Callable[[], TestRun]] = {}
        if plan.ready:
            second, second_tree, _ = fresh(facts)
            second_tree.apply(kept, new)
            pair = [first, second]
            mirror_at = secrets.randbelow(
                2
            )  # which of the two is the mirror: nothing else differs between them
            env = _pair_env(harness.for_command(facts, spec.test_command))
            inject = plan.inject_instruction()
            for name, sandbox in (("real", pair[1 - mirror_at]), ("mirror", pair[mirror_at])):
                told = harness.Instruction(
                    armed=plan.armed_instruction(),
                    inject=inject,
                    mirror=name == "mirror",
                    nonce=secrets.token_hex(harness.NONCE_HEX // 2),
                )
                runs[name] = _runner(sandbox, plan.command or "", timeout, per_test_timeout, facts, told, env)
            if plan.own_run:
                third, third_tree, _ = fresh(facts)
                third_tree.apply(kept, new)
                runs["task"] = _runner(third, spec.test_command, timeout, per_test_timeout, facts)
        else:
            runs["task"] = _runner(first, spec.test_command, timeout, per_test_timeout, facts)
        results = _run_at_once(runs)
    after = results.get("task") or results["real"]
    found = judge(plan, results.get("real"), results.get("mirror"), results.get("task"))
    verdict = grade(
        instance_id=spec.instance_id,
        before=before,
        after=after,
        dropped=dropped,
        expected_fail_to_pass=spec.FAIL_TO_PASS,
        expected_pass_to_pass=spec.PASS_TO_PASS,
        expected_fail_to_fail=spec.FAIL_TO_FAIL,
        suspicious=suspicious_signals({c.path: (old.get(c.path), new[c.path]) for c in kept if c.new}),
        mirror=found,
        mirror_run=results.get("mirror"),
    )
    return Regraded(verdict, after, results.get("mirror"), patch)


def _pair_env(facts: harness.EnvFacts) -> dict[str, str]:
    """What both runs of the pair have on top of every graded run's variables: one hash seed (so that the two
    processes hash alike), one seed for pytest-randomly where the environment has it (so that they run the tests in
    one order), and pytest-xdist kept in the runner's own process (its workers would not have the instruction)."""
    seed = secrets.randbelow(2**32)
    env = {"PYTHONHASHSEED": str(seed)}
    options = []
    if "xdist" in facts.plugins:
        options.append("-n 0")
    if "randomly" in facts.plugins:
        options.append(f"--randomly-seed={seed}")
    if options:
        env["PYTEST_ADDOPTS"] = " ".join([harness.graded_env(facts)["PYTEST_ADDOPTS"], *options])
    return env


def _runner(
    sandbox: Sandbox,
    command: str,
    timeout: float,
    per_test_timeout: float | None,
    facts: harness.EnvFacts,
    instruction: harness.Instruction | None = None,
    env: dict[str, str] | None = None,
) -> Callable[[], TestRun]:
    def run() -> TestRun:
        return run_tests(
            sandbox,
            command,
            timeout=timeout,
            per_test_timeout=per_test_timeout,
            facts=facts,
            instruction=instruction,
            env=env,
        )

    return run


def _run_at_once(runs: dict[str, Callable[[], TestRun]]) -> dict[str, TestRun]:
    """Every run at the same time, each in a thread of its own (the sandboxes do the work)."""
    if len(runs) == 1:
        return {name: run() for name, run in runs.items()}
    with ThreadPoolExecutor(max_workers=len(runs), thread_name_prefix="bugsweep-regrade") as pool:
        futures = {name: pool.submit(run) for name, run in runs.items()}
        return {name: future.result() for name, future in futures.items()}


__all__ = ["PairPlan", "Regraded", "regrade_change"]
