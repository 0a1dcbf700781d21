"""Tag checks: run-time checks on tags left on an automaton's transitions.

A check the automaton cannot express (``uniqueItems``: :mod:`.unique_items`; JSON keys in any
order: :mod:`.key_order`) is compiled as marker bytes, then the marker edges are dropped from
the automaton, leaving :class:`Tags` on the transitions that read the byte after each marker.
The automaton without markers is an ordinary automaton: its plain :class:`~.matcher.Matcher`
accepts the texts with the check left out. The check folds the tags met along a parse into
a tuple of frames (the open arrays or objects), with ``tags.apply``: None refuses the parse.

This module holds what every tag check shares: the walks of a text that fold the tags
(:func:`step`, :func:`accepts`, :func:`is_prefix`, :func:`symbolic_events`), the numba walk
that finds the tokens that may meet a tag (:func:`_unsafe`), :class:`TagCheck`, the base of
the checks (``compiled.check``: the mask rows and the matchers), and
:class:`TagCheckMatcher`, which holds the plain matcher and adds, per configuration of the
automaton (one for a DFA, one per set of stacks with the same frames for a pushdown
automaton), the frames: it keeps ``((configuration, frames), ...)`` groups and the output
bytes.
"""

from __future__ import annotations

import re

import numpy as np

from .automaton.pushdown import Automaton, union_config
from .automaton.tables import flags
from .matcher import MAX_FORCED_BYTES, Matcher, encode_forced
from .native import kernel

_MISS = object()
STEP_MEMO = 1 << 16  # pushdown steps a check keeps (then it starts afresh)


class Tags:
    """The tags of an automaton's transitions: ``kind[(state, class)]`` is the tag read there
    (its meaning is the check's), ``apply`` the check's fold."""

    def __init__(
        self,
        automaton: Automaton,
        kind: dict[tuple[int, int], object],
        pointers: tuple[str, ...],
        trigger: bytes,
        apply,
    ) -> None:
        self.automaton = automaton
        n_states = automaton.n_states
        self.kind = kind
        tagged = np.zeros(n_states, dtype=bool)
        for s, _ in kind:
            tagged[s] = True
        self.tagged = flags(tagged)
        self.pointers = pointers
        self.trigger = trigger  # the bytes whose transitions may carry a tag
        # frames after a tag: apply(frames, kind, pos, buf, data), None to refuse
        self.apply = apply
        self.steps: dict = {}  # (configuration, byte class) -> its moves (see _moves)


def text_span(buf, data: bytes, start: int, end: int) -> bytes:
    """Bytes ``start:end`` (absolute positions) of the text ``buf + data``."""
    n = len(buf)
    if end <= n:
        return bytes(buf[start:end])
    head = bytes(buf[start:]) if start < n else b""
    return head + data[max(0, start - n) : end - n]


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
                t = a.targets[s * a.width + c]
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
    steps = tags.steps
    cur = list(groups)
    for j, b in enumerate(data):
        c = cls[b]
        moved: dict = {}
        for cfg, acc in cur:
            outs = steps.get((cfg, c))
            if outs is None:
                outs = _moves(tags, cfg, c)
                if len(steps) >= STEP_MEMO:
                    steps.clear()
                steps[(cfg, c)] = outs
            for k, cfg2 in outs:
                a2 = acc if k is None else fold(acc, k, j)
                if a2 is not None:
                    moved.setdefault(a2, []).append(cfg2)
        cur = [(cfgs[0] if len(cfgs) == 1 else union_config(cfgs), a2) for a2, cfgs in moved.items()]
        if not cur:
            return []
    return cur


def _moves(tags: Tags, cfg, c: int) -> tuple:
    """A pushdown configuration's step by byte class ``c``, the frames left out: ``((tag or
    None, configuration), ...)``, the stacks that move by the same tag (or by none) closed
    together. A parse's frames fold each tag, so stacks whose tags fold alike share a
    configuration: the union of these (a closure is what its stacks reach, so that of
    several sets of stacks is the union of theirs); :func:`_walk_ref` is the reference."""
    a, kind, tagged = tags.automaton, tags.kind, tags.tagged
    by_tag: dict = {}
    for st in cfg[0]:
        top = st[-1]
        t = a.targets[top * a.width + c]
        if t < 0:
            continue
        k = kind.get((top, c)) if tagged[top] else None
        by_tag.setdefault(k, []).append(st[:-1] + (t,))
    out = []
    for k, sts in by_tag.items():
        cfg2 = a.closure(sts)
        if cfg2 is not None:
            out.append((k, cfg2))
    return tuple(out)


def _walk_ref(tags: Tags, groups, data: bytes, fold) -> list:
    """:func:`_walk` of a pushdown automaton, every step taken and closed afresh."""
    a = tags.automaton
    kind, tagged, cls = tags.kind, tags.tagged, a.cls_list
    cur = list(groups)
    for j, b in enumerate(data):
        c = cls[b]
        moved: dict = {}
        for cfg, acc in cur:
            for st in cfg[0]:
                top = st[-1]
                t = a.targets[top * a.width + c]
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


def _add_event(ev: tuple, k, j: int) -> tuple:
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
    """Does ``data`` match the whole grammar, the tag checks included?"""
    a = tags.automaton
    if a.initial is None:
        return False
    groups = step(tags, ((a.initial, ()),), data, b"")
    return groups is not None and any(a.can_end(cfg) for cfg, _ in groups)


def is_prefix(tags: Tags, data: bytes) -> bool:
    """Can ``data`` be extended to a match, the tag checks included?"""
    a = tags.automaton
    return a.initial is not None and step(tags, ((a.initial, ()),), data, b"") is not None


def symbolic_events(tags: Tags, cfg, data: bytes) -> tuple:
    """The tag sequences ``((offset, kind), ...)`` of the parses of ``data`` from ``cfg``
    that survive it, whatever the frames (a refusal is judged later, by :func:`survives`)."""
    return tuple(ev for _, ev in _walk(tags, ((cfg, ()),), data, _add_event))


def survives(seqs: tuple, frames: tuple, buf, data: bytes, fold) -> bool:
    """Does one of the tag sequences ``seqs`` (of one token, ``data``) meet no refusing tag
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


_unsafe = kernel(_unsafe_py, __name__, "_unsafe")


def _concat(tb: list, ids: list) -> tuple[np.ndarray, np.ndarray]:
    """The bytes of the tokens ``ids`` end to end, and their offsets (the input of :func:`_unsafe`)."""
    flat = np.frombuffer(b"".join(tb[i] for i in ids), dtype=np.uint8)
    offs = np.cumsum([0] + [len(tb[i]) for i in ids]).astype(np.int64)
    return flat, offs


def _trigger_tokens(vocab, trigger: bytes) -> tuple:
    """The tokens holding one of the ``trigger`` bytes: (a flag per token id, their ids, their
    bytes end to end, the offsets), made once per vocabulary and trigger set (read-only)."""
    cache = vocab.__dict__.setdefault("_trigger_tokens", {})
    hit = cache.get(trigger)
    if hit is None:
        tb = vocab.token_bytes
        pattern = re.compile(b"[" + re.escape(trigger) + b"]")
        ids = [i for i, x in enumerate(tb) if x and pattern.search(x)]
        flag = np.zeros(vocab.vocab_size, dtype=bool)
        flag[ids] = True
        hit = cache[trigger] = (tuple(flag.tolist()), np.array(ids, dtype=np.int64), *_concat(tb, ids))
    return hit


# ------------------------------------------------------------------------------ check


class TagCheck:
    """Per compiled constraint with tags (``compiled.check``): the matchers (:meth:`matcher`)
    and the mask rows.

    A token is dropped from a row only where each of its parses from the configuration meets
    a tag that refuses (``tags.apply`` returns None). :meth:`row` checks only the allowed
    tokens that may meet one (:meth:`_suspects`; by default those :meth:`_allowed` finds:
    one numba walk per configuration over the tokens with a trigger byte, narrowed to those
    with a byte of ``WALKED`` where a subclass sets it, memoised), each by its tag sequences
    from the configuration (memoised per configuration and token). The rows equal
    :meth:`row_reference` (the simulation of every allowed token that holds a trigger byte).
    Subclasses set ``EMPTY_REASON`` (see :meth:`TagCheckMatcher.empty_reason`)."""

    MEMO = 8192
    EVENTS_MEMO = 1 << 16
    EMPTY_REASON = "every token the grammar allows here meets a tag that refuses it"
    WALKED: bytes | None = None  # the bytes a token needs (one of) to be walked; None: any trigger byte

    def __init__(self, compiled, tags: Tags) -> None:
        self.compiled = compiled
        a = compiled.automaton
        assert a is tags.automaton
        self.a = a
        self.tags = tags
        self.has_trig, self.trig_ids, self._flat, self._offs = _trigger_tokens(compiled.vocab, tags.trigger)
        self.comp = self.trig_ids  # the tokens the walk of _allowed reads
        if self.WALKED is not None:
            tb = compiled.vocab.token_bytes
            comp = [i for i in self.trig_ids.tolist() if any(b in tb[i] for b in self.WALKED)]
            self.comp = np.array(comp, dtype=np.int64)
            self._flat, self._offs = _concat(tb, comp)
        tagmat = np.zeros((len(a.table), a.table.shape[1]), dtype=np.bool_)
        for st, c in tags.kind:
            tagmat[st, c] = True
        self._tagmat = tagmat
        self._stop = np.zeros(len(a.table), dtype=np.bool_) if a.is_regular else (a.accepting | a.has_calls)
        self._table = np.ascontiguousarray(a.table)
        self._cls = np.ascontiguousarray(a.cls, dtype=np.int64)
        self._on: dict = {}
        self._events: dict = {}
        self._cands: dict = {}

    def matcher(self) -> TagCheckMatcher:
        """A new matcher of the compiled constraint, with the check."""
        return TagCheckMatcher(self.compiled, self)

    def accepts(self, data: bytes) -> bool:
        """Does ``data`` match the whole constraint, the check included?"""
        return accepts(self.tags, data)

    # ------------------------------------------------------------------ fast rows

    def _walk_tokens(self, tops: np.ndarray, words: np.ndarray) -> np.ndarray | None:
        """Which of ``comp`` the row ``words`` allows and may meet a tag from the states
        ``tops`` (:func:`_unsafe`): a mask over ``comp``, None where none may."""
        out = np.zeros(len(self.comp), dtype=np.bool_)
        n = _unsafe(
            self._table,
            self._cls,
            self._tagmat,
            self._stop,
            tops,
            words,
            self.comp,
            self._flat,
            self._offs,
            out,
        )
        return out if n else None

    def _sorted(self, on: list):
        """What :meth:`_allowed` keeps of the tokens ``on`` (the subclass's classes of them)."""
        return on

    def _allowed(self, cfg, row: np.ndarray):
        """The tokens of a configuration's row that may meet a tag, as :meth:`_sorted` keeps
        them (memoised per configuration)."""
        hit = self._on.get(cfg)
        if hit is not None:
            return hit
        tops = np.array([cfg] if self.a.is_regular else sorted({st[-1] for st in cfg[0]}), dtype=np.int64)
        out = self._walk_tokens(tops, row.view(np.uint32))
        hit = self._sorted(self.comp[out].tolist() if out is not None else [])
        if len(self._on) >= self.MEMO:
            self._on.clear()
        self._on[cfg] = hit
        return hit

    def _suspects(self, cfg, row: np.ndarray, frames: tuple, buf):
        """The tokens of a configuration's row to check against the frames: those that may
        meet a tag."""
        return self._allowed(cfg, row)

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
        """The mask row of groups: each configuration's row without the tokens all of whose
        parses meet a refusing tag (equal to :meth:`row_reference`)."""
        c = self.compiled
        tb = c.vocab.token_bytes
        fold = self.tags.apply
        acc = None
        for cfg, fr in groups:
            row = c.mask_row(cfg)
            drop = []
            for t in self._suspects(cfg, row, fr, buf):
                seqs = self._seqs(cfg, t)
                if seqs and not survives(seqs, fr, buf, tb[t], fold):
                    drop.append(t)
            if drop:
                row = cleared_row(row, drop)
            acc = row if acc is None else acc | row
        return acc

    # ------------------------------------------------------------------ the reference

    def candidates(self, cfg, row: np.ndarray) -> list:
        """Tokens allowed by ``row`` (the configuration's) that hold a trigger byte and, for a
        DFA, meet a tag: for a DFA ``(token, ((offset, kind), ...))``, else ``(token, None)``."""
        hit = self._cands.get(cfg)
        if hit is not None:
            return hit
        ids = self.trig_ids
        words = row.view(np.uint32)
        on = ids[((words[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool)] if len(ids) else ids
        tb = self.compiled.vocab.token_bytes
        out = []
        if self.a.is_regular:
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
        """The mask row of groups, by simulating every allowed token that holds a trigger byte
        (a DFA's by its tag sequences; the reference of :meth:`row`)."""
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


# ---------------------------------------------------------------------------- the matcher


class TagCheckMatcher:
    """A :class:`~.matcher.Matcher` with a tag check: the plain matcher walks the automaton
    (history, EOS, tokenization of forced bytes); this one also keeps the
    ``((configuration, frames), ...)`` groups and the output bytes, refuses a token whose
    every parse meets a refusing tag and leaves such tokens out of the mask rows. Same
    interface as the matcher; ``state`` is the groups."""

    __slots__ = ("compiled", "_check", "_plain", "_groups", "_buf", "_lens")

    def __init__(self, compiled, check: TagCheck) -> None:
        self.compiled = compiled
        self._check = check
        self._plain = Matcher.plain(compiled)
        self._groups: list[tuple] = [((compiled.initial, ()),)]
        self._buf = bytearray()  # the output bytes (the checks read items and keys back)
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
                row = memo.get(cfg)
                nxt = _MISS if row is None else row.get(token_id, _MISS)
                if nxt is _MISS:
                    nxt = a.step_bytes(cfg, data)
                    nxt = c.remember_step(cfg, token_id, nxt)
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

    def copy(self) -> TagCheckMatcher:
        m = TagCheckMatcher.__new__(TagCheckMatcher)
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
        tokens the grammar allows all meet a tag that refuses them (the check's
        ``EMPTY_REASON``: a uniqueItems array's duplicate item, a repeated key; the checks
        judge as items and keys end, they do not look ahead). None otherwise."""
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
        """Forced bytes of the groups: never a byte that meets a refusing tag."""
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
