"""The cut rules for editor completions, fed text the way a model streams it (a few characters at a time)."""

from __future__ import annotations

import pytest

from lingcode.completion.cuts import CutRules


def cut(prefix: str, suffix: str, generated: str, step: int = 3, **kwargs) -> tuple[str, str | None]:
    """What the rules let through of `generated`, and why they stopped (None: the model stopped)."""
    rules = CutRules(prefix, suffix, **kwargs)
    out = ""
    for i in range(0, len(generated), step):
        text, done = rules.feed(generated[i : i + step])
        out += text
        if done:
            return out, rules.reason
    return out + rules.flush(), rules.reason


def test_mid_line_is_one_line_without_repeating_the_rest_of_the_line():
    assert cut("total = add(", ")\nprint(total)\n", "a, b)\nprint(total)\n") == ("a, b", "newline")


def test_at_the_end_of_a_line_a_block_ends_where_its_indentation_does():
    body = "\n    x = 1\n    return x\n\ndef other():\n    pass\n"
    assert cut("def f():", "\n", body) == ("\n    x = 1\n    return x", "indent")


def test_a_blank_cursor_line_below_an_opener_belongs_to_that_block():
    assert cut("def f():\n    ", "", "x = 1\n    return x\n\nclass A:\n") == ("x = 1\n    return x", "indent")
    assert cut("def f():\n", "", "    x = 1\ndef g():\n") == ("    x = 1", "indent")


def test_a_closing_bracket_at_the_openers_indentation_is_the_blocks_last_line():
    assert cut("  if (x) {", "", "\n    y();\n  }\n  z();\n") == ("\n    y();\n  }", "block_end")


def test_a_line_that_is_already_below_the_cursor_is_not_written_again():
    assert cut("def f(a):\n    ", "\n    return a\n", "a += 1\n    return a\n") == ("a += 1", "suffix")
    assert cut("if (x) {", "\n}\n", "\n    y();\n}\n") == ("\n    y();", "suffix")


def test_after_the_time_budget_the_line_being_written_is_the_last():
    now = [0.0]
    rules = CutRules("def f(a):\n    ", "", time_budget_ms=100, clock=lambda: now[0])
    assert rules.feed("a += 1\n") == ("a += 1", False)  # within the budget: goes on
    now[0] = 0.2
    assert rules.feed("    b = 2") == ("", False)  # the budget is spent mid-line: the line is finished
    assert rules.feed("\n    c = 3\n") == ("\n    b = 2", True)
    assert rules.reason == "time_budget"


def test_text_is_released_only_once_no_rule_can_take_it_back():
    rules = CutRules("def f():", "", multiline=True)
    assert rules.feed("\n    x = 1") == ("", False)  # an unfinished line could still be cut
    assert rules.feed("\n") == ("\n    x = 1", False)
    assert rules.feed("\n\n") == ("", False)  # blank lines are held: they may be trailing
    assert rules.feed("    y = 2\nz") == ("\n\n\n    y = 2", False)
    assert rules.feed("\n") == ("", True) and rules.reason == "indent"


def test_trailing_blanks_are_not_part_of_a_suggestion_and_the_last_line_is_kept():
    assert cut("x = ", "", "1   \n\n\n") == ("1", None)
    assert cut("", "", "import os\nimport s") == ("import os\nimport s", None)


@pytest.mark.parametrize("multiline, expected", [(False, ("a", "newline")), (True, ("a\nb", None))])
def test_the_caller_can_force_one_line_or_a_block(multiline, expected):
    assert cut("x = ", "", "a\nb", multiline=multiline) == expected


def test_an_empty_first_line_mid_line_is_an_empty_suggestion():
    assert cut("foo(", ")\n", "\n    bar") == ("", "newline")


@pytest.mark.parametrize(
    ("prefix", "suffix", "written", "expected"),
    [
        ("def f(s):\n    ", "", "\n    return s", "return s"),  # the cursor's indentation, written again
        ("def f(s):\n    ", "", "\n        return s", "    return s"),  # deeper: the extra is kept
        ("def f(s):\n        ", "", "\n    return s", "return s"),  # shallower: at the cursor
        ("def f(s):\n\n    ", "", "\n    return s", "return s"),  # a blank line the model left out
        ("x = 1\n    ", "", "\n\n    y = 2", "\n    y = 2"),  # a line break more than the cursor has
        ("func f() {\n\t", "", "\n\treturn 1", "return 1"),  # tabs
        ("x = foo(a, ", ")\n", " b", "b"),  # mid-line: the space after the comma
        ("x = foo(a,", ")\n", " b", " b"),  # no whitespace at the cursor: nothing to take off
    ],
)
def test_a_suggestion_never_repeats_the_whitespace_the_line_has(prefix, suffix, written, expected):
    cut = CutRules(prefix, suffix, multiline=True)
    out = "".join(cut.feed(piece)[0] for piece in written)  # a character at a time, as tokens arrive
    assert out + cut.flush() == expected
