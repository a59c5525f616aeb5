"""Runs inside the task's test process (the sandbox's Python, not bugsweep's): per-test outcomes for unittest, and
the tripwire's canary tests added to whichever runner runs first.

bugsweep writes this folder into the sandbox for one test run and puts it first on PYTHONPATH, so that Python
imports its `sitecustomize` (which imports this module) and pytest finds its entry point (the `.dist-info` beside
it). Nothing here is trusted for its own sake: the code under test runs in the same process and could undo any of
it. What it buys is that undoing it is visible (bugsweep.tripwire): a must-fail canary reported passed, a test
recorded failed that the runner's summary calls OK, an exit code that contradicts both.

Settings come from the environment of the test command (bugsweep.grading.run_tests):
- BUGSWEEP_PROBE_DIR: this folder; the report (`report`, one "kind<TAB>value" line each) is written in it;
- BUGSWEEP_PROBE_CANARY: the canary module's path in the repository (pytest) and its module name (unittest),
  then its tests ('Class.test' or 'test', separated by commas), separated by TABs; unset: no canary. Only those
  tests of the module run: not the tests its class inherits, nor the test classes its imports bring in.
- BUGSWEEP_PROBE_TEST_TIMEOUT: seconds one test may take (the per-test time limit); unset: none. A test still
  running then gets an exception (TestTimedOut, a BaseException, so that `except Exception` does not swallow it)
  from a SIGALRM in the main thread, and the report says `timeout<TAB>test id` before it is raised: bugsweep counts
  that test as failed whatever the runner reports afterwards, so code that catches the exception cannot make it
  a pass. A test that blocks the signal, or never returns to Python, runs on until the whole run's timeout.

The first test runner of the run takes the canary (a file created with O_EXCL says so); every runner process
removes this folder from PYTHONPATH for its children, so that a test that starts another test runner in a
subprocess neither records into the report nor gets a canary. Kept compatible with Python 3.8.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

_DIR = os.environ.get("BUGSWEEP_PROBE_DIR", "")
_CANARY = os.environ.get("BUGSWEEP_PROBE_CANARY", "")
try:
    _LIMIT = max(float(os.environ.get("BUGSWEEP_PROBE_TEST_TIMEOUT") or 0), 0.0)
except ValueError:
    _LIMIT = 0.0
_runner = [""]  # the runner this process is, once it has started one
_depth = [0]  # how deep in TextTestRunner.run this process is


def record(kind, value):
    """Append one line to the report; each line is written at once, so a process that ends abruptly keeps it."""
    if not _DIR:
        return
    line = "{}\t{}\n".format(kind, " ".join(str(value).split()))
    try:
        fd = os.open(os.path.join(_DIR, "report"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass


def _claim(runner):
    """This process runs tests: say so, keep the probe from its children, and take the canary if no runner has.
    Returns the canary (path, module, names of its tests or None: all) this runner runs, or None."""
    if _runner[0]:
        return None
    _runner[0] = runner
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _DIR]
    if parts:
        os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        os.environ.pop("PYTHONPATH", None)
    record("runner", runner)
    if not _CANARY or not _DIR:
        return None
    try:
        os.close(os.open(os.path.join(_DIR, "canary-taken"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:
        return None  # an earlier runner of the same command has it
    path, _, rest = _CANARY.partition("\t")
    module, _, names = rest.partition("\t")
    return path, module, set(names.split(",")) if names else None


# -- the per-test time limit -----------------------------------------------------------------------------------


class TestTimedOut(BaseException):
    """A test ran past bugsweep's per-test time limit."""

    __test__ = False


#: The test whose time runs (only one at a time: a test that runs tests in-process does not start another clock),
#: its deadline, and the SIGALRM handler it replaced while armed.
class _Clock:
    test: str | None = None
    deadline = 0.0
    armed = False
    previous: Any = None
    fired = False


_clock = _Clock()


def _start(test_id):
    """The test's time starts. False when there is no limit or another test's time runs already."""
    if not _LIMIT or _clock.test is not None:
        return False
    _clock.test, _clock.deadline, _clock.fired = test_id, time.monotonic() + _LIMIT, False
    return True


def _fire(signum, frame):
    if not _clock.fired:
        _clock.fired = True
        record("timeout", _clock.test)
    raise TestTimedOut(f"bugsweep: {_clock.test} ran past the per-test time limit of {_LIMIT:g} s")


def _arm():
    """Set the alarm for the rest of the running test's time (a phase after it fired gets the whole limit again,
    so that its fixtures can be torn down). True when this call armed it: only then does its caller disarm."""
    if _clock.test is None or _clock.armed or threading.current_thread() is not threading.main_thread():
        return False
    left = _clock.deadline - time.monotonic()
    try:
        _clock.previous = signal.signal(signal.SIGALRM, _fire)
        # then once a second: a test that catches the first exception and waits again is stopped again
        signal.setitimer(signal.ITIMER_REAL, left if left > 0 else _LIMIT, 1.0)
    except (ValueError, OSError, AttributeError) as exc:  # no SIGALRM: the whole run's timeout is the bound
        record("probe-error", repr(exc)[:300])
        return False
    _clock.armed = True
    return True


def _disarm():
    try:
        signal.setitimer(signal.ITIMER_REAL, 0)
        previous = _clock.previous
        signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
    except (ValueError, OSError, AttributeError):
        pass
    _clock.armed, _clock.previous = False, None


def _stop(test_id):
    """The test is over: its alarm is off and its time no longer runs."""
    if _clock.test is not None and _clock.test == test_id:
        if _clock.armed:
            _disarm()
        _clock.test = None


# -- unittest: outcomes recorded by the result object of each run ----------------------------------------------

_OUTCOMES = {
    "addSuccess": "passed",
    "addFailure": "failed",
    "addError": "error",
    "addSkip": "skipped",
    "addExpectedFailure": "skipped",  # as pytest's JUnit XML has an expected failure
    "addUnexpectedSuccess": "failed",
}


def _test_id(test):
    try:
        return test.id()
    except Exception:
        return repr(test)


def _watch(result):
    """Record every outcome on the result object itself (an instance attribute, so that replacing the methods of
    unittest's classes afterwards does not stop the recording)."""
    for name, outcome in _OUTCOMES.items():
        method = getattr(result, name, None)
        if method is None:
            continue

        def wrapper(test, *args, _method=method, _outcome=outcome):
            record(_outcome, _test_id(test))
            return _method(test, *args)

        setattr(result, name, wrapper)
    sub = getattr(result, "addSubTest", None)
    if sub is not None:

        def add_sub_test(test, subtest, err, _method=sub):
            if err is not None:
                failed = issubclass(err[0], getattr(test, "failureException", AssertionError))
                record("failed" if failed else "error", _test_id(test))
            return _method(test, subtest, err)

        result.addSubTest = add_sub_test
    start, stop = getattr(result, "startTest", None), getattr(result, "stopTest", None)
    if _LIMIT and start is not None and stop is not None:

        def start_test(test, _method=start):
            _method(test)
            if _start(_test_id(test)):
                _arm()

        def stop_test(test, _method=stop):
            _stop(_test_id(test))
            return _method(test)

        result.startTest = start_test
        result.stopTest = stop_test
    return result


def _with_canary(suite, module, names=None):
    """The suite with the canary module's tests (those of `names`, if given) last (dropped first where discovery
    found them)."""
    import importlib
    import unittest

    try:  # imported first: a canary that cannot be imported is said, never run as a failing test of the task's
        importlib.import_module(module)
    except Exception as exc:
        record("canary-error", repr(exc)[-300:])
        return suite
    canary = unittest.defaultTestLoader.loadTestsFromName(module)
    if names is not None:
        canary = unittest.TestSuite([t for t in _flat(canary) if _test_id(t)[len(module) + 1 :] in names])
    record("canary", "unittest")

    def rest(test):
        if isinstance(test, unittest.TestSuite):
            return unittest.TestSuite([t for t in (rest(t) for t in test) if t is not None])
        return None if _test_id(test).startswith(module + ".") else test

    kept = rest(suite) if isinstance(suite, unittest.TestSuite) else suite
    return unittest.TestSuite([t for t in (kept, canary) if t is not None])


def _flat(suite):
    import unittest

    for test in suite:
        if isinstance(test, unittest.TestSuite):
            yield from _flat(test)
        else:
            yield test


def _install_unittest():
    import unittest.runner

    run = unittest.runner.TextTestRunner.run
    make = unittest.runner.TextTestRunner._makeResult

    def make_result(self):
        result = make(self)
        # only the outermost run of the runner process: a test that runs a suite of its own in-process (tests of
        # test tools) does not add its inner outcomes
        return _watch(result) if _runner[0] == "unittest" and _depth[0] == 1 else result

    def run_tests(self, test):
        canary = _claim("unittest")
        if canary is not None:
            test = _with_canary(test, canary[1], canary[2])
        _depth[0] += 1
        try:
            return run(self, test)
        finally:
            _depth[0] -= 1

    unittest.runner.TextTestRunner._makeResult = make_result  # type: ignore[method-assign]
    unittest.runner.TextTestRunner.run = run_tests  # type: ignore[method-assign]


class _Pytest:
    """The canary's tests, last among the collected items (also after -k or -m deselected them)."""

    def __init__(self, path, names=None):
        self.path = path
        self.names = names

    def wanted(self, item):
        """One of the canary's own tests (not one its class inherits or its imports bring in)."""
        name = item.nodeid.partition("::")[2].replace("::", ".")
        return self.names is None or name.partition("[")[0] in self.names

    def modifyitems(self, session, items):
        import pytest

        ours = [i for i in items if str(getattr(i, "path", "")) == self.path]
        if not ours:
            try:
                module = pytest.Module.from_parent(session, path=__import__("pathlib").Path(self.path))
                # imported first: a canary that cannot be imported is said, never reported to pytest as a
                # collection error (that would stop the session before the task's tests run)
                module.obj  # noqa: B018
                ours = list(session.genitems(module))
            except Exception as exc:
                record("canary-error", repr(exc)[-300:])
        ours = [i for i in ours if self.wanted(i)]
        items[:] = [i for i in items if str(getattr(i, "path", "")) != self.path] + ours
        if ours:  # armed only now: a runner that collects elsewhere (pytest-xdist's workers) runs no canary
            record("canary", "pytest")


def pytest_configure(config):
    """pytest loads this module as a plugin through the entry point beside it."""
    first = not _runner[0]
    canary = _claim("pytest")
    import pytest

    if first and _LIMIT:  # not for a pytest run in-process by a test: the outer test's time runs on
        config.pluginmanager.register(_time_limit_plugin(pytest), "bugsweep-time-limit")
    if canary is None:
        return

    plugin = _Pytest(canary[0], canary[2])

    class Hooks:
        @pytest.hookimpl(trylast=True)
        def pytest_collection_modifyitems(self, session, config, items):
            plugin.modifyitems(session, items)

    config.pluginmanager.register(Hooks(), "bugsweep-canary")


def _time_limit_plugin(pytest):
    """pytest hook wrappers that run each phase of a test (setup, call, teardown) under the per-test alarm, armed
    and disarmed inside the phase, so that the exception lands where pytest reports it as that phase's failure."""

    def phase(item, first=False, last=False):
        if first:
            _start(item.nodeid)
        armed = _arm() if _clock.test == item.nodeid else False
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

    return TimeLimit()


def install():
    """Called by the sitecustomize beside this module, in every Python process of the test run."""
    if not _DIR:
        return
    try:
        _install_unittest()
    except Exception as exc:  # a Python without unittest: nothing to record
        record("probe-error", repr(exc)[:300])
    sys.modules.setdefault("bugsweep_probe", sys.modules[__name__])
