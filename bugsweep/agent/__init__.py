"""The agent: a model that fixes a bug by calling four tools in a sandbox.

- prompts.py: every text the model reads (system prompt, error messages, the nudge); tool_specs.py: the four tools
  declared once (names, descriptions, arguments).
- tools.py: run, read_file, edit_file, finish, on the sandbox interface; text.py: their pure text helpers.
- model.py: the OpenAI-compatible client (retries, errors, usage, tool calls recovered from text).
- loop.py: `run_agent`, the loop with its budgets and stop reasons; types.py its small types; conversation.py the
  messages, the record and the progress events of a run; history.py how the history is kept and shortened.
- policy.py: the contract of a policy (what the harness does for the model beyond the loop) and `plain`;
  small_model/: the `small-model` policy (one part per file), with rewrite.py (whole-function edits) and focus.py.
- trajectory.py: the record of a run, saved after every step.
"""
