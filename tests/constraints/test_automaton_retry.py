"""An automaton too large when rules are inlined compiles again with rules kept as rules
(the branches of an anyOf then run side by side as pushdown stacks)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from deepinfer.constraints.automaton.nfa import Limits
from deepinfer.constraints.automaton.pushdown import CALL_ABOVE, _compile, compile_grammar
from deepinfer.constraints.errors import ConstraintTooComplex
from deepinfer.constraints.json_schema import schema_to_grammar

from .shared_data import need_shared

REPO = Path(__file__).resolve().parents[2]


def _object(prefix: str, n: int) -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {f"{prefix}{i}": {"type": "string", "maxLength": 6} for i in range(n)},
    }


SCHEMA = {"anyOf": [_object("a", 6), _object("b", 6), _object("ab", 6)]}
CASES = [
    {"a0": "x", "a3": "yy"},
    {"b1": ""},
    {"ab5": "zzz"},
    {},
    {"a0": "x", "b1": "y"},
    {"a0": "toolong!"},
    {"ab0": "x", "a1": "y"},
    {"c": "1"},
    {"a1": "x", "a5": "y"},
]  # schema key order


def test_rules_kept_as_rules_accept_the_same_language():
    g = schema_to_grammar(SCHEMA)
    inlined = _compile(g, Limits(), None, float("inf"))
    called = _compile(g, Limits(), CALL_ABOVE, float("inf"))
    assert inlined.is_regular and not called.is_regular
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for value in CASES:
        text = json.dumps(value, separators=(",", ":")).encode()
        assert called.accepts(text) == inlined.accepts(text) == validator.is_valid(value), value
        for cut in range(len(text)):
            assert called.is_prefix(text[:cut]) == inlined.is_prefix(text[:cut])


def test_the_first_error_is_reported_when_both_attempts_fail():
    with pytest.raises(ConstraintTooComplex, match="exceeds 5 states"):
        compile_grammar(schema_to_grammar(SCHEMA), Limits(max_dfa_states=5))


def test_a_schema_too_large_inlined_compiles_with_its_rules_kept():
    path = need_shared("maskbench-dev", "Kubernetes---kb_862_Normalized.json")
    case = json.loads(path.read_text())
    g = schema_to_grammar(case["schema"])
    with pytest.raises(ConstraintTooComplex):
        _compile(g, Limits(), None, float("inf"))
    automaton = compile_grammar(g)
    for test in case["tests"]:
        if test["valid"]:
            continue  # valid instances need the schema's key order (the maskbench test does that)
        text = json.dumps(test["data"], separators=(",", ":")).encode()
        assert not automaton.accepts(text)
