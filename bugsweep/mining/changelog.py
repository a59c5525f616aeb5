"""What a commit's changelog entries say it is (a fix, a feature, a removal), from text alone: towncrier-style
fragments by their type, reno notes by their sections, and the lines added to a CHANGES / CHANGELOG / NEWS / HISTORY
file by their first word or the section heading they sit under (Markdown or reStructuredText). Used by change.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import PurePosixPath

#: Folders of changelog fragments (towncrier and the like) and the fragment types, by the kind they say.
FRAGMENT_DIRS = {
    "changelog",
    "changelog.d",
    "changes",
    "changes.d",
    "newsfragments",
    "news",
    "news.d",
    "towncrier",
}
FRAGMENT_KINDS = {
    "bugfix": "fix", "bugfixes": "fix", "fix": "fix", "fixes": "fix", "fixed": "fix", "bug": "fix",
    "feature": "feature", "features": "feature", "added": "feature", "enhancement": "feature",
    "removal": "removal", "removed": "removal", "deprecation": "removal", "breaking": "removal",
}  # fmt: skip
#: Files whose added lines are changelog entries ("- Fixed ...", "* Added ...").
CHANGELOG_NAME = re.compile(r"^(changes|changelog|news|history|releases?|versions)(\.\w+)?$", re.IGNORECASE)
#: The first word of a changelog entry, by the kind it says.
ENTRY_KIND = re.compile(
    r"^\s*(?:[-*+]|\d+\.)\s+(?:\*\*|`)?(?:(?P<fix>fix(es|ed)?|bug\s?fix(es)?|corrected|resolved)|"
    r"(?P<feature>add(s|ed)?|new|support(s|ed)?|implement(s|ed)?|introduced?|allow(s|ed)?)|"
    r"(?P<removal>removed?|drop(s|ped)?))\b",
    re.IGNORECASE,
)
#: Keep-a-changelog section headings among the added lines.
SECTION_KIND = re.compile(
    r"^\s*#+\s*(?:(?P<fix>fixed|bug\s?fixes)|(?P<feature>added)|(?P<removal>removed|deprecated))\b", re.I
)
#: A changelog's section headings (Markdown `## Fixed`, or reStructuredText underlined), by the kind they say:
#: an entry added under one is of that kind ("Deprecations" / "* :gh:`160`: max_ver, min_ver").
HEADING_KIND = re.compile(
    r"^(?:(?P<fix>bug\s?-?fix(es)?|fixe[sd]|bugs(\s+fixed)?)|(?P<feature>(new\s+)?features?|added|additions|"
    r"enhancements?|new)|(?P<removal>removals?|removed|deprecations?|deprecated|breaking(\s+changes)?))\s*:?$",
    re.IGNORECASE,
)
MARKDOWN_HEADING = re.compile(r"^\s*#+\s+(?P<title>.*?)\s*#*\s*$")
#: A short plain line standing alone between blank lines that titles the list under it ("Bug fixes:", "New
#: features:" in h11's changes.rst; "Bug Fixes", "Enhancements:" in sqlparse's CHANGELOG).
LABEL_HEADING = re.compile(r"^(?P<title>[A-Za-z][\w ,&/'-]{0,40}?):?\s*$")
RST_UNDERLINE = re.compile(r"^([=\-~^*+#\"'`])\1{2,}\s*$")
HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(?P<start>\d+)(?:,(?P<count>\d+))? @@")


def is_changelog(path: str) -> bool:
    p = PurePosixPath(path)
    if len(p.parts) > 1 and p.parts[-2].lower() in FRAGMENT_DIRS:
        return True
    if len(p.parts) > 2 and p.parts[-3:-1] == ("releasenotes", "notes"):
        return True
    return bool(CHANGELOG_NAME.match(p.name))


def changelog_kinds(path: str, new_text: Callable[[], str], diff_u0: Callable[[], str]) -> set[str]:
    """What a changed changelog file says the change is: a fragment's type, a reno note's sections, or the first
    words of the entries it adds and the section headings they sit under. `new_text` gives the file at the commit,
    `diff_u0` its diff against the parent without context (`git diff -U0`); each is read only when needed."""
    p = PurePosixPath(path)
    if len(p.parts) > 1 and p.parts[-2].lower() in FRAGMENT_DIRS:
        typed = {FRAGMENT_KINDS[part.lower()] for part in p.name.split(".") if part.lower() in FRAGMENT_KINDS}
        if typed:
            return typed
    if p.parts[-3:-1] == ("releasenotes", "notes"):
        text = new_text()
        notes = set(re.findall(r"^(\w+):", text, re.MULTILINE))
        return {kind for key, kind in (("fixes", "fix"), ("features", "feature"), ("deprecations", "removal"),
                                       ("upgrade", "removal")) if key in notes}  # fmt: skip
    kinds: set[str] = set()
    # each added line's number (from 1) in the new file -> the kinds its first word says
    entries: dict[int, set[str]] = {}
    for line in diff_u0().splitlines():
        if hunk := HUNK.match(line):
            number = int(hunk["start"])
            continue
        if not line.startswith("+") or line.startswith("+++"):
            continue
        if line[1:].strip():
            entries[number] = _kinds(ENTRY_KIND.match(line[1:]))
        number += 1
        kinds |= _kinds(SECTION_KIND.match(line[1:]))
    if entries:
        sections = _section_kinds(new_text().splitlines(), list(entries))
        # the section an entry sits under and its first word both say (an "Allow ..." under "Bug fixes:" says two
        # kinds, and the screen then judges by the rest: taking the section's word alone kept 2 more fixes and 3
        # more not-fixes or borderline commits over the labelled sets, bench/README.md)
        for number, said in entries.items():
            kinds |= sections.get(number, set()) | said
    return kinds


def _section_kinds(lines: list[str], added: list[int]) -> dict[int, set[str]]:
    """The kinds the section headings say that the added lines (numbers from 1) of a changelog fall under, by line
    (lines under no heading that says a kind are left out)."""
    heading_at: dict[int, str] = {}  # line index -> the heading's title
    for index, line in enumerate(lines):
        if found := MARKDOWN_HEADING.match(line) or _label_heading(lines, index):
            heading_at[index] = found["title"]
        elif index and RST_UNDERLINE.match(line) and lines[index - 1].strip():
            heading_at[index - 1] = lines[index - 1].strip()
            heading_at[index] = ""  # the underline itself
    kinds: dict[int, set[str]] = {}
    for number in added:
        index = number - 1
        if index in heading_at or index >= len(lines):
            continue
        title = next((heading_at[i] for i in range(index - 1, -1, -1) if heading_at.get(i)), None)
        if title is not None and (said := _kinds(HEADING_KIND.match(title.strip().strip("*_`")))):
            kinds[number] = said
    return kinds


def _kinds(found: re.Match[str] | None) -> set[str]:
    """The kinds a match of ENTRY_KIND, SECTION_KIND or HEADING_KIND says: its named groups that matched."""
    return {kind for kind, word in found.groupdict().items() if word} if found else set()


def _label_heading(lines: list[str], index: int) -> re.Match[str] | None:
    """LABEL_HEADING at `index`, when the lines around it are blank (a title, not a line of an entry's text)."""
    if (index and lines[index - 1].strip()) or (index + 1 < len(lines) and lines[index + 1].strip()):
        return None
    return LABEL_HEADING.match(lines[index])
