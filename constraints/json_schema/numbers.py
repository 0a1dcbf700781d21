"""JSON numbers as byte-level IR: the number grammar and exact decimal ranges.

All languages here are canonical JSON number texts: no leading zeros, no ``+``, no ``-0``
inside a bounded range. Bounded languages (``minimum`` and friends, ``multipleOf`` of
the form ``10**-k``) accept plain decimals only (``12``, ``12.50``), no exponent: the
grammar must decide the value digit by digit, which an exponent would defeat. Python's
``json.dumps`` writes every integer and every float in ``[1e-4, 1e16)`` this way.
"""

from __future__ import annotations

from decimal import Decimal

from ..ir import EMPTY, NOTHING, Dfa, Expr, alt, byte_range, intersect, lit, opt, plus, rep, seq, star

DIGIT = byte_range(0x30, 0x39)
NONZERO = byte_range(0x31, 0x39)
MINUS = lit("-")
NAT = alt(lit("0"), seq(NONZERO, star(DIGIT)))
INTEGER = seq(opt(MINUS), NAT)
NUMBER = seq(
    INTEGER,
    opt(seq(lit("."), plus(DIGIT))),
    opt(seq(alt(lit("e"), lit("E")), opt(alt(lit("+"), lit("-"))), plus(DIGIT))),
)

# numbers that are not integers: a plain decimal with a non-zero fraction digit, or a
# mantissa in [1, 10) times a negative power of ten (Python writes 1e-05); no integer is
# written either way, and json.dumps writes every non-integral float so
_FRAC_NONZERO = seq(lit("."), star(DIGIT), NONZERO, star(DIGIT))
NONINT_PLAIN = seq(opt(MINUS), NAT, _FRAC_NONZERO)
NONINT = alt(
    NONINT_PLAIN,
    seq(
        opt(MINUS),
        NONZERO,
        opt(seq(lit("."), star(DIGIT), NONZERO)),
        alt(lit("e"), lit("E")),
        lit("-"),
        star(lit("0")),
        NONZERO,
        star(DIGIT),
    ),
)


def _digits(lo: str, hi: str) -> Expr:
    return byte_range(ord(lo), ord(hi)) if lo <= hi else NOTHING


def _same_len(a: str, b: str) -> Expr:
    """Digit strings of len(a) == len(b) between a and b inclusive (leading zeros kept)."""
    if a > b:
        return NOTHING
    if not a:
        return EMPTY
    if a == b:
        return lit(a)
    if len(a) == 1:
        return _digits(a, b)
    n = len(a) - 1
    if a[0] == b[0]:
        return seq(lit(a[0]), _same_len(a[1:], b[1:]))
    parts = []
    if a[1:] == "0" * n:
        lo_first = a[0]
    else:
        parts.append(seq(lit(a[0]), _same_len(a[1:], "9" * n)))
        lo_first = chr(ord(a[0]) + 1)
    if b[1:] == "9" * n:
        hi_first = b[0]
        tail = None
    else:
        hi_first = chr(ord(b[0]) - 1)
        tail = seq(lit(b[0]), _same_len("0" * n, b[1:]))
    if lo_first <= hi_first:
        parts.append(seq(_digits(lo_first, hi_first), rep(DIGIT, n, n)))
    if tail is not None:
        parts.append(tail)
    return alt(*parts)


def nat_range(lo: int, hi: int | None) -> Expr:
    """Canonical decimal texts of the integers ``lo..hi`` (``lo >= 0``; ``hi=None``: no bound)."""
    lo = max(lo, 0)
    if hi is not None and hi < lo:
        return NOTHING
    parts: list[Expr] = []
    top = hi if hi is not None else 10 ** len(str(lo)) - 1
    for length in range(len(str(lo)), len(str(top)) + 1):
        a = max(lo, 10 ** (length - 1) if length > 1 else 0)
        b = min(top, 10**length - 1)
        if a <= b:
            parts.append(_same_len(str(a).zfill(length), str(b).zfill(length)))
    if hi is None:
        parts.append(seq(NONZERO, rep(DIGIT, len(str(lo)), None)))
    return alt(*parts)


def int_range(lo: int | None, hi: int | None) -> Expr:
    """Canonical JSON integers in ``[lo, hi]`` (``None``: unbounded)."""
    if lo is None and hi is None:
        return INTEGER
    parts = []
    if lo is None or lo < 0:  # negative side: "-" v with v in [max(1, -hi), -lo]
        vmin = max(1, -hi) if hi is not None else 1
        vmax = -lo if lo is not None else None
        if vmax is None or vmin <= vmax:
            parts.append(seq(MINUS, nat_range(vmin, vmax)))
    if hi is None or hi >= 0:
        parts.append(nat_range(max(0, lo if lo is not None else 0), hi))
    return alt(*parts)


# ------------------------------------------------------------------ decimal fractions
# A fraction F (the digits after ".") is compared as 0.F. Each helper returns
# (empty_ok, nonempty): whether "no fraction" (value 0) qualifies, and the language of
# non-empty digit strings F that qualify. ``cap`` limits significant digits (multipleOf
# 10**-cap): digits past position ``cap`` must be zeros.


class _Frac:
    def __init__(self, cap: int | None) -> None:
        self.cap = cap

    def any(self, pos: int) -> Expr:
        """Any digit string (possibly empty) starting at position ``pos``."""
        if self.cap is None:
            return star(DIGIT)
        return seq(rep(DIGIT, 0, max(0, self.cap - pos)), star(lit("0")))

    def digit(self, lo: str, hi: str, pos: int) -> Expr:
        if self.cap is not None and pos >= self.cap:
            return lit("0") if lo == "0" else NOTHING
        return _digits(lo, hi)

    def full(self, r: tuple[bool, Expr]) -> Expr:
        return alt(EMPTY, r[1]) if r[0] else r[1]

    def ge(self, a: str, strict: bool, pos: int = 0) -> tuple[bool, Expr]:
        a = a.rstrip("0")
        if not a:
            if strict:
                return False, self._nonzero_exact(pos)
            return True, seq(self.digit("0", "9", pos), self.any(pos + 1))
        c = a[0]
        parts = []
        if c < "9":
            parts.append(seq(self.digit(chr(ord(c) + 1), "9", pos), self.any(pos + 1)))
        parts.append(seq(self.digit(c, c, pos), self.full(self.ge(a[1:], strict, pos + 1))))
        return False, alt(*parts)

    def le(self, b: str, strict: bool, pos: int = 0) -> tuple[bool, Expr]:
        b = b.rstrip("0")
        if not b:
            if strict:
                return False, NOTHING
            return True, plus(lit("0"))
        c = b[0]
        parts = []
        if c > "0":
            parts.append(seq(self.digit("0", chr(ord(c) - 1), pos), self.any(pos + 1)))
        parts.append(seq(self.digit(c, c, pos), self.full(self.le(b[1:], strict, pos + 1))))
        return True, alt(*parts)

    def between(self, a: str, b: str, sa: bool, sb: bool, pos: int = 0) -> tuple[bool, Expr]:
        a, b = a.rstrip("0"), b.rstrip("0")
        if not b:
            if a or sa or sb:
                return False, NOTHING
            return True, plus(lit("0"))
        empty_ok = not a and not sa
        a0 = a[0] if a else "0"
        b0 = b[0]
        parts = []
        if a0 == b0:
            parts.append(seq(self.digit(a0, a0, pos), self.full(self.between(a[1:], b[1:], sa, sb, pos + 1))))
        else:
            parts.append(seq(self.digit(a0, a0, pos), self.full(self.ge(a[1:], sa, pos + 1))))
            if ord(b0) - ord(a0) > 1:
                parts.append(seq(self.digit(chr(ord(a0) + 1), chr(ord(b0) - 1), pos), self.any(pos + 1)))
            parts.append(seq(self.digit(b0, b0, pos), self.full(self.le(b[1:], sb, pos + 1))))
        return empty_ok, alt(*parts)

    def _nonzero_exact(self, pos: int) -> Expr:
        if self.cap is None:
            return seq(star(DIGIT), NONZERO, star(DIGIT))
        # digit strings with a non-zero digit among the first (cap - pos) positions, zeros after
        n = self.cap - pos
        if n <= 0:
            return NOTHING
        return seq(rep(lit("0"), 0, n - 1), NONZERO, rep(DIGIT, 0, n - 1), star(lit("0")))


def _split(d: Decimal) -> tuple[int, str]:
    """Non-negative decimal -> (integer part, fraction digits)."""
    s = format(d, "f")
    if "." in s:
        i, f = s.split(".")
        return int(i), f
    return int(s), ""


def _frac_part(r: tuple[bool, Expr]) -> Expr:
    empty_ok, ne = r
    return alt(EMPTY, seq(lit("."), ne)) if empty_ok else seq(lit("."), ne)


def _nonneg_decimal(lo: Decimal, hi: Decimal | None, lo_excl: bool, hi_excl: bool, cap: int | None) -> Expr:
    """Plain decimals x >= 0 with lo <= x <= hi (strict where flagged)."""
    fr = _Frac(cap)
    any_frac = _frac_part((True, seq(fr.digit("0", "9", 0), fr.any(1))))
    li, lf = _split(lo)
    parts = []
    if hi is None:
        parts.append(seq(nat_range(li, li), _frac_part(fr.ge(lf, lo_excl))))
        parts.append(seq(nat_range(li + 1, None), any_frac))
        return alt(*parts)
    if hi < lo or (hi == lo and (lo_excl or hi_excl)):
        return NOTHING
    hi_i, hf = _split(hi)
    if li == hi_i:
        return seq(nat_range(li, li), _frac_part(fr.between(lf, hf, lo_excl, hi_excl)))
    parts.append(seq(nat_range(li, li), _frac_part(fr.ge(lf, lo_excl))))
    if hi_i - li > 1:
        parts.append(seq(nat_range(li + 1, hi_i - 1), any_frac))
    parts.append(seq(nat_range(hi_i, hi_i), _frac_part(fr.le(hf, hi_excl))))
    return alt(*parts)


def decimal_range(
    lo: Decimal | None,
    hi: Decimal | None,
    *,
    lo_excl: bool = False,
    hi_excl: bool = False,
    cap: int | None = None,
) -> Expr:
    """Plain JSON decimals (optional fraction, no exponent) in the interval.

    ``cap``: at most ``cap`` significant fraction digits (trailing zeros allowed), which
    is ``multipleOf: 10**-cap``. Negative values never use ``-0``.
    """
    parts = []
    if lo is None or lo < 0:  # "-" x with x in [max(0, -hi), -lo], x > 0
        if hi is None or hi > 0:
            n_lo, n_lo_excl = Decimal(0), True
        else:
            n_lo, n_lo_excl = -hi, hi_excl
            if n_lo == 0:
                n_lo_excl = True
        n_hi = -lo if lo is not None else None
        parts.append(seq(MINUS, _nonneg_decimal(n_lo, n_hi, n_lo_excl, lo_excl, cap)))
    if hi is None or hi >= 0:
        if lo is None or lo < 0:
            p_lo, p_excl = Decimal(0), False
        else:
            p_lo, p_excl = lo, lo_excl
        parts.append(_nonneg_decimal(p_lo, hi, p_excl, hi_excl, cap))
    return alt(*parts)


# ------------------------------------------------------------------ multipleOf (integers)
MAX_MOD_STATES = 10_000  # remainder automaton states (an IR leaf of m states: 9,973 compiles in ~0.2 s)
MAX_SUFFIXES = 2_000  # suffix words for the 2**a * 5**b part of a divisor


def _dfa_regex(n: int, delta) -> Expr:
    """Strings over digits that take the DFA with states 0..n-1 (``delta(state, digit)``)
    from state 0 back to state 0, as IR, by state elimination. Sub-expressions are shared
    objects, so the IR is a DAG of O(n**3) nodes (the automaton determinises each shared
    node once)."""
    r: list[list[Expr]] = [[NOTHING] * n for _ in range(n)]
    for i in range(n):
        by_target: dict[int, list[int]] = {}
        for d in range(10):
            by_target.setdefault(delta(i, d), []).append(d)
        for j, ds in by_target.items():
            r[i][j] = alt(*(lit(str(d)) for d in ds))
    for k in range(n - 1, 0, -1):
        loop = star(r[k][k])
        for i in range(k):
            if r[i][k] == NOTHING:
                continue
            via = seq(r[i][k], loop)
            for j in range(k):
                if r[k][j] != NOTHING:
                    r[i][j] = alt(r[i][j], seq(via, r[k][j]))
    return star(r[0][0])


def _suffix_multiples(q: int) -> Expr | None:
    """Digit strings (leading zeros allowed) whose value is a multiple of q = 2**a * 5**b:
    decided by the last k = max(a, b) digits. None when the suffix set is too large."""
    k = 0
    while 10**k % q:
        k += 1
    count = 10**k // q
    if count > MAX_SUFFIXES:
        return None
    words = [str(v).zfill(k) for v in range(0, 10**k, q)]
    shorts = [str(v) for v in range(0, 10 ** max(0, k - 1), q)]
    return alt(
        seq(star(DIGIT), alt(*(lit(w) for w in words))),
        seq(star(lit("0")), alt(*(lit(w) for w in shorts))) if shorts else NOTHING,
    )


def int_multiple(lo: int | None, hi: int | None, m: int) -> Expr | None:
    """Canonical JSON integers in ``[lo, hi]`` that are multiples of ``m`` (``m >= 1``), or
    None when the remainder automaton would exceed the bounds."""
    if m == 1:
        return int_range(lo, hi)
    if lo is not None and hi is not None and (hi - lo) // m <= 2000:
        first = -(-lo // m) * m
        vals = range(first, hi + 1, m)
        return alt(*(lit(str(v)) for v in vals)) if vals else NOTHING
    q, rest = 1, m
    for p in (2, 5):
        while rest % p == 0:
            rest //= p
            q *= p
    parts = [int_range(lo, hi)]
    if q > 1:
        suffix = _suffix_multiples(q)
        if suffix is None:
            return None
        parts.append(seq(opt(MINUS), suffix))
    if rest > 1:
        if rest > MAX_MOD_STATES:
            return None
        parts.append(seq(opt(MINUS), remainder_dfa(rest)))
    return intersect(*parts)


def remainder_dfa(m: int) -> Expr:
    """Digit strings whose value is a multiple of ``m`` (the empty one included): the
    remainder automaton itself, ``r --d--> (10 r + d) mod m``, as an IR leaf (m states;
    the language as a regular expression grows as m**3, see :func:`_dfa_regex`)."""
    edges = []
    for r in range(m):
        by_target: dict[int, int] = {}
        for d in range(10):
            t = (10 * r + d) % m
            by_target[t] = by_target.get(t, 0) | 1 << (0x30 + d)
        edges += [(r, mask, t) for t, mask in by_target.items()]
    return Dfa(m, edges, [0])
