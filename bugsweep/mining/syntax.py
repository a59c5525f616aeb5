"""Python newer than the running interpreter, read by the screen.

bugsweep runs on Python 3.11; a project that requires 3.12 or later writes type parameters (PEP 695:
`def first[T](items: list[T]) -> T`, `class Box[T: Number]:`, `type Vector = list[float]`), which 3.11's parser
refuses, and the screen would read such a change by its words alone (issue 37: 13 of the 23 tasks of hgrecco/pint
kept in held-out-32 were read so). The type parameters only serve type checkers, which the screen sets aside
anyway, so they are blanked out (lines and columns kept) and the rest parsed as 3.11 reads it. Other newer syntax
(3.12's f-strings nesting their own quotes, 3.14's template strings) still does not parse: the file stays unread.
"""

from __future__ import annotations

import ast
import io
import tokenize
import warnings

_OPENING, _CLOSING = "([{", ")]}"
_STATEMENT_ENDS = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)


def parse_newer(text: str) -> ast.Module:
    """`ast.parse(text)`, or, where the running Python refuses it, the text with its type parameter lists and
    `type` statements written as Python 3.11 reads them (`without_type_parameters`). Raises SyntaxError (or
    ValueError) when that does not parse either. The parser's warnings about the project's code ("invalid escape
    sequence", "invalid decimal literal") are not printed: they are about the project, not bugsweep."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return ast.parse(text)
        except SyntaxError as refused:
            plainer = without_type_parameters(text)
            if plainer == text:
                raise
            try:
                return ast.parse(plainer)
            except SyntaxError:
                raise refused from None


def without_type_parameters(text: str) -> str:
    """`text` with each type parameter list (`[T, U: int]` after a `def` or `class` name, or a `type` alias's name)
    blanked and each `type X = ...` statement written `X: TypeAlias = ...` (what the screen reads as a type alias),
    every line where it was. Text that Python 3.11 cannot tokenize comes back unchanged."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, int, str]] = []  # (row, column, end column, what replaces it)
    previous: tokenize.TokenInfo | None = None  # the token before, comments and blank lines set aside
    for i, token in enumerate(tokens):
        if token.type in (tokenize.NL, tokenize.COMMENT):
            continue
        at_start = previous is None or previous.type in _STATEMENT_ENDS or previous.string == ";"
        previous, named = token, tokens[i + 1] if i + 1 < len(tokens) else None
        if not named or named.type != tokenize.NAME:
            continue
        if token.string in ("def", "class"):
            _blank_brackets(tokens, i + 2, lines, edits)
        elif at_start and token.string == "type":  # `type` is a keyword only as a statement's first word
            after = _blank_brackets(tokens, i + 2, lines, edits)
            if after < len(tokens) and tokens[after].string == "=":
                edits.append((*token.start, named.start[1], ""))
                edits.append((*tokens[after].start, tokens[after].start[1], ": TypeAlias "))
    for row, col, end_col, replacement in sorted(edits, reverse=True):
        line = lines[row - 1]
        lines[row - 1] = line[:col] + replacement + line[end_col:]
    return "".join(lines)


def _blank_brackets(
    tokens: list[tokenize.TokenInfo], i: int, lines: list[str], edits: list[tuple[int, int, int, str]]
) -> int:
    """Blank the `[...]` that opens at token `i`, if one does (a list over several lines: each of its lines but the
    last ends in a backslash); the index of the token after it (or `i`)."""
    if i >= len(tokens) or tokens[i].string != "[":
        return i
    depth = 0
    for j in range(i, len(tokens)):
        depth += (tokens[j].string in _OPENING) - (tokens[j].string in _CLOSING)
        if depth == 0:
            (row, col), (end_row, end_col) = tokens[i].start, tokens[j].end
            for r in range(row, end_row):
                end = len(lines[r - 1].rstrip("\r\n"))
                edits.append(
                    (r, col if r == row else 0, end, " " * max(end - (col if r == row else 0) - 1, 0) + "\\")
                )
            edits.append(
                (
                    end_row,
                    col if end_row == row else 0,
                    end_col,
                    " " * (end_col - (col if end_row == row else 0)),
                )
            )
            return j + 1
    return len(tokens)
