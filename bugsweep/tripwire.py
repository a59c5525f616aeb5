"""The probe in every graded test run, and the tripwire in the regrade's: evidence that the runner told the truth.

The code under test runs in the test runner's process, so it can change what the runner reports: make the process
exit 0 at exit, turn the recording of failures into no-ops, load a plugin that reports every failure as passed.
Nothing inside that process can be trusted on its own; what can be checked is whether its reports agree:

- **The probe** (bugsweep/probe/, written into the sandbox for one run and put first on PYTHONPATH) records each
  unittest outcome the moment the result object receives it, on that object itself, so unittest gets per-test
  verdicts as pytest has them from its JUnit XML, and later patches of unittest's classes do not stop the recording.
- **The canary** (`make_canary`): a test module bugsweep writes beside the failing tests in the regrade's fresh
  sandbox, never seen by the agent, named like a sibling module and holding tests named like the failing ones (same
  class, same base classes (a class of the test module itself: its own bases), the same kind of assertion, the same
  module-level imports), some that must fail and one that must pass. The first test runner of the run adds it last
  (after -k, -m, -x and discovery), and only its own tests (not those its class inherits or its imports bring in).
- **The check** (`check`): a must-fail canary reported passed, or not reported at all by a run that otherwise
  passes, means the runner was subverted; the after-run's exit code must be the one its own results call for (with
  the canary failing: 1), and the runner's summary line must count the failures its per-test results hold.

What it cannot see: code that recognises the canary (it is not in the repository's git history) and behaves only
there, or a change that makes the tests pass by a special case that looks legitimate. The first is a targeted
attack on bugsweep that the `suspicious` signals look for; the second is the tests' problem, not the grader's.
"""

from __future__ import annotations

import ast
import re
import secrets
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources

from pydantic import BaseModel, Field

#: The probe's files, as written into the sandbox (name -> text); the `.dist-info` makes pytest load it as a plugin.
PROBE_MODULES = ("bugsweep_probe.py", "sitecustomize.py")
_DIST_INFO = "bugsweep_probe-1.dist-info"
_DIST_FILES = {
    f"{_DIST_INFO}/METADATA": "Metadata-Version: 2.1\nName: bugsweep-probe\nVersion: 1\n",
    f"{_DIST_INFO}/entry_points.txt": "[pytest11]\nbugsweep_probe = bugsweep_probe\n",
}
#: A unittest record of a module that could not be loaded: not a test (after a fix the module's own tests run).
_FAILED_LOAD = "unittest.loader._FailedTest."
_RANK = {"error": 4, "failed": 3, "passed": 2, "skipped": 1}


def probe_files() -> dict[str, str]:
    """Relative path -> text of everything the probe folder holds."""
    package = resources.files("bugsweep.probe")
    files = {name: package.joinpath(name).read_text(encoding="utf-8") for name in PROBE_MODULES}
    return {**files, **_DIST_FILES}


@dataclass
class ProbeReport:
    """What the probe wrote during one run."""

    runners: list[str] = field(default_factory=list)
    """The test runners that ran (first the one that took the canary, if any)."""
    canary_taken: bool = False
    errors: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    """unittest's per-test outcomes (test id -> the worst outcome recorded for it)."""
    load_errors: set[str] = field(default_factory=set)
    """Modules unittest could not load: not tests, but its summary counts each as an error."""
    timeouts: list[str] = field(default_factory=list)
    """Tests stopped at the per-test time limit (pytest node ids, unittest ids), recorded as the alarm went off."""


def parse_report(text: str) -> ProbeReport:
    report = ProbeReport()
    for line in text.splitlines():
        kind, _, value = line.partition("\t")
        if kind == "runner":
            report.runners.append(value)
        elif kind == "canary":
            report.canary_taken = True
        elif kind in ("canary-error", "probe-error"):
            report.errors.append(value)
        elif kind == "timeout":
            if value not in report.timeouts:
                report.timeouts.append(value)
        elif value.startswith(_FAILED_LOAD):
            report.load_errors.add(value[len(_FAILED_LOAD) :])
        elif kind in _RANK and value and _RANK[kind] > _RANK.get(report.outcomes.get(value, ""), 0):
            report.outcomes[value] = kind
    return report


# -- the canary ------------------------------------------------------------------------------------------------


@dataclass
class Canary:
    """A test module for one regrade: where it goes, what it holds, which of its tests must fail and pass."""

    path: str
    """Relative to the repository root, beside the failing tests' file."""
    module: str
    """Its dotted name as unittest imports it (the failing tests' package, its own name)."""
    source: str
    must_fail: list[str]
    """Its tests ('Class.test' or 'test') that fail by construction."""
    must_pass: list[str]

    def name_of(self, test_id: str) -> str | None:
        """'Class.test' for one of the canary's test ids (pytest node id or unittest id), else None."""
        for prefix in (self.path + "::", self.module + "."):
            if test_id.startswith(prefix):
                return re.sub(r"\[.*\]$", "", test_id[len(prefix) :]).replace("::", ".")
        return None


#: Assertion method -> (arguments that fail, arguments that pass); any other method is mirrored as assertEqual.
_ASSERTIONS = {
    "assertEqual": ("1, 2", "1, 1"),
    "assertEquals": ("1, 2", "1, 1"),
    "assertNotEqual": ("1, 1", "1, 2"),
    "assertTrue": ("False", "True"),
    "assertFalse": ("True", "False"),
    "assertIs": ("None, 0", "None, None"),
    "assertIsNone": ("0", "None"),
    "assertIsNotNone": ("None", "0"),
    "assertIn": ("1, []", "1, [1]"),
    "assertNotIn": ("1, [1]", "1, []"),
    "assertAlmostEqual": ("1.0, 2.0", "1.0, 1.0"),
    "assertGreater": ("1, 2", "2, 1"),
    "assertLess": ("2, 1", "1, 2"),
}


def make_canary(
    failing: list[str],
    passing: list[str],
    task_paths: frozenset[str],
    read: Callable[[str], str | None],
    *,
    test_command: str,
) -> Canary | None:
    """The canary for a regrade, mirroring the first failing test whose file is found; None when the tripwire
    cannot be armed (no failing test found in a Python file, or a test command that runs more than one runner)."""
    if not single_runner(test_command):
        return None
    for test_id in failing:
        located = _locate(test_id, task_paths)
        if located is None:
            continue
        rel, module, cls, _ = located
        text = read(rel)
        if text is None:
            continue
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        names = [
            n
            for t in failing
            if (got := _locate(t, task_paths)) and got[0] == rel and got[2] == cls
            for n in [got[3]]
        ]
        kept = [n for n in passing if (got := _locate(n, task_paths)) and got[0] == rel and got[2] == cls]
        canary = _write_canary(tree, text, rel, module, cls, list(dict.fromkeys(names))[:2], kept)
        try:
            compile(canary.source, canary.path, "exec")
        except (SyntaxError, ValueError):
            continue
        return canary
    return None


def _write_canary(
    tree: ast.Module, text: str, rel: str, module: str, cls: str, fail_names: list[str], passing: list[str]
) -> Canary:
    token = secrets.token_hex(3)
    folder, _, filename = rel.rpartition("/")
    stem = filename[:-3]
    name = f"_{stem}_{token}"  # not a name discovery picks up (test*.py, *_test.py): only the probe adds it
    path = f"{folder}/{name}.py" if folder else f"{name}.py"
    package = module.rpartition(".")[0]
    pass_names = [n for n in (_locate_name(p) for p in passing) if n.isidentifier() and n not in fail_names][
        :1
    ] or [f"{fail_names[0]}_{token}"]
    cls_node = (
        next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None) if cls else None
    )
    bases = ", ".join(_bases(tree, text, cls_node)) if cls_node else ""
    scope = cls_node.body if cls_node else tree.body
    lines = [*_prelude(tree, text), ""]
    indent, self_arg = ("    ", "self") if cls else ("", "")
    if cls:
        lines.append(f"class {cls}({bases}):" if bases else f"class {cls}:")
    for fail_name in fail_names:
        style = _assertion_style(scope, fail_name)
        lines += [f"{indent}def {fail_name}({self_arg}):", f"{indent}    {_statement(style, fail=True)}", ""]
    style = _assertion_style(scope, fail_names[0])
    lines += [f"{indent}def {pass_names[0]}({self_arg}):", f"{indent}    {_statement(style, fail=False)}", ""]
    prefix = f"{cls}." if cls else ""
    return Canary(
        path=path,
        module=f"{package}.{name}" if package else name,
        source="\n".join(lines),
        must_fail=[prefix + n for n in fail_names],
        must_pass=[prefix + pass_names[0]],
    )


def _bases(tree: ast.Module, text: str, cls_node: ast.ClassDef) -> list[str]:
    """The failing tests' class's bases as the canary can name them: a class of the test module itself (a mixin, a
    base with fixtures; the canary imports only what the module imports) is replaced by its own bases, a base that
    needs any other name the module defines is left out."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    prelude = set(_prelude(tree, text))
    defined = {
        name
        for node in tree.body
        if (ast.get_source_segment(text, node) or "") not in prelude
        for name in _bound(node)
    }
    kept: list[str] = []

    def add(node: ast.ClassDef, seen: frozenset[str]) -> None:
        for base in node.bases:
            names = {n.id for n in ast.walk(base) if isinstance(n, ast.Name)}  # `Generic[T]`: T too
            if isinstance(base, ast.Name) and base.id in classes and base.id not in seen:
                add(classes[base.id], seen | {base.id})
            elif names and not names & defined:
                source = ast.get_source_segment(text, base) or ast.unparse(base)
                if source not in kept:
                    kept.append(source)

    add(cls_node, frozenset({cls_node.name}))
    return kept


def _bound(node: ast.AST) -> set[str]:
    """The names a module-level statement binds in the module (not inside the functions or classes it defines)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Name):
        return {node.id} if isinstance(node.ctx, ast.Store) else set()
    if isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
        return set()
    return set().union(*(_bound(child) for child in ast.iter_child_nodes(node)))


def _locate_name(test_id: str) -> str:
    """The test function's name in a pytest node id or a unittest id (its parameters first cut off: they may hold
    dots)."""
    return re.split(r"::|\.", re.sub(r"\[.*\]$", "", test_id))[-1]


def _locate(test_id: str, task_paths: frozenset[str]) -> tuple[str, str, str, str] | None:
    """(file, module, class or '', test name) of a pytest node id or a unittest id, when its file is in the task."""
    if "::" in test_id:
        rel, *rest = test_id.split("::")
        if not rel.endswith(".py") or rel not in task_paths or not rest or len(rest) > 2:
            return None
        module, name = rel[:-3].replace("/", "."), re.sub(r"\[.*\]$", "", rest[-1])
        cls = rest[0] if len(rest) > 1 else ""
        # a doctest's id names a dotted object, a nested class two levels: nothing a canary can mirror
        return (rel, module, cls, name) if name.isidentifier() and (not cls or cls.isidentifier()) else None
    parts = test_id.split(".")
    if len(parts) < 3 or not all(p.isidentifier() for p in parts):
        return None
    module, cls, name = ".".join(parts[:-2]), parts[-2], parts[-1]
    tail = module.replace(".", "/") + ".py"
    found = sorted((p for p in task_paths if p == tail or p.endswith("/" + tail)), key=len)
    return (found[0], module, cls, name) if found else None


def _prelude(tree: ast.Module, text: str) -> list[str]:
    """The test module's module-level imports (and what they need: sys.path changes), so that the canary imports
    the code under test the way the failing tests do."""
    kept: list[str] = []
    for node in tree.body:
        source = ast.get_source_segment(text, node) or ""
        imports = any(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(node))
        if isinstance(node, ast.Import | ast.ImportFrom) or (
            isinstance(node, ast.Try | ast.If | ast.Expr | ast.Assign)
            and (imports or "sys.path" in source)
            and not _is_main_guard(node)
        ):
            kept.append(source)
    return kept


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def _assertion_style(scope: list[ast.stmt], name: str) -> str:
    """'assert' or the name of the `self.assert...` method the test `name` checks with first."""
    function = next(
        (n for n in scope if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name), None
    )
    for node in ast.walk(function) if function else ():
        if isinstance(node, ast.Assert):
            return "assert"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
            and node.func.attr.startswith("assert")
        ):
            return node.func.attr
    return "assert"


def _statement(style: str, *, fail: bool) -> str:
    if style == "assert":
        return "assert 1 == 2" if fail else "assert 1 == 1"
    if style == "assertRaises":
        return "with self.assertRaises(ValueError):\n            " + ("pass" if fail else "raise ValueError")
    method = style if style in _ASSERTIONS else "assertEqual"
    return f"self.{method}({_ASSERTIONS[method][0 if fail else 1]})"


def single_runner(test_command: str) -> bool:
    """Whether the test command runs one test runner, last: the canary's failure then only decides its exit code.
    (In `pytest a && pytest b` the first runner's canary would stop the second.)"""
    try:
        lexer = shlex.shlex(test_command, posix=True, punctuation_chars=True)
        words = list(lexer)
    except ValueError:
        return False
    steps: list[list[str]] = [[]]
    for word in words:
        if word in ("&&", ";", "||", "|", "&", "\n"):
            steps.append([])
        else:
            steps[-1].append(word)
    runs = [
        i for i, step in enumerate(steps) if step and step[0] not in ("cd", "export", "set", "source", ".")
    ]
    return runs == [len(steps) - 1]


# -- the check ---------------------------------------------------------------------------------------------------


class Tripwire(BaseModel):
    """What the tripwire saw in the regrade's test run (grade.json `tripwire`)."""

    armed: bool = False
    """A test runner took the canary (the probe was loaded by pytest or unittest, and the command runs one)."""
    runner: str | None = None
    canary: str | None = None
    """The canary module's path in the repository (never in the agent's sandbox)."""
    outcomes: dict[str, str] = Field(default_factory=dict)
    """Canary test -> what the runner reported ('missing' when nothing)."""
    subverted: str | None = None
    """Why the runner's reports cannot be trusted, when they cannot."""
    note: str | None = None
    """Why the tripwire could not judge (not armed, the canary could not run), when it could not."""


def check(
    canary: Canary | None, tests: dict[str, str] | None, report: ProbeReport
) -> tuple[dict[str, str] | None, Tripwire]:
    """Split the canary's results off the run's per-test results and judge them.

    Returns the task's own per-test results and the tripwire's finding. `subverted` is set only where the
    evidence is positive (a must-fail canary reported as anything but failed or error); a canary reported missing
    is judged by the grade, which knows whether the rest of the run passed."""
    runner = report.runners[0] if report.runners else None
    if canary is None:
        return tests, Tripwire(
            runner=runner,
            note="not armed: no failing test to mirror, or a test command of more than one step",
        )
    found: dict[str, str] = {}
    own: dict[str, str] | None = None
    if tests is not None:
        own = {}
        for test_id, outcome in tests.items():
            name = canary.name_of(test_id)
            if name is None:
                own[test_id] = outcome
            else:
                found[name] = max(outcome, found.get(name, ""), key=lambda o: _RANK.get(o, 0))
    wire = Tripwire(armed=report.canary_taken, runner=runner, canary=canary.path)
    wire.outcomes = {n: found.get(n, "missing") for n in [*canary.must_fail, *canary.must_pass]}
    if not wire.armed:
        wire.note = (
            "not armed: the canary could not be imported: " + "; ".join(report.errors)
            if report.errors
            else "not armed: no test runner the probe knows (pytest, unittest) ran the canary"
        )
        return own, wire
    wrong = [n for n in canary.must_fail if wire.outcomes[n] in ("passed", "skipped")]
    if wrong:
        wire.subverted = (
            f"the tripwire's must-fail test {wrong[0]} was reported {wire.outcomes[wrong[0]]}: something in the "
            "test process changes the runner's verdicts"
        )
    elif report.errors or any(wire.outcomes[n] not in ("passed", "missing") for n in canary.must_pass):
        # could not judge: the canary did not import, or its must-pass test did not pass (the code under test
        # fails to import, say: then the task's own tests say so)
        wire.note = "the canary did not run cleanly: " + (
            "; ".join(report.errors)
            or f"must-pass {canary.must_pass[0]} {wire.outcomes[canary.must_pass[0]]}"
        )
    return own, wire


# -- the runner's own summary ------------------------------------------------------------------------------------

_UNITTEST_END = re.compile(
    r"^Ran (\d+) tests? in [\d.]+s\s*\n\s*\n(OK|FAILED)\b(?: \((.*)\))?\s*$", re.MULTILINE
)
_PYTEST_END = re.compile(
    r"^=*\s*((?:\d+ (?:passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?|rerun)(?:, )?)+)"
    r"(?: in [\d.]+s)",
    re.MULTILINE,
)


def summary_failures(log: str, runner: str | None) -> int | None:
    """How many tests failed (failures and errors) by the runner's own last summary line; None without one."""
    if runner in (None, "unittest"):
        ends = _UNITTEST_END.findall(log)
        if ends:
            detail = ends[-1][2]
            counts = dict(re.findall(r"(\w+(?: \w+)?)=(\d+)", detail or ""))
            return sum(int(counts.get(k, 0)) for k in ("failures", "errors", "unexpected successes"))
    if runner in (None, "pytest"):
        lines = _PYTEST_END.findall(log)
        if lines:
            return sum(int(n) for n, _ in re.findall(r"(\d+) (failed|errors?)", lines[-1]))
    return None
