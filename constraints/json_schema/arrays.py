"""Arrays for the JSON Schema front end (a mixin of the compiler).

``contains`` (with ``minContains``/``maxContains``) is written as a sequence of item
segments: ``items* (items ∧ contains) items*`` for "at least one" (ambiguous, so no
negation is needed), and ``Z* ((items ∧ contains) Z*){min,max}`` with ``Z = items ∧ ¬contains``
for a bounded count. Both are schema-level, so recursive items are fine.
"""

from __future__ import annotations

from ..errors import ConstraintError, ConstraintTooComplex
from ..ir import (
    EMPTY,
    MARK_CLOSE,
    MARK_OPEN,
    MARK_SEP,
    NOTHING,
    Expr,
    alt,
    intersect,
    lit,
    opt,
    refs,
    rep,
    seq,
    star,
)
from .common import CONTAINS, MAX_REPEAT_COST, canon, child, constraining, cost

MAX_CONTAINS_SPAN = 32  # maxItems (or minItems) enumerated around the first contained item
MAX_UNIQUE_VALUES = 8  # uniqueItems: item values (a product of one automaton each)
MAX_MERGED_CONTAINS = 3  # contains merged from allOf (13 ordered partitions of 3)


class ArrayMixin:
    def compile_array(self, s: dict, ptr: str) -> Expr:
        if s.get("uniqueItems") is True and self.runtime_unique and self.unique_groups(s) is None:
            return self.marked_array(s, ptr)
        arr = self.compile_array_base(s, ptr)
        if s.get("uniqueItems") is True:
            arr = self.unique_items(s, arr, ptr)
        return arr

    def marked_array(self, s: dict, ptr: str) -> Expr:
        """uniqueItems over items whose values cannot be enumerated: checked at run time. The
        array is written with marker bytes (never in UTF-8 text) right before its ``[``, each
        separating ``,`` and its ``]``; the automaton turns them into tags on those bytes'
        transitions (:mod:`..unique_items`), and the matcher compares each completed item's JSON
        value with the earlier items of the same array."""
        sep = seq(self.pad, MARK_SEP, lit(","), self.ws)
        arr = self.compile_array_base(s, ptr, sep=sep, marked=True)
        self.unique_ptrs.append(child(ptr, "uniqueItems"))
        return arr

    def compile_array_base(self, s: dict, ptr: str, sep: Expr | None = None, marked: bool = False) -> Expr:
        comma = self.comma if sep is None else sep
        open_, close = (
            (seq(MARK_OPEN, lit("[")), seq(MARK_CLOSE, lit("]"))) if marked else (lit("["), lit("]"))
        )
        prefix = s.get("prefixItems")
        items = s.get("items", True)
        pptr = child(ptr, "prefixItems")
        iptr = child(ptr, "items")
        if isinstance(items, list):  # draft-7 tuple form
            prefix, pptr = items, iptr
            items, iptr = s.get("additionalItems", True), child(ptr, "additionalItems")
        prefix = prefix or []
        lo = int(s.get("minItems", 0))
        hi = s.get("maxItems")
        hi = int(hi) if hi is not None else None
        if hi is not None and hi < lo:
            return NOTHING
        if "contains" in s:
            body = self.contains_body(s, prefix, items, lo, hi, ptr, comma)
            if body is not None:
                return seq(open_, self.ws, body, self.ws, close)
        pexprs = [self.compile(p, child(pptr, i)) for i, p in enumerate(prefix)]
        iexpr = self.compile(items, iptr)
        k = len(pexprs)
        # tail after the whole prefix: items, count between max(0, lo-k) and hi-k
        t_lo, t_hi = max(0, lo - k), (None if hi is None else hi - k)
        count_kw = "maxItems" if hi is not None else "minItems"  # (the bound a long repeat counts)
        body: Expr
        if k == 0:
            if t_hi == 0:
                body = EMPTY
            else:
                more = self.repeat(
                    seq(comma, iexpr),
                    max(0, t_lo - 1),
                    None if t_hi is None else t_hi - 1,
                    child(ptr, count_kw),
                    count_kw,
                )
                body = seq(iexpr, more)
                if t_lo == 0:
                    body = opt(body)
        else:
            if t_hi is not None and t_hi < 0:
                pexprs = pexprs[:hi]
                k = len(pexprs)
                t_hi = 0
            tail = (
                EMPTY
                if t_hi == 0
                else self.repeat(seq(comma, iexpr), t_lo, t_hi, child(ptr, count_kw), count_kw)
            )
            body = tail
            for i in range(k - 1, -1, -1):
                cur = seq(comma if i > 0 else EMPTY, pexprs[i], body)
                body = cur if i < lo else opt(cur)
        return seq(open_, self.ws, body, self.ws, close)

    def contains_body(
        self,
        s: dict,
        prefix: list,
        items: object,
        lo: int,
        hi: int | None,
        ptr: str,
        comma: Expr | None = None,
    ) -> Expr | None:
        """The members of an array under ``contains``; None where contains has no effect
        (or is relaxed)."""
        cptr = child(ptr, "contains")
        c = s["contains"]
        cmin = int(s.get("minContains", 1))
        cmax = s.get("maxContains")
        cmax = int(cmax) if cmax is not None else None
        if s.get(CONTAINS):
            return (
                self.contains_two(s, c, items, lo, hi, ptr, comma)
                if not prefix
                else self.relax("contains", cptr, "with prefixItems")
            )
        if cmax is not None and cmax < cmin:
            return NOTHING
        if cmin == 0 and cmax is None:
            return None  # always holds
        if prefix:
            self.relax("contains", cptr, "with prefixItems")
            return None
        y = self.compile({"allOf": [items, c]}, cptr)  # an item that is contained
        i = self.compile(items, child(ptr, "items"))
        if cmax is None and hi is None and lo <= cmin:
            # I* (Y I*){cmin}: at least cmin contained items (the length follows)
            if cmin > 64 and cmin * (cost(y) + cost(i)) > MAX_REPEAT_COST:
                raise ConstraintTooComplex(
                    f"minContains {cmin} of an item of {cost(y)} grammar nodes exceeds the size bound "
                    f"({MAX_REPEAT_COST})",
                    path=child(ptr, "minContains"),
                )
            return self.joined([(i, 0, None)] + [(y, 1, 1), (i, 0, None)] * cmin, comma)
        if cmax is None and cmin == 1:
            # position k of a contained item, items around it within the length bounds
            n = hi if hi is not None else lo
            if n > MAX_CONTAINS_SPAN:
                raise ConstraintTooComplex(
                    f"contains with {'maxItems' if hi is not None else 'minItems'} {n} "
                    f"exceeds the bound ({MAX_CONTAINS_SPAN})",
                    path=cptr,
                )
            parts = [
                self.joined(
                    [(i, k, k), (y, 1, 1), (i, max(lo - k - 1, 0), None if hi is None else hi - k - 1)], comma
                )
                for k in range(hi if hi is not None else lo)
            ]
            if hi is None:
                parts.append(self.joined([(i, lo, None), (y, 1, 1), (i, 0, None)], comma))
            return alt(*parts)
        if lo == 0 and hi is None:
            z = self.compile({"allOf": [items, self.negate(c)]}, cptr)  # an item that is not
            group = seq(y, star(seq(self.comma if comma is None else comma, z)))
            if cmax is not None and cmax > MAX_CONTAINS_SPAN:
                raise ConstraintTooComplex(
                    f"maxContains {cmax} exceeds the bound ({MAX_CONTAINS_SPAN})", path=cptr
                )
            return self.joined([(z, 0, None), (group, cmin, cmax)], comma)
        self.relax("contains", cptr, "minContains/maxContains with minItems/maxItems")
        return None

    def contains_two(
        self, s: dict, c: object, items: object, lo: int, hi: int | None, ptr: str, comma: Expr | None = None
    ) -> Expr | None:
        """Several contains (merged from allOf, at most :data:`MAX_MERGED_CONTAINS`): per ordered
        partition of them, one item for each block matching the block's schemas, in that order,
        other items anywhere (``I* (I∧A∧B) I* | I* (I∧A) I* (I∧B) I* | I* (I∧B) I* (I∧A) I*``)."""
        cptr = child(ptr, "contains")
        cs = [c, *s[CONTAINS]]
        if len(cs) > MAX_MERGED_CONTAINS or "minContains" in s or "maxContains" in s:
            self.relax("contains", cptr, f"{len(cs)} contains under allOf with minContains/maxContains")
            return None
        i = self.compile(items, child(ptr, "items"))
        memo: dict = {}

        def block(idx: tuple[int, ...]) -> Expr:
            if idx not in memo:
                memo[idx] = self.compile({"allOf": [items, *(cs[j] for j in idx)]}, cptr)
            return memo[idx]

        def partitions(rest: tuple[int, ...]) -> list[list[tuple[int, ...]]]:
            if not rest:
                return [[]]
            out = []
            for mask in range(1, 1 << len(rest)):
                first = tuple(x for b, x in enumerate(rest) if mask >> b & 1)
                others = tuple(x for b, x in enumerate(rest) if not mask >> b & 1)
                out += [[first, *p] for p in partitions(others)]
            return out

        def gaps(m: int) -> list[list[tuple[int, int | None]]]:
            """The other items' counts before each of m contained items and after the last,
            totalling between lo - m and hi - m: exact counts while the bounds still bite."""

            def go(j: int, need: int, budget: int | None) -> list[list[tuple[int, int | None]]]:
                if j == m:
                    return [] if budget is not None and need > budget else [[(max(need, 0), budget)]]
                if hi is None and need <= 0:
                    return [[(0, None)] * (m - j + 1)]
                top = budget if hi is not None else need - 1
                out = [
                    [(k, k), *g]
                    for k in range(top + 1)
                    for g in go(j + 1, need - k, None if budget is None else budget - k)
                ]
                if hi is None:
                    out += [[(need, None), *([(0, None)] * (m - j))]]
                if len(out) > MAX_CONTAINS_SPAN * 8:
                    raise ConstraintTooComplex(
                        f"{len(cs)} contains with minItems/maxItems exceed the bound", path=cptr
                    )
                return out

            try:
                return go(0, lo - m, None if hi is None else hi - m)
            finally:
                go = None  # (a nested function that calls itself is a reference cycle: freed here)

        parts = []
        try:
            for p in partitions(tuple(range(len(cs)))):
                if hi is not None and hi < len(p):
                    continue
                for g in gaps(len(p)):
                    segs = [(i, *g[0])]
                    for blk, gap in zip(p, g[1:]):
                        segs += [(block(blk), 1, 1), (i, *gap)]
                    parts.append(self.joined(segs, comma))
        finally:
            partitions = None  # (as go)
        return alt(*parts)

    def unique_groups(self, s: dict) -> list[list] | None:
        """The item values of an array under ``uniqueItems`` grouped by equality, where
        they are a few scalars (an enum, boolean, null); None otherwise."""
        items = s.get("items", True)
        if "contains" in s:
            return None
        schemas = list(s.get("prefixItems") or [])
        if isinstance(items, list):  # draft-7 tuple form
            schemas += [*items, s.get("additionalItems", True)]
        else:
            schemas.append(items)
        values: list = []
        for x in schemas:
            vs = self._finite_values(x)
            if vs is None:
                return None
            values += vs
        groups: dict[str, list] = {}
        for v in values:
            groups.setdefault(canon(v), []).append(v)  # 1 and 1.0 are one value
        if len(groups) > MAX_UNIQUE_VALUES:
            return None
        return list(groups.values())

    def _finite_values(self, x: object) -> list | None:
        """The values of an item schema that is a few scalars (an enum, boolean, null, false)."""
        depth = 0
        while isinstance(x, dict) and "$ref" in x and set(constraining(x)) == {"$ref"} and depth < 16:
            try:
                x, _ = self.resolve(x["$ref"], "#")
            except ConstraintError:
                return None
            depth += 1
        if x is False:
            return []
        if not isinstance(x, dict):
            return None
        if "enum" in x or "const" in x:
            values = [x["const"]] if "const" in x else x["enum"]
            if not isinstance(values, list) or not all(
                v is None or isinstance(v, (str, bool, int, float)) for v in values
            ):
                return None
            check = self.validator(x)
            return [v for v in values if check.is_valid(v)]
        if set(constraining(x)) == {"type"} and set(self.types_of(x, "#")) <= {"boolean", "null"}:
            ts = self.types_of(x, "#")
            return [v for t, vs in (("boolean", [True, False]), ("null", [None])) if t in ts for v in vs]
        return None

    def unique_items(self, s: dict, arr: Expr, ptr: str) -> Expr:
        """uniqueItems over a few item values: per value, the arrays holding it at most once
        (a product DFA with the array's own language)."""
        groups = self.unique_groups(s)
        if groups is None:
            return arr  # (reported by check_unsupported)
        if refs(arr):
            self.relax("uniqueItems", child(ptr, "uniqueItems"), "the array's language is not regular")
            return arr
        encs = [alt(*(self.value_lit(v) for v in g)) for g in groups]
        parts = [arr]
        for i, g in enumerate(encs):
            w = alt(*(e for j, e in enumerate(encs) if j != i))
            once = alt(self.joined([(w, 0, None), (g, 1, 1), (w, 0, None)]), self.joined([(w, 0, None)]))
            parts.append(seq(lit("["), self.ws, once, self.ws, lit("]")))
        return intersect(*parts)

    def joined(self, segs: list[tuple[Expr, int, int | None]], comma: Expr | None = None) -> Expr:
        """Segments ``(element, min, max)`` in order, elements separated by commas (``comma``,
        by default the compiler's)."""
        comma = self.comma if comma is None else comma
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
                out = seq(rep(seq(comma, x), a, b), f(j + 1, False))
            else:
                some = seq(
                    x, rep(seq(comma, x), max(a - 1, 0), None if b is None else b - 1), f(j + 1, False)
                )
                out = alt(some, f(j + 1, True)) if a == 0 else some
            memo[j, first] = out
            return out

        try:
            return f(0, True)
        finally:
            f = None  # (a nested function that calls itself is a reference cycle: freed here)
