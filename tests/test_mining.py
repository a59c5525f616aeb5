"""Mining tasks from git history (bugsweep.mining).

Real parts: real git repositories built by the test (tests.support.repos), real `git`, the real local sandbox
(bubblewrap + overlayfs) running real pytest. No stand-ins. The unit tests of `judge` use hand-made TestRun
values: they check the decision rules on outcomes a sandbox would report.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bugsweep.grading import TestRun
from bugsweep.mining import (
    Commands,
    MiningEvent,
    Rejection,
    RejectReason,
    Screened,
    build_task,
    deselection,
    detect_commands,
    judge,
    looks_like_fix,
    mine,
    not_a_fix_reason,
    scan_history,
    screen,
)
from bugsweep.mining.building import BUILD_CONSTRAINTS, constrain_builds
from bugsweep.settings import SandboxSettings
from bugsweep.spec import TaskSpec, load_tasks
from tests.support.repos import commit_all, git, make_repo, write_files

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n    return a / b\n"
PYPROJECT = '[tool.pytest.ini_options]\npythonpath = ["."]\n'
TEST_MUL = "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
# Counts the runs in this sandbox: a test that checks only on even runs fails on the first run and passes on the
# second, so it is flaky by construction.
RUN_COUNTER = """import pathlib


def run_number(name):
    p = pathlib.Path(__file__).with_name("." + name + "_runs")
    n = int(p.read_text()) if p.exists() else 0
    p.write_text(str(n + 1))
    return n

"""


def build_history(root: Path) -> dict[str, str]:
    """A repository whose commits each exercise one rule. Returns commit sha by role."""
    repo = make_repo(root, {"calc.py": CALC, "tests/test_calc.py": TEST_MUL, "pyproject.toml": PYPROJECT})
    shas: dict[str, str] = {}

    # A real fix with its test: kept (test_add fail->pass, test_mul pass->pass).
    write_files(repo, {
        "calc.py": CALC.replace("a - b", "a + b"),
        "tests/test_calc.py": TEST_MUL.replace("import mul", "import add, mul")
        + "\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    })  # fmt: skip
    shas["fix"] = commit_all(repo, "Fix add() returning the difference")

    # Only tests change.
    write_files(
        repo,
        {"tests/test_more.py": "from calc import mul\n\n\ndef test_zero():\n    assert mul(0, 5) == 0\n"},
    )
    shas["tests_only"] = commit_all(repo, "Fix: add a test for mul by zero")

    # Only code changes.
    write_files(repo, {"calc.py": CALC.replace("a - b", "a + b") + "\n\ndef sub(a, b):\n    return a - b\n"})
    shas["code_only"] = commit_all(repo, "Fix: add sub()")

    # Code and tests change, but the message is no fix.
    write_files(repo, {
        "calc.py": (repo / "calc.py").read_text() + "\n\ndef neg(a):\n    return -a\n",
        "tests/test_neg.py": "from calc import neg\n\n\ndef test_neg():\n    assert neg(2) == -2\n",
    })  # fmt: skip
    shas["not_a_fix"] = commit_all(repo, "Add neg()")

    # A "fix" whose new test already passed before the change.
    write_files(repo, {
        "calc.py": (repo / "calc.py").read_text().replace("return -a", "return 0 - a"),
        "tests/test_neg2.py": "from calc import neg\n\n\ndef test_neg_zero():\n    assert neg(0) == 0\n",
    })  # fmt: skip
    shas["already_passing"] = commit_all(repo, "Fix neg() for zero")

    # A fix whose only failing test is flaky: it fails or passes at the parent depending on the run.
    write_files(repo, {
        "calc.py": (repo / "calc.py").read_text().replace("return a / b", "return a / b if b else None"),
        "tests/test_div.py": "from calc import div\n" + RUN_COUNTER
        + "\ndef test_div():\n    if run_number('div') % 2 == 0:\n        assert div(1, 0) is None\n",
    })  # fmt: skip
    shas["flaky"] = commit_all(repo, "Fix crash in div() on zero")

    # A fix whose test still fails at the fix commit.
    write_files(repo, {
        "calc.py": (repo / "calc.py").read_text() + "\n\ndef half(a):\n    return a // 2\n\n\ndef sq(a):\n    return a + a\n",
        "tests/test_half.py": "from calc import half\n\n\ndef test_half():\n    assert half(3) == 1.5\n",
    })  # fmt: skip
    shas["fails_at_fix"] = commit_all(repo, "Fix half() for odd numbers")

    # A fix with a stable fail->pass test and a flaky neighbour: kept, the flaky test deselected.
    write_files(repo, {
        "calc.py": (repo / "calc.py").read_text().replace("return a + a", "return a * a"),
        "tests/test_sq.py": "from calc import sq\n" + RUN_COUNTER
        + "\ndef test_sq():\n    assert sq(3) == 9\n\n\n"
        + "def test_sq_flaky():\n    assert run_number('sq') % 2 == 1, 'fails on every other run'\n",
    })  # fmt: skip
    shas["kept_with_flaky"] = commit_all(repo, "Fix sq() doubling instead of squaring (issue #7)")
    return shas


# -- screening and decisions, without a sandbox ------------------------------------------------------------------


def test_fix_keywords() -> None:
    for message in (
        "Fix add()",
        "handle OSError on Windows",
        "crash when empty",
        "closes #12",
        "regression in 2.1",
        "fix: add() returned the difference",
        "fix(parser)!: crash on empty input",
        "refactor: fix the off-by-one in paginate",
        "Make paginate() stop at the last page\n\nIt raised IndexError past the end.",
        # issue 37, round 3: a release that also fixes something; "Add handling for" reads like "handle"
        "Bump version to 1.5.6 and fix setitem with a slice aliasing itself",
        "Add handling for '.' when splitting paths\n\nUnpacking its parts failed with ValueError.",
    ):
        assert looks_like_fix(message), message
    for message in (
        "Add neg()",
        "Release 1.2.0",
        "Revert 'fix add'",
        "Merge branch 'fix-x'",
        "docs: prefix",
        "feat: add neg()\n\nCloses #467",
        "refactor(core): split the parser\n\nRaises ValueError as before; fixes the layering.",
        "perf: faster add()\n\nThe old one was wrong about caching.",
        "chore: bump deps",
        "Add neg() (#123)",
        "Add neg()\n\nCloses #467",
        # issue 37, round 3: housekeeping and static analysis; an exception the subject says the code now raises
        "Solve static analysis errors",
        "Dev chores (#2226)\n\n* Migrate to ruff\n* Minor fixes",
        "Release 2.0 and fix typos",
        "Make iterkeys and viewkeys raise AttributeError",
    ):
        assert not looks_like_fix(message), message


def test_not_a_fix_says_why() -> None:
    assert (
        not_a_fix_reason("feat: add neg()\n\nCloses #467") == "a 'feat' commit whose subject does not say fix"
    )
    assert (
        not_a_fix_reason("Add neg()\n\nCloses #467")
        == "no fix word in the message, and the subject says 'Add'"
    )
    assert not_a_fix_reason("Tidy neg()\n\nCloses #467") == (
        "no fix word in the message, and the subject says 'Tidy'"
    )
    assert not_a_fix_reason("Neg for floats\n\nCloses #467") == (
        "only an issue reference, no fix keyword (fix, bug, error, crash, ...)"
    )
    assert not_a_fix_reason("Release 1.2") == "the subject starts with 'release'"


def test_screen_gives_each_commit_its_reason(tmp_path: Path) -> None:
    shas = build_history(tmp_path / "repo")
    screened = {c.sha: screen(c) for c in scan_history(tmp_path / "repo")}
    assert len(screened) == len(shas) + 1  # plus the initial commit
    reason = {role: getattr(screened[sha], "reason", None) for role, sha in shas.items()}
    assert reason["tests_only"] == RejectReason.NO_SOURCE_CHANGE
    assert reason["code_only"] == RejectReason.NO_TEST_CHANGE
    assert reason["not_a_fix"] == RejectReason.NOT_A_FIX
    for role in ("fix", "already_passing", "flaky", "fails_at_fix", "kept_with_flaky"):
        assert reason[role] is None, role  # these need the sandbox to decide
    fix = screened[shas["fix"]]
    assert isinstance(fix, Screened)
    assert fix.runnable_tests == ["tests/test_calc.py"] and fix.source_files == ["calc.py"]


def test_the_test_runners_configuration_a_fix_changes_goes_with_its_tests(tmp_path: Path) -> None:
    """What the grader protects (tox.ini whole; the pytest section of setup.cfg or pyproject.toml) goes into the
    test patch, not the fix's own patch: a fix patch that touches it is not resolved by its own commit (schema's
    2018 fix changed tox.ini). A change to other sections of setup.cfg stays in the fix."""
    repo = make_repo(tmp_path / "repo", {
        "calc.py": CALC, "tests/test_calc.py": TEST_MUL, "tox.ini": "[tox]\nenvlist = py38\n",
        "setup.cfg": "[metadata]\nname = calc\n\n[tool:pytest]\ntestpaths = tests\n", "pyproject.toml": PYPROJECT,
    })  # fmt: skip
    write_files(repo, {
        "calc.py": CALC.replace("a - b", "a + b"), "tox.ini": "[tox]\nenvlist = py38,py39\n",
        "setup.cfg": "[metadata]\nname = calc2\n\n[tool:pytest]\ntestpaths = tests\n",
        "tests/test_calc.py": TEST_MUL + "\n\ndef test_add():\n    from calc import add\n\n    assert add(2, 3) == 5\n",
    })  # fmt: skip
    sha = commit_all(repo, "Fix add() returning the difference")
    screened = screen(next(c for c in scan_history(repo) if c.sha == sha))
    assert isinstance(screened, Screened)
    spec = build_task(repo, screened, repo_name=str(repo))
    assert "tox.ini" in spec.test_patch and "tox.ini" not in (spec.patch or "")
    assert "setup.cfg" in (spec.patch or "") and "setup.cfg" not in spec.test_patch, (
        "its runner section is the same"
    )


def test_built_task_starts_at_the_parent_with_the_commits_tests(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shas = build_history(repo)
    commit = next(c for c in scan_history(repo) if c.sha == shas["fix"])
    screened = screen(commit)
    assert isinstance(screened, Screened)
    spec = build_task(repo, screened, repo_name=str(repo))
    assert spec.base_commit == git(repo, "rev-parse", f"{shas['fix']}^")
    assert spec.fix_commit == shas["fix"]
    assert spec.problem_statement == "Fix add() returning the difference"
    assert spec.test_command == "python -m pytest -q tests/test_calc.py"
    assert (
        spec.setup_command == "pip install pytest"
    )  # pyproject.toml without [project]: only the test runner
    assert (
        spec.test_patch
        and "+def test_add():" in spec.test_patch
        and "calc.py" not in spec.test_patch.replace("tests/test_calc.py", "")
    )
    # the test patch applies to the parent and yields exactly the commit's test file
    git(repo, "checkout", "-q", spec.base_commit)
    (tmp_path / "p.diff").write_text(spec.test_patch)
    git(repo, "apply", str(tmp_path / "p.diff"))
    assert (repo / "tests/test_calc.py").read_text() == git(
        repo, "show", f"{shas['fix']}:tests/test_calc.py"
    ) + "\n"


def _detected(root: Path, files: dict[str, str], test_files: list[str]) -> tuple[Path, Commands]:
    """A repository of `files` in one commit, and the commands detected for it."""
    repo = make_repo(root, files)
    return repo, detect_commands(repo, git(repo, "rev-parse", "HEAD"), test_files)


def test_detected_commands_for_common_layouts(tmp_path: Path) -> None:
    _, cmds = _detected(tmp_path / "pkg", {
        "pyproject.toml": '[project]\nname = "pkg"\n\n[project.optional-dependencies]\ntests = ["pytest"]\n',
        "src/pkg/__init__.py": "",
        "tests/test_pkg.py": "def test_x():\n    pass\n",
    }, ["tests/test_pkg.py"])  # fmt: skip
    assert cmds.setup == "pip install -e '.[tests]' && pip install pytest"
    assert cmds.test == "python -m pytest -q tests/test_pkg.py"

    _, cmds = _detected(tmp_path / "legacy", {
        "setup.py": "from setuptools import setup\nsetup(name='x')\n",
        "requirements/tests.txt": "pytest\n",
        "tests.py": "def test_x():\n    pass\n",
    }, ["tests.py"])  # fmt: skip
    assert cmds.setup == "pip install -e . && pip install -r requirements/tests.txt && pip install pytest"

    # a requirements.txt that installs the project itself (starlette's `-e .[full]`, whose httpx its test client
    # needs) or pytest is a developer's list; one of the code's own requirements only is not
    _, cmds = _detected(tmp_path / "dev-reqs", {
        "pyproject.toml": '[project]\nname = "s"\n\n[project.optional-dependencies]\nfull = ["httpx"]\n',
        "requirements.txt": "# Optionals\n-e .[full]\n\n# Testing\npytest==8.3.5\npytest-cov\n",
        "tests/test_s.py": "def test_x():\n    pass\n",
    }, ["tests/test_s.py"])  # fmt: skip
    assert cmds.setup == "pip install -e . && pip install -r requirements.txt && pip install pytest"
    assert "test requirements in requirements.txt" in cmds.why
    for runtime in ("requests>=2\nattrs\n", "pytest-cov\n"):
        _, cmds = _detected(tmp_path / f"runtime-reqs-{len(runtime)}", {
            "pyproject.toml": '[project]\nname = "r"\n', "requirements.txt": runtime,
            "tests/test_r.py": "def test_x():\n    pass\n",
        }, ["tests/test_r.py"])  # fmt: skip
        assert cmds.setup == "pip install -e . && pip install pytest"

    # test dependencies in a PEP 735 dependency group, or in tox.ini's [testenv] deps
    _, cmds = _detected(tmp_path / "grouped", {
        "pyproject.toml": '[project]\nname = "g"\n\n[dependency-groups]\ntests = ["pytest>=8", "freezegun"]\n',
        "tests/test_g.py": "def test_x():\n    pass\n",
    }, ["tests/test_g.py"])  # fmt: skip
    assert cmds.setup == "pip install -e . && pip install 'pytest>=8' freezegun"
    # with the extras named as what the changed tests import (cattrs' preconf tests: bson, pyyaml, ...), not those
    # whose requirements they import (pytest, or the project itself)
    _, cmds = _detected(tmp_path / "imports-extras", {
        "pyproject.toml": '[project]\nname = "c"\n\n[project.optional-dependencies]\ntests = ["pytest"]\n'
        'ujson = ["ujson>=5"]\npyyaml = ["PyYAML"]\nbson = ["pymongo"]\ndev = ["pytest", "black"]\ncov = ["c[tests]"]\n',
        "tests/test_c.py": "import pytest\nimport ujson\nfrom c.preconf.pyyaml import make_converter\n\n\n"
        "def test_x():\n    pass\n",
    }, ["tests/test_c.py"])  # fmt: skip
    assert cmds.setup == "pip install -e '.[tests,ujson,pyyaml]' && pip install pytest"
    assert "the changed tests import what the extras ujson, pyyaml install" in cmds.why
    # or in PDM's or Poetry's own tables of development dependencies (cattrs: hypothesis), Poetry's constraints,
    # which pip cannot read, and its path dependencies left out
    _, cmds = _detected(tmp_path / "pdm", {
        "pyproject.toml": '[project]\nname = "d"\n\n[tool.pdm.dev-dependencies]\nlint = ["ruff"]\n'
        'test = ["hypothesis>=6.79.4", "pytest"]\n',
        "tests/test_d.py": "def test_x():\n    pass\n",
    }, ["tests/test_d.py"])  # fmt: skip
    assert cmds.setup == "pip install -e . && pip install 'hypothesis>=6.79.4' pytest"
    assert "the 'test' development dependencies in pyproject.toml" in cmds.why
    _, cmds = _detected(tmp_path / "poetry", {
        "pyproject.toml": '[tool.poetry]\nname = "p"\n\n[tool.poetry.dev-dependencies]\npython = "^3.7"\n'
        'hypothesis = "^6.9.2"\ncoverage = {version = "^5", extras = ["toml"]}\nlocal = {path = "../local"}\n\n'
        '[build-system]\nrequires = ["poetry-core"]\nbuild-backend = "poetry.core.masonry.api"\n',
        "tests/test_p.py": "def test_x():\n    pass\n",
    }, ["tests/test_p.py"])  # fmt: skip
    assert cmds.setup == "pip install -e . && pip install hypothesis 'coverage[toml]' && pip install pytest"
    _, cmds = _detected(tmp_path / "toxed", {
        "setup.py": "from setuptools import setup\nsetup(name='t')\n",
        "tox.ini": "[tox]\nenvlist = py3\n\n[testenv]\ndeps =\n    pytest\n    freezegun\n    py38: mock\n"
        "    -r{toxinidir}/docs.txt\ncommands = pytest\n",
        "tests/test_t.py": "def test_x():\n    pass\n",
    }, ["tests/test_t.py"])  # fmt: skip
    assert cmds.setup == "pip install -e . && pip install pytest freezegun"
    # and what the changed tests import from the project's other lists of development requirements (isort and pdoc
    # keep hypothesis only in a PEP 735 group named `dev`; faker's tox.ini has freezegun, its dev-requirements.txt
    # lint tools): only those, not the rest of such a list, nor what the setup installs already (the project's own
    # requirements, the chosen file's) or the project's own modules
    dev, cmds = _detected(tmp_path / "dev-group", {
        "pyproject.toml": '[project]\nname = "i"\ndependencies = ["attrs"]\n\n[dependency-groups]\n'
        'dev = ["ruff", "hypothesis>=6.1", "attrs>=99", "i-plugin", "mypy"]\n',
        "i/__init__.py": "",
        "i_plugin.py": "",
        "tests/test_i.py": "import attrs\nimport pytest\nimport i_plugin\nfrom hypothesis import given\n\n\n"
        "def test_x():\n    pass\n",
    }, ["tests/test_i.py"])  # fmt: skip
    assert cmds.setup == "pip install -e . && pip install 'hypothesis>=6.1' && pip install pytest"
    assert (
        "pyproject.toml's dependency group 'dev' lists hypothesis>=6.1, which the changed tests import"
        in cmds.why
    )
    write_files(dev, {
        "pyproject.toml": '[project]\nname = "i"\n',
        "dev-requirements.txt": "flake8  # lint\n-r other.txt\npytest>=6\nhypothesis\n",
        "tox.ini": "[testenv]\ndeps =\n    pytest\n    freezegun\n    hypothesis==1.0\n    mypy\n",
        "tests/test_i.py": "import freezegun\nimport hypothesis\nimport mypy_extensions\n\n\ndef test_x():\n    pass\n",
    })  # fmt: skip
    cmds = detect_commands(dev, commit_all(dev, "dev requirements and tox"), ["tests/test_i.py"])
    assert cmds.setup == (
        "pip install -e . && pip install -r dev-requirements.txt && pip install freezegun && pip install pytest"
    )
    assert "tox.ini's [testenv] deps lists freezegun, which the changed tests import" in cmds.why
    # an extra of any name counts as such a list (sqlglot's tests import duckdb, which only its `dev` extra in
    # setup.py installs, with mypy, pandas and pre-commit; another extra of its computes a pin): only what the
    # changed tests import is installed
    write_files(dev, {
        "setup.py": "from setuptools import setup\nversion = '1.0'\nsetup(name='s', extras_require={\n"
        "    'dev': ['duckdb>=0.6', 'mypy; python_version >= \"3.10\"', 'pre-commit'],\n"
        "    'c': [f's-c=={version}'],\n})\n",
        "tests/test_i.py": "import duckdb\n\n\ndef test_x():\n    pass\n",
    })  # fmt: skip
    (dev / "tox.ini").unlink()
    (dev / "dev-requirements.txt").unlink()
    cmds = detect_commands(dev, commit_all(dev, "a dev extra"), ["tests/test_i.py"])
    assert cmds.setup == "pip install -e . && pip install 'duckdb>=0.6' && pip install pytest"
    assert "the extra 'dev' lists duckdb>=0.6, which the changed tests import" in cmds.why
    # or only in setup.py's tests_require (`setup.py test`'s, which pip never installs: python-fire's mock), a
    # literal list or a name bound to one; a computed one is left alone
    tests_require = "from setuptools import setup\nTEST_DEPENDENCIES = ['mock', 'hypothesis>=3']\n"
    required, cmds = _detected(tmp_path / "required", {
        "setup.py": tests_require + "setup(name='r', tests_require=TEST_DEPENDENCIES)\n",
        "r_test.py": "def test_x():\n    pass\n",
    }, ["r_test.py"])  # fmt: skip
    assert cmds.setup == "pip install -e . && pip install mock 'hypothesis>=3' && pip install pytest"
    assert "setup.py's tests_require" in cmds.why
    write_files(
        required, {"setup.py": tests_require + "setup(name='r', tests_require=TEST_DEPENDENCIES[:1])\n"}
    )
    head = commit_all(required, "computed")
    assert detect_commands(required, head, ["r_test.py"]).setup == "pip install -e . && pip install pytest"

    # the test extra named by tox.ini, or only in setup.py's extras_require
    extras, cmds = _detected(tmp_path / "extras", {
        "setup.py": "from setuptools import setup\nEXTRAS = {\n    'tests': ['pytest', 'pytz'],\n}\n"
        "setup(name='e', extras_require=EXTRAS)\n",
        "tests/test_e.py": "def test_x():\n    pass\n",
    }, ["tests/test_e.py"])  # fmt: skip
    assert cmds.setup == "pip install -e '.[tests]' && pip install pytest"
    write_files(extras, {"tox.ini": "[testenv]\nextras = testing\ncommands = pytest\n"})
    head = commit_all(extras, "tox")
    assert (
        detect_commands(extras, head, ["tests/test_e.py"]).setup
        == "pip install -e '.[testing]' && pip install pytest"
    )
    _, cmds = _detected(tmp_path / "extras-set", {
        "setup.py": "from setuptools import setup\nEXTRAS = {'tests_no_zope': ['pytest']}\n"
        "EXTRAS['tests'] = EXTRAS['tests_no_zope'] + ['zope.interface']\nsetup(name='e', extras_require=EXTRAS)\n",
        "tests/test_e.py": "def test_x():\n    pass\n",
    }, ["tests/test_e.py"])  # fmt: skip
    assert cmds.setup == "pip install -e '.[tests]' && pip install pytest"
    # tox's environment substitution, with the extras it installs when the variable is unset (attrs 2021:
    # `{env:TOX_AP_TEST_EXTRAS:tests}`, its setup.py building that extra in code)
    write_files(
        extras, {"tox.ini": "[testenv]\nextras = {env:TEST_EXTRAS:dev}, {env:MORE}\ncommands = pytest\n"}
    )
    head = commit_all(extras, "tox with a substitution")
    assert (
        detect_commands(extras, head, ["tests/test_e.py"]).setup
        == "pip install -e '.[dev]' && pip install pytest"
    )

    # the extras tox installs whatever their names (loguru: extras = dev), and setuptools < 82 for code importing
    # pkg_resources (cerberus); not the requirements files tox's deps name (old pins that today's Python cannot run)
    _, cmds = _detected(tmp_path / "legacy-tox", {
        "setup.py": "from setuptools import setup\nsetup(name='l', extras_require={'dev': ['freezegun']})\n",
        "tox.ini": "[testenv]\nextras = dev\ndeps =\n    -rrequirements.txt\n    -r{toxinidir}/missing.txt\n",
        "requirements.txt": "pytz\n",
        "legacy/__init__.py": "from pkg_resources import get_distribution\n",
        "tests/test_l.py": "def test_x():\n    pass\n",
    }, ["tests/test_l.py"])  # fmt: skip
    assert cmds.setup == ("pip install -e '.[dev]' && pip install 'setuptools<82' && pip install pytest")
    assert "the code imports pkg_resources, which setuptools 82 removed" in cmds.why

    # a conftest.py hook with a py.path argument (boltons 2020-2021), which pytest 9 refuses: pytest < 9
    py_path, cmds = _detected(tmp_path / "py-path", {
        "setup.py": "from setuptools import setup\nsetup(name='p')\n",
        "tests/conftest.py": "def pytest_ignore_collect(path, config):\n    return False\n",
        "tests/test_p.py": "def test_x():\n    pass\n",
    }, ["tests/test_p.py"])  # fmt: skip
    assert cmds.setup == "pip install -e . && pip install 'pytest<9'"
    write_files(
        py_path,
        {"tests/conftest.py": "def pytest_ignore_collect(collection_path, config):\n    return False\n"},
    )
    cmds = detect_commands(py_path, commit_all(py_path, "pathlib hook"), ["tests/test_p.py"])
    assert cmds.setup == "pip install -e . && pip install pytest"

    # test requirements pinning a pytest (and py) that Python 3.11 cannot run (boltons 2020): raised to pytest 7.4-8
    write_files(py_path, {"requirements-test.txt": "coverage==4.5.1\npy<1.6.0\npytest==3.0.7\n"})
    cmds = detect_commands(py_path, commit_all(py_path, "old pins"), ["tests/test_p.py"])
    assert cmds.setup == (
        "pip install -e . && pip install -r requirements-test.txt && pip install 'pytest>=7.4,<9' 'py>=1.11'"
    )
    # pytest plugins pinned beside that pytest are releases made for it (hyperlink 2017: pytest-cov==2.3.0, whose
    # options today's pytest cannot parse): their newest releases are installed with pytest 7.4-8, or the pinned one
    # where none came later (pydocstyle 2016-2019: pytest-pep8==1.0.6, its last release; `>1.0.6` found nothing)
    pins = "pytest==2.9.2\npytest-cov==2.3.0\npytest-pep8==1.0.6\npytest-xdist<1.20\ntox==2.6.0\n"
    write_files(py_path, {"requirements-test.txt": pins})
    cmds = detect_commands(py_path, commit_all(py_path, "old plugin pins"), ["tests/test_p.py"])
    assert cmds.setup is not None and cmds.setup.endswith(
        "pip install --upgrade 'pytest>=7.4,<9' 'py>=1.11' 'pytest-cov>=2.3.0' 'pytest-pep8>=1.0.6' 'pytest-xdist>=1.20'"
    )

    # tests using the py library beyond pytest's stand-in for it (six 2013-2019: `import py` and `py.test.raises`):
    # py 1.11, which pytest installed until 7.2; not for `py.test` in a comment or a file that does not import py
    pylib, cmds = _detected(tmp_path / "pylib", {
        "setup.py": "from setuptools import setup\nsetup(name='s')\n",
        "test_s.py": "import py\n\ndef test_x():\n    py.test.raises(ZeroDivisionError, lambda: 1 / 0)\n",
    }, ["test_s.py"])  # fmt: skip
    assert cmds.setup == "pip install -e . && pip install 'py>=1.11' && pip install pytest"
    assert "the code uses the py library (py.test, ...), which pytest installed until 7.2" in cmds.why
    write_files(pylib, {
        "test_s.py": "import py  # its path only\n\ndef test_x(tmpdir):\n    assert py.path.local(tmpdir)\n",
        "conftest.py": "# run with py.test\n",
    })  # fmt: skip
    cmds = detect_commands(pylib, commit_all(pylib, "py.path only"), ["test_s.py"])
    assert cmds.setup == "pip install -e . && pip install pytest"
    write_files(pylib, {"conftest.py": "import py.code\n"})  # pytest-mock 2015-2020
    cmds = detect_commands(pylib, commit_all(pylib, "py.code"), ["test_s.py"])
    assert cmds.setup == "pip install -e . && pip install 'py>=1.11' && pip install pytest"

    # the same pin in the test extra the setup installs (markdown-it-py 2020: "testing": ["pytest>=3.6,<4",
    # "pytest-benchmark~=3.2"]): pytest 7.4-8 and a newer plugin; not for a pin that admits pytest 7
    extra_pin, cmds = _detected(tmp_path / "extra-pin", {
        "setup.py": "from setuptools import setup\nsetup(name='m', extras_require={\n"
                    "    'testing': ['coverage', 'pytest>=3.6,<4', 'pytest-benchmark~=3.2'],\n})\n",
        "tests/test_m.py": "def test_x():\n    pass\n",
    }, ["tests/test_m.py"])  # fmt: skip
    assert cmds.setup == (
        "pip install -e '.[testing]' && pip install --upgrade 'pytest>=7.4,<9' 'py>=1.11' 'pytest-benchmark>=3.2'"
    )
    write_files(extra_pin, {"setup.py": "from setuptools import setup\nsetup(name='m', extras_require={\n"
                                        "    'testing': ['pytest>=6.2,<8'],\n})\n"})  # fmt: skip
    cmds = detect_commands(extra_pin, commit_all(extra_pin, "pytest 7"), ["tests/test_m.py"])
    assert cmds.setup == "pip install -e '.[testing]' && pip install pytest"

    # a PyYAML older than 6.0.1 pinned through an included requirements file (deepdiff 2022: requirements-dev.txt
    # -> -r requirements-cli.txt -> pyyaml==5.4.1), whose source does not build with Cython 3: Cython < 3 for builds
    pinned, cmds = _detected(tmp_path / "old-yaml", {
        "setup.py": "from setuptools import setup\nsetup(name='y')\n",
        "requirements-dev.txt": "-r requirements-cli.txt\npytest==8.3.4\n",
        "requirements-cli.txt": "click==8.0.3\npyyaml==5.4.1\n",
        "tests/test_y.py": "def test_x():\n    pass\n",
    }, ["tests/test_y.py"])  # fmt: skip
    assert cmds.setup == (
        f"printf 'cython<3\\n' > {BUILD_CONSTRAINTS} && export UV_BUILD_CONSTRAINT={BUILD_CONSTRAINTS} "
        f"PIP_BUILD_CONSTRAINT={BUILD_CONSTRAINTS} && pip install -e . && pip install -r requirements-dev.txt "
        "&& pip install pytest"
    )
    write_files(pinned, {"requirements-cli.txt": "click==8.0.3\npyyaml==6.0.1\n"})
    cmds = detect_commands(pinned, commit_all(pinned, "wheels"), ["tests/test_y.py"])
    assert cmds.setup == "pip install -e . && pip install -r requirements-dev.txt && pip install pytest"
    write_files(
        pinned,
        {"setup.py": "from setuptools import setup\nsetup(name='y', install_requires=['PyYAML<=6.0'])\n"},
    )
    cmds = detect_commands(pinned, commit_all(pinned, "metadata pin"), ["tests/test_y.py"])
    assert cmds.setup is not None and cmds.setup.startswith("printf 'cython<3")
    # a build constraint learnt from a failed setup (setuptools < 58 for a package asking for 2to3) joins the file
    # the setup writes already, or comes with its own
    both = constrain_builds(cmds.setup, "setuptools<58")
    assert both == cmds.setup.replace("printf 'cython<3\\n'", "printf 'cython<3\\nsetuptools<58\\n'", 1)
    assert constrain_builds("pip install -e .", "setuptools<58") == (
        f"printf 'setuptools<58\\n' > {BUILD_CONSTRAINTS} && export UV_BUILD_CONSTRAINT={BUILD_CONSTRAINTS} "
        f"PIP_BUILD_CONSTRAINT={BUILD_CONSTRAINTS} && pip install -e ."
    )

    # a setup.py that has setuptools run 2to3 (simpleeval 2013-2018: `use_2to3 = True`; parsimonious:
    # `use_2to3=version_info >= (3,)`), which setuptools 58 removed: setuptools < 58 for builds, and a copy installed
    # (it has no editable install); not for `use_2to3=False`, nor for a src/ layout, whose copy the tests would import
    two_to_3, cmds = _detected(tmp_path / "2to3", {
        "setup.py": "from setuptools import setup\nsetup(name='t', py_modules=['t'], use_2to3 = True)\n",
        "test_t.py": "def test_x():\n    pass\n",
    }, ["test_t.py"])  # fmt: skip
    assert cmds.setup == (
        f"printf 'setuptools<58\\n' > {BUILD_CONSTRAINTS} && export UV_BUILD_CONSTRAINT={BUILD_CONSTRAINTS} "
        f"PIP_BUILD_CONSTRAINT={BUILD_CONSTRAINTS} && pip install . && pip install pytest"
    )
    for setup_py, expected in [
        ("from sys import version_info\nsetup(name='t', use_2to3=version_info >= (3,))\n", "pip install ."),
        ("setup(name='t', use_2to3=False)\n", "pip install -e ."),
        ("setup(name='t', package_dir={'': 'src'}, use_2to3=True)\n", "pip install -e ."),
    ]:
        write_files(two_to_3, {"setup.py": "from setuptools import setup\n" + setup_py})
        cmds = detect_commands(two_to_3, commit_all(two_to_3, setup_py), ["test_t.py"])
        assert cmds.setup is not None and f"{expected} && pip install pytest" in cmds.setup, setup_py


def test_pytest_cov_is_installed_when_the_pytest_configuration_passes_its_options(tmp_path: Path) -> None:
    """arrow's 2020 commits: tox.ini's [pytest] addopts pass --cov options, and pytest-cov came from a requirements
    file tox's deps name (not installed: old pins), so pytest stopped at a usage error ("tests cannot run") for 14
    of its fixes. pytest-cov is installed when the configuration pytest reads (its first file with a pytest
    section) passes them; not for a section pytest does not read."""
    setup_py = "from setuptools import setup\nsetup(name='a')\n"
    repo, cmds = _detected(tmp_path / "arrow", {
        "setup.py": setup_py,
        "tox.ini": "[testenv]\ndeps = -rrequirements.txt\n\n[pytest]\naddopts = -v --cov-branch --cov=arrow\n",
        "tests/test_a.py": "def test_x():\n    pass\n",
    }, ["tests/test_a.py"])  # fmt: skip
    assert cmds.setup == "pip install -e . && pip install pytest-cov && pip install pytest"
    assert "the pytest configuration passes pytest-cov's options (--cov) in addopts" in cmds.why
    # pyproject.toml's list form
    write_files(repo, {"pyproject.toml": '[tool.pytest.ini_options]\naddopts = ["-ra", "--cov", "pkg"]\n'})
    cmds = detect_commands(repo, commit_all(repo, "pyproject"), ["tests/test_a.py"])
    assert cmds.setup == "pip install -e . && pip install pytest-cov && pip install pytest"
    # pytest.ini comes first, and it passes none; a coverage section is not pytest's
    write_files(repo, {"pytest.ini": "[pytest]\naddopts = -ra\n[coverage:run]\nbranch = --cov\n"})
    cmds = detect_commands(repo, commit_all(repo, "pytest.ini"), ["tests/test_a.py"])
    assert cmds.setup == "pip install -e . && pip install pytest"


def _run(tests: dict[str, str] | None, exit_code: int = 1) -> TestRun:
    return TestRun(
        command="pytest", exit_code=exit_code, timed_out=False, log="", duration_s=0.1, tests=tests
    )


def test_only_other_modules_that_stop_pytest_at_collection_are_ignored() -> None:
    """A run that pytest interrupted at collection errors: the modules other than the commit's own are ignored (its
    own failing to import, as a test of a name the fix adds does, is a failing test); a run that ran tests, or ran
    under another runner, ignores nothing."""
    from bugsweep.grading.records import ProbeReport
    from bugsweep.mining.validation import uncollectable
    from bugsweep.spec import TaskSpec

    log = "ERROR tests/test_old.py\n!!!!!!!!!!!!!!!!!!!! Interrupted: 2 errors during collection !!!!!!!!!!!!!!!!!!!!\n"
    spec = TaskSpec(repo=".", problem_statement="x", test_command="python -m pytest -q",
                    test_patch="diff --git a/tests/test_new.py b/tests/test_new.py\n")  # fmt: skip
    errors = {"tests/test_old.py::tests.test_old": "error", "tests/test_new.py::tests.test_new": "error"}
    interrupted = replace(_run(errors, 2), log=log, probe=ProbeReport(runners=["pytest"]))
    assert uncollectable([interrupted, interrupted], spec) == ["tests/test_old.py"]
    ran = replace(interrupted, tests={**errors, "tests/test_x.py::test_x": "passed"})
    assert uncollectable([interrupted, ran], spec) == []
    assert uncollectable([replace(interrupted, probe=ProbeReport(runners=["unittest"]))], spec) == []

    # where a conftest.py overrides --ignore (boltons 2020), such a module fails in both states: FAIL_TO_FAIL, not
    # the fix's failure; a module of its own that does not import at the fix still is
    old = "tests/test_old.py::tests.test_old"
    before = [_run({old: "error", "tests/test_new.py::test_new": "failed"})] * 2
    after = [_run({old: "error", "tests/test_new.py::test_new": "passed"})] * 2
    v = judge(before, after, unrelated=["tests/test_old.py"])
    assert (v.reason, v.fail_to_pass, v.fail_to_fail) == (None, ["tests/test_new.py::test_new"], [old])
    assert judge(before, after).reason == RejectReason.TESTS_FAIL_AT_FIX


def test_judge_per_test_outcomes() -> None:
    before = [_run({"t::a": "failed", "t::b": "passed"})] * 2
    after = [_run({"t::a": "passed", "t::b": "passed"}, 0)] * 2
    v = judge(before, after)
    assert (v.reason, v.fail_to_pass, v.pass_to_pass, v.flaky) == (None, ["t::a"], ["t::b"], [])

    # a collection error before the fix (the test imports a name that does not exist yet)
    collect_error = [_run({"tests.test_x": "error"}, 2)] * 2
    v = judge(collect_error, [_run({"tests/test_x.py::test_new": "passed"}, 0)] * 2)
    assert v.reason is None and v.fail_to_pass == ["tests/test_x.py::test_new"]

    v = judge([_run({"t::a": "passed"}, 0)], [])
    assert v.reason == RejectReason.TESTS_PASS_AT_PARENT

    # a run cut at the whole-run limit, also when run again without the tests that ran past their own limit (run_tests
    # does), names those tests
    stuck = TestRun(
        command="pytest", exit_code=None, timed_out=True, log="", duration_s=900.0,
        tests_timed_out=["tests/test_c.py::test_repr[<object object at 0x7f3a1c2b5e90>]"],
    )  # fmt: skip
    v = judge([stuck], [])
    assert v.reason == RejectReason.TIMED_OUT
    assert "ran past the per-test time limit: tests/test_c.py::test_repr[<object object at 0x…>])" in v.detail
    assert judge([_run(None, 0), replace(stuck, tests_timed_out=[])], []).detail == "a test run timed out"

    v = judge([_run({"t::a": "failed"}), _run({"t::a": "passed"}, 0)], [])
    assert v.reason == RejectReason.FLAKY and v.flaky == ["t::a"]

    v = judge(before, [_run({"t::a": "passed", "t::b": "failed"})] * 2)
    assert v.reason == RejectReason.TESTS_FAIL_AT_FIX and "t::b" in v.detail

    # flaky at the fix only: dropped, and the task is kept on its stable test
    before3 = [_run({"t::a": "failed", "t::c": "failed"})] * 2
    after3 = [_run({"t::a": "passed", "t::c": "passed"}, 0), _run({"t::a": "passed", "t::c": "failed"})]
    v = judge(before3, after3)
    assert v.reason is None and v.fail_to_pass == ["t::a"] and v.flaky == ["t::c"]

    # the run at the task state was killed before pytest wrote its results (an endless generator at the memory
    # limit): nothing can be named FAIL_TO_PASS, so no task, whatever the exit codes say
    v = judge([_run(None, 137)], [_run({"t::a": "passed"}, 0)])
    assert v.reason == RejectReason.NO_TEST_RESULTS and "killed (exit 137" in v.detail
    from bugsweep.grading.records import ProbeReport

    killed = replace(_run(None, 137), probe=ProbeReport(runners=["unittest"]))
    assert "before unittest wrote its results" in judge([killed], [_run({"t.T.a": "passed"}, 0)]).detail

    # without per-test results (not pytest), exit codes decide
    assert judge([_run(None)], [_run(None, 0)]).reason is None
    assert judge([_run(None)], [_run(None, 1)]).reason == RejectReason.TESTS_FAIL_AT_FIX


def test_tests_failing_in_both_states_are_left_out_and_deselected(tmp_path: Path) -> None:
    """An unrelated test failing at the task state and at the fix is not the candidate's fault (issue 37): it is
    FAIL_TO_FAIL, in neither list, deselected; a test the fix broke still rejects it."""
    before = [_run({"t.py::a": "failed", "t.py::b": "passed", "t.py::old": "failed"})] * 2
    after = [_run({"t.py::a": "passed", "t.py::b": "passed", "t.py::old": "failed"})] * 2
    v = judge(before, after)
    assert (v.reason, v.fail_to_pass, v.pass_to_pass) == (None, ["t.py::a"], ["t.py::b"])
    assert v.fail_to_fail == ["t.py::old"] and v.deselect == ["t.py::old"]
    # pytest deselects by prefix: `t.py::old` also leaves out `t.py::old_style`, so no list names it (cerberus 2019)
    before2 = [_run({"t.py::a": "failed", "t.py::old": "failed", "t.py::old_style": "passed"})] * 2
    after2 = [_run({"t.py::a": "passed", "t.py::old": "failed", "t.py::old_style": "passed"})] * 2
    v = judge(before2, after2)
    assert (v.reason, v.fail_to_pass, v.pass_to_pass) == (None, ["t.py::a"], [])
    assert v.deselect == ["t.py::old"] and v.also_deselected == ["t.py::old_style"]
    # a changed module that does not import at the task state (it imports what the commit adds): its tests never
    # failed one by one there, and a grader's baseline holds one pseudo-test no fix makes pass (gold runs: cerberus)
    not_imported = [
        _run({"tests/test_x.py::tests.test_x": "failed", "tests/test_y.py::test_b": "failed"})
    ] * 2
    after4 = [_run({"tests/test_x.py::test_a": "passed", "tests/test_y.py::test_b": "passed"})] * 2
    v = judge(not_imported, after4)
    assert v.reason == RejectReason.TESTS_CANNOT_RUN and "tests/test_x.py could not be imported" in v.detail
    # and what pytest said of it, from the run's log (pytest's own report of a module it could not import)
    write_files(tmp_path, {"calc.py": "def add(a, b):\n    return a + b\n",
                           "tests/test_x.py": "from calc import lenient_add\n"})  # fmt: skip
    pytest_said = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "pythonpath=.", "tests/test_x.py"],
        cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    ).stdout  # fmt: skip
    v = judge([replace(r, log=pytest_said) for r in not_imported], after4)
    assert v.detail.endswith("; tests/test_x.py: ImportError: cannot import name 'lenient_add' from 'calc' "
                             f"({tmp_path / 'calc.py'})"), v.detail  # fmt: skip
    # a test function named like its module is no pseudo-test: it is there at the fix (schema's test_schema)
    named_like = [_run({"test_schema.py::test_schema": "failed"})] * 2
    v = judge(named_like, [_run({"test_schema.py::test_schema": "passed"})] * 2)
    assert v.reason is None and v.fail_to_pass == ["test_schema.py::test_schema"]
    # an xfail test that xpassed at the task state and xfails at the fix (bleach 2017): left out, since a grader
    # needs every test that passed before to pass after
    xpassed = [_run({"t.py::a": "failed", "t.py::x": "passed", "t.py::b": "passed"})] * 2
    v = judge(xpassed, [_run({"t.py::a": "passed", "t.py::x": "skipped", "t.py::b": "passed"})] * 2)
    assert (v.reason, v.fail_to_pass, v.pass_to_pass) == (None, ["t.py::a"], ["t.py::b"])
    assert v.skipped_after == ["t.py::x"] and v.deselect == ["t.py::x"]
    before3 = [_run({"t.py::old": "failed", "t.py::old_style": "failed"})] * 2
    v = judge(before3, [_run({"t.py::old": "failed", "t.py::old_style": "passed"})] * 2)
    assert v.reason == RejectReason.TESTS_PASS_AT_PARENT and "t.py::old_style" in v.detail
    broke = [_run({"t.py::a": "passed", "t.py::b": "failed", "t.py::old": "failed"})] * 2
    v = judge(before, broke)
    assert v.reason == RejectReason.TESTS_FAIL_AT_FIX and v.detail == "failing at the fix commit: t.py::b"


def test_ids_that_differ_by_a_memory_address_are_one_test() -> None:
    """pytest's ids of object parameters hold their address, new in every run: the same test, not flaky; named
    in neither list (a grader matches ids exactly), and deselected, where they must be, by what precedes it."""

    def ids(address: str, outcome: str) -> dict[str, str]:
        return {"t.py::test_new": outcome, f"t.py::test_repr[<object object at {address}>]": "passed",
                f"t.py::test_old[<Thing at {address}>]": "failed"}  # fmt: skip

    before = [_run(ids("0x7f3a1c2b5e90", "failed")), _run(ids("0x7f11aa00cc10", "failed"))]
    after = [_run(ids("0x7fee0077ab20", "passed"), 0), _run(ids("0x7f00badc0de0", "passed"), 0)]
    v = judge(before, after)
    assert (v.reason, v.flaky, v.fail_to_pass, v.pass_to_pass) == (None, [], ["t.py::test_new"], [])
    assert v.unnamed == ["t.py::test_repr[<object object at 0x…>]"]
    assert v.fail_to_fail == ["t.py::test_old[<Thing at 0x…>]"]
    assert v.deselect == ["t.py::test_old["]  # every parameter of test_old: one argument, live in any run


def test_deselection_takes_whole_groups_in_one_argument() -> None:
    known = {
        "a.py::T::x",
        "a.py::T::y",
        "a.py::U::x",
        "a.py::f[1]",
        "a.py::f[2]",
        "a.py::g",
        "b.py::h",
        "b.py::k",
    }
    assert deselection({"a.py::T::x", "a.py::T::y", "a.py::f[1]", "a.py::f[2]", "b.py::h", "b.py::k"}, known) == [
        "a.py::T::", "a.py::f[", "b.py::",
    ]  # fmt: skip
    assert deselection({"a.py::T::x", "a.py::g"}, known) == ["a.py::T::x", "a.py::g"]


# -- the whole thing, in the real sandbox ------------------------------------------------------------------------


@needs_bwrap
def test_mine_keeps_real_fixes_and_rejects_the_rest_for_the_right_reason(tmp_path: Path) -> None:
    from bugsweep.sandbox import get_provider

    repo = tmp_path / "repo"
    shas = build_history(repo)
    out = tmp_path / "tasks.jsonl"
    events = []
    # three candidates validated at once: the outcome must be what one at a time gives, in history order
    result = mine(
        str(repo), provider=get_provider("local"), runs=2, out=out, on_progress=events.append, concurrency=3
    )

    reasons = {r.commit: r.reason for r in result.rejected}
    details = {r.commit: r.detail for r in result.rejected}
    assert reasons[shas["tests_only"]] == RejectReason.NO_SOURCE_CHANGE
    assert reasons[shas["code_only"]] == RejectReason.NO_TEST_CHANGE
    assert reasons[shas["not_a_fix"]] == RejectReason.NOT_A_FIX
    assert reasons[shas["already_passing"]] == RejectReason.TESTS_PASS_AT_PARENT
    assert reasons[shas["flaky"]] == RejectReason.FLAKY, details.get(shas["flaky"])
    assert reasons[shas["fails_at_fix"]] == RejectReason.TESTS_FAIL_AT_FIX
    assert "tests/test_half.py::test_half" in details[shas["fails_at_fix"]]

    kept = {t.fix_commit: t for t in result.tasks}
    assert set(kept) == {shas["fix"], shas["kept_with_flaky"]}
    fix = kept[shas["fix"]]
    assert fix.FAIL_TO_PASS == ["tests/test_calc.py::test_add"]
    assert fix.PASS_TO_PASS == ["tests/test_calc.py::test_mul"]
    assert fix.problem_statement == "Fix add() returning the difference"
    sq = kept[shas["kept_with_flaky"]]
    assert sq.FAIL_TO_PASS == ["tests/test_sq.py::test_sq"]
    assert "--deselect tests/test_sq.py::test_sq_flaky" in sq.test_command
    assert result.flaky_tests[shas["kept_with_flaky"]] == ["tests/test_sq.py::test_sq_flaky"]
    assert result.flaky_tests[shas["flaky"]] == ["tests/test_div.py::test_div"]
    assert result.scanned == 9 and result.validated == 5

    # the file a sweep reads back holds the same tasks, newest first
    assert [t.fix_commit for t in load_tasks(out)] == [shas["kept_with_flaky"], shas["fix"]]
    assert {e.kind for e in events} >= {"scan", "validate", "kept", "rejected"}
    assert [r.commit for r in result.rejected] == [
        sha for sha in reversed(list(shas.values())) if sha not in kept
    ] + [git(repo, "rev-list", "--max-parents=0", "HEAD")]


@needs_bwrap
def test_mine_stops_at_the_limit_and_reports_setup_failures(tmp_path: Path) -> None:
    from bugsweep.sandbox import get_provider

    repo = tmp_path / "repo"
    shas = build_history(repo)
    provider = get_provider("local")

    broken = mine(str(repo), provider=provider, runs=1, limit=1, setup_command="exit 3", max_candidates=1)
    assert [r.reason for r in broken.rejected] == [RejectReason.SETUP_FAILED]
    assert broken.tasks == []
    # the installer's own error, with what it points to, not its last line ("╰─> typed-ast": pydocstyle's 2016 setup)
    pip_said = (
        "printf 'Failed to build typed-ast\\nERROR: Failed to build installable wheels for some pyproject.toml "
        "based projects\\n╰─> typed-ast\\n' >&2; exit 1"
    )
    broken = mine(str(repo), provider=provider, runs=1, limit=1, setup_command=pip_said, max_candidates=1)
    (rejected,) = broken.rejected
    assert rejected.detail.startswith(
        "ERROR: Failed to build installable wheels for some pyproject.toml based projects: typed-ast (and on "
    ), rejected.detail

    first = mine(str(repo), provider=provider, runs=2, limit=1)
    assert [t.fix_commit for t in first.tasks] == [shas["kept_with_flaky"]]
    assert first.scanned == 1


def test_rejection_serialises_with_its_reason() -> None:
    r = Rejection(commit="abc", subject="x", reason=RejectReason.FLAKY, detail="flaky: t::a")
    assert json.loads(r.model_dump_json())["reason"] == "flaky"


@needs_bwrap
def test_mine_command_writes_tasks_and_says_why_it_skipped(tmp_path: Path) -> None:
    """`bugsweep mine` as a user runs it: the real command line in a subprocess."""
    import os
    import subprocess
    import sys

    repo = tmp_path / "repo"
    shas = build_history(repo)
    out = tmp_path / "mined.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "bugsweep.cli",
        "mine",
        str(repo),
        "--limit",
        "1",
        "--runs",
        "2",
        "--out",
        str(out),
    ]
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        f"kept     {shas['kept_with_flaky'][:10]} Fix sq() doubling instead of squaring (issue #7)"
        in proc.stdout
    )
    assert "(1 changed test module(s), 2 run(s) per state)" in proc.stdout
    assert "1 flaky left out; screen: the subject says 'Fix'" in proc.stdout  # why the screen took it
    assert "1 task(s) from 1 commits scanned, 1 validated" in proc.stdout
    assert "flaky at" in proc.stdout and "test_sq_flaky" in proc.stdout
    (task,) = load_tasks(out)
    assert task.fix_commit == shas["kept_with_flaky"]
    assert task.instance_id.endswith("-" + shas["kept_with_flaky"][:10])
    report = json.loads((tmp_path / "mined.mining.json").read_text())
    assert report["scanned"] == 1 and report["flaky_tests"]
    assert report["kept"] == [{
        "commit": task.fix_commit, "subject": "Fix sq() doubling instead of squaring (issue #7)", "screen_rule": "fix word in the subject",
        "screen_reason": "the subject says 'Fix'", "test_command": task.test_command,
    }]  # fmt: skip
    assert (task.screen_rule, task.screen_reason) == ("fix word in the subject", "the subject says 'Fix'")

    # nothing to find: exit code 1, and the reasons are still shown
    proc = subprocess.run([*cmd[:-2], "--out", str(tmp_path / "none.jsonl"), "--since", "2099-01-01"],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "0 task(s) from 0 commits scanned" in proc.stdout and (tmp_path / "none.jsonl").read_text() == ""


@needs_bwrap
def test_merged_pull_requests_are_candidates_with_merges(tmp_path: Path) -> None:
    """A pull request whose fix and test are separate commits: no task commit by commit, one task as a merge."""
    from bugsweep.sandbox import get_provider

    repo = make_repo(
        tmp_path / "repo", {"calc.py": CALC, "tests/test_calc.py": TEST_MUL, "pyproject.toml": PYPROJECT}
    )
    git(repo, "checkout", "-q", "-b", "fix-add")
    write_files(repo, {"calc.py": CALC.replace("a - b", "a + b")})
    commit_all(repo, "wip")
    write_files(repo, {"tests/test_calc.py": TEST_MUL.replace("import mul", "import add, mul")
                       + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"})  # fmt: skip
    commit_all(repo, "add a test")
    git(repo, "checkout", "-q", "main")
    git(
        repo,
        "merge",
        "-q",
        "--no-ff",
        "fix-add",
        "-m",
        "Merge pull request #5 from me/fix-add\n\nFix add() returning the difference",
    )
    merge_sha = git(repo, "rev-parse", "HEAD")

    provider = get_provider("local")
    by_commit = mine(str(repo), provider=provider, runs=1)
    assert by_commit.tasks == []
    assert {r.reason for r in by_commit.rejected} >= {
        RejectReason.NO_TEST_CHANGE,
        RejectReason.NO_SOURCE_CHANGE,
    }

    by_pr = mine(str(repo), provider=provider, runs=1, merges=True)
    (task,) = by_pr.tasks
    assert task.fix_commit == merge_sha
    assert task.problem_statement == "Fix add() returning the difference"
    assert task.base_commit == git(repo, "rev-parse", "HEAD^1")
    assert task.FAIL_TO_PASS == ["tests/test_calc.py::test_add"]
    assert "calc.py" not in task.test_patch.replace("tests/test_calc.py", "")


@needs_bwrap
def test_tests_named_like_mkdocs_tests_are_run_by_name(tmp_path: Path) -> None:
    """End to end (real sandbox, real pytest): mkdocs names its unittest modules `*_tests.py` in a tests folder
    (`mkdocs/tests/config/config_tests.py`, found by `unittest discover -p "*tests.py"`), which pytest collects
    when named. A fix changing one is a candidate, and its task runs it; a `*_tests.py` outside a tests folder is
    not taken for a test."""
    from bugsweep.sandbox import get_provider

    unit = "import unittest\n\nfrom calc import {names}\n\n\nclass CalcTests(unittest.TestCase):\n{tests}"
    mul = "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n"
    add = "\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
    repo = make_repo(tmp_path / "repo", {
        "calc.py": CALC, "pyproject.toml": PYPROJECT, "calc_tests.py": "",
        "tests/__init__.py": "", "tests/calc_tests.py": unit.format(names="mul", tests=mul),
    })  # fmt: skip
    write_files(repo, {
        "calc.py": CALC.replace("a - b", "a + b"), "tests/calc_tests.py": unit.format(names="add, mul", tests=mul + add),
    })  # fmt: skip
    fix = commit_all(repo, "Fix add() returning the difference")
    write_files(repo, {"calc.py": CALC.replace("a - b", "a + b") + "\n# sums\n", "calc_tests.py": "X = 1\n"})
    commit_all(repo, "Fix a comment")

    result = mine(str(repo), provider=get_provider("local"), runs=1)
    (task,) = result.tasks
    assert task.fix_commit == fix and task.test_files == ["tests/calc_tests.py"]
    assert task.FAIL_TO_PASS == ["tests/calc_tests.py::CalcTests::test_add"]
    assert task.PASS_TO_PASS == ["tests/calc_tests.py::CalcTests::test_mul"]
    (other,) = [r for r in result.rejected if r.subject == "Fix a comment"]
    assert other.reason == RejectReason.NO_TEST_CHANGE


@needs_bwrap
def test_a_fix_backported_to_a_maintenance_branch_merged_back_is_one_task(tmp_path: Path) -> None:
    """End to end (real git, real sandbox): a fix made on main and cherry-picked onto a maintenance branch that is
    merged back (as astroid's "[Backport maintenance/4.1.x] ..." commits are) is in the history twice. The
    benchmark has it once, as the commit on main's own line; the other is rejected, naming it."""
    from bugsweep.sandbox import get_provider

    repo = make_repo(
        tmp_path / "repo", {"calc.py": CALC, "tests/test_calc.py": TEST_MUL, "pyproject.toml": PYPROJECT}
    )
    git(repo, "branch", "maintenance/1.x")
    write_files(repo, {"README.md": "calc\n"})
    commit_all(repo, "Add a readme")  # main moves on: the backport applies with other context
    original = commit_add_fix(repo)
    git(repo, "checkout", "-q", "maintenance/1.x")
    git(repo, "cherry-pick", "-x", original)
    backport = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "maintenance/1.x", "-m", "Merge branch 'maintenance/1.x'")

    result = mine(str(repo), provider=get_provider("local"), runs=1)
    (task,) = result.tasks
    assert task.fix_commit == original and task.FAIL_TO_PASS == ["tests/test_add.py::test_add"]
    (duplicate,) = [r for r in result.rejected if r.commit == backport]
    assert duplicate.reason == RejectReason.SAME_CHANGE
    assert original[:10] in duplicate.detail and "backport" in duplicate.detail
    assert result.validated == 1  # the copy never reached a sandbox


@needs_bwrap
def test_mine_reads_stubs_leaves_out_tests_failing_in_both_states_and_says_why(tmp_path: Path) -> None:
    """End to end (real sandbox, real pytest, one run per state, the whole suite as the test command): an
    "Issue N: Update ..." fix is kept, with the unrelated test that fails at both states left out and deselected,
    an unrelated module that does not import (which stops pytest before any test runs) ignored,
    the test whose id holds a memory address neither flaky nor named, and the screen's rule and reason in the
    task file and the report; an "Issue N: Add ..." feature that also changes the type stub is rejected unrun."""
    from bugsweep.sandbox import get_provider

    tests = (
        "import pytest\nfrom calc import add, mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n\n\n"
        "def test_unrelated_broken():\n    assert mul(0, 1) == 1, 'broken long ago'\n\n\n"
        "@pytest.mark.parametrize('obj', [object()], ids=repr)\ndef test_any(obj):\n    assert obj is not None\n"
    )
    repo = make_repo(tmp_path / "repo", {
        "calc.py": CALC, "calc.pyi": "def add(a: int, b: int) -> int: ...\n", "tests/test_calc.py": tests,
        "pyproject.toml": PYPROJECT, "tests/test_old.py": "import pprint\n\npprint.gone_since_3_11\n",
    })  # fmt: skip
    write_files(repo, {
        "calc.py": CALC.replace("a - b", "a + b"),
        "tests/test_calc.py": tests + "\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    })  # fmt: skip
    fixed = commit_all(repo, "Issue 12: Update add() to sum")
    write_files(repo, {
        "calc.py": (repo / "calc.py").read_text() + "\n\ndef neg(a):\n    return -a\n",
        "calc.pyi": (repo / "calc.pyi").read_text() + "def neg(a: int) -> int: ...\n",
        "tests/test_neg.py": "from calc import neg\n\n\ndef test_neg():\n    assert neg(2) == -2\n",
    })  # fmt: skip
    feature = commit_all(repo, "Issue 13: Add neg()")

    events: list[MiningEvent] = []
    out = tmp_path / "tasks.jsonl"
    result = mine(
        str(repo), provider=get_provider("local"), runs=1, setup_command="pip install pytest",
        test_command="python -m pytest -q tests", out=out, report=tmp_path / "tasks.mining.json",
        on_progress=events.append,
    )  # fmt: skip
    (task,) = load_tasks(out)
    assert task.fix_commit == fixed
    assert task.FAIL_TO_PASS == ["tests/test_calc.py::test_add"]
    assert task.PASS_TO_PASS == ["tests/test_calc.py::test_mul"]  # not test_any[<object object at 0x...>]
    assert task.FAIL_TO_FAIL == ["tests/test_calc.py::test_unrelated_broken"]
    assert task.test_command == (  # a module that does not import stops pytest before any test: ignored
        "python -m pytest -q tests --ignore=tests/test_old.py --continue-on-collection-errors"
        " --deselect tests/test_calc.py::test_unrelated_broken"
    )
    assert task.screen_rule == "issue reference and a fix-shaped change"
    assert task.screen_reason is not None and task.screen_reason.startswith(
        "the subject opens with an issue reference and the change reads like a fix: it changes existing code (add"
    )
    (rejected,) = [r for r in result.rejected if r.commit == feature]
    assert (rejected.reason, rejected.detail) == (
        RejectReason.NOT_A_FIX,
        "a feature: the subject says 'Add' and the change adds new public names (neg)",
    )
    report = json.loads((tmp_path / "tasks.mining.json").read_text())
    (kept,) = report["kept"]
    assert (kept["commit"], kept["screen_reason"], kept["test_command"]) == (
        fixed,
        task.screen_reason,
        task.test_command,
    )
    assert report["failing_in_both"] == {fixed: ["tests/test_calc.py::test_unrelated_broken"]}
    assert report["flaky_tests"] == {}
    (validate,) = [e for e in events if e.kind == "validate"]
    assert validate.message == "test command 'python -m pytest -q tests', 1 run(s) per state"
    (kept_line,) = [e.message for e in events if e.kind == "kept"]
    assert kept_line == (
        "1 fail->pass, 1 pass->pass, 1 other test module(s) that do not import ignored, 1 failing in both states "
        f"left out, 1 with a memory address in their id not named; screen: {task.screen_reason}"
    )


# -- what is a fix, what went wrong, and stopping --------------------------------------------------------------


def conventional_history(root: Path) -> dict[str, str]:
    """Conventional-commit subjects: features and refactors with tests and an issue reference, and one real fix."""
    repo = make_repo(root, {"calc.py": CALC, "tests/test_calc.py": TEST_MUL, "pyproject.toml": PYPROJECT})
    shas: dict[str, str] = {}
    write_files(repo, {
        "calc.py": (repo / "calc.py").read_text() + "\n\ndef neg(a):\n    return -a\n",
        "tests/test_neg.py": "from calc import neg\n\n\ndef test_neg():\n    assert neg(2) == -2\n",
    })  # fmt: skip
    shas["feat"] = commit_all(repo, "feat: add neg()\n\nRaises no TypeError any more. Closes #467")
    write_files(repo, {
        "calc.py": (repo / "calc.py").read_text().replace("return a * b", "return b * a"),
        "tests/test_mul2.py": "from calc import mul\n\n\ndef test_mul_order():\n    assert mul(3, 2) == 6\n",
    })  # fmt: skip
    shas["refactor"] = commit_all(repo, "refactor(calc): commutative mul\n\nSee #12, the bug report.")
    write_files(repo, {
        "calc.py": (repo / "calc.py").read_text().replace("a - b", "a + b"),
        "tests/test_calc.py": TEST_MUL.replace("import mul", "import add, mul")
        + "\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    })  # fmt: skip
    shas["fix"] = commit_all(repo, "fix: add() returned the difference")
    return shas


@needs_bwrap
def test_conventional_features_are_rejected_and_the_fix_kept(tmp_path: Path) -> None:
    from bugsweep.sandbox import get_provider

    shas = conventional_history(tmp_path / "repo")
    events = []
    result = mine(str(tmp_path / "repo"), provider=get_provider("local"), runs=1, on_progress=events.append)
    assert [t.fix_commit for t in result.tasks] == [shas["fix"]]
    assert result.tasks[0].FAIL_TO_PASS == ["tests/test_calc.py::test_add"]
    why = {r.commit: (r.reason, r.detail) for r in result.rejected}
    assert why[shas["feat"]] == (RejectReason.NOT_A_FIX, "a 'feat' commit whose subject does not say fix")
    assert why[shas["refactor"]] == (
        RejectReason.NOT_A_FIX,
        "a 'refactor' commit whose subject does not say fix",
    )
    assert result.validated == 1  # neither feature reached the sandbox
    # progress counts the commits decided out of the commits in range
    assert result.total == 4 and events[-1].total == 4 and events[-1].done == 4
    assert [e.done for e in events if e.kind in ("kept", "rejected")] == [1, 2, 3, 4]


def _mine_cli(repo: Path, out: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    import sys

    return [sys.executable, "-m", "bugsweep.cli", "mine", str(repo), "--runs", "1", "--out", str(out), *args]


def test_bad_dates_exit_2_naming_the_value(tmp_path: Path) -> None:
    import os
    import subprocess

    repo = make_repo(tmp_path / "repo", {"calc.py": CALC, "tests/test_calc.py": TEST_MUL})
    env = {**os.environ, "COLUMNS": "200"}
    for option, value in (("--since", "last tuesdy"), ("--until", "2024-13-45")):
        proc = subprocess.run(
            _mine_cli(repo, tmp_path / "t.jsonl", option, value), capture_output=True, text=True, env=env
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"{option} {value!r} is not a date" in proc.stderr
        assert "Traceback" not in proc.stderr
    # dates that do parse are taken; nothing in range is exit 1, not an error
    proc = subprocess.run(
        _mine_cli(repo, tmp_path / "t.jsonl", "--since", "2099-01-01", "--until", "3 days ago"),
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 1 and "0 task(s) from 0 commits scanned" in proc.stdout, (
        proc.stdout + proc.stderr
    )


@needs_bwrap
def test_a_missing_test_command_stops_the_run_once(tmp_path: Path) -> None:
    import os
    import subprocess

    repo = tmp_path / "repo"
    build_history(repo)
    out = tmp_path / "t.jsonl"
    env = {**os.environ, "COLUMNS": "200"}
    cmd = _mine_cli(repo, out, "--test-command", "no-such-runner {test_files}", "--concurrency", "2")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("no-such-runner") >= 1 and "its program was not found (exit 127)" in proc.stderr
    assert "tests fail at fix" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    report = json.loads(out.with_name("t.mining.json").read_text())
    assert "no-such-runner" in report["stopped"] and report["unfinished"]
    assert "tests pass at parent" not in json.dumps(report)  # no candidate was judged on the missing command


#: A small sandbox: the per-test memory bound is 3/4 of its 256 MiB.
SMALL = SandboxSettings(memory_mib=256)


def _mine_small(
    repo: Path, report: Path, test_command: str, **options: Any
) -> tuple[TaskSpec, dict[str, Any]]:
    """The one task mined from `repo` in SMALL sandboxes (one run a state), and the mining report."""
    from bugsweep.sandbox import get_provider

    result = mine(
        str(repo), provider=get_provider("local", settings=SMALL), runs=1, test_command=test_command,
        report=report, **options,
    )  # fmt: skip
    (task,) = result.tasks
    return task, json.loads(report.read_text())


#: Text pages padded to their width: at the task state, text that is not a whole number of pages makes the loop step
#: past its end and fill a list with blank pages without end (as boltons' endless generators did), 1000 bytes a page.
PAGES = (
    "def pages(text, width):\n    out, start = [], 0\n    while start {op} len(text):\n"
    "        out.append(text[start:start + width].ljust(width))\n        start += width\n    return out\n"
)


@needs_bwrap
def test_a_test_filling_memory_fails_and_the_run_goes_on(tmp_path: Path) -> None:
    """End to end (real sandbox with a 256 MiB memory limit, real pytest): at the task state the changed test fills
    memory in an endless loop; the probe stops it at the per-test memory bound, so it fails and the other tests still
    run. The fix is kept with that test as FAIL_TO_PASS, and the report names the test that was stopped."""

    tests = "from calc import mul\nfrom pages import pages\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
    repo = make_repo(tmp_path / "repo", {
        "calc.py": CALC, "pages.py": PAGES.format(op="!="), "tests/test_calc.py": tests, "pyproject.toml": PYPROJECT,
    })  # fmt: skip
    write_files(repo, {
        "pages.py": PAGES.format(op="<"),
        "tests/test_calc.py": tests + "\n\ndef test_pages():\n    assert pages('abc', 1000) == ['abc'.ljust(1000)]\n",
    })  # fmt: skip
    sha = commit_all(repo, "Fix pages() looping without end when the text is not whole pages")
    task, report = _mine_small(repo, tmp_path / "tasks.mining.json", "python -m pytest -q tests")
    assert task.FAIL_TO_PASS == ["tests/test_calc.py::test_pages"]
    assert task.PASS_TO_PASS == ["tests/test_calc.py::test_mul"]  # it ran after the stopped test
    assert report["out_of_memory"] == {sha: ["tests/test_calc.py::test_pages"]}


#: Code that retries on any exception, the per-test time limit's included (as a `catch()` that takes BaseException
#: does): at the task state it never gives up, so its test goes on though told to stop at its limit each second.
RETRY = (
    "def retry(fn, tries):\n    while True:\n        try:\n            return fn()\n"
    "        except {caught}:\n            tries -= 1\n"
)
RETRY_FIXED = (
    "def retry(fn, tries):\n    for _ in range(tries - 1):\n        try:\n            return fn()\n"
    "        except Exception:\n            pass\n    return fn()\n"
)
TESTS_DYING = (
    "import os, signal, time\n\nimport pytest\n\nfrom calc import add, mul\nfrom retry import retry\n\n\n"
    "def test_add():\n    if add(2, 3) != 5:\n        held = bytearray(120 << 20)\n        time.sleep(0.5)\n"
    "        os.kill(os.getpid(), signal.SIGKILL)\n\n\n"
    "def test_gives_up():\n    with pytest.raises(ZeroDivisionError):\n        retry(lambda: time.sleep(0.2) or 1 / 0, tries=3)\n\n\n"
    "class Sleeper:\n    def __repr__(self):\n        return retry(lambda: time.sleep(0.2) or 1 / 0, tries=3)\n\n\n"
    "@pytest.fixture\ndef sleeper():\n    return Sleeper()\n\n\n"
    "def test_reported(sleeper):  # its failure's report shows its arguments: repr(sleeper) never returns\n"
    "    assert add(1, 1) == 2\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\n"
)


@needs_bwrap
def test_tests_whose_process_dies_at_the_task_state_fail_and_the_run_goes_on(tmp_path: Path) -> None:
    """End to end (real sandbox with a 256 MiB memory limit, real pytest): at the task state one changed test takes
    half the memory bound and its process is then killed (as the memory limit kills what grows faster than the probe
    reads it), another catches the per-test time limit's exception each time it is told to stop, and a third fails
    and its report never comes (pytest shows the test's arguments: their repr never returns). As pytest-xdist does
    with a crashed worker, each is that test failing: the run goes on without it. The fix is kept with the three in
    FAIL_TO_PASS and the test after them in PASS_TO_PASS, and the report names them."""

    repo = make_repo(tmp_path / "repo", {
        "calc.py": CALC, "retry.py": RETRY.format(caught="BaseException"), "tests/test_calc.py": TEST_MUL,
        "pyproject.toml": PYPROJECT,
    })  # fmt: skip
    write_files(repo, {"calc.py": CALC.replace("a - b", "a + b"), "retry.py": RETRY_FIXED,
                       "tests/test_calc.py": TESTS_DYING})  # fmt: skip
    sha = commit_all(repo, "Fix add() returning the difference, and retry() never giving up")
    task, report = _mine_small(
        repo, tmp_path / "tasks.mining.json", "python -m pytest -q tests", per_test_timeout=2
    )
    dying = [
        "tests/test_calc.py::test_add",
        "tests/test_calc.py::test_gives_up",
        "tests/test_calc.py::test_reported",
    ]
    assert dying == task.FAIL_TO_PASS
    assert task.PASS_TO_PASS == ["tests/test_calc.py::test_mul"]  # it ran after both
    assert report["crashed"] == {sha: dying}


#: At the task state spin() loops without end.
SPIN = "def spin(n):\n    while n:\n        pass\n    return n\n"
TESTS_SPINNING = (
    "from calc import mul\nfrom spin import spin\n\n\n"
    + "".join(
        f"def test_spin_{name}():\n    assert spin({n}) == {n}\n\n\n"
        for n, name in enumerate("abcde", start=1)
    )
    + "def test_mul():\n    assert mul(2, 3) == 6\n"
)


def _spin_fixed(root: Path, tests_at_fix: str) -> tuple[Path, str]:
    """A repository whose spin() loops without end, and the commit (its sha) that fixes it with `tests_at_fix`."""
    tests = "from calc import mul\nfrom spin import spin\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
    repo = make_repo(root, {
        "calc.py": CALC, "spin.py": SPIN, "tests/test_calc.py": tests, "pyproject.toml": PYPROJECT,
    })  # fmt: skip
    write_files(repo, {"spin.py": "def spin(n):\n    return n\n", "tests/test_calc.py": tests_at_fix})
    return repo, commit_all(repo, "Fix spin() looping without end")


@needs_bwrap
def test_a_run_whose_tests_each_run_to_their_limit_goes_on_past_its_timeout(tmp_path: Path) -> None:
    """End to end (real sandbox, real pytest): at the task state five changed tests each loop until the per-test
    limit (2 s), so the whole run reaches its timeout (8 s) before the last ones ran. The tests that ran to their
    limit failed, and the run goes on without them, with a timeout of its own, as it does for a test whose process
    died: the fix is kept with the five in FAIL_TO_PASS and the test after them in PASS_TO_PASS. Before, the
    candidate was rejected ("tests timed out").
    The run's timeout leaves room for pytest's start in the sandbox (seconds under load): a run again in which no
    test reached its limit before the timeout is not run once more (TIMEOUT_ROUNDS), and with a 5 s timeout it once
    was not, under the load of four test processes on two cores."""

    repo, _ = _spin_fixed(tmp_path / "repo", TESTS_SPINNING)
    task, _ = _mine_small(
        repo, tmp_path / "tasks.mining.json", "python -m pytest -q tests", per_test_timeout=2, test_timeout=8
    )
    assert [f"tests/test_calc.py::test_spin_{name}" for name in "abcde"] == task.FAIL_TO_PASS
    assert task.PASS_TO_PASS == ["tests/test_calc.py::test_mul"]


@needs_bwrap
def test_a_test_its_alarm_cannot_stop_is_ended_by_the_watcher_and_the_run_goes_on(tmp_path: Path) -> None:
    """End to end (real sandbox, real pytest): at the task state a changed test ignores SIGALRM and then loops, so the
    per-test limit's alarm never reaches it. The probe's watcher thread ends the process once the test is past its
    limit and as long again, recording a hard stop; the test failed, and the run goes on without it: the fix is kept
    with it in FAIL_TO_PASS, the test after it in PASS_TO_PASS, and the report names it."""

    blocked = (
        "import signal\n\nfrom calc import mul\nfrom spin import spin\n\n\ndef test_blocked():\n"
        "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    assert spin(1) == 1\n\n\n"
        "def test_mul():\n    assert mul(2, 3) == 6\n"
    )
    repo, sha = _spin_fixed(tmp_path / "repo", blocked)
    task, report = _mine_small(
        repo, tmp_path / "tasks.mining.json", "python -m pytest -q tests", per_test_timeout=1
    )
    assert task.FAIL_TO_PASS == ["tests/test_calc.py::test_blocked"]
    assert task.PASS_TO_PASS == ["tests/test_calc.py::test_mul"]
    assert report["crashed"] == {sha: ["tests/test_calc.py::test_blocked"]}


#: unittest's tests, run in name order: at the task state test_add takes memory and its process is then killed.
UNITTEST_DYING = (
    "import os\nimport signal\nimport unittest\n\nfrom calc import add, mul\n\n\nclass T(unittest.TestCase):\n"
    "    def test_add(self):\n        if add(2, 3) != 5:\n            held = bytearray(120 << 20)\n"
    "            os.kill(os.getpid(), signal.SIGKILL)\n        self.assertEqual(add(2, 3), 5)\n\n"
    "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n"
)


@needs_bwrap
def test_a_unittest_test_whose_process_dies_fails_and_the_run_goes_on(tmp_path: Path) -> None:
    """End to end (real sandbox, `python -m unittest`): at the task state a changed test's process is killed while
    it runs. unittest's run goes on without it, as pytest's does: the fix is kept with that test as FAIL_TO_PASS and
    the test after it (never reached in the first run) as PASS_TO_PASS, and the report names it."""

    tests = "import unittest\n\nfrom calc import mul\n\n\nclass T(unittest.TestCase):\n"
    tests += "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n"
    repo = make_repo(
        tmp_path / "repo", {"calc.py": CALC, "tests/__init__.py": "", "tests/test_calc.py": tests}
    )
    write_files(repo, {"calc.py": CALC.replace("a - b", "a + b"), "tests/test_calc.py": UNITTEST_DYING})
    sha = commit_all(repo, "Fix add() returning the difference")
    task, report = _mine_small(repo, tmp_path / "tasks.mining.json", "python -m unittest -v")
    assert (task.FAIL_TO_PASS, task.PASS_TO_PASS) == (
        ["tests.test_calc.T.test_add"],
        ["tests.test_calc.T.test_mul"],
    )
    assert report["crashed"] == {sha: ["tests.test_calc.T.test_add"]}


TEST_ADD = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def commit_add_fix(repo: Path, test: str = TEST_ADD) -> str:
    """Commit the fix of add() (it returned the difference) with its new test module tests/test_add.py: its sha."""
    write_files(repo, {"calc.py": CALC.replace("a - b", "a + b"), "tests/test_add.py": test})
    return commit_all(repo, "Fix add() returning the difference").strip()


@needs_bwrap
def test_a_mark_the_project_never_registered_is_not_an_error_of_its_tests(tmp_path: Path) -> None:
    """End to end (real sandbox, today's pytest): the project makes warnings errors (`filterwarnings = error`, as
    dateutil did in 2018) and marks tests with a mark it never registered, which pytest 4.5 began to warn of, so
    today's pytest stops at collecting the module. That warning is about the pytest mining installed, not the
    commit: its command ignores it, and the fix is kept with the task's command saying so."""
    from bugsweep.sandbox import get_provider

    marked = "import pytest\n\nfrom calc import add\n\n\n@pytest.mark.arith\ndef test_add():\n    assert add(2, 3) == 5\n"
    ini = PYPROJECT + 'filterwarnings = ["error"]\n'
    repo = make_repo(
        tmp_path / "repo", {"calc.py": CALC, "tests/test_calc.py": TEST_MUL, "pyproject.toml": ini}
    )
    commit_add_fix(repo, marked)
    result = mine(str(repo), provider=get_provider("local"), runs=1, setup_command="pip install pytest")
    (task,) = result.tasks
    assert task.FAIL_TO_PASS == ["tests/test_add.py::test_add"]
    assert task.test_command.endswith(" -W ignore::pytest.PytestUnknownMarkWarning")


@needs_bwrap
def test_a_pin_the_package_index_does_not_have_is_relaxed_to_its_nearest_releases(tmp_path: Path) -> None:
    """End to end (real sandbox, the real package index): the test requirements pin a version never published
    (deepdiff's 2025 requirements-dev.txt pinned types-setuptools==75.8.0), or name a stub package every release of
    which was yanked (isort's 2023 types-pkg-resources), so their install fails. The pin is relaxed to the releases
    of its major version from there on, the stub package left out, the fix is kept, and its task's setup does the
    same; a pin with no release of its major version from there on stays a setup failure."""
    from bugsweep.sandbox import get_provider

    repo = make_repo(tmp_path / "repo", {
        "calc.py": CALC, "tests/test_calc.py": TEST_MUL, "pyproject.toml": PYPROJECT,
        "requirements-test.txt": "packaging==24.1.99\ntypes-pkg-resources\n",  # 24.2 is the release after it
    })  # fmt: skip
    fixed = commit_add_fix(repo)
    result = mine(str(repo), provider=get_provider("local"), runs=1, older_python=False)

    (task,) = result.tasks
    assert task.fix_commit == fixed and task.FAIL_TO_PASS == ["tests/test_add.py::test_add"]
    assert task.setup_command is not None
    assert task.setup_command.startswith(
        "printf 'packaging>=24.1.99,<25\\ntypes-pkg-resources ; sys_platform == \"never\"\\n' > "
        "/tmp/bugsweep-overrides.txt && "
    )
    assert task.setup_command.endswith("pip install -r requirements-test.txt && pip install pytest")

    write_files(repo, {"requirements-test.txt": "packaging==99.0.1\n"})
    commit_all(repo, "Pin packaging")
    div_test = "from calc import div\n\n\ndef test_div():\n    assert div(7, 2) == 3\n"
    write_files(
        repo,
        {"calc.py": CALC.replace("a - b", "a + b").replace("a / b", "a // b"), "tests/test_div.py": div_test},
    )
    commit_all(repo, "Fix div() returning a float")
    unmet = git(repo, "rev-parse", "HEAD").strip()
    later = mine(str(repo), provider=get_provider("local"), runs=1, older_python=False, exclude=fixed)
    assert later.tasks == []
    (rejected,) = [r for r in later.rejected if r.commit == unmet]  # "Pin packaging" changes no test
    assert rejected.reason == RejectReason.SETUP_FAILED
    assert "packaging==99.0.1" in rejected.detail


@needs_bwrap
def test_a_plugin_pytest_refuses_to_load_is_disabled_and_the_fix_kept(tmp_path: Path) -> None:
    """End to end (real sandbox, real pytest): the project installs a pytest plugin whose hook pytest refuses
    (pytest-flake8's py.path argument, refused by pytest 9, stopped every run of schedule's 2021-2024 commits before
    their first test). The plugin is disabled (`-p no:NAME`), the fix is kept, and the task's command says so."""
    from bugsweep.sandbox import get_provider

    pyproject = (
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "calc"\nversion = "1.0"\n\n[project.entry-points.pytest11]\ncalcplugin = "calcplugin"\n\n'
        '[tool.setuptools]\npy-modules = ["calc", "calcplugin"]\n\n' + PYPROJECT
    )
    plugin = "def pytest_collect_file(file_path, parent, no_such_argument):\n    return None\n"
    repo = make_repo(tmp_path / "repo", {
        "calc.py": CALC, "calcplugin.py": plugin, "tests/test_calc.py": TEST_MUL, "pyproject.toml": pyproject,
    })  # fmt: skip
    commit_add_fix(repo)
    result = mine(str(repo), provider=get_provider("local"), runs=1, older_python=False)
    (task,) = result.tasks
    assert task.FAIL_TO_PASS == ["tests/test_add.py::test_add"]
    assert task.test_command.endswith(" -p no:calcplugin")


@needs_bwrap
def test_a_pytest_warning_that_stops_pytest_at_its_start_is_not_an_error_of_its_tests(tmp_path: Path) -> None:
    """End to end (real sandbox, real pytest): the project makes warnings errors (`filterwarnings = error`) and its
    conftest.py has a hook taking py.path's `path`, which pytest 8 warns of when it loads the conftest, so every run
    stops before its first test (typeguard's 2022-2025 commits). That warning is about the pytest mining installed:
    the task's command ignores it, and the fix is kept."""
    from bugsweep.sandbox import get_provider

    ini = PYPROJECT + 'filterwarnings = ["error"]\n'
    conftest = "def pytest_ignore_collect(path, config):\n    return None\n"
    repo = make_repo(tmp_path / "repo", {
        "calc.py": CALC, "tests/test_calc.py": TEST_MUL, "pyproject.toml": ini, "tests/conftest.py": conftest,
    })  # fmt: skip
    commit_add_fix(repo)
    result = mine(
        str(repo), provider=get_provider("local"), runs=1, setup_command="pip install 'pytest>=8,<9'"
    )
    (task,) = result.tasks
    assert task.FAIL_TO_PASS == ["tests/test_add.py::test_add"]
    assert task.test_command.endswith(" -W ignore::pytest.PytestRemovedIn9Warning")


@needs_bwrap
def test_a_dependency_built_with_2to3_is_built_with_the_setuptools_that_could(tmp_path: Path) -> None:
    """End to end (real sandbox, real package index): the test requirements name a package whose setup.py asks
    setuptools to run 2to3 (python-nameparser's 2014-2019 dev-requirements.txt pins ipdb==0.9.0; here a package of
    the repository), which every setuptools since 58 refuses ("use_2to3 is invalid"): the setup failed. The setup
    runs again with setuptools < 58 for its builds, the task's setup does the same, and the fix is kept."""
    from bugsweep.sandbox import get_provider

    legacy = "from setuptools import setup\n\nsetup(name='legacy', version='0.9', py_modules=['legacy'], use_2to3=True)\n"
    repo = make_repo(tmp_path / "repo", {
        "calc.py": CALC, "tests/test_calc.py": TEST_MUL, "pyproject.toml": PYPROJECT,
        "vendor/legacy/setup.py": legacy, "vendor/legacy/legacy.py": "VALUE = 1\n",
        "requirements-dev.txt": "./vendor/legacy\npytest\n",
    })  # fmt: skip
    commit_add_fix(repo)
    result = mine(str(repo), provider=get_provider("local"), runs=1, older_python=False)
    (task,) = result.tasks
    assert task.FAIL_TO_PASS == ["tests/test_add.py::test_add"]
    assert task.setup_command is not None
    assert task.setup_command.startswith(f"printf 'setuptools<58\\n' > {BUILD_CONSTRAINTS} && export ")


@needs_bwrap
def test_a_setup_cfg_today_s_pytest_refuses_is_left_unread(tmp_path: Path) -> None:
    """End to end (real sandbox, real pytest): the project configures pytest in a `[pytest]` section of setup.cfg,
    which pytest 4 and later refuse at start-up ("no longer supported, change to [tool:pytest]"), so every run
    stops before its first test (cssselect's 2012-2017 history: all 11 fixes the screen passed, "tests fail at
    fix"). The task's command reads no configuration file, its test ids are the usual ones, and the fix is kept."""
    from bugsweep.sandbox import get_provider

    setup_cfg = "[pytest]\ntestpaths = tests\n"
    repo = make_repo(
        tmp_path / "repo", {"calc.py": CALC, "tests/test_calc.py": TEST_MUL, "setup.cfg": setup_cfg}
    )
    commit_add_fix(repo)
    result = mine(
        str(repo),
        provider=get_provider("local"),
        runs=1,
        older_python=False,
        setup_command="pip install pytest",
    )
    (task,) = result.tasks
    assert task.FAIL_TO_PASS == ["tests/test_add.py::test_add"]
    assert task.test_command.endswith(" -c /dev/null --rootdir .")


@needs_bwrap
def test_tests_written_for_the_py_library_pytest_once_installed_are_run_with_it(tmp_path: Path) -> None:
    """End to end (real sandbox, real package index): the project's tests use `py.test.raises`, from the py library
    that pytest installed until 7.2 (six's 2013-2019 test_six.py). With today's pytest alone every test module
    fails to import ("module 'py' has no attribute 'test'"); the task's setup installs py 1.11, and the fix is kept."""
    from bugsweep.sandbox import get_provider

    raising = (
        "import py\n\nfrom calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
        "    py.test.raises(TypeError, add, 2)\n"
    )
    repo = make_repo(
        tmp_path / "repo", {"calc.py": CALC, "tests/test_calc.py": TEST_MUL, "pyproject.toml": PYPROJECT}
    )
    commit_add_fix(repo, raising)
    result = mine(str(repo), provider=get_provider("local"), runs=1, older_python=False)
    (task,) = result.tasks
    assert task.FAIL_TO_PASS == ["tests/test_add.py::test_add"]
    assert task.setup_command == "pip install 'py>=1.11' && pip install pytest"


@needs_bwrap
def test_a_project_built_with_2to3_is_installed_with_the_setuptools_that_could(tmp_path: Path) -> None:
    """End to end (real sandbox, real package index): the project's setup.py asks setuptools to run 2to3
    (`use_2to3=True`, simpleeval's 2013-2018 commits), which every setuptools since 58 refuses, so the setup of every
    commit failed. The task's setup builds it with setuptools < 58, installs a copy (no editable install there), and
    the tests import the repository's own code: the fix is kept, and graded on the code it changes."""
    from bugsweep.sandbox import get_provider

    setup_py = "from setuptools import setup\n\nsetup(name='calc', version='1.0', py_modules=['calc'], use_2to3=True)\n"
    repo = make_repo(tmp_path / "repo", {"calc.py": CALC, "test_mul.py": TEST_MUL, "setup.py": setup_py})
    write_files(repo, {"calc.py": CALC.replace("a - b", "a + b"), "test_add.py": TEST_ADD})
    commit_all(repo, "Fix add() returning the difference")
    result = mine(str(repo), provider=get_provider("local"), runs=1, older_python=False)
    (task,) = result.tasks
    assert task.FAIL_TO_PASS == ["test_add.py::test_add"]
    assert task.setup_command is not None and "setuptools<58" in task.setup_command


def test_the_python_a_commit_names_decides_whether_an_older_one_is_tried(tmp_path: Path) -> None:
    """The Python versions a commit names (classifiers in setup.py, setup.cfg or pyproject.toml; tox's envlist,
    braces included) and, naming none, its date: a commit that names the running Python, or came after it, gets no
    older interpreter; one that names only older ones gets the newest of this machine's that it names."""
    import sys

    from bugsweep.mining.interpreters import declared_versions, machine_interpreters, older_python

    running = sys.version_info[1]
    repo = make_repo(tmp_path / "repo", {
        "setup.py": "classifiers=['Programming Language :: Python :: 3.6', 'Programming Language :: Python :: 3.7']",
        "tox.ini": "[tox]\nenvlist =\n    py{27,35,38},py3.9\n    flake8\n\n[testenv]\ndeps = pytest\n",
    })  # fmt: skip
    head = git(repo, "rev-parse", "HEAD").strip()
    assert declared_versions(repo, head) == {5, 6, 7, 8, 9}
    assert all(8 <= minor != running for minor in machine_interpreters())
    older = {minor: path for minor, path in machine_interpreters().items() if minor < running}
    fitting = [m for m in older if m <= 9]
    expected = older[max(fitting)] if fitting else older[min(older)] if older else None
    assert older_python(repo, head, "2020-06-01T00:00:00+00:00") == expected
    write_files(
        repo, {"pyproject.toml": f'classifiers = ["Programming Language :: Python :: 3.{running}"]\n'}
    )
    later = commit_all(repo, "names this Python")
    assert older_python(repo, later, "2020-06-01T00:00:00+00:00") is None
    bare = make_repo(tmp_path / "bare", {"calc.py": CALC})
    first = git(bare, "rev-parse", "HEAD").strip()
    assert declared_versions(bare, first) == set()
    assert older_python(bare, first, "2099-01-01T00:00:00+00:00") is None  # after every Python known
    if older:
        assert older_python(bare, first, "2019-01-01T00:00:00+00:00") == older[min(older)]  # before 3.8


def test_a_package_that_requires_a_newer_python_is_tried_on_the_oldest_newer_one_it_allows(
    tmp_path: Path,
) -> None:
    """pint's 2025-2026 commits say `requires-python = ">=3.12"`: their setup fails on 3.11 ("requires a different
    Python"). Such a commit gets the oldest interpreter of this machine, newer than the running one, that its
    package allows (pyproject.toml's requires-python, else setup.cfg's or setup.py's python_requires); a package
    that allows the running Python, or says nothing, gets none."""
    import sys

    from bugsweep.mining.interpreters import machine_interpreters, newer_python, required_python

    running = sys.version_info[1]
    newer = sorted(m for m in machine_interpreters() if m > running)
    repo = make_repo(tmp_path / "repo", {
        "pyproject.toml": f'[project]\nname = "p"\nrequires-python = ">=3.{running + 1}"\n', "calc.py": CALC,
    })  # fmt: skip
    head = git(repo, "rev-parse", "HEAD").strip()
    assert str(required_python(repo, head)) == f">=3.{running + 1}"
    assert newer_python(repo, head) == (machine_interpreters()[newer[0]] if newer else None)
    write_files(repo, {"pyproject.toml": '[project]\nname = "p"\nrequires-python = ">=3.8"\n'})
    assert newer_python(repo, commit_all(repo, "allows this Python")) is None
    write_files(
        repo,
        {"pyproject.toml": '[project]\nname = "p"\n', "setup.cfg": "[options]\npython_requires = >=3.99\n"},
    )
    only_later = commit_all(repo, "setup.cfg asks for a Python no machine has")
    assert str(required_python(repo, only_later)) == ">=3.99" and newer_python(repo, only_later) is None
    write_files(
        repo, {"setup.cfg": "", "setup.py": f"setup(name='p', python_requires='>=3.{running + 1}')\n"}
    )
    in_setup_py = commit_all(repo, "setup.py asks for a newer Python")
    assert newer_python(repo, in_setup_py) == newer_python(repo, head)
    write_files(repo, {"setup.py": "setup(name='p')\n"})
    assert required_python(repo, commit_all(repo, "says nothing")) is None


@needs_bwrap
def test_a_commit_whose_code_the_running_python_cannot_run_is_kept_on_the_older_python_it_names(
    tmp_path: Path,
) -> None:
    """End to end (real sandbox, this machine's interpreters): the project names an older Python only, and its code
    does not run on the running one (it stands in for an API a newer Python removed, as Python 3.10 removed
    collections.MutableMapping). On the running Python the candidate fails (its tests do not import); validated
    again on the older interpreter, it is kept, and its task names that interpreter. Without --older-python the
    same commit is rejected."""
    import sys

    from bugsweep.mining.interpreters import machine_interpreters
    from bugsweep.sandbox import get_provider

    older = {minor: path for minor, path in machine_interpreters().items() if minor < sys.version_info[1]}
    if not older:
        pytest.skip("this machine has no Python older than the one running the tests")
    minor = max(older)
    guard = f"import sys\n\nif sys.version_info[:2] > (3, {minor}):\n    raise ImportError('removed after 3.{minor}')\n\n\n"
    repo = make_repo(tmp_path / "repo", {
        "calc.py": guard + CALC, "tests/test_calc.py": TEST_MUL, "pyproject.toml": PYPROJECT,
        "setup.cfg": f"[metadata]\nclassifiers =\n    Programming Language :: Python :: 3.{minor}\n",
    })  # fmt: skip
    test_add = "\n\ndef test_add():\n    from calc import add\n\n    assert add(2, 3) == 5\n"
    write_files(
        repo, {"calc.py": guard + CALC.replace("a - b", "a + b"), "tests/test_calc.py": TEST_MUL + test_add}
    )
    sha = commit_all(repo, "Fix add() returning the difference")
    provider = get_provider("local")
    report = tmp_path / "tasks.mining.json"
    (task,) = mine(
        str(repo), provider=provider, runs=1, setup_command="pip install pytest", report=report
    ).tasks
    assert task.python == older[minor] and task.FAIL_TO_PASS == ["tests/test_calc.py::test_add"]
    assert json.loads(report.read_text())["older_python"] == {sha: older[minor]}
    assert sys.version_info[1] > minor
    kept = mine(str(repo), provider=provider, runs=1, setup_command="pip install pytest", older_python=False)
    assert kept.tasks == []
    (rejected,) = [r for r in kept.rejected if r.commit == sha]
    assert rejected.reason in (RejectReason.TESTS_CANNOT_RUN, RejectReason.TESTS_FAIL_AT_FIX), rejected


@needs_bwrap
def test_a_commit_that_todays_releases_break_is_kept_with_the_releases_of_its_date(tmp_path: Path) -> None:
    """End to end (real sandbox, the real package index): the code stops importing under a release of a dependency
    made after the commit (it stands in for pint's June 2024 code, which flexparser 0.4 of November 2024 broke at
    import). The test repository's commits are dated 2026-01-01, and pytest 9.1 came out after it. On today's
    releases the candidate fails (its tests do not import); validated again with the releases of its date (the
    only retry: it names no Python, and its date is after every Python's release), it is kept, its task's setup
    installs those releases, and the report names the date."""
    from bugsweep.sandbox import get_provider

    guard = (
        "from importlib.metadata import version\n\nif tuple(map(int, version('pytest').split('.')[:2])) >= (9, 1):\n"
        "    raise ImportError('pytest 9.1 changed what this code uses')\n\n\n"
    )
    repo = make_repo(tmp_path / "repo", {
        "calc.py": guard + CALC, "tests/test_calc.py": TEST_MUL, "pyproject.toml": PYPROJECT,
    })  # fmt: skip
    test_add = "\n\ndef test_add():\n    from calc import add\n\n    assert add(2, 3) == 5\n"
    write_files(
        repo, {"calc.py": guard + CALC.replace("a - b", "a + b"), "tests/test_calc.py": TEST_MUL + test_add}
    )
    sha = commit_all(repo, "Fix add() returning the difference")
    report = tmp_path / "tasks.mining.json"
    setup = "pip install pytest"
    (task,) = mine(
        str(repo), provider=get_provider("local"), runs=1, setup_command=setup, report=report
    ).tasks
    assert task.FAIL_TO_PASS == ["tests/test_calc.py::test_add"] and task.python is None
    assert task.setup_command == f"export UV_EXCLUDE_NEWER=2026-01-01T00:00:00Z && {setup}"
    assert json.loads(report.read_text())["dated"] == {sha: "2026-01-01T00:00:00+00:00"}


@needs_bwrap
def test_a_module_the_tests_import_from_an_extra_of_the_project_is_installed_with_it(tmp_path: Path) -> None:
    """End to end (real sandbox, the real package index): the project's tests import a library that only one of its
    extras installs (construct's `extras` extra: arrow, numpy, lz4), which the setup does not install. Both states
    fail to import the test module ("No module named 'six'"); validated again with that extra installed, the fix is
    kept, its task's setup installs it too, and the report names it."""
    from bugsweep.sandbox import get_provider

    project = (
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "calc"\nversion = "0.1"\n\n[project.optional-dependencies]\nextras = ["six"]\n\n'
        '[tool.setuptools]\npy-modules = ["calc"]\n\n' + PYPROJECT
    )
    tests = "import six\n\n" + TEST_MUL.replace(
        "def test_mul", "def test_mul_on_text():\n    assert six.text_type\n\n\ndef test_mul"
    )
    repo = make_repo(
        tmp_path / "repo", {"calc.py": CALC, "tests/test_calc.py": tests, "pyproject.toml": project}
    )
    test_add = "\n\ndef test_add():\n    from calc import add\n\n    assert add(2, 3) == 5\n"
    write_files(repo, {"calc.py": CALC.replace("a - b", "a + b"), "tests/test_calc.py": tests + test_add})
    sha = commit_all(repo, "Fix add() returning the difference")
    # and a commit whose new test passes at its parent too, once the extra is installed: no task, and it says so
    test_mul = "\n\ndef test_mul_by_zero():\n    from calc import mul\n\n    assert mul(0, 3) == 0\n"
    fixed = CALC.replace("a - b", "a + b")
    write_files(
        repo, {"calc.py": fixed.replace("a * b", "b * a"), "tests/test_calc.py": tests + test_add + test_mul}
    )
    no_fix = commit_all(repo, "Fix mul() of zero")
    report = tmp_path / "tasks.mining.json"
    setup = "pip install pytest"
    result = mine(str(repo), provider=get_provider("local"), runs=1, setup_command=setup, report=report)
    (task,) = result.tasks
    assert task.FAIL_TO_PASS == ["tests/test_calc.py::test_add"]
    assert task.setup_command == f"{setup} && pip install -e '.[extras]'"
    assert json.loads(report.read_text())["extras"] == {sha: ["extras"]}
    (rejected,) = [r for r in result.rejected if r.commit == no_fix]
    assert rejected.reason == RejectReason.TESTS_PASS_AT_PARENT
    assert rejected.detail.startswith(
        "on this Python with the extras extras: every changed test passed at the task state (before that: tests "
        "fail at fix: failing at the fix commit (tests/test_calc.py could not be imported or collected)"
    ), rejected.detail


@needs_bwrap
def test_ctrl_c_writes_the_report_and_judges_nothing_half_way(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import time

    repo = tmp_path / "repo"
    build_history(repo)
    out = tmp_path / "t.jsonl"
    state = tmp_path / "state"
    env = {**os.environ, "COLUMNS": "200", "BUGSWEEP_SANDBOX_STATE_DIR": str(state)}
    # the first candidate is decided quickly; the tests of the others take ten minutes
    cmd = _mine_cli(
        repo,
        out,
        "--test-command",
        "test -e tests/test_sq.py || sleep 600; python -m pytest -q {test_files}",
        "--runs",
        "2",  # the newest fix has a flaky test: two runs keep it, with the flaky test deselected
    )
    # Ctrl-C reaches a command a person runs in the foreground; a test session started in the background (`cmd &`
    # in a script) ignores SIGINT, and its children would inherit that
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert proc.stdout is not None
    lines = []
    try:
        for line in proc.stdout:  # progress comes line by line through a pipe
            lines.append(line)
            if line.lstrip("[0123456789/] ").startswith("validate") and "kept" in "".join(lines):
                break
    finally:
        if "kept" not in "".join(lines):  # never leave the run behind, whatever went wrong
            proc.send_signal(signal.SIGINT)
    assert "kept" in "".join(lines), "".join(lines)
    time.sleep(3)  # the second candidate's sandbox is up and its tests are sleeping
    proc.send_signal(signal.SIGINT)
    try:
        rest, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # say where it hung (the threads' stacks), and leave nothing running
        proc.send_signal(signal.SIGUSR1)  # bugsweep prints its threads' stacks
        time.sleep(2)
        proc.kill()
        rest, stderr = proc.communicate()
        from bugsweep.sandbox.local import LocalProvider

        LocalProvider(
            state_dir=state
        ).reap_stale()  # its sandbox's mounts and loop device, for the next tests
        raise AssertionError("no exit 120 s after Ctrl-C:\n" + "".join(lines) + rest + stderr) from None
    assert proc.returncode == 130, "".join(lines) + rest + stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    report = json.loads(out.with_name("t.mining.json").read_text())
    assert report["stopped"] == "interrupted (Ctrl-C)"
    (unfinished,) = report["unfinished"]
    assert unfinished["commit"] not in {r["commit"] for r in report["rejected"]}  # not judged on a killed run
    (task,) = load_tasks(out)  # what was kept before the Ctrl-C is still there
    assert task.problem_statement == "Fix sq() doubling instead of squaring (issue #7)"
    assert not state.exists() or not any(state.iterdir())  # no sandbox left behind
