"""Imported by Python at start-up in every process of a graded test run (bugsweep puts this folder first on
PYTHONPATH): installs the probe (bugsweep_probe.py), then runs the `sitecustomize` this one hides, if any (Debian's
Python has one), so that the task's environment behaves as it would without bugsweep."""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
try:
    import bugsweep_probe

    bugsweep_probe.install()
except Exception:  # never stop the test process: bugsweep judges a missing probe on its own
    pass

# the import system takes this module back from sys.modules under its name once it has run: put it back after
_me = sys.modules.pop("sitecustomize")
_path = sys.path[:]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
try:
    import sitecustomize  # noqa: F401  (the one this file hides)
except ImportError:
    pass
finally:
    sys.path[:] = _path
    sys.modules["sitecustomize"] = _me
