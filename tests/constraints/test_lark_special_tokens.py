"""Special tokens in Lark grammars (``<|im_end|>`` by text, ``<[7]>`` by id) and JSON Schema
inside Lark (``%json {...}``), as llguidance's Lark writes them.

A special token never matches ordinary text, nor ordinary text a special token: checked on
a vocabulary whose special tokens' texts are also spelled by ordinary tokens, and whose
ordinary tokens include the byte the IR writes special tokens with.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from deepinfer.constraints import Compiler, ConstraintError, Matcher, Vocabulary

IM_END, TOOL, EOS = 256, 257, 258
PIECES = [bytes([b]) for b in range(256)] + [None, None, None, b"<|im_end|>", b"<|", b"|>", b"\xfe\x80"]
PLAIN_IM_END, FE_PAIR = 259, 262


@pytest.fixture(scope="module")
def compiler():
    vocab = Vocabulary(PIECES, eos_ids=[EOS], special_ids=[IM_END, TOOL])
    return Compiler(vocab, special_tokens={"<|im_end|>": IM_END, "<|python_tag|>": TOOL, "<|eos|>": EOS})


def walk(m: Matcher, data: bytes) -> bool:
    return all(m.accept(b) for b in data)


def test_by_text_and_by_id(compiler):
    for g in ('start: "hi" <|im_end|> "x"', 'start: "hi" <[256]> "x"'):
        c = compiler.grammar(g)
        m = Matcher(c)
        assert walk(m, b"hi")
        assert list(m.allowed_tokens()) == [IM_END]  # not the text "<|im_end|>", not "<", not 0xFE
        assert (
            not m.copy().accept(PLAIN_IM_END) and not m.copy().accept(0xFE) and not m.copy().accept(FE_PAIR)
        )
        assert m.forced_tokens() == [IM_END, ord("x")]
        assert m.accept(IM_END) and walk(m, b"x") and m.can_end()
        assert not c.accepts("hi<|im_end|>x")  # ordinary text is not the special token


def test_text_rule_never_takes_the_special_token(compiler):
    c = compiler.grammar('start: "a" "<|im_end|>"')
    m = Matcher(c)
    assert walk(m, b"a") and IM_END not in m.allowed_tokens() and PLAIN_IM_END in m.allowed_tokens()
    assert not m.copy().accept(IM_END) and m.accept(PLAIN_IM_END) and m.can_end()


def test_eos_named_inside_and_alternatives(compiler):
    c = compiler.grammar("start: (<|python_tag|> CALL | TEXT) <|eos|>\nCALL: /[a-z]+\\(\\)/\nTEXT: /[a-z ]+/")
    m = Matcher(c)
    assert {TOOL} <= set(m.allowed_tokens()) and m.accept(TOOL) and walk(m, b"f()")
    assert list(m.allowed_tokens()) == [EOS] and m.accept(EOS) and m.is_terminated()


def test_random_walks_only_special_where_the_grammar_names_it(compiler):
    c = compiler.grammar("start: (WORD <|im_end|>)+\nWORD: /[a-z]{1,3}/")
    rng = random.Random(1)
    for _ in range(20):
        m = Matcher(c)
        seq = []
        for _ in range(12):
            allowed = [int(t) for t in m.allowed_tokens()]
            assert allowed == [t for t in range(len(PIECES)) if m.copy().accept(t)]
            t = rng.choice(allowed)
            assert m.accept(t)
            seq.append(t)
            if m.is_terminated():
                break
        text = "".join("|" if t == IM_END else "" if t == EOS else PIECES[t].decode() for t in seq)
        assert all(w.isalpha() and len(w) <= 3 for w in text.split("|")[:-1]), text


BAD = [
    ('start: "a" <|nope|>', r"unknown special token <\|nope\|>.*line 1, column 12"),
    ('start: "a"\n  | <[42]>', r"token id 42 in <\[42\]> is not a special token.*line 2, column 5"),
    ('start: A\nA: "x" <|im_end|>', r"special token <\|im_end\|> in terminal A.*line 2, column 8"),
    ('start: "a" %json {"type": "strin"}', r"%json: invalid JSON Schema.*#/type.*line 1, column 12"),
    ('start: "a" %json {"type": ', r"%json needs a JSON object.*line 1, column 12"),
]


@pytest.mark.parametrize("text,pattern", BAD)
def test_bad_input_names_line_and_column(compiler, text, pattern):
    with pytest.raises(ConstraintError, match=pattern):
        compiler.grammar(text)


SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 20}},
    "required": ["n"],
}


def test_json_inside_lark(compiler):
    text = f'start: "Answer: " obj <|im_end|>\nobj: %json {json.dumps(SCHEMA, indent=1)}\n'
    c = compiler.grammar(text)
    for good in ('{"n": 3}', '{"n":20,"x":[1]}'):
        m = Matcher(c)
        assert walk(m, b"Answer: " + good.encode()) and m.accept(IM_END) and m.can_end()
    for bad in ('{"n": 0}', '{"m": 3}', "[1]"):
        assert not Matcher(c).accept_bytes(b"Answer: " + bad.encode() + b" ")
    # random walks, closed by the shortest completion: the JSON part validates
    from .test_structural_tags import shortest_completion

    rng = random.Random(2)
    for _ in range(10):
        m = Matcher(c)
        out = bytearray()
        for _ in range(rng.randint(3, 30)):
            allowed = [int(t) for t in m.allowed_tokens() if t < IM_END or t > EOS]
            if not allowed:
                break
            t = rng.choice(allowed)
            assert m.accept(t)
            out += PIECES[t]
        tail = shortest_completion(c.automaton, m.state)
        assert tail is not None and tail.endswith(b"\xfe\x80\x80\x84\x80")  # (IM_END in the IR's bytes)
        out += tail[:-5]
        assert out.startswith(b"Answer: ")
        jsonschema.validate(json.loads(out[len(b"Answer: ") :]), SCHEMA)


def test_json_keeps_line_numbers(compiler):
    """A multi-line %json leaves the lines after it where they were: an error there names its line."""
    text = 'start: obj undefined_rule\nobj: %json {\n  "type": "integer"\n}\n'
    with pytest.raises(ConstraintError, match=r"undefined rule 'undefined_rule'.*line 1, column 12"):
        compiler.grammar(text)
    with pytest.raises(ConstraintError, match=r"line 5"):
        compiler.grammar('start: obj\nobj: %json {\n  "type": "integer"\n}\nX: "(\n')
