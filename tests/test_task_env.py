"""The task's own environment on the local backend, for real: real bubblewrap and overlayfs, real uv and pip installs,
real interpreters of this machine, real pytest runs. The model, where one is needed, is the scripted server (a
stand-in). Each test keeps its environment layers in its own folder, so "built" and "reused" are observed, not assumed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bugsweep.errors import SandboxError
from bugsweep.pipeline import baseline, prepare, setup, solve_task
from bugsweep.sandbox.base import RepoSource
from bugsweep.sandbox.local import LocalProvider
from bugsweep.sandbox.local.layers import EnvCache, Layer
from bugsweep.settings import AgentSettings, ModelSettings, SandboxSettings
from bugsweep.spec import TaskSpec
from tests.support.repos import BUGGY_CALC, PYTEST_SETUP, commit_all, git, make_repo, make_wheel, write_files
from tests.support.scripted_model import tool_call


@pytest.fixture
def provider(tmp_path: Path) -> LocalProvider:
    settings = SandboxSettings(env_dir=str(tmp_path / "envs"))
    return LocalProvider(settings, cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")


def test_the_task_environment_holds_what_its_setup_installed_and_nothing_of_bugsweep(provider, tmp_path):
    repo = make_repo(tmp_path / "calc")
    (repo / "vendor").mkdir()
    make_wheel(repo / "vendor", "envpkg", "WHERE = 'setup'\n")
    commit_all(repo, "a vendored wheel")
    with provider.create(RepoSource(str(repo))) as sbx:
        for module in ("prefect", "typer", "pydantic", "bugsweep", "pytest"):
            imported = sbx.exec(f"cd /tmp && python -c 'import {module}'")
            assert imported.exit_code == 1 and "ModuleNotFoundError" in imported.stderr, (
                module,
                imported.output,
            )
        assert sbx.exec("command -v python pip").stdout.split() == [
            "/opt/venv/bin/python",
            "/opt/venv/bin/pip",
        ]
        result, environment = sbx.setup_environment("pip install vendor/envpkg-1.0-py3-none-any.whl")
        assert result is not None and result.ok, result and result.output
        assert sbx.exec("cd /tmp && python -c 'import envpkg; print(envpkg.WHERE, envpkg.__file__)'").stdout.split() == [
            "setup", "/opt/venv/lib/python{}.{}/site-packages/envpkg.py".format(*sys.version_info[:2]),
        ]  # fmt: skip
        assert "envpkg==1.0" in environment.packages and environment.python == sys.version.split()[0]
        assert environment.installer == "uv" and not environment.reused
        assert sbx.exec("git status --porcelain").stdout == "", (
            "nothing of the install lands in the repository"
        )


def _other_interpreter() -> str | None:
    """An interpreter of this machine that is not the one running the tests."""
    mine = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    for candidate in (
        "/usr/bin/python3",
        "/usr/local/bin/python3",
        "/usr/bin/python3.12",
        "/usr/bin/python3.11",
    ):
        if os.path.exists(candidate) and os.path.realpath(candidate) != mine:
            return candidate
    return None


def test_a_task_with_another_interpreter_runs_its_tests_on_it(provider, tmp_path):
    other = _other_interpreter()
    if other is None:
        pytest.skip("this machine has only one Python interpreter")
    version = subprocess.run(
        [other, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
    ).stdout.strip()
    spec = TaskSpec(
        repo=str(make_repo(tmp_path / "calc")), problem_statement="x", python=other,
        test_command="python -m pytest -q -p no:cacheprovider", setup_command=PYTEST_SETUP,
    )  # fmt: skip
    prepared = prepare(spec, provider)
    with prepared.sandbox:
        setup(prepared)
        before = baseline(prepared)
        assert prepared.environment is not None and prepared.environment.python == version
        assert f"Python {version}" in prepared.sandbox.exec("python -VV").stdout
        assert before.tests == {
            "tests/test_calc.py::test_add": "failed",
            "tests/test_calc.py::test_mul": "passed",
        }


def test_an_interpreter_that_does_not_exist_is_a_config_error(provider, buggy_repo):
    from bugsweep.errors import ConfigError

    with pytest.raises(ConfigError, match="no such interpreter"):
        provider.create(RepoSource(str(buggy_repo)), python="/usr/bin/python2.2")


SOLVE_STEPS = [
    tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b"),
    tool_call("finish", summary="add() subtracted"),
]


def _solve(provider: LocalProvider, spec: TaskSpec, scripted_model, out: Path):
    server = scripted_model(SOLVE_STEPS)
    model = ModelSettings(base_url=server.base_url, model="scripted", api_key="sk-test")  # type: ignore[arg-type]
    return solve_task(
        spec, provider=provider, model_settings=model, agent_settings=AgentSettings(max_turns=5), out_dir=out
    )


def test_a_second_task_on_the_same_repository_reuses_the_environment_and_still_grades_right(
    provider, tmp_path, scripted_model, caplog
):
    """Two tasks of one repository at two commits with the same dependency files: the first builds the
    environment layer, the second reuses it (no install runs: its setup.log and grade.json say so), and both
    grade resolved. grade.json records the environment; environment.txt lists it."""
    repo = make_repo(tmp_path / "calc")
    first = git(repo, "rev-parse", "HEAD")
    write_files(repo, {"README.md": "calc\n"})
    second = commit_all(repo, "docs")
    caplog.set_level(logging.INFO, logger="bugsweep")
    grades = []
    for n, commit in enumerate((first, second)):
        spec = TaskSpec(
            instance_id=f"calc-{n}", repo=str(repo), base_commit=commit, problem_statement="add() is wrong",
            test_command="python -m pytest -q", setup_command=PYTEST_SETUP,
        )  # fmt: skip
        grades.append(_solve(provider, spec, scripted_model, tmp_path / f"run{n}"))
    assert all(g.resolved for g in grades)
    recorded = [json.loads((tmp_path / f"run{n}" / "grade.json").read_text())["environment"] for n in (0, 1)]
    assert [r["reused"] for r in recorded] == [False, True]
    assert recorded[0]["layer"] == recorded[1]["layer"] and recorded[0]["setup_command"] == PYTEST_SETUP
    assert recorded[0]["packages_sha256"] == recorded[1]["packages_sha256"]
    assert recorded[0]["python"] == sys.version.split()[0] and recorded[0]["installer"] == "uv"
    listed = (tmp_path / "run1" / "environment.txt").read_text()
    assert (
        "pytest==" in listed and hashlib.sha256(listed.encode()).hexdigest() == recorded[1]["packages_sha256"]
    )
    assert "Installed" in (tmp_path / "run0" / "setup.log").read_text()  # uv's report of the install
    assert "not run: reused" in (tmp_path / "run1" / "setup.log").read_text()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("building the task environment" in m for m in messages) == 1
    assert sum("reusing the task environment" in m for m in messages) == 1


def test_a_task_whose_test_patch_deletes_a_file_still_gets_a_reusable_environment(provider, tmp_path):
    """The deletion is the task's own change (it stays in the sandbox's layer), not the setup's."""
    repo = make_repo(tmp_path / "calc", {**BUGGY_CALC, "tests/test_old.py": "def test_old():\n    pass\n"})
    delete = (
        "diff --git a/tests/test_old.py b/tests/test_old.py\ndeleted file mode 100644\n--- a/tests/test_old.py\n"
        "+++ /dev/null\n@@ -1,2 +0,0 @@\n-def test_old():\n-    pass\n"
    )
    spec = TaskSpec(repo=str(repo), problem_statement="x", test_command="python -m pytest -q",
                    setup_command=PYTEST_SETUP, test_patch=delete)  # fmt: skip
    layers = []
    for _ in range(2):
        prepared = prepare(spec, provider)
        with prepared.sandbox:
            setup(prepared)
            assert prepared.environment is not None and prepared.environment.key, "kept as a layer"
            layers.append((prepared.environment.key, prepared.environment.reused))
            assert not prepared.sandbox.files.exists("/workspace/repo/tests/test_old.py")
    assert layers[0][0] == layers[1][0] and [reused for _, reused in layers] == [False, True]


def test_a_changed_dependency_file_makes_a_new_environment(provider, tmp_path):
    repo = make_repo(tmp_path / "calc", {**BUGGY_CALC, "requirements.txt": "pytest\n"})
    keys = []
    for requirement in (None, "pytest\niniconfig\n"):
        if requirement:
            write_files(repo, {"requirements.txt": requirement})
            commit_all(repo, "one more requirement")
        with provider.create(RepoSource(str(repo), "HEAD")) as sbx:
            result, environment = sbx.setup_environment("pip install -r requirements.txt")
            assert result is not None and result.ok and not environment.reused, "a new key: the setup runs"
            keys.append(environment.key)
        with provider.create(RepoSource(str(repo), "HEAD")) as sbx:
            result, environment = sbx.setup_environment("pip install -r requirements.txt")
            assert result is None and environment.reused and environment.key == keys[-1]
    assert keys[0] != keys[1]
    assert len([e for e in provider.env_cache.layers() if e["kind"] == "setup"]) == 2


def test_a_setup_that_copies_the_repository_into_the_environment_is_bound_to_that_tree(provider, tmp_path):
    """`pip install .` (not editable) puts the repository's own code into the venv: reusing that environment at
    another commit would test the old code. Such a layer is only reused for the very same tree."""
    files = {
        **BUGGY_CALC,
        "pyproject.toml": '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "calc"\nversion = "0.1"\n[tool.setuptools]\npy-modules = ["calc"]\n',
    }
    repo = make_repo(tmp_path / "calc", files)
    command = "pip install . pytest"
    with provider.create(RepoSource(str(repo), "HEAD")) as sbx:
        result, built = sbx.setup_environment(command)
        assert result is not None and result.ok, result and result.output
    write_files(repo, {"calc.py": BUGGY_CALC["calc.py"].replace("a - b", "a + b")})
    commit_all(repo, "the fix")
    with provider.create(RepoSource(str(repo), "HEAD")) as sbx:
        result, again = sbx.setup_environment(command)
        assert result is not None and not again.reused, "another tree: the environment is built again"
        tests = sbx.exec("cd /tmp && python -c 'import calc; print(calc.add(2, 3))'")
        assert tests.stdout.strip() == "5", "the installed copy is this commit's code"
    assert built.key != again.key


def test_a_fresh_sandbox_from_a_snapshot_has_the_task_state_and_nothing_the_agent_wrote(provider, buggy_repo):
    """The clean-room contract: snapshot() after setup freezes the repository (.git included) and the task
    environment; create_from() gives a new sandbox on it in which no install runs and nothing of the agent's
    writes exists: not in the repository, not in $HOME, not in /tmp, not in the task environment."""
    with provider.create(RepoSource(str(buggy_repo))) as sbx:
        result, _ = sbx.setup_environment(PYTEST_SETUP)
        assert result is None or result.ok
        head = sbx.exec("git rev-parse HEAD").stdout.strip()
        snapshot = sbx.snapshot()
        layers = sbx.repo_layers()
        assert layers.upper is not None and not any(layers.upper.iterdir()), (
            "a snapshot leaves an empty upper"
        )
        tamper = (
            "sed -i 's/a - b/a + b/' calc.py && git commit -qam agent && echo junk > /tmp/junk && "
            "echo 'import os' > $(echo /opt/venv/lib/python3*/site-packages)/hijack.pth && echo x > ~/.gitconfig"
        )
        assert sbx.exec(tamper).ok
        assert {p.name for p in layers.upper.iterdir()} >= {"calc.py", ".git"}, (
            "the agent's writes, seen from the host"
        )
        with provider.create_from(snapshot) as fresh:
            state = fresh.exec(
                "git rev-parse HEAD; git status --porcelain; cat calc.py; ls -A /tmp; cat ~/.gitconfig;"
                "ls /opt/venv/lib/python3*/site-packages/ | grep -c hijack"
            )
            assert state.stdout.split("\n")[0] == head and "return a - b" in state.stdout
            assert (
                "junk" not in state.stdout
                and "x\n" not in state.stdout
                and state.stdout.rstrip().endswith("0")
            )
            tests = fresh.exec("python -m pytest -q")
            assert tests.exit_code == 1 and "1 failed, 1 passed" in tests.output
        snapshot.release()
    assert not list(provider.state_dir.glob("snap-*")), "a released snapshot is gone once nothing uses it"


@pytest.mark.parametrize("when", ["moving its files", "mounting it again"])
def test_a_sandbox_released_by_another_thread_while_a_snapshot_is_taken_leaves_no_snapshot_behind(
    provider, buggy_repo, monkeypatch, when
):
    """Mining stops on Ctrl-C or SIGTERM by releasing the sandboxes in flight from the main thread, while a
    validation thread may be taking a snapshot of one (seen: a snap-* folder left in the state folder after
    SIGTERM). Whatever step the snapshot was at, nothing of it is left: no folder, no mount."""
    from bugsweep.sandbox.local import taskenv

    with provider.create(RepoSource(str(buggy_repo))) as sbx:
        step = taskenv.move_tree if when == "moving its files" else taskenv._restack

        def released_meanwhile(*args, **kwargs):
            sbx.release()  # as Stopper.stop() does from the main thread
            return step(*args, **kwargs)

        monkeypatch.setattr(taskenv, step.__name__, released_meanwhile)
        with pytest.raises((OSError, SandboxError)):  # SandboxGone, or its files gone under it
            sbx.snapshot()
        assert sbx.released
    left = [p.name for p in provider.state_dir.iterdir() if p.name.startswith(("snap-", "local-"))]
    assert left == [], "no snapshot and no sandbox left in the state folder"
    assert str(provider.state_dir) not in Path("/proc/mounts").read_text()


def test_old_environments_are_evicted_but_never_one_in_use(tmp_path):
    cache = EnvCache(tmp_path / "envs", max_age_days=14, max_bytes=10**9)
    made = []
    for n in range(3):
        staging = cache.staging()
        (staging / "venv").mkdir()
        (staging / "venv" / "blob").write_bytes(b"x" * 100_000)
        made.append(cache.commit(staging, f"k{n}", None, {"kind": "setup"}))
    for old in made[:2]:
        old.release()
        os.utime(old.path / ".used", (1, 1))  # long unused
    held = Layer(made[0].path.with_name("k2"))  # k2 is in use by a sandbox
    cache.max_bytes = 0
    removed = cache.evict()
    assert sorted(removed) == ["k0", "k1"] and (tmp_path / "envs" / "k2").is_dir()
    held.release()
    made[2].release()
    assert cache.evict() == ["k2"]
