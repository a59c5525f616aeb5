"""TaskSpec: what one bug-fix task is, and the tasks.jsonl file that holds many.

Field names follow SWE-bench where they fit (instance_id, repo, base_commit, problem_statement, test_patch, patch,
FAIL_TO_PASS, PASS_TO_PASS), so task sets can travel between tools; a task file may also hold SWE-bench records as
they are published, made into TaskSpecs as they are read (bugsweep.swebench).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bugsweep.errors import BadTaskFile

if TYPE_CHECKING:
    from bugsweep.swebench import SweBenchRecords


#: The test command of a one-off task or a branch's failing tests when none is given: the run form of solve-bug,
#: `bugsweep sweep --repo` and the flows' repository source (`bugsweep solve` asks for one).
DEFAULT_TEST_COMMAND = "python -m pytest -q"
#: The setup command of a one-off task or a branch's failing tests when none is given, in every front end (`bugsweep
#: solve`, the run form of solve-bug, `bugsweep sweep --repo`, the flows' repository source): a task's environment
#: holds only what its setup installs, the test runner included. An empty setup command means none.
DEFAULT_SETUP_COMMAND = "pip install pytest"


class TaskSpec(BaseModel):
    """One bug to fix: a repository state, a task text, and how to test it."""

    # The field docstrings below become the JSON schema's descriptions (the help text of the Prefect UI's forms).
    model_config = ConfigDict(use_attribute_docstrings=True)

    instance_id: str = ""
    """Stable name of the task (unique within a task file). Derived from repo, commit and text when empty."""
    repo: str
    """A local path or a git URL."""
    base_commit: str | None = None
    """Commit, branch or tag to start from; unset: the working tree of a local path as it is."""
    problem_statement: str
    """The task text given to the model."""
    test_command: str
    """Runs the tests; exit code 0 means they pass."""
    setup_command: str | None = None
    """Runs once before the baseline, with network access, in the task's own virtual environment (first on PATH):
    it must install what the tests need, the test runner included (e.g. `pip install -e . pytest`)."""
    python: str | None = None
    """The interpreter the task's environment is made from: a path or a name on PATH (e.g. /usr/bin/python3,
    python3.12); unset: the one bugsweep runs on."""
    test_patch: str | None = None
    """A diff applied before the baseline (for mined tasks: the fix commit's test files)."""
    test_files: list[str] = Field(default_factory=list)
    """Test files that must stay untouched, besides those matched by the protected globs."""
    FAIL_TO_PASS: list[str] = Field(default_factory=list)
    """Test ids that fail before the fix and must pass after it."""
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    """Test ids that pass before and must still pass after."""
    FAIL_TO_FAIL: list[str] = Field(default_factory=list)
    """For mined tasks: tests that failed at the task state and at the fix commit alike (not the fix's doing): left
    out of FAIL_TO_PASS and PASS_TO_PASS and deselected from the test command."""
    fix_commit: str | None = None
    """For mined tasks: the commit that fixed the bug (never shown to the model)."""
    patch: str | None = None
    """The real fix as a diff, without its test files (SWE-bench's gold patch; for mined tasks the fix commit's
    other changes). Never shown to the model."""
    created_at: str | None = None
    """For mined tasks: the fix commit's date."""
    screen_rule: str | None = None
    """For mined tasks: the rule of the mining screen that took the commit for a bug fix (e.g. 'fix word in the
    subject', 'issue reference and a fix-shaped change')."""
    screen_reason: str | None = None
    """For mined tasks: why the screen took the commit for a bug fix, in words (e.g. "the subject says 'Fix'")."""
    added_at: str | None = None
    """For a growing benchmark's tasks: when the nightly mining added the task (ISO 8601)."""
    disk_mib: int | None = Field(default=None, gt=0)
    """Disk quota of this task's sandbox in MiB (its repository changes, $HOME and /tmp together); unset: the
    sandbox setting (BUGSWEEP_SANDBOX_DISK_MIB)."""

    def definition(self) -> dict[str, object]:
        """What this task is, for "already graded": every field that decides how it runs or what its verdict means
        (TASK_DEFINITION). A grade stored for a task of the same name counts only when its task.json has the same
        definition: an edited test command, setup, test patch or list of named tests runs the task again."""
        return self.model_dump(mode="json", include=set(TASK_DEFINITION))

    def model_post_init(self, __context: object) -> None:
        if not self.instance_id:
            digest = hashlib.sha256(
                f"{self.repo}\0{self.base_commit}\0{self.problem_statement}".encode()
            ).hexdigest()
            stem = re.sub(r"[^A-Za-z0-9]+", "-", Path(self.repo.rstrip("/")).name).strip("-") or "repo"
            self.instance_id = f"{stem}-{digest[:10]}"


#: The fields that define a task: where it starts (repository, commit, interpreter, disk), what the model is told,
#: and how it is set up and graded. Not its history (fix_commit, created_at, added_at) nor its gold patch, which the
#: model never sees and the grader never uses.
TASK_DEFINITION = (
    "repo", "base_commit", "python", "disk_mib", "problem_statement", "setup_command", "test_command", "test_patch",
    "test_files", "FAIL_TO_PASS", "PASS_TO_PASS",
)  # fmt: skip


def same_task(stored: TaskSpec, spec: TaskSpec) -> bool:
    """Whether a grade made for `stored` (its run folder's task.json) is a grade of `spec`: the one rule both
    checks of "already graded" use (a sweep skipping graded tasks; a run reusing a grade kept after a failed
    upload)."""
    return stored.definition() == spec.definition()


def load_tasks(
    path: str | Path, *, specs: str | Path | None = None, repos_from: str | None = None
) -> list[TaskSpec]:
    """Read a tasks.jsonl file. A bad line is a BadTaskFile error naming the line; nothing is half-loaded.

    SWE-bench records in it (lines without test_command) take their commands from `specs`, by default
    TASKS.specs.json beside the file, and their repositories from `repos_from` (bugsweep.swebench)."""
    from bugsweep.swebench import DEFAULT_REPOS_FROM, SweBenchRecords, specs_beside

    text = Path(path).read_text(encoding="utf-8")
    records = SweBenchRecords(
        specs=str(specs) if specs is not None else specs_beside(str(path)),
        repos_from=repos_from or DEFAULT_REPOS_FROM,
    )
    return parse_tasks(text, source=str(path), records=records)


def parse_tasks(
    text: str, source: str = "tasks.jsonl", records: SweBenchRecords | None = None
) -> list[TaskSpec]:
    """The tasks of a task file's text. A line without test_command is a SWE-bench record, made a task by
    `records` (without it: an error saying where its commands would come from)."""
    from bugsweep.swebench import SweBenchRecords

    records = records or SweBenchRecords()
    tasks: list[TaskSpec] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{source}:{lineno}"
        try:
            fields = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadTaskFile(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
        if not isinstance(fields, dict):
            raise BadTaskFile(f"{where}: not a JSON object")
        if "test_command" not in fields:
            fields = records.task(fields, where)
        try:
            task = TaskSpec.model_validate(fields)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'line'}: {e['msg']}" for e in exc.errors()
            )
            raise BadTaskFile(f"{where}: not a valid task ({problems})") from exc
        if task.instance_id in seen:
            raise BadTaskFile(f"{where}: duplicate instance_id {task.instance_id!r}")
        seen.add(task.instance_id)
        tasks.append(task)
    return tasks


def dump_tasks(tasks: list[TaskSpec], path: str | Path) -> None:
    """Write tasks as JSON Lines, atomically (a crash never leaves half a file)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(t.model_dump_json(exclude_none=True) + "\n" for t in tasks), encoding="utf-8")
    tmp.replace(path)
