"""PYTEST_DONT_REWRITE (pytest: loaded before pytest starts; never rewrite it)

The per-test memory bound, in the test runner's process (bugsweep_probe.py loads this file beside it when its
instruction sets `memory`, once the process starts a test runner). Kept compatible with Python 3.8.

A test that fills memory (an endless loop appending to a list) would reach the sandbox's memory limit and take the
whole run down with it: the process killed, no per-test results, no test named. Here a watcher thread reads the
process's resident memory (/proc/self/statm) every POLL_S while a test runs (every POLL_S / 10 once it holds half
the bound, so that fast growth is caught before the sandbox's limit); past the bound it raises
TestOutOfMemory in the main thread, as the per-test time limit raises TestTimedOut: the test fails and the run goes
on. Records: ["memory", test id, resident bytes, stopped], with stopped 0 when the test's process first held half the
bound (so that a process killed anyway, by memory a child process held or memory grown between two reads, names the
test that was running) and 1 when the test was stopped at the bound.

Its state is module attributes that code under test could read or change: it can only make a test fail (stopped, or
killed at the sandbox's limit without the bound), which any code can do; nothing here decides that a test passed.

An interrupt is never taken back with PyThreadState_SetAsyncExc(id, NULL): on CPython 3.11 that leaves the eval
breaker set for good, and under a trace function (coverage's, pytest-cov's, hypothesis') every Python call then
loops at its first line without end (zipp's runs under pytest-enabler's coverage hung at their first test). One sent
and not yet raised is raised at the end of the test's phase instead, and dropped there (`end`).
"""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any

POLL_S = 0.05


class TestOutOfMemory(BaseException):
    """A test's process grew past bugsweep's per-test memory bound."""

    __test__ = False

    def __init__(self, *args):
        said = f"bugsweep: {_memory.test} grew past the per-test memory bound of {_memory.bound >> 20} MiB"
        super().__init__(*(args or (said,)))


class _Memory:
    bound = 0  # bytes
    record: Any = None  # the probe's record function
    interrupt: Any = None  # PyThreadState_SetAsyncExc
    main = 0  # the main thread's ident
    test: Any = None  # the test whose phase runs (pytest: setup, call, teardown; unittest: the whole test)
    start = 0  # resident bytes as it started: a test that starts past the bound is not stopped for it
    high: Any = None  # the last test recorded at half the bound
    stopped: Any = None  # the last test stopped at the bound
    raised = 0.0  # when it was last interrupted (again once a second while it holds more: as the alarm)
    sent = False  # an interrupt was sent during the test's phase: it may not have been raised yet
    overdue: Any = None  # the probe's: the test its alarm should have stopped and could not, or None
    exit_code = 70  # the probe's HARD_STOP_EXIT
    lock = threading.Lock()


_memory = _Memory()


def _rss(page=os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096):
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * page
    except (OSError, ValueError, IndexError):
        return 0


def start(bound, record, overdue=None, exit_code=70):
    """Start the watcher in this process (from its main thread). False when it cannot run here. `overdue` (the
    probe's) names a test whose time limit's alarm could not stop it: the watcher ends the process, recording a
    "hard-stop" for it, as the alarm would."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if not _rss():
        record("probe-error", "no /proc/self/statm: no per-test memory bound")
        return False
    try:
        import ctypes

        set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc

        def interrupt(ident, exc):
            """Raise `exc` in the thread `ident` at its next bytecode (never None: see the module's docstring)."""
            set_async(ctypes.c_ulong(ident), ctypes.py_object(exc))
    except Exception as exc:  # not CPython
        record("probe-error", repr(exc)[:300])
        return False
    _memory.bound, _memory.record, _memory.interrupt = bound, record, interrupt
    _memory.overdue, _memory.exit_code = overdue, exit_code
    _memory.main = threading.get_ident()
    threading.Thread(target=_watch, name="bugsweep-memory", daemon=True).start()
    return True


def begin(test_id):
    _memory.start = _rss()
    _memory.test = test_id


def end(test_id):
    if _memory.test is None or _memory.test != test_id:
        return
    while True:  # an interrupt sent and not yet raised lands here, never after the test
        try:
            with _memory.lock:  # the watcher sends none once the test is over
                _memory.test = None
                sent, _memory.sent = _memory.sent, False
            for _ in range(3 if sent else 0):
                pass  # a loop's jump back raises an exception sent to this thread
            break
        except TestOutOfMemory:
            continue
    if _memory.stopped == test_id:
        gc.collect()  # what the stopped test held goes before the next test starts


def _watch():
    while True:
        time.sleep(POLL_S / 10 if _memory.high is not None and _memory.high == _memory.test else POLL_S)
        late = _memory.overdue() if _memory.overdue is not None else None
        if late is not None:
            _memory.record("hard-stop", late)
            os._exit(_memory.exit_code)
        test = _memory.test
        if test is None:
            continue
        rss = _rss()
        if rss * 2 > _memory.bound and _memory.high != test:
            _memory.high = test
            _memory.record("memory", test, rss, 0)
        if rss <= _memory.bound or _memory.start > _memory.bound:
            continue
        with _memory.lock:
            if _memory.test != test or time.monotonic() - _memory.raised < 1.0:
                continue
            if _memory.stopped != test:
                _memory.stopped = test
                _memory.record("memory", test, rss, 1)
            _memory.raised, _memory.sent = time.monotonic(), True
            _memory.interrupt(_memory.main, TestOutOfMemory)


def pytest_plugin(pytest):
    """pytest hook wrappers that put each phase of a test (setup, call, teardown) under the bound."""

    def phase(item):
        begin(item.nodeid)
        try:
            yield
        finally:
            end(item.nodeid)

    wrap = pytest.hookimpl(hookwrapper=True, tryfirst=True)

    class MemoryBound:
        @wrap
        def pytest_runtest_setup(self, item):
            yield from phase(item)

        @wrap
        def pytest_runtest_call(self, item):
            yield from phase(item)

        @wrap
        def pytest_runtest_teardown(self, item):
            yield from phase(item)

    return MemoryBound()
