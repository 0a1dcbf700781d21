"""An independent matcher for non-recursive IR, used by the regex tests as an oracle.

``ir_accepts(expr, data)`` runs a memoised backtracking match of ``expr`` over bytes;
``ir_sample(expr, rng)`` draws a random member of the language. Neither shares code
with the automaton builder, so a test that agrees with both has two witnesses.
"""

from __future__ import annotations

import random

import pytest

from deepinfer.constraints.ir import Alt, ByteSet, Expr, Repeat, Seq, alt, byte_range, lit, rep, seq


def _ends(expr: Expr, data: bytes, pos: int, memo: dict) -> frozenset[int]:
    key = (id(expr), pos)
    hit = memo.get(key)
    if hit is not None:
        return hit
    if isinstance(expr, ByteSet):
        out = frozenset((pos + 1,)) if pos < len(data) and expr.mask >> data[pos] & 1 else frozenset()
    elif isinstance(expr, Seq):
        cur = {pos}
        for item in expr.items:
            nxt: set[int] = set()
            for p in cur:
                nxt |= _ends(item, data, p, memo)
            cur = nxt
            if not cur:
                break
        out = frozenset(cur)
    elif isinstance(expr, Alt):
        acc: set[int] = set()
        for item in expr.items:
            # first-byte pruning keeps big Unicode classes cheap
            if isinstance(item, Seq) and item.items and isinstance(item.items[0], ByteSet):
                if pos >= len(data) or not item.items[0].mask >> data[pos] & 1:
                    continue
            acc |= _ends(item, data, pos, memo)
        out = frozenset(acc)
    elif isinstance(expr, Repeat):
        reached: set[int] = set()
        cur = {pos}
        count = 0
        while cur:
            if count >= expr.min:
                reached |= cur
            if expr.max is not None and count >= expr.max:
                break
            nxt: set[int] = set()
            for p in cur:
                nxt |= _ends(expr.item, data, p, memo)
            count += 1
            if count > expr.min:
                nxt -= reached  # past the minimum, revisiting a position adds nothing
            cur = nxt
        out = frozenset(reached)
    else:
        raise TypeError(f"not a non-recursive IR node: {expr!r}")
    memo[key] = out
    return out


def ir_accepts(expr: Expr, data: bytes) -> bool:
    return len(data) in _ends(expr, data, 0, {})


def ir_sample(expr: Expr, rng: random.Random, unbounded: int = 3) -> bytes | None:
    """A random member of the language (None if the walk hit an empty alternative)."""
    if isinstance(expr, ByteSet):
        vals = expr.bytes()
        return bytes([rng.choice(vals)]) if vals else None
    if isinstance(expr, Seq):
        out = b""
        for item in expr.items:
            part = ir_sample(item, rng, unbounded)
            if part is None:
                return None
            out += part
        return out
    if isinstance(expr, Alt):
        return ir_sample(rng.choice(expr.items), rng, unbounded) if expr.items else None
    if isinstance(expr, Repeat):
        hi = expr.max if expr.max is not None else expr.min + unbounded
        out = b""
        for _ in range(rng.randint(expr.min, min(hi, expr.min + unbounded))):
            part = ir_sample(expr.item, rng, unbounded)
            if part is None:
                return None
            out += part
        return out
    raise TypeError(f"not a non-recursive IR node: {expr!r}")


# ------------------------------------------------------------- the oracle's own tests

_AB = alt(lit("a"), lit("b"))
ORACLE_CASES = [
    (lit("abc"), b"abc", True),
    (lit("abc"), b"ab", False),
    (seq(lit("a"), rep(_AB, 0, None), lit("b")), b"abab", True),
    (seq(lit("a"), rep(_AB, 0, None), lit("b")), b"aba", False),
    (rep(lit("ab"), 2, 3), b"abab", True),
    (rep(lit("ab"), 2, 3), b"ab", False),
    (rep(lit("ab"), 2, 3), b"abababab", False),
    (rep(rep(lit("a"), 0, 1), 2, None), b"", True),
    (rep(seq(byte_range(0x30, 0x39), rep(lit("x"), 0, 1)), 1, None), b"1x23x", True),
    (Alt(()), b"", False),
    (Seq(()), b"", True),
]


@pytest.mark.parametrize("expr,data,expected", ORACLE_CASES)
def test_regex_oracle_matcher(expr: Expr, data: bytes, expected: bool) -> None:
    assert ir_accepts(expr, data) is expected


def test_regex_oracle_sampler_stays_in_language() -> None:
    rng = random.Random(0)
    expr = seq(lit("a"), rep(_AB, 1, None), rep(lit("é"), 0, 2))
    for _ in range(50):
        s = ir_sample(expr, rng)
        assert s is not None and ir_accepts(expr, s)
