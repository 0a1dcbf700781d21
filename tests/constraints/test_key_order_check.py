"""JSON object keys in any order (``key_order="any"``): the run-time check of
:mod:`deepinfer.constraints.key_order`.

- Completeness: every permutation of the keys of valid instances is accepted by the
  automaton with the check, and (a few per instance) token by token, greedily tokenized and
  byte by byte; schema order stays the default (and rejects them).
- Soundness: a key given twice, a missing required key, an undeclared key under
  ``additionalProperties: false`` are rejected; seeded random walks over the token masks
  end in JSON that jsonschema validates (with keys in whatever order the walk chose).
- The fast mask rows equal the reference rows (every allowed token stepped).
- MaskBench (shared data, a few schemas): instances in their own key order are accepted.
"""

from __future__ import annotations

import functools
import itertools
import json
import random

import jsonschema
import numpy as np
import pytest

from deepinfer import SamplingParams
from deepinfer.constraints import Compiler, ConstraintError, Matcher
from deepinfer.constraints.bitmask import unpack_bitmask
from deepinfer.constraints.json_schema import schema_to_grammar
from deepinfer.constraints.key_order import KeyOrderCheck, compile_unique
from deepinfer.constraints.tag_check import _add_event, _walk, _walk_ref, accepts

from .shared_data import need_shared
from .vocabs import small_vocab

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9},
        "owner": PERSON,
        "extra": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}}},
    },
    "required": ["owner", "id"],
}
OVERLAP = {  # anyOf branches whose objects read alike (one DFA state while they agree)
    "anyOf": [
        {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "y": {"type": "boolean"}},
            "required": ["x"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"x": {"type": "string"}, "y": {"type": "boolean"}},
            "required": ["y"],
            "additionalProperties": False,
        },
    ]
}
UNIQUE = {  # uniqueItems (checked at run time) and key order in one automaton
    "type": "array",
    "uniqueItems": True,
    "maxItems": 3,
    "items": {
        "type": "object",
        "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 2}, "v": {"type": "boolean"}},
        "required": ["k"],
        "additionalProperties": False,
    },
}
RECURSIVE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "v": {"type": "integer"},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["v"],
            "additionalProperties": False,
        }
    },
    "$ref": "#/$defs/node",
}
BOUNDED = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
    "minProperties": 2,
    "maxProperties": 2,
    "additionalProperties": {"type": "boolean"},
}

# (name, schema, valid instances, invalid texts)
CASES = [
    (
        "person",
        PERSON,
        [{"name": "Ann", "age": 3, "tags": ["a", "b"]}, {"name": "Bo", "age": 40}],
        ['{"age":3}', '{"age":3,"name":"a","age":4}', '{"name":"a","age":3,"zip":1}', '{"name":"a"}', "{}"],
    ),
    (
        "nested",
        NESTED,
        [{"id": 1, "owner": {"name": "x", "age": 1}, "extra": {"a": True, "b": None}, "more": [1]}],
        [
            '{"owner":{"age":1},"id":1}',
            '{"id":1,"owner":{"name":"x","age":1},"id":2}',
            '{"owner":{"name":"x","age":1}}',
        ],
    ),
    (
        "overlap",
        OVERLAP,
        [{"x": 1, "y": True}, {"y": False, "x": "s"}, {"x": 2}, {"y": True}],
        ['{"x":"s"}', "{}", '{"y":true,"y":true}', '{"x":1,"x":1}'],
    ),
    (
        "unique",
        UNIQUE,
        [[{"k": 0, "v": True}, {"v": True, "k": 1}], [{"k": 2}]],
        ['[{"k":0,"v":true},{"v":true,"k":0}]', '[{"v":true}]', '[{"k":0,"k":1}]'],
    ),
    (
        "recursive",
        RECURSIVE,
        [{"v": 1, "kids": [{"kids": [], "v": 2}, {"v": 3}]}],
        ['{"kids":[]}', '{"v":1,"kids":[{"kids":[]}]}', '{"v":1,"v":1}'],
    ),
    (
        "bounded",
        BOUNDED,
        [{"c": 1, "a": 2}, {"x": True, "b": 1}],
        ['{"a":1}', '{"a":1,"b":2,"c":3}', '{"a":1,"a":2}', '{"x":true,"x":false}'],
    ),
]


def _perms(value):
    """Every key order of the top-level object (and of nested objects, one at a time)."""
    if isinstance(value, dict):
        keys = list(value)
        for order in itertools.permutations(keys):
            yield {k: value[k] for k in order}
        for k in keys:
            for sub in itertools.islice(_perms(value[k]), 1, 4):
                yield {**value, k: sub}
    elif isinstance(value, list):
        yield value
        for i, v in enumerate(value):
            for sub in itertools.islice(_perms(v), 1, 4):
                yield value[:i] + [sub] + value[i + 1 :]
    else:
        yield value


def _texts(value, ws: str) -> list[str]:
    sep = (",", ":") if ws == "compact" else (", ", ": ")
    return [json.dumps(p, separators=sep) for p in _perms(value)]


@pytest.mark.parametrize("ws", ["compact", "flexible"])
@pytest.mark.parametrize("name,schema,good,bad", CASES, ids=[c[0] for c in CASES])
def test_bytes_any_order(name, schema, good, bad, ws):
    g = schema_to_grammar(schema, whitespace=ws, key_order="any")
    _, tags = compile_unique(g)
    assert tags is not None and not g.notes, g.notes
    validator = jsonschema.Draft202012Validator(schema)
    for value in good:
        for text in _texts(value, ws):
            assert validator.is_valid(json.loads(text)), text
            assert accepts(tags, text.encode()), (name, text)
    for text in bad:
        assert not accepts(tags, text.encode()), (name, text)


def test_schema_order_stays_the_default():
    c = Compiler(small_vocab())
    default = c.json_schema(PERSON, whitespace="compact")
    anyorder = c.json_schema(PERSON, whitespace="compact", key_order="any")
    assert default is not anyorder and default.check is None and isinstance(anyorder.check, KeyOrderCheck)
    text = b'{"age":3,"name":"a"}'
    assert not default.accepts(text) and anyorder.accepts(text)
    assert Compiler(small_vocab(), key_order="any").json_schema(PERSON, whitespace="compact").accepts(text)
    with pytest.raises(ConstraintError, match="key_order must be one of"):
        c.json_schema(PERSON, key_order="sorted")
    with pytest.raises(ValueError, match="key_order"):
        SamplingParams(json_schema=PERSON, key_order="random")


@pytest.fixture(scope="module")
def compiler():
    return Compiler(small_vocab(), key_order="any")


def _tokens(vocab, data: bytes) -> list[int]:
    return vocab.index().greedy_tokenize(data, vocab)


@pytest.mark.parametrize("name,schema,good,bad", CASES, ids=[c[0] for c in CASES])
def test_tokens_any_order(compiler, name, schema, good, bad):
    compiled = compiler.json_schema(schema, whitespace="compact")
    vocab = compiled.vocab
    single = {piece[0]: i for i, piece in enumerate(vocab.token_bytes) if piece and len(piece) == 1}
    for value in good:
        for text in _texts(value, "compact")[:6]:
            m = Matcher(compiled)
            for t in _tokens(vocab, text.encode()):
                assert m.accept(t), (name, text, vocab.token_bytes[t])
            assert m.can_end(), (name, text)
            m = Matcher(compiled)  # byte by byte
            for b in text.encode():
                assert m.accept(single[b]), (name, text, b)
            assert m.can_end(), (name, text)
    for text in bad:
        m = Matcher(compiled)
        ok = all(m.accept(t) for t in _tokens(vocab, text.encode())) and m.can_end()
        assert not ok, (name, text)


def test_duplicate_key_is_masked_and_explained(compiler):
    compiled = compiler.json_schema(PERSON, whitespace="compact")
    vocab = compiled.vocab
    m = Matcher(compiled)
    assert m.accept_bytes(b'{"name":"a","age":1') and m.accept_bytes(b',"name"')
    colon = vocab.token_bytes.index(b":")
    row = unpack_bitmask(m.mask_row()[None], vocab.vocab_size)[0]
    assert not row[colon] and not m.accept(colon)
    assert not row.any() and "repeats a key" in m.empty_reason()
    m.rollback(1)
    assert m.accept_bytes(b',"tags"') and m.accept(colon)
    # a required key missing: no "}"
    m = Matcher(compiled)
    assert m.accept_bytes(b'{"age":1')
    brace = vocab.token_bytes.index(b"}")
    assert not m.accept(brace) and not unpack_bitmask(m.mask_row()[None], vocab.vocab_size)[0][brace]


def test_markers_only_in_branches_that_cannot_match(compiler):
    """Keys that all end in "a" or all start with "b", one starting "2345": the objects that
    could carry key-order markers (the "b" branch) cannot match, so no marker edge is left and
    the constraint needs no key check (maskbench-dev's Handwritten allOfPProp7, reduced)."""
    schema = {
        "allOf": [
            {
                "anyOf": [
                    {"patternProperties": {"a$": {}}, "additionalProperties": False},
                    {"patternProperties": {"^b": True}, "additionalProperties": False},
                ]
            },
            {"anyOf": [{"not": {"patternProperties": {"^2345": False}}}]},
        ],
        "patternProperties": {"a": {"not": {"multipleOf": 20}}},
    }
    compiled = compiler.json_schema(schema, whitespace="compact")
    assert compiled.check is None
    validator = jsonschema.Draft202012Validator(schema)
    for text in ['{"xa":2,"2345a":1}', '{"2345a":3}']:  # (the member a "not" asks for is written last)
        assert validator.is_valid(json.loads(text)) and compiled.accepts(text.encode()), text
    for text in ['{"b":1}', '{"2345a":40}', '{"2345a":1,"b":2}', "{}"]:
        assert not validator.is_valid(json.loads(text)) and not compiled.accepts(text.encode()), text


WALKED = [c for c in CASES if c[0] != "nested"]  # (nested: extra members of any JSON, walks seldom end)


@pytest.mark.parametrize("name,schema,good,bad", WALKED, ids=[c[0] for c in WALKED])
def test_random_walks_valid_and_fast_rows_equal_reference(compiler, name, schema, good, bad):
    compiled = compiler.json_schema(schema, whitespace="compact")
    check = compiled.check
    vocab = compiled.vocab
    tb = vocab.token_bytes
    eos = set(vocab.eos_ids)
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(name)
    finished = 0
    for walk in range(25):
        m = Matcher(compiled)
        out = bytearray()
        for _step in range(70):
            fast = check.row(m.state, m.text)
            if walk < 4:
                assert np.array_equal(fast, check.row_reference(m.state, m.text)), (name, bytes(m.text))
            allowed = [int(t) for t in np.nonzero(unpack_bitmask(fast[None], vocab.vocab_size)[0])[0]]
            if not allowed:
                break  # a dead end the check alone causes (a key the walk wrote again)
            if any(t in eos for t in allowed) and (rng.random() < 0.6 or all(t in eos for t in allowed)):
                assert validator.is_valid(json.loads(out.decode("utf-8"))), bytes(out)
                assert m.accept(next(t for t in allowed if t in eos))
                finished += 1
                break
            choices = [t for t in allowed if t not in eos]
            # prefer keys already written (duplicates) and closing tokens
            echo = [t for t in choices if len(tb[t]) > 2 and tb[t] in out]
            closing = [t for t in choices if tb[t][:1] in (b"}", b"]", b'"', b",")]
            u = rng.random()
            t = rng.choice(echo if echo and u < 0.3 else closing if closing and u < 0.7 else choices)
            assert m.accept(t), tb[t]
            out += tb[t]
            if rng.random() < 0.1:
                m.rollback(1)
                assert m.accept(t)
    assert finished >= 3, (name, finished)


def _frames_fold(tags, buf: bytes, data: bytes, fr, k, j: int):
    return tags.apply(fr, k, len(buf) + j, buf, data)


# recursive arrays of unique items and objects whose keys come in any order: a pushdown
# automaton with both checks' tags
UNIQUE_NESTED = {
    "$defs": {
        "n": {
            "type": "array",
            "uniqueItems": True,
            "items": {
                "anyOf": [
                    {"type": "integer"},
                    {"$ref": "#/$defs/n"},
                    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"$ref": "#/$defs/n"}}},
                ]
            },
        }
    },
    "$ref": "#/$defs/n",
}
STEPPED = [(c[0], c[1]) for c in WALKED] + [("unique-nested", UNIQUE_NESTED)]


@pytest.mark.parametrize("name,schema", STEPPED, ids=[c[0] for c in STEPPED])
def test_steps_kept_equal_steps_taken_afresh(compiler, name, schema):
    """The check's walks of a token from a matcher's groups take each pushdown step (a
    configuration's moves by one byte class, its stacks closed by the tag they meet) from
    a memo: on random walks, for tokens the row allows and tokens it refuses, with the
    symbolic fold and the frames' fold, the groups that survive equal those of the walk
    that steps and closes every byte afresh (``_walk_ref``)."""
    compiled = compiler.json_schema(schema, whitespace="compact")
    check = compiled.check
    tags, tb = check.tags, compiled.vocab.token_bytes
    rng = random.Random(name + "steps")
    compared = 0
    for _ in range(8):
        m = Matcher(compiled)
        for _ in range(40):
            groups, buf = m.state, bytes(m.text)
            if tags.automaton.is_regular:
                return  # (a DFA's walks keep no steps)
            row = check.row(groups, buf)
            allowed = [int(t) for t in np.nonzero(unpack_bitmask(row[None], compiled.vocab.vocab_size)[0])[0]]
            allowed = [t for t in allowed if tb[t]]
            if not allowed:
                break
            for t in rng.sample(allowed, min(6, len(allowed))) + rng.sample(range(2, len(tb)), 6):
                data = tb[t]
                if not data:
                    continue
                frames = functools.partial(_frames_fold, tags, buf, data)
                for fold in (_add_event, frames):
                    assert _walk(tags, groups, data, fold) == _walk_ref(tags, groups, data, fold), (buf, data)
                    compared += 1
            assert m.accept(rng.choice(allowed))
    assert compared > 100


MASKBENCH = [
    "Github_medium---o47944.json",
    "Github_medium---o55359.json",
    "Github_medium---o76576.json",  # (overlapping oneOf branches of objects)
]


@pytest.mark.parametrize("fname", MASKBENCH)
def test_maskbench_instances_in_their_own_key_order(fname):
    """Schemas whose valid instances were false rejections in schema order: with
    key_order="any" each is accepted as written, and each invalid one still rejected."""
    case = json.loads(need_shared("maskbench-dev", fname).read_text())
    g = schema_to_grammar(case["schema"], whitespace="compact", key_order="any")
    a, tags = compile_unique(g)
    assert not g.notes, g.notes
    order = schema_to_grammar(case["schema"], whitespace="compact")
    b, _ = compile_unique(order)
    out_of_order = 0
    for test in case["tests"]:
        text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False).encode()
        assert accepts(tags, text) == test["valid"], (fname, text[:200])
        out_of_order += test["valid"] and not b.accepts(text)
    assert out_of_order, "the schema-order grammar should reject some valid instance as written"
