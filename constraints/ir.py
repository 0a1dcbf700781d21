"""The grammar IR every constraint lowers to.

A :class:`Grammar` is a set of named rules; a rule is an :class:`Expr` over **bytes**:

- ``ByteSet(mask)``: one byte whose value ``b`` has bit ``b`` set in the 256-bit ``mask``;
- ``Seq(items)``, ``Alt(items)``: concatenation and alternation;
- ``Repeat(item, min, max)``: ``item{min,max}`` (``max=None``: unbounded);
- ``Ref(name)``: the rule ``name`` (rules may be recursive).

Characters are UTF-8 byte sequences: :func:`utf8_class` turns code point ranges into
alternatives of byte sequences, so a regex, a JSON Schema or a Lark grammar all end as one
byte-level language. Build expressions with the helpers (``lit``, ``seq``, ``alt``, ``rep``,
``opt``, ``star``, ``plus``), which flatten and simplify.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .memo import NodeMemo

ALL_BYTES_MASK = (1 << 256) - 1


class Expr:
    """Base class of IR nodes: immutable, hashable; the hash, the node count and the
    names of the rules referred to are computed once at construction (big shared
    sub-trees are hashed and inspected often)."""

    __slots__ = ("_hash", "_size", "_refs", "_long")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(self) is not type(other) or self._hash != other._hash:  # type: ignore[attr-defined]
            return False
        return self._key() == other._key()  # type: ignore[attr-defined]

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("IR nodes are immutable")

    def _init(self, key: tuple, size: int, refs: frozenset[str] = frozenset(), long: bool = False) -> None:
        """Set the cached hash (over the key, sub-expressions by their cached hash: no
        Python-level ``__hash__`` call per child), size, refs and ``_long`` (a
        :class:`Repeat` of more than :data:`LONG_REPEAT` copies lies below, not under a
        ``Diff``: the automaton may count it, see :mod:`.automaton.counted`)."""
        _set(
            self, "_hash", hash((type(self).__name__, *[k._hash if isinstance(k, Expr) else k for k in key]))
        )
        _set(self, "_size", size)
        _set(self, "_refs", refs)
        _set(self, "_long", long)


_set = object.__setattr__
_NO_REFS: frozenset[str] = frozenset()
LONG_REPEAT = 64  # copies above which a Repeat may become a counter (see .counted)


class ByteSet(Expr):
    __slots__ = ("mask",)

    def __init__(self, mask: int) -> None:
        _set(self, "mask", mask)  # bit b set <=> byte b allowed
        _set(self, "_hash", hash(("ByteSet", mask)))
        _set(self, "_size", 1)
        _set(self, "_refs", _NO_REFS)
        _set(self, "_long", False)

    def _key(self) -> tuple:
        return (self.mask,)

    def __repr__(self) -> str:
        return f"ByteSet({self.mask:#x})"

    def bytes(self) -> list[int]:
        m, out, b = self.mask, [], 0
        while m:
            if m & 1:
                out.append(b)
            m >>= 1
            b += 1
        return out


class Items(Expr):
    """A node over a tuple of sub-expressions (Seq, Alt, And)."""

    __slots__ = ("items",)

    def __init__(self, items: tuple[Expr, ...]) -> None:
        items = tuple(items)
        _set(self, "items", items)
        # (one loop for the four: the lowering makes tens of thousands of these per schema)
        hs = [type(self).__name__]
        size, refs, long = 1, _NO_REFS, False
        for i in items:
            hs.append(i._hash)
            size += i._size
            if i._refs:
                refs = i._refs if not refs else refs | i._refs
            if i._long:
                long = True
        _set(self, "_hash", hash(tuple(hs)))
        _set(self, "_size", size)
        _set(self, "_refs", refs)
        _set(self, "_long", long)

    def _key(self) -> tuple:
        return self.items

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.items!r})"


class Seq(Items):
    """Concatenation of ``items``."""

    __slots__ = ()


class Alt(Items):
    """Alternation of ``items``."""

    __slots__ = ()


class Repeat(Expr):
    __slots__ = ("item", "min", "max")

    def __init__(self, item: Expr, min: int, max: int | None) -> None:  # noqa: A002
        object.__setattr__(self, "item", item)
        object.__setattr__(self, "min", min)
        object.__setattr__(self, "max", max)  # None: unbounded
        self._init(
            (item, min, max),
            1 + item._size,
            item._refs,
            item._long or max is None and min > LONG_REPEAT or max is not None and max > LONG_REPEAT,
        )

    def _key(self) -> tuple:
        return (self.item, self.min, self.max)

    def __repr__(self) -> str:
        return f"Repeat({self.item!r}, {self.min}, {self.max})"


class Dfa(Expr):
    """A regular language given as a DFA over byte sets (a leaf: built as it is, not from a
    regular expression, where one would be large: the remainders of ``multipleOf``).
    ``edges``: (state, byte mask, next state) triples over states ``0..n-1``, state 0 the
    start; ``accept``: the accepting states."""

    __slots__ = ("n", "edges", "accept")

    def __init__(self, n: int, edges, accept) -> None:
        edges = tuple(sorted(set(edges)))
        accept = tuple(sorted(set(accept)))
        _set(self, "n", n)
        _set(self, "edges", edges)
        _set(self, "accept", accept)
        _set(self, "_hash", hash(("Dfa", n, edges, accept)))
        _set(self, "_size", 1 + len(edges))
        _set(self, "_refs", _NO_REFS)
        _set(self, "_long", False)

    def _key(self) -> tuple:
        return (self.n, self.edges, self.accept)

    def __repr__(self) -> str:
        return f"Dfa({self.n} states, {len(self.edges)} edges)"


class Ref(Expr):
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "name", name)
        self._init((name,), 1, frozenset((name,)))

    def _key(self) -> tuple:
        return (self.name,)

    def __repr__(self) -> str:
        return f"Ref({self.name!r})"


class And(Items):
    """Strings every item matches (items must not refer to rules)."""

    __slots__ = ()


class Diff(Expr):
    """Strings ``items[0]`` matches and ``items[1]`` does not (no rule references)."""

    __slots__ = ("items",)

    def __init__(self, base: Expr, minus: Expr) -> None:
        object.__setattr__(self, "items", (base, minus))
        self._init((base, minus), 1 + base._size + minus._size, _union_refs((base, minus)))

    def _key(self) -> tuple:
        return self.items

    def __repr__(self) -> str:
        return f"Diff({self.items[0]!r}, {self.items[1]!r})"


def _union_refs(items: tuple[Expr, ...]) -> frozenset[str]:
    parts = [i._refs for i in items if i._refs]
    if not parts:
        return _NO_REFS
    return parts[0] if len(parts) == 1 else frozenset().union(*parts)


EMPTY: Expr = Seq(())  # matches the empty string
NOTHING: Expr = Alt(())  # matches nothing
_SINGLE = [ByteSet(1 << b) for b in range(256)]  # one byte each (nodes are immutable: shared)


@dataclass
class Grammar:
    """Named rules over bytes; ``start`` names the rule a whole output must match."""

    rules: dict[str, Expr]
    start: str = "start"
    # free-form notes from the front end (e.g. relaxed JSON Schema keywords)
    notes: list[str] = field(default_factory=list)
    # JSON pointers of the uniqueItems arrays written with the marker bytes below (checked
    # at run time, see ..unique_items); empty when the grammar has no markers
    unique: tuple[str, ...] = ()
    # (lenient JSON Schema with markers) the grammar with uniqueItems relaxed instead, made if
    # the markers cannot be kept (see ..unique_items.compile_unique)
    fallback: object = None
    # ids of the special tokens the grammar names, written as :func:`special_bytes`
    specials: tuple[int, ...] = ()


# A special token (a control token such as ``<|im_end|>``, which has no text) is written in
# the IR as bytes no UTF-8 text holds: SPECIAL_LEAD, then its id in four bytes of six bits
# each (0x80 | bits, most significant first). Text never reaches these bytes, so a special
# token never matches text, nor text a special token; the compiled constraint maps the id to
# them (see ..compiled) and keeps ordinary tokens holding the lead byte out of its rows.
SPECIAL_LEAD = 0xFE
MAX_SPECIAL_ID = (1 << 24) - 1


def special_bytes(token_id: int) -> bytes:
    """The IR's bytes for special token ``token_id`` (0 <= id < 2**24)."""
    if not 0 <= token_id <= MAX_SPECIAL_ID:
        raise ValueError(f"special token id {token_id} is outside 0..{MAX_SPECIAL_ID}")
    return bytes([SPECIAL_LEAD] + [0x80 | (token_id >> s) & 0x3F for s in (18, 12, 6, 0)])


def special_id(data: bytes, at: int = 0) -> int | None:
    """The special token id written at ``data[at:]`` (:func:`special_bytes`), or None."""
    chunk = data[at : at + 5]
    if len(chunk) != 5 or chunk[0] != SPECIAL_LEAD or any(b & 0xC0 != 0x80 for b in chunk[1:]):
        return None
    return (chunk[1] & 0x3F) << 18 | (chunk[2] & 0x3F) << 12 | (chunk[3] & 0x3F) << 6 | chunk[4] & 0x3F


# uniqueItems markers: bytes never found in UTF-8 text, written right before the ``[``, each
# ``,`` between two items and the ``]`` of an array whose items are checked for uniqueness
# at run time (see ..unique_items)
UNIQUE_OPEN, UNIQUE_SEP, UNIQUE_CLOSE = 0xFB, 0xFC, 0xFD
MARK_OPEN, MARK_SEP, MARK_CLOSE = (
    ByteSet(1 << UNIQUE_OPEN),
    ByteSet(1 << UNIQUE_SEP),
    ByteSet(1 << UNIQUE_CLOSE),
)


# ---------------------------------------------------------------------------- builders


def byte_set(values: Iterable[int]) -> ByteSet:
    m = 0
    for b in values:
        m |= 1 << b
    return ByteSet(m)


def byte_range(lo: int, hi: int) -> ByteSet:
    """Bytes ``lo..hi`` inclusive."""
    if lo > hi:
        return ByteSet(0)
    return ByteSet(((1 << (hi - lo + 1)) - 1) << lo)


def lit(text: str | bytes) -> Expr:
    """The exact string (str is encoded as UTF-8); the node of a recent string is reused
    (nodes are immutable: JSON keys recur within and across schemas)."""
    hit = _LITS.get(text)  # ("a" and b"a" are different keys)
    if hit is not None:
        return hit
    data = text.encode("utf-8") if isinstance(text, str) else text
    if len(data) == 1:
        return _SINGLE[data[0]]
    e = Seq(tuple([_SINGLE[b] for b in data])) if data else EMPTY
    if len(data) <= 64:
        if len(_LITS) >= 8192:
            _LITS.clear()
        _LITS[text] = e
    return e


_LITS: dict = {}  # recent literal -> its node


def seq(*items: Expr) -> Expr:
    out: list[Expr] = []
    for it in items:
        if isinstance(it, Seq):
            out.extend(it.items)
        elif isinstance(it, Alt) and not it.items:
            return NOTHING
        else:
            out.append(it)
    if len(out) == 1:
        return out[0]
    return Seq(tuple(out))


def alt(*items: Expr) -> Expr:
    out: list[Expr] = []
    seen: set[Expr] = set()
    for it in items:
        parts = it.items if isinstance(it, Alt) else (it,)
        for p in parts:
            if p not in seen:
                seen.add(p)
                out.append(p)
    # merge single-byte alternatives into one ByteSet
    sets = [p for p in out if isinstance(p, ByteSet)]
    if len(sets) > 1:
        m = 0
        for s in sets:
            m |= s.mask
        merged = ByteSet(m)
        first = out.index(sets[0])
        out = [p for p in out if not isinstance(p, ByteSet)]
        out.insert(first, merged)
    if len(out) == 1:
        return out[0]
    return Alt(tuple(out))


def rep(item: Expr, lo: int, hi: int | None) -> Expr:
    if hi is not None and hi < lo:
        return NOTHING
    if hi == 0:
        return EMPTY
    if lo == 1 and hi == 1:
        return item
    if item == EMPTY:
        return EMPTY
    if item == NOTHING:
        return EMPTY if lo == 0 else NOTHING
    return Repeat(item, lo, hi)


def intersect(*items: Expr) -> Expr:
    """Strings all ``items`` match (regular, Ref-free operands): built as a product DFA."""
    if any(i == NOTHING for i in items):
        return NOTHING
    if len(items) == 1:
        return items[0]
    return And(tuple(items))


def difference(base: Expr, minus: Expr) -> Expr:
    """Strings ``base`` matches and ``minus`` does not (regular, Ref-free operands)."""
    if minus == NOTHING or base == NOTHING:
        return base
    return Diff(base, minus)


def opt(item: Expr) -> Expr:
    return rep(item, 0, 1)


def star(item: Expr) -> Expr:
    return rep(item, 0, None)


def plus(item: Expr) -> Expr:
    return rep(item, 1, None)


# ------------------------------------------------------------------------------ UTF-8

MAX_CODE_POINT = 0x10FFFF
_UTF8_BOUNDS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CODE_POINT))


def _utf8_seqs(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Split code points lo..hi (same encoded length) into byte-range sequences."""
    n = len(chr(lo).encode("utf-8", "surrogatepass"))
    if n == 1:
        return [[(lo, hi)]]
    # Split so that every continuation byte spans its full range 0x80..0xBF, or the
    # range shares all leading bytes (the classic utf8-ranges algorithm).
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m != 0:
                return _utf8_seqs(lo, lo | m) + _utf8_seqs((lo | m) + 1, hi)
            if hi & m != m:
                return _utf8_seqs(lo, (hi & ~m) - 1) + _utf8_seqs(hi & ~m, hi)
    a = chr(lo).encode("utf-8", "surrogatepass")
    b = chr(hi).encode("utf-8", "surrogatepass")
    return [[(a[k], b[k]) for k in range(n)]]


def utf8_class(ranges: Iterable[tuple[int, int]], *, negate: bool = False) -> Expr:
    """One character whose code point lies in one of ``ranges`` (inclusive pairs).

    Surrogates (U+D800..U+DFFF) are never produced: they are not valid UTF-8.
    With ``negate=True`` the class is every valid code point *not* in ``ranges``.
    """
    rs = sorted((max(0, lo), min(MAX_CODE_POINT, hi)) for lo, hi in ranges if lo <= hi)
    merged: list[tuple[int, int]] = []
    for lo, hi in rs:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    if negate:
        comp, prev = [], 0
        for lo, hi in merged:
            if lo > prev:
                comp.append((prev, lo - 1))
            prev = hi + 1
        if prev <= MAX_CODE_POINT:
            comp.append((prev, MAX_CODE_POINT))
        merged = comp
    # remove surrogates
    clean: list[tuple[int, int]] = []
    for lo, hi in merged:
        if hi < 0xD800 or lo > 0xDFFF:
            clean.append((lo, hi))
        else:
            if lo < 0xD800:
                clean.append((lo, 0xD7FF))
            if hi > 0xDFFF:
                clean.append((0xE000, hi))
    alts: list[Expr] = []
    for lo, hi in clean:
        for blo, bhi in _UTF8_BOUNDS:
            a, b = max(lo, blo), min(hi, bhi)
            if a <= b:
                for s in _utf8_seqs(a, b):
                    alts.append(seq(*(byte_range(x, y) for x, y in s)))
    return alt(*alts) if alts else NOTHING


ANY_CHAR: Expr = utf8_class([(0, MAX_CODE_POINT)])


# ----------------------------------------------------------------------- inspection


def rename_refs(expr: Expr, names: dict[str, str], memo: dict[int, Expr] | None = None) -> Expr:
    """``expr`` with every ``Ref(a)`` whose name is in ``names`` pointing to ``names[a]``
    (to embed one grammar's rules in another under fresh names; shared sub-trees are
    rebuilt once, sub-trees without such references are kept as they are)."""
    memo = {} if memo is None else memo
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:  # post-order, without recursion (IR trees may be deep)
        e, done = stack.pop()
        if id(e) in memo:
            continue
        if not (e._refs & names.keys()):
            memo[id(e)] = e
            continue
        t = type(e)
        if t is Ref:
            memo[id(e)] = Ref(names[e.name])
            continue
        kids = (e.item,) if t is Repeat else e.items
        if not done:
            stack.append((e, True))
            stack.extend((k, False) for k in kids if id(k) not in memo)
            continue
        new = [memo[id(k)] for k in kids]
        if t is Repeat:
            memo[id(e)] = Repeat(new[0], e.min, e.max)
        elif t is Diff:
            memo[id(e)] = Diff(new[0], new[1])
        else:
            memo[id(e)] = t(tuple(new))
    return memo[id(expr)]


def refs(expr: Expr) -> set[str]:
    """Names of the rules ``expr`` refers to."""
    return set(expr._refs)


def size(expr: Expr) -> int:
    """Number of nodes (Repeat counts its item once; shared sub-trees count each time)."""
    return expr._size


MASKS_MEMO_MIN = 64  # nodes: a Ref-free sub-expression this large keeps its byte sets (below)
_MASKS = NodeMemo(20_000)  # Ref-free sub-expression -> frozenset of its byte sets


def collect_masks(rules: dict[str, Expr], roots: list[str], called: set[str]) -> set[int]:
    """The byte sets of every rule reachable from ``roots`` (shared nodes visited once; a
    large Ref-free sub-expression's are kept across calls: JSON strings, numbers and
    values recur in every schema)."""
    masks: set[int] = set()
    add = masks.add
    seen_rules: set[str] = set()
    seen: set[int] = set()
    stack: list[Expr] = [rules[r] for r in roots]
    byte_set, repeat, ref = ByteSet, Repeat, Ref
    local: dict[int, frozenset[int]] = {}
    while stack:
        e = stack.pop()
        t = type(e)
        if t is byte_set:
            add(e.mask)
            continue
        if id(e) in seen:
            continue
        seen.add(id(e))
        if e._size >= MASKS_MEMO_MIN and not e._refs:
            masks.update(_masks_of(e, local))
            continue
        if t is repeat:
            stack.append(e.item)
        elif t is ref:
            if e.name not in seen_rules and e.name in rules:
                seen_rules.add(e.name)
                stack.append(rules[e.name])
        elif t is Dfa:
            for _, m, _ in e.edges:
                add(m)
        else:  # Seq, Alt, And, Diff
            for it in e.items:
                if type(it) is byte_set:
                    add(it.mask)
                else:
                    stack.append(it)
    return masks


def _masks_of(e: Expr, local: dict[int, frozenset[int]]) -> frozenset[int]:
    """The byte sets under the Ref-free expression ``e`` (kept for the large ones: in
    ``local`` by identity for this walk, whatever their size, so a sub-expression shared
    many times is walked once; in :data:`_MASKS` across compilations, within its bound)."""
    hit = local.get(id(e))
    if hit is not None:
        return hit
    hit = _MASKS.get(e)
    if hit is not None:
        local[id(e)] = hit
        return hit
    out: set[int] = set()
    seen: set[int] = set()
    stack: list[Expr] = [e]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is ByteSet:
            out.add(x.mask)
            continue
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x is not e and x._size >= MASKS_MEMO_MIN:
            out.update(_masks_of(x, local))
        elif t is Repeat:
            stack.append(x.item)
        elif t is Dfa:
            out.update(m for _, m, _ in x.edges)
        else:  # Seq, Alt, And, Diff
            stack.extend(x.items)
    hit = local[id(e)] = _MASKS.put(e, frozenset(out), e._size)
    return hit


def count_nodes(roots: Iterable[Expr], cap: int) -> int:
    """Distinct nodes (by identity; a :class:`Dfa` leaf counts its edges) under ``roots``;
    counting stops once past ``cap`` (linear, no recursion)."""
    seen: set[int] = set()
    stack: list[Expr] = list(roots)
    n = 0
    while stack and n <= cap:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        t = type(e)
        n += 1 + len(e.edges) if t is Dfa else 1
        if t is Repeat:
            stack.append(e.item)
        elif t is Seq or t is Alt or t is And or t is Diff:
            stack.extend(e.items)
    return n


def unproductive(rules: dict[str, Expr]) -> set[str]:
    """Rules that derive no finite text (the least fixpoint of "derives some text"): a
    front end refuses a start rule among them."""
    good: set[str] = set()

    def ok(e: Expr) -> bool:
        if isinstance(e, ByteSet):
            return e.mask != 0
        if isinstance(e, Ref):
            return e.name in good
        if isinstance(e, Seq):
            return all(ok(i) for i in e.items)
        if isinstance(e, Alt):
            return any(ok(i) for i in e.items)
        if isinstance(e, Repeat):
            return e.min == 0 or ok(e.item)
        return True  # an IR node of another front end: assume it matches something

    changed = True
    while changed:
        changed = False
        for name, e in rules.items():
            if name not in good and ok(e):
                good.add(name)
                changed = True
    return set(rules) - good
