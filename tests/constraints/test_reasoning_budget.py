"""Reasoning, then a constraint: ``begin``, free text without ``end``, ``end``, the constraint;
with ``max_tokens`` the end marker is forced once the block holds that many tokens.

Judged by definitions: outputs split with str.find and the answer checked by jsonschema;
masks equal the token-by-token reference; the budget counted from the token ids.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from deepinfer.constraints import Compiler, ConstraintError, Matcher, Vocabulary

from .test_structural_tags import random_walk
from .vocabs import small_vocab

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
AFTER = {"json_schema": SCHEMA, "whitespace": "compact"}


@pytest.fixture(scope="module")
def small():
    v = small_vocab()
    ids = {b[0]: i for i, b in enumerate(v.token_bytes) if b is not None and len(b) == 1}
    return v, Compiler(v), ids


@pytest.mark.parametrize(
    "text,ok",
    [
        ('<think>let me see</think>{"ok":true,"n":3}', True),
        ('<think></think>{"ok":false,"n":0}', True),
        ('<think>a </think {"x"} still thinking</think>{"ok":true,"n":1}', True),
        ('<think>a</think>{"ok":true,"n":100}', False),
        ('<think>a</think>b</think>{"ok":true,"n":1}', False),  # the first end closes the block
        ('{"ok":true,"n":1}', False),
        ("<think>never closed", False),
    ],
)
def test_language(small, text, ok):
    _, compiler, _ = small
    assert compiler.reasoning(AFTER).accepts(text) == ok


def test_open_block_and_free_answer(small):
    _, compiler, _ = small
    c = compiler.reasoning(AFTER, begin="")  # the prompt opened the block
    assert c.accepts('hmm</think>{"ok":true,"n":5}') and not c.accepts('<think>x</think>{"ok":1}')
    free = compiler.reasoning(None, begin="[[", end="]]")
    assert free.accepts("[[why]]any answer") and free.accepts("[[a]]b]]") and not free.accepts("[[a]b")


def split(text: str) -> tuple[str, str]:
    assert text.startswith("<think>")
    body = text[len("<think>") :]
    k = body.index("</think>")
    return body[:k], body[k + len("</think>") :]


def test_random_walks_and_masks(small):
    vocab, compiler, ids = small
    c = compiler.reasoning(AFTER)
    rng = random.Random(3)

    def close(rng, out):  # close the block now and then
        return b"</think>" if rng.random() < 0.1 and b"</think>" not in out else None

    for _ in range(8):
        text = random_walk(c, vocab, ids, rng, rng.randint(5, 60), 7, close)
        reasoning, answer = split(text.decode("utf-8"))
        assert "</think>" not in reasoning
        jsonschema.validate(json.loads(answer), SCHEMA)


@pytest.mark.parametrize("budget", [0, 1, 4, 9])
def test_budget_forces_the_end_marker(small, budget):
    """Random tokens that never close the block: once it holds ``budget`` tokens, the mask
    is one token, the end marker comes within len(end) tokens, then the JSON is free."""
    vocab, compiler, _ = small
    c = compiler.reasoning(AFTER, max_tokens=budget)
    end = c.check.end
    rng = random.Random(budget)
    for _ in range(4):
        m = Matcher(c)
        out = bytearray()
        forced = 0
        while b"</think>" not in out:
            allowed = [int(t) for t in m.allowed_tokens()]
            if m.num_accepted() >= budget:
                assert len(allowed) == 1, (bytes(out), allowed)
                forced += 1
            else:
                allowed = [t for t in allowed if b"/" not in (vocab.token_bytes[t] or b"/")]  # no early close
            t = rng.choice(allowed)
            assert m.accept(t)
            out += vocab.token_bytes[t]
            assert m.num_accepted() <= budget + len(b"<think>") + len(end)
        assert forced <= len(b"<think>") + len(end)
        assert m.reasoning_tokens == m.num_accepted()
        assert len(m.allowed_tokens()) > 1  # the answer is the constraint's again
        assert m.accept_bytes(b'{"ok":true,"n":7}') and m.can_end()


def test_budget_rollback_and_copy(small):
    vocab, compiler, ids = small
    c = compiler.reasoning(AFTER, max_tokens=11)
    m = Matcher(c)
    for b in b"<think>ab":
        assert m.accept(ids[b])
    k = m.copy()
    assert m.accept(ids[ord("c")]) and m.accept(ids[ord("d")])
    assert len(m.allowed_tokens()) == 1 and not m.accept(ids[ord("e")])  # forced
    assert m.state[1] is not None and k.state[1] is None  # (memo keys tell forcing apart)
    m.rollback(2)
    assert m.reasoning_tokens == k.reasoning_tokens == 9
    assert (m.mask_row() == k.mask_row()).all() and len(m.allowed_tokens()) > 1
    assert m.accept(ids[ord("<")]) and m.accept(ids[ord("<")])  # 11 tokens: the budget
    assert m.forced_bytes() == b"/think>" and m.accept(ids[ord("/")])  # the marker's rest, not all of it


def test_special_token_markers():
    """Think markers that are special tokens of the vocabulary (no text): the tokens themselves."""
    pieces = [bytes([b]) for b in range(256)] + [None, None, None]  # 256 <think>, 257 </think>, 258 EOS
    vocab = Vocabulary(pieces, eos_ids=[258], special_ids=[256, 257])
    compiler = Compiler(vocab, special_tokens={"<think>": 256, "</think>": 257})
    c = compiler.reasoning({"regex": "[0-9]+"}, max_tokens=3)
    m = Matcher(c)
    assert list(m.allowed_tokens()) == [256] and m.accept(256)
    assert m.accept(ord("a")) and m.accept(ord("<"))
    assert list(m.allowed_tokens()) == [257] and m.forced_tokens() == [257] and m.accept(257)
    assert not m.accept(257) and m.accept(ord("4")) and m.can_end()


BAD = [
    ({"begin": "<t>", "end": ""}, r"end marker must not be empty|non-empty"),
    ({"begin": "ab", "end": "bc"}, r"markers overlap"),
    ({"max_tokens": -1}, r"max_tokens"),
]


@pytest.mark.parametrize("kw,pattern", BAD)
def test_bad_input(small, kw, pattern):
    _, compiler, _ = small
    with pytest.raises(ConstraintError, match=pattern):
        compiler.reasoning(AFTER, **kw)


def test_bad_inner_constraint_names_its_place(small):
    _, compiler, _ = small
    with pytest.raises(ConstraintError, match=r"#/json_schema/properties/a/type"):
        compiler.reasoning({"json_schema": {"properties": {"a": {"type": "strin"}}}})
    with pytest.raises(ConstraintError, match=r"uniqueItems.*#"):
        compiler.reasoning(
            {"json_schema": {"type": "array", "items": {"type": "object"}, "uniqueItems": True}}
        )
