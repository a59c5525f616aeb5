"""What makes a run (bugsweep.runconfig): declared once, written into every grade, and the key results are found by.

Without Prefect: the digest (what changes it, what never enters it), and a check that every front end (command
line, flow parameters, blocks, compare's model entries, the environment's settings) offers the same settings with
the same rules, made from the one declaration.

With Prefect (a test server, prefect_test_harness): the issue's two sweeps, a rerun and a --redo-graded, and a comparison
of two configurations of one model, as a user runs them with `bugsweep sweep` and `bugsweep compare`. Real parts:
the local sandbox (bubblewrap + overlayfs), real pytest on a real git repository, a local-folder artifact store.
Stand-in: the model is the scripted OpenAI-compatible server (tests/support/scripted_model.py), which replays tool
calls; it is not a model.
"""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import SecretStr

from bugsweep.spec import TaskSpec, dump_tasks
from tests.support.repos import PYTEST_SETUP
from tests.support.scripted_model import tool_call

pytest_plugins = ["tests.support.prefect_server"]

SECRET = "sk-runconfig-SECRET-never-written"
FIX = tool_call("edit_file", path="calc.py", old="return a - b", new="return a + b")


def fixer(body: dict[str, Any]) -> dict[str, Any]:
    """Any number of runs at once: fix on a run's first turn, finish on its next."""
    if any(m.get("role") == "tool" for m in body["messages"]):
        return tool_call("finish", summary="add() now adds")
    return FIX


def config(**changes: dict[str, Any]) -> Any:
    from bugsweep.runconfig import RunConfig
    from bugsweep.settings import AgentSettings, ModelSettings, SandboxSettings

    model = ModelSettings(
        **{
            "base_url": "http://models/v1",
            "model": "m",
            "api_key": SecretStr(SECRET),
            **changes.get("model", {}),
        }
    )
    agent = AgentSettings(**{"policy": "plain", **changes.get("agent", {})})
    provider = SimpleNamespace(name="local", settings=SandboxSettings(**changes.get("sandbox", {})))
    return RunConfig.of(model, agent, provider)  # type: ignore[arg-type]


def test_the_digest_names_what_can_change_a_verdict_and_never_the_key() -> None:
    base = config()
    assert base.digest == config().digest and len(base.digest) == 12, "the same settings, the same digest"
    assert SECRET not in base.canonical_json() and SECRET not in base.model_dump_json()
    for changed in (
        {"agent": {"max_turns": 30}},
        {"agent": {"policy": "small-model"}},
        {"agent": {"max_cost_usd": 1.0}},
        {"agent": {"per_test_timeout_s": 5.0}},  # a 10 s test passes under one limit, fails under another
        {"model": {"temperature": 0.7}},
        {"model": {"max_tokens_per_reply": 512}},
        {"model": {"model": "other"}},
        {"sandbox": {"memory_mib": 2048}},
        {"sandbox": {"installer": "pip"}},
    ):
        assert config(**changed).digest != base.digest, changed
    for unchanged in (
        {"model": {"api_key": SecretStr("sk-another")}},
        {"model": {"request_timeout_s": 5.0}},
        {"model": {"price_prompt_per_mtok": 3.0}},  # without a cost limit, prices decide nothing
    ):
        assert config(**unchanged).digest == base.digest, unchanged
    capped = {"max_cost_usd": 1.0}
    assert config(agent=capped, model={"price_prompt_per_mtok": 3.0}).digest != config(agent=capped).digest, (
        "under a cost limit the prices decide when the run stops"
    )


def test_a_setting_declared_once_is_in_the_configuration_unless_declared_not_to_change_a_verdict() -> None:
    """A field added to a declaration (AgentLimits, ModelFields, SandboxLimits, RuntimeFields) reaches the digest
    with nothing else to write: every field is in the configuration but those declared never to change a verdict
    (a reply's timeout, retries, prices without a cost limit, Runtime's lifetime, caps and waits)."""
    from bugsweep.runconfig import (
        MODEL_FIELDS_NOT_IN_CONFIG,
        PRICE_FIELDS,
        RUNTIME_FIELDS_NOT_IN_CONFIG,
        AgentLimits,
        ModelFields,
        RunConfig,
        RuntimeFields,
        SandboxLimits,
    )
    from bugsweep.sandbox.runtime import RuntimeSettings
    from bugsweep.settings import AgentSettings, ModelSettings, SandboxSettings

    made = config(agent={"max_cost_usd": 1.0}).model_dump(mode="json")
    assert set(AgentLimits.model_fields) - {"policy"} <= set(made["agent"]) and made["policy"]
    assert set(ModelFields.model_fields) - MODEL_FIELDS_NOT_IN_CONFIG - PRICE_FIELDS <= set(made["model"])
    assert set(made["model"]["prices"]) == PRICE_FIELDS
    assert set(SandboxLimits.model_fields) <= set(made["sandbox"])
    runtime = SimpleNamespace(name="runtime", settings=SandboxSettings(), runtime_settings=RuntimeSettings())
    on_runtime = RunConfig.of(ModelSettings(base_url="http://m/v1"), AgentSettings(policy="plain"), runtime)  # type: ignore[arg-type]
    assert (
        set(on_runtime.sandbox.runtime or {})
        == set(RuntimeFields.model_fields) - RUNTIME_FIELDS_NOT_IN_CONFIG
    )


def test_every_front_end_offers_the_same_settings_with_the_same_rules() -> None:
    """Fails when a setting exists in one front end (command line, flow parameters, blocks, compare's entries, the
    environment) and not the others, or with other bounds or defaults there: each must be made from the one
    declaration in bugsweep/runconfig.py."""
    import inspect
    from typing import Optional, get_args

    import typer

    from blocks import GitBranches, LocalSandbox, ModelEndpoint, RuntimeSandbox
    from bugsweep.agent.policy import policy_names
    from bugsweep.branches import BranchFields
    from bugsweep.cli import app
    from bugsweep.runconfig import (
        POLICY_NAMES,
        AgentChoices,
        AgentLimits,
        ModelChoices,
        ModelFields,
        RuntimeFields,
        SandboxLimits,
    )
    from bugsweep.sandbox.runtime import RuntimeSettings
    from bugsweep.settings import AgentSettings, BranchSettings, ModelSettings, SandboxSettings
    from flows.compare import ModelEntry, compare_models
    from flows.solve_bug import solve_bug
    from flows.sweep import sweep

    limits = set(AgentLimits.model_fields)
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name in ("solve", "demo", "sweep", "compare"):
        options = {p.name: p for p in commands[name].params if p.param_type_name == "option"}
        assert limits <= set(options), f"`bugsweep {name}` lacks {limits - set(options)}"
        choice = inspect.signature(commands[name].callback).parameters["policy"].annotation
        assert [n for arg in get_args(get_args(choice)[0]) for n in get_args(arg)] == list(POLICY_NAMES)
        for option in (p for p in commands[name].params if p.name in limits):
            assert option.default is None, (
                f"`bugsweep {name} --{option.name}` left out is unset, not a default"
            )
    for flow in (sweep, solve_bug, compare_models):
        schema = flow.parameters.model_dump()["definitions"]["AgentChoices"]["properties"]
        assert set(schema) == limits, f"flow {flow.name}'s limits: {set(schema) ^ limits}"
        assert all(field.get("default") is None for field in schema.values()), "an empty form field is unset"
    assert list(POLICY_NAMES) == policy_names(), "every policy name has its policy, and no other"
    # the choices a user makes (options, form fields, a comparison's entries) are the declaration's fields, each
    # unset (None) unless given, with the same rules
    for declared, choices in (
        (AgentLimits, AgentChoices),
        (ModelFields, ModelChoices),
        (ModelFields, ModelEntry),
    ):
        assert set(declared.model_fields) <= set(choices.model_fields)
        for name, field in declared.model_fields.items():
            if choices is ModelEntry and name in ("base_url", "model"):
                continue  # an entry must name its endpoint; its model id defaults to its name
            theirs = choices.model_fields[name]
            assert theirs.default is None and theirs.metadata == field.metadata, f"{choices.__name__}.{name}"
            assert set(get_args(theirs.annotation)) == set(get_args(Optional[field.annotation])), name  # noqa: UP045

    # (declaration, the holders that must offer every one of its fields with the same rules)
    holders: list[tuple[Any, list[Any]]] = [
        (AgentLimits, [AgentSettings]),
        (ModelFields, [ModelSettings, ModelEndpoint]),
        (SandboxLimits, [SandboxSettings, LocalSandbox]),
        (RuntimeFields, [RuntimeSettings, RuntimeSandbox]),
        (BranchFields, [BranchSettings, GitBranches]),
    ]
    for declared, others in holders:
        for holder in others:
            missing = set(declared.model_fields) - set(holder.model_fields)
            assert not missing, f"{holder.__name__} lacks {missing}"
            for name, field in declared.model_fields.items():
                theirs = holder.model_fields[name]
                assert (theirs.annotation, theirs.default, theirs.metadata) == (
                    field.annotation,
                    field.default,
                    field.metadata,
                ), f"{holder.__name__}.{name} differs from {declared.__name__}.{name}"
    # the blocks hold exactly what the environment's settings hold (the model's key included), nothing else
    assert set(ModelEndpoint.model_fields) == set(ModelSettings.model_fields)
    assert set(LocalSandbox.model_fields) == set(SandboxLimits.model_fields)
    assert set(RuntimeSandbox.model_fields) == set(RuntimeSettings.model_fields) | {"setup_network"}
    assert (
        RuntimeSandbox.model_fields["setup_network"].default
        == SandboxLimits.model_fields["setup_network"].default
    )
    assert set(GitBranches.model_fields) == set(
        BranchSettings.model_fields
    )  # the token: a Secret block there
    assert ModelEntry.model_fields["limits"].annotation == AgentChoices | None


#: Builds one configuration from fixed settings and prints its digest and the code digest: run by a copy of the
#: package, in its own process, so that the copy's files are what is hashed.
DIGEST_SCRIPT = """
from types import SimpleNamespace
from bugsweep.runconfig import RunConfig, code_digest
from bugsweep.settings import AgentSettings, ModelSettings, SandboxSettings
model = ModelSettings(base_url="http://models/v1", model="m")
provider = SimpleNamespace(name="local", settings=SandboxSettings())
print(RunConfig.of(model, AgentSettings(policy="plain"), provider).digest, code_digest())
"""


def test_the_configuration_names_the_code_and_one_changed_file_is_another_configuration(
    tmp_path: Path,
) -> None:
    """The configuration holds a hash of the package's files (`bugsweep_code`): a copy of this checkout gives the
    same configuration digest as the checkout; one changed line in one source file of the copy gives another. Each
    digest is computed by the package itself, in a process of its own. (The wheel of this tree gives the same code
    digest as the checkout: tests/test_packaging.py.)"""
    import os
    import subprocess
    import sys

    import bugsweep
    from bugsweep.runconfig import code_digest

    package = Path(bugsweep.__file__).resolve().parent
    project = package.parent
    copy = tmp_path / "copy"
    shutil.copytree(package, copy / "bugsweep", ignore=shutil.ignore_patterns("__pycache__"))
    for name in (".gitignore", "pyproject.toml"):
        shutil.copy(project / name, copy / name)
    plain = {k: v for k, v in os.environ.items() if not k.startswith(("BUGSWEEP_", "LLM_", "PYTHON"))}

    def digests(root: Path) -> tuple[str, str]:
        done = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT], env={**plain, "PYTHONPATH": str(root)},
                              cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
        config, code = done.stdout.split()
        return config, code

    here = digests(project)
    assert digests(copy) == here and here[1] == code_digest(), "the same files, the same configuration"
    prompts = copy / "bugsweep" / "agent" / "prompts.py"
    prompts.write_text(prompts.read_text() + "\n# one line more\n")
    changed = digests(copy)
    assert changed[0] != here[0] and changed[1] != here[1], "one changed file: another configuration"


#: Each command's options that are not agent limits, and the flow parameter each one fills (None: the command
#: offers it where the flow has none, with the reason). A new option or parameter must be added here, in both
#: front ends, or the test below fails.
COMMAND_TO_FLOW: dict[str, dict[str, str | None]] = {
    "sweep": {
        "tasks": "source", "repo": "source", "branch": "source", "test_command": "source", "setup_command": "source",
        "name": "name", "concurrency": "concurrency", "sandbox": "sandbox", "model_block": "model",
        "store_block": "store", "on_workers": "run_on", "redo_graded": "redo_graded", "push_branches": "push_branches",
        "keep_graded_by_other_code": "keep_graded_by_other_code",
        "branches_block": "branches", "specs": "source", "repos_from": "source", "added_within_days": "source",
        "escalate_to_block": "escalate_to",
    },
    "compare": {
        "tasks": "source", "model": "models", "price": "models", "model_policy": "models", "model_set": "models",
        "runs": "runs", "concurrency": "concurrency", "out": "report_dir", "name": "name", "sandbox": "sandbox",
        "specs": "source", "repos_from": "source", "added_within_days": "source",
    },
    "solve": {
        "repo": "repo", "task": "problem", "test_command": "test_command", "setup_command": "setup_command",
        "ref": "ref", "python": "task", "sandbox": "sandbox", "out": None,  # a run folder on this machine
        "push_branch": "push_branches",
        "push_url": None,  # the flow takes a git branches block; the command BUGSWEEP_BRANCH_* and this
        "escalate_to": "escalate_to", "escalate_set": "escalate_to",  # the flow takes saved endpoint blocks
    },
}  # fmt: skip
#: Flow parameters a command does not offer, and why.
FLOW_ONLY = {
    "sweep": {"deployment"},  # the solve-bug deployment a sweep on workers uses: `bugsweep deploy` makes it
    "compare": {"store"},  # the command uses BUGSWEEP_STORE_URL
    "solve": {
        "sweep",
        "model",
        "store",
        "branches",
    },  # the command writes a local run folder and takes the model from LLM_*, the branches' from BUGSWEEP_BRANCH_*
}


def test_each_command_and_its_flow_offer_the_same_settings() -> None:
    """Fails when a command gains an option its flow lacks, or a flow a parameter its command lacks (unless both
    tables above say why)."""
    import inspect

    import typer

    from bugsweep.cli import app
    from bugsweep.runconfig import AgentLimits
    from flows.compare import compare_models
    from flows.solve_bug import solve_bug
    from flows.sweep import sweep

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name, flow in (("sweep", sweep), ("compare", compare_models), ("solve", solve_bug)):
        options = {p.name for p in commands[name].params} - set(AgentLimits.model_fields)
        assert options == set(COMMAND_TO_FLOW[name]), (
            f"`bugsweep {name}`: {options ^ set(COMMAND_TO_FLOW[name])}"
        )
        parameters = set(inspect.signature(flow.fn).parameters) - {"limits"}
        filled = {p for p in COMMAND_TO_FLOW[name].values() if p} | FLOW_ONLY[name]
        assert parameters == filled, f"flow {flow.name}: {parameters ^ filled}"


def flow_default(flow: Any, parameter: str) -> Any:
    default = inspect.signature(flow.fn).parameters[parameter].default
    return getattr(default, "default", default)  # a form field's default, or the parameter's own


def test_a_setting_offered_by_a_command_and_its_flow_has_one_default() -> None:
    """Fails when a command's option and the flow parameter (or task source field) it fills default to different
    values: a run started from the command line and one started from the UI would differ."""
    import typer

    from bugsweep.cli import app
    from bugsweep.discover import RepoBranch, TaskFile
    from flows.compare import compare_models
    from flows.solve_bug import solve_bug
    from flows.sweep import sweep

    expected = {
        "sweep": {
            "concurrency": flow_default(sweep, "concurrency"), "sandbox": flow_default(sweep, "sandbox"),
            "test_command": RepoBranch.model_fields["test_command"].default,
            "setup_command": RepoBranch.model_fields["setup_command"].default,
            "branch": RepoBranch.model_fields["branch"].default, "repos_from": TaskFile.model_fields["repos_from"].default,
            "redo_graded": flow_default(sweep, "redo_graded"), "push_branches": flow_default(sweep, "push_branches"),
            "keep_graded_by_other_code": flow_default(sweep, "keep_graded_by_other_code"),
        },
        "compare": {
            "runs": flow_default(compare_models, "runs"), "concurrency": flow_default(compare_models, "concurrency"),
            "sandbox": flow_default(compare_models, "sandbox"), "repos_from": TaskFile.model_fields["repos_from"].default,
        },
        "solve": {
            "setup_command": flow_default(solve_bug, "setup_command"), "sandbox": flow_default(solve_bug, "sandbox"),
            "push_branch": flow_default(solve_bug, "push_branches"),
        },
    }  # fmt: skip
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name, defaults in expected.items():
        options = {p.name: p.default for p in commands[name].params}
        assert {k: options[k] for k in defaults} == defaults, f"`bugsweep {name}`"


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--model-set", "a:bogus=1"], "'bogus' is not a setting of a model entry"),
        (["--model-set", "a:max_turns=0"], "greater than or equal to 1"),
        (["--model-set", "b:max_turns=3"], "expected NAME:SETTING=VALUE for one of the --model names"),
        (["--model-policy", "a=bogus"], "--model-policy 'a=bogus': Input should be 'plain' or 'small-model'"),
    ],
)
def test_a_bad_entry_setting_is_refused_before_anything_runs(
    tmp_path: Path, option: list[str], says: str
) -> None:
    from typer.testing import CliRunner

    from bugsweep.cli import app

    tasks = tmp_path / "t.jsonl"
    tasks.write_text("")
    result = CliRunner().invoke(app, ["compare", "--tasks", str(tasks), "--model", "a=http://h/v1", *option])
    assert result.exit_code == 2 and says in " ".join(result.output.split()), result.output


def test_a_worker_that_ran_under_another_configuration_is_named_not_lost(tmp_path: Path) -> None:
    """A sweep on workers reads each solve-bug run's grade at SWEEP/TASK/MODEL/CONFIG. A worker whose own settings
    make another configuration stores it under another digest: the task fails as a configuration problem naming
    both digests (no Prefect server: `collect` is a plain function)."""
    from bugsweep.grading import Grade
    from bugsweep.runconfig import RunConfig
    from bugsweep.settings import AgentSettings, ModelSettings, SandboxSettings
    from bugsweep.storage import LocalStore
    from bugsweep.sweep import RunSetup
    from bugsweep.sweep.collect import collect

    model, agent = ModelSettings(base_url="http://models/v1", model="m"), AgentSettings(policy="plain")
    provider = SimpleNamespace(name="local", settings=SandboxSettings())
    store = LocalStore(tmp_path / "store")
    run = RunSetup(model, agent, provider, store, tmp_path / "local", RunConfig.of(model, agent, provider))  # type: ignore[arg-type]
    spec = calc_task(tmp_path, "calc-w")
    ended = "Completed"

    def written(digest: str, flow_run: str) -> None:
        store.put_bytes(f"s/calc-w/m/{digest}/run.json", json.dumps({"flow_run_id": flow_run}).encode())
        grade = Grade(instance_id="calc-w", model="m", resolved=True, config_digest=digest)
        store.put_bytes(f"s/calc-w/m/{digest}/grade.json", grade.model_dump_json().encode())

    written("0123456789ab", "run-1")
    lost = collect(spec, "run-1", ended, run, "s", started=0.0)
    assert lost.grade.failure_kind == "config" and "0123456789ab" in (lost.grade.error or "")
    assert run.config.digest in (lost.grade.error or "") and lost.grade.config_digest == run.config.digest

    written(run.config.digest, "run-2")
    found = collect(spec, "run-2", ended, run, "s", started=0.0)
    assert (
        found.grade.resolved
        and found.stored_at
        and found.stored_at.endswith(f"s/calc-w/m/{run.config.digest}")
    )


# -- with Prefect: sweeps and a comparison under two configurations -------------------------------------------


def calc_task(repo: Path, instance_id: str) -> TaskSpec:
    return TaskSpec(
        instance_id=instance_id,
        repo=str(repo),
        problem_statement="tests/test_calc.py::test_add fails: add() returns the wrong result. Fix the code.",
        test_command="python -m pytest -q",
        setup_command=PYTEST_SETUP,
    )


@pytest.fixture
def user_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scripted_model: Any) -> Any:
    """A user's environment: the model from LLM_* (the scripted stand-in server), artifacts in a local folder."""
    server = scripted_model([fixer] * 60)
    monkeypatch.setenv("LLM_BASE_URL", server.base_url)
    monkeypatch.setenv("LLM_MODEL", "scripted-model")
    monkeypatch.setenv("LLM_API_KEY", SECRET)
    monkeypatch.setenv("BUGSWEEP_STORE_URL", str(tmp_path / "artifacts"))
    monkeypatch.setenv("COLUMNS", "250")
    return server


def run_cli(*args: str) -> str:
    from typer.testing import CliRunner

    from bugsweep.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    return " ".join(result.output.split())


@pytest.mark.prefect
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")
def test_a_sweep_under_another_configuration_runs_again_and_keeps_both(
    prefect_harness: None, user_env: Any, buggy_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's steps: `sweep --policy plain --max-turns 10`, then `--policy small-model --max-turns 30`. The
    second runs the task (it used to run nothing and return the first one's grade), both grades are kept under
    their configurations' digests, and the summary shows both. The same configuration again skips the task;
    `--redo-graded` runs it again and replaces only that configuration's grade. After a change of bugsweep's code
    (stood in for by another code digest) the task runs again and both grades are kept; an edited test command
    runs it again; `--keep-graded-by-other-code` keeps what the other code graded and the summary says so."""
    from prefect.artifacts import Artifact

    from bugsweep import runconfig
    from tasks.steps import OTHER_CONFIGURATION

    server = user_env
    tasks = tmp_path / "configs.jsonl"
    dump_tasks([calc_task(buggy_repo, "calc-t")], tasks)
    folder = tmp_path / "artifacts" / "configs" / "calc-t" / "scripted-model"  # SWEEP/TASK/MODEL/CONFIG

    def sweep(*options: str) -> tuple[str, int]:
        before = len(server.requests)
        output = run_cli("sweep", "--tasks", str(tasks), *options)
        return output, len(server.requests) - before

    def stored() -> dict[str, dict[str, Any]]:
        return {p.parent.name: json.loads(p.read_text()) for p in folder.glob("*/grade.json")}

    first, asked = sweep("--policy", "plain", "--max-turns", "10")
    assert asked > 0 and "agent policy: plain" in first
    ((plain, plain_grade),) = stored().items()
    assert plain_grade["config_digest"] == plain and plain_grade["policy"] == "plain"
    assert plain_grade["config"]["agent"]["max_turns"] == 10 and plain_grade["config"]["policy"] == "plain"

    second, asked = sweep("--policy", "small-model", "--max-turns", "30")

    assert asked > 0, "under another configuration the task runs again"
    grades = stored()
    assert set(grades) - {plain} and plain in grades, "both grades are kept"
    (small,) = set(grades) - {plain}
    assert grades[small]["policy"] == "small-model" and grades[small]["config"]["agent"]["max_turns"] == 30
    assert grades[plain] == plain_grade, "the first configuration's grade is untouched"
    assert "agent policy: small-model" in second and "agent policy: plain" not in second
    assert f"configuration {small}: scripted-model, policy small-model, 30 turns" in second
    assert "COMPLETED: 1 task(s) graded: " in second
    summary = Artifact.get("sweep-configs")
    assert summary is not None
    text = str(summary.data)
    assert small in text and plain in text and OTHER_CONFIGURATION in text, text
    assert f"`{plain}` (policy plain): 1 of 1 resolved" in text and f"`{small}` (policy small-model)" in text
    table = Artifact.get("sweep-configs-table")
    assert table is not None and plain in str(table.data) and small in str(table.data)

    again, asked = sweep("--policy", "small-model", "--max-turns", "30")

    assert asked == 0, "the same configuration: the graded task is skipped"
    assert "skipped (graded before)" in str(Artifact.get("sweep-configs").data)  # type: ignore[union-attr]
    assert small in again
    assert (
        "1 task(s) already graded under this configuration were not run again (redo_graded, `bugsweep sweep "
        "--redo-graded`, runs them again)" in " ".join(again.split())
    )

    redo, asked = sweep("--policy", "small-model", "--max-turns", "30", "--redo-graded")

    assert asked > 0, "--redo-graded runs it again"
    grades = stored()
    assert set(grades) == {plain, small} and grades[plain] == plain_grade, "only that configuration's grade"
    assert grades[small]["wall_s"] != 0 and small in redo
    small_grade = grades[small]

    # An upgrade: the same settings, another bugsweep (another hash of the package's files).
    monkeypatch.setattr(runconfig, "code_digest", lambda: "0" * 16)
    _, asked = sweep("--policy", "small-model", "--max-turns", "30")

    assert asked > 0, "what the old code graded runs again"
    grades = stored()
    (upgraded,) = set(grades) - {plain, small}
    assert grades[upgraded]["config"]["bugsweep_code"] == "0" * 16 and grades[small] == small_grade, (
        "both kept"
    )
    summary = " ".join(str(Artifact.get("sweep-configs").data).split())  # type: ignore[union-attr]
    assert "1 graded by another bugsweep (another code digest): run again" in summary, summary

    # The task edited (its test command): graded under this very configuration, it runs again all the same.
    dump_tasks(
        [calc_task(buggy_repo, "calc-t").model_copy(update={"test_command": "python -m pytest -q tests"})],
        tasks,
    )
    _, asked = sweep("--policy", "small-model", "--max-turns", "30")

    assert asked > 0, "an edited test command is another task"
    edited = stored()[upgraded]
    assert (
        json.loads((folder / upgraded / "task.json").read_text())["test_command"]
        == "python -m pytest -q tests"
    )

    # Another upgrade, keeping what the older code graded: nothing runs, and the summary says so.
    monkeypatch.setattr(runconfig, "code_digest", lambda: "1" * 16)
    kept, asked = sweep("--policy", "small-model", "--max-turns", "30", "--keep-graded-by-other-code")

    assert asked == 0, "the grades of the other bugsweep are kept, by choice"
    summary = " ".join(str(Artifact.get("sweep-configs").data).split())  # type: ignore[union-attr]
    assert "1 graded by another bugsweep: their grades kept by choice" in summary, summary
    assert "kept: graded by another bugsweep" in summary and upgraded in kept
    assert stored()[upgraded] == edited and len(stored()) == 3, "nothing graded anew, nothing deleted"
    for path in (tmp_path / "artifacts").rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


@pytest.mark.prefect
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")
def test_compare_puts_two_configurations_of_one_model_side_by_side(
    prefect_harness: None, user_env: Any, buggy_repo: Path, tmp_path: Path
) -> None:
    """One model (one server, one model id) as two entries: `plain` with 6 turns and `small` under the small-model
    policy with 4. Each is its own configuration, stored and reported under its own digest."""
    server = user_env
    tasks = tmp_path / "pair.jsonl"
    dump_tasks([calc_task(buggy_repo, "calc-t")], tasks)

    output = run_cli(
        "compare", "--tasks", str(tasks),
        "--model", f"plain={server.base_url},,scripted-model", "--model", f"small={server.base_url},,scripted-model",
        "--model-policy", "small=small-model", "--model-set", "small:max_turns=4",
        "--runs", "1", "--concurrency", "2", "--max-turns", "6",
    )  # fmt: skip

    report_dir = tmp_path / "artifacts" / "compare-pair"
    data = json.loads((report_dir / "report.json").read_text())
    by_entry = {m["model"]: m for m in data["models"]}
    assert by_entry["plain"]["policies"] == ["plain"] and by_entry["small"]["policies"] == ["small-model"]
    ((plain,), (small,)) = by_entry["plain"]["configs"], by_entry["small"]["configs"]
    assert plain != small and by_entry["plain"]["resolved"] == by_entry["small"]["resolved"] == 1
    for entry, digest, turns, policy in (("plain", plain, 6, "plain"), ("small", small, 4, "small-model")):
        grade = json.loads((report_dir / "calc-t" / entry / digest / "run-0" / "grade.json").read_text())
        assert grade["config_digest"] == digest and grade["config"]["model"]["model"] == "scripted-model"
        assert (grade["config"]["agent"]["max_turns"], grade["config"]["policy"]) == (turns, policy)
    assert plain in output and small in output, f"the table shows each entry's configuration: {output}"
    assert "did not all run under the same agent policy (plain: plain; small: small-model)" in output
    assert plain in (report_dir / "report.md").read_text()


# -- one environment, one set of choices: one run from every front end ------------------------------------------


class Built(BaseException):  # not an error: it stops a front end once its run is built
    """Raised by the builder in these tests once a front end has built its run: the front end goes no further
    (nothing runs), and the configuration it built is kept."""

    def __init__(self, config: Any) -> None:
        super().__init__(config.digest)
        self.config = config


@pytest.fixture
def stop_when_built(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every front end builds its run through bugsweep.runbuilder.build_run, which makes the configuration with
    RunConfig.of: here that raises Built with it, so each front end is called through its real entry point and
    stops there."""
    from bugsweep import runbuilder
    from bugsweep.runconfig import RunConfig

    built: list[Any] = []

    def of(*args: Any, **kwargs: Any) -> Any:
        config = RunConfig.of(*args, **kwargs)
        built.append(config)
        raise Built(config)

    monkeypatch.setattr(runbuilder, "RunConfig", SimpleNamespace(of=of))
    return built


@pytest.fixture
def saved_blocks(prefect_harness: None) -> Any:
    """Deletes the blocks and deployments a test saved in the session's Prefect server (other tests must find none)."""
    from prefect.client.orchestration import get_client

    yield
    with get_client(sync_client=True) as client:
        for deployment in client.read_deployments():
            client.delete_deployment(deployment.id)
        for document in client.read_block_documents():
            if document.name and document.name.startswith("bugsweep-"):
                client.delete_block_document(document.id)


def built_by(call: Any) -> Any:
    """The configuration a front end built before it was stopped."""
    with pytest.raises(Built) as stopped:
        call()
    return stopped.value.config


def deployment_run(flow: Any, name: str, deployed: dict[str, Any], *, form: dict[str, Any] | None = None,
                   saved_blocks_chosen: bool = True) -> Any:  # fmt: skip
    """A run of `flow` deployed as `name` with `deployed` parameters (prefect.yaml's), executed as a worker
    executes it: the server merges the deployment's parameters with the run's (`form`: what the UI's run form
    sends; none for a schedule), and the engine validates them and resolves block references."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.flow_engine import run_flow

    from deployments.deploy import choose_saved_blocks

    deployment = flow.to_deployment(name=name, parameters=deployed)
    deployment.apply()
    full_name = f"{flow.name}/{name}"
    if saved_blocks_chosen:
        choose_saved_blocks(full_name)  # what `bugsweep deploy` does
    created = run_deployment(full_name, parameters=form or {}, timeout=0)
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(created.id)
    return run_flow(flow, flow_run=flow_run)


@pytest.mark.prefect
def test_every_front_end_builds_one_run_from_one_environment_and_one_set_of_choices(
    prefect_harness: None, saved_blocks: None, stop_when_built: list[Any], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The issue's check: BUGSWEEP_*, LLM_* and BUGSWEEP_SANDBOX_* in the environment and one choice (900 s of
    wall time) give ONE configuration digest from `bugsweep solve`, `bugsweep sweep`, `bugsweep compare`, the
    blocks `bugsweep blocks create` saves from that environment, the sweep and solve-bug flows run from their
    deployments as the UI and the schedule start them (and solve-bug as a sweep on workers starts it), and the
    compare flow called with JSON parameters (there, a comparison entry's own limit goes over the comparison's,
    field by field, from the command line and the flow alike). Each front end is called through its real entry
    point and stops
    where its run is built; nothing runs. Both sandboxes: local, and Runtime (its block saved from
    BUGSWEEP_RUNTIME_*; no Runtime API is called: a provider talks to it only to make a sandbox)."""
    import yaml
    from typer.testing import CliRunner

    from bugsweep.cli import app
    from bugsweep.runconfig import AgentChoices
    from flows.compare import compare_models
    from flows.solve_bug import solve_bug
    from flows.sweep import sweep, worker_parameters

    endpoint = "http://127.0.0.1:9/v1"  # never asked: every front end stops before its first request
    for name, value in {
        "LLM_BASE_URL": endpoint, "LLM_MODEL": "env-model", "LLM_API_KEY": SECRET, "BUGSWEEP_MAX_TURNS": "17",
        "BUGSWEEP_POLICY": "small-model", "BUGSWEEP_SANDBOX_MEMORY_MIB": "3072", "BUGSWEEP_SANDBOX_DISK_MIB": "4096",
        "LLM_TEMPERATURE": "0.25",
        "BUGSWEEP_SANDBOX_STATE_DIR": str(tmp_path / "sandboxes"), "BUGSWEEP_STORE_URL": str(tmp_path / "artifacts"),
        "RUNTIME_API_KEY": "rk-runconfig-test", "BUGSWEEP_RUNTIME_DISK_MIB": "5000", "BUGSWEEP_RUNTIME_VCPU": "4",
        "RUNTIME_API_URL": "http://127.0.0.1:9", "BUGSWEEP_RUNTIME_MAX_RETRIES": "0",  # a crashed flow's cleanup hook
        # (it runs when the flow is stopped here) finds nothing listening there and gives up at once
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    chosen = {"max_wall_s": 900.0, "attempts": 3}
    form = {
        "limits": {**dict.fromkeys(AgentChoices.model_fields), **chosen}
    }  # the run form: empty fields are null
    tasks = tmp_path / "tasks.jsonl"
    dump_tasks([calc_task(tmp_path, "calc-1")], tasks)
    deployed = {
        d["name"]: d.get("parameters") or {}
        for d in yaml.safe_load(Path("prefect.yaml").read_text())["deployments"]
    }
    runner = CliRunner()

    def cli(*args: str) -> Any:
        given = [*args, "--max-wall-s", "900", "--attempts", "3"]
        return built_by(lambda: runner.invoke(app, given, catch_exceptions=False))

    one_off = ["--repo", str(tmp_path), "--task", "add() subtracts", "--test-command", "python -m pytest -q"]
    digests = {
        "bugsweep solve": cli("solve", *one_off),
        "bugsweep sweep": cli("sweep", "--tasks", str(tasks)),
        # a comparison's entry: its own limit (17 turns) over the comparison's (5 turns, 900 s), field by field
        "bugsweep compare": cli("compare", "--tasks", str(tasks), "--model", f"entry={endpoint},,env-model",
                                "--max-turns", "5", "--model-set", "entry:max_turns=17"),
        "compare-models flow (JSON parameters)": built_by(lambda: compare_models(
            source={"kind": "file", "path": str(tasks)}, models=[{"name": "entry", "base_url": endpoint,
            "model": "env-model", "limits": {"max_turns": 17}}], limits={**form["limits"], "max_turns": 5})),
    }  # fmt: skip
    made = runner.invoke(app, ["blocks", "create", "--no-check"], catch_exceptions=False)
    assert made.exit_code == 0 and "bugsweep-model" in made.output and "bugsweep-runtime" in made.output, (
        made.output
    )
    nightly = {**deployed["nightly-sweep"], "source": {"kind": "file", "path": str(tasks)}, "limits": chosen}
    digests |= {
        "sweep flow with the saved blocks": built_by(lambda: sweep(source={"kind": "file", "path": str(tasks)}, **form)),
        "sweep deployment, its schedule": built_by(lambda: deployment_run(sweep, "nightly", nightly)),
        "sweep deployment, the UI's run form": built_by(lambda: deployment_run(
            sweep, "ui", deployed["nightly-sweep"], form={"source": nightly["source"], **form})),
        "solve-bug deployment, the UI's run form": built_by(lambda: deployment_run(
            solve_bug, "solve-bug", deployed["solve-bug"], form={"repo": str(tmp_path), "problem": "add()", **form})),
        "solve-bug deployment, as a sweep on workers starts it": built_by(lambda: deployment_run(
            solve_bug, "solve-bug", deployed["solve-bug"], form={
                **worker_parameters(None, "local", None, AgentChoices(**chosen), False, None),
                "repo": str(tmp_path), "problem": "add()", "task": calc_task(tmp_path, "calc-1").model_dump(mode="json")})),
    }  # fmt: skip
    configs = {front_end: config.digest for front_end, config in digests.items()}
    assert len(set(configs.values())) == 1, configs
    config = digests["bugsweep solve"]
    assert (
        config.agent["max_turns"],
        config.agent["max_wall_s"],
        config.agent["attempts"],
        config.policy,
    ) == (
        17,
        900.0,
        3,
        "small-model",
    )

    # a cheaper model first: the models a task escalates to, named on the command line (an endpoint and the name of
    # its key's variable) or as saved blocks (a sweep's, handed on to a solve-bug run on a worker as references)
    from blocks import ModelEndpoint

    strong_url = "http://127.0.0.1:9/v2"
    monkeypatch.setenv("STRONG_KEY", "sk-strong-runconfig")
    ModelEndpoint(base_url=strong_url, model="strong", temperature=0.25, api_key="sk-strong-runconfig").save(
        "strong", overwrite=True
    )
    strong = ModelEndpoint.load("strong")
    cascades = {
        "bugsweep solve --escalate-to": cli("solve", *one_off, "--escalate-to", f"strong={strong_url},STRONG_KEY"),
        "bugsweep sweep --escalate-to-block": cli("sweep", "--tasks", str(tasks), "--escalate-to-block", "strong"),
        "solve-bug deployment, as a sweep on workers starts it": built_by(lambda: deployment_run(
            solve_bug, "solve-bug", deployed["solve-bug"], form={
                **worker_parameters(None, "local", None, AgentChoices(**chosen), False, None, [strong]),
                "repo": str(tmp_path), "problem": "add()", "task": calc_task(tmp_path, "calc-1").model_dump(mode="json")})),
    }  # fmt: skip
    assert len({c.digest for c in cascades.values()}) == 1, {k: c.digest for k, c in cascades.items()}
    cascade = cascades["bugsweep solve --escalate-to"]
    assert [(m.model, m.base_url) for m in cascade.escalate_to] == [("strong", strong_url)]
    assert cascade.digest != config.digest and "sk-strong" not in cascade.canonical_json()
    assert (config.model.model, config.model.base_url, config.model.temperature) == (
        "env-model",
        endpoint,
        0.25,
    )
    assert (config.sandbox.memory_mib, config.sandbox.disk_mib) == (3072, 4096)

    monkeypatch.setenv(
        "BUGSWEEP_SANDBOX_BACKEND", "runtime"
    )  # the backend too: from the environment, else chosen
    runtime = {
        "bugsweep solve (the environment)": cli("solve", *one_off),
        "bugsweep solve --sandbox runtime": cli("solve", *one_off, "--sandbox", "runtime"),
        "sweep flow (its saved Runtime block)": built_by(lambda: sweep(source={"kind": "file", "path": str(tasks)}, **form)),
    }  # fmt: skip
    assert len({c.digest for c in runtime.values()}) == 1, {k: c.digest for k, c in runtime.items()}
    made_on = runtime["bugsweep solve (the environment)"].sandbox
    assert (made_on.backend, made_on.runtime["disk_mib"], made_on.runtime["vcpu"]) == ("runtime", 5000, 4)
