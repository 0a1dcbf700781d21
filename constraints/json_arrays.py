"""Arrays for the JSON Schema front end (a mixin of the compiler)."""

from __future__ import annotations

from .ir import EMPTY, NOTHING, Expr, lit, opt, seq
from .json_common import _child


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
