"""Judging a candidate from its test runs at the task state and at the fix commit (no sandbox here)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from bugsweep.grading import TestRun
from bugsweep.mining.extras import missing_modules
from bugsweep.mining.records import RejectReason

#: A memory address in a test id (`test_repr[<object object at 0x7f3a1c2b5e90>]`): it changes from run to run, so
#: two ids that differ only by one are the same test.
ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
#: What an address becomes in a normalised id.
ADDRESS_MARK = "0x…"


def normalise(test_id: str) -> str:
    """The id with its memory addresses replaced by ADDRESS_MARK: the same for every run of the same test."""
    return ADDRESS.sub(ADDRESS_MARK, test_id)


@dataclass
class Verdict:
    """What the test runs say about a candidate."""

    reason: RejectReason | None
    detail: str = ""
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    fail_to_fail: list[str] = field(default_factory=list)
    """Tests that failed in every run at the task state and at the fix commit: not the candidate's doing, left out
    of FAIL_TO_PASS and PASS_TO_PASS and deselected from the task's test command (as SWE-bench leaves them out)."""
    flaky: list[str] = field(default_factory=list)
    unnamed: list[str] = field(default_factory=list)
    """Tests whose id holds a memory address (normalised, `0x…`): judged as one test across runs, but left out of
    FAIL_TO_PASS and PASS_TO_PASS, which a grader matches by exact id (they still run in the test command)."""
    skipped_after: list[str] = field(default_factory=list)
    """Tests that passed in every run at the task state and were skipped (or did not run) at the fix commit, such as
    an xfail test that xpassed before the fix: deselected, since a grader needs every test that passed before to
    pass after."""
    also_deselected: list[str] = field(default_factory=list)
    """Tests that passed at the fix whose id starts with a deselected test's (pytest's `--deselect` matches a
    prefix: `test_type_field` beside a deselected `test_type`): they do not run in the task's command, so neither
    FAIL_TO_PASS nor PASS_TO_PASS names them (a grader would find them missing)."""
    deselect: list[str] = field(default_factory=list)
    """What the task's test command deselects (`--deselect`, which pytest matches as a prefix): the flaky and
    fail-to-fail tests, a whole class, module or parametrised test in one argument where all of its tests are
    deselected, and the part of an id before its memory address."""
    out_of_memory: list[str] = field(default_factory=list)
    """Tests the probe stopped at the per-test memory bound in any run, at either state (normalised ids): failed
    there, as at the time limit (an endless loop filling a list at the task state is a FAIL_TO_PASS test)."""
    ignored: list[str] = field(default_factory=list)
    """Test modules other than the commit's own that stopped pytest at the task state by not importing: the task's
    command ignores them (`--ignore`; bugsweep.mining.validation.uncollectable)."""
    allowed_warnings: list[str] = field(default_factory=list)
    """pytest's own warning categories that the project's `filterwarnings = error` made collection errors at the
    task state (an unregistered mark, which pytest 4.5 began to warn of): the task's command ignores them (`-W`)."""
    relaxed: list[str] = field(default_factory=list)
    """Pins (NAME==VERSION) of the setup that the package index has no distribution for, relaxed to the releases of
    their major version from there on, and type-stub packages (NAME) it has no release of, left out
    (bugsweep.mining.building.relax_pins): the task's setup does the same."""
    build_constraints: list[str] = field(default_factory=list)
    """Build constraints the setup failed without (`setuptools<58` where a package it builds asks for 2to3, which
    setuptools 58 removed): the task's setup constrains its builds so too (building.constrain_builds)."""
    disabled_plugins: list[str] = field(default_factory=list)
    """Installed pytest plugins that today's pytest refused to load at the task state, stopping every run before
    its first test (pytest-flake8's py.path hook, refused by pytest 9): the task's command disables them (`-p no:`)."""
    no_ini: bool = False
    """True when today's pytest refused the project's configuration at start-up at the task state (a `[pytest]`
    section in setup.cfg, which pytest 4 stopped reading), stopping every run before its first test: the task's
    command reads no configuration file (bugsweep.mining.verdict.without_ini)."""
    crashed: list[str] = field(default_factory=list)
    """Tests whose process died while they ran, in any run (normalised ids): failed there, and the rest of that run
    ran again without them (bugsweep.grading.runs.run_tests)."""
    python: str | None = None
    """The other interpreter (older, or newer where the package requires one) the candidate was validated on again,
    and kept on, after its environment failed on the running Python (bugsweep.mining.interpreters); None: the
    running one."""
    dated: str = ""
    """The commit's time (ISO 8601, as git gives it) when the candidate was kept with the releases of that time
    installed (bugsweep.mining.building.dated_setup), its environment having failed with today's; empty otherwise."""
    extras: list[str] = field(default_factory=list)
    """The project's extras the candidate was validated on again with, and kept with, after its tests could not
    import a module one of them installs (bugsweep.mining.extras); the task's setup installs them too."""
    missing_modules: list[str] = field(default_factory=list)
    """Top-level modules a test run could not import ("No module named 'arrow'"), in any run, at either state."""
    environments: list[str] = field(default_factory=list)
    """How each state's task environment came about, in the order they ran (the task state, then the fix commit):
    'built' (the setup ran), 'reused' (a finished setup was reused), 'no setup'."""


Outcomes = dict[str, str]


def _outcomes(run: TestRun) -> Outcomes:
    """The run's per-test outcomes by normalised id; where several ids become one, a failure wins, then a pass."""
    merged: Outcomes = {}
    rank = {"failed": 3, "error": 3, "passed": 2, "skipped": 1}
    for test_id, outcome in (run.tests or {}).items():
        key = normalise(test_id)
        if key not in merged or rank.get(outcome, 3) > rank.get(merged[key], 3):
            merged[key] = outcome
    return merged


def _status(outcomes: Outcomes, test_id: str) -> str:
    outcome = outcomes.get(test_id, "missing")
    return "pass" if outcome == "passed" else "skip" if outcome == "skipped" else "fail"


def _stable(runs: Sequence[Outcomes], ids: set[str]) -> tuple[dict[str, str], set[str]]:
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


def _all_ids(runs: Sequence[Outcomes]) -> set[str]:
    return {t for r in runs for t in r}


def judge(before: Sequence[TestRun], after: Sequence[TestRun], unrelated: Collection[str] = ()) -> Verdict:
    """Decide from the runs at the task state (`before`) and at the fix commit (`after`, may be empty if stopped early).

    Per test when JUnit results exist (pytest); by exit code otherwise.
    """
    verdict = _judge(before, after, unrelated)
    if NOT_IMPORTED in verdict.detail:  # what pytest said of each such module: why, without running it again
        errors = collection_errors([*after, *before]).items()
        verdict.detail += "".join(f"; {path}: {error}" for path, error in errors if path in verdict.detail)
    verdict.missing_modules = missing_modules([*before, *after])
    verdict.out_of_memory = sorted({normalise(t) for r in (*before, *after) for t in r.tests_out_of_memory})
    verdict.crashed = sorted({normalise(t) for r in (*before, *after) for t in r.tests_crashed})
    return verdict


def _judge(before: Sequence[TestRun], after: Sequence[TestRun], unrelated: Collection[str] = ()) -> Verdict:
    if timed_out := [r for r in (*before, *after) if r.timed_out]:
        detail = "a test run timed out"
        if stuck := sorted({normalise(t) for r in timed_out for t in r.tests_timed_out}):
            # tests ran on to their limit one after another, and the runs again without them (run_tests) did too
            detail += (
                " (its whole-run limit, also when run again without the tests that ran past the per-test time "
                f"limit: {', '.join(stuck[:3])}{' and more' if len(stuck) > 3 else ''})"
            )
        return Verdict(RejectReason.TIMED_OUT, detail)
    no_results = next((r for r in before if r.tests is None), None)
    if no_results is not None and after and all(r.tests is not None for r in after):
        # The runner ran to the end at the fix but not at the task state: the run there was killed (an endless loop
        # at the memory limit, a crash) before it wrote its results, so no test can be named FAIL_TO_PASS.
        code = no_results.exit_code
        how = (
            f"was killed (exit {code}: out of memory, or a signal)"
            if code is not None and (code < 0 or code >= 128)
            else f"exited {code}"
        )
        if no_results.killed_in:
            how += (
                f" while {no_results.killed_in} ran (its process held half the per-test memory bound or more)"
            )
        runner = no_results.probe.runners[0] if no_results.probe.runners else "the test runner"
        return Verdict(
            RejectReason.NO_TEST_RESULTS,
            f"the test run at the task state {how} before {runner} wrote its results: no test to name FAIL_TO_PASS",
        )
    if all(r.tests is not None for r in (*before, *after)):
        return _judge_tests([_outcomes(r) for r in before], [_outcomes(r) for r in after], unrelated)
    return _judge_exit_codes(before, after)


def _judge_tests(
    before: Sequence[Outcomes], after: Sequence[Outcomes], unrelated: Collection[str] = ()
) -> Verdict:
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
    # no longer exists after it. One at both states fails the fix, but for the other modules that stopped pytest
    # at the task state (`unrelated`: ignored, where a conftest.py overrode that).
    st_after, flaky_after = _stable(after, _all_ids(after))
    flaky = flaky_before | flaky_after
    fail_to_fail = {
        t
        for t in failing
        if st_after.get(t) == "fail"
        and t not in flaky
        and (not _is_collection_error(t) or t.partition("::")[0] in unrelated)
    }
    broken = {t for t, s in st_after.items() if s == "fail" and t not in flaky and t not in fail_to_fail}
    fail_to_pass = sorted(t for t in failing if st_after.get(t) == "pass" and t not in flaky)
    pass_to_pass = sorted(
        t for t, s in st_before.items() if s == "pass" and st_after.get(t) == "pass" and t not in flaky
    )
    outcome = Verdict(None, fail_to_fail=sorted(fail_to_fail), flaky=sorted(flaky))
    if broken:
        outcome.reason = RejectReason.TESTS_FAIL_AT_FIX
        outcome.detail = _ids("failing at the fix commit", broken)
        return outcome
    # passed before, skipped or gone after (an xfail test that xpassed at the task state): a grader needs every
    # test that passed before to pass after, so the task's command leaves them out
    outcome.skipped_after = sorted(
        t
        for t, s in st_before.items()
        if s == "pass" and st_after.get(t, "skip") == "skip" and t not in flaky
    )
    outcome.deselect = deselection(flaky | fail_to_fail | set(outcome.skipped_after), ids)
    # pytest's --deselect leaves out every test whose id starts with an argument: a test named like the start of a
    # deselected one's id (`test_type_field` beside a deselected `test_type`) does not run in the task's command
    also = tuple(outcome.deselect)
    outcome.also_deselected = sorted(t for t in [*fail_to_pass, *pass_to_pass] if t.startswith(also))
    fail_to_pass = [t for t in fail_to_pass if t not in outcome.also_deselected]
    pass_to_pass = [t for t in pass_to_pass if t not in outcome.also_deselected]
    named = [t for t in fail_to_pass if ADDRESS_MARK not in t]
    if not named:
        if caught := [t for t in outcome.also_deselected if st_before.get(t) == "fail"]:
            outcome.reason = RejectReason.TESTS_PASS_AT_PARENT
            outcome.detail = _ids(
                "the only tests that failed at the task state and passed at the fix would be deselected with a "
                "flaky or failing test whose id begins theirs (pytest's --deselect matches a prefix)",
                set(caught),
            )
        elif fail_to_fail:
            outcome.reason = RejectReason.TESTS_FAIL_AT_FIX
            outcome.detail = "no test failed at the task state and passed at the fix; " + _ids(
                "failing in both states", fail_to_fail
            )
        elif fail_to_pass:
            outcome.reason = RejectReason.TESTS_PASS_AT_PARENT
            outcome.detail = _ids(
                "the only tests that failed at the task state and passed at the fix have ids that hold a memory "
                "address (a grader could not name them)",
                set(fail_to_pass),
            )
        elif flaky:
            outcome.reason, outcome.detail = RejectReason.FLAKY, _ids("flaky", flaky)
        else:
            outcome.reason = RejectReason.TESTS_PASS_AT_PARENT
            outcome.detail = "no test failed at the task state and passed at the fix"
        return outcome
    # A changed module that did not import before the fix (its pseudo-test is gone at the fix; a test function
    # named like its module, test_schema.py::test_schema, is still there): its tests did not run before the fix,
    # the grader's baseline would hold one pseudo-test for it that no fix can make pass, and the mirror has no
    # function to arm there.
    not_imported = sorted(
        t for t in failing if _is_collection_error(t) and t not in fail_to_fail and t not in st_after
    )
    if not_imported:
        outcome.reason = RejectReason.TESTS_CANNOT_RUN
        outcome.detail = _ids(
            "a changed test module does not import at the task state (it imports what the commit adds), so its "
            "tests cannot fail there one by one and a grader cannot check them",
            set(not_imported),
        )
        return outcome
    outcome.fail_to_pass = named
    outcome.pass_to_pass = [t for t in pass_to_pass if ADDRESS_MARK not in t]
    outcome.unnamed = sorted(t for t in [*fail_to_pass, *pass_to_pass] if ADDRESS_MARK in t)
    return outcome


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


#: What a verdict says of test modules pytest could not import (`_ids`).
NOT_IMPORTED = "could not be imported or collected"
#: pytest's report of a module it could not import, "___ ERROR collecting tests/test_x.py ___", and its traceback,
#: whose `E   ` lines end with the exception ("E   ModuleNotFoundError: No module named 'numpy'").
_COLLECTING = re.compile(r"^_+ ERROR collecting (\S+) _+$(.*?)(?=^_{3,} |^={3,} |\Z)", re.M | re.S)
_EXCEPTION_LINE = re.compile(r"^E\s+((?:\w+\.)*\w*(?:Error|Exception|Exit|Interrupt)\b.*)$", re.M)


def collection_errors(runs: Sequence[TestRun]) -> dict[str, str]:
    """Test module path -> the exception pytest reported when it could not import it (the first run's that has one;
    the modules in the order pytest reported them)."""
    found: dict[str, str] = {}
    for run in runs:
        for path, block in _COLLECTING.findall(run.log):
            if path not in found and (raised := _EXCEPTION_LINE.findall(block)):
                found[path] = raised[-1].strip()[:200]
    return found


def _ids(what: str, ids: set[str], limit: int = 4) -> str:
    broken = sorted(t for t in ids if _is_collection_error(t))
    if broken:
        what += f" ({', '.join(t.partition('::')[0] for t in broken)} {NOT_IMPORTED})"
    shown = sorted(ids)[:limit]
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return f"{what}: {', '.join(shown)}{more}"


def deselection(tests: Collection[str], known: Collection[str]) -> list[str]:
    """The `--deselect` arguments that leave out `tests` (normalised ids) and nothing else of `known` (every test
    the runs saw): pytest deselects every test whose id starts with an argument, so a module (`path::`), a class
    (`path::Class::`) or a parametrised test (`path::test_f[`) all of whose tests are in `tests` is one argument,
    and an id holding a memory address is deselected by its part before the address (which matches it in any
    run). Arguments are in id order, and each matches a test the runs saw."""
    wanted = set(tests)
    chosen: list[str] = []
    for test_id in sorted(wanted):
        if any(test_id.startswith(prefix) for prefix in chosen):
            continue
        prefixes = _prefixes(test_id)
        fits = (p for p in prefixes if all(k in wanted for k in known if k.startswith(p)))
        chosen.append(next(fits, prefixes[-1]))  # the id itself, even where it is the start of another id
    return chosen


def _prefixes(test_id: str) -> list[str]:
    """The prefixes of a normalised id that could deselect it, widest first, the last one matching only it."""
    exact = test_id.split(ADDRESS_MARK, 1)[0]
    path, sep, rest = exact.partition("::")
    if not sep:
        return [exact]
    wider = [f"{path}::"]
    parts = rest.split("::")
    for i in range(1, len(parts)):
        wider.append(f"{path}::{'::'.join(parts[:i])}::")
    if "[" in parts[-1]:
        wider.append(exact[: exact.index("[", len(path)) + 1])
    return [*wider, exact] if ADDRESS_MARK in test_id else [*wider, test_id]


def ignore(test_command: str, paths: Sequence[str]) -> str:
    """The pytest command with these test modules left out of collection (`--ignore`), and collection errors no
    longer stopping the session: a conftest.py whose `pytest_ignore_collect` answers False for every path (boltons
    2020) overrides `--ignore`, and its modules then fail in both states, as the task's FAIL_TO_FAIL."""
    return (
        test_command
        + "".join(f" --ignore={shlex.quote(path)}" for path in paths)
        + " --continue-on-collection-errors"
    )


#: A warning of pytest's own that the project's `filterwarnings = error` made a collection error: "E   pytest.
#: PytestUnknownMarkWarning: Unknown pytest.mark.tzoffset" (marks needed no registering before pytest 4.5).
_PYTEST_WARNING_ERROR = re.compile(r"^E\s+pytest\.(Pytest\w*Warning)\b", re.M)
#: The same stopping pytest at start-up, before any test, as the last line of its traceback: "pytest.
#: PytestRemovedIn9Warning: The (path: py.path.local) argument is deprecated" for a conftest.py hook (typeguard's
#: 2022-2025 commits, with pytest 8).
_PYTEST_WARNING_AT_START = re.compile(r"^pytest\.(Pytest\w*Warning): ", re.M)


def pytest_warnings_as_errors(runs: Sequence[TestRun]) -> list[str]:
    """pytest's own warning categories that stopped a module's collection in a run, or pytest's start in a run with
    no test result (as errors, by the project's `filterwarnings = error`): about the pytest mining installed, newer
    than the commit's, not about its code."""
    found = {
        m for run in runs if "ERROR collecting" in run.log for m in _PYTEST_WARNING_ERROR.findall(run.log)
    }
    found |= {m for run in runs if not run.tests for m in _PYTEST_WARNING_AT_START.findall(run.log)}
    return sorted(found)


#: A plugin that today's pytest refuses to load, which stops every run before its first test: "Plugin 'flake8'
#: for hook 'pytest_collect_file' ... Argument(s) {'path'} are declared in the hookimpl but can not be found in the
#: hookspec" (pytest-flake8 with pytest 9, which lost schedule's 2021-2024 fixes).
_REFUSED_PLUGIN = re.compile(r"PluginValidationError: Plugin '([A-Za-z0-9_.-]+)' for hook")


def refused_plugins(runs: Sequence[TestRun]) -> list[str]:
    """The installed pytest plugins that pytest refused to load in a run with no test result (it stopped at
    start-up): about the environment mining made, not about the commit's code."""
    found = {m for run in runs if not run.tests for m in _REFUSED_PLUGIN.findall(run.log)}
    return sorted(found)


#: What pytest 4 and later say at start-up of a `[pytest]` section in setup.cfg, and stop: every run of such a
#: commit has no test result (cssselect's 2012-2017 setup.cfg, six's 2014).
_REFUSED_SETUP_CFG = "[pytest] section in setup.cfg files is no longer supported"


def setup_cfg_refused(runs: Sequence[TestRun]) -> bool:
    """Whether pytest refused the project's setup.cfg at start-up in a run with no test result."""
    return any(not run.tests and _REFUSED_SETUP_CFG in run.log for run in runs)


def without_ini(test_command: str) -> str:
    """The pytest command reading no configuration file (`-c /dev/null`: its options are the ones the command
    gives), rooted where it runs, the repository's root, so that its test ids stay the same (`--rootdir .`)."""
    return test_command + " -c /dev/null --rootdir ."


def disable_plugins(test_command: str, plugins: Sequence[str]) -> str:
    """The pytest command with these plugins not loaded (`-p no:NAME`)."""
    return test_command + "".join(f" -p no:{plugin}" for plugin in plugins)


def allow_warnings(test_command: str, categories: Sequence[str]) -> str:
    """The pytest command with these pytest warning categories ignored (`-W`, which overrides the ini file)."""
    return test_command + "".join(f" -W ignore::pytest.{category}" for category in categories)


def deselect(test_command: str, prefixes: Sequence[str]) -> str:
    """The pytest command with these tests (ids, or prefixes from `deselection`) deselected, so grading never
    depends on them."""
    return test_command + "".join(f" --deselect {shlex.quote(t)}" for t in prefixes)
