"""The JSON Schema lowering's fast paths against their references, on random inputs:
``cost_over`` (a bounded walk) against ``cost`` (the whole walk), and the jsonschema
validator class made once per draft: its regexes matched by the search of the check that
runs it, whichever compilation made the check."""

from __future__ import annotations

import random

import pytest

from deepinfer.constraints import Compiler, ir
from deepinfer.constraints.json_schema import lowering
from deepinfer.constraints.json_schema.common import cost, cost_over

from .vocabs import small_vocab


def _random_expr(rng: random.Random, depth: int, pool: list) -> ir.Expr:
    if pool and rng.random() < 0.2:
        return rng.choice(pool)  # a shared node (counted once by cost)
    if depth == 0 or rng.random() < 0.2:
        e = ir.lit(rng.choice(["a", "bc", "def"]))
    else:
        kind = rng.randrange(3)
        subs = [_random_expr(rng, depth - 1, pool) for _ in range(rng.randint(1, 4))]
        if kind == 0:
            e = ir.seq(*subs)
        elif kind == 1:
            e = ir.alt(*subs)
        else:
            lo = rng.choice([0, 1, 3, 70])
            e = ir.rep(subs[0], lo, rng.choice([None, lo, lo + 5, 200]))
    pool.append(e)
    return e


@pytest.mark.parametrize("seed", range(60))
def test_cost_over_agrees_with_cost(seed):
    rng = random.Random(seed)
    e = _random_expr(rng, rng.randint(1, 4), [])
    full = cost(e)
    for bound in (0, 1, 5, 64, full - 1, full, full + 1, 10 * full):
        assert cost_over(e, bound) == (full > bound), (bound, full)


def test_the_validator_class_is_made_once_and_searches_with_its_checks_compilation():
    c = Compiler(small_vocab())
    schema = {
        "type": "object",
        "properties": {"k": {"enum": ["ab", "ba", "abab"], "pattern": "^(ab)+$"}},
        "required": ["k"],
    }
    for _ in range(2):
        compiled = c.json_schema(schema, whitespace="compact")
        assert compiled.accepts('{"k":"abab"}') and not compiled.accepts('{"k":"ba"}')
        schema = {**schema, "title": "again"}  # (another schema: compiled again)
    assert len(lowering._SAFE_CLASSES) >= 1
    searches = []
    sc = lowering._SchemaCompiler({"pattern": "^a"}, "compact", False, False)
    sc.search = lambda p, t, ptr="#": searches.append((p, t)) or t.startswith("a")
    check = sc.validator({"pattern": "^a"})
    assert check.is_valid("abc") and not check.is_valid("xbc")
    assert searches == [("^a", "abc"), ("^a", "xbc")]
