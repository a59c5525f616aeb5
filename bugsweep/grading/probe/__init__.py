"""What bugsweep puts into a test run: `bugsweep_probe.py`, its `sitecustomize.py` (bugsweep.tripwire)."""
