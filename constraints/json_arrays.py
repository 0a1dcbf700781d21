"""Arrays for the JSON Schema front end (a mixin of the compiler).

``contains`` (with ``minContains``/``maxContains``) is written as a sequence of item
segments: ``items* (items ∧ contains) items*`` for "at least one" (ambiguous, so no
negation is needed), and ``Z* ((items ∧ contains) Z*){min,max}`` with ``Z = items ∧ ¬contains``
for a bounded count. Both are schema-level, so recursive items are fine.
"""

from __future__ import annotations

from .errors import ConstraintTooComplex
from .ir import EMPTY, NOTHING, Expr, alt, lit, opt, rep, seq, star
from .json_common import _child

MAX_CONTAINS_SPAN = 32  # maxItems (or minItems) enumerated around the first contained item


class ArrayMixin:
    def compile_array(self, s: dict, ptr: str) -> Expr:
        prefix = s.get("prefixItems")
        items = s.get("items", True)
        pptr = _child(ptr, "prefixItems")
        iptr = _child(ptr, "items")
        if isinstance(items, list):  # draft-7 tuple form
            prefix, pptr = items, iptr
            items, iptr = s.get("additionalItems", True), _child(ptr, "additionalItems")
        prefix = prefix or []
        lo = int(s.get("minItems", 0))
        hi = s.get("maxItems")
        hi = int(hi) if hi is not None else None
        if hi is not None and hi < lo:
            return NOTHING
        if "contains" in s:
            body = self.contains_body(s, prefix, items, lo, hi, ptr)
            if body is not None:
                return seq(lit("["), self.ws, body, self.ws, lit("]"))
        pexprs = [self.compile(p, _child(pptr, i)) for i, p in enumerate(prefix)]
        iexpr = self.compile(items, iptr)
        k = len(pexprs)
        # tail after the whole prefix: items, count between max(0, lo-k) and hi-k
        t_lo, t_hi = max(0, lo - k), (None if hi is None else hi - k)
        body: Expr
        if k == 0:
            if t_hi == 0:
                body = EMPTY
            else:
                more = self.repeat(seq(self.comma, iexpr), max(0, t_lo - 1), None if t_hi is None else t_hi - 1,
                                   _child(ptr, "maxItems"), "maxItems")
                body = seq(iexpr, more)
                if t_lo == 0:
                    body = opt(body)
        else:
            if t_hi is not None and t_hi < 0:
                pexprs = pexprs[:hi]
                k = len(pexprs)
                t_hi = 0
            tail = EMPTY if t_hi == 0 else self.repeat(seq(self.comma, iexpr), t_lo, t_hi, _child(ptr, "maxItems"),
                                                        "maxItems")
            body = tail
            for i in range(k - 1, -1, -1):
                cur = seq(self.comma if i > 0 else EMPTY, pexprs[i], body)
                body = cur if i < lo else opt(cur)
        return seq(lit("["), self.ws, body, self.ws, lit("]"))

    def contains_body(self, s: dict, prefix: list, items: object, lo: int, hi: int | None, ptr: str) -> Expr | None:
        """The members of an array under ``contains``; None where contains has no effect
        (or is relaxed)."""
        cptr = _child(ptr, "contains")
        c = s["contains"]
        cmin = int(s.get("minContains", 1))
        cmax = s.get("maxContains")
        cmax = int(cmax) if cmax is not None else None
        if cmax is not None and cmax < cmin:
            return NOTHING
        if cmin == 0 and cmax is None:
            return None  # always holds
        if prefix:
            self.relax("contains", cptr, "with prefixItems")
            return None
        y = self.compile({"allOf": [items, c]}, cptr)  # an item that is contained
        i = self.compile(items, _child(ptr, "items"))
        if cmax is None and hi is None and lo <= cmin:
            # I* (Y I*){cmin}: at least cmin contained items (the length follows)
            return self.joined([(i, 0, None)] + [(y, 1, 1), (i, 0, None)] * cmin)
        if cmax is None and cmin == 1:
            # position k of a contained item, items around it within the length bounds
            n = hi if hi is not None else lo
            if n > MAX_CONTAINS_SPAN:
                raise ConstraintTooComplex(f"contains with {'maxItems' if hi is not None else 'minItems'} {n} "
                                           f"exceeds the bound ({MAX_CONTAINS_SPAN})", path=cptr)
            parts = [self.joined([(i, k, k), (y, 1, 1), (i, max(lo - k - 1, 0), None if hi is None else hi - k - 1)])
                     for k in range(hi if hi is not None else lo)]
            if hi is None:
                parts.append(self.joined([(i, lo, None), (y, 1, 1), (i, 0, None)]))
            return alt(*parts)
        if lo == 0 and hi is None:
            z = self.compile({"allOf": [items, self.negate(c)]}, cptr)  # an item that is not
            group = seq(y, star(seq(self.comma, z)))
            if cmax is not None and cmax > MAX_CONTAINS_SPAN:
                raise ConstraintTooComplex(f"maxContains {cmax} exceeds the bound ({MAX_CONTAINS_SPAN})", path=cptr)
            return self.joined([(z, 0, None), (group, cmin, cmax)])
        self.relax("contains", cptr, "minContains/maxContains with minItems/maxItems")
        return None

    def joined(self, segs: list[tuple[Expr, int, int | None]]) -> Expr:
        """Segments ``(element, min, max)`` in order, elements separated by commas."""
        memo: dict = {}

        def f(j: int, first: bool) -> Expr:
            if (j, first) in memo:
                return memo[j, first]
            if j == len(segs):
                return EMPTY
            x, a, b = segs[j]
            if b == 0:
                out = f(j + 1, first)
            elif not first:
                out = seq(rep(seq(self.comma, x), a, b), f(j + 1, False))
            else:
                some = seq(x, rep(seq(self.comma, x), max(a - 1, 0), None if b is None else b - 1), f(j + 1, False))
                out = alt(some, f(j + 1, True)) if a == 0 else some
            memo[j, first] = out
            return out

        return f(0, True)
