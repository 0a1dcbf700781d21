"""Token level: the vocabulary as a DFS-ordered byte trie, walked by numba.

One :class:`VocabIndex` per vocabulary (shared by every compiled constraint). Walking the
trie from a DFA state visits only live nodes, so a restrictive state costs a few µs
(measured: ``MEASUREMENTS.md``). The walk writes allowed tokens straight into an uint32
bitmask row and reports *boundary* nodes: trie nodes where the DFA reached a state with
a call edge or (above the bottom of the stack) an accepting state, so the pushdown
matcher can continue those subtrees in other rules.
"""

from __future__ import annotations

import numpy as np

try:  # numba is a listed dependency; the pure-Python fallback keeps the package importable
    from numba import njit
except ImportError:  # pragma: no cover
    njit = None


def _walk_py(table, cls, start, node_byte, node_depth, node_skip, tok_lo, tok_hi, tok_ids,
             lo, hi, base_depth, boundary, out, bnd_nodes, bnd_states, states):
    """Walk trie nodes ``lo..hi-1`` (a DFS range whose roots are at ``base_depth + 1``)
    from DFA state ``start``; set the bits of tokens that stay alive; return the number
    of boundary (node, state) pairs written to ``bnd_nodes`` / ``bnd_states``."""
    states[base_depth] = start
    nb = 0
    i = lo
    while i < hi:
        d = node_depth[i]
        t = table[states[d - 1], cls[node_byte[i]]]
        if t < 0:
            i = node_skip[i]
            continue
        states[d] = t
        for k in range(tok_lo[i], tok_hi[i]):
            tid = tok_ids[k]
            out[tid >> 5] |= np.uint32(1) << np.uint32(tid & 31)
        if boundary[t]:
            bnd_nodes[nb] = i
            bnd_states[nb] = t
            nb += 1
        i += 1
    return nb


_walk = njit(cache=True, nogil=True)(_walk_py) if njit is not None else _walk_py


def _walk_many_py(table, cls, start, node_byte, node_depth, node_skip, tok_lo, tok_hi, tok_ids,
                  roots, boundary, out, bnd_nodes, bnd_states, states):
    """``_walk_py`` over the subtrees below each node of ``roots`` (children only)."""
    nb = 0
    for r in range(roots.shape[0]):
        node = roots[r]
        nb += _walk(table, cls, start, node_byte, node_depth, node_skip, tok_lo, tok_hi, tok_ids,
                    node + 1, node_skip[node], node_depth[node], boundary, out,
                    bnd_nodes[nb:], bnd_states[nb:], states)
    return nb


_walk_many = njit(cache=True, nogil=True)(_walk_many_py) if njit is not None else _walk_many_py


class VocabIndex:
    """The vocabulary's byte trie in DFS order (built once per vocabulary).

    Arrays, one entry per trie node ``i``: ``node_byte[i]`` (the byte on the edge into
    ``i``), ``node_depth[i]`` (1 for the first byte), ``node_skip[i]`` (the first node
    after ``i``'s subtree); tokens ending at ``i`` are ``tok_ids[tok_lo[i]:tok_hi[i]]``.
    """

    def __init__(self, vocab, keep=None) -> None:
        self.vocab_size = vocab.vocab_size
        self.n_words = (self.vocab_size + 31) // 32
        pairs = sorted((b, i) for i, b in enumerate(vocab.token_bytes) if b and (keep is None or keep(b)))
        node_byte: list[int] = []
        node_depth: list[int] = []
        tok_lo: list[int] = []
        tok_hi: list[int] = []
        tok_ids: list[int] = []
        path_nodes: list[int] = []  # node index at each depth of the current path
        prev = b""
        for data, tid in pairs:
            common = 0
            lim = min(len(prev), len(data))
            while common < lim and prev[common] == data[common]:
                common += 1
            if common == len(data) and len(prev) == len(data):
                # same bytes as the previous token: another id on the same node
                tok_ids.append(tid)
                tok_hi[path_nodes[-1]] = len(tok_ids)
                continue
            del path_nodes[common:]
            for d in range(common, len(data)):
                n = len(node_byte)
                node_byte.append(data[d])
                node_depth.append(d + 1)
                tok_lo.append(len(tok_ids))
                tok_hi.append(len(tok_ids))
                path_nodes.append(n)
            tok_ids.append(tid)
            tok_lo[path_nodes[-1]] = len(tok_ids) - 1
            tok_hi[path_nodes[-1]] = len(tok_ids)
            prev = data
        n = len(node_byte)
        self.n_nodes = n
        self.node_byte = np.array(node_byte, dtype=np.int32)
        self.node_depth = np.array(node_depth, dtype=np.int32)
        self.tok_lo = np.array(tok_lo, dtype=np.int32)
        self.tok_hi = np.array(tok_hi, dtype=np.int32)
        self.tok_ids = np.array(tok_ids, dtype=np.int32)
        # skip[i]: first node after the subtree of i = next node with depth <= depth[i]
        skip = np.full(n, n, dtype=np.int32)
        stack: list[int] = []
        for i, d in enumerate(node_depth):
            while stack and node_depth[stack[-1]] >= d:
                skip[stack.pop()] = i
            stack.append(i)
        self.node_skip = skip
        self.max_depth = int(self.node_depth.max()) if n else 0

    def walk(self, table, cls, start: int, boundary, out, lo: int = 0, hi: int | None = None,
             base_depth: int = 0):
        """Walk the subtree range ``lo..hi`` from DFA state ``start`` (see ``_walk_py``).

        Returns ``(nodes, states)`` of the boundary pairs met.
        """
        hi = self.n_nodes if hi is None else hi
        cap = hi - lo
        bnd_nodes = np.empty(cap, dtype=np.int32)
        bnd_states = np.empty(cap, dtype=np.int32)
        states = np.empty(self.max_depth + 1, dtype=np.int32)
        nb = _walk(table, cls, np.int32(start), self.node_byte, self.node_depth, self.node_skip,
                   self.tok_lo, self.tok_hi, self.tok_ids, lo, hi, base_depth, boundary, out,
                   bnd_nodes, bnd_states, states)
        return bnd_nodes[:nb], bnd_states[:nb]

    def walk_below(self, table, cls, start: int, boundary, out, roots: np.ndarray):
        """Walk the subtrees below every node of ``roots`` from DFA state ``start``."""
        cap = int((self.node_skip[roots] - roots).sum()) if len(roots) else 0
        bnd_nodes = np.empty(cap, dtype=np.int32)
        bnd_states = np.empty(cap, dtype=np.int32)
        states = np.empty(self.max_depth + 1, dtype=np.int32)
        nb = _walk_many(table, cls, np.int32(start), self.node_byte, self.node_depth, self.node_skip,
                        self.tok_lo, self.tok_hi, self.tok_ids, roots.astype(np.int32), boundary, out,
                        bnd_nodes, bnd_states, states)
        return bnd_nodes[:nb], bnd_states[:nb]

    def greedy_tokenize(self, data: bytes, vocab) -> list[int]:
        """Longest-match tokenization of ``data`` (every token's bytes concatenate to it)."""
        lookup = getattr(self, "_lookup", None)
        if lookup is None:
            lookup = {}
            for i, b in enumerate(vocab.token_bytes):
                if b and b not in lookup:
                    lookup[b] = i
            self._lookup = lookup
        out: list[int] = []
        pos = 0
        while pos < len(data):
            for end in range(min(len(data), pos + self.max_depth), pos, -1):
                tid = lookup.get(data[pos:end])
                if tid is not None:
                    out.append(tid)
                    pos = end
                    break
            else:
                return out  # a byte with no token: stop before it
        return out
