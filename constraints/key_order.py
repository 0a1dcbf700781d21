"""JSON object keys in any order (``key_order="any"``), checked at run time.

The JSON Schema front end writes such an object as any list of its members
(``json_schema.objects.ObjectMixin.any_order_body``) with marker bytes, never found in
UTF-8 text: ``KEY_OPEN`` right before its ``{``, ``KEY_NAME`` right before each member's
``:``, and ``KEY_CLOSE`` then the id of its set of required keys (``required_id``, in
``ID_WIDTH`` digit markers) right before its ``}``. This is the mechanism of
``uniqueItems`` (:mod:`.unique_items`, on :mod:`.tag_check`): :func:`eliminate_keys` drops
the marker edges from the compiled automaton, leaving tags on the ``{``, ``:`` and ``}``
transitions, and a check wraps the matcher. No permutation automaton: the automaton stays the size of the
schema-order one.

The ``}`` tag holds the set of the ids its markers may spell from that state: objects of
overlapping ``anyOf`` branches are one DFA state while their texts agree, and the state
knows which branches are still alive, so the object may close where one of those
branches has all its required keys. The ``{`` and ``:`` tags are the same for every object.

:func:`apply_keys` is the tags' fold: ``{`` pushes a frame ``(KEY_FRAME, keys seen)``; ``:``
reads the member's key (a JSON string, found by scanning back from the colon) and refuses
it if the object has it already (keys compared as decoded strings); ``}`` refuses to close
unless one of its sets of required keys was all seen, and pops. uniqueItems tags (ints) go
to :func:`.unique_items.apply`: both checks may share one automaton.

:class:`KeyOrderCheck` is ``compiled.check``, a :class:`~.tag_check.TagCheck`: its matcher is
:class:`~.tag_check.TagCheckMatcher` (the groups ``((configuration, frames), ...)`` and the
output bytes) and its mask rows are the plain rows without the tokens that would repeat a
key or close an object early (equal to :meth:`~.tag_check.TagCheck.row_reference`). A
duplicate key is refused at its ``:``, so a model that writes a key again is stopped right
after its closing quote.
"""

from __future__ import annotations

import functools
import json

import numpy as np

from . import unique_items as _unique
from .automaton.nfa import Limits
from .automaton.pushdown import Automaton, compile_grammar
from .errors import ConstraintError
from .ir import Grammar, collect_masks
from .json_schema.objects import ID_WIDTH, KEY_CLOSE, KEY_DIGITS, KEY_NAME, KEY_OPEN, required_set
from .tag_check import TagCheck, Tags, text_span
from .unique_items import FOLLOW, apply, eliminate

KEY_FRAME = "k"  # first item of an object's frame (an array's frame starts with an int)
_HEADS = {KEY_OPEN: ord("{"), KEY_NAME: ord(":"), KEY_CLOSE: ord("}")}
_WS = b" \t\r\n"
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def compile_unique(
    grammar: Grammar, limits: Limits | None = None, deadline: float | None = None
) -> tuple[Automaton, Tags | None]:
    """:func:`.unique_items.compile_unique`, for grammars that may also hold key-order
    markers: the automaton without any marker and the tags of both checks. Where the key
    order markers cannot be kept (:func:`eliminate_keys` refuses, or the automaton is too
    large without counted repetitions), the grammar's fallback is compiled instead: keys in
    schema order, its notes say so."""
    if grammar.fallback is None or not _has_key_markers(grammar):
        return _unique.compile_unique(grammar, limits, deadline)
    try:
        a = compile_grammar(grammar, limits, deadline=deadline)
        if a.counters is not None:  # tags live on plain transitions
            a = compile_grammar(grammar, limits, count=False, deadline=deadline)
        tags = eliminate(a, grammar.unique) if grammar.unique else (a, None)
        return eliminate_keys(*tags)
    except ConstraintError:
        relaxed = grammar.fallback()
        grammar.notes[:] = relaxed.notes
        return compile_unique(relaxed, limits, deadline)


def attach(compiled, tags: Tags | None):
    """``compiled`` with the run-time check of ``tags``: :class:`KeyOrderCheck` for key-order
    tags (uniqueItems' too, if any), else :func:`.unique_items.attach`'s."""
    if tags is not None and tags.apply is apply_keys:
        compiled.check = KeyOrderCheck(compiled, tags)
        return compiled
    return _unique.attach(compiled, tags)


def _has_key_markers(grammar: Grammar) -> bool:
    return any(m >> KEY_OPEN & 1 for m in collect_masks(grammar.rules, [grammar.start], set()))


def _refuse(why: str) -> ConstraintError:
    return ConstraintError(f"key_order='any' cannot be enforced here: {why}")


def eliminate_keys(a: Automaton, tags: Tags | None) -> tuple[Automaton, Tags | None]:
    """The automaton ``a`` without its key-order marker edges, and the tags (those of
    ``tags``, uniqueItems', kept). A state that could read a ``{``, ``:`` or ``}`` with a tag
    and without one (an object of ``key_order="any"`` and one written otherwise that read
    alike), or whose ``}`` reaches two states, is a ConstraintError (the lowering's fallback
    then writes the keys in schema order). The tags are None where no marker edge is left (the
    markers sat only in branches that cannot match)."""
    cls, table = a.cls, a.table
    ncls = table.shape[1]
    used = {}
    for m in (KEY_OPEN, KEY_NAME, KEY_CLOSE, *KEY_DIGITS):
        c = int(cls[m])
        if (table[:, c] >= 0).any():
            if int((cls == c).sum()) != 1:
                raise _refuse("the grammar uses bytes reserved for its markers")
            used[m] = c
    digit = {used[d]: k for k, d in enumerate(KEY_DIGITS) if d in used}
    kind: dict = dict(tags.kind) if tags is not None else {}
    new = table.copy()
    reads = (table >= 0).sum(axis=1)  # classes each state reads
    not_digit = np.ones(ncls, dtype=bool)
    not_digit[list(digit)] = False

    def only(t: int, fc: int) -> int:
        """The state after ``fc`` from ``t``, where ``t`` reads nothing else."""
        u = int(table[t, fc])
        if u < 0 or t in a.calls or a.accepting[t] or reads[t] != 1:
            raise _refuse(f"a marker is not followed by its {chr(head)!r}")
        return u

    for m, head in _HEADS.items():
        if m not in used:
            continue
        fc = int(cls[head])
        for s in np.flatnonzero(table[:, used[m]] >= 0).tolist():
            t = int(table[s, used[m]])
            if m != KEY_CLOSE:
                u, tag = only(t, fc), ("{",) if m == KEY_OPEN else (":",)
            else:  # the ids the digits may spell from t, and the one state after "}"
                ids, ends, front = set(), set(), [(t, 0, 0)]
                while front:
                    x, i, depth = front.pop()
                    if depth == ID_WIDTH:
                        ends.add(only(x, fc))
                        ids.add(i)
                        continue
                    nxt = [(int(table[x, c]), k) for c, k in digit.items() if table[x, c] >= 0]
                    if not nxt or x in a.calls or a.accepting[x] or (table[x, not_digit] >= 0).any():
                        raise _refuse("an object's closing marker is not followed by its id")
                    front += [(y, i * len(KEY_DIGITS) + k, depth + 1) for y, k in nxt]
                if len(ends) != 1:
                    raise _refuse("objects that read alike close into different states")
                u, tag = ends.pop(), ("}", frozenset(ids))
            if table[s, fc] >= 0 or (s, fc) in kind:
                raise _refuse(
                    f"the same {chr(head)!r} may be read with and without the key check (an object "
                    "that may be read two ways)"
                )
            new[s, fc] = u
            kind[(s, fc)] = tag
    for c in used.values():
        new[:, c] = -1
    out = Automaton(new, cls, a.accepting, a.calls, a.start, a.rule_names, None)
    if not kind:  # no object of the language holds a marker (a branch that cannot match)
        return out, None
    trigger = {FOLLOW[k] for k in kind.values() if isinstance(k, int)}
    trigger |= {ord(k[0]) for k in kind.values() if not isinstance(k, int)}
    pointers = tags.pointers if tags is not None else ()
    return out, Tags(out, kind, pointers, bytes(sorted(trigger)), apply=apply_keys)


# ----------------------------------------------------------------------------- frames


@functools.lru_cache(maxsize=4096)
def _decode(text: bytes) -> str | bytes:
    try:
        return json.loads(text.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):  # pragma: no cover - the grammar writes JSON strings
        return text


def key_before(buf, data: bytes, pos: int) -> str | bytes:
    """The decoded key of the member whose ``:`` is at absolute position ``pos`` of
    ``buf + data``: the JSON string that ends before it (whitespace between), found by
    scanning back to its opening quote (a quote inside a key is always escaped)."""
    n = len(buf)

    def at(i: int) -> int:
        return buf[i] if i < n else data[i - n]

    j = pos - 1
    while j >= 0 and at(j) in _WS:
        j -= 1
    end = j  # the closing quote
    j -= 1
    while j > 0:
        if at(j) == _QUOTE:
            k, slashes = j - 1, 0
            while k >= 0 and at(k) == _BACKSLASH:
                slashes, k = slashes + 1, k - 1
            if slashes % 2 == 0:
                break
        j -= 1
    return _decode(text_span(buf, data, j, end + 1))


def apply_keys(frames: tuple, kind, pos: int, buf, data: bytes):
    """Frames after a tag read at absolute position ``pos`` (``buf + data`` the text up to and
    including it); None when the tag repeats a key or closes an object too early."""
    if isinstance(kind, int):  # uniqueItems
        return apply(frames, kind, pos, buf, data)
    op = kind[0]
    if op == "{":
        return frames + ((KEY_FRAME, frozenset()),)
    if not frames or frames[-1][0] != KEY_FRAME:  # pragma: no cover - tags are balanced by the grammar
        return frames
    seen = frames[-1][1]
    if op == ":":
        key = key_before(buf, data, pos)
        if key in seen:
            return None
        return frames[:-1] + ((KEY_FRAME, seen | {key}),)
    # "}": one of the sets of required keys of the objects it may close was all seen
    return frames[:-1] if any(required_set(i) <= seen for i in kind[1]) else None


# ------------------------------------------------------------------------------ check


class KeyOrderCheck(TagCheck):
    """The key-order check of a compiled constraint (``compiled.check``) with key-order tags
    (and maybe uniqueItems tags).

    A token is dropped from a row only where each of its parses from the configuration meets
    a tag that refuses (a ``:`` after a key given already, a ``}`` before the required keys,
    uniqueItems' ``,`` and ``]`` after a duplicate item). Only the allowed tokens that may meet
    a tag are checked (:meth:`~.tag_check.TagCheck._allowed`: every token with a ``{``, ``:``
    or ``}``, or a uniqueItems tag byte, that the numba walk flags)."""

    EMPTY_REASON = (
        "key_order='any': every token the grammar allows here repeats a key of the object, or "
        "closes it before all its required keys (keys are checked as they end, not looked ahead)"
    )
