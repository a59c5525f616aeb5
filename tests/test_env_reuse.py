"""Environment reuse across the commits of a repository whose install writes a version file into its tree
(setuptools_scm's `version_file`, hatch-vcs's `version-file`), for real: real git histories, the real build backends
and VCS plugins (setuptools + setuptools_scm, hatchling + hatch-vcs) installed from PyPI by `pip install -e .` through
the sandbox's setup network, as every setup test here does, real bubblewrap and overlayfs, real pytest runs.
Each test keeps its environment layers in its own folder, so "built" and "reused" are observed, not assumed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bugsweep.sandbox.base import Environment, RepoSource
from bugsweep.sandbox.local import LocalProvider
from bugsweep.sandbox.local.layers import version_files
from bugsweep.settings import SandboxSettings
from tests.support.repos import BUGGY_CALC, commit_all, git, make_repo, write_files

SETUP = "pip install -e . pytest"
TEST = "python -m pytest -q -p no:cacheprovider"

SETUPTOOLS_SCM = (
    '[build-system]\nrequires = ["setuptools>=64", "setuptools_scm>=8"]\nbuild-backend = "setuptools.build_meta"\n'
    '[project]\nname = "scmpkg"\ndynamic = ["version"]\ndependencies = []\n'
    '[tool.setuptools_scm]\nversion_file = "src/scmpkg/_version.py"\n'
)
HATCH_VCS = (
    '[build-system]\nrequires = ["hatchling", "hatch-vcs"]\nbuild-backend = "hatchling.build"\n'
    '[project]\nname = "scmpkg"\ndynamic = ["version"]\n'
    '[tool.hatch]\nversion.source = "vcs"\nbuild.hooks.vcs.version-file = "src/scmpkg/_version.py"\n'
)


def _package(answer: int) -> dict[str, str]:
    """The package at one commit: `answer()` tells which commit's code runs; it imports the generated version
    file as humanize does (`from ._version import __version__`), so the file must be there."""
    return {
        "src/scmpkg/__init__.py": f"from scmpkg._version import version\n\n\ndef answer():\n    return {answer}\n",
        "tests/test_answer.py": f"from scmpkg import answer\n\n\ndef test_answer():\n    assert answer() == {answer}\n",
    }


def _scm_repo(path: Path, pyproject: str) -> Path:
    files = {"pyproject.toml": pyproject, ".gitignore": "src/scmpkg/_version.py\n", **_package(1)}
    repo = make_repo(path, files)
    git(repo, "tag", "v1.0")
    return repo


@pytest.fixture
def provider(tmp_path: Path) -> LocalProvider:
    settings = SandboxSettings(env_dir=str(tmp_path / "envs"))
    return LocalProvider(settings, cache_dir=tmp_path / "cache", state_dir=tmp_path / "state")


def _setup_and_test(
    provider: LocalProvider, repo: Path, commit: str, check: str = ""
) -> tuple[Environment, str]:
    """Set up the commit's sandbox, run its tests (they must pass) and `check`; the environment and its output."""
    with provider.create(RepoSource(str(repo), commit)) as sbx:
        result, environment = sbx.setup_environment(SETUP)
        assert result is None or result.ok, result.output[-2000:]
        assert (result is None) == environment.reused and environment.key, "kept as a layer, or reused"
        tests = sbx.exec(TEST, timeout=300)
        assert tests.ok and "1 passed" in tests.output, (commit, tests.output[-2000:])
        return environment, sbx.exec(check).output if check else ""


@pytest.mark.parametrize("backend", ["setuptools_scm", "hatch-vcs"])
def test_commits_with_the_same_dependencies_share_one_environment_and_test_their_own_code(
    provider, tmp_path, backend
):
    """Before: the version file the install wrote (`1.1.dev1+g<sha>` at each commit) bound the layer to its tree,
    so every commit built its own environment. Now the first commit builds it and the next ones reuse it, and
    each commit's tests run that commit's code (the editable install points at the sandbox's tree)."""
    repo = _scm_repo(tmp_path / "repo", SETUPTOOLS_SCM if backend == "setuptools_scm" else HATCH_VCS)
    commits = [git(repo, "rev-parse", "HEAD")]
    for answer in (2, 3):
        write_files(repo, _package(answer))
        commits.append(commit_all(repo, f"answer {answer}"))
    seen = []
    for answer, commit in enumerate(commits, start=1):
        environment, out = _setup_and_test(
            provider, repo, commit, "python -c 'import scmpkg; print(scmpkg.answer(), scmpkg.version)'"
        )
        seen.append((environment.reused, environment.key))
        assert out.split()[0] == str(answer), "the tests import this commit's code"
        assert out.split()[1] == "1.0", "the version of the commit the environment was built at (the tag)"
    assert [reused for reused, _ in seen] == [False, True, True]
    assert len({key for _, key in seen}) == 1
    assert [e["name"] for e in provider.env_cache.layers() if e["kind"] == "setup"] == [seen[0][1]]


def test_a_change_of_dependencies_or_a_tracked_version_file_gets_a_new_environment(provider, tmp_path):
    """Reuse stops where it would be wrong: a commit that adds a dependency gets its own environment (holding the
    dependency), and a commit that tracks the version file itself is not covered by the layer's copy of it."""
    repo = _scm_repo(tmp_path / "repo", SETUPTOOLS_SCM)
    first = git(repo, "rev-parse", "HEAD")
    write_files(
        repo, {"pyproject.toml": SETUPTOOLS_SCM.replace("dependencies = []", 'dependencies = ["iniconfig"]')}
    )
    more_dependencies = commit_all(repo, "depend on iniconfig")
    git(repo, "checkout", "-q", "-b", "tracked", first)
    write_files(repo, {".gitignore": "", "src/scmpkg/_version.py": "version = '7.7'\n"})
    tracked = commit_all(repo, "track the version file")

    built, _ = _setup_and_test(provider, repo, first)
    changed, out = _setup_and_test(
        provider, repo, more_dependencies, "python -c 'import iniconfig; print(1)'"
    )
    assert not changed.reused and changed.key != built.key and out.strip() == "1"
    own, _ = _setup_and_test(provider, repo, tracked)
    assert not own.reused and own.key not in (built.key, changed.key), "the first layer would hide the file"
    again, _ = _setup_and_test(provider, repo, tracked)
    assert again.reused and again.key == own.key, "that commit's own environment is reused in turn"
    assert _setup_and_test(provider, repo, first)[0].key == built.key


def test_bytecode_of_the_tree_stays_in_its_sandbox_and_the_packages_bytecode_goes_with_the_environment(
    provider, tmp_path
):
    """Python trusts a .pyc whose source has the same mtime and size: another commit's checkout with a same-size
    fix could run the old code from it. A setup that imports the repository's modules leaves their bytecode in
    its own sandbox; a sandbox that reuses the environment gets none of it. The installed packages' bytecode is
    made by the setup and goes with the environment (its files never change): a graded run, which writes no
    bytecode, loads pytest from it instead of compiling it again (~0.25 s of CPU a run, bench/README.md)."""
    repo = make_repo(tmp_path / "calc")
    first = git(repo, "rev-parse", "HEAD")
    write_files(repo, {"calc.py": BUGGY_CALC["calc.py"].replace("a - b", "a + b")})
    fixed = commit_all(repo, "the fix")
    setup = "pip install pytest && python -c 'import calc'"
    pyc = "ls __pycache__/calc.*.pyc 2>/dev/null | wc -l"
    with provider.create(RepoSource(str(repo), first)) as sbx:
        result, built = sbx.setup_environment(setup)
        assert result is not None and result.ok and built.key, result and result.output[-2000:]
        assert sbx.exec(pyc).stdout.strip() == "1", "the setup compiled calc.py in this sandbox"
    with provider.create(RepoSource(str(repo), fixed)) as sbx:
        result, reused = sbx.setup_environment(setup)
        assert result is None and reused.reused and reused.key == built.key
        assert sbx.exec(pyc).stdout.strip() == "0", "no bytecode of another commit"
        loads = sbx.exec(
            "PYTHONDONTWRITEBYTECODE=1 python -v -c 'import _pytest.python' 2>&1 | grep _pytest/"
        )
        assert re.search(
            r"^# \S*/_pytest/__pycache__/python\.\S*\.pyc matches \S*/_pytest/python\.py$", loads.stdout, re.M
        ), loads.stdout
        assert sbx.exec("python -m pytest -q -p no:cacheprovider").ok, "the fixed code runs"


def test_version_files_are_read_from_the_build_configuration():
    pyproject = (
        '[tool.setuptools_scm]\nwrite_to = "pkg/_version.py"\nversion_file = "./src/pkg/_v.py"\n'
        '[tool.hatch.build.hooks.vcs]\nversion-file = "src/pkg/__about__.py"\n'
        '[tool.hatch.build.targets.wheel.hooks.vcs]\nversion-file = "src/pkg/_wheel.py"\n'
    )
    assert version_files({"pyproject.toml": pyproject.encode()}) == {
        "pkg/_version.py", "src/pkg/_v.py", "src/pkg/__about__.py", "src/pkg/_wheel.py",
    }  # fmt: skip
    setup_py = b'setup(name="x", use_scm_version={"write_to": "x/version.py", "local_scheme": "dirty-tag"})\n'
    assert version_files({"setup.py": setup_py}) == {"x/version.py"}
    assert version_files({"setup.py": b'setup(write_to="x/version.py")\n'}) == set(), "no setuptools_scm"
    outside = b'[tool.setuptools_scm]\nwrite_to = "../x.py"\nversion_file = "/etc/x.py"\n'
    assert version_files({"pyproject.toml": outside}) == set(), "only paths inside the repository"
    assert version_files({"pyproject.toml": b"[tool.setuptools_scm\n"}) == set(), (
        "a broken file declares none"
    )
