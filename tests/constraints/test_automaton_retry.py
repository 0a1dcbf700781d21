"""An automaton too large when rules are inlined compiles again with rules kept as rules
(the branches of an anyOf then run side by side as pushdown stacks)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
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


def test_live_states_are_found_once_per_rule_callees_first(monkeypatch):
    """The productive rules' fixpoint visits callees before their callers, so a rule that
    calls others but not itself has its live states found once, with its callees settled,
    and its minimisation reuses them. Before, the start rule came first: found live with its
    callee not yet known productive, then again for its minimisation. A rule that calls
    itself is found live before it is known productive, then again with its own calls
    productive."""
    from deepinfer.constraints.automaton import pushdown

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["name"],
    }
    found: dict[int, int] = {}
    real = pushdown.live_states

    def counted(dfa, productive):
        found[id(dfa)] = found.get(id(dfa), 0) + 1
        return real(dfa, productive)

    monkeypatch.setattr(pushdown, "live_states", counted)
    g = schema_to_grammar(schema, whitespace="compact")
    automaton = _compile(g, Limits(), None, float("inf"), memo=None)
    # the start rule (it calls the schema's own rule "ref:#"), then "ref:#" and JSON values
    # (each calls itself)
    assert sorted(found.values()) == [1, 2, 2]
    assert automaton.accepts(b'{"name":"a","tags":[{"name":"b"},{"name":"c","tags":[]}]}')
    assert not automaton.accepts(b'{"tags":[]}')


def test_callees_first_orders_rules_after_what_they_call():
    """``_callees_first``: a post-order of the call graph from rule 0 (cycles broken where
    met), then the rules rule 0 does not reach."""
    from deepinfer.constraints.automaton.nfa import with_calls
    from deepinfer.constraints.automaton.pushdown import _callees_first

    def rule(*calls):
        n = len(calls) + 1
        src = np.arange(len(calls), dtype=np.int64)
        return with_calls(
            np.full((n, 1), -1, dtype=np.int32),
            np.ones(n, dtype=bool),
            src,
            np.array(calls, dtype=np.int64),
            src + 1,
        )

    # 0 -> 2, 3; 2 -> 3; 3 -> 2 (a cycle); 1 unreached; 4 -> 0
    raw = [rule(2, 3), rule(), rule(3), rule(2), rule(0)]
    order = _callees_first(raw)
    assert sorted(order) == list(range(5)) and order.index(0) == 2 and order[3:] == [1, 4]
    assert max(order.index(2), order.index(3)) < order.index(0)  # (the cycle 2 <-> 3: either first)
    assert _callees_first([rule()]) == [0]
