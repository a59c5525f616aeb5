"""PYTEST_DONT_REWRITE (pytest: this module is loaded before pytest starts; never rewrite it)

Runs inside the task's test process (the sandbox's Python, not bugsweep's): per-test outcomes for pytest and
unittest, the per-test time limit, and the mirror run's one false assertion (bugsweep.grading.mirror).

How it gets there (bugsweep.grading.harness): a `.pth` line in the task environment's site-packages loads this file
at interpreter start-up, in every Python process of the environment, before any code of the repository can run.
It does nothing unless the process holds bugsweep's instruction on file descriptor 97: bugsweep's wrapper script
gives it on the command's stdin and moves it there. The probe reads it completely at start-up and closes it, so
that no code that runs later in this process can read it, and writes what it records to file descriptor 98, which
the wrapper sends to the command's stderr (captured outside the sandbox: code can add lines there, never take one
back). Both descriptors are closed for the process's children (a test that starts another Python gets no probe).
In the regrade's two runs (the real one and the mirror) the descriptors, the files and the environment are the
same; only the instruction differs (in one flag, and its nonce: of the same length), and only the probe's memory
keeps it: in closures made at start-up (bugsweep_probe_instruction.py reads it and makes them), never in a module
attribute that code could read or set by name.

The instruction (one JSON object): `mirror` (0 or 1), `nonce` (32 hex digits, a new one for each run of the pair),
`limit` (seconds one test may take; 0: none), `memory` (bytes the runner's process may hold while a test runs:
bugsweep_probe_memory.py; 0: no bound), `inject`: the test functions that get bugsweep's statement (`[[file,
[[qualname, line], ...]], ...]`: every test of the baseline that has a function in the repository, the `line` where
it failed before, or 0), and `armed`: the one test the mirror gives a false assertion (`id` as the runner names it,
its function's `file`, `qualname` and `line`) or null, and `skip`: pytest node ids or unittest test ids not to
run (deselected, or taken out of the suite; a run again after the process died while they ran). In both runs every function named is compiled with one more
statement after its body (and before each `return` of its own): `assert bugsweep_probe.expect()`, or for a
`unittest` method `self.assertX(*bugsweep_probe.expect_args("assertX"))` in the style of the test's own assertion.

When that statement runs in its function's own outermost call, while the runner runs a test of that function, on
the thread that runs it, the probe records ["reached", test id, file, qualname, nonce]: that test's body ran to its
end. The nonce is only in the probe's memory, so a line written by anyone else does not count (bugsweep reads each
run's records with that run's nonce). `expect` then says True, and `expect_args` gives arguments that pass,
everywhere but in the mirror's armed test: there they fail. With a real fix the mirror's armed test fails at that
statement; with a bogus fix it fails at its own assertion first, exactly as in the real run, so code that turns
failures into passes turns this one too, and the mirror reads "passed"; and a test reported passed in either run
without its "reached" record did not run to its end.

Records (one JSON list a line): ["hello"], ["runner", name, facts], ["pt", when, outcome, xfail, nodeid, file,
classname, name] (pytest, with the JUnit XML names), ["pc", outcome, nodeid, file, classname, name] (a collection
error), ["ut", outcome, test id], ["ut-start", test id], ["ut-stop", test id] (unittest), ["code", test id, file, qualname, line, kind] (a test's function: of
every test that ran, in a run without `inject`; `kind` "async" or "gen" for a coroutine or generator function),
["inj", file, qualname, style] (a function compiled with bugsweep's statement), ["inj-miss", file, qualname],
["reached", ...], ["timeout", test id], ["hard-stop", test id] (it went on HARD_STOP_S past its limit: the
process exits), ["memory", test id, bytes, stopped] (bugsweep_probe_memory.py), ["end",
runner] (the runner finished: without it a run's per-test results are not whole), ["probe-error", text]. Kept compatible with Python 3.8.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import threading
import time
from typing import Any

INSTRUCTION_FD = 97
RECORD_FD = 98
_write = os.write
_dumps = json.dumps


class _State:
    active = False
    runner = ""  # the runner this process is, once it has started one
    depth = 0  # how deep in TextTestRunner.run this process is
    limit = 0.0
    memory_bound = 0  # bytes
    memory: Any = None  # bugsweep_probe_memory, once its watcher runs in this process (the runner's)
    pair = False  # a run of the regrade's pair (its tests' functions are known: no "code" record for passing tests)
    hooked = False  # pytest's assertion rewriting hooked (once, whatever pytest sessions run in this process)
    # pytest node ids not to run (a rerun's: they were running when a run before it died)
    skip: Any = frozenset()


_state = _State()


def record(*fields):
    """Write one record (a line of its own, so a half line written by anyone else cannot swallow it)."""
    if not _state.active:
        return
    try:  # noqa: SIM105 (no contextlib: the probe imports as little as it can)
        _write(RECORD_FD, ("\n" + _dumps(list(fields), default=str) + "\n").encode())
    except (OSError, ValueError, TypeError):
        pass


def expect():
    """bugsweep's statement in plain `assert` style: True, except in the mirror's armed test."""
    return not _decide()


#: unittest assertion method -> (arguments that pass, arguments that fail); any other method is assertEqual's.
_ARGS = {
    "assertEqual": ((1, 1), (1, 2)),
    "assertEquals": ((1, 1), (1, 2)),
    "assertNotEqual": ((1, 2), (1, 1)),
    "assertTrue": ((True,), (False,)),
    "assertFalse": ((False,), (True,)),
    "assertIs": ((None, None), (None, 0)),
    "assertIsNot": ((None, 0), (None, None)),
    "assertIsNone": ((None,), (0,)),
    "assertIsNotNone": ((0,), (None,)),
    "assertIn": ((1, [1]), (1, [])),
    "assertNotIn": ((1, []), (1, [1])),
    "assertIsInstance": ((1, int), (1, str)),
    "assertNotIsInstance": ((1, str), (1, int)),
    "assertAlmostEqual": ((1.0, 1.0), (1.0, 2.0)),
    "assertNotAlmostEqual": ((1.0, 2.0), (1.0, 1.0)),
    "assertGreater": ((2, 1), (1, 2)),
    "assertGreaterEqual": ((2, 1), (1, 2)),
    "assertLess": ((1, 2), (2, 1)),
    "assertLessEqual": ((1, 2), (2, 1)),
    "assertCountEqual": (([1], [1]), ([1], [2])),
    "assertListEqual": (([1], [1]), ([1], [2])),
    "assertSequenceEqual": (([1], [1]), ([1], [2])),
    "assertTupleEqual": (((1,), (1,)), ((1,), (2,))),
    "assertSetEqual": (({1}, {1}), ({1}, {2})),
    "assertDictEqual": (({1: 1}, {1: 1}), ({1: 1}, {1: 2})),
    "assertMultiLineEqual": (("a", "a"), ("a", "b")),
    "assertRegex": (("a", "a"), ("a", "b")),
    "assertNotRegex": (("a", "b"), ("a", "a")),
}


def expect_args(method):
    """The arguments of bugsweep's `self.<method>(...)` statement: passing ones, except in the mirror's armed test."""
    passing, failing = _ARGS.get(method, _ARGS["assertEqual"])
    return failing if _decide() else passing


def _decide():
    return False


# -- the per-test time limit -----------------------------------------------------------------------------------


class TestTimedOut(BaseException):
    """A test ran past bugsweep's per-test time limit."""

    __test__ = False


class _Clock:
    """The test whose time runs (one at a time: a test that runs tests in-process starts no other clock), its
    deadline, and the SIGALRM handler it replaced while armed."""

    test: Any = None
    deadline = 0.0
    armed = False
    previous: Any = None
    fired = False
    fired_at = 0.0
    hard = False  # armed while a report is built: the alarm ends the process


_clock = _Clock()

#: Seconds a test may go on after it was first told to stop (once a second) before its process is ended (or its
#: time limit again, if that is shorter): code that catches the exception each time would otherwise hold the whole
#: run until its own timeout. The process exits HARD_STOP_EXIT after a "hard-stop" record; bugsweep runs the
#: command again without that test, which failed (bugsweep.grading.runs.run_tests).
HARD_STOP_S = 10.0
HARD_STOP_EXIT = 70


def _start(test_id):
    """The test's time starts. False when there is no limit or another test's time runs already."""
    if not _state.limit or _clock.test is not None:
        return False
    _clock.test, _clock.deadline, _clock.fired = test_id, time.monotonic() + _state.limit, False
    return True


def _fire(signum, frame):
    now = time.monotonic()
    if not _clock.fired:
        _clock.fired, _clock.fired_at = True, now
        record("timeout", _clock.test)
    elif now - _clock.fired_at >= min(HARD_STOP_S, _state.limit):
        _clock.hard = True  # told to stop for as long again: it will not
    if _clock.hard:
        record("hard-stop", _clock.test)
        os._exit(HARD_STOP_EXIT)
    raise TestTimedOut(f"bugsweep: {_clock.test} ran past the per-test time limit of {_state.limit:g} s")


def _overdue():
    """The running test, when its alarm should have stopped it a while ago and has not begun to (code under test
    that took over SIGALRM); else None. The memory watcher's thread then ends the process as the alarm's hard stop
    would (bugsweep_probe_memory.py)."""
    test = _clock.test
    if test is None or not _clock.armed or _clock.fired or not _state.limit:
        return None
    return test if time.monotonic() > _clock.deadline + min(HARD_STOP_S, _state.limit) + 1 else None


def _arm(hard=False):
    """Set the alarm for the rest of the running test's time (a phase after it fired gets the whole limit again,
    so that its fixtures can be torn down). True when this call armed it: only then does its caller disarm.
    `hard`: while the runner builds a test's report, where an exception would end the whole run half way, the
    alarm ends the process instead (a report built past the test's time, or for as long again once it fired)."""
    if _clock.test is None or _clock.armed or threading.current_thread() is not threading.main_thread():
        return False
    left = _clock.deadline - time.monotonic()
    if hard and _clock.fired:
        left = min(HARD_STOP_S, _state.limit)
    try:
        _clock.previous = signal.signal(signal.SIGALRM, _fire)
        # then once a second: a test that catches the first exception and waits again is stopped again
        signal.setitimer(signal.ITIMER_REAL, left if left > 0 else _state.limit, 1.0)
    except (ValueError, OSError, AttributeError) as exc:  # no SIGALRM: the whole run's timeout is the bound
        record("probe-error", repr(exc)[:300])
        return False
    _clock.armed, _clock.hard = True, hard
    return True


def _disarm():
    try:
        signal.setitimer(signal.ITIMER_REAL, 0)
        previous = _clock.previous
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
    except (ValueError, OSError, AttributeError):
        pass
    _clock.armed, _clock.previous, _clock.hard = False, None, False


def _stop(test_id):
    """The test is over: its alarm is off and its time no longer runs."""
    if _clock.test is not None and _clock.test == test_id:
        if _clock.armed:
            _disarm()
        _clock.test = None


# -- each test's function (where a failing one failed), for the regrade's pair ------------------------------------


def _function(obj):
    """The plain function under a test's method, decorators and partials (their __wrapped__), or None."""
    for _ in range(20):
        inner = getattr(obj, "__wrapped__", None) or getattr(obj, "__func__", None)
        if inner is None:
            break
        obj = inner
    return obj if hasattr(obj, "__code__") and hasattr(obj, "__qualname__") else None


#: CO_GENERATOR, CO_ASYNC_GENERATOR; CO_COROUTINE, CO_ITERABLE_COROUTINE: a test of such a function may pass without
#: its body running (unittest calls it and drops what it returns)
_GENERATOR, _COROUTINE = 0x20 | 0x200, 0x80 | 0x100


def _record_code(test_id, obj, tb):
    """["code", ...] for a test that failed (`tb`: where), or passed (`tb` None; not in the pair, which knows)."""
    if tb is None and _state.pair:
        return
    function = _function(obj)
    if function is None:
        return
    code = function.__code__
    line = 0
    while tb is not None:
        if tb.tb_frame.f_code is code:
            line = tb.tb_lineno
        tb = tb.tb_next
    flags = code.co_flags
    kind = "gen" if flags & _GENERATOR else "async" if flags & _COROUTINE else ""
    record("code", test_id, code.co_filename, function.__qualname__, line, kind)


def _claim(runner, **facts):
    """This process runs tests: say so (once). False when it runs tests already (a test that runs a test runner
    in-process: its outcomes are not the run's)."""
    if _state.runner:
        return False
    _state.runner = runner
    record("runner", runner, facts)
    if _state.memory_bound:
        module = _sibling("bugsweep_probe_memory")
        _state.memory = (
            module if module.start(_state.memory_bound, record, _overdue, HARD_STOP_EXIT) else None
        )
    return True


# -- pytest: loaded as a plugin by name (`-p bugsweep_probe` in PYTEST_ADDOPTS) -----------------------------------


def pytest_addoption(parser):
    """Replaced at start-up in a graded run (`_pytest_hooks`); pytest finds this module's hooks when it registers it,
    after start-up."""


def pytest_configure(config):
    """Replaced at start-up in a graded run (`_pytest_hooks`)."""


def _pytest_hooks(set_current, targets, register):
    """This run's `pytest_addoption` and `pytest_configure`, with the private hooks in their closures."""

    def pytest_addoption(parser):
        """Called as pytest registers this plugin, before it imports any conftest or test module."""
        if targets and not _state.hooked:
            _state.hooked = True
            _inject_module().hook_pytest(targets, record, register)

    def pytest_configure(config):
        if not _state.active or not _claim(
            "pytest",
            rootdir=str(getattr(config, "rootpath", "") or getattr(config, "rootdir", "")),
            cwd=os.getcwd(),
            pythonpath=os.environ.get("PYTHONPATH"),
            workers=str(getattr(config.option, "numprocesses", "") or ""),
        ):
            return
        import pytest

        config.pluginmanager.register(_pytest_plugin(pytest, set_current), "bugsweep-probe-session")
        if _state.limit:
            config.pluginmanager.register(_time_limit_plugin(pytest), "bugsweep-time-limit")
        if _state.memory is not None:
            config.pluginmanager.register(_state.memory.pytest_plugin(pytest), "bugsweep-memory-bound")

    return pytest_addoption, pytest_configure


def _junit_names(nodeid):
    """(classname, name) as pytest's JUnit XML writes them for this node id (its own functions, where it has them)."""
    try:
        from _pytest.junitxml import bin_xml_escape, mangle_test_address

        names = mangle_test_address(nodeid)
        name = bin_xml_escape(names[-1])
        if hasattr(name, "uniobj"):  # pytest < 6.1: py.xml's raw markup, which a JUnit XML reader unescapes
            from xml.sax.saxutils import unescape

            name = unescape(name.uniobj, {"&quot;": '"', "&apos;": "'", "&#39;": "'"})
        return ".".join(names[:-1]), str(name)
    except Exception:
        path, bracket, params = nodeid.partition("[")
        names = path.split("::")
        names[0] = names[0].replace("/", ".")
        names[0] = names[0][:-3] if names[0].endswith(".py") else names[0]
        names[-1] += bracket + params
        return ".".join(names[:-1]), names[-1]


def _pytest_plugin(pytest, set_current):
    class Session:
        @pytest.hookimpl(tryfirst=True)
        def pytest_runtest_logreport(self, report):
            classname, name = _junit_names(report.nodeid)
            file = report.location[0] if report.location else ""
            xfail = 1 if hasattr(report, "wasxfail") else 0
            record("pt", report.when, report.outcome, xfail, report.nodeid, file, classname, name)

        @pytest.hookimpl(tryfirst=True)
        def pytest_collectreport(self, report):
            if not report.passed:
                classname, name = _junit_names(report.nodeid)
                file = report.location[0] if getattr(report, "location", None) else report.nodeid
                record("pc", report.outcome, report.nodeid, file, classname, name)

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            outcome = yield
            try:
                report = outcome.get_result()
                if report.failed and call.excinfo is not None:
                    _record_code(item.nodeid, getattr(item, "obj", None), call.excinfo.tb)
                elif report.passed and report.when in ("setup", "call"):
                    # at setup too: a test whose process dies in its call still has its function known
                    _record_code(item.nodeid, getattr(item, "obj", None), None)
            except Exception:
                pass

        @pytest.hookimpl(trylast=True)
        def pytest_collection_modifyitems(self, session, config, items):
            if _state.skip:
                left = [item for item in items if item.nodeid in _state.skip]
                if left:
                    items[:] = [item for item in items if item.nodeid not in _state.skip]
                    config.hook.pytest_deselected(items=left)

        @pytest.hookimpl(trylast=True)
        def pytest_sessionfinish(self, session, exitstatus):
            record("end", "pytest")

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item):
            set_current(item.nodeid)
            try:
                yield
            finally:
                set_current(None)

    return Session()


def _time_limit_plugin(pytest):
    """pytest hook wrappers that run each phase of a test (setup, call, teardown) under the per-test alarm, armed
    and disarmed inside the phase, so that the exception lands where pytest reports it as that phase's failure."""

    def phase(item, first=False, last=False, hard=False):
        if first:
            _start(item.nodeid)
        armed = _arm(hard) if _clock.test == item.nodeid else False
        try:
            yield
        finally:
            if armed:
                _disarm()
            if last:
                _stop(item.nodeid)

    wrap = pytest.hookimpl(hookwrapper=True, tryfirst=True)

    class TimeLimit:
        @wrap
        def pytest_runtest_setup(self, item):
            yield from phase(item, first=True)

        @wrap
        def pytest_runtest_call(self, item):
            yield from phase(item)

        @wrap
        def pytest_runtest_teardown(self, item):
            yield from phase(item, last=True)

        @wrap
        def pytest_runtest_makereport(self, item, call):
            # a failure's report shows its frames' arguments: a repr that never returns (loguru 2024) is bounded too
            yield from phase(item, hard=True)

    return TimeLimit()


def _inject_module():
    return _sibling("bugsweep_probe_inject")


def _sibling(name):
    """The module `name` from its file beside this one, by its path (a module of that name elsewhere on sys.path is
    not it)."""
    module = sys.modules.get(name)
    if module is None:
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


# -- start-up ----------------------------------------------------------------------------------------------------


def _start_up():
    global _decide, pytest_addoption, pytest_configure
    try:
        os.fstat(INSTRUCTION_FD)
    except OSError:
        return  # no descriptor 97 (a process bugsweep did not start, a test's child): nothing to read or load
    given = _sibling("bugsweep_probe_instruction")
    instruction = given.read(INSTRUCTION_FD)
    if not isinstance(instruction, dict):
        return
    try:
        if not stat.S_ISFIFO(os.fstat(RECORD_FD).st_mode):
            return
        os.set_inheritable(RECORD_FD, False)  # a test's own child processes record nothing
    except OSError:
        return
    _state.active = True
    try:
        _state.limit = max(float(instruction.get("limit") or 0), 0.0)
    except (TypeError, ValueError):
        _state.limit = 0.0
    try:
        _state.memory_bound = max(int(instruction.get("memory") or 0), 0)
    except (TypeError, ValueError):
        _state.memory_bound = 0
    skip = instruction.get("skip")
    _state.skip = frozenset(str(t) for t in skip) if isinstance(skip, list) else frozenset()
    targets = given.targets(instruction, record)
    _state.pair = bool(targets)
    set_current, register, _decide = given.private(
        instruction, (expect.__code__, expect_args.__code__), RECORD_FD
    )
    del instruction
    pytest_addoption, pytest_configure = _pytest_hooks(set_current, targets, register)
    record("hello")
    try:
        _sibling("bugsweep_probe_unittest").install(sys.modules[__name__], set_current)
    except Exception as exc:  # a Python without unittest: nothing to record
        record("probe-error", repr(exc)[:300])
    if targets:
        try:
            _inject_module().hook_source_loader(targets, record, register)
        except Exception as exc:
            record("probe-error", repr(exc)[:300])


_start_up()
