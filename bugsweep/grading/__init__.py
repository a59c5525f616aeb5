"""Grading: a fix counts only when the tests failed before, pass after, and nothing the agent or the code under test
could reach decided so. The whole verdict lives in this package:

- `cleanroom`: the agent's change, read from outside its sandbox (no git, no link followed), written into others;
- `testfiles`: which paths are the test infrastructure (their changes are dropped and named);
- `harness`: what goes into a graded test run (the probe in the task environment's site-packages, the runner's
  settings, the wrapper that carries the probe's instruction in and its records out);
- `probe/`: the code that runs inside the test process (per-test outcomes, the per-test time limit, the mirror's
  false assertion);
- `runs`: one test run (`run_tests`, `TestRun`); `records`: what a run says about itself;
- `mirror`: the pair of runs the code under test cannot tell apart, one with a false assertion;
- `regrade`: the clean-room regrade that puts these together; `verdict`: the grade (`Grade`, `grade`);
- `signals`: what tests cannot judge (held for review).

The grader never trusts the model's word (its `finish` summary is recorded, never read), nor anything the agent
could write, nor what the test process says unless the mirror run agrees.
"""

from bugsweep.grading.runs import TestRun, run_tests
from bugsweep.grading.verdict import Grade, grade, verdict_label, verdict_word

__all__ = ["Grade", "TestRun", "grade", "run_tests", "verdict_label", "verdict_word"]
