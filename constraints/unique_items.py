"""``uniqueItems`` checked at run time: a check that wraps the matcher.

Where the items of a ``uniqueItems`` array cannot be enumerated (objects, free strings), the
JSON Schema front end writes the array with three marker bytes, never found in UTF-8 text
(:data:`~.ir.MARK_OPEN` right before its ``[``, :data:`~.ir.MARK_SEP` right before each ``,``
that separates two items and :data:`~.ir.MARK_CLOSE` right before its ``]``:
``json_schema.arrays.marked_array``). Every marker is followed by its fixed byte, so
:func:`eliminate` drops the marker edges from the compiled automaton: a transition
``s --M--> t --b--> u`` becomes ``s --b--> u`` tagged ``M`` (:class:`Tags`). A state with both
a tagged and an untagged way to read ``b`` would make the checks depend on a parse the text
does not determine: that is a compile error naming the keyword. :func:`compile_unique` is
compile + eliminate (and the lenient fallback).

The automaton without markers is an ordinary automaton: its plain :class:`~.matcher.Matcher`
accepts the texts of the grammar with the uniqueness check left out. The check is
:class:`UniqueItemsMatcher`, which holds that plain matcher and adds, per configuration of
the automaton (one for a DFA, one per set of stacks with the same arrays open for a
pushdown automaton), the open uniqueItems arrays: a tuple of frames ``(start of the
current item, frozenset of the keys of the completed items)``. ``OPEN`` pushes a frame,
``SEP`` completes an item (rejected when its JSON value equals an earlier item's:
:func:`item_key`, JSON Schema equality), ``CLOSE`` completes the last item (if any) and
pops. It keeps ``((configuration, frames), ...)`` groups and the output bytes.

A compiled constraint that needs the check carries a :class:`UniqueItemsCheck` as
``compiled.check`` (:func:`attach`); ``Matcher(compiled)`` then returns its
:class:`UniqueItemsMatcher`. The check's mask rows are the plain rows without the tokens
that would complete a duplicate item (:meth:`UniqueItemsCheck.row`).
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
from .matcher import MAX_FORCED_BYTES, STEP_MEMO_SIZE, Matcher, encode_forced

try:  # numba is a listed dependency; the pure-Python fallback keeps the package importable
    from numba import njit
except ImportError:  # pragma: no cover
    njit = None

OPEN, SEP, CLOSE = UNIQUE_OPEN, UNIQUE_SEP, UNIQUE_CLOSE  # the tag kinds: the marker bytes
FOLLOW = {OPEN: ord("["), SEP: ord(","), CLOSE: ord("]")}  # the byte each marker comes before
_WS = b" \t\r\n"
_MISS = object()


class Tags:
    """The tags of an automaton's transitions: ``kind[(state, class)]`` is OPEN, SEP or CLOSE."""

    def __init__(
        self,
        automaton: Automaton,
        kind: dict[tuple[int, int], int],
        pointers: tuple[str, ...],
        trigger: bytes,
        apply=None,
    ) -> None:
        self.automaton = automaton
        n_states = automaton.n_states
        self.kind = kind
        tagged = np.zeros(n_states, dtype=bool)
        for s, _ in kind:
            tagged[s] = True
        self.tagged = tagged.tolist()
        self.pointers = pointers
        self.trigger = trigger  # the bytes whose transitions may carry a tag
        # frames after a tag: apply(frames, kind, pos, buf, data), None to refuse (a check
        # with more tag kinds than uniqueItems' brings its own: see ..key_order)
        self.apply = apply or globals()["apply"]


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
            if u < 0 or others or a.calls[t] or a.accepting[t]:
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
    return out, Tags(out, kind, pointers, trigger)


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


def text_span(buf, data: bytes, start: int, end: int) -> bytes:
    n = len(buf)
    if end <= n:
        return bytes(buf[start:end])
    head = bytes(buf[start:]) if start < n else b""
    return head + data[max(0, start - n) : end - n]


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


# ----------------------------------------------------------------------------- steps


def _walk(tags: Tags, groups, data: bytes, fold) -> list:
    """The groups ``((configuration, acc), ...)`` that survive ``data``; ``acc`` is folded over
    each tagged transition met at offset j: ``fold(acc, kind, j)``, None drops that parse."""
    a = tags.automaton
    kind, tagged, cls = tags.kind, tags.tagged, a.cls_list
    if a.is_regular:
        out = []
        for s, acc in groups:
            for j, b in enumerate(data):
                c = cls[b]
                t = a.row(s)[c]
                if t < 0:
                    acc = None
                    break
                if tagged[s]:
                    k = kind.get((s, c))
                    if k is not None:
                        acc = fold(acc, k, j)
                        if acc is None:
                            break
                s = t
            if acc is not None and (s, acc) not in out:
                out.append((s, acc))
        return out
    cur = list(groups)
    for j, b in enumerate(data):
        c = cls[b]
        moved: dict = {}
        for cfg, acc in cur:
            for st in cfg.stacks:
                top = st[-1]
                t = a.row(top)[c]
                if t < 0:
                    continue
                a2 = acc
                if tagged[top]:
                    k = kind.get((top, c))
                    if k is not None:
                        a2 = fold(acc, k, j)
                        if a2 is None:
                            continue
                moved.setdefault(a2, []).append(st[:-1] + (t,))
        cur = []
        for a2, sts in moved.items():
            cfg = a.closure(sts)
            if cfg is not None:
                cur.append((cfg, a2))
        if not cur:
            return []
    return cur


def cleared_row(row: np.ndarray, drop: list) -> np.ndarray:
    """A copy of the int32 mask row without the tokens in ``drop``."""
    row = row.copy()
    w = row.view(np.uint32)
    for t in drop:
        w[t >> 5] &= ~np.uint32(1 << (t & 31))
    return row


def _add_event(ev: tuple, k: int, j: int) -> tuple:
    return ev + ((j, k),)


def step(tags: Tags, groups: tuple, data: bytes, buf) -> tuple | None:
    """Groups ``((configuration, frames), ...)`` after ``data`` (``buf``: the text before it);
    None if no group survives."""
    base = len(buf)
    fold = tags.apply
    out = _walk(tags, groups, data, lambda fr, k, j: fold(fr, k, base + j, buf, data))
    return tuple(out) if out else None


def events(tags: Tags, s: int, data: bytes) -> tuple | None:
    """A DFA's tags met reading ``data`` from state ``s``: ((offset, kind), ...); None if dead."""
    out = _walk(tags, ((s, ()),), data, _add_event)
    return out[0][1] if out else None


def accepts(tags: Tags, data: bytes) -> bool:
    """Does ``data`` match the whole grammar, uniqueItems included?"""
    a = tags.automaton
    if a.initial is None:
        return False
    groups = step(tags, ((a.initial, ()),), data, b"")
    return groups is not None and any(a.can_end(cfg) for cfg, _ in groups)


def is_prefix(tags: Tags, data: bytes) -> bool:
    """Can ``data`` be extended to a match, uniqueItems included?"""
    a = tags.automaton
    return a.initial is not None and step(tags, ((a.initial, ()),), data, b"") is not None


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


def _unsafe_py(table, cls, tagmat, stop, tops, words, ids, flat, offs, out):
    """``out[k]``: token ``ids[k]`` is allowed by the row ``words`` and its bytes
    (``flat[offs[k]:offs[k + 1]]``), read from one of the states ``tops``, may meet a tag:
    they take a tagged transition, or reach a state that may call or return (``stop``)
    before their last byte. Returns the number of such tokens."""
    n = 0
    for k in range(len(ids)):
        t = ids[k]
        if not (words[t >> 5] >> (t & 31)) & 1:
            continue
        a, b = offs[k], offs[k + 1]
        for s0 in tops:
            s = s0
            hit = False
            for j in range(a, b):
                c = cls[flat[j]]
                nxt = table[s, c]
                if nxt < 0:
                    break
                if tagmat[s, c] or (j < b - 1 and stop[nxt]):
                    hit = True
                    break
                s = nxt
            if hit:
                out[k] = True
                n += 1
                break
    return n


_unsafe = njit(cache=True, nogil=True)(_unsafe_py) if njit is not None else _unsafe_py


def unsafe_tokens(table, cls, tagmat, stop, tops, words, ids, flat, offs, out) -> int:
    """:func:`_unsafe_py` (numba-compiled where numba is): which tokens ``ids`` allowed by the
    row ``words`` may meet a tag from the states ``tops``; marks them in ``out``, returns
    their number."""
    return _unsafe(table, cls, tagmat, stop, tops, words, ids, flat, offs, out)


def symbolic_events(tags: Tags, cfg, data: bytes) -> tuple:
    """The tag sequences ``((offset, kind), ...)`` of the parses of ``data`` from ``cfg``
    that survive it, whatever the frames (a duplicate is judged later, by :func:`survives`)."""
    return tuple(ev for _, ev in _walk(tags, ((cfg, ()),), data, _add_event))


def survives(seqs: tuple, frames: tuple, buf, data: bytes, fold=apply) -> bool:
    """Does one of the tag sequences ``seqs`` (of one token, ``data``) complete no duplicate
    (``fold``: the tags' apply)?"""
    base = len(buf)
    for ev in seqs:
        f2 = frames
        for j, k in ev:
            f2 = fold(f2, k, base + j, buf, data)
            if f2 is None:
                break
        else:
            return True
    return False


class UniqueItemsCheck:
    """Per compiled constraint (``compiled.check``): what mask rows of uniqueItems groups
    need beyond the plain rows, and the matchers (:meth:`matcher`).

    A token can be dropped from a row only where it completes an item equal to an earlier
    one of the same array. :meth:`row` checks only the allowed tokens that can (a sound
    filter, :meth:`_suspects`) by their tag sequences from the configuration (memoised per
    configuration and token): with no earlier item in any open array that is the tokens with
    a ``,`` followed by a ``,`` or ``]`` (two items ended in one token); an earlier item of
    the innermost array adds the tokens with ``,`` or ``]`` that may end the current item
    with a value equal to one (string prefixes, nesting depth); an earlier item of an outer
    array adds the tokens with a ``]`` followed by a ``,`` or ``]``. The rows equal
    :meth:`row_reference` (the simulation of every allowed token with ``[``, ``,`` or ``]``).
    """

    MEMO = 8192
    EVENTS_MEMO = 1 << 16
    EMPTY_REASON = (
        "uniqueItems: every token the grammar allows here completes an array item equal to an "
        "earlier item of the same array"
    )

    def __init__(self, compiled, tags: Tags) -> None:
        self.compiled = compiled
        a = compiled.automaton
        assert a is tags.automaton
        self.a = a
        self.tags = tags
        trig = tags.trigger
        tb = compiled.vocab.token_bytes
        ids = [i for i, x in enumerate(tb) if x and any(b in x for b in trig)]
        self.trig_ids = np.array(ids, dtype=np.int64)
        flag = np.zeros(compiled.vocab_size, dtype=bool)
        flag[self.trig_ids] = True
        self.has_trig = flag.tolist()
        self._cands: dict = {}
        # token classes (subsets of trig_ids) for the fast rows
        pair = re.compile(rb",.*[,\]]", re.S)
        cpair = re.compile(rb"\].*[,\]]", re.S)
        comp = [i for i in ids if b"," in tb[i] or b"]" in tb[i]]
        self.comp = np.array(comp, dtype=np.int64)
        self.pair = frozenset(i for i in comp if pair.search(tb[i]))
        self.cpair = frozenset(i for i in comp if cpair.search(tb[i]))
        self.backslash = frozenset(i for i in comp if b"\\" in tb[i])
        self.closers = {i: tb[i].count(b"}") + tb[i].count(b"]") for i in comp}
        self._by_bytes = sorted((tb[i], i) for i in comp)
        self._by_bytes_ws = sorted((tb[i].lstrip(_WS), i) for i in comp)
        self._on: dict = {}
        self._events: dict = {}
        # per configuration, the walk of _unsafe over those tokens (numba)
        self._flat = np.frombuffer(b"".join(tb[i] for i in comp), dtype=np.uint8)
        self._offs = np.cumsum([0] + [len(tb[i]) for i in comp]).astype(np.int64)
        ncls = a.table.shape[1]
        tagmat = np.zeros((len(a.table), ncls), dtype=np.bool_)
        for st, c in tags.kind:
            tagmat[st, c] = True
        self._tagmat = tagmat
        self._stop = np.zeros(len(a.table), dtype=np.bool_) if a.is_regular else (a.accepting | a.has_calls)
        self._table = np.ascontiguousarray(a.table)
        self._cls = np.ascontiguousarray(a.cls, dtype=np.int64)
        # compile (or load) the kernel now, not at the first mask (rows are read-only arrays)
        words = np.zeros(compiled.n_words, dtype=np.uint32)
        words.flags.writeable = False
        _unsafe(
            self._table,
            self._cls,
            self._tagmat,
            self._stop,
            np.array([a.start], dtype=np.int64),
            words,
            self.comp,
            self._flat,
            self._offs,
            np.zeros(len(comp), dtype=np.bool_),
        )

    # ------------------------------------------------------------------ fast rows

    def matcher(self) -> UniqueItemsMatcher:
        """A new matcher of the compiled constraint, with the check."""
        return UniqueItemsMatcher(self.compiled, self)

    def accepts(self, data: bytes) -> bool:
        """Does ``data`` match the whole constraint, uniqueItems included?"""
        return accepts(self.tags, data)

    def _allowed(self, cfg, row: np.ndarray) -> tuple:
        """What a configuration's row holds of the tokens that may meet a tag (those with
        ',' or ']' whose parse is not surely tag-free, see :func:`_unsafe`): ``(all of
        them as a set, those in pair, those in cpair)``; memoised per configuration."""
        hit = self._on.get(cfg)
        if hit is not None:
            return hit
        tops = np.array([cfg] if self.a.is_regular else sorted({st[-1] for st in cfg.stacks}), dtype=np.int64)
        ids = self.comp
        out = np.zeros(len(ids), dtype=np.bool_)
        if _unsafe(
            self._table,
            self._cls,
            self._tagmat,
            self._stop,
            tops,
            row.view(np.uint32),
            ids,
            self._flat,
            self._offs,
            out,
        ):
            on = ids[out].tolist()
            pair, cpair = self.pair, self.cpair
            hit = (frozenset(on), [t for t in on if t in pair], [t for t in on if t in cpair])
        else:
            hit = _NONE
        if len(self._on) >= self.MEMO:
            self._on.clear()
        self._on[cfg] = hit
        return hit

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

    def _suspects(self, hit: tuple, frames: tuple, buf):
        """The tokens of a row (``hit``: its :meth:`_allowed`) that may complete a duplicate
        item, given the open arrays ``frames``."""
        on, pair, cpair = hit
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

    def _seqs(self, cfg, t: int) -> tuple:
        key = (cfg, t)
        hit = self._events.get(key)
        if hit is None:
            hit = symbolic_events(self.tags, cfg, self.compiled.vocab.token_bytes[t])
            hit = tuple(ev for ev in hit if ev) if all(hit) else ()  # () where one parse meets no tag
            if len(self._events) >= self.EVENTS_MEMO:
                self._events.clear()
            self._events[key] = hit
        return hit

    def row(self, groups: tuple, buf) -> np.ndarray:
        """The mask row of groups: each configuration's row without the tokens that would
        complete a duplicate item (equal to :meth:`row_reference`)."""
        c = self.compiled
        acc = None
        for cfg, fr in groups:
            row = c.mask_row(cfg)
            hit = self._on.get(cfg)
            if hit is None:
                hit = self._allowed(cfg, row)
            if hit[0] and (fr or hit[1]):
                drop = None
                tb = c.vocab.token_bytes
                for t in self._suspects(hit, fr, buf):
                    seqs = self._seqs(cfg, t)
                    if seqs and not survives(seqs, fr, buf, tb[t]):
                        if drop is None:
                            drop = []
                        drop.append(t)
                if drop:
                    row = cleared_row(row, drop)
            acc = row if acc is None else acc | row
        return acc

    # ------------------------------------------------------------------ the reference

    def candidates(self, cfg, row: np.ndarray) -> list:
        """Tokens allowed by ``row`` (the configuration's) that meet a tag: for a DFA
        ``(token, ((offset, kind), ...))``, else ``(token, None)``."""
        hit = self._cands.get(cfg)
        if hit is not None:
            return hit
        ids = self.trig_ids
        words = row.view(np.uint32)
        on = ids[((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)] if len(ids) else ids
        tb = self.compiled.vocab.token_bytes
        a = self.a
        out = []
        if a.is_regular:
            for t in on.tolist():
                ev = events(self.tags, cfg, tb[t])
                if ev:
                    out.append((t, ev))
        else:
            out = [(t, None) for t in on.tolist()]
        if len(self._cands) >= self.MEMO:
            self._cands.clear()
        self._cands[cfg] = out
        return out

    def row_reference(self, groups: tuple, buf) -> np.ndarray:
        """The mask row of groups, by simulating every allowed token that holds a tag byte
        (the reference of :meth:`row`)."""
        c = self.compiled
        tb = c.vocab.token_bytes
        acc = None
        for cfg, fr in groups:
            row = c.mask_row(cfg)
            drop = []
            for t, ev in self.candidates(cfg, row):
                data = tb[t]
                if ev is not None:
                    f2 = fr
                    for j, k in ev:
                        f2 = self.tags.apply(f2, k, len(buf) + j, buf, data)
                        if f2 is None:
                            drop.append(t)
                            break
                elif step(self.tags, ((cfg, fr),), data, buf) is None:
                    drop.append(t)
            if drop:
                row = cleared_row(row, drop)
            acc = row if acc is None else acc | row
        return acc


def attach(compiled, tags: Tags | None):
    """``compiled`` with the uniqueItems check of ``tags`` (nothing to attach where None):
    its matchers, ``Matcher(compiled)`` included, are :class:`UniqueItemsMatcher`."""
    if tags is not None:
        compiled.check = UniqueItemsCheck(compiled, tags)
    return compiled


# ---------------------------------------------------------------------------- the matcher


class UniqueItemsMatcher:
    """A :class:`~.matcher.Matcher` with uniqueItems checked: the plain matcher walks the
    automaton (history, EOS, tokenization of forced bytes); this one also keeps the
    ``((configuration, frames), ...)`` groups and the output bytes, refuses a token that
    completes an item equal to an earlier one of its array and leaves such tokens out of the
    mask rows. Same interface as the matcher; ``state`` is the groups."""

    __slots__ = ("compiled", "_check", "_plain", "_groups", "_buf", "_lens")

    def __init__(self, compiled, check: UniqueItemsCheck) -> None:
        self.compiled = compiled
        self._check = check
        self._plain = Matcher.plain(compiled)
        self._groups: list[tuple] = [((compiled.initial, ()),)]
        self._buf = bytearray()  # the output bytes (item values are compared as JSON)
        self._lens: list[int] = [0]  # len(_buf) at each point of history

    # ------------------------------------------------------------------ state

    @property
    def state(self):
        return self._groups[-1]

    @property
    def ended(self) -> bool:
        return self._plain.ended

    @property
    def text(self) -> bytearray:
        """The output bytes so far (shared; do not modify)."""
        return self._buf

    def can_end(self) -> bool:
        a = self.compiled.automaton
        return not self._plain.ended and any(a.can_end(cfg) for cfg, _ in self._groups[-1])

    def is_terminated(self) -> bool:
        if self._plain.ended:
            return True
        a = self.compiled.automaton
        groups = self._groups[-1]
        return any(a.can_end(cfg) for cfg, _ in groups) and not any(a.next_bytes(cfg) for cfg, _ in groups)

    def num_accepted(self) -> int:
        return self._plain.num_accepted()

    # ---------------------------------------------------------------- tokens

    def _step(self, groups: tuple, token_id: int | None, data: bytes) -> tuple | None:
        """Groups after ``data``: a token that cannot meet a tag takes the memoised plain step
        of each configuration."""
        c = self.compiled
        a = c.automaton
        if token_id is not None and not self._check.has_trig[token_id]:
            memo = c.step_memo
            out = []
            for cfg, fr in groups:
                key = (cfg, token_id)
                nxt = memo.get(key, _MISS)
                if nxt is _MISS:
                    nxt = a.step_bytes(cfg, data)
                    if len(memo) >= STEP_MEMO_SIZE:
                        memo.clear()
                    memo[key] = nxt
                if nxt is not None:
                    out.append((nxt, fr))
            return tuple(out) if out else None
        return step(self._check.tags, groups, data, self._buf)

    def _push(self, groups: tuple, data: bytes) -> None:
        self._groups.append(groups)
        self._buf += data
        self._lens.append(len(self._buf))

    def accept(self, token_id: int) -> bool:
        """Advance by one token; on False the state is unchanged."""
        if self._plain.ended:
            return False
        c = self.compiled
        groups = self._groups[-1]
        if token_id in c.vocab.eos_ids:
            if not self.can_end() or not self._plain.accept(token_id):
                return False
            self._push(groups, b"")
            return True
        data = c.vocab.token_bytes[token_id] if 0 <= token_id < c.vocab_size else None
        if not data:
            return False
        nxt = self._step(groups, token_id, data)
        # (the groups' parses are parses of the automaton: the plain matcher accepts too)
        if nxt is None or not self._plain.accept(token_id):
            return False
        self._push(nxt, data)
        return True

    def accept_bytes(self, data: bytes) -> bool:
        """Advance by raw bytes (as one history entry); on False the state is unchanged."""
        if self._plain.ended:
            return False
        groups = self._groups[-1]
        nxt = step(self._check.tags, groups, data, self._buf) if data else groups
        if nxt is None or not self._plain.accept_bytes(data):
            return False
        self._push(nxt, data)
        return True

    def rollback(self, n: int = 1) -> None:
        """Undo the last ``n`` accepted tokens."""
        self._plain.rollback(n)
        if n:
            del self._groups[-n:]
            del self._lens[-n:]
            del self._buf[self._lens[-1] :]

    def reset(self) -> None:
        self._plain.reset()
        del self._groups[1:]
        del self._lens[1:]
        del self._buf[:]

    def copy(self) -> UniqueItemsMatcher:
        m = UniqueItemsMatcher.__new__(UniqueItemsMatcher)
        m.compiled = self.compiled
        m._check = self._check
        m._plain = self._plain.copy()
        m._groups = list(self._groups)
        m._buf = bytearray(self._buf)
        m._lens = list(self._lens)
        return m

    # ----------------------------------------------------------------- masks

    def mask_row(self) -> np.ndarray:
        """This step's allowed tokens as an int32 row (shared; do not modify)."""
        if self._plain.ended:
            return self.compiled.mask_row_eos_only()
        return self._check.row(self._groups[-1], self._buf)

    def empty_reason(self) -> str | None:
        """Why this step's mask allows nothing, when the reason is not the grammar itself: the
        tokens the grammar allows all complete an array item equal to an earlier item of that
        array (``uniqueItems`` is checked as items end, not looked ahead). None otherwise."""
        if self._plain.ended or self.mask_row().any():
            return None
        c = self.compiled
        if not any(c.mask_row(cfg).any() for cfg, _ in self._groups[-1]):
            return None
        return self._check.EMPTY_REASON

    def fill_bitmask(self, bitmask, row: int = 0) -> None:
        """Write this step's allowed tokens into ``bitmask[row]`` (see :meth:`.Matcher.fill_bitmask`)."""
        Matcher.write_row(bitmask, row, self.mask_row())

    def allowed_tokens(self) -> np.ndarray:
        return Matcher.row_tokens(self.mask_row(), self.compiled.vocab_size)

    # -------------------------------------------------------------- jump-forward

    def forced_bytes(self) -> bytes:
        """Forced bytes of the groups: never a byte that completes a duplicate item."""
        if self._plain.ended:
            return b""
        a = self.compiled.automaton
        groups = self._groups[-1]
        out = bytearray()
        while len(out) < MAX_FORCED_BYTES and not any(a.can_end(cfg) for cfg, _ in groups):
            nb = sorted({b for cfg, _ in groups for b in a.next_bytes(cfg)})
            if len(nb) != 1:
                break
            nxt = step(self._check.tags, groups, bytes(nb), self._buf + out)
            if nxt is None:
                break
            out.append(nb[0])
            groups = nxt
        return bytes(out)

    def forced_tokens(self) -> list[int]:
        return encode_forced(self.compiled, self.forced_bytes())
