"""SWE-bench records in and out: read them as tasks, write mined tasks as them, and write a sweep's predictions.

A SWE-bench record (as published: `princeton-nlp/SWE-bench` and its variants, one JSON object a line) names its
repository as `owner/name`, holds FAIL_TO_PASS and PASS_TO_PASS as JSON strings, and carries no commands: the
official harness keeps those per repository and version. Here they come from a specs file (JSON):

    {"owner/name": {"1.0": {"setup_command": "pip install -e . pytest",
                            "test_command": "python -m pytest -rA {test_files}", "python": "python3.11"},
                    "*": {...}}}     # "*": any version not listed

A record is read as a SWE-bench record when it has no `test_command` (bugsweep's own records always have one):
one field decides, for every line on its own. It becomes a TaskSpec at load (`SweBenchRecords.task`), and nothing
after the load knows where a task came from. docs/tasks-jsonl.md ("SWE-bench records") is the user's side.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from bugsweep.errors import BadTaskFile, ConfigError
from bugsweep.sandbox.sources import is_git_url, redact_url

if TYPE_CHECKING:
    from bugsweep.spec import TaskSpec
    from bugsweep.storage import ArtifactStore

#: Where `owner/name` repositories are cloned from unless told otherwise (as the official harness does).
DEFAULT_REPOS_FROM = "https://github.com"
#: The specs file a task file gets when none is named: `tasks.jsonl` -> `tasks.specs.json`, beside it.
SPECS_SUFFIX = ".specs.json"
#: The file a sweep writes beside its grades, in the official harness's predictions format.
PREDICTIONS_FILE = "predictions.jsonl"
#: The version entry of a specs file that holds for every version not listed.
ANY_VERSION = "*"
#: In a specs file's test_command: the test modules the record's test_patch adds or changes, shell-quoted.
TEST_FILES = "{test_files}"

_SLUG = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_DIFF_HEADER = re.compile(r"^diff --git a/(.+?) b/(.+)$", re.M)
#: The fields a SWE-bench record hands over to its TaskSpec as they are.
_KEPT = ("instance_id", "base_commit", "problem_statement", "test_patch", "patch", "created_at")


class RepoVersion(BaseModel):
    """How to set up and test one version of one repository (an entry of a specs file)."""

    model_config = ConfigDict(extra="forbid")

    setup_command: str | None = None
    """Runs once before the tests, with network access, in the task's own environment (TaskSpec.setup_command)."""
    test_command: str
    """Runs the tests; `{test_files}` is replaced by the test modules the record's test_patch adds or changes."""
    python: str | None = None
    """The interpreter the task's environment is made from (TaskSpec.python)."""


Specs = dict[str, dict[str, RepoVersion]]
_SPECS = TypeAdapter(Specs)


def specs_beside(tasks_location: str) -> str:
    """The specs file that goes with a task file: `dir/tasks.jsonl` -> `dir/tasks.specs.json` (paths or s3://)."""
    head, _, name = tasks_location.rpartition("/")
    stem = name.rsplit(".", 1)[0] if "." in name else name
    return f"{head}/{stem}{SPECS_SUFFIX}" if head else f"{stem}{SPECS_SUFFIX}"


def parse_specs(text: str, source: str) -> Specs:
    """A specs file's entries; a BadTaskFile naming the file and the entry at fault otherwise."""
    try:
        return _SPECS.validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(f"{' '.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors())
        raise BadTaskFile(f"specs {source}: {problems}") from exc


def test_files_of(test_patch: str) -> list[str]:
    """The test modules a diff adds or changes (not those it deletes), in its order: what `{test_files}` means."""
    from bugsweep.mining.files import is_runnable_test  # mining's rule, so mined tasks round-trip

    files = []
    chunks = _DIFF_HEADER.split(test_patch)  # [before, a, b, body, a, b, body, ...]
    for i in range(1, len(chunks) - 2, 3):
        path, body = chunks[i + 1], chunks[i + 2]
        deleted = re.search(r"^deleted file mode", body.split("\n@@", 1)[0], re.M)
        if not deleted and is_runnable_test(path) and path not in files:
            files.append(path)
    return files


def _changed_files(patch: str) -> list[str]:
    return sorted({path for m in _DIFF_HEADER.finditer(patch) for path in m.groups()})


def repo_location(slug: str, repos_from: str) -> str:
    """Where to clone `owner/name` from: `BASE/owner/name` for a URL, or its clone in a local folder
    (`owner__name` or `owner/name`, each also with `.git`: a checkout or a bare mirror)."""
    if is_git_url(repos_from):
        return f"{repos_from.rstrip('/')}/{slug}"
    folder = Path(repos_from).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"no folder {folder} to find {slug} in (--repos-from)")
    owner, name = slug.split("/")
    for candidate in (f"{owner}__{name}", f"{owner}/{name}", f"{owner}__{name}.git", f"{owner}/{name}.git"):
        if (folder / candidate).is_dir():
            return str((folder / candidate).resolve())
    raise ConfigError(f"no clone of {slug} in {folder} (looked for {owner}__{name} and {owner}/{name})")


def _read_local(location: str) -> str:
    path = Path(location).expanduser()
    if not path.is_file():
        raise ConfigError(f"{location} does not exist")
    return path.read_text(encoding="utf-8")


def _test_ids(record: dict[str, Any], name: str, where: str) -> list[str]:
    value = record.get(name, [])
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError:
            raise BadTaskFile(f"{where}: {name}: not a JSON list of test ids") from None
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise BadTaskFile(f"{where}: {name}: not a JSON list of test ids")
    return value


def _version(record: dict[str, Any], where: str) -> str | None:
    version = record.get("version")
    if version is None or isinstance(version, str):
        return version
    if isinstance(version, int) and not isinstance(version, bool):
        return str(version)
    raise BadTaskFile(f'{where}: version: give it as a string ("3.10"), not {json.dumps(version)}')


@dataclass
class SweBenchRecords:
    """How the SWE-bench records of one task file become tasks: the specs file their commands come from, and
    where their repositories are cloned from. The specs file is read when the first record needs it."""

    specs: str | None = None
    """The specs file (a path or s3://); None: none given and none beside the task file."""
    repos_from: str = DEFAULT_REPOS_FROM
    """A base URL (`BASE/owner/name`) or a local folder holding `owner__name` or `owner/name` clones."""
    read: Callable[[str], str] = _read_local
    """Reads the specs file's text (the artifact store's reader for s3://)."""
    find_commit: Callable[[str, str], str] | None = None
    """Resolves (repository, commit) to the commit, raising ConfigError when the repository has none such (a
    cached clone's check, `SourceCache.resolve`): each record's base_commit is checked at load, before any run.
    None: not checked (the run finds out)."""
    _loaded: Specs | None = field(default=None, init=False, repr=False)

    def commands(self, slug: str, version: str | None, where: str) -> RepoVersion:
        if self.specs is None:
            raise BadTaskFile(
                f"{where}: test_command: none, so it is read as a SWE-bench record, and there is no specs file "
                "for its commands (--specs FILE, or TASKS.specs.json beside the task file; docs/tasks-jsonl.md)"
            )
        if self._loaded is None:
            try:
                text = self.read(self.specs)
            except ConfigError as exc:
                raise BadTaskFile(
                    f"{where}: test_command: none, so it is read as a SWE-bench record, and its specs file "
                    f"is missing (--specs FILE): {exc}"
                ) from exc
            self._loaded = parse_specs(text, self.specs)
        versions = self._loaded.get(slug)
        if versions is None:
            known = ", ".join(sorted(self._loaded)) or "none"
            raise BadTaskFile(
                f"{where}: repo: no commands for {slug} in specs {self.specs} (it has: {known})"
            )
        found = versions.get(version or ANY_VERSION) or versions.get(ANY_VERSION)
        if found is None:
            known = ", ".join(sorted(versions))
            raise BadTaskFile(
                f"{where}: version: no test_command for repo {slug} version {version!r} in specs {self.specs} "
                f"(its versions: {known}; {ANY_VERSION!r} holds for any other)"
            )
        return found

    def check_commit(self, repo: str, commit: Any, where: str) -> None:
        """A record's base_commit is what its tests run at: refused at load when it is missing, or (with
        `find_commit`) not in the repository."""
        if not isinstance(commit, str) or not commit.strip():
            raise BadTaskFile(
                f"{where}: base_commit: {'missing' if commit in (None, '') else f'not a commit: {json.dumps(commit)}'}"
                " (a SWE-bench record names the commit its repository is checked out at)"
            )
        if self.find_commit is None:
            return
        try:
            self.find_commit(repo, commit)
        except ConfigError:
            raise BadTaskFile(
                f"{where}: base_commit: {commit} is not a commit of {redact_url(repo)} (checked in a clone of it)"
            ) from None

    def task(self, record: dict[str, Any], where: str) -> dict[str, Any]:
        """The TaskSpec fields of one SWE-bench record (`where`: 'tasks.jsonl:3', for its errors).

        `patch`, the gold patch, is kept like fix_commit (never shown to the model); hints_text,
        environment_setup_commit and any other field are accepted and not used: the setup runs at base_commit.
        """
        slug = record.get("repo")
        if not isinstance(slug, str) or not _SLUG.match(slug):
            raise BadTaskFile(
                f"{where}: repo: {json.dumps(slug)} is not an owner/name slug (a record without test_command is "
                "read as a SWE-bench record)"
            )
        fail_to_pass = _test_ids(record, "FAIL_TO_PASS", where)
        pass_to_pass = _test_ids(record, "PASS_TO_PASS", where)
        commands = self.commands(slug, _version(record, where), where)
        test_patch = record.get("test_patch") or ""
        if not isinstance(test_patch, str):
            raise BadTaskFile(f"{where}: test_patch: not a string")
        test_command = commands.test_command
        if TEST_FILES in test_command:
            files = test_files_of(test_patch)
            if not files:
                raise BadTaskFile(
                    f"{where}: test_patch: adds or changes no test module, for {TEST_FILES} in the test_command "
                    f"of {slug} in specs {self.specs}"
                )
            test_command = test_command.replace(TEST_FILES, " ".join(shlex.quote(f) for f in files))
        try:
            repo = repo_location(slug, self.repos_from)
        except ConfigError as exc:
            raise BadTaskFile(f"{where}: repo: {exc}") from exc
        self.check_commit(repo, record.get("base_commit"), where)
        task = {name: record[name] for name in _KEPT if record.get(name) is not None}
        task.update(
            repo=repo,
            test_command=test_command,
            setup_command=commands.setup_command,
            python=commands.python,
            test_files=_changed_files(test_patch),
            FAIL_TO_PASS=fail_to_pass,
            PASS_TO_PASS=pass_to_pass,
        )
        return task


# -- out: mined tasks as SWE-bench records ------------------------------------------------------------------------


def is_slug(text: str) -> bool:
    """True for `owner/name`."""
    return bool(_SLUG.match(text))


def slug_of(repo: str) -> str:
    """`owner/name` for a repository: a URL's last two path parts, a folder named `owner__name`, else a
    folder's parent and its own name (`.../mirror/owner/name` -> `owner/name`)."""
    parts = [p.removesuffix(".git") for p in re.split(r"[/:]", repo.rstrip("/")) if p]
    if not is_git_url(repo):
        parts = [p.removesuffix(".git") for p in Path(repo).expanduser().resolve().parts if p != "/"]
    if parts and "__" in parts[-1]:
        return parts[-1].replace("__", "/", 1)
    slug = "/".join(parts[-2:]) if len(parts) >= 2 else f"local/{parts[-1] if parts else 'repo'}"
    if not _SLUG.match(slug):
        raise ConfigError(f"cannot make an owner/name from {repo!r}: give one (--slug OWNER/NAME)")
    return slug


def to_records(tasks: Iterable[TaskSpec], slug: str) -> tuple[list[dict[str, Any]], Specs]:
    """SWE-bench records of `tasks` and the specs file that sweeps them back.

    Each distinct (setup command, test command with the test modules as `{test_files}`, interpreter) is one
    version, "0", "1", ... in order of first use: a mined task's test command names its own test modules, and
    deselects its flaky tests, so the commands read back are exactly the task's.
    """
    records: list[dict[str, Any]] = []
    versions: dict[str, RepoVersion] = {}
    for spec in tasks:
        files = " ".join(shlex.quote(f) for f in test_files_of(spec.test_patch or ""))
        template = spec.test_command.replace(files, TEST_FILES, 1) if files else spec.test_command
        entry = RepoVersion(setup_command=spec.setup_command, test_command=template, python=spec.python)
        version = next((v for v, known in versions.items() if known == entry), str(len(versions)))
        versions[version] = entry
        records.append({
            "repo": slug, "instance_id": spec.instance_id, "base_commit": spec.base_commit or "",
            "patch": spec.patch or "", "test_patch": spec.test_patch or "",
            "problem_statement": spec.problem_statement, "hints_text": "", "created_at": spec.created_at or "",
            "version": version, "FAIL_TO_PASS": json.dumps(spec.FAIL_TO_PASS),
            "PASS_TO_PASS": json.dumps(spec.PASS_TO_PASS), "environment_setup_commit": spec.base_commit or "",
            # a mined task's: why the screen took it for a fix (fields SWE-bench readers leave alone)
            **{k: v for k, v in (("screen_rule", spec.screen_rule), ("screen_reason", spec.screen_reason)) if v},
        })  # fmt: skip
    return records, {slug: versions}


def dump_records(tasks: list[TaskSpec], path: str | Path, *, slug: str) -> None:
    """Write `tasks` as SWE-bench records to `path` and their specs beside it (TASKS.specs.json), atomically."""
    path = Path(path)
    records, specs = to_records(tasks, slug)
    specs_text = json.dumps(
        {repo: {v: e.model_dump() for v, e in versions.items()} for repo, versions in specs.items()}, indent=2
    )
    for target, text in (
        (Path(specs_beside(str(path))), specs_text + "\n"),
        (path, "".join(json.dumps(r) + "\n" for r in records)),
    ):
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)


# -- out: a sweep's predictions -----------------------------------------------------------------------------------


def prediction(instance_id: str, model: str, patch: str) -> dict[str, str]:
    """One line of the official harness's predictions file."""
    return {"instance_id": instance_id, "model_name_or_path": model, "model_patch": patch}


def run_patch(store: ArtifactStore, key: str, local_dir: Path | None = None) -> str:
    """A run's patch.diff, exactly: from its run folder on this machine, else from the store; '' when it made none
    (a task that could not run)."""
    if local_dir is not None and (local_dir / "patch.diff").is_file():
        return (local_dir / "patch.diff").read_text(encoding="utf-8")
    try:
        return store.get_bytes(f"{key}/patch.diff").decode("utf-8")
    except FileNotFoundError:
        return ""


def write_predictions(
    store: ArtifactStore,
    prefix: str,
    model: str,
    runs: Iterable[tuple[str, str, Path | None]],
    local_root: Path,
) -> str:
    """`PREFIX/predictions.jsonl` (the sweep's folder), one line per (instance_id, run key, local run folder),
    written in `local_root` and put in the store; returns its URI in the store."""
    text = "".join(
        json.dumps(prediction(task, model, run_patch(store, key, local_dir))) + "\n"
        for task, key, local_dir in runs
    )
    local = local_root / prefix / PREDICTIONS_FILE
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(f".{local.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(local)
    return store.put_bytes(f"{prefix}/{PREDICTIONS_FILE}", text.encode("utf-8"))
