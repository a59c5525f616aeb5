"""The agent: a model that fixes a bug by calling four tools in a sandbox.

- prompts.py: every text the model reads (system prompt, tool descriptions, error messages, the nudge).
- tools.py: run, read_file, edit_file, finish, on the sandbox interface.
- model.py: the OpenAI-compatible client (retries, errors, usage, tool calls recovered from text).
- loop.py: `run_agent`, the loop with its budgets and stop reasons.
- trajectory.py: the record of a run, saved after every step.
"""
