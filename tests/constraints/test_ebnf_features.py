"""Lark EBNF front end: one table of (text, accepted) cases per grammar feature.

Every expected verdict is checked against lark's own Earley parser (the oracle) and then
against the compiled automaton. The oracle uses ``lexer="dynamic_complete"``, which tries
every length of every terminal: that is the scannerless reading we compile (see the
docstring of ``deepinfer.constraints.ebnf``); the ``scannerless`` row shows a text that
lark's greedier ``lexer="dynamic"`` rejects.
"""

from __future__ import annotations

import functools
import re

import pytest

lark = pytest.importorskip("lark")

from deepinfer.constraints.errors import ConstraintError  # noqa: E402
from deepinfer.constraints.frontends.lark import IGNORE_RULE, lark_to_grammar  # noqa: E402
from deepinfer.constraints.ir import Ref, refs  # noqa: E402

# feature: (grammar, [(text, accepted), ...])
FEATURES: dict[str, tuple[str, list[tuple[str, bool]]]] = {
    "rules": (
        'start: a b\na: "x"\nb: "y" | "z"',
        [("xy", True), ("xz", True), ("x", False), ("xyz", False), ("", False), ("yx", False)],
    ),
    "recursion": (
        'start: "(" start ")" | "x"',
        [("x", True), ("(x)", True), ("(((x)))", True), ("((x)", False), ("()", False)],
    ),
    "direct_left_recursion": (
        'start: start "+" "a" | "a"',
        [("a", True), ("a+a", True), ("a+a+a", True), ("+a", False), ("a+", False)],
    ),
    "string_escapes_unicode": (
        'start: "tab\\t" "quote\\"" "é€😀"',
        [('tab\tquote"é€😀', True), ('tab quote"é€😀', False), ('tab\tquote"e€😀', False)],
    ),
    "regex": (
        'start: /[0-9]{2,3}/ "-" /[a-z]+/',
        [("12-ab", True), ("123-z", True), ("1-ab", False), ("1234-ab", False), ("12-", False)],
    ),
    "regex_flags": (
        'start: /abc/i ":" /a.c/s',
        [("ABC:abc", True), ("aBc:a\nc", True), ("abd:abc", False)],
    ),
    "regex_unicode": (
        "start: /[α-ω]+/ /\\d/",
        [("αβγ1", True), ("ω٣", True), ("a1", False)],
    ),
    "optional": (
        'start: "a" "b"? "c"',
        [("ac", True), ("abc", True), ("abbc", False)],
    ),
    "maybe": (
        'start: "a" ["b" "b"] "c"',
        [("ac", True), ("abbc", True), ("abc", False)],
    ),
    "many_optionals": (  # lark expands these into 2^5 alternatives; the front end factors them
        'start: "a"? "b" "c"? ("d" | "e")? "f"? "g"?',
        [("b", True), ("abcdfg", True), ("bef", True), ("acg", False), ("bdeg", False), ("abcdefg", False)]
        + [
            ("".join(c for c, keep in zip("abcdfg", f"{m:06b}") if keep == "1"), m & 0b010000 != 0)
            for m in range(64)
        ],
    ),
    "star": (
        'start: "a" "b"* "c"',
        [("ac", True), ("abc", True), ("abbbbc", True), ("abcb", False)],
    ),
    "plus": (
        'start: "a" "b"+ "c"',
        [("ac", False), ("abc", True), ("abbbc", True)],
    ),
    "groups": (
        'start: ("ab" | "cd")+ ("," ("x" | "y"))*',
        [("ab", True), ("abcdab,x,y", True), ("", False), ("abc", False), ("ab,", False)],
    ),
    "repeat_exact": (
        'start: "ab"~3',
        [("ababab", True), ("abab", False), ("abababab", False)],
    ),
    "repeat_range": (
        'start: "a"~2..4 "b"',
        [("ab", False), ("aab", True), ("aaaab", True), ("aaaaab", False)],
    ),
    "repeat_large_range": (
        'start: "a"~60..70',
        [("a" * 59, False), ("a" * 60, True), ("a" * 65, True), ("a" * 70, True), ("a" * 71, False)],
    ),
    "repeat_group_range": (
        'start: ("x" "y"?)~2..3',
        [("xx", True), ("xyxy", True), ("xyxxy", True), ("x", False), ("xxxx", False)],
    ),
    "repeat_in_terminal": (
        'start: HEX\nHEX: "#" /[0-9a-f]/~3..6',
        [("#abc", True), ("#a0b1c2", True), ("#ab", False), ("#abcdef0", False)],
    ),
    "import_common": (
        'start: SIGNED_NUMBER ("," SIGNED_NUMBER)* ";" CNAME ";" ESCAPED_STRING\n'
        "%import common.SIGNED_NUMBER\n%import common.CNAME\n%import common.ESCAPED_STRING",
        [
            ('1,-2.5,+3e4;_x9;"hi \\" there"', True),
            ('1;x;""', True),
            ('1,;x;""', False),
            ('1;9x;""', False),
            ("1;x;'a'", False),
        ],
    ),
    "import_grouped_renamed": (
        "start: NUM (WS_INLINE NUM)* DIGIT?\n%import common (WS_INLINE, DIGIT)\n%import common.INT -> NUM",
        [("1 22  333", True), ("1", True), ("1 ", False), ("1 a", False)],
    ),
    "ignore_string": (
        'start: "a" "b"\n%ignore " "',
        [("ab", True), ("a b", True), ("  a   b  ", True), ("a\tb", False), ("", False)],
    ),
    "ignore_not_inside_terminals": (
        'start: "ab" "c"\n%ignore " "',
        [("ab c", True), (" abc ", True), ("a bc", False)],
    ),
    "ignore_common_ws": (
        'start: "[" [INT ("," INT)*] "]"\n%import common.INT\n%import common.WS\n%ignore WS',
        [("[1,2]", True), (" [ 1 ,\n 2\t] ", True), ("[]", True), ("[1 2]", False), ("[1,2 3]", False)],
    ),
    "ignore_two": (
        'start: "x"+\n%ignore " "\n%ignore /#[^\\n]*\\n/',
        [("x x", True), ("x #note\n x", True), ("x #note x", False)],
    ),
    "inline_rule": (
        'start: x x\n?x: "a" | "b" y\ny: "c"',
        [("aa", True), ("abc", True), ("bcbc", True), ("ab", False)],
    ),
    "aliases": (
        'start: "a" -> one\n     | "b" "c" -> two',
        [("a", True), ("bc", True), ("b", False), ("abc", False)],
    ),
    "case_insensitive_string": (
        'start: "select"i " " KW\nKW: "abc"i',
        [
            ("SELECT abc", True),
            ("SeLeCt ABC", True),
            ("select aBc", True),
            ("SELECTabc", False),
            ("selekt abc", False),
        ],
    ),
    "templates": (
        'start: _sep{"a", ","} ";" _sep{"b", "-"}\n_sep{x, s}: x (s x)*',
        [("a;b", True), ("a,a,a;b-b", True), ("a,;b", False), ("a-a;b", False)],
    ),
    "priorities_ignored": (
        'start: a | b\na.2: "x"\nb: "y"\nT.5: "z"\nstart2: T',
        [("x", True), ("y", True), ("z", False)],
    ),
    "composite_terminal": (
        'start: RANGE\nRANGE: DIGITS "-" DIGITS\nDIGITS: /[0-9]+/',
        [("1-22", True), ("1-", False), ("a-1", False)],
    ),
    "composite_terminal_flags": (
        'start: WORD\nWORD: "a"i "b" /c+/',
        [("Abccc", True), ("abc", True), ("aBc", False)],
    ),
    "scannerless": (  # lark's lexer="dynamic" takes /a+/'s greedy match only and rejects "aaa"
        'start: /a+/ "a"',
        [("aa", True), ("aaa", True), ("a", False)],
    ),
    "comments_in_grammar": (
        '// a comment\nstart: "a" // trailing comment\n  | "b"  // another',
        [("a", True), ("b", True), ("ab", False)],
    ),
}

CASES = [
    pytest.param(feature, grammar, text, expected, id=f"{feature}-{i}")
    for feature, (grammar, rows) in FEATURES.items()
    for i, (text, expected) in enumerate(rows)
]


def lark_accepts(grammar: str, text: str, lexer: str = "dynamic_complete") -> bool:
    return _lark_parser(grammar, lexer) is not None and _lark_parse(grammar, lexer, text)


@functools.cache
def _lark_parser(grammar: str, lexer: str):
    from lark.load_grammar import FromPackageLoader

    loader = FromPackageLoader("deepinfer.grammars", ("",))
    return lark.Lark(grammar, parser="earley", lexer=lexer, import_paths=[loader])


def _lark_parse(grammar: str, lexer: str, text: str) -> bool:
    try:
        _lark_parser(grammar, lexer).parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


@functools.cache
def automaton(grammar: str, start: str = "start"):
    from deepinfer.constraints.automaton import compile_grammar

    return compile_grammar(lark_to_grammar(grammar, start))


@pytest.mark.parametrize(("feature", "grammar", "text", "expected"), CASES)
def test_table_agrees_with_lark(feature, grammar, text, expected):
    assert lark_accepts(grammar, text) == expected


@pytest.mark.parametrize(("feature", "grammar", "text", "expected"), CASES)
def test_automaton_accepts(feature, grammar, text, expected):
    a = automaton(grammar)
    data = text.encode("utf-8")
    assert a.accepts(data) == expected
    if expected:  # every prefix of an accepted text is a live prefix
        assert all(a.is_prefix(data[:k]) for k in range(len(data) + 1))


def test_scannerless_differs_from_lark_dynamic_lexer():
    grammar = FEATURES["scannerless"][0]
    assert not lark_accepts(grammar, "aaa", lexer="dynamic")
    assert automaton(grammar).accepts(b"aaa")


def test_escaped_string_is_read_as_lark_lexes_it():
    # common.ESCAPED_STRING's regex (lazy, with a lookbehind) fullmatches '"a"b"'; lark's
    # lexers end the string at the first unescaped quote, and so does the front end.
    grammar = "start: ESCAPED_STRING\n%import common.ESCAPED_STRING"
    assert re.fullmatch(r'".*?(?<!\\)(\\\\)*?"', '"a"b"')
    assert not lark_accepts(grammar, '"a"b"')
    a = automaton(grammar)
    assert not a.accepts(b'"a"b"')
    assert a.accepts(b'"a\\"b"') and a.accepts(b'"\\\\"') and not a.accepts(b'"a\\"')


def test_is_prefix():
    a = automaton(FEATURES["ignore_common_ws"][0])
    assert a.is_prefix(b" [ 1 ,")
    assert not a.is_prefix(b"[1 2")
    assert not a.is_prefix(b"x")


def test_other_start_rule():
    g = 'start: "a"\nother: "b" start'
    assert automaton(g, "other").accepts(b"ba")
    assert not automaton(g, "other").accepts(b"a")


def test_star_helpers_are_not_recursive():
    # lark expands x* into `__star: __star x | x`; the front end turns that into x x*
    g = lark_to_grammar('start: "a"* ("b" "c")+')
    for name, body in g.rules.items():
        assert Ref(name) not in _direct_refs(body, g), name


def _direct_refs(body, g):
    return {Ref(n) for n in refs(body)}


def test_ignore_is_noted_and_is_a_rule():
    g = lark_to_grammar(FEATURES["ignore_common_ws"][0])
    assert IGNORE_RULE in g.rules
    assert any("unbounded" in n for n in g.notes)
    assert not lark_to_grammar('start: "a"').notes


# ---------------------------------------------------------------------------- errors

ERRORS = [
    ('start: "a" (', "start", r"syntax error: Unclosed parenthesis \(line 1, column 13\)"),
    ('start: "a"\n  bar: ]', "start", r"syntax error: .*\(line 2, column 8\)"),
    ('start "a"', "start", r"missing colon\) \(line 1, column 7\)"),
    ("start: 'a'", "start", r"syntax error: .*\(line 1, column 8\)"),
    ("start: foo", "start", r"undefined rule 'foo' \(used in rule start\) \(line 1, column 8\)"),
    ('start: "a"\n  | "b" FOO', "start", r"undefined terminal 'FOO' .*\(line 2, column 9\)"),
    ('start: "a"', "main", r"start rule 'main' is not defined in the grammar \(rules: start\)"),
    ('start: "a"~3..1', "start", r"Bad Range"),
    ("%declare FOO\nstart: FOO", "start", r"terminal 'FOO' is declared \(%declare\) but has no pattern"),
    ("%import nomodule.X\nstart: X", "start", r"%import failed"),
    ('start: ""', "start", r"Empty terminals are not allowed"),
    ('start: "x"\n  | /(/', "start", r"terminal '__ANON_0' \(/\(/\): .*\(line 2, column 5\)"),
    ("start: A\nA: /[/", "start", r"terminal 'A' .*\(line 2, column 1\)"),
    ('start: "a" /b/l', "start", r"unsupported regex flag\(s\) 'l' \(line 1, column 12\)"),
    ('start: "a"\nstart: "b"', "start", r"defined more than once"),
    ('start: a\na: "x" a', "start", r"start rule 'start' derives no finite text .*through a"),
]


@pytest.mark.parametrize(("grammar", "start", "match"), ERRORS)
def test_errors(grammar, start, match):
    with pytest.raises(ConstraintError, match=match):
        lark_to_grammar(grammar, start)


def test_syntax_error_has_line_and_column_attributes():
    with pytest.raises(ConstraintError) as info:
        lark_to_grammar('start: "a"\n\n   x: (')
    assert (info.value.line, info.value.column) == (3, 8)
