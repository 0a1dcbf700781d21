"""Draft sources: grammar-forced tokens and n-gram lookup in the prompt and output.

Drafts are proposals only: the target model verifies every one (``verify.py``), so a draft
that is not what the model would produce -- a forced span tokenized differently from the model's
choice, a last forced token that the model merges with what follows, a copied span that the
model does not copy -- is rejected and the model's own token is emitted instead. Outputs are
the model's, exactly; a good draft only saves forward passes.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

FORCED, NGRAM = 0, 1  # draft sources
FORCED_MEMO_SIZE = 4096  # configurations remembered per compiled constraint
FEW_ENDS = 16  # NgramIndex: new ends indexed key by key up to this many, else n by n through zip

# compiled constraint -> {configuration: forced tokens}. What the grammar forces depends on the
# configuration alone, and a generation revisits configurations (every object's keys, every
# closing bracket), so each is tokenized once.
_forced_memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def forced_tokens(matcher) -> tuple[int, ...]:
    """``matcher.forced_tokens()``, memoised by the matcher's configuration."""
    memo = _forced_memo.get(matcher.compiled)
    if memo is None:
        memo = _forced_memo[matcher.compiled] = {}
    state = matcher.state
    hit = memo.get(state)
    if hit is None:
        if len(memo) >= FORCED_MEMO_SIZE:
            memo.clear()
        hit = memo[state] = tuple(matcher.forced_tokens())
    return hit


class NgramIndex:
    """Where each n-gram of a token list last ended, for prompt lookup.

    ``index[n][tuple(tokens[e-n:e])] = e`` for every end e already indexed. ``lookup`` indexes
    every end but the current one first, so the current suffix is never matched with itself.
    """

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.index: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_max + 1)]
        self.indexed = 0  # ends < this are indexed

    def _extend(self, tokens: list[int], upto: int) -> None:
        # every end e in [indexed, upto) with e >= n, in increasing e (a later end overwrites an
        # earlier one). A few new ends (a decode step's tokens): one key a (end, n), the cheapest
        # way for a handful. Many (a prompt): one n at a time, the keys built by zip in C, so a
        # request's first lookup over a prompt of hundreds of tokens costs tens of microseconds,
        # not a millisecond. Both give the same index.
        start = max(self.indexed, 1)
        if upto - start <= FEW_ENDS:
            index, lo, hi = self.index, self.n_min, self.n_max
            for e in range(start, upto):
                for n in range(lo, min(hi, e) + 1):
                    index[n][tuple(tokens[e - n : e])] = e
            self.indexed = max(self.indexed, upto)
            return
        for n in range(self.n_min, self.n_max + 1):
            s0 = max(start, n)
            if s0 < upto:
                cols = [tokens[s0 - n + i : upto - n + i] for i in range(n)]
                self.index[n].update(zip(zip(*cols), range(s0, upto)))
        self.indexed = max(self.indexed, upto)

    def extend(self, tokens: list[int]) -> None:
        """Index every end of ``tokens`` but the last (what ``lookup(tokens, ...)`` indexes first)."""
        if self.indexed < len(tokens):
            self._extend(tokens, len(tokens))

    def lookup(self, tokens: list[int], k: int, context: list[int] | None = None) -> tuple[list[int], int]:
        """(up to k tokens that followed the longest earlier occurrence of the suffix of
        ``tokens + context``, the length of that suffix); ``tokens`` is indexed, ``context``
        (the drafts so far) is not. ([], 0) when nothing matches."""
        self.extend(tokens)  # every end but len(tokens) itself
        tail = (tokens[-self.n_max :] + (context or []))[-self.n_max :]
        for n in range(min(self.n_max, len(tail)), self.n_min - 1, -1):
            e = self.index[n].get(tuple(tail[-n:]))
            if e is not None:
                return tokens[e : e + k], n
        return [], 0


# Confidence classes of a draft (the policy keeps an acceptance rate for each): a forced
# token; the first token copied after a suffix match of 1, 2, or 3+ tokens; a token that
# continues a copy whose previous token is also drafted.
K_FORCED, K_COPY1, K_COPY2, K_COPY3, K_COPY_NEXT = range(5)


@dataclass
class Drafts:
    tokens: list[int] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)  # FORCED or NGRAM per token
    kinds: list[int] = field(default_factory=list)  # K_* per token

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, source: int, kind: int) -> None:
        self.tokens.append(token)
        self.sources.append(source)
        self.kinds.append(kind)

    def truncate(self, n: int) -> None:
        del self.tokens[n:], self.sources[n:], self.kinds[n:]


def propose(
    tokens: list[int],
    matcher,
    index: NgramIndex | None,
    k: int,
    *,
    forced: bool,
    stop_ids: frozenset[int],
    preferred: dict | None = None,
) -> Drafts:
    """Up to k drafts for a request whose text so far is ``tokens``.

    Alternates the two sources: the grammar's forced tokens where the constraint allows one
    continuation, else a copy of what followed the suffix earlier (prompt or output), each copied
    token kept only while the constraint accepts it. ``matcher`` is a private copy (it is advanced
    along the drafts here), or None for an unconstrained request. A stop token ends the drafts.

    Boundary tokens: the canonical tokenization of a forced span can differ from the model's
    (``":"`` as one token where the model writes ``":`` and then opens the string value itself).
    ``preferred`` maps a forced token to the token the model emitted instead the last time that
    draft was rejected; it is drafted in its place where the constraint allows it, and what
    remains forced after it is drafted again from the new state.
    """
    out = Drafts()
    while len(out) < k:
        took = 0
        if forced and matcher is not None:
            for t in forced_tokens(matcher)[: k - len(out)]:
                p = preferred.get(t) if preferred else None
                if p is not None and matcher.accept(p):
                    out.add(p, FORCED, K_FORCED)
                    took += 1
                    break  # re-derive what is forced after the model's own token
                if not matcher.accept(t):
                    break
                out.add(t, FORCED, K_FORCED)
                took += 1
            if took:
                continue
        if index is None:
            break
        cont, n = index.lookup(tokens, k - len(out), out.tokens)
        for i, t in enumerate(cont):
            if matcher is not None and not matcher.accept(t):
                break
            out.add(t, NGRAM, K_COPY_NEXT if i else min(n, 3))  # K_COPY1..3 = 1..3
            took += 1
            if t in stop_ids:
                return out
        if not took:
            break
    return out
