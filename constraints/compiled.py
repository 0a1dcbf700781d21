"""A compiled constraint: the automaton joined to the vocabulary, with memoised mask rows.

Immutable from the outside and shared by every request that uses the same constraint.
Rows are computed on first visit and kept (dict writes are atomic under the GIL, and two
threads computing the same row write equal values), so the steady-state step is a lookup.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .automaton import Automaton, Config

ROW_CACHE_SIZE = 8192
QUOTE = 0x22
PERMISSIVE_BYTES = 128  # states allowing at least this many bytes take the shared-row path
MAX_CANON_STATES = 64


class CompiledConstraint:
    """An automaton over a vocabulary. Create matchers with ``Matcher(compiled)``."""

    def __init__(self, automaton: Automaton, vocab, kind: str, spec: str, notes: list[str] | None = None):
        self.automaton = automaton
        self.vocab = vocab
        self.kind = kind
        self.spec = spec
        self.notes = list(notes or [])  # e.g. JSON Schema keywords relaxed in lenient mode
        self.index = vocab.index()
        a = automaton
        self._bnd_bottom = a.has_calls.copy()
        self._bnd_inner = a.has_calls | a.accepting
        self._ci: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._rows: OrderedDict = OrderedDict()
        self._interned: dict[bytes, np.ndarray] = {}
        self._eos = np.array(vocab.eos_ids, dtype=np.int64)

    @property
    def vocab_size(self) -> int:
        return self.vocab.vocab_size

    @property
    def n_words(self) -> int:
        return self.index.n_words

    @property
    def initial(self):
        return self.automaton.initial

    # ----------------------------------------------------------------------- rows

    def mask_row(self, config) -> np.ndarray:
        """The int32 bitmask row of a configuration (shared; do not modify)."""
        row = self._rows.get(config)
        if row is not None:
            return row
        words = self._compute(config)
        if self.automaton.can_end(config):
            for e in self._eos:
                words[e >> 5] |= np.uint32(1) << np.uint32(e & 31)
        key = words.tobytes()
        row = self._interned.get(key)
        if row is None:
            row = words.view(np.int32)
            row.flags.writeable = False
            self._interned[key] = row
        self._rows[config] = row
        if len(self._rows) > ROW_CACHE_SIZE:
            self._rows.popitem(last=False)
        return row

    def mask_row_eos_only(self) -> np.ndarray:
        """The row after EOS was accepted: only EOS again (never an empty row)."""
        row = getattr(self, "_eos_row", None)
        if row is None:
            words = np.zeros(self.n_words, dtype=np.uint32)
            for e in self._eos:
                words[e >> 5] |= np.uint32(1) << np.uint32(e & 31)
            row = words.view(np.int32)
            row.flags.writeable = False
            self._eos_row = row
        return row

    def _context_independent(self, state: int, inner: bool):
        """Walk the whole trie from ``state``: tokens read within the state's own rule,
        plus the boundary pairs where a call or a return may continue the token."""
        key = (state, inner)
        hit = self._ci.get(key)
        if hit is None:
            a = self.automaton
            words = np.zeros(self.n_words, dtype=np.uint32)
            nodes, states = self.index.walk(
                a.table, a.cls, state, self._bnd_inner if inner else self._bnd_bottom, words
            )
            hit = (words, nodes.copy(), states.copy())
            self._ci[key] = hit
        return hit

    def _canonical_unquoted(self, state: int) -> bytes | None:
        """A canonical form of the automaton that decides tokens without ``"`` from
        ``state``: its part reachable over the other bytes, states numbered in BFS order
        (by first byte), or None when that part is large. Equal forms => equal rows for
        those tokens, so the costly walk of a permissive state ("inside a string") is
        shared by every state and every compilation with the same form."""
        a = self.automaton
        seen = {state}
        order = [state]
        rows = []
        k = 0
        while k < len(order):
            r = a.table[order[k]][a.cls]
            r[QUOTE] = -1
            rows.append(r)
            tgts, first = np.unique(r, return_index=True)
            for t in tgts[np.argsort(first)].tolist():
                if t >= 0 and t not in seen:
                    if len(order) >= MAX_CANON_STATES:
                        return None
                    seen.add(t)
                    order.append(t)
            k += 1
        keys = np.array(order)
        sorter = np.argsort(keys)
        sub = np.stack(rows)
        pos = np.searchsorted(keys[sorter], np.maximum(sub, 0))
        local = np.where(sub >= 0, sorter[np.minimum(pos, len(keys) - 1)], -1).astype(np.int16)
        return local.tobytes()

    def _regular_row(self, state: int) -> np.ndarray:
        a = self.automaton
        row = a.table[state]
        allowed_bytes = int((row[a.cls] >= 0).sum())
        if allowed_bytes < PERMISSIVE_BYTES:
            return self._context_independent(state, False)[0].copy()
        key = self._canonical_unquoted(state)
        no_quote, with_quote = self.vocab.split_index(QUOTE)
        shared = self.vocab.shared_rows()
        words = shared.get(key) if key is not None else None
        if words is None:
            words = np.zeros(self.n_words, dtype=np.uint32)
            no_quote.walk(a.table, a.cls, state, self._bnd_bottom, words)
            if key is not None:
                words.flags.writeable = False
                shared[key] = words
        words = words.copy()
        with_quote.walk(a.table, a.cls, state, self._bnd_bottom, words)
        return words

    def _compute(self, config) -> np.ndarray:
        a = self.automaton
        if a.is_regular:
            return self._regular_row(config)
        words = np.zeros(self.n_words, dtype=np.uint32)
        for st in config.stacks:
            ci_words, nodes, states = self._context_independent(st[-1], len(st) > 1)
            words |= ci_words
            for node, t in zip(nodes.tolist(), states.tolist()):
                self._continue(st[:-1] + (t,), node, words)
        return words

    def _continue(self, stack: tuple[int, ...], node: int, words: np.ndarray) -> None:
        """Tokens that pass trie ``node`` with ``stack`` and then go on through a call or
        a return: walk the node's subtree from every *other* stack of the closure."""
        cfg = self.automaton.closure([stack])
        if cfg is None:
            return
        idx = self.index
        lo, hi, depth = node + 1, int(idx.node_skip[node]), int(idx.node_depth[node])
        if lo >= hi:
            return
        a = self.automaton
        for st in cfg.stacks:
            if st == stack:
                continue  # the caller's walk already follows this stack
            bnd = self._bnd_inner if len(st) > 1 else self._bnd_bottom
            nodes, states = idx.walk(a.table, a.cls, st[-1], bnd, words, lo, hi, depth)
            for n2, t2 in zip(nodes.tolist(), states.tolist()):
                self._continue(st[:-1] + (t2,), n2, words)

    def allowed_tokens(self, config) -> np.ndarray:
        """Token ids allowed in ``config`` (for tests and debugging)."""
        row = self.mask_row(config).view(np.uint32)
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: self.vocab_size]
        return np.nonzero(bits)[0]


__all__ = ["CompiledConstraint", "Config"]
