"""Mining bug-fix tasks from a repository's own git history.

The method: a commit that fixed a bug and changed a test already holds a task. Check out its parent, copy in only
the commit's test files (the test_patch), and the changed tests fail for the reason the bug had; at the commit
itself they pass. The commit message's first line is the task text.

Steps, newest commit first (`mine`, in miner.py, runs them all):
1. `scan_history` (history.py) lists candidate commits (no merges) with their changed files.
2. `screen` (screening.py) rejects, without running anything, commits that change no runnable test file, no source
   file, or that do not read like a fix by their message and, for Python, their change (`read_commit`; the change's
   shape from change.py: new public names, existing functions changed, what the changed tests assert).
3. `build_task` (building.py) makes the TaskSpec: base_commit = parent, test_patch = the commit's diff of its test
   files, setup and test commands detected from the layout (`detect_commands`) unless given.
4. `validate` (validation.py) runs the tests `runs` times in a sandbox at the task state (parent + test_patch,
   exactly as a sweep prepares it) and `runs` times at the fix commit, each test under the per-test time limit
   (a test that hangs fails; the run goes on); `judge` (verdict.py) reads the runs. A test
   whose outcome differs between runs is flaky: it is reported and deselected from the task's test command.
   FAIL_TO_PASS are the tests that failed in every run before and passed in every run after; PASS_TO_PASS passed
   everywhere. A task needs at least one FAIL_TO_PASS test and no test that keeps failing at the fix (the grader
   requires the test command to pass after the fix).

Every rejected candidate gets a reason (RejectReason, records.py) and a detail line, so a user can see why their
history yielded what it did. A test command that cannot run for any candidate (CommandNotFound: a program not
found, `python -m` of a module the environment lacks) stops the run at the first one instead.
"""

from bugsweep.mining.building import Commands, build_task, default_prefix, detect_commands, test_patch
from bugsweep.mining.files import is_runnable_test, is_source_file
from bugsweep.mining.history import list_history, local_clone, parse_date, scan_history
from bugsweep.mining.miner import mine
from bugsweep.mining.records import (
    Commit,
    Kept,
    MiningEvent,
    MiningResult,
    ProgressCallback,
    Rejection,
    RejectReason,
    Screened,
    Unfinished,
)
from bugsweep.mining.screening import FIX_PATTERN, looks_like_fix, not_a_fix_reason, screen
from bugsweep.mining.validation import CannotRun, CommandNotFound, MiningStopped, Stopper, validate
from bugsweep.mining.verdict import Verdict, deselect, deselection, judge, normalise

__all__ = [
    "FIX_PATTERN", "CannotRun", "CommandNotFound", "Commands", "Commit", "Kept", "MiningEvent", "MiningResult",
    "MiningStopped", "ProgressCallback", "RejectReason", "Rejection", "Screened", "Stopper", "Unfinished", "Verdict",
    "build_task", "default_prefix", "deselect", "deselection", "detect_commands", "is_runnable_test",
    "is_source_file", "judge", "list_history", "local_clone", "looks_like_fix", "mine", "normalise",
    "not_a_fix_reason", "parse_date", "scan_history", "screen", "test_patch", "validate",
]  # fmt: skip
