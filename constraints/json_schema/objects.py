"""Objects for the JSON Schema front end (a mixin of the compiler).

Members come in schema order (declared ones, then extra ones), or, with ``key_order="any"``,
in any order: the body is then any list of members, and the run-time check of
:mod:`..key_order` refuses a key given twice and an object closed before all its required
keys. The object is written with marker bytes for that check (never in UTF-8 text):
:data:`KEY_OPEN` right before its ``{``, :data:`KEY_NAME` right before the ``:`` of each
member, and :data:`KEY_CLOSE` then the id of its set of required keys
(:func:`required_id`, :data:`ID_WIDTH` digits of :data:`KEY_DIGITS`) right before its ``}``.
"""

from __future__ import annotations

import json
import threading

from .. import ir
from ..errors import ConstraintError, ConstraintTooComplex
from ..ir import (
    EMPTY,
    NOTHING,
    Alt,
    Expr,
    Ref,
    Repeat,
    Seq,
    alt,
    difference,
    intersect,
    lit,
    opt,
    rep,
    seq,
    star,
)
from . import formats as jf
from .common import ADDL, MAX_PATTERN_PROPERTIES, child, cost_over, is_trivial

# key_order="any" markers (bytes never found in UTF-8 text; uniqueItems uses 0xFB..0xFD)
KEY_OPEN, KEY_NAME, KEY_CLOSE = 0xF5, 0xF6, 0xF7
KEY_DIGITS = (0xF8, 0xF9, 0xFA)  # the id of a set of required keys, base 3
ID_WIDTH = 12  # digits of an id (3**12 sets of required keys per process)
KEY_ORDERS = ("schema", "any")
_required_ids: dict[frozenset, int] = {}
_required_sets: list[frozenset] = []
_required_lock = threading.Lock()


def required_id(keys) -> int:
    """A process-wide id of a set of required keys (interned: the same set, the same id)."""
    keys = frozenset(keys)
    with _required_lock:
        i = _required_ids.get(keys)
        if i is None:
            i = _required_ids[keys] = len(_required_sets)
            if i >= len(KEY_DIGITS) ** ID_WIDTH:  # pragma: no cover - 531,441 distinct sets
                raise ConstraintTooComplex("too many distinct sets of required keys for key_order='any'")
            _required_sets.append(keys)
        return i


def required_set(i: int) -> frozenset:
    """The set of required keys of id ``i`` (:func:`required_id`)."""
    return _required_sets[i]


def id_marks(i: int) -> Expr:
    """The marker digits of id ``i``, most significant first."""
    base = len(KEY_DIGITS)
    digits = []
    for _ in range(ID_WIDTH):
        i, d = divmod(i, base)
        digits.append(ir.ByteSet(1 << KEY_DIGITS[d]))
    return seq(*reversed(digits))


FLAT_TAIL_ITEMS = 100_000  # IR items of the flat tails of an object's members past which they are chained
TAIL_BLOCK = 32  # members per link of the chained tails


def _empty(key: Expr, deadline: float | None = None) -> bool:
    """Whether a (small, Ref-free) key language is empty: decided by compiling it (within
    a second, and before ``deadline``: else taken as not empty)."""
    import time

    from ..automaton.pushdown import compile_grammar

    soon = time.monotonic() + 1.0
    try:
        compile_grammar(
            ir.Grammar({"start": key}), deadline=soon if deadline is None else min(soon, deadline)
        )
    except ConstraintTooComplex:
        return False
    except ConstraintError:
        return True
    return False


class ObjectMixin:
    def compile_object(self, s: dict, ptr: str, some: tuple[object, object] | None = None) -> Expr:
        """Objects of ``s``; with ``some`` (keys, value schema), only those that have an
        undeclared member whose key is one of the keys and whose value fails the schema."""
        if "not" in s and some is None:
            some = self.member_not(s["not"])
            if some is not None:
                return self.compile_member_not(s, some, ptr)
        props = s.get("properties", {})
        required = list(dict.fromkeys(s.get("required", [])))
        pats = s.get("patternProperties", {})
        addl = s.get("additionalProperties", True)
        if self.strict:
            addl = False
        names = s.get("propertyNames")
        pnames = names if names is not None and not is_trivial(names) else None
        name_check = self.validator(pnames, child(ptr, "propertyNames")) if pnames is not None else None
        members: list[tuple[str, object, str]] = []  # (key, schema, pointer) in schema order
        for key, sub in props.items():
            members.append((key, sub, child(ptr, "properties", key)))
        for key in required:
            if key not in props:
                pm = [
                    (p, v) for p, v in pats.items() if self.search(p, key, child(ptr, "patternProperties", p))
                ]
                apart = [v for ps, v in s.get(ADDL, []) if not any(self.search(p, key) for p in ps)]
                if pm:
                    members.append(
                        (
                            key,
                            {"allOf": [v for _, v in pm] + apart},
                            child(ptr, "patternProperties", pm[0][0]),
                        )
                    )
                elif addl is False:
                    return self.unsatisfiable(
                        f"required property {key!r} is not allowed (additionalProperties is false)",
                        child(ptr, "required"),
                    )
                else:
                    members.append(
                        (
                            key,
                            {"allOf": [addl, *apart]} if apart else addl,
                            child(ptr, "additionalProperties"),
                        )
                    )
        marked = self.key_order == "any" and some is None  # keys in any order (see key_order)
        items: list[tuple[Expr, bool]] = []
        for key, sub, sptr in members:
            pm = [
                v
                for p, v in pats.items()
                if key in props and self.search(p, key, child(ptr, "patternProperties", p))
            ]
            if pm:
                sub = {"allOf": [sub, *pm]}
            value = self.compile(sub, sptr)
            ok = value != NOTHING and (name_check is None or name_check.is_valid(key))
            if not ok:
                if key in required:
                    # only a required unsatisfiable property makes the object unsatisfiable
                    return self.unsatisfiable(f"required property {key!r} cannot be satisfied", sptr)
                continue  # an optional one is dropped
            if not isinstance(value, Ref) and cost_over(value, 64):
                # a named rule, like a $ref target: inlined where the automaton stays small,
                # else a call (a long counted string would multiply the states of the object
                # around it)
                value = self.named("value:" + sptr, value)
            colon = self.member_colon() if marked else self.colon
            items.append((seq(lit(json.dumps(key, ensure_ascii=False)), colon, value), key in required))
        extra = self.extra_member(s, ptr, list(props) + required, pats, addl, pnames, marked=marked)
        special = None
        if some is not None:
            special = self.extra_member(s, ptr, list(props) + required, pats, addl, pnames, some)
            if special is None:
                return NOTHING
        lo = int(s.get("minProperties", 0))
        hi = s.get("maxProperties")
        hi = int(hi) if hi is not None else None
        if marked:
            body = self.any_order_body(items, extra, lo, hi, ptr)
            closer = seq(ir.ByteSet(1 << KEY_CLOSE), id_marks(required_id(required)))
            return seq(ir.ByteSet(1 << KEY_OPEN), lit("{"), self.ws, body, self.ws, closer, lit("}"))
        body = self.members_body(items, extra, lo, hi, ptr, special)
        return seq(lit("{"), self.ws, body, self.ws, lit("}"))

    def member_colon(self) -> Expr:
        """The ``:`` of a member of an object whose keys come in any order, after its marker."""
        return seq(self.pad, ir.ByteSet(1 << KEY_NAME), lit(":"), self.after_colon)

    def any_order_body(
        self, items: list[tuple[Expr, bool]], extra: Expr | None, lo: int, hi: int | None, ptr: str
    ) -> Expr:
        """The members between the braces in any order (key_order="any"): a list of members,
        each declared or extra, between ``lo`` and ``hi`` of them (minProperties,
        maxProperties; with no extra member, at most one per declared key); a key given twice
        and a missing required key are refused at run time (:mod:`..key_order`)."""
        n_req = sum(1 for _, r in items if r)
        n_max = len(items) if extra is None else None
        if n_max is not None:
            hi = n_max if hi is None else min(hi, n_max)
        if hi is not None and hi < max(lo, n_req):
            return NOTHING
        member = alt(*(m for m, _ in items), *([extra] if extra is not None else []))
        if member == NOTHING:
            return EMPTY if lo == 0 else NOTHING
        if hi == 0:
            return EMPTY
        kw = "maxProperties" if hi is not None else "minProperties"
        more = self.repeat(
            seq(self.comma, member), max(0, lo - 1), None if hi is None else hi - 1, child(ptr, kw), kw
        )
        return seq(member, more) if lo > 0 else opt(seq(member, more))

    def compile_member_not(self, s: dict, some: tuple[object, object], ptr: str) -> Expr:
        """Objects of ``s`` (without its ``not``) that have a member whose key is one of
        ``keys`` and whose value fails ``value`` (``some``): where the key is declared, the
        object requiring it with that value; where it is not, an extra member written last
        (so that, keys repeating, the value read is the failing one)."""
        keys, value = some
        base = {k: v for k, v in s.items() if k != "not"}
        props = base.get("properties", {})
        pats = base.get("patternProperties", {})
        addl = False if self.strict else base.get("additionalProperties", True)
        check = self.validator(keys, child(ptr, "not"))
        parts = []
        for key in dict.fromkeys([*props, *base.get("required", [])]):
            if not check.is_valid(key):
                continue
            if key in props:
                sub = props[key]
            else:
                # an undeclared required key: the schema it takes as an extra member
                apart = [v for ps, v in base.get(ADDL, []) if not any(self.search(p, key) for p in ps)]
                if any(self.search(p, key, child(ptr, "patternProperties", p)) for p in pats):
                    sub = {"allOf": apart} if apart else True  # (patterns apply to declared keys too)
                elif addl is False:
                    continue
                else:
                    sub = {"allOf": [addl, *apart]}
            variant = {
                **base,
                "required": list(dict.fromkeys([*base.get("required", []), key])),
                "properties": {**props, key: {"allOf": [sub, {"not": value}]}},
            }
            parts.append(self.compile_object(variant, ptr))
        parts.append(self.compile_object(base, ptr, some))
        return alt(*parts)

    def extra_member(
        self,
        s: dict,
        ptr: str,
        declared: list[str],
        pats: dict,
        addl: object,
        pnames: object,
        some: tuple[object, object] | None = None,
        *,
        marked: bool = False,
    ) -> Expr | None:
        """One member whose key is not declared, or None when no such key is allowed; with
        ``some`` (keys, value schema), one whose key is also one of the keys and whose value
        also fails the value schema.

        Exact: a key matching some patterns takes the value of all of them (one branch per
        set of matched patterns, the key language being their intersection minus the other
        patterns and the declared keys); a key matching none takes ``additionalProperties``.
        Key languages are product DFAs over canonical encodings, so they stay small."""
        key_filter = None
        if pnames is not None:
            kptr = child(ptr, "propertyNames")
            key_filter = self.inline(self.compile_key(pnames, kptr))
            if key_filter is None:
                self.relax(
                    "propertyNames",
                    kptr,
                    "a recursive propertyNames schema is enforced on declared keys only",
                )
            elif key_filter == NOTHING:
                return None
        if some is not None:
            some_keys = self.inline(self.compile_key(some[0], child(ptr, "not")))
            key_filter = some_keys if key_filter is None else intersect(key_filter, some_keys)
        plist = list(pats.items())
        apart = s.get(ADDL, [])  # (patterns, schema): keys matching none of the patterns take schema
        pptrs = [child(ptr, "patternProperties", p) for p, _ in plist]
        raws = [self.pattern_raw(p, pp) for (p, _), pp in zip(plist, pptrs, strict=True)]
        encs = [jf.encode_raw(r) for r in raws]
        # (the declared keys' encodings, for the pattern keys' differences: none to take without patterns)
        declared_enc = [lit(jf.encode_key(k)) for k in declared] if plist else []
        parts = []

        def member(key: Expr, value: Expr) -> None:
            k = seq(jf.QUOTE, key, jf.QUOTE)
            if key_filter is not None:
                k = intersect(k, key_filter)
            parts.append(seq(k, self.member_colon() if marked else self.colon, value))

        n = len(plist)
        if n > MAX_PATTERN_PROPERTIES and apart:
            raise ConstraintTooComplex(
                f"over {MAX_PATTERN_PROPERTIES} patternProperties merged with "
                "additionalProperties under allOf",
                path=child(ptr, "patternProperties"),
            )
        if n > MAX_PATTERN_PROPERTIES:
            for i in range(n):
                self.relax(
                    "patternProperties",
                    pptrs[i],
                    f"over {MAX_PATTERN_PROPERTIES} patterns: overlaps between patterns are not resolved",
                )
                value = self.compile(self._failing(plist[i][1], some), pptrs[i])
                if value != NOTHING:
                    member(difference(encs[i], alt(*declared_enc)) if declared_enc else encs[i], value)
        else:
            for subset in range(1, 1 << n):
                inside = [i for i in range(n) if subset >> i & 1]
                minus = [encs[j] for j in range(n) if not subset >> j & 1] + declared_enc
                key = intersect(*(encs[i] for i in inside))
                if minus:
                    key = difference(key, alt(*minus))
                if n > 1 and _empty(key, self.deadline):
                    continue
                matched = {plist[i][0] for i in inside}
                subs = [plist[i][1] for i in inside] + [v for ps, v in apart if not matched & set(ps)]
                value = self.compile(
                    self._failing(subs[0] if len(subs) == 1 else {"allOf": subs}, some), pptrs[inside[0]]
                )
                if value != NOTHING:
                    member(key, value)
        if addl is not False:
            aptr = child(ptr, "additionalProperties")
            value = self.compile(
                self._failing({"allOf": [addl, *(v for _, v in apart)]} if apart else addl, some), aptr
            )
            if value != NOTHING:
                if declared or raws:
                    member(jf.keys_except(declared, raws), value)
                else:
                    member(star(jf.CHAR), value)  # every key, in every encoding
        extra = alt(*parts)
        return None if extra == NOTHING else extra  # e.g. additionalProperties unsatisfiable: no extra key

    @staticmethod
    def _failing(schema: object, some: tuple[object, object] | None) -> object:
        return schema if some is None else {"allOf": [schema, {"not": some[1]}]}

    def inline(self, e: Expr, depth: int = 0) -> Expr | None:
        """``e`` with its rule references replaced by their bodies (None if recursive)."""
        if not ir.refs(e):
            return e
        if depth > 32:
            return None
        if isinstance(e, Ref):
            body = self.rules.get(e.name)
            return None if body is None else self.inline(body, depth + 1)
        if isinstance(e, (Seq, Alt)):
            items = [self.inline(x, depth) for x in e.items]
            if any(x is None for x in items):
                return None
            return seq(*items) if isinstance(e, Seq) else alt(*items)
        if isinstance(e, Repeat):
            x = self.inline(e.item, depth)
            return None if x is None else rep(x, e.min, e.max)
        return None

    def compile_key(self, names: object, ptr: str) -> Expr:
        """Keys under ``propertyNames`` (only its string part matters)."""
        if isinstance(names, dict):
            names = {**names, "type": "string"}
        return self.compile(names, ptr)

    def declared_members(self, items: list[tuple[Expr, bool]], ptr: str) -> Expr:
        """The declared members in order, each optional one optional, with commas between
        them: one alternative per possible first member (up to the first required one),
        each followed by the members after it (a shared tail). Written flat while that is
        small; past :data:`FLAT_TAIL_ITEMS` the tails are chained in blocks of
        :data:`TAIL_BLOCK` members, each block ending in the next block's tail, so that the
        IR is linear in the members (flat, it is quadratic)."""
        comma = self.comma
        parts = [seq(comma, m) if r else opt(seq(comma, m)) for m, r in items]
        if any(p == NOTHING for p in parts):
            return NOTHING
        n = len(items)
        first_req = next((f for f, (_, r) in enumerate(items) if r), n - 1)
        widths = [len(p.items) if isinstance(p, Seq) else 1 for p in parts]
        after = [0] * (n + 1)  # items of the flat tail after member j
        for j in range(n - 1, -1, -1):
            after[j] = after[j + 1] + widths[j]
        if sum(after[f + 1] for f in range(first_req + 1)) <= FLAT_TAIL_ITEMS:
            # (the same IR as the flat tails built one from the next)
            return alt(*(seq(items[f][0], *parts[f + 1 :]) for f in range(first_req + 1)))
        # tails[b]: the members from block b on, one node (a Repeat of one copy is kept a
        # node of its own by seq, which would flatten a Seq into each alternative)
        blocks = (n + TAIL_BLOCK - 1) // TAIL_BLOCK
        tails: list[Expr] = [EMPTY] * (blocks + 1)
        for b in range(blocks - 1, -1, -1):
            self.tick(ptr)
            body = seq(*parts[b * TAIL_BLOCK : (b + 1) * TAIL_BLOCK], tails[b + 1])
            tails[b] = Repeat(body, 1, 1) if isinstance(body, Seq) else body
        firsts = []
        for f in range(first_req + 1):
            b = (f + 1) // TAIL_BLOCK
            firsts.append(seq(items[f][0], *parts[f + 1 : (b + 1) * TAIL_BLOCK], tails[b + 1]))
        return alt(*firsts)

    def members_body(
        self,
        items: list[tuple[Expr, bool]],
        extra: Expr | None,
        lo: int,
        hi: int | None,
        ptr: str,
        special: Expr | None = None,
    ) -> Expr:
        """The members between the braces: declared ones in order, then extra ones; with
        ``special`` (an extra member of a narrower kind), at least one extra member, the
        last being special."""
        comma = self.comma
        n_req = sum(1 for _, r in items if r)
        n_max = len(items) if extra is None else None
        if hi is not None and hi < max(lo, n_req) or (n_max is not None and n_max < lo):
            return NOTHING
        simple = lo <= n_req and (hi is None or (n_max is not None and hi >= n_max))
        if simple:
            decl = self.declared_members(items, ptr)
            if extra is None:
                return decl if n_req else opt(decl)
            tail = star(seq(comma, extra))
            if special is not None:
                parts = [seq(decl, tail, comma, special)]
                if not n_req:
                    parts.append(seq(star(seq(extra, comma)), special))
                return alt(*parts)
            parts = [seq(decl, tail)]
            if not n_req:
                parts.append(opt(seq(extra, tail)))
            return alt(*parts)
        n_opt = len(items) - n_req
        if n_opt > 12:
            raise ConstraintTooComplex(
                f"minProperties/maxProperties over {n_opt} optional properties exceeds the bound (12)",
                path=ptr,
            )
        memo: dict = {}

        def d(j: int, c: int, first: bool) -> Expr:
            """Members j.. with exactly c of them present; ``first``: nothing emitted before."""
            if (j, c, first) in memo:
                return memo[j, c, first]
            if j == len(items):
                out = EMPTY if c == 0 else NOTHING
            elif c < 0:
                out = NOTHING
            else:
                m, r = items[j]
                took = seq(EMPTY if first else comma, m, d(j + 1, c - 1, False))
                out = took if r else alt(took, d(j + 1, c, first))
            memo[j, c, first] = out
            return out

        parts = []
        count_kw = "maxProperties" if hi is not None else "minProperties"  # (the bound a repeat counts)
        for c in range(n_req, len(items) + 1):
            if hi is not None and c > hi:
                break
            decl = d(0, c, True)
            if decl == NOTHING:
                continue
            if extra is None:
                if c >= lo:
                    parts.append(decl)
                continue
            e_lo, e_hi = max(0, lo - c), None if hi is None else hi - c
            if special is not None:
                if e_hi is not None and e_hi < 1:
                    continue
                # e_lo.. extra members (at least one), the last special
                head = seq(comma, extra) if c > 0 else seq(extra, comma)
                more = self.repeat(
                    head,
                    max(0, e_lo - 1),
                    None if e_hi is None else e_hi - 1,
                    child(ptr, count_kw),
                    count_kw,
                )
                parts.append(seq(decl, more, comma, special) if c > 0 else seq(more, special))
                continue
            if c > 0:
                parts.append(
                    seq(
                        decl,
                        self.repeat(seq(comma, extra), e_lo, e_hi, child(ptr, count_kw), count_kw),
                    )
                )
            elif e_hi != 0:
                more = self.repeat(
                    seq(comma, extra),
                    max(0, e_lo - 1),
                    None if e_hi is None else e_hi - 1,
                    child(ptr, count_kw),
                    count_kw,
                )
                parts.append(seq(extra, more) if e_lo > 0 else opt(seq(extra, more)))
            elif e_lo == 0:
                parts.append(EMPTY)
        d = None  # (a nested function that calls itself is a reference cycle: freed here)
        return alt(*parts)
