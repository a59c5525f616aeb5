"""What bugsweep puts into a test run: `bugsweep_probe.py`, loaded at start-up, and the modules it loads beside it."""
