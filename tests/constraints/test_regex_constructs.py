"""Regex front end, construct by construct: (pattern, string, expected) tables.

Every expected value is checked against ``re.fullmatch`` (the oracle) and against the
IR, evaluated by the independent matcher in ``test_regex_oracle`` and, where the
automaton builder is present, by the compiled automaton too.
"""

from __future__ import annotations

import re

import pytest

from deepinfer.constraints.errors import ConstraintError
from deepinfer.constraints.frontends.regex import regex_to_ir
from deepinfer.constraints.ir import Grammar, size
from tests.constraints.test_regex_oracle import ir_accepts

I, S, X, A, M = re.IGNORECASE, re.DOTALL, re.VERBOSE, re.ASCII, re.MULTILINE

LITERALS = [
    ("abc", "abc", True),
    ("abc", "ab", False),
    ("abc", "abcd", False),
    ("", "", True),
    ("", "a", False),
    ("héllo", "héllo", True),
    ("héllo", "hello", False),
    ("日本語", "日本語", True),
    ("😀x", "😀x", True),
    ("😀x", "😁x", False),
    (r"a\.b", "a.b", True),
    (r"a\.b", "axb", False),
    (r"\(\)\[\]\{\}\*\+\?\|\^\$\\", "()[]{}*+?|^$\\", True),
]

ESCAPES = [
    (r"a\nb", "a\nb", True),
    (r"\t", "\t", True),
    (r"\r\f\v\a", "\r\f\v\a", True),
    (r"\x41", "A", True),
    (r"\x41", "a", False),
    (r"\u00e9", "é", True),
    (r"\u00e9", "e", False),
    (r"\U0001F600", "😀", True),
    (r"\N{GREEK SMALL LETTER ALPHA}", "α", True),
    (r"\101", "A", True),
    (r"\0", "\0", True),
]

CATEGORIES = [
    (r"\d", "7", True),
    (r"\d", "٣", True),  # ARABIC-INDIC DIGIT THREE (Nd)
    (r"\d", "²", False),  # superscript two: numeric, not decimal
    (r"\d", "a", False),
    (r"\D", "a", True),
    (r"\D", "5", False),
    (r"\D", "😀", True),
    (r"\w", "_", True),
    (r"\w", "é", True),
    (r"\w", "字", True),
    (r"\w", "²", True),  # isalnum() via isdigit
    (r"\w", "-", False),
    (r"\w", " ", False),
    (r"\w", "😀", False),
    (r"\W", "😀", True),
    (r"\W", "a", False),
    (r"\s", " ", True),
    (r"\s", "\u00a0", True),  # NO-BREAK SPACE
    (r"\s", "\u3000", True),
    (r"\s", "\x1c", True),  # re treats the file separator as whitespace
    (r"\s", "\u200b", False),  # zero width space is not
    (r"\S", "x", True),
    (r"\S", "\n", False),
    (r"\w+", "abc_123", True),
    (r"\w+", "abc-123", False),
    (r"(?a)\d", "٣", False),
    (r"(?a)\w", "é", False),
    (r"(?a)\w", "a", True),
    (r"(?a)\s", "\u00a0", False),
    (r"(?a)\W", "é", True),
]

CLASSES = [
    ("[abc]", "b", True),
    ("[abc]", "d", False),
    ("[a-z]", "m", True),
    ("[a-z]", "M", False),
    ("[^a-z]", "M", True),
    ("[^a-z]", "m", False),
    ("[^a-z]", "é", True),
    ("[^a-z]", "😀", True),
    ("[^a-z]", "\n", True),
    ("[^a]", "", False),
    ("[^a]", "bb", False),
    ("[α-ω]", "λ", True),
    ("[α-ω]", "a", False),
    ("[\u00e0-\U0001f600]", "😀", True),
    ("[\u00e0-\U0001f600]", "😁", False),
    ("[\u00e0-\U0001f600]", "\u07ff", True),
    ("[\u00e0-\U0001f600]", "\uffff", True),
    (r"[\d_]", "_", True),
    (r"[\d_]", "٣", True),
    (r"[^\d\s]", "a", True),
    (r"[^\d\s]", "5", False),
    (r"[^\d\s]", " ", False),
    (r"[^\W\d]", "a", True),
    (r"[^\W\d]", "5", False),
    (r"[\w-]", "-", True),
    (r"[]a]", "]", True),
    (r"[^]a]", "]", False),
    (r"[\]]", "]", True),
    (r"[.]", "x", False),
    (r'[^"\\]*', 'ab"', False),
    (r'[^"\\]*', "ab😀c", True),
]

DOT = [
    (".", "a", True),
    (".", "😀", True),
    (".", "\n", False),
    (".", "\r", True),
    (".", "", False),
    ("(?s).", "\n", True),
    ("a.c", "a\u20acc", True),
    (".*", "line\nline", False),
    ("(?s).*", "line\nline", True),
]

GROUPS_ALTERNATION = [
    ("(ab)+", "abab", True),
    ("(ab)+", "aba", False),
    ("(?:ab|cd)e", "cde", True),
    ("(?:ab|cd)e", "ace", False),
    ("(?P<word>[a-z]+)-(?P<n>\\d+)", "abc-42", True),
    ("(?P<word>[a-z]+)-(?P<n>\\d+)", "abc-", False),
    ("a|b|c", "c", True),
    ("a|b|c", "ab", False),
    ("ab|ac|ad", "ad", True),
    ("|a", "", True),
    ("a|", "", True),
    ("(|a)(b|)", "a", True),
    ("((a|b)c|d)*", "acbcd", True),
    ("((a|b)c|d)*", "acb", False),
    ("(?#comment)a", "a", True),
    ("()", "", True),
]

QUANTIFIERS = [
    ("a?", "", True),
    ("a?", "a", True),
    ("a?", "aa", False),
    ("a*", "", True),
    ("a*", "aaaa", True),
    ("a+", "", False),
    ("a+", "aaa", True),
    ("a{3}", "aaa", True),
    ("a{3}", "aa", False),
    ("a{3}", "aaaa", False),
    ("a{2,}", "a", False),
    ("a{2,}", "aaaaa", True),
    ("a{2,4}", "aaaa", True),
    ("a{2,4}", "aaaaa", False),
    ("a{,2}", "", True),
    ("a{,2}", "aaa", False),
    ("a{0}", "", True),
    ("a{0}b", "b", True),
    ("a{0,0}", "a", False),
    ("a??", "a", True),
    ("a*?b", "aab", True),
    ("a+?", "aa", True),
    ("a{2,3}?", "aaa", True),
    ("a{2,}?", "aaaa", True),
    ("(a|ab)(c|bcd)(d*)", "abcd", True),
    ("(a*)*", "aaa", True),
    ("(a*)+b", "b", True),
    ("(?:a?){3}", "aa", True),
    ("(?:é|😀){2}", "é😀", True),
    ("(?:é|😀){2}", "é", False),
    ("a{", "a{", True),  # not a quantifier in Python
    ("a{x}", "a{x}", True),
    (r"\d{3}-\d{4}", "555-1234", True),
    (r"\d{3}-\d{4}", "555-12345", False),
]

ANCHORS = [
    ("^abc$", "abc", True),
    ("^abc$", "abc\n", False),  # $ also matches before a final \n, but fullmatch needs the end
    ("abc$", "abc\n", False),
    (r"\Aabc\Z", "abc", True),
    (r"(?m)^abc$", "abc", True),
    (r"(?m)^abc$", "abc\n", False),
    ("^$", "", True),
    ("^", "", True),
    ("$", "", True),
    ("$", "\n", False),
    ("^a|^b", "b", True),
    ("^(a|b)$", "a", True),
    ("(^a|b$)", "b", True),
    ("(?:^)*a", "a", True),
    ("^^a$$", "a", True),
    ("(^|x)y", "y", True),
    ("(^|x)y", "xy", True),
    ("a(b|$)", "a", True),
    ("a(b|$)", "ab", True),
    ("(?:a$)?", "", True),
    # end anchors inside: the rest must match empty (no newline can follow, so Python's
    # "$ before a final newline" never applies)
    ("a$b|c", "ab", False),
    ("a$$b?", "a", True),
    (r"a\Zb?", "a", True),
    (r"a\Zb?", "ab", False),
    ("(a|b$)c?", "b", True),
    ("(a|b$)c?", "bc", False),
    ("(a|b$)c?", "ac", True),
    ("(a$|b)+c*", "bba", True),
    ("(a$|b)+c*", "bab", False),
    ("(a$|b)+c*", "bbc", True),
    ("(x$|y){2,3}", "yx", True),
    ("(x$|y){2,3}", "x", False),
    ("(x$|y){2,3}", "yyy", True),
    (r"(\/?((\.{2})|([a-z0-9\-]*))($|\/))*", "a/../b-c", True),
    (r"(\/?((\.{2})|([a-z0-9\-]*))($|\/))*", "a/.x", False),
    (r"(\/?((\.{2})|([a-z0-9\-]*))($|\/))*", "/a/", True),
]

IGNORECASE = [
    ("(?i)abc", "AbC", True),
    ("(?i)abc", "abd", False),
    ("(?i)k", "\u212a", True),  # KELVIN SIGN
    ("(?i)\u212a", "k", True),
    ("(?i)\u212a", "K", True),
    ("(?i)s", "ſ", True),  # LATIN SMALL LETTER LONG S
    ("(?i)ſ", "S", True),
    ("(?i)ß", "ẞ", True),
    ("(?i)ß", "ss", False),  # no multi-character folding in re
    ("(?i)σ", "ς", True),
    ("(?i)σ", "Σ", True),
    ("(?i)i", "İ", True),  # simple lowercase of İ is i
    ("(?i)i", "ı", True),  # re._casefix extra case
    ("(?i)µ", "Μ", True),
    ("(?i)[a-z]+", "HeLLo", True),
    ("(?i)[a-z]", "\u212a", True),
    ("(?i)[a-z]", "ſ", True),
    ("(?i)[^a-z]", "A", False),
    ("(?i)[^a-z]", "\u212a", False),
    ("(?i)[^k]", "K", False),
    ("(?i)[k]", "\u212a", True),
    ("(?i)[^\\W\\d_]", "É", True),
    ("(?i)é", "É", True),
    ("(?i)😀", "😀", True),
    ("(?i)\U00010400", "\U00010428", True),  # DESERET capital/small LONG I
    ("(?i)\U00010428", "\U00010400", True),
    ("(?i)[\U00010400-\U00010401]", "\U00010428", True),
    ("(?i)[\U00010428]", "\U00010400", True),
    ("(?i)a(?-i:b)c", "AbC", True),
    ("(?i)a(?-i:b)c", "ABC", False),
    ("a(?i:b)c", "aBc", True),
    ("a(?i:b)c", "ABc", False),
    ("(?ia)k", "\u212a", False),
    ("(?ia)[a-z]", "ſ", False),
    ("(?i)(?a:k)", "\u212a", False),
    ("(?i)1", "1", True),
]

VERBOSE = [
    ("(?x) a b  c # comment\n d", "abcd", True),
    ("(?x) a\\ b", "a b", True),
    ("(?x)[ ]", " ", True),
    ("(?x) a | b ", "b", True),
]

TABLES = {
    "literals": LITERALS,
    "escapes": ESCAPES,
    "categories": CATEGORIES,
    "classes": CLASSES,
    "dot": DOT,
    "groups": GROUPS_ALTERNATION,
    "quantifiers": QUANTIFIERS,
    "anchors": ANCHORS,
    "ignorecase": IGNORECASE,
    "verbose": VERBOSE,
}
CASES = [pytest.param(p, s, e, id=f"{name}:{p!r}~{s!r}") for name, rows in TABLES.items() for p, s, e in rows]

# (pattern, flags, string, expected) for flags passed as the argument
FLAG_CASES = [
    ("abc", I, "ABC", True),
    (".", S, "\n", True),
    (".", 0, "\n", False),
    (" a # c", X, "a", True),
    (r"\w", A, "é", False),
    (r"\w", I | A, "é", False),
    ("^a$", M, "a", True),
    ("[k-k]", I, "\u212a", True),
]


def _check(pattern: str, flags: int, string: str, expected: bool) -> None:
    assert bool(re.fullmatch(pattern, string, flags)) is expected, "table disagrees with re"
    expr = regex_to_ir(pattern, flags=flags)
    assert ir_accepts(expr, string.encode()) is expected


@pytest.mark.parametrize("pattern,string,expected", CASES)
def test_regex_construct(pattern: str, string: str, expected: bool) -> None:
    _check(pattern, 0, string, expected)


@pytest.mark.parametrize("pattern,flags,string,expected", FLAG_CASES)
def test_regex_flags_argument(pattern: str, flags: int, string: str, expected: bool) -> None:
    _check(pattern, flags, string, expected)


def test_regex_compiled_pattern_argument() -> None:
    expr = regex_to_ir(re.compile("ab", re.I))
    assert ir_accepts(expr, b"AB") and not ir_accepts(expr, b"ac")


def test_regex_lone_surrogate_matches_nothing() -> None:
    expr = regex_to_ir("a\\ud800?")
    assert ir_accepts(expr, b"a")


@pytest.mark.parametrize("pattern,string,expected", CASES)
def test_regex_same_language_through_the_automaton(pattern: str, string: str, expected: bool) -> None:
    automaton = pytest.importorskip("deepinfer.constraints.automaton")
    expr = regex_to_ir(pattern)
    if size(expr) > 1000:
        pytest.skip("large Unicode class: ~1 s of DFA construction each, too slow for this table")
    aut = automaton.compile_grammar(Grammar(rules={"start": expr}, start="start"))
    assert aut.accepts(string.encode()) is expected


@pytest.mark.parametrize(
    "pattern,string,expected",
    [
        (r"a$\n?", "a", True),  # ECMA's $: only the end, so no newline can follow it
        (r"a$\n?", "a\n", False),
        (r"(a$|b)\s*", "a", True),
        (r"(a$|b)\s*", "a ", False),
        (r"(a$|b)\s*", "b\n", True),
    ],
)
def test_regex_end_only(pattern: str, string: str, expected: bool) -> None:
    """``end_only``: $ matches only at the end of the text (JSON Schema's ECMA reading)."""
    assert ir_accepts(regex_to_ir(pattern, end_only=True), string.encode()) is expected
    with pytest.raises(ConstraintError, match=r"anchor \$ not at the end"):
        regex_to_ir(pattern)  # Python's $ also matches before a final newline
