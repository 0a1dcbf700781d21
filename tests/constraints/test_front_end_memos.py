"""The front end's memos across compilations: bounded by the IR nodes they hold, so a
long-running process's full collections stay short however many distinct schemas it
compiles, and the compilations are the same with the memos warm, cold or evicting."""

from __future__ import annotations

import gc
import random
import threading

import pytest

from deepinfer.constraints import ir
from deepinfer.constraints.automaton.pushdown import compile_grammar
from deepinfer.constraints.frontends import regex_classes
from deepinfer.constraints.ir import Expr
from deepinfer.constraints.json_schema import common, formats, schema_to_grammar
from deepinfer.constraints.memo import NodeMemo

MEMOS = {
    "cost_over": common._OVER,
    "masks": ir._MASKS,
    "formats": formats._KEPT,
    "classes": regex_classes._CLASS_CACHE,
    "utf8": regex_classes._UTF8_CACHE,
}


def _nodes_held(memo: NodeMemo) -> int:
    """Distinct IR nodes reachable from the memo's entries."""
    seen: set[int] = set()
    stack = list(gc.get_referents(memo._d))
    n = 0
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, Expr):
            n += 1
        if isinstance(o, (Expr, tuple, frozenset, list)):
            stack.extend(gc.get_referents(o))
    return n


def test_lru_evicts_the_least_recent_by_weight():
    m = NodeMemo(100)
    for k in range(10):
        m.put(k, str(k), 10)
    assert len(m) == 10 and m.nodes == 100
    assert m.get(0) == "0"  # now the most recent
    m.put("new", "x", 12)  # evicts 1 and 2 (the least recent), not 0
    assert m.get(1) is None and m.get(2) is None
    assert m.get(0) == "0" and m.get("new") == "x"
    assert m.nodes <= 100
    assert m.put("big", "y", 13) == "y" and m.get("big") is None  # over an eighth: not kept
    m.put(0, "again", 5)  # replacing an entry re-weighs it
    assert m.get(0) == "again" and m.nodes == sum(w for _, w in m._d.values())
    m.clear()
    assert len(m) == 0 and m.nodes == 0


def test_threads_share_a_memo():
    m = NodeMemo(500)
    errors = []

    def work(seed: int) -> None:
        rnd = random.Random(seed)
        try:
            for _ in range(3000):
                k = rnd.randrange(200)
                v = m.get(k)
                if v is None:
                    m.put(k, k * 2, rnd.randrange(1, 20))
                else:
                    assert v == k * 2
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert m.nodes == sum(w for _, w in m._d.values()) <= 500


def _schema(rnd: random.Random, k: int) -> dict:
    """A schema of its own: distinct property names, patterns, enums and bounds."""
    props = {}
    for j in range(rnd.randrange(4, 9)):
        kind = rnd.randrange(4)
        if kind == 0:
            p = {"type": "string", "pattern": f"^[a-{'fkpz'[j % 4]}]{{1,{rnd.randrange(2, 9)}}}x{k}$"}
        elif kind == 1:
            p = {"type": "integer", "minimum": rnd.randrange(-50, 0), "maximum": rnd.randrange(1, 5000)}
        elif kind == 2:
            p = {"enum": [f"v{k}_{j}_{i}" for i in range(rnd.randrange(2, 6))]}
        else:
            p = {
                "type": "object",
                "properties": {f"in{k}_{i}": {"type": "string", "maxLength": 3 + i} for i in range(3)},
                "required": [f"in{k}_0"],
            }
        props[f"p{k}_{j}"] = p
    return {"type": "object", "properties": props, "required": sorted(props)[:2]}


@pytest.fixture
def small_memos(monkeypatch):
    """The memos with a small bound (and emptied), restored afterwards."""
    for m in MEMOS.values():
        monkeypatch.setattr(m, "max_nodes", 1500)
        m.clear()
    yield
    for m in MEMOS.values():
        m.clear()


def test_many_schemas_keep_the_memos_bounded(small_memos):
    rnd = random.Random(7)
    schemas = [_schema(rnd, k) for k in range(80)]
    for s in schemas:  # (unbounded, the cost memo alone would hold about 4,000 nodes)
        compile_grammar(schema_to_grammar(s, whitespace="compact"))
    for name, m in MEMOS.items():
        assert m.nodes <= m.max_nodes, name
        # the weights bound what is really held (a shared sub-tree counts once here)
        assert _nodes_held(m) <= m.max_nodes, name
    assert any(len(m) for m in MEMOS.values())  # (they are used)


def test_evicting_memos_compile_the_same(small_memos):
    """The same schemas compiled with the memos evicting as they go, then again with them
    warm, then cold: the same automata."""
    rnd = random.Random(11)
    schemas = [_schema(rnd, k) for k in range(12)]

    def tables():
        out = []
        for s in schemas:
            a = compile_grammar(schema_to_grammar(s, whitespace="compact"))
            out.append((a.table.tobytes(), a.accepting.tobytes(), a.cls.tobytes()))
        return out

    first = tables()
    assert tables() == first
    for m in MEMOS.values():
        m.clear()
    assert tables() == first


def test_shared_sub_expressions_are_walked_once(monkeypatch):
    """A sub-expression shared many times (a DAG whose tree size is 2^60, far over any
    memo's bound, so the memo across compilations keeps none of it) has its byte sets
    collected once per node, not once per path."""
    calls = []

    class Counting(NodeMemo):
        def get(self, key):
            calls.append(key)
            return super().get(key)

    monkeypatch.setattr(ir, "_MASKS", Counting(1000))
    x = ir.Seq(tuple(ir.ByteSet(1 << b) for b in range(ir.MASKS_MEMO_MIN)))
    expected = {1 << b for b in range(ir.MASKS_MEMO_MIN)}
    for level in range(60):
        bit = 1 << (100 + level)
        x = ir.Seq((ir.Repeat(x, 0, 2), ir.ByteSet(bit), ir.Repeat(x, 1, 3)))
        expected.add(bit)
    assert x._size > 2**60
    assert ir.collect_masks({"start": x}, ["start"], set()) == expected
    assert len(calls) <= 3 * 61  # (each large node asked once)


def test_any_value_rule_is_one_object_across_compilations():
    """Schemas that allow any JSON value, written with the same whitespace, share the value
    rule's body itself, so what is kept by it (its DFA, its byte sets) is found by identity."""
    from deepinfer.constraints.json_schema import lowering

    a = schema_to_grammar({"type": "object"}, whitespace="compact")
    b = schema_to_grammar({"type": "array", "items": {}}, whitespace="compact")
    c = schema_to_grammar({"type": "object"}, whitespace="flexible")
    assert a.rules["json:value"] is b.rules["json:value"]
    assert c.rules["json:value"] is not a.rules["json:value"]
    assert c.rules["json:value"] != a.rules["json:value"]  # (whitespace differs)
    assert len(lowering._ANY_VALUE) <= 16


def test_a_schema_with_an_empty_shared_rule_compiles_again():
    """Array items whose own sub-schema no document meets (arrays that must contain a number
    but whose items are all arrays) leave a shared rule that matches nothing. The same
    schema compiled again, with the shared DFAs warm (as after it left a compiler's cache),
    gives the same automaton, where it once failed with an internal error."""
    from deepinfer.constraints.automaton import nfa

    number = {"type": "number", "multipleOf": 11, "minimum": 100}
    schema = {
        "type": "array",
        "oneOf": [
            {"allOf": [{"items": {"$ref": "#/$defs/outer"}}, {"contains": {"$ref": "#/$defs/flat"}}]},
            {"allOf": [{"items": {"$ref": "#/$defs/flat"}}, {"contains": {"$ref": "#/$defs/outer"}}]},
        ],
        "$defs": {
            "outer": {"type": "array", "items": {"$ref": "#/$defs/holds"}},
            "flat": {"type": "array", "items": {"$ref": "#/$defs/numbers"}},
            "holds": {"type": "array", "contains": number},
            "numbers": {"type": "array", "items": number},
        },
    }
    nfa.SHARED_DFAS.clear()
    first, again = (compile_grammar(schema_to_grammar(schema, whitespace="compact")) for _ in range(2))
    assert first.table.tobytes() == again.table.tobytes() and first.calls == again.calls
    assert again.accepts(b"[[[]],[[110]]]")  # the second branch only
    assert not again.accepts(b"[[[110]]]") and not again.accepts(b"[]")  # both branches; neither


def test_an_object_without_pattern_keys_encodes_its_declared_keys_once(monkeypatch):
    """Where no patternProperties are declared, the extra members' key language (a JSON
    string minus the declared keys) is the only use of the declared keys' encodings: each is
    made once, not a second time for pattern keys there are none of. The extra members stay:
    an undeclared key is accepted, a declared one only with its own value."""
    made = []
    real = formats.encode_key

    def counted(key):
        made.append(key)
        return real(key)

    monkeypatch.setattr(formats, "encode_key", counted)
    schema = {"type": "object", "properties": {"alpha": {"type": "integer"}, "beta": {"type": "string"}}}
    a = compile_grammar(schema_to_grammar(schema, whitespace="compact"))
    assert sorted(made) == ["alpha", "beta"]
    assert a.accepts(b'{"alpha":1,"beta":"x","gamma":[true]}')
    assert not a.accepts(b'{"alpha":"one"}')
