"""What bugsweep puts into a test run: `bugsweep_probe.py`, loaded at start-up, and the modules it loads beside it."""

#: The probe's modules, the one loaded at start-up first. Every list of them is made from this one: the files put
#: into site-packages (harness.PROBE_FILES), the names the facts script leaves out, the runner's modules a
#: repository file may not shadow (testfiles.RUNNER_MODULES).
MODULES = (
    "bugsweep_probe",
    "bugsweep_probe_instruction",
    "bugsweep_probe_inject",
    "bugsweep_probe_memory",
    "bugsweep_probe_unittest",
)
