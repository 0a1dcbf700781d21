"""Regex front end: unsupported constructs and bad input raise errors naming what and where."""

from __future__ import annotations

import re

import pytest

from deepinfer.constraints.errors import ConstraintError, ConstraintTooComplex
from deepinfer.constraints.frontends.regex import regex_to_ir

# (pattern, construct named in the message, position)
UNSUPPORTED = [
    (r"(a)\1", "backreference", 3),
    (r"(?P<x>a)b(?P=x)", "backreference", 9),
    (r"\\1(a)\1", "backreference", 6),  # an escaped backslash before 1 is a literal
    (r"ab(?=c)", r"lookahead \(\?=", 2),
    (r"ab(?!c)", r"negative lookahead \(\?!", 2),
    (r"a(?<=a)b", r"lookbehind \(\?<=", 1),
    (r"a(?<!x)b", r"negative lookbehind \(\?<!", 1),
    (r"[(?=]a(?=b)", r"lookahead \(\?=", 6),
    (r"a\bb", r"word boundary \\b", 1),
    (r"a\Bb", r"word boundary \\B", 1),
    (r"[\b]x\b", r"word boundary \\b", 5),
    (r"(a)?(?(1)b|c)", r"conditional group", 4),
    (r"a^b", r"anchor \^ not at the start", 1),
    (r"(?m)a\n^b", r"anchor \^ not at the start", 7),
    (r"^a^b", r"anchor \^ not at the start", 2),
    # $ inside is refused only where a newline could follow (Python's $ before a final \n)
    (r"a$\n", r"anchor \$ not at the end", 1),
    (r"a$$\s", r"anchor \$ not at the end", 1),
    (r"(a$|b)[^x]", r"anchor \$ not at the end", 2),
    (r"a\Ab", r"anchor \\A not at the start", 1),
    (r"(^a)*", r"anchor \^ not at the start", 1),
    (r"a*+b", r"possessive quantifier", 1),
    (r"ab{1,2}+", r"possessive quantifier", 2),
    (r"(?>ab|a)b", r"atomic group", 0),
    ("(?x) a # (?=x)\n (?=y)", r"lookahead", 16),
]


@pytest.mark.parametrize("pattern,construct,position", UNSUPPORTED)
def test_regex_unsupported_construct(pattern: str, construct: str, position: int) -> None:
    re.compile(pattern)  # valid Python: refused because the IR cannot enforce it
    with pytest.raises(ConstraintError, match=rf"{construct}.*\(position {position}\)") as info:
        regex_to_ir(pattern)
    assert info.value.position == position
    assert pattern[position] in "(\\^$*+?{"


# (pattern, message fragment, position) for syntax errors: re's message and position
SYNTAX = [
    ("a(b", "missing \\), unterminated subpattern", 1),
    ("a)b", "unbalanced parenthesis", 1),
    ("[z-a]", "bad character range z-a", 1),
    ("*a", "nothing to repeat", 0),
    ("a**", "multiple repeat", 2),
    ("a{3,2}", "min repeat greater than max repeat", 2),
    ("[abc", "unterminated character set", 0),
    ("\\", "bad escape \\(end of pattern\\)", 0),
    ("\\q", "bad escape \\\\q", 0),
    ("(?P<1x>a)", "bad character in group name", 4),
    ("a(?i)b", "global flags not at the start", 1),
]


@pytest.mark.parametrize("pattern,message,position", SYNTAX)
def test_regex_syntax_error(pattern: str, message: str, position: int) -> None:
    with pytest.raises(re.error) as ref:
        re.compile(pattern)
    assert ref.value.pos == position
    with pytest.raises(ConstraintError, match=rf"invalid regex: {message}.*\(position {position}\)"):
        regex_to_ir(pattern)


@pytest.mark.parametrize(
    "pattern", ["a{100000}", "(?:ab){30000,}", "(?:a{1000}){1000}", "(?:x{300}|y){200}", r"\w{60000}"]
)
def test_regex_too_complex(pattern: str) -> None:
    with pytest.raises(
        ConstraintTooComplex, match=r"regex repeat \{[0-9,]+\} expands to .* character positions"
    ):
        regex_to_ir(pattern)


def test_regex_repeat_within_bound_is_fine() -> None:
    regex_to_ir(r"[^\"]{0,10000}")
    regex_to_ir(r"(?:\w{1,64}\.){1,100}")


def test_regex_bad_flags_and_types() -> None:
    with pytest.raises(ConstraintError, match="flags"):
        regex_to_ir("a", flags=re.LOCALE)
    with pytest.raises(ConstraintError, match="flags"):
        regex_to_ir("a", flags=re.ASCII | re.UNICODE)
    with pytest.raises(ConstraintError, match="must be a str"):
        regex_to_ir(b"a")  # type: ignore[arg-type]


def test_regex_deep_nesting_is_a_clear_error() -> None:
    with pytest.raises(ConstraintError):
        regex_to_ir("(" * 2000 + "a" + ")" * 2000)
