"""PYTEST_DONT_REWRITE (pytest: loaded before pytest starts; never rewrite it)

unittest in the test process: the outcome of each test, recorded by the result object of each run, and which test
runs (its start and stop, the per-test time limit and memory bound around it). bugsweep_probe.py loads this file
beside it at start-up and calls `install`. Records: ["ut", outcome, test id], ["ut-start", test id], ["ut-stop",
test id], ["runner", "unittest", facts], ["end", "unittest"] (bugsweep_probe's module docstring has them all). A
run again after its process died while a test ran leaves the tests of the instruction's `skip` out of the suite.
Kept compatible with Python 3.8.
"""

import os
from typing import Any

_probe: Any = None  # bugsweep_probe, once installed

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


def _watch(result, set_current):
    """Record every outcome on the result object itself (an instance attribute, so that replacing the methods of
    unittest's classes afterwards does not stop the recording), and which test runs (`set_current`)."""
    for name, outcome in _OUTCOMES.items():
        method = getattr(result, name, None)
        if method is None:
            continue

        def wrapper(test, *args, _method=method, _outcome=outcome):
            _probe.record("ut", _outcome, _test_id(test))
            method = getattr(test, getattr(test, "_testMethodName", ""), None)
            if _outcome in ("failed", "error") and args and isinstance(args[0], tuple) and len(args[0]) == 3:
                _probe._record_code(_test_id(test), method, args[0][2])
            elif _outcome == "passed":
                _probe._record_code(_test_id(test), method, None)
            return _method(test, *args)

        setattr(result, name, wrapper)
    sub = getattr(result, "addSubTest", None)
    if sub is not None:

        def add_sub_test(test, subtest, err, _method=sub):
            if err is not None:
                failed = issubclass(err[0], getattr(test, "failureException", AssertionError))
                _probe.record("ut", "failed" if failed else "error", _test_id(test))
                _probe._record_code(
                    _test_id(test), getattr(test, getattr(test, "_testMethodName", ""), None), err[2]
                )
            return _method(test, subtest, err)

        result.addSubTest = add_sub_test
    start, stop = getattr(result, "startTest", None), getattr(result, "stopTest", None)
    if start is not None and stop is not None:

        def start_test(test, _method=start):
            _method(test)
            _probe.record("ut-start", _test_id(test))
            set_current(_test_id(test))
            if _probe._state.memory is not None:
                _probe._state.memory.begin(_test_id(test))
            if _probe._start(_test_id(test)):
                _probe._arm()

        def stop_test(test, _method=stop):
            set_current(None)
            if _probe._state.memory is not None:
                _probe._state.memory.end(_test_id(test))
            _probe._stop(_test_id(test))
            _probe.record("ut-stop", _test_id(test))
            return _method(test)

        result.startTest = start_test
        result.stopTest = stop_test
    return result


def _drop_skipped(suite):
    """Take the tests of `skip` out of a unittest suite, at any depth (a run again after the process died in them)."""
    tests = getattr(suite, "_tests", None)
    if tests is None:
        return
    kept = []
    for test in tests:
        if getattr(test, "_tests", None) is not None:
            _drop_skipped(test)
            kept.append(test)
        elif _test_id(test) not in _probe._state.skip:
            kept.append(test)
    suite._tests = kept


def install(probe, set_current):
    """Record the outcomes of every run of unittest's TextTestRunner in this process (`probe`: bugsweep_probe)."""
    global _probe
    _probe = probe
    import unittest.runner

    run = unittest.runner.TextTestRunner.run
    make = unittest.runner.TextTestRunner._makeResult

    def make_result(self):
        result = make(self)
        # only the outermost run of the runner process: a test that runs a suite of its own in-process (tests of
        # test tools) does not add its inner outcomes
        return (
            _watch(result, set_current)
            if _probe._state.runner == "unittest" and _probe._state.depth == 1
            else result
        )

    def run_tests(self, test):
        import unittest

        top = getattr(unittest.defaultTestLoader, "_top_level_dir", None)
        _probe._claim("unittest", cwd=os.getcwd(), top=top, pythonpath=os.environ.get("PYTHONPATH"))
        if _probe._state.skip and _probe._state.runner == "unittest" and _probe._state.depth == 0:
            _drop_skipped(test)
        _probe._state.depth += 1
        try:
            result = run(self, test)
        finally:
            _probe._state.depth -= 1
        if _probe._state.runner == "unittest" and _probe._state.depth == 0:
            _probe.record("end", "unittest")
        return result

    unittest.runner.TextTestRunner._makeResult = make_result  # type: ignore[method-assign]
    unittest.runner.TextTestRunner.run = run_tests  # type: ignore[method-assign]
