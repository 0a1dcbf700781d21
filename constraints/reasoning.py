"""The token budget of a reasoning block (``Compiler.reasoning(max_tokens=N)``).

The grammar (:func:`.frontends.structural.reasoning_grammar`) already says what a
reasoning block is: ``begin``, text without ``end``, ``end``, then the constraint. How many
tokens the block may take is not a property of the text but of its tokenization, so it is
counted here, at run time, like the uniqueItems check: ``compiled.check`` is a
:class:`ReasoningBudget` and ``Matcher(compiled)`` returns a :class:`ReasoningMatcher`.
Once the block holds ``max_tokens`` tokens and its end marker has not been written, the
mask allows exactly one token: the next of the canonical encoding of what remains of the
markers (the rest of ``begin`` if it is still open, then ``end``, less the part of it the
text already ends with).

The budget composes with the constraint's own run-time check (JSON keys in any order or
uniqueItems after the block: ``inner``, the check it replaces as ``compiled.check``): the
reasoning matcher then wraps that check's matcher instead of a plain one, and every step,
row and forced byte goes through it.
"""

from __future__ import annotations

import numpy as np

from .matcher import Matcher, encode_forced


class ReasoningBudget:
    """The run-time check of a reasoning constraint: its markers and token budget."""

    def __init__(self, compiled, begin: bytes, end: bytes, max_tokens: int, inner=None) -> None:
        self.compiled = compiled
        self.begin = begin  # (a special token's marker: its ir.special_bytes)
        self.end = end
        self.max_tokens = max_tokens
        self.inner = inner  # the constraint's own run-time check (a TagCheck), or None
        self._rows: dict[int, np.ndarray] = {}

    def matcher(self) -> ReasoningMatcher:
        return ReasoningMatcher(self.compiled, self)

    def inner_matcher(self):
        """The matcher the reasoning matcher wraps: the inner check's, else a plain one."""
        return self.inner.matcher() if self.inner is not None else Matcher.plain(self.compiled)

    def accepts(self, data: bytes) -> bool:
        """The language is the automaton's, the inner check's included (the budget bounds
        tokens, not text)."""
        if self.inner is not None:
            return self.inner.accepts(data)
        return self.compiled.automaton.accepts(data)

    def one_hot(self, token_id: int) -> np.ndarray:
        """The row allowing ``token_id`` only (shared; do not modify)."""
        row = self._rows.get(token_id)
        if row is None:
            words = np.zeros(self.compiled.n_words, dtype=np.uint32)
            words[token_id >> 5] |= np.uint32(1) << np.uint32(token_id & 31)
            row = words.view(np.int32)
            row.flags.writeable = False
            self._rows[token_id] = row
        return row

    def remaining(self, plain: Matcher, tail: bytes) -> bytes:
        """The marker bytes still to write, the output so far ending with ``tail`` (its last
        ``len(end) - 1`` bytes inside the block): the automaton's forced bytes (the rest of
        ``begin``), then ``end`` less its longest prefix the text already ends with."""
        forced = plain.forced_bytes()
        text = tail + forced
        end = self.end
        for k in range(min(len(end) - 1, len(text)), 0, -1):
            if text.endswith(end[:k]):
                return forced + end[k:]
        return forced + end


def attach_budget(compiled, begin: bytes, end: bytes, max_tokens: int | None):
    """``compiled`` with a reasoning budget of ``max_tokens`` (nothing to attach where None),
    around the check it has already, if any."""
    if max_tokens is not None:
        compiled.check = ReasoningBudget(compiled, begin, end, max_tokens, inner=compiled.check)
    return compiled


class ReasoningMatcher:
    """A :class:`~.matcher.Matcher` that counts the tokens of the reasoning block and forces
    its end marker when they reach the budget. Same interface as the matcher. Per point of
    history: the tokens counted, whether the end marker was written, and the block's last
    ``len(end) - 1`` bytes (enough to see the marker complete across tokens)."""

    __slots__ = ("compiled", "_check", "_plain", "_count", "_done", "_tail")

    def __init__(self, compiled, check: ReasoningBudget) -> None:
        self.compiled = compiled
        self._check = check
        self._plain = check.inner_matcher()
        self._count = [0]
        self._done = [False]
        self._tail = [b""]

    @property
    def state(self):
        """What the next mask depends on (memo keys, as DSpark's forced drafts use): the
        automaton's configuration, and over budget the block's last bytes."""
        return (self._plain.state, self._tail[-1] if self._forcing() else None)

    @property
    def ended(self) -> bool:
        return self._plain.ended

    @property
    def reasoning_tokens(self) -> int:
        """Tokens of the reasoning block so far (its markers included)."""
        return self._count[-1]

    def _forcing(self) -> bool:
        return not self._done[-1] and self._count[-1] >= self._check.max_tokens and not self._plain.ended

    def can_end(self) -> bool:
        return self._plain.can_end()

    def is_terminated(self) -> bool:
        return self._plain.is_terminated()

    def num_accepted(self) -> int:
        return self._plain.num_accepted()

    # ---------------------------------------------------------------- tokens

    def _push(self, data: bytes) -> None:
        done, tail, count = self._done[-1], self._tail[-1], self._count[-1]
        if not done:
            window = tail + data
            end = self._check.end
            count += 1
            if end in window:
                done, tail = True, b""
            else:
                tail = window[-(len(end) - 1) :] if len(end) > 1 else b""
        self._count.append(count)
        self._done.append(done)
        self._tail.append(tail)

    def accept(self, token_id: int) -> bool:
        """Advance by one token; on False the state is unchanged. Over budget, only the
        forced token is accepted."""
        if self._forcing() and self.forced_tokens()[:1] != [token_id]:
            return False
        if not self._plain.accept(token_id):
            return False
        self._push(self.compiled.token_data(token_id) or b"")
        return True

    def accept_bytes(self, data: bytes) -> bool:
        if not self._plain.accept_bytes(data):
            return False
        self._push(data)
        return True

    def rollback(self, n: int = 1) -> None:
        self._plain.rollback(n)
        if n:
            del self._count[-n:]
            del self._done[-n:]
            del self._tail[-n:]

    def reset(self) -> None:
        self._plain.reset()
        del self._count[1:]
        del self._done[1:]
        del self._tail[1:]

    def copy(self) -> ReasoningMatcher:
        m = ReasoningMatcher.__new__(ReasoningMatcher)
        m.compiled = self.compiled
        m._check = self._check
        m._plain = self._plain.copy()
        m._count = list(self._count)
        m._done = list(self._done)
        m._tail = list(self._tail)
        return m

    # ----------------------------------------------------------------- masks

    def mask_row(self) -> np.ndarray:
        if self._forcing():
            tokens = self.forced_tokens()
            if tokens:
                return self._check.one_hot(tokens[0])
        return self._plain.mask_row()

    def empty_reason(self) -> str | None:
        return None if self._forcing() else self._plain.empty_reason()

    def fill_bitmask(self, bitmask, row: int = 0) -> None:
        Matcher.write_row(bitmask, row, self.mask_row())

    def allowed_tokens(self) -> np.ndarray:
        return Matcher.row_tokens(self.mask_row(), self.compiled.vocab_size)

    # -------------------------------------------------------------- jump-forward

    def forced_bytes(self) -> bytes:
        if self._forcing():
            return self._check.remaining(self._plain, self._tail[-1])
        return self._plain.forced_bytes()

    def forced_tokens(self) -> list[int]:
        return encode_forced(self.compiled, self.forced_bytes())
