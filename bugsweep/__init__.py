"""bugsweep: a coding agent for open models that fixes real bugs in a sandbox and grades its own work.

One task's data flows one way:
    TaskSpec (spec.py) -> Sandbox (sandbox/) -> agent loop (agent/) -> Grade (grading.py) -> artifacts (storage.py)
and `pipeline.py` strings those steps together for the command line (cli/) and the Prefect layer (tasks/, flows/).
"""

__version__ = "0.1.0"
