"""Fixes as branches: a resolved task's graded change, committed on its base commit and pushed for review.

Made outside every sandbox, from what the grader graded: in a temporary bare repository on this host, the task's
base commit is fetched from its repository, the task's `test_patch` (when it has one) and the run's `patch.diff`
are applied to an index (`git apply --cached`: no work tree, no checkout of the agent's), and the result is
committed with the base commit as its only parent. So the branch is a commit a reviewer can merge: the fix and
the tests that prove it, nothing else. Its message carries the grade's summary (verdict, the tests that fail
before and pass now, model, policy, configuration digest).

The branch is pushed to `push_url`, or to the task's repository when that is a URL, as PREFIX/SWEEP/TASK. A branch
already there is never overwritten: pushing the same change again (a rerun) finds it there and says so; another
commit under that name is an error that names it. Only resolved tasks are pushed (`push_fix` refuses the rest).

The token goes to the git server as an HTTP header made from it (`http.<origin>.extraHeader` through git's
GIT_CONFIG_* environment variables, only for the push URL's server): never on a command line, never in the run
folder, and scrubbed from every message (`scrub`). Only pydantic and the standard library are imported here.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import tempfile
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, SecretStr

from bugsweep.errors import ConfigError, InfraError
from bugsweep.runconfig import DOCUMENTED

if TYPE_CHECKING:
    from bugsweep.grading import Grade
    from bugsweep.spec import TaskSpec

#: Written into the run folder when a branch was asked for: the branch pushed, or why it was not.
BRANCH_FILE = "branch.json"
#: Seconds one fetch or push may take.
GIT_NETWORK_TIMEOUT_S = 900.0
#: The folder of a run that has no sweep (`bugsweep solve`, and solve-bug's default folder).
ADHOC = "adhoc"


class BranchFields(BaseModel):
    """Where fixes go as branches, and as whom: declared once, the fields of the `GitBranches` block and of
    BUGSWEEP_BRANCH_* (bugsweep.settings.BranchSettings). The token is kept apart by each holder (a Secret block, a
    variable)."""

    model_config = DOCUMENTED

    push_url: str | None = Field(default=None, title="Push URL")
    """The git repository branches are pushed to (https://..., ssh://..., git@host:path or a folder); empty: the
    task's own repository when it is a URL (a task on a folder needs one)."""
    prefix: str = Field(default="bugsweep", title="Branch prefix")
    """Branches are named PREFIX/SWEEP/TASK (characters git does not allow in a branch name become '-')."""
    username: str = Field(default="x-access-token", title="User name for the token")
    """Sent with the token over HTTP(S): x-access-token for GitHub, oauth2 for GitLab, your user name elsewhere."""
    author: str = Field(default="bugsweep <bugsweep@localhost>", title="Commit author")
    """Author and committer of the commit, as 'Name <email>'."""


class BranchFailed(InfraError):
    """The branch could not be made or pushed (the git server, the network, a change that does not apply). The
    grade stands: a branch is made from a grade, it never changes one."""


@dataclass
class PushedBranch:
    """A branch on the remote holding a resolved task's fix."""

    branch: str
    commit: str
    base: str
    """The commit it is made on: its only parent."""
    remote: str
    """Where it was pushed (without any user or password the URL held)."""
    test_patch: bool
    """Whether the commit holds the task's test_patch besides the fix."""
    already_there: bool = False
    """The remote had this change under this name already (a rerun): nothing was pushed."""

    def describe(self) -> str:
        there = "already on" if self.already_there else "pushed to"
        return f"branch {self.branch} ({self.commit[:12]} on {self.base[:12]}) {there} {self.remote}"


def push_fix(
    spec: TaskSpec,
    verdict: Grade,
    patch: str,
    *,
    sweep: str,
    settings: BranchFields,
    token: SecretStr | None = None,
) -> PushedBranch:
    """Commit a resolved task's graded change (with its test_patch) on its base commit and push it as a branch.

    Raises ConfigError for what a user must change (no push URL, a folder task with uncommitted changes, a refused
    token, a branch of that name holding another commit) and BranchFailed for the rest; their messages never hold
    the token. Never called for an unresolved task (ValueError).
    """
    if not verdict.resolved:
        raise ValueError(f"{spec.instance_id} is not resolved: no branch is made for it")
    remote = destination(spec, settings)
    name = branch_name(settings.prefix, sweep, spec.instance_id)
    git = Git(remote, settings.username, token)
    with tempfile.TemporaryDirectory(prefix="bugsweep-branch-") as tmp:
        work = Path(tmp) / "repo.git"
        git.run(None, "init", "--quiet", "--bare", str(work))
        base = git.fetch_base(work, spec)
        tree = git.apply(work, base, [("the task's test_patch", spec.test_patch), ("patch.diff", patch)])
        commit = git.commit(work, tree, base, commit_message(spec, verdict, sweep), settings.author)
        already = git.push(work, commit, name)
    return PushedBranch(
        branch=name,
        commit=already or commit,
        base=base,
        remote=redact_url(remote),
        test_patch=bool(spec.test_patch),
        already_there=already is not None,
    )


def push_run_folder(
    out_dir: Path,
    spec: TaskSpec,
    verdict: Grade,
    *,
    sweep: str,
    settings: BranchFields,
    token: SecretStr | None = None,
) -> PushedBranch:
    """`push_fix` for a run folder: its patch.diff (what the grader applied), then branch.json says what was
    pushed, or why not (and the error is raised again)."""
    from bugsweep.errors import BugsweepError

    try:
        try:
            patch = (out_dir / "patch.diff").read_text(encoding="utf-8")
        except OSError as exc:
            raise BranchFailed(f"the run folder {out_dir} has no readable patch.diff ({exc})") from None
        pushed = push_fix(spec, verdict, patch, sweep=sweep, settings=settings, token=token)
    except BugsweepError as exc:
        write_branch_record(out_dir, None, error=f"{type(exc).__name__}: {exc}")
        raise
    write_branch_record(out_dir, pushed)
    return pushed


def destination(spec: TaskSpec, settings: BranchFields) -> str:
    """Where the branch goes: the push URL, else the task's repository when it is a URL."""
    if settings.push_url:
        return settings.push_url
    if is_git_url(spec.repo):
        return spec.repo
    raise ConfigError(
        f"task {spec.instance_id} comes from the folder {spec.repo}, not a git URL: say where its branch goes "
        "(push URL: --push-url, BUGSWEEP_BRANCH_PUSH_URL or the git branches block)"
    )


def branch_name(prefix: str, sweep: str, instance_id: str) -> str:
    """PREFIX/SWEEP/TASK as a valid branch name (`git check-ref-format --branch`): each part keeps letters,
    digits, '.', '_' and '-', anything else becomes '-'."""
    parts = [_ref_part(p) for p in f"{prefix}/{sweep}".split("/")] + [_ref_part(instance_id)]
    name = "/".join(p for p in parts if p)
    checked = subprocess.run(
        ["git", "check-ref-format", "--branch", name], capture_output=True, text=True, check=False
    )
    if checked.returncode != 0 or not name:
        raise ConfigError(
            f"{name!r} (from {prefix!r}, {sweep!r}, {instance_id!r}) is not a valid branch name"
        )
    return checked.stdout.strip()


def _ref_part(text: str) -> str:
    part = re.sub(r"[^A-Za-z0-9._-]+", "-", text)
    part = re.sub(r"\.{2,}", ".", part).strip("-.")
    while part.endswith(".lock"):
        part = part.removesuffix(".lock").rstrip("-.")
    return part


def commit_message(spec: TaskSpec, verdict: Grade, sweep: str) -> str:
    """The subject names the task; the body is the grade's summary, then trailers a script can read."""
    from bugsweep import __version__
    from bugsweep.grading import verdict_word

    problem = next((line.strip() for line in spec.problem_statement.splitlines() if line.strip()), "")
    fixed = verdict.FAIL_TO_PASS
    lines = [
        f"Fix {spec.instance_id}",
        "",
        f"Task: {problem[:300]}",
        "",
        f"Graded {verdict_word(verdict)} by bugsweep {__version__}: the tests failed before this change and pass "
        f"after it, rerun in a fresh sandbox with the test files untouched (evidence: {verdict.evidence or '-'}).",
        f"Tests that failed before and pass now ({len(fixed)}):",
        *(f"  {test}" for test in fixed[:50]),
        *([f"  ... and {len(fixed) - 50} more"] if len(fixed) > 50 else []),
        f"Tests still passing: {len(verdict.PASS_TO_PASS)}",
        "Includes the task's test_patch: " + ("yes" if spec.test_patch else "no (the task has none)"),
        "",
        f"Bugsweep-Verdict: {verdict_word(verdict)}",
        f"Bugsweep-Model: {verdict.model}",
        f"Bugsweep-Policy: {verdict.policy or '-'}",
        f"Bugsweep-Config: {verdict.config_digest or '-'}",
        f"Bugsweep-Sweep: {sweep}",
        f"Bugsweep-Task: {spec.instance_id}",
    ]
    return "\n".join(lines) + "\n"


def write_branch_record(out_dir: Path, pushed: PushedBranch | None, error: str | None = None) -> None:
    """branch.json in the run folder: the branch pushed, or why it was not (never the token)."""
    record = asdict(pushed) if pushed is not None else {"error": error}
    (out_dir / BRANCH_FILE).write_text(json.dumps(record, indent=2), encoding="utf-8")


def read_branch_record(out_dir: Path) -> dict[str, object] | None:
    try:
        record = json.loads((out_dir / BRANCH_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


# -- git on this host -----------------------------------------------------------------------------------------


def is_git_url(repo: str) -> bool:
    from bugsweep.sandbox.sources import is_git_url as source_is_url

    return source_is_url(repo)


def redact_url(url: str) -> str:
    from bugsweep.sandbox.sources import redact_url as redact

    return redact(url)


class Git:
    """Host git for one push: the token as a header for the push URL's server only, in the environment; every
    message scrubbed of it."""

    def __init__(self, remote: str, username: str, token: SecretStr | None) -> None:
        self.remote = remote
        self.secrets = [s for s in self._secrets(remote, username, token) if s]
        self.env = dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C")
        self.env.pop("GIT_DIR", None)
        value = token.get_secret_value() if token is not None else ""
        origin = _origin(remote)
        if value and origin:
            header = base64.b64encode(f"{username}:{value}".encode()).decode()
            count = int(self.env.get("GIT_CONFIG_COUNT", "0") or 0)
            self.env.update({
                "GIT_CONFIG_COUNT": str(count + 1),
                f"GIT_CONFIG_KEY_{count}": f"http.{origin}.extraHeader",
                f"GIT_CONFIG_VALUE_{count}": f"Authorization: Basic {header}",
            })  # fmt: skip

    @staticmethod
    def _secrets(remote: str, username: str, token: SecretStr | None) -> list[str]:
        value = token.get_secret_value() if token is not None else ""
        found = [value, base64.b64encode(f"{username}:{value}".encode()).decode() if value else ""]
        password = urllib.parse.urlsplit(remote).password if "://" in remote else None
        return [*found, password or ""]

    def scrub(self, text: str) -> str:
        text = text.replace(self.remote, redact_url(self.remote))
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def run(
        self, cwd: Path | None, *args: str, stdin: str | None = None, network: bool = False,
        env: dict[str, str] | None = None,
    ) -> str:  # fmt: skip
        try:
            done = subprocess.run(
                ["git", *args], cwd=cwd, env={**self.env, **(env or {})}, input=stdin, capture_output=True, text=True,
                timeout=GIT_NETWORK_TIMEOUT_S if network else 300.0, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise BranchFailed(
                self.scrub(f"git {args[0]} took too long ({args[0]} of {self.remote})")
            ) from None
        if done.returncode != 0:
            raise GitFailed(
                self.scrub((done.stderr or done.stdout).strip()[-800:] or f"exit {done.returncode}")
            )
        return done.stdout.strip()

    def fetch_base(self, work: Path, spec: TaskSpec) -> str:
        """The task's base commit, fetched from its repository into `work`."""
        source, ref = spec.repo, spec.base_commit or "HEAD"
        if not is_git_url(source) and spec.base_commit is None:
            dirty = self._run_or_fail(Path(source), "status", "--porcelain", "--untracked-files=normal")
            if dirty:
                raise ConfigError(
                    f"task {spec.instance_id} ran on the working tree of {source}, which has uncommitted changes: "
                    "there is no commit to put its fix on (give the task a base commit: --ref)"
                )
        try:
            self.run(work, "fetch", "--quiet", "--no-tags", "--end-of-options", source, ref, network=True)
        except GitFailed:  # a server that hands out only what its refs point at: everything, then the name
            self._run_or_fail(
                work, "fetch", "--quiet", "--no-tags", "--end-of-options", source, "+refs/heads/*:refs/source/heads/*",
                "+refs/tags/*:refs/source/tags/*", network=True,
            )  # fmt: skip
            return self._run_or_fail(work, "rev-parse", "--verify", f"{ref}^{{commit}}")
        return self._run_or_fail(work, "rev-parse", "--verify", "FETCH_HEAD^{commit}")

    def apply(self, work: Path, base: str, patches: list[tuple[str, str | None]]) -> str:
        """The tree of `base` with `patches` applied in order (to an index of its own; no work tree)."""
        index = {"GIT_INDEX_FILE": str(work / "bugsweep.index")}
        self._run_or_fail(work, "read-tree", base, env=index)
        for what, text in patches:
            if not text:
                continue
            try:
                self.run(work, "apply", "--cached", "--whitespace=nowarn", "-", stdin=text, env=index)
            except GitFailed as exc:
                raise BranchFailed(f"{what} does not apply at {base[:12]}: {exc}") from None
        return self._run_or_fail(work, "write-tree", env=index)

    def commit(self, work: Path, tree: str, base: str, message: str, author: str) -> str:
        name, email = _person(author)
        env = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
               "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email}  # fmt: skip
        return self._run_or_fail(work, "commit-tree", tree, "-p", base, "-F", "-", stdin=message, env=env)

    def push(self, work: Path, commit: str, name: str) -> str | None:
        """Push `commit` as branch `name`, never over another commit. Returns None when pushed, or the commit
        already there when the remote has the same change (same tree, same parent) under that name."""
        target = f"refs/heads/{name}"
        there = self._remote_commit(target)
        if there is None:
            try:
                self.run(work, "push", "--quiet", "--porcelain", "--end-of-options", self.remote,
                         f"{commit}:{target}", network=True)  # fmt: skip
                return None
            except GitFailed as exc:
                message = str(exc)
                refused = _refused_credentials(message)
                if refused:
                    raise ConfigError(
                        f"{redact_url(self.remote)} refused the push of {name} ({refused}): check the token and "
                        f"the user name it goes with: {message}"
                    ) from None
                there = self._remote_commit(target)  # pushed by another run meanwhile?
                if there is None:
                    raise BranchFailed(
                        f"could not push {name} to {redact_url(self.remote)}: {message}"
                    ) from None
        self._run_or_fail(work, "fetch", "--quiet", "--no-tags", "--end-of-options", self.remote, target,
                          network=True)  # fmt: skip
        if self._change(work, "FETCH_HEAD") != self._change(work, commit):
            raise ConfigError(
                f"branch {name} on {redact_url(self.remote)} already holds another commit ({there[:12]}): it is not "
                "overwritten; delete it, or run under another sweep name or branch prefix"
            )
        return self._run_or_fail(work, "rev-parse", "FETCH_HEAD")

    def _remote_commit(self, ref: str) -> str | None:
        """The commit `ref` names on the remote, or None when it has no such ref."""
        try:
            listed = self.run(None, "ls-remote", "--end-of-options", self.remote, ref, network=True)
        except GitFailed as exc:
            refused = _refused_credentials(str(exc))
            if refused:
                raise ConfigError(
                    f"{redact_url(self.remote)} refused to list its branches ({refused}): check the token: {exc}"
                ) from None
            raise BranchFailed(f"could not reach {redact_url(self.remote)}: {exc}") from None
        found = [line.split("\t")[0] for line in listed.splitlines() if line.endswith(f"\t{ref}")]
        return found[0] if found else None

    def _change(self, work: Path, commit: str) -> str:
        """A commit's tree and parents: the same change on the same base, whatever its date."""
        return self._run_or_fail(work, "rev-parse", f"{commit}^{{tree}}", f"{commit}^@")

    def _run_or_fail(
        self, cwd: Path | None, *args: str, stdin: str | None = None, network: bool = False,
        env: dict[str, str] | None = None,
    ) -> str:  # fmt: skip
        try:
            return self.run(cwd, *args, stdin=stdin, network=network, env=env)
        except GitFailed as exc:
            raise BranchFailed(f"git {args[0]} failed: {exc}") from None


class GitFailed(Exception):
    """A git command exited non-zero (its message already scrubbed); turned into BranchFailed or ConfigError."""


def _origin(url: str) -> str | None:
    """scheme://host[:port]/ of an HTTP(S) URL: the token is sent to that server only."""
    parts = urllib.parse.urlsplit(url) if "://" in url else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}/"


def _person(author: str) -> tuple[str, str]:
    match = re.fullmatch(r"\s*(.*?)\s*<([^<>]+)>\s*", author)
    if not match or not match.group(1):
        raise ConfigError(f"commit author {author!r} is not 'Name <email>'")
    return match.group(1), match.group(2)


def _refused_credentials(message: str) -> str | None:
    for pattern in (r"Authentication failed", r"could not read (Username|Password)", r"returned error: (401|403)",
                    r"Permission denied", r"HTTP Basic: Access denied"):  # fmt: skip
        found = re.search(pattern, message)
        if found:
            return found.group(0)
    return None
