"""Policies: named, recorded variants of what the harness does for the model.

The loop (loop.py) is the same for every model: ask the model, run its tool calls, append the results, enforce the
budgets. Anything beyond that which changes what the model sees or what the harness does on its behalf (help for
weak models: whole-function rewrites, trying an edit against the tests, dropping failed edits from the history,
saying that a call failed the same way before) lives in a policy. A policy is chosen by configuration
(`--policy`, `BUGSWEEP_POLICY`, `AgentSettings.policy`), never by a model's name; unset, it is the embedded
model's own (`small-model`, bugsweep.embedded.ModelSpec.policy), else `plain` (bugsweep.runconfig.resolve_policy,
the one place that decides). Its name is written into the
trajectory (the `meta` event), grade.json (`policy`), the run summary and every comparison report, so a comparison
can tell whether two models ran under the same harness.

Policies:
- `plain` (this base class): every hook does nothing; the plain seed loop with its plain tools (tools.py:
  edit_file replaces exactly one exact occurrence and otherwise says precisely why not, read_file shows what it is
  asked for, every mistake is a message). Any help beyond that (whole-function edits, focused prompts, whole reads)
  is a policy's.
- `small-model` (small_model/): the help the embedded 1.5B model needs to resolve the demo (bench/README.md).

The contract. A policy is one object per run (it may keep state), a subclass of `Policy` with a unique `name`,
registered in POLICIES. The loop calls it at four hooks, always in the loop's own thread:
- `start(run)`: once, after the system prompt and the first user message are in `run.messages`, before the first
  request. It may replace those messages (nothing has been sent yet).
- `before_request(run)`: before each model request, after the budgets were checked. It may change the newest
  messages; it should leave older ones alone, so that the server's prompt cache keeps the shared prefix.
- `after_reply(run, reply) -> bool`: after a reply is counted, recorded in the trajectory and appended to
  `run.messages`, before its tool calls run. Return True when the policy has dealt with the reply itself (the
  loop then runs none of its tool calls and the turn is over); False to let the loop run them as usual.
- `after_tool(run, call, outcome) -> ToolOutcome`: after one tool call ran, before its result is recorded and
  appended. Return the outcome to use (the same one, or a replacement with other `content`).
What a policy may use of `run` (loop.AgentRun): `messages`, `toolbox`, `trajectory`, `settings`, `test_command`,
`turn`, and the methods `append`, `drop_messages_from`, `record_tool`, `emit`, `format_error` and `usable_reply`
(those of its conversation, conversation.py) and `sample` (one more reply to an earlier state of the
conversation).
Every change it makes to the conversation is recorded in the trajectory (an event of its own, or the messages it
appends), so what the model saw can always be rebuilt. A policy never decides the grade: grading happens after the
loop, outside the sandbox, the same for every policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from bugsweep.errors import ConfigError
from bugsweep.runconfig import DEFAULT_POLICY, POLICY_NAMES

if TYPE_CHECKING:
    from bugsweep.agent.loop import AgentRun
    from bugsweep.agent.model import ModelReply, ToolCall
    from bugsweep.agent.tools import ToolOutcome


class Policy:
    """The `plain` policy, and the base class of every other: hooks that do nothing."""

    name: ClassVar[str] = "plain"
    reads_short_files_whole: ClassVar[bool] = False
    """Whether read_file returns a short file whole whatever range is asked for (its description says which)."""

    def start(self, run: AgentRun) -> None:
        """Once, before the first request."""

    def before_request(self, run: AgentRun) -> None:
        """Before each request."""

    def after_reply(self, run: AgentRun, reply: ModelReply) -> bool:
        """After a reply is in the history; True when the policy has dealt with it (its tool calls do not run)."""
        return False

    def after_tool(self, run: AgentRun, call: ToolCall, outcome: ToolOutcome) -> ToolOutcome:
        """After one tool call ran, before its result is appended; returns the outcome to use."""
        return outcome


def policy_names() -> list[str]:
    return list(_registry())


def make_policy(name: str | None) -> Policy:
    """A fresh policy object for one run; None means the default (`plain`). Unknown names are a ConfigError."""
    registry = _registry()
    chosen = name or DEFAULT_POLICY
    if chosen not in registry:
        raise ConfigError(f"unknown policy {chosen!r}: choose one of {', '.join(registry)}")
    return registry[chosen]()


def _registry() -> dict[str, type[Policy]]:
    """Each name of runconfig.PolicyName (the one list of them), with its class."""
    from bugsweep.agent.small_model import SmallModelPolicy

    registry: dict[str, type[Policy]] = {Policy.name: Policy, SmallModelPolicy.name: SmallModelPolicy}
    return {name: registry[name] for name in POLICY_NAMES}
