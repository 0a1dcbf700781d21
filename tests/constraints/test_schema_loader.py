"""The one schema loader (``json_schema.loader``) and the uniqueItems matcher wrapper."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import BaseModel

from deepinfer.constraints import Compiler, ConstraintError, Matcher, load_schema
from deepinfer.constraints.json_schema.loader import is_schema_source, schema_key
from deepinfer.constraints.unique_items import UniqueItemsMatcher

from .vocabs import small_vocab


class Point(BaseModel):
    x: int
    y: int


@dataclasses.dataclass
class Pair:
    a: str
    b: bool


def test_dicts_and_bools_are_the_schema():
    s = {"type": "integer"}
    assert load_schema(s) is s and load_schema(True) is True and load_schema(False) is False


def test_json_text_is_parsed():
    assert load_schema('{"type": "string"}') == {"type": "string"}
    assert load_schema("true") is True


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"type": "object",', r"schema is not valid JSON: .*line 1 column 19 .*\(at #\)"),
        ("[1]", r"a JSON Schema is an object or a bool, got list"),
        ("12", r"a JSON Schema is an object or a bool, got int"),
    ],
)
def test_bad_json_text_names_the_problem(text, message):
    with pytest.raises(ConstraintError, match=message):
        load_schema(text)


def test_models_and_types_pydantic_describes():
    assert load_schema(Point) == Point.model_json_schema()
    assert load_schema(list[int]) == {"type": "array", "items": {"type": "integer"}}
    assert load_schema(Pair)["properties"].keys() == {"a", "b"}


def test_what_is_not_a_schema_is_refused():
    for bad in (3, 2.5, None, [1], b"{}"):
        assert not is_schema_source(bad)
        with pytest.raises(ConstraintError, match="expected a JSON Schema"):
            load_schema(bad)
    with pytest.raises(ConstraintError, match="json_schema must be"):
        schema_key(None)


def test_cache_keys():
    assert schema_key('{"a": 1}') == '{"a": 1}'  # JSON text is its own key
    assert schema_key({"a": "é"}) == '{"a": "é"}'
    assert schema_key(Point).endswith(":" + __import__("json").dumps(Point.model_json_schema()))


@pytest.fixture(scope="module")
def compiler():
    return Compiler(small_vocab())


def test_compiler_takes_every_kind(compiler):
    for spec in (
        {"type": "array", "items": {"type": "integer"}},
        '{"type": "array", "items": {"type": "integer"}}',
        list[int],
    ):
        m = Matcher(compiler.json_schema(spec))
        assert m.accept_bytes(b"[1,2]") and m.can_end()
    m = Matcher(compiler.json_schema(Point))
    assert m.accept_bytes(b'{"x":1,"y":2}') and m.can_end()


def test_unique_items_matcher_wraps_a_plain_matcher(compiler):
    compiled = compiler.json_schema(
        {"type": "array", "uniqueItems": True, "items": {"type": "object"}}, whitespace="compact"
    )
    m = Matcher(compiled)
    assert isinstance(m, UniqueItemsMatcher) and compiled.check is not None
    plain = Matcher.plain(compiled)  # the automaton alone: no uniqueness
    assert type(plain) is Matcher
    assert m.accept_bytes(b"[{},") and plain.accept_bytes(b"[{},")
    c = m.copy()
    assert m.accept_bytes(b"{}") and plain.accept_bytes(b"{}")
    assert not m.accept_bytes(b"]") and plain.accept_bytes(b"]")  # a duplicate item
    assert m.empty_reason() is not None and not m.mask_row().any()
    m.rollback(1)
    assert bytes(m.text) == b"[{}," and m.num_accepted() == 1
    assert c.accept_bytes(b'{"a":1}]') and c.can_end() and bytes(c.text) == b'[{},{"a":1}]'
    m.reset()
    assert m.num_accepted() == 0 and bytes(m.text) == b""
