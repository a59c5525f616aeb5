"""The whole mining run: scan, screen, build and validate candidates, several at once, newest first."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from bugsweep.errors import ConfigError, Terminated
from bugsweep.mining.building import build_task
from bugsweep.mining.history import list_history, local_clone, repo_name, same_changes, scan_history
from bugsweep.mining.records import (
    Commit,
    Kept,
    MiningEvent,
    MiningResult,
    ProgressCallback,
    Rejection,
    RejectReason,
    Unfinished,
)
from bugsweep.mining.screening import screen
from bugsweep.mining.validation import Stopper, task_commands, validate_on_its_python
from bugsweep.mining.verdict import Verdict
from bugsweep.runconfig import AgentLimits
from bugsweep.sandbox.base import SandboxProvider
from bugsweep.spec import TaskSpec, dump_tasks

#: The per-test time limit of a validation unless one is given: the one graded runs have (AgentLimits).
DEFAULT_PER_TEST_TIMEOUT_S: float | None = AgentLimits.model_fields["per_test_timeout_s"].default


def mine(
    repo: str,
    *,
    provider: SandboxProvider,
    limit: int = 10,
    since: str | None = None,
    until: str | None = None,
    branch: str | None = None,
    test_command: str | None = None,
    setup_command: str | None = None,
    runs: int = 3,
    max_candidates: int | None = None,
    merges: bool = False,
    concurrency: int = 1,
    out: Path | None = None,
    report: Path | None = None,
    on_progress: ProgressCallback | None = None,
    test_timeout: float = 900.0,
    per_test_timeout: float | None = DEFAULT_PER_TEST_TIMEOUT_S,
    task_prefix: str | None = None,
    write: Callable[[list[TaskSpec], Path], None] = dump_tasks,
    exclude: str | None = None,
    result: MiningResult | None = None,
    older_python: bool = True,
    unreleased_fixes: bool = False,
    mined: Sequence[str] = (),
) -> MiningResult:
    """Scan `repo`'s history newest first and keep up to `limit` validated tasks (`merges`: see scan_history).

    Up to `concurrency` candidates are validated at once (each in its own sandboxes), never more than could still
    be kept, so the history is scanned no further than with one at a time. Tasks stay in history order.
    `test_timeout` bounds each test run, `per_test_timeout` each test in it (a test still running then fails).
    `out`, when given, is rewritten (atomically) after every kept task, so an interrupted run keeps what it found,
    and once more at the end: empty when the run kept nothing, except that a run stopped early without a kept task
    leaves it as it was (`tasks_file` says whether this run wrote it).
    `exclude`: leave out the commits reachable from this one (what an earlier run already mined).
    `mined`: the fix commits of the tasks an earlier run kept; a commit making the same change as one of them (or
    as another commit in range: a backport merged back) is rejected as `same change as another commit`.
    `write` writes the task file (bugsweep's, or e.g. bugsweep.swebench.dump_records).
    `report`, when given, gets the rejections and counts (MiningResult without the tasks) however the run ends.
    `result`, when given, is the result filled in (so that a caller still has it when the run ends by an exception).
    `older_python`: a candidate whose environment failed on the running Python is validated again in the
    environment of its time (bugsweep.mining.validation.validate_on_its_python): on an older interpreter of this
    machine (or a newer one its package requires), then with the releases of its date; kept there, its task names
    that interpreter (`python`) or its setup installs those releases.
    `unreleased_fixes`: keep commits that mend their author's own work since the last release, which the screen
    otherwise reads as no fix (bugsweep.mining.releases).

    A run stops early on Ctrl-C (KeyboardInterrupt), SIGTERM (Terminated) or when the test or setup command cannot
    run at all (CommandNotFound): the candidates in flight are not judged (their sandboxes are released at once
    and they are listed as `unfinished`), the task file and the report are written, and the exception goes on to
    the caller.
    """
    started = time.monotonic()
    progress = on_progress or (lambda e: None)
    git_dir = local_clone(repo)
    name = repo_name(repo)
    result = result if result is not None else MiningResult(repo=name)
    result.repo, result.per_test_timeout_s = name, per_test_timeout
    result.unreleased_fixes = unreleased_fixes
    shas = list_history(
        git_dir, branch=branch, since=since, until=until, max_commits=max_candidates, merges=merges,
        exclude=exclude,
    )  # fmt: skip
    result.total = len(shas)
    same = {} if merges else same_changes(git_dir, shas, branch, mined)
    # Scan order of each commit, so that results coming back out of order are still kept newest first.
    position: dict[str, int] = {}

    def event(kind: str, commit: Commit, message: str = "", environments: str = "") -> MiningEvent:
        return MiningEvent(
            kind,
            commit.sha,
            commit.subject,
            message,
            scanned=result.scanned,
            kept=len(result.tasks),
            done=result.done,
            total=result.total,
            environments=environments,
        )

    def next_candidate(history: Iterator[Commit]) -> tuple[Commit, TaskSpec, str] | None:
        """Scan and screen until a commit needs the sandbox; None when the history is used up."""
        for commit in history:
            result.scanned += 1
            position[commit.sha] = result.scanned
            progress(event("scan", commit))
            if commit.sha in same:
                other = same[commit.sha]
                detail = (
                    f"the same change as {other[:10]}, a task of an earlier run"
                    if other in mined
                    else f"{other[:10]} makes it too (a backport or cherry-pick merged back): judged once, as that one"
                )
                duplicate = Rejection(
                    commit=commit.sha, subject=commit.subject, reason=RejectReason.SAME_CHANGE, detail=detail
                )
                result.rejected.append(duplicate)
                progress(_rejected_event(duplicate, result))
                continue
            screened = screen(commit, repo=git_dir, unreleased_fixes=unreleased_fixes)
            if isinstance(screened, Rejection):
                result.rejected.append(screened)
                progress(_rejected_event(screened, result))
                continue
            spec = build_task(
                git_dir,
                screened,
                repo_name=name,
                test_command=test_command,
                setup_command=setup_command,
                task_prefix=task_prefix,
            )
            return commit, spec, _what_runs(spec, screened.runnable_tests, test_command)
        return None

    def record(commit: Commit, spec: TaskSpec, verdict: Verdict) -> None:
        if verdict.flaky:
            result.flaky_tests[commit.sha] = verdict.flaky
        if verdict.out_of_memory:
            result.out_of_memory[commit.sha] = verdict.out_of_memory
        if verdict.crashed:
            result.crashed[commit.sha] = verdict.crashed
        result.environments_built += verdict.environments.count("built")
        result.environments_reused += verdict.environments.count("reused")
        environments = ", ".join(verdict.environments)
        if verdict.reason is not None:
            rejection = Rejection(
                commit=commit.sha, subject=commit.subject, reason=verdict.reason, detail=verdict.detail
            )
            result.rejected.append(rejection)
            progress(_rejected_event(rejection, result, environments))
            return
        if verdict.python:
            spec.python = verdict.python
            result.older_python[commit.sha] = verdict.python
        spec.FAIL_TO_PASS = verdict.fail_to_pass
        spec.PASS_TO_PASS = verdict.pass_to_pass
        spec.FAIL_TO_FAIL = verdict.fail_to_fail
        if spec.setup_command and verdict.extras:
            result.extras[commit.sha] = verdict.extras
        if spec.setup_command and verdict.dated:
            result.dated[commit.sha] = verdict.dated
        spec.setup_command, spec.test_command = task_commands(spec, verdict)
        if verdict.fail_to_fail:
            result.failing_in_both[commit.sha] = verdict.fail_to_fail
        result.kept.append(
            Kept(
                commit=commit.sha,
                subject=commit.subject,
                screen_rule=spec.screen_rule or "",
                screen_reason=spec.screen_reason or "",
                test_command=spec.test_command,
            )
        )
        result.kept.sort(key=lambda k: position[k.commit])
        result.tasks.append(spec)
        result.tasks.sort(key=lambda t: position[t.fix_commit or ""])
        if out is not None:
            write(result.tasks, out)
        note = f"{len(verdict.fail_to_pass)} fail->pass, {len(verdict.pass_to_pass)} pass->pass"
        if verdict.python:
            note += f", on {verdict.python} (its environment failed on this Python)"
        if verdict.extras:
            note += f", with the project's extras {', '.join(verdict.extras)} (its tests import what they install)"
        if verdict.dated:
            note += f", with the releases of {verdict.dated[:10]} (its environment failed with today's)"
        if verdict.disabled_plugins:
            note += f", pytest plugin(s) today's pytest will not load disabled ({', '.join(verdict.disabled_plugins)})"
        if verdict.no_ini:
            note += ", the configuration today's pytest will not read (setup.cfg's [pytest]) left unread"
        if verdict.allowed_warnings:
            note += f", pytest's {', '.join(verdict.allowed_warnings)} not an error"
        if verdict.build_constraints:
            note += f", built with {', '.join(verdict.build_constraints)} (a package asks for 2to3)"
        if verdict.relaxed:
            note += f", pins or stub packages the package index does not have relaxed or left out ({', '.join(verdict.relaxed)})"
        if verdict.ignored:
            note += f", {len(verdict.ignored)} other test module(s) that do not import ignored"
        if verdict.fail_to_fail:
            note += f", {len(verdict.fail_to_fail)} failing in both states left out"
        if verdict.flaky:
            note += f", {len(verdict.flaky)} flaky left out"
        if verdict.out_of_memory:
            note += f", {len(verdict.out_of_memory)} stopped at the per-test memory bound"
        if verdict.crashed:
            note += f", {len(verdict.crashed)} failed where the test process died (the rest run again without them)"
        if verdict.skipped_after:
            note += f", {len(verdict.skipped_after)} passing before and skipped after left out"
        if verdict.also_deselected:
            note += (
                f", {len(verdict.also_deselected)} deselected with them (an id that begins theirs) not named"
            )
        if verdict.unnamed:
            note += f", {len(verdict.unnamed)} with a memory address in their id not named"
        note += f"; screen: {spec.screen_reason}" if spec.screen_reason else ""
        progress(event("kept", commit, note, environments))

    history = scan_history(git_dir, shas=shas, merges=merges)
    pending: dict[Future[Verdict], tuple[Commit, TaskSpec]] = {}
    exhausted = False
    stopper = Stopper()
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="mine")
    try:
        while True:
            while (
                not exhausted
                and len(pending) < max(1, concurrency)
                and len(result.tasks) + len(pending) < limit
            ):
                found = next_candidate(history)
                if found is None:
                    exhausted = True
                    break
                commit, spec, what_runs = found
                # Validate against the local clone (fast); the task file names the repository as the user gave it.
                in_sandbox = spec.model_copy(update={"repo": str(git_dir)})
                progress(event("validate", commit, f"{what_runs}, {runs} run(s) per state"))
                result.validated += 1
                future = pool.submit(
                    validate_on_its_python,
                    in_sandbox,
                    provider,
                    commit,
                    repo=git_dir,
                    older=older_python,
                    runs=runs,
                    timeout=test_timeout,
                    per_test_timeout=per_test_timeout,
                    stopper=stopper,
                )
                pending[future] = (commit, spec)
            if not pending:
                break
            # A short timeout, again and again: the kernel may hand Ctrl-C to a worker thread, and a main thread
            # blocked in an endless wait would not run Python's handler until a validation ends
            done: set[Future[Verdict]] = set()
            while not done:
                done, _ = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: position[pending[f][0].sha]):
                commit, spec = pending[future]
                verdict = future.result()  # CommandNotFound stops the run here, this candidate unfinished
                del pending[future]
                record(commit, spec, verdict)
    except BaseException as exc:  # Ctrl-C, SIGTERM or a command that cannot run: judge nothing cut short
        stopper.stop()
        result.stopped = (
            "terminated (SIGTERM)"
            if isinstance(exc, Terminated)
            else "interrupted (Ctrl-C)"
            if isinstance(exc, KeyboardInterrupt)
            else str(exc)
        )
        for future, (commit, _) in sorted(pending.items(), key=lambda kv: position[kv[1][0].sha]):
            future.cancel()
            result.unfinished.append(Unfinished(commit=commit.sha, subject=commit.subject))
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        result.rejected.sort(key=lambda r: position.get(r.commit, 0))
        result.elapsed_s = time.monotonic() - started
        # A stopped run that kept nothing leaves an older task file alone: nothing is lost to a mistyped command.
        keep_old = result.stopped is not None and not result.tasks
        write_problem = _write_tasks(result, out, write) if out is not None and not keep_old else None
        if report is not None:
            result.report_file = str(report)
            result.write_report(report)
    if write_problem:  # only here, when nothing else went wrong: an exception in flight is the story to tell
        raise ConfigError(write_problem)
    return result


def _write_tasks(
    result: MiningResult, out: Path, write: Callable[[list[TaskSpec], Path], None] = dump_tasks
) -> str | None:
    """Write the kept tasks (none: an empty file) to `out`, atomically, and record it; the problem, if it failed."""
    try:
        write(result.tasks, out)
    except OSError as exc:
        result.tasks_file = None
        return f"could not write the task file {out}: {exc}"
    result.tasks_file = str(out)
    return None


def _what_runs(spec: TaskSpec, modules: list[str], given: str | None) -> str:
    """How the progress line names what a validation runs: the changed test modules when the test command runs
    those (the detected one, or a given one with `{test_files}`), else the command itself."""
    if given is None or "{test_files}" in given:
        return f"{len(modules)} changed test module(s)"
    command = spec.test_command if len(spec.test_command) <= 80 else spec.test_command[:77] + "..."
    return f"test command {command!r}"


def _rejected_event(rejection: Rejection, result: MiningResult, environments: str = "") -> MiningEvent:
    return MiningEvent(
        "rejected",
        rejection.commit,
        rejection.subject,
        f"{rejection.reason.value}: {rejection.detail}" if rejection.detail else rejection.reason.value,
        scanned=result.scanned,
        kept=len(result.tasks),
        done=result.done,
        total=result.total,
        environments=environments,
    )
