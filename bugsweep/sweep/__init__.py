"""Many tasks as one night, in plain functions: what the `solve-bug`, `sweep` and `compare-models` flows do besides
calling Prefect, usable and tested without it.

- `setup.py`: `RunSetup`, a run built by bugsweep.runbuilder with where its artifacts go.
- `task.py`: one task end to end (`solve_one`: an earlier run's kept grade uploaded instead of solving again,
  `pipeline.solve_task`, the branch, the upload, a kept folder when the store refuses), its `TaskOutcome`, and the
  steps a caller runs it with (`TaskSteps`: plain calls, or the flows' Prefect tasks).
- `graded.py`: what was graded before ("already graded": `previous_grade`, `split_graded`; grades made by another
  bugsweep; other configurations' grades of the same tasks) and results a failed upload kept (`upload_kept`).
- `collect.py`: a task's result read back from the store (a sweep whose tasks ran on workers), and the sweep's
  predictions file's runs.
"""

from bugsweep.sweep.setup import RunSetup
from bugsweep.sweep.task import TaskOutcome, TaskSteps, solve_one

__all__ = ["RunSetup", "TaskOutcome", "TaskSteps", "solve_one"]
