"""The GBNF front end (llama.cpp's grammar dialect): each construct's language, the errors
(line and column, the construct named), llama.cpp's own grammar files (shared data) and the
GBNF grammars packaged in ``deepinfer.grammars``."""

from __future__ import annotations

import pytest

from deepinfer import SamplingParams, grammars
from deepinfer.constraints.automaton.pushdown import compile_grammar
from deepinfer.constraints.errors import ConstraintError, ConstraintTooComplex
from deepinfer.constraints.frontends.gbnf import gbnf_to_grammar
from deepinfer.constraints.limits import Limits

from .shared_data import need_shared


def automaton(text: str, start: str = "root"):
    return compile_grammar(gbnf_to_grammar(text, start))


# (grammar, accepted texts, rejected texts)
FEATURES = [
    ('root ::= "ab" | "c"', ["ab", "c"], ["", "a", "abc", "cc"]),
    ('root ::= ("a" | "b")* "."', [".", "ab.", "bbba."], ["", "c.", "ab"]),
    ('root ::= "x"+ "y"? ', ["x", "xxy"], ["", "y", "xyy"]),
    ('root ::= "a"{3}', ["aaa"], ["aa", "aaaa"]),
    ('root ::= "a"{2,}', ["aa", "aaaaa"], ["a"]),
    ('root ::= "a"{1,3} "b"{,2}', ["a", "aaab", "abb"], ["", "aaaa", "abbb"]),
    ('root ::= ("ab"){2} [0-9]{0,1}', ["abab", "abab7"], ["ab", "abab77"]),
    ('root ::= "\\n\\t\\"\\\\\\x41\\u00e9\\U0001F600"', ['\n\t"\\Aé😀'], ["\\n", "A"]),
    ("root ::= [a-cx\\-]+", ["abc", "x-a", "-"], ["d", "", "A"]),
    ("root ::= [-+*/] [0-9]", ["-1", "/9", "*0"], ["a1", "--"]),
    ('root ::= [^"\\\\\\x00-\\x1F]*', ["abc é 😀", ""], ['"', "\\", "\n", "\x01"]),
    ("root ::= [^a]", ["b", "é", "😀"], ["a", "bb"]),
    ("root ::= . .", ["ab", "é😀", "\n\n"], ["a", "abc"]),
    ("root ::= [ぁ-ゟ]+", ["ひらがな"], ["カ", "a"]),
    ('root ::= [\\]\\[] "]"', ["[]", "]]"], ["[[", "a]"]),
    ('root ::= x\nx ::= | "a" x', ["", "a", "aaa"], ["b"]),
    # comments, rules over several lines (after ::=, a trailing | and inside parentheses)
    (
        '# a comment\nroot ::=\n  ( "a" # inside\n    "b" ) |\n  "c"  # after\n\n# end\n',
        ["ab", "c"],
        ["a", "abc"],
    ),
    ('root ::= item ("," item)*\nitem ::= [a-z]+ | "(" root ")"', ["a,b", "(a,(b)),c"], ["a,", "(a"]),
    # stacked postfixes apply one after the other; names with - and _
    ('root ::= my-rule*?\nmy-rule ::= "z" my_other?\nmy_other ::= "!"', ["", "zz!", "z!z"], ["!", "z!!"]),
]


@pytest.mark.parametrize("text,good,bad", FEATURES, ids=[f"f{i}" for i in range(len(FEATURES))])
def test_constructs(text, good, bad):
    a = automaton(text)
    for s in good:
        assert a.accepts(s.encode()), (text, s)
    for s in bad:
        assert not a.accepts(s.encode()), (text, s)


# (grammar, message part, line, column)
ERRORS = [
    ('root ::= "a" b', "rule 'b' is used but not defined", 1, 14),
    ('root ::= "a"\nother ::= "b" (\n  "c" | missing )', "rule 'missing' is used but not defined", 3, 9),
    ('root ::= "a\nb"', "string literal not closed", 1, 10),
    ('root ::= "a" )', "')' without '('", 1, 14),
    ('root ::= ( "a"', "expected ')' to close", 1, 15),
    ("root ::= [a-", "character class not closed", 1, 10),
    ('root ::= "\\q"', "unknown escape '\\q'", 1, 11),
    ('root ::= "\\x4"', "'\\x' takes 2 hexadecimal digits", 1, 11),
    ('root ::= "\\uD800"', "not a Unicode scalar value", 1, 11),
    ("root ::= [z-a]", "range 'z'-'a' is reversed", 1, 13),
    ('root "a"', "expected '::=' after rule name 'root'", 1, 6),
    ('root ::= "a"\nroot ::= "b"', "rule 'root' is defined twice (first at line 1)", 2, 1),
    ('root ::= "a"\n  | "b"', "'|' at the start of a line", 2, 3),
    ('root ::= "a" b ::= "c"', "rule 'b' defined inside another rule", 1, 14),
    ('root ::= * "a"', "'*' with nothing before it", 1, 10),
    ('root ::= "a"{3,1}', "maximum is below the minimum", 1, 13),
    ('root ::= "a"{x}', "expected a number", 1, 14),
    # unsupported constructs, named
    ("root ::= <[128000]> [a-z]", "token reference '<[128000]>' is not supported", 1, 10),
    ("root ::= <|im_end|>", "token reference '<|im_end|>' is not supported", 1, 10),
    ('root ::= "a" !<[2]>', "token reference '!<[2]>' is not supported", 1, 14),
    ('root ::= (= "a") "a"', "lookahead assertion '(= ...)' is not supported", 1, 10),
    ('main ::= "a"', "no start rule 'root' (rules: main)", 1, 1),
    ("root ::= root", "derives no finite text", 1, 1),
]


@pytest.mark.parametrize("text,msg,line,column", ERRORS, ids=[f"e{i}" for i in range(len(ERRORS))])
def test_errors_name_the_place(text, msg, line, column):
    with pytest.raises(ConstraintError) as info:
        gbnf_to_grammar(text)
    e = info.value
    assert msg in str(e), str(e)
    assert (e.line, e.column) == (line, column), str(e)


def test_bounds():
    with pytest.raises(ConstraintTooComplex) as info:
        gbnf_to_grammar('root ::= "a"{1,100000}')
    assert info.value.bound == "gbnf_max_repeat" and info.value.line == 1
    with pytest.raises(ConstraintTooComplex) as info:
        gbnf_to_grammar("root ::= " + "(" * 80 + '"a"' + ")" * 80)
    assert info.value.bound == "max_grammar_nesting"
    with pytest.raises(ConstraintTooComplex) as info:
        gbnf_to_grammar('root ::= "a"\n' * 10, limits=Limits(max_grammar_chars=20))
    assert info.value.bound == "max_grammar_chars"
    with pytest.raises(ConstraintError, match="must be a str"):
        gbnf_to_grammar(b'root ::= "a"')  # type: ignore[arg-type]


def test_start_rule_other_than_root():
    a = automaton('root ::= "r"\nexpr ::= "e"+', start="expr")
    assert a.accepts(b"ee") and not a.accepts(b"r")


LLAMA_CPP = ["arithmetic", "c", "chess", "english", "japanese", "json", "json_arr", "list"]


@pytest.mark.parametrize("name", LLAMA_CPP)
def test_llama_cpp_grammars_compile(name):
    """llama.cpp's own example grammars each compile (none uses a construct we refuse)."""
    path = need_shared("gbnf", f"{name}.gbnf")
    a = compile_grammar(gbnf_to_grammar(path.read_text(encoding="utf-8")))
    assert a.initial is not None


def test_llama_cpp_json_grammar_language():
    path = need_shared("gbnf", "json.gbnf")
    a = automaton(path.read_text(encoding="utf-8"))
    for s in ['{"a": [1, 2.5e3, "x\\u00e9"], "b": {"c": null}}', "{}", '{"k":true}']:
        assert a.accepts(s.encode()), s
    for s in ["[]", '{"a":}', '{"a": 01}', '{"a": "\x01"}', "{} {}"]:
        assert not a.accepts(s.encode()), s


PACKAGED = {
    "person.gbnf": (
        ['{"name": "Maria Lopez", "age": 34, "city": "Madrid"}', '{"name":"Zoë","age":119}'],
        ['{"name": "maria", "age": 34}', '{"name": "Ann", "age": 120}', '{"name":"Ann","age":1,"city":""}'],
    ),
    "arithmetic.gbnf": (["1+2*(3-4)", "-(-1.5) / (2)", "42"], ["1++2", "(1", "1.23456"]),
}


@pytest.mark.parametrize("name", list(PACKAGED))
def test_packaged_gbnf_grammars(name):
    text = grammars.load(name)
    a = automaton(text)
    good, bad = PACKAGED[name]
    for s in good:
        assert a.accepts(s.encode()), s
    for s in bad:
        assert not a.accepts(s.encode()), s


def test_sampling_params_pick_the_dialect(tmp_path):
    assert SamplingParams(grammar="person.gbnf").grammar_dialect == "gbnf"
    assert SamplingParams(grammar='root ::= "a"', grammar_syntax="gbnf").grammar_dialect == "gbnf"
    assert SamplingParams(grammar="json").grammar_dialect == "lark"
    assert SamplingParams(grammar='start: "a"').grammar_dialect == "lark"
    f = tmp_path / "mine.gbnf"
    f.write_text('root ::= "a"\n')
    assert SamplingParams(grammar=str(f)).grammar_dialect == "gbnf"
    with pytest.raises(ValueError, match="grammar_syntax"):
        SamplingParams(grammar='root ::= "a"', grammar_syntax="ebnf")


def test_gbnf_after_reasoning_and_inside_a_structural_tag():
    """A GBNF grammar embedded in another constraint is read as GBNF, not as Lark."""
    from deepinfer.constraints import Compiler
    from deepinfer.structured import constraint_spec

    from .vocabs import small_vocab

    c = Compiler(small_vocab())
    digits = 'root ::= [0-9]+ "!"'
    spec = constraint_spec(SamplingParams(grammar=digits, grammar_syntax="gbnf"))
    assert spec["syntax"] == "gbnf" and spec["start"] == "root"
    after = c.reasoning(spec)
    assert after.accepts("<think>hm</think>42!") and not after.accepts("<think>hm</think>4x!")
    tags = c.structural_tags([{"begin": "<n>", "end": "</n>", "grammar": digits, "syntax": "gbnf"}])
    assert tags.accepts("say <n>7!</n> ok") and not tags.accepts("say <n>x</n> ok")
    with pytest.raises(ConstraintError, match="grammar syntax must be"):
        c.reasoning({"grammar": digits, "syntax": "ebnf"})
