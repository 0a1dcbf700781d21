"""A compiled constraint: the automaton joined to the vocabulary, with memoised mask rows.

Immutable from the outside and shared by every request that uses the same constraint.
Rows are computed on first visit and kept (dict writes are atomic under the GIL, and two
threads computing the same row write equal values), so the steady-state step is a lookup.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .automaton import Automaton, Config
from .nfa import _scc_blocks

ROW_CACHE_SIZE = 8192
QUOTE = 0x22
PERMISSIVE_BYTES = 128  # states allowing at least this many bytes take the shared-row path
MAX_CANON_STATES = 256
MAX_PARTITION_STATES = 20_000


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
        # accepted steps seen before: the common accept is one dict hit (bounded; see matcher)
        self.step_memo: dict = {}

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
        plus the boundary pairs where a call or a return may continue the token.

        A permissive state (many bytes allowed, e.g. inside a string) takes the shared
        path: tokens without ``"`` come from a row shared by every state — of any
        compilation — whose unquoted sub-automaton is the same (see
        :meth:`_canonical_unquoted`); only tokens with ``"`` are walked for this state.
        """
        key = (state, inner)
        hit = self._ci.get(key)
        if hit is not None:
            return hit
        a = self.automaton
        bnd = self._bnd_inner if inner else self._bnd_bottom
        canon = None
        if int((a.table[state][a.cls] >= 0).sum()) >= PERMISSIVE_BYTES:
            canon = self._canonical_unquoted(state, inner)
        trie = self.index
        if canon is None:
            words = np.zeros(self.n_words, dtype=np.uint32)
            nodes, states = trie.walk(a.table, a.cls, state, bnd, words)
        else:
            no_quote, with_quote = self.vocab.split_index(QUOTE)
            shared = self.vocab.shared_rows()
            base = shared.get(canon)
            if base is None:
                base = np.zeros(self.n_words, dtype=np.uint32)
                no_quote.walk(a.table, a.cls, state, bnd, base)
                base.flags.writeable = False
                shared[canon] = base
            words = base.copy()
            trie = with_quote  # boundary node ids below index this trie
            nodes, states = trie.walk(a.table, a.cls, state, bnd, words)
        hit = (words, nodes.copy(), states.copy(), trie)
        self._ci[key] = hit
        return hit

    def _restricted_partition(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """States grouped by the language of byte strings without ``"`` they can read
        (definedness only; boundary states kept apart). Computed once per constraint."""
        hit = getattr(self, "_rpart", None)
        if hit is not None:
            return hit
        a = self.automaton
        n = a.n_states
        full = a.table[:, a.cls]  # [N, 256]
        full[:, QUOTE] = -1
        tbl = np.vstack([np.where(full >= 0, full, n), np.full((1, 256), n, dtype=full.dtype)])
        boundary = np.append(a.has_calls | (a.accepting & ~a.is_regular), False)
        init = boundary.astype(np.int64)
        init[n] = 2
        block = _scc_blocks(tbl, np.zeros(n + 1, dtype=bool), [[] for _ in range(n + 1)], n, init)
        _, block = np.unique(block, return_inverse=True)
        block = block.reshape(-1).astype(np.int64)
        n_blocks = int(block.max()) + 1
        rep = np.zeros(n_blocks, dtype=np.int64)
        rep[block[::-1]] = np.arange(n, -1, -1)  # first state of each block
        block_boundary = boundary[rep]
        hit = (block, tbl, rep, block_boundary)
        self._rpart = hit
        self._canon_memo: dict[int, bytes | None] = {}
        return hit

    def _canonical_unquoted(self, state: int, inner: bool = False) -> bytes | None:
        """A canonical form of what decides tokens without ``"`` from ``state``: the
        minimal (definedness-only) automaton over the other bytes, its states numbered
        in BFS order by first byte. None when it is large or reaches a boundary state
        (a call or, in a pushdown, a return), whose tokens must be walked for real.
        Equal forms give equal rows for those tokens, across states and compilations."""
        if self.automaton.n_states > MAX_PARTITION_STATES:
            return None
        block, tbl, rep, block_boundary = self._restricted_partition()
        b0 = int(block[state])
        memo = self._canon_memo
        if b0 in memo:
            return memo[b0]
        sink = int(block[-1])
        ren = np.full(len(rep), -1, dtype=np.int64)
        ren[b0] = 0
        order = [b0]
        parts = []
        k = 0
        out: bytes | None = None
        while k < len(order):
            b = order[k]
            k += 1
            if block_boundary[b] and not self.automaton.is_regular:
                break
            row = block[tbl[rep[b]]]
            u, first = np.unique(row, return_index=True)
            for nb in u[np.argsort(first)].tolist():
                if nb != sink and ren[nb] < 0:
                    ren[nb] = len(order)
                    order.append(nb)
            if len(order) > MAX_CANON_STATES:
                break
            mapped = np.where(row == sink, -1, ren[row]).astype(np.int16)
            parts.append(mapped.tobytes())
        else:
            out = b"".join(parts)
        memo[b0] = out
        return out

    def _compute(self, config) -> np.ndarray:
        a = self.automaton
        if a.is_regular:
            return self._context_independent(config, False)[0].copy()
        words = np.zeros(self.n_words, dtype=np.uint32)
        for st in config.stacks:
            ci_words, nodes, states, trie = self._context_independent(st[-1], len(st) > 1)
            words |= ci_words
            if len(nodes):
                self._continue(st[:-1], nodes, states, words, trie)
        return words

    def _continue(self, base: tuple[int, ...], nodes: np.ndarray, states: np.ndarray,
                  words: np.ndarray, trie) -> None:
        """Tokens that pass trie ``nodes[i]`` with stack ``base + (states[i],)`` and go on
        through a call or a return: walk those subtrees from every *other* stack of the
        closure (the caller's walk already follows the stack itself). Boundaries that
        share a state share one closure and one batched walk."""
        a = self.automaton
        for t in np.unique(states).tolist():
            stack = base + (t,)
            cfg = a.closure([stack])
            if cfg is None:
                continue
            roots = nodes[states == t]
            for st in cfg.stacks:
                if st == stack:
                    continue
                bnd = self._bnd_inner if len(st) > 1 else self._bnd_bottom
                n2, t2 = trie.walk_below(a.table, a.cls, st[-1], bnd, words, roots)
                if len(n2):
                    self._continue(st[:-1], n2, t2, words, trie)

    def allowed_tokens(self, config) -> np.ndarray:
        """Token ids allowed in ``config`` (for tests and debugging)."""
        row = self.mask_row(config).view(np.uint32)
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")[: self.vocab_size]
        return np.nonzero(bits)[0]


__all__ = ["CompiledConstraint", "Config"]
