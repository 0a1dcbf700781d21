"""``uniqueItems`` checked at run time: a tag check (:mod:`.tag_check`).

Where the items of a ``uniqueItems`` array cannot be enumerated (objects, free strings), the
JSON Schema front end writes the array with three marker bytes, never found in UTF-8 text
(:data:`~.ir.MARK_OPEN` right before its ``[``, :data:`~.ir.MARK_SEP` right before each ``,``
that separates two items and :data:`~.ir.MARK_CLOSE` right before its ``]``:
``json_schema.arrays.marked_array``). Every marker is followed by its fixed byte, so
:func:`eliminate` drops the marker edges from the compiled automaton: a transition
``s --M--> t --b--> u`` becomes ``s --b--> u`` tagged ``M`` (:class:`~.tag_check.Tags`). A
state with both a tagged and an untagged way to read ``b`` would make the checks depend on a
parse the text does not determine: that is a compile error naming the keyword.
:func:`compile_unique` is compile + eliminate (and the lenient fallback).

The frames of the open uniqueItems arrays are ``(start of the current item, frozenset of the
keys of the completed items)``; :func:`apply` is the tags' fold: ``OPEN`` pushes a frame,
``SEP`` completes an item (rejected when its JSON value equals an earlier item's:
:func:`item_key`, JSON Schema equality), ``CLOSE`` completes the last item (if any) and pops.

A compiled constraint that needs the check carries a :class:`UniqueItemsCheck` as
``compiled.check`` (:func:`attach`); ``Matcher(compiled)`` then returns its
:class:`~.tag_check.TagCheckMatcher` (also importable here as ``UniqueItemsMatcher``). The
check's mask rows are the plain rows without the tokens that would complete a duplicate item
(:meth:`UniqueItemsCheck._suspects` narrows the tokens to check).
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import re

import numpy as np

from .automaton.nfa import Limits
from .automaton.pushdown import Automaton, compile_grammar
from .errors import ConstraintError
from .ir import UNIQUE_CLOSE, UNIQUE_OPEN, UNIQUE_SEP, Grammar
from .tag_check import TagCheck, TagCheckMatcher, Tags, text_span

OPEN, SEP, CLOSE = UNIQUE_OPEN, UNIQUE_SEP, UNIQUE_CLOSE  # the tag kinds: the marker bytes
FOLLOW = {OPEN: ord("["), SEP: ord(","), CLOSE: ord("]")}  # the byte each marker comes before
_WS = b" \t\r\n"
UniqueItemsMatcher = TagCheckMatcher  # (the matcher of every tag check; its former name here)


def compile_unique(
    grammar: Grammar, limits: Limits | None = None, deadline: float | None = None
) -> tuple[Automaton, Tags | None]:
    """Compile a grammar that may hold uniqueItems markers (``grammar.unique``): the
    automaton without them and its tags (None for a grammar without markers, or where the
    markers were compiled away). A lenient grammar whose markers cannot be kept is compiled
    again with uniqueItems relaxed (``grammar.fallback``; its notes say so). (Grammars that
    may also hold key-order markers go through :func:`.key_order.compile_unique`.)"""
    if not grammar.unique:
        return compile_grammar(grammar, limits, deadline=deadline), None
    a = compile_grammar(grammar, limits, count=False, deadline=deadline)  # tags live on plain transitions
    try:
        return eliminate(a, grammar.unique)
    except ConstraintError:
        if grammar.fallback is None:
            raise
        relaxed = grammar.fallback()  # lenient: uniqueItems relaxed, as the notes say
        grammar.notes[:] = relaxed.notes
        return compile_unique(relaxed, limits, deadline)


def eliminate(a: Automaton, pointers: tuple[str, ...]) -> tuple[Automaton, Tags | None]:
    """The automaton ``a`` without its marker edges, and its tags (None where it has no
    marker: the uniqueItems arrays were compiled away)."""
    cls = a.cls
    mcls = {m: int(cls[m]) for m in FOLLOW}
    where = ", ".join(pointers)
    for c in mcls.values():
        if int((cls == c).sum()) != 1:
            raise ConstraintError(
                f"JSON Schema keyword 'uniqueItems' cannot be enforced here (at {where}): the "
                "grammar uses bytes reserved for its markers"
            )
    table = a.table
    marked = np.zeros(len(table), dtype=bool)
    for c in mcls.values():
        marked |= table[:, c] >= 0
    if not marked.any():
        return a, None
    if a.counters is not None:  # (not made: compile_unique counts nothing)
        raise ConstraintError(
            f"JSON Schema keyword 'uniqueItems' cannot be enforced with counted repetitions (at {where})"
        )
    new = table.copy()
    kind: dict[tuple[int, int], int] = {}
    for s in np.flatnonzero(marked).tolist():
        for m, c in mcls.items():
            t = int(table[s, c])
            if t < 0:
                continue
            fc = int(cls[FOLLOW[m]])
            u = int(table[t, fc])
            others = [x for x in range(table.shape[1]) if x != fc and table[t, x] >= 0]
            if u < 0 or others or t in a.calls or a.accepting[t]:
                raise ConstraintError(
                    f"JSON Schema keyword 'uniqueItems' cannot be enforced here (at {where}): a "
                    "marker is not followed by its bracket or comma"
                )
            if table[s, fc] >= 0 or (s, fc) in kind:
                raise ConstraintError(
                    f"JSON Schema keyword 'uniqueItems' cannot be enforced here (at {where}): "
                    "the same text may be an array with uniqueItems or without "
                    "(e.g. anyOf branches that differ only in uniqueItems); pass lenient=True to relax it"
                )  # (lenient: compile_unique relaxes it)
            new[s, fc] = u
            kind[(s, fc)] = m
    for c in mcls.values():
        new[:, c] = -1
    out = Automaton(new, cls, a.accepting, a.calls, a.start, a.rule_names, None)
    trigger = bytes(sorted({FOLLOW[m] for m in kind.values()}))
    return out, Tags(out, kind, pointers, trigger, apply)


# ------------------------------------------------------------------------ JSON values


def _canon(v: object):
    """A hashable key equal for values JSON Schema calls equal (1 == 1.0, key order
    irrelevant, true != 1)."""
    if isinstance(v, bool) or v is None:
        return ("b", v)
    if isinstance(v, (int, float)):
        if isinstance(v, float) and math.isfinite(v) and v.is_integer():
            v = int(v)
        return ("n", v)
    if isinstance(v, str):
        return ("s", v)
    if isinstance(v, list):
        return ("a", tuple(_canon(x) for x in v))
    return ("o", frozenset((k, _canon(x)) for k, x in v.items()))


@functools.lru_cache(maxsize=1024)  # a row checks many tokens that end the same item
def item_key(text: bytes):
    """The equality key of an item's JSON text (surrounding whitespace allowed)."""
    try:
        return _canon(json.loads(text.decode("utf-8")))
    except (ValueError, UnicodeDecodeError):  # pragma: no cover - the grammar writes JSON
        return ("raw", text)


def apply(frames: tuple, kind: int, pos: int, buf, data: bytes):
    """Frames after a tag read at absolute position ``pos`` (``buf + data`` the text up to
    and including it); None when it completes a duplicate item."""
    if kind == OPEN:
        return frames + ((pos + 1, frozenset()),)
    if not frames:  # pragma: no cover - tags are balanced by the grammar
        return frames
    start, seen = frames[-1]
    text = text_span(buf, data, start, pos)
    if kind == CLOSE and not text.strip(_WS):
        return frames[:-1]  # an empty array
    key = item_key(text)
    if key in seen:
        return None
    if kind == CLOSE:
        return frames[:-1]
    return frames[:-1] + ((pos + 1, seen | {key}),)


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"?', re.S)  # JSON strings (the last one may be open)
_STRING = re.compile(rb'"((?:[^"\\]|\\.)*)(")?', re.S)  # a JSON string's content, closed or not
_OPEN_U = re.compile(rb"\\u[0-9a-fA-F]{0,3}$")
_NONE = (frozenset(), [], [])


def _decoded_prefix(content: bytes) -> bytes | None:
    """The UTF-8 bytes of the value an open JSON string's ``content`` starts, whatever comes
    next; None where unsure (an open \\u escape, a surrogate escape)."""
    if b"\\" not in content:
        return content
    if _OPEN_U.search(content):
        return None
    for k in range(4):  # a UTF-8 sequence may be cut at the end
        head = content[: len(content) - k]
        if b"\\" in content[len(head) :]:
            return None
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            continue
        try:
            value = json.loads('"' + text + '"')
        except ValueError:
            return None
        if any(0xD800 <= ord(ch) < 0xE000 for ch in value):
            return None
        return value.encode("utf-8") + content[len(head) :]
    return None


_TYPE = {ord('"'): "s", ord("{"): "o", ord("["): "a", ord("t"): "b", ord("f"): "b", ord("n"): "b"}

_NONE = (frozenset(), [], [])


class UniqueItemsCheck(TagCheck):
    """The uniqueItems check of a compiled constraint (``compiled.check``).

    A token can be dropped from a row only where it completes an item equal to an earlier
    one of the same array. :meth:`~.tag_check.TagCheck.row` checks only the allowed tokens
    that can (a sound filter, :meth:`_suspects`): with no earlier item in any open array that
    is the tokens with a ``,`` followed by a ``,`` or ``]`` (two items ended in one token); an
    earlier item of the innermost array adds the tokens with ``,`` or ``]`` that may end the
    current item with a value equal to one (string prefixes, nesting depth); an earlier item
    of an outer array adds the tokens with a ``]`` followed by a ``,`` or ``]``. The rows equal
    :meth:`~.tag_check.TagCheck.row_reference` (the simulation of every allowed token with
    ``[``, ``,`` or ``]``).
    """

    EMPTY_REASON = (
        "uniqueItems: every token the grammar allows here completes an array item equal to an "
        "earlier item of the same array"
    )
    WALKED = b",]"  # only a token with ',' or ']' may complete an item

    def __init__(self, compiled, tags: Tags) -> None:
        super().__init__(compiled, tags)
        tb = compiled.vocab.token_bytes
        comp = self.comp.tolist()
        # token classes (subsets of comp) for the fast rows
        pair = re.compile(rb",.*[,\]]", re.S)
        cpair = re.compile(rb"\].*[,\]]", re.S)
        self.pair = frozenset(i for i in comp if pair.search(tb[i]))
        self.cpair = frozenset(i for i in comp if cpair.search(tb[i]))
        self.backslash = frozenset(i for i in comp if b"\\" in tb[i])
        self.closers = {i: tb[i].count(b"}") + tb[i].count(b"]") for i in comp}
        self._by_bytes = sorted((tb[i], i) for i in comp)
        self._by_bytes_ws = sorted((tb[i].lstrip(_WS), i) for i in comp)
        # compile (or load) the kernel now, not at the first mask (rows are read-only arrays)
        words = np.zeros(compiled.n_words, dtype=np.uint32)
        words.flags.writeable = False
        self._walk_tokens(np.array([self.a.start], dtype=np.int64), words)

    def _sorted(self, on: list) -> tuple:
        """The tokens of a row that may meet a tag (those with ',' or ']' whose parse is not
        surely tag-free): ``(all of them as a set, those in pair, those in cpair)``."""
        if not on:
            return _NONE
        pair, cpair = self.pair, self.cpair
        return (frozenset(on), [t for t in on if t in pair], [t for t in on if t in cpair])

    def _prefixed(self, keys: list, prefix: bytes, out: set) -> None:
        i = bisect.bisect_left(keys, (prefix,))
        while i < len(keys) and keys[i][0].startswith(prefix):
            out.add(keys[i][1])
            i += 1

    def _top_suspects(self, start: int, seen: frozenset, buf, on: frozenset):
        """Allowed tokens that may end the innermost array's current item (``buf[start:]`` so
        far) with a value in ``seen``: a set, or ``on`` itself where no filter applies."""
        text = bytes(buf[start:]).lstrip(_WS)
        types = {k[0] for k in seen}
        if "raw" in types:
            return on
        if not text:  # the item is all in the token
            if types != {"s"}:
                return on
            out = set(self.backslash)
            for _, v in seen:
                self._prefixed(self._by_bytes_ws, b'"' + v.encode("utf-8", "surrogatepass") + b'"', out)
            return out
        ty = _TYPE.get(text[0], "n")
        if ty not in types:
            return ()
        if ty == "s":
            m = _STRING.match(text)
            content = m.group(1)
            if m.group(2):  # the string is complete
                try:
                    value = json.loads(text[: m.end()].decode("utf-8"))
                except (ValueError, UnicodeDecodeError):
                    return on
                return on if ("s", value) in seen else ()
            if m.end() != len(text):
                return on  # an escape is open
            done = _decoded_prefix(content)
            if done is None:
                return on
            out = set(self.backslash)
            for t, v in seen:
                if t == "s":
                    vb = v.encode("utf-8", "surrogatepass")
                    if vb.startswith(done):
                        self._prefixed(self._by_bytes, vb[len(done) :] + b'"', out)
            return out
        if ty in "oa":
            bare = _STRINGS.sub(b"", text)
            depth = bare.count(b"{") + bare.count(b"[") - bare.count(b"}") - bare.count(b"]")
            if depth <= 0:
                return on
            closers = self.closers
            return [t for t in on if closers[t] >= depth]
        return on

    def _suspects(self, cfg, row: np.ndarray, frames: tuple, buf):
        """The tokens of a configuration's row that may complete a duplicate item, given the
        open arrays ``frames``."""
        on, pair, cpair = self._allowed(cfg, row)
        if not on:
            return ()
        if not frames:
            return pair
        outer = len(frames) > 1 and cpair and any(seen for _, seen in frames[:-1])
        start, seen = frames[-1]
        if not seen:
            return pair + cpair if outer else pair
        top = self._top_suspects(start, seen, buf, on)
        if top is on:
            return on
        out = set(pair)
        if outer:
            out.update(cpair)
        out.update(t for t in top if t in on)
        return out


def attach(compiled, tags: Tags | None):
    """``compiled`` with the uniqueItems check of ``tags`` (nothing to attach where None):
    its matchers, ``Matcher(compiled)`` included, are :class:`~.tag_check.TagCheckMatcher`."""
    if tags is not None:
        compiled.check = UniqueItemsCheck(compiled, tags)
    return compiled
