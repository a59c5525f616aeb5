"""Whole-function edits (bugsweep/agent/rewrite.py): finding the function an edit lands in, reading the function
out of a model's reply, and putting it in its place. Pure text in, text out: no model, no sandbox."""

from __future__ import annotations

import textwrap

import pytest

from bugsweep.agent.rewrite import (
    RewriteError,
    called_functions,
    code_blocks,
    current_span,
    enclosing_function,
    function_from_reply,
    function_meant,
    keep_docstring,
    splice,
)

SOURCE = textwrap.dedent(
    '''\
    """Shapes."""
    import functools

    SIDES = 4


    @functools.cache
    def area(w, h):
        """Area of a rectangle."""
        return w + h


    class Square:
        side = 1

        def perimeter(self):
            def double(x):
                return x * 2
            return double(self.side) * 3
    '''
)


def span_of(text: str, source: str = SOURCE):
    start = source.index(text)
    return enclosing_function(source, "shapes.py", start, start + len(text))


def test_an_edit_inside_a_function_names_the_whole_function_with_its_decorators() -> None:
    span = span_of("return w + h")
    assert span is not None
    assert (span.name, span.first, span.last, span.indent) == ("area", 7, 10, "")
    assert span.source.startswith("@functools.cache\ndef area(w, h):") and span.source.endswith(
        "return w + h"
    )


def test_the_innermost_function_is_chosen_and_a_method_keeps_its_indentation() -> None:
    inner = span_of("return x * 2")
    method = span_of("return double(self.side) * 3")
    assert inner is not None and (inner.name, inner.indent) == ("double", " " * 8)
    assert method is not None and (method.name, method.first, method.last, method.indent) == (
        "perimeter",
        16,
        19,
        " " * 4,
    )


@pytest.mark.parametrize(
    "text", ["SIDES = 4", "side = 1", "import functools", "return w + h\n\n\nclass Square:"]
)
def test_text_outside_one_function_is_not_a_whole_function_edit(text: str) -> None:
    assert span_of(text) is None


def test_long_functions_and_broken_files_are_edited_as_sent() -> None:
    start = SOURCE.index("return w + h")
    assert enclosing_function(SOURCE, "shapes.py", start, start + 3, max_lines=3) is None
    broken = SOURCE.replace("def area(w, h):", "def area(w, h)")
    start = broken.index("return w + h")
    assert enclosing_function(broken, "shapes.py", start, start + 3) is None


def test_code_blocks_accept_a_missing_closing_fence_at_the_end() -> None:
    """llama.cpp's tool-call parser can drop the closing fence of a reply's last block."""
    reply = "Here:\n```python\ndef f():\n    return 1\n```\nand\n```py\ndef g():\n    return 2\n"
    assert code_blocks(reply) == ["def f():\n    return 1\n", "def g():\n    return 2\n"]
    assert code_blocks("no code here") == []


def test_only_the_named_function_is_taken_from_the_reply() -> None:
    reply = textwrap.dedent(
        """\
        The sum should be a product.
        ```python
        import functools

        @functools.cache
        def area(w, h):
            return w * h

        print(area(2, 3))
        ```
        """
    )
    assert function_from_reply(reply, "area") == "@functools.cache\ndef area(w, h):\n    return w * h"


def test_a_method_written_inside_its_class_or_indented_is_found() -> None:
    in_class = "```python\nclass Square:\n    def perimeter(self):\n        return self.side * 4\n```"
    indented = "```python\n    def perimeter(self):\n        return self.side * 4\n```"
    expected = "def perimeter(self):\n    return self.side * 4"
    assert function_from_reply(in_class, "perimeter") == expected
    assert function_from_reply(indented, "perimeter") == expected


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("I would multiply.", "no ```python code block"),
        (
            "```python\ndef volume(w, h, d):\n    return w * h * d\n```",
            "no code block in your reply defines area",
        ),
        ("```python\ndef area(w, h)\n    return w * h\n```", "not valid Python (line 1"),
    ],
)
def test_an_unusable_reply_says_what_is_wrong(reply: str, problem: str) -> None:
    with pytest.raises(RewriteError, match=problem.replace("(", r"\(")):
        function_from_reply(reply, "area")


def test_splice_replaces_exactly_the_function_lines_at_their_indentation() -> None:
    method = span_of("return double(self.side) * 3")
    assert method is not None
    updated = splice(SOURCE, method, "def perimeter(self):\n\n    return self.side * 4\n")
    assert updated == SOURCE.replace(
        "    def perimeter(self):\n        def double(x):\n            return x * 2\n"
        "        return double(self.side) * 3\n",
        "    def perimeter(self):\n\n        return self.side * 4\n",
    )
    compile(updated, "shapes.py", "exec")


def test_the_function_is_found_again_after_the_file_moved() -> None:
    span = span_of("return w + h")
    assert span is not None
    moved = SOURCE.replace('"""Shapes."""\n', '"""Shapes."""\n# a new comment\n# and another\n')
    again = current_span(moved, span)
    assert again is not None and (again.first, again.last) == (span.first + 2, span.last + 2)
    assert current_span(SOURCE.replace("def area", "def surface"), span) is None


def test_called_functions_are_the_functions_of_the_file_that_the_body_calls_in_file_order() -> None:
    source = textwrap.dedent(
        '''\
        def total(items):
            """Uses helper() in its docstring only."""
            return sum(price(i) for i in items) + self_tax.rate(items)


        def helper():
            return 1


        def rate(items):
            return 0


        def price(item):
            return item
        '''
    )
    start = source.index("return sum")
    span = enclosing_function(source, "cart.py", start, start + 1)
    assert span is not None
    assert [(f.name, f.first) for f in called_functions(source, span)] == [("rate", 10), ("price", 14)]
    assert called_functions(source, span, max_lines=1) == []


# -- the function an edit means when its `old` matches no single place ------------------------------------------

DATES = textwrap.dedent(
    '''\
    def is_leap_year(year):
        """Divisible by 4, except by 100 unless also by 400."""
        return year % 4 == 0


    def days_in_month(year, month):
        if month == 2 and is_leap_year(year):
            return 29
        return 30
    '''
)


@pytest.mark.parametrize(
    ("old", "found_nowhere", "meant"),
    [
        # The three `old`s the 1.5B model sent for dates.py before it had read it (trajectory of 2026-12-01):
        ("is_leap_year", False, "is_leap_year"),  # the name alone: the def and a call, found twice
        ("if year % 400 == 0 or (year % 4 == 0 and year % 100 != 0):", True, "is_leap_year"),  # imagined
        (
            'def is_leap_year(year):\n    """Divisible by 4."""\n    return year % 4 == 0\n\n\ndef days_in_month(',
            True,
            "is_leap_year",
        ),  # the function copied with a changed docstring
        ("return month + 30", True, "days_in_month"),  # its words are only there
        ("return 30", True, None),  # too few words to tell
        ("year, 29, 400", True, None),  # two thirds of its words in each function: a tie
        ("if year % 400 == 0:", False, None),  # found twice and naming no function: only a match would tell
        ("def nowhere(x):\n    return x", True, None),  # a function the file does not have
    ],
)
def test_the_function_an_unmatched_old_means(old: str, found_nowhere: bool, meant: str | None) -> None:
    span = function_meant(DATES, "dates.py", old, found_nowhere=found_nowhere)
    assert (span.name if span else None) == meant


def test_a_function_defined_twice_is_never_guessed() -> None:
    twice = DATES + "\n\ndef is_leap_year(year):\n    return False\n"
    assert function_meant(twice, "dates.py", "is_leap_year", found_nowhere=False) is None


def test_a_function_written_without_its_docstring_keeps_the_original_one() -> None:
    """Seen on the 1.5B model: the right code without the docstring it had; the patch deleted the docstring."""
    original = (
        "    def leap(self, year: int) -> bool:\n"
        '        """True in a leap year.\n\n        Not every fourth year.\n        """\n'
        "        return year % 4 == 0\n"
    )
    fixed = "def leap(self, year):\n    if year % 100 == 0:\n        return year % 400 == 0\n    return year % 4 == 0"
    assert keep_docstring(original, fixed) == (
        "def leap(self, year: int) -> bool:\n"
        '    """True in a leap year.\n\n    Not every fourth year.\n    """\n'
        "    if year % 100 == 0:\n        return year % 400 == 0\n    return year % 4 == 0"
    )
    with_own = 'def leap(self, year):\n    """Mine."""\n    return False'
    assert keep_docstring(original, with_own) == with_own.replace("year)", "year: int) -> bool"), (
        "its own kept"
    )
    assert keep_docstring("def leap(year):\n    return 1\n", fixed) == fixed, "no docstring to keep"
    assert keep_docstring(original, "def leap(year): return 1") == "def leap(year): return 1"


def test_a_function_written_without_its_annotations_keeps_the_original_signature() -> None:
    """Seen on the 1.5B model: `def is_leap_year(year):` for `def is_leap_year(year: int) -> bool:`."""
    original = (
        'def leap(year: int, *, strict: bool = False) -> bool:\n    """Doc."""\n    return year % 4 == 0\n'
    )
    fixed = "def leap(year, *, strict=False):\n    return year % 4 == 0 and year % 100 != 0"
    assert keep_docstring(original, fixed) == (
        'def leap(year: int, *, strict: bool = False) -> bool:\n    """Doc."""\n'
        "    return year % 4 == 0 and year % 100 != 0"
    )
    for changed in (
        "def leap(year, strict=False):\n    return 1",  # strict is no longer keyword-only
        "def leap(year, *, strict=True):\n    return 1",  # another default
        "def leap(y, *, strict=False):\n    return 1",  # another name
        "def leap(year: int, *, strict=False):\n    return 1",  # annotated by the model
    ):
        assert keep_docstring(original, changed).startswith(changed.split("\n")[0]), changed
