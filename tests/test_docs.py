"""The docs say what the code does: every `bugsweep` command and option they show exists, every variable they name
is read, and the numbers they quote (defaults, retries, timeouts, heartbeats) are the code's.

No servers, no sandboxes: the docs' text against the command line (typer), the settings classes and the constants.
A doc that quotes a number the code no longer has fails here; so does code that changes a quoted number.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[1]
DOCS = [PROJECT / "README.md", PROJECT / "ARCHITECTURE.md", *sorted((PROJECT / "docs").glob("*.md"))]
#: Prefect block type names, not commands ("bugsweep artifact store" is the old block the docs say to delete).
NOT_COMMANDS = {
    "artifact",
    "model endpoint",
    "local sandbox",
    "runtime sandbox",
    "git branches",
    "commands",
    "sandbox",
}
#: Options of other programs the docs show (docker, prefect, git, vllm, pytest, the SWE-bench harness, ...).
OTHER_PROGRAMS_OPTIONS = {
    "--base-job-template", "--build-arg", "--cached", "--cap-add", "--cap-drop", "--deselect", "--device-cgroup-rule",
    "--enable-auto-tool-choice", "--first-parent", "--git", "--host", "--include", "--network", "--predictions",
    "--privileged", "--rm", "--security-opt", "--tool-call-parser", "--type", "--user", "--variant", "--watch",
    "--watch-timeout", "--limit", "--pool", "--name", "--params", "--job-variable", "--prefect-file", "--no-deps",
    "--ignore", "--continue-on-collection-errors", "--rootdir", "--cov", "--upgrade", "--stable",
}  # fmt: skip


def text_of(doc: Path) -> str:
    return " ".join(doc.read_text(encoding="utf-8").split())


def code_spans(doc: Path) -> list[str]:
    """Inline code and every line of the code blocks, comments cut off."""
    text = doc.read_text(encoding="utf-8")
    blocks = [line for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S) for line in block.splitlines()]
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return [re.split(r"\s#\s", span)[0] for span in [*blocks, *inline]]


def cli() -> Any:
    import typer

    from bugsweep.cli import app

    return typer.main.get_command(app)


def option_names(command: Any) -> set[str]:
    return {o for p in command.params for o in [*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]}


def test_every_command_and_option_the_docs_show_exists() -> None:
    root, wrong = cli(), []
    for doc in DOCS:
        for span in code_spans(doc):
            for found in re.finditer(r"(?:^|[\s(&|;$])bugsweep((?: [a-z][a-z-]*)+)", span):
                words, command, path = found.group(1).split(), root, []
                for word in words:
                    if word in getattr(command, "commands", {}):
                        command = command.commands[word]
                        path.append(word)
                    else:
                        break
                if not path:
                    if " ".join(words[:2]) not in NOT_COMMANDS and words[0] not in NOT_COMMANDS:
                        wrong.append(f"{doc.name}: no command `bugsweep {' '.join(words)}`")
                    continue
                rest = re.split(r"\|\||&&|;|\|| -- ", span[found.end() :])[0]
                for option in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
                    if option not in option_names(command) | {"--help"}:
                        wrong.append(f"{doc.name}: `bugsweep {' '.join(path)}` has no {option}")
    assert not wrong, "\n".join(wrong)


def test_every_option_the_docs_name_is_an_option_of_some_command() -> None:
    """Options named in the prose (`--max-cost-usd` on ...) as well: each is some command's, or another program's."""
    every: set[str] = set()

    def walk(command: Any) -> None:
        every.update(option_names(command))
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(cli())
    named = {
        (doc.name, o) for doc in DOCS for o in re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", doc.read_text())
    }
    unknown = sorted(
        f"{doc}: {o}" for doc, o in named if o not in every | OTHER_PROGRAMS_OPTIONS | {"--help"}
    )
    assert not unknown, unknown


def settings_variables() -> dict[str, Any]:
    """Every variable the settings read, with its default."""
    from bugsweep.sandbox.runtime import RuntimeSettings
    from bugsweep.settings import AgentSettings, BranchSettings, ModelSettings, SandboxSettings
    from bugsweep.storage import StoreSettings

    found: dict[str, Any] = {}
    for settings in (
        AgentSettings,
        ModelSettings,
        SandboxSettings,
        BranchSettings,
        StoreSettings,
        RuntimeSettings,
    ):
        prefix = settings.model_config.get("env_prefix", "")
        for name, field in settings.model_fields.items():
            default = field.get_default(call_default_factory=True)
            found[(prefix + name).upper()] = default
            for alias in getattr(field.validation_alias, "choices", []):
                found[str(alias).upper()] = default
    return found


def test_every_variable_the_docs_name_is_read() -> None:
    variables = settings_variables()
    code = "\n".join(
        p.read_text() for folder in ("bugsweep", "flows", "tasks", "blocks", "deployments", "tests")
        for p in (PROJECT / folder).rglob("*.py")
    )  # fmt: skip
    unknown = sorted(
        f"{doc.name}: {name}"
        for doc in DOCS
        for name in set(re.findall(r"\b((?:BUGSWEEP|LLM|RUNTIME)_[A-Z0-9_]*[A-Z0-9])\b", doc.read_text()))
        if name not in variables and f'"{name}"' not in code
    )
    assert not unknown, unknown


def test_the_defaults_the_docs_give_for_variables_are_the_settings() -> None:
    """`VARIABLE` (default X), and the settings tables' rows (| `VARIABLE` | X |): X is the setting's default (a
    setting whose default is unset is described in words there, and not compared)."""
    variables, checked, wrong = settings_variables(), 0, []
    for doc in DOCS:
        raw = doc.read_text(encoding="utf-8")
        found = re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \| `?([^`|]+?)`? \|", raw, re.M)
        found += re.findall(r"`([A-Z][A-Z0-9_]+)`(?: \(|, )default `?([^`),;]+)`?[),;]", text_of(doc))
        for name, quoted in found:
            default = variables.get(name)
            if default is None or default == "" or hasattr(default, "get_secret_value"):
                continue
            checked += 1
            if isinstance(default, bool):
                matches = quoted == str(default).lower()
            elif isinstance(default, int | float):
                matches = re.fullmatch(r"[\d.]+", quoted) is not None and float(quoted) == float(default)
            else:
                matches = quoted == str(default)
            if not matches:
                wrong.append(f"{doc.name}: {name} default {quoted!r}, the code's {default!r}")
    assert not wrong, wrong
    assert checked >= 10, "the settings tables were read"


def quoted_numbers() -> list[tuple[str, str]]:
    """(doc, phrase): each number a doc quotes, written from the constant the code uses."""
    from bugsweep.agent.focus import FIRST_PROMPT_MAX_CHARS
    from bugsweep.agent.model import MAX_RETRY_AFTER_S
    from bugsweep.agent.small_model.whole_function import SAMPLE_TEMPERATURE
    from bugsweep.cli.deploy import WORKER_QUERY_S
    from bugsweep.embedded import EmbeddedSettings
    from bugsweep.grading.runs import LOG_HEAD_BYTES
    from bugsweep.runconfig import AgentLimits, SandboxLimits
    from bugsweep.settings import AgentSettings, ModelSettings, SandboxSettings
    from bugsweep.storage import StoreSettings
    from deployments.deploy import HEARTBEAT_S, MISSED_HEARTBEATS, RERUN_AFTER_S
    from flows.common import CRASH_RERUNS
    from tasks.fanout import RERUN_GRACE_S
    from tasks.limits import LEASE_S
    from tasks.steps import STEP_OPTIONS, TIMEOUT_MARGIN_S

    agent, limits, sandbox, model = (
        AgentSettings.model_fields,
        AgentLimits.model_fields,
        SandboxSettings.model_fields,
        ModelSettings.model_fields,
    )
    delays = [f"{d:g}" for d in default_retry_delays()]
    attempts = StoreSettings.model_fields["attempts"].default
    words = {1: "once", 2: "two", 3: "three"}
    return [
        ("README.md", f"the last {agent['output_tail_chars'].default:,} characters; "
                      f"{agent['command_timeout_s'].default:g} s timeout"),
        ("README.md", f"`per_test_timeout_s` seconds (default {limits['per_test_timeout_s'].default:g};"),
        ("README.md", f"{SandboxLimits.model_fields['disk_mib'].default / 1024:g} GiB by default"),
        ("README.md", f"`BUGSWEEP_SANDBOX_ENV_MAX_GIB`, {sandbox['env_max_gib'].default:g}, or after "
                      f"`BUGSWEEP_SANDBOX_ENV_MAX_AGE_DAYS`, {sandbox['env_max_age_days'].default:g})"),
        ("README.md", f"(`rewrite_samples`, default {agent['rewrite_samples'].default}, each a turn)"),
        ("README.md", f"asked again at temperature {SAMPLE_TEMPERATURE:g}"),
        ("README.md", f"`--model-set NAME:attempts=N`; default {limits['attempts'].default})"),
        ("README.md", f"(at most {FIRST_PROMPT_MAX_CHARS:,} characters)"),
        ("README.md", f"keep their first and last {LOG_HEAD_BYTES // 1024} KiB"),
        ("docs/pipeline.md", f"by the store ({attempts} tries over about 45 s)"),
        ("docs/pipeline.md", f"`BUGSWEEP_STORE_ATTEMPTS` tries per call (default {attempts})"),
        ("docs/pipeline.md", f"`LLM_MAX_RETRIES` retries per request (default "
                             f"{ModelSettings.model_fields['max_retries'].default})"),
        ("docs/pipeline.md", f"`Retry-After` (at most {MAX_RETRY_AFTER_S:g} s)"),
        ("docs/pipeline.md", f"| {STEP_OPTIONS['setup']['retries']} retries, after {delays[0]} s and {delays[1]} s "
                             "(`BUGSWEEP_RETRY_DELAYS_S`)"),
        ("docs/pipeline.md", f"| {STEP_OPTIONS['baseline']['retries']} retry, after {delays[0]} s |"),
        ("docs/pipeline.md", f"| {STEP_OPTIONS['sandbox']['retries']} retries, after {delays[0]} s and {delays[1]} s "
                             "| the attempts made before it"),
        ("docs/pipeline.md", f"(the core's own limit plus {TIMEOUT_MARGIN_S:g} s:"),
        ("docs/pipeline.md", f"Flow runs send a heartbeat every {HEARTBEAT_S} s"),
        ("docs/pipeline.md", f"silent for {words[MISSED_HEARTBEATS]} heartbeats ({MISSED_HEARTBEATS * HEARTBEAT_S} s)"),
        ("docs/pipeline.md", f"after {MISSED_HEARTBEATS} missed heartbeats ({HEARTBEAT_S} s each)"),
        ("docs/pipeline.md", f"| {words[CRASH_RERUNS]} (`CRASH_RERUNS`);"),
        ("docs/pipeline.md", f"waits up to {RERUN_GRACE_S:g} s for the rerun"),
        ("docs/pipeline.md", f"is scheduled again, {RERUN_AFTER_S} s later"),
        ("docs/pipeline.md", f"wait `BUGSWEEP_RETRY_DELAYS_S` seconds (default `{','.join(delays)}`)"),
        ("docs/pipeline.md", f"ask the server for new runs every {WORKER_QUERY_S} s"),
        ("docs/pipeline.md", f"for `LLM_OUTAGE_WAIT_S` seconds from the first refusal (default "
                             f"{model['outage_wait_s'].default:g})"),
        ("docs/pipeline.md", f"a comparison entry's; default {model['max_concurrent_requests'].default}; 0: no limit"),
        ("docs/pipeline.md", f"a slot is leased for {LEASE_S:g} s"),
        ("docs/pipeline.md", f"(`BUGSWEEP_MODEL_N_PARALLEL`, {EmbeddedSettings.model_fields['n_parallel'].default})"),
    ]  # fmt: skip


def default_retry_delays() -> list[float]:
    import os

    from tasks.steps import retry_delays_s

    saved = os.environ.pop("BUGSWEEP_RETRY_DELAYS_S", None)
    try:
        return retry_delays_s()
    finally:
        if saved is not None:
            os.environ["BUGSWEEP_RETRY_DELAYS_S"] = saved


def test_the_numbers_the_docs_quote_are_the_codes() -> None:
    """Each phrase is written from the constant the code uses: change the constant, and the doc must follow."""
    missing = [
        f"{doc} should say: {phrase}"
        for doc, phrase in quoted_numbers()
        if phrase not in text_of(PROJECT / doc)
    ]
    assert not missing, "\n".join(missing)
