"""The `small-model` policy: the help a small open model needs, measured on the embedded Qwen2.5-Coder-1.5B.

With it the embedded model resolved the demo 5 of 5 times (bench/README.md, "whole-function edits"); without it
(the `plain` policy) 0 of 2. What it does, each change seen in that model's trajectories:
- Whole-function edits (whole_function.py, with rewrite.py): an edit_file call that lands inside one Python
  function is first tried as sent and kept when the task's tests pass with it (tried.py); otherwise it is undone,
  the call leaves the conversation, and the model is asked for the whole corrected function as a ```python block
  (shown with what the failing tests say: focus.failure_digest), which then replaces the function. A function
  written back unchanged moves the request to the one function of the file that it calls.
  An edit_file call whose `old` matches no single place but clearly means one function (it defines it, names it,
  or, found nowhere, is mostly that function's words: rewrite.function_meant) is answered the same way (seen:
  "old text not found" again and again on unread files, in the demo and on real bugs).
  So is an edit_file call that changes nothing (`new` equal to `old`) inside one function, once per function
  (seen on real bugs: the same region of the right file sent back unchanged, turn after turn).
  An answer that leaves the task's tests failing is followed by up to `rewrite_samples` answers to the same request
  at temperature 0.8 (each a turn), each tried against the tests; the first they pass with is kept (seen on real
  bugs: at temperature 0 the function came back unchanged, a sample at 0.8 wrote the fix).
- A function written whole gets back the docstring and annotated signature it left out (rewrite.keep_docstring).
- A failed edit_file call leaves the conversation: the reply and its result are replaced by one note saying what
  went wrong (once a wrong `old` is in the history, the model sends it again and again).
- A read_file or edit_file call that fails exactly as an identical earlier call did is told so.
- A read_file with a range of a file that fits is shown whole (seen: one line read, then an edit made blind).
On real repositories (bench/README.md, "Real bugs"), also:
- A small first prompt: the failing tests, how they fail, the files their traceback names and the files that
  define what the failing tests import, instead of the
  repository's file list (thousands of tokens on a real project: minutes on two cores before the first reply);
  bounded by focus.FIRST_PROMPT_MAX_CHARS whatever the repository's size.
- Test output focused on failures: a `run` whose output has pytest's FAILURES/ERRORS section comes back as that
  section and the short summary, without the progress dots of the passing tests.
- A `run` of the same command as before is answered with what is new in its output since then, or that nothing
  is (seen: the same `python -m pytest tests` eight times in a row until the context was full). A failing test run
  repeated with nothing changed is followed by a request for the function where its traceback ends, when that is
  code under test and was not asked for before (seen: the same run ten times in a row despite that note).
- An edit_file call on a file the model never read that finds no match gets the region of the file that best
  matches its `old`, with more context than usual (seen: three "old text not found" in a row on an unread file).
- Within an 8k window, the failing assertion is never lost: it is in the first message, which the loop's
  context-length shortening never elides (only old tool outputs go).
Every change is recorded in the trajectory (first_prompt_focused, run_focused, rewrite_requested, edit_tried,
rewrite_sampled, model_sample, forgotten, unread_file_region, read_whole events and the messages).

Removed after plain and small-model were run side by side on 10 real mined tasks (bench/README.md, "plain vs
small-model" and "the parts that changed nothing"), where none of them changed an outcome: the first finish refused
while the tests fail, a reply's code block tried in place of a function, loose and normalised `old` matches
applied, `old` found in other files (and the definitions of what a copied test line calls), the refusal of a test
file naming the code under test, and outlines of long files.

The parts, each small enough to read on its own:
- policy.py: `SmallModelPolicy`, what it keeps of a run and which part each hook calls.
- whole_function.py: the whole-function requests and their answers (rewrite.py parses and splices functions).
- tried.py: an edit inside one function tried against the task's tests.
- repeats.py: failed edits taken out of the conversation, repeats said to be repeats, test output focused.
- tool_help.py: help with the plain tools' answers (an unread file's region, whole short files).
- lookups.py: the code under test a test imports (for the first prompt); common.py: what the parts share.
Its model-facing text is in prompts.py with the rest; focus.py holds the pure text helpers for real repositories.
"""

from bugsweep.agent.small_model.policy import SmallModelPolicy

__all__ = ["SmallModelPolicy"]
