"""Per-request cursor over a compiled constraint.

State is persistent: every accepted token pushes one immutable configuration on a
history list, so ``rollback(n)`` is a slice and ``copy()`` is cheap.

A constraint with uniqueItems checked at run time (``compiled.unique``, see :mod:`.unique`)
pushes ``((configuration, frames), ...)`` groups instead, and keeps the output bytes (item
values are compared as JSON); every other constraint takes the plain path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import unique as uq
from .bitmask import unpack_bitmask
from .compiled import CompiledConstraint

MAX_FORCED_BYTES = 256
STEP_MEMO_SIZE = 1 << 18  # (configuration, token) -> next configuration, per constraint
_MISS = object()


class Matcher:
    """Walks one request's output through a :class:`CompiledConstraint`."""

    __slots__ = ("compiled", "_hist", "_ended", "_uq", "_buf", "_lens")

    def __init__(self, compiled: CompiledConstraint) -> None:
        self.compiled = compiled
        self._uq = compiled.unique
        self._hist: list[Any] = [compiled.initial if self._uq is None else ((compiled.initial, ()),)]
        self._ended: list[bool] = [False]  # EOS accepted at this point of history
        self._buf = bytearray()  # (uniqueItems only) the output bytes
        self._lens: list[int] = [0]  # (uniqueItems only) len(_buf) at each point of history

    # ------------------------------------------------------------------ state

    @property
    def state(self):
        return self._hist[-1]

    def can_end(self) -> bool:
        """May the output end here (is EOS allowed)?"""
        if self._uq is not None:
            a = self.compiled.automaton
            return not self._ended[-1] and any(a.can_end(cfg) for cfg, _ in self._hist[-1])
        return not self._ended[-1] and self.compiled.automaton.can_end(self._hist[-1])

    def is_terminated(self) -> bool:
        """EOS was accepted, or the constraint is complete and allows nothing more."""
        if self._ended[-1]:
            return True
        if self._uq is not None:
            a = self.compiled.automaton
            groups = self._hist[-1]
            return any(a.can_end(cfg) for cfg, _ in groups) and not any(a.next_bytes(cfg) for cfg, _ in groups)
        a = self.compiled.automaton
        cfg = self._hist[-1]
        if not a.can_end(cfg):
            return False
        if a.counters is not None:  # a count may close the bytes a state has
            return not a.next_bytes(cfg)
        if a.is_regular:
            return not a.has_bytes[cfg]
        return not cfg.stacks

    def num_accepted(self) -> int:
        return len(self._hist) - 1

    # ---------------------------------------------------------------- tokens

    def accept(self, token_id: int) -> bool:
        """Advance by one token; on False the state is unchanged."""
        if self._ended[-1]:
            return False
        if self._uq is not None:
            return self._accept_unique(token_id)
        c = self.compiled
        cfg = self._hist[-1]
        memo = c.step_memo
        key = (cfg, token_id)
        nxt = memo.get(key, _MISS)
        if nxt is _MISS:
            if token_id in c.vocab.eos_ids:
                if not c.automaton.can_end(cfg):
                    return False
                self._hist.append(cfg)
                self._ended.append(True)
                return True
            data = c.vocab.token_bytes[token_id] if 0 <= token_id < c.vocab_size else None
            nxt = c.automaton.step_bytes(cfg, data) if data else None
            if len(memo) >= STEP_MEMO_SIZE:
                memo.clear()
            memo[key] = nxt
        if nxt is None:
            return False
        self._hist.append(nxt)
        self._ended.append(False)
        return True

    def _step_groups(self, groups: tuple, token_id: int | None, data: bytes) -> tuple | None:
        """(uniqueItems) groups after ``data``: a token that cannot meet a tag takes the
        memoised plain step of each configuration."""
        c = self.compiled
        a = c.automaton
        if token_id is not None and not self._uq.has_trig[token_id]:
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
        return uq.step(a, groups, data, self._buf)

    def _push_unique(self, groups: tuple, data: bytes) -> None:
        self._hist.append(groups)
        self._ended.append(False)
        self._buf += data
        self._lens.append(len(self._buf))

    def _accept_unique(self, token_id: int) -> bool:
        c = self.compiled
        groups = self._hist[-1]
        if token_id in c.vocab.eos_ids:
            if not self.can_end():
                return False
            self._hist.append(groups)
            self._ended.append(True)
            self._lens.append(len(self._buf))
            return True
        data = c.vocab.token_bytes[token_id] if 0 <= token_id < c.vocab_size else None
        if not data:
            return False
        nxt = self._step_groups(groups, token_id, data)
        if nxt is None:
            return False
        self._push_unique(nxt, data)
        return True

    def accept_bytes(self, data: bytes) -> bool:
        """Advance by raw bytes (as one history entry); on False the state is unchanged."""
        if self._ended[-1]:
            return False
        if self._uq is not None:
            nxt = uq.step(self.compiled.automaton, self._hist[-1], data, self._buf) if data else self._hist[-1]
            if nxt is None:
                return False
            self._push_unique(nxt, data)
            return True
        nxt = self.compiled.automaton.step_bytes(self._hist[-1], data)
        if nxt is None:
            return False
        self._hist.append(nxt)
        self._ended.append(False)
        return True

    def rollback(self, n: int = 1) -> None:
        """Undo the last ``n`` accepted tokens."""
        if n < 0 or n > len(self._hist) - 1:
            raise ValueError(f"cannot roll back {n} tokens: {len(self._hist) - 1} accepted")
        if n:
            del self._hist[-n:]
            del self._ended[-n:]
            if self._uq is not None:
                del self._lens[-n:]
                del self._buf[self._lens[-1]:]

    def reset(self) -> None:
        del self._hist[1:]
        del self._ended[1:]
        del self._lens[1:]
        del self._buf[:]

    def copy(self) -> Matcher:
        m = Matcher.__new__(Matcher)
        m.compiled = self.compiled
        m._uq = self._uq
        m._hist = list(self._hist)
        m._ended = list(self._ended)
        m._buf = bytearray(self._buf)
        m._lens = list(self._lens)
        return m

    # ----------------------------------------------------------------- masks

    def mask_row(self) -> np.ndarray:
        """This step's allowed tokens as an int32 row (shared; do not modify)."""
        c = self.compiled
        if self._ended[-1]:
            return c.mask_row_eos_only()
        if self._uq is not None:
            return self._uq.row(self._hist[-1], self._buf)
        return c.mask_row(self._hist[-1])

    def empty_reason(self) -> str | None:
        """Why this step's mask allows nothing, when the reason is not the grammar itself: the
        tokens the grammar allows all complete an array item equal to an earlier one of that
        array (``uniqueItems`` is checked as items end, not looked ahead). None otherwise."""
        if self._uq is None or self._ended[-1] or self.mask_row().any():
            return None
        c = self.compiled
        if not any(c.mask_row(cfg).any() for cfg, _ in self._hist[-1]):
            return None
        return ("uniqueItems: every token the grammar allows here completes an array item equal to an "
                "earlier item of the same array")

    def fill_bitmask(self, bitmask, row: int = 0) -> None:
        """Write this step's allowed tokens into ``bitmask[row]`` (int32 [B, ceil(V/32)];
        a numpy array or a CPU torch tensor)."""
        src = self.mask_row()
        if isinstance(bitmask, np.ndarray):
            bitmask[row, : src.shape[0]] = src
        else:  # torch tensor on the CPU (pinned or not)
            bitmask[row].numpy()[: src.shape[0]] = src

    def allowed_tokens(self) -> np.ndarray:
        return np.nonzero(unpack_bitmask(self.mask_row()[None], self.compiled.vocab_size)[0])[0]

    # -------------------------------------------------------------- jump-forward

    def forced_bytes(self) -> bytes:
        """The bytes the constraint alone determines next (empty if there is a choice)."""
        if self._ended[-1]:
            return b""
        a = self.compiled.automaton
        if self._uq is not None:
            return self._forced_unique(a)
        cfg = self._hist[-1]
        out = bytearray()
        while len(out) < MAX_FORCED_BYTES and not a.can_end(cfg):
            nb = a.next_bytes(cfg)
            if len(nb) != 1:
                break
            out.append(nb[0])
            cfg = a.step_byte(cfg, nb[0])
            if cfg is None:  # pragma: no cover - next_bytes only lists live bytes
                break
        return bytes(out)

    def _forced_unique(self, a) -> bytes:
        """Forced bytes of uniqueItems groups: never a byte that completes a duplicate item."""
        groups = self._hist[-1]
        out = bytearray()
        while len(out) < MAX_FORCED_BYTES and not any(a.can_end(cfg) for cfg, _ in groups):
            nb = sorted({b for cfg, _ in groups for b in a.next_bytes(cfg)})
            if len(nb) != 1:
                break
            nxt = uq.step(a, groups, bytes(nb), self._buf + out)
            if nxt is None:
                break
            out.append(nb[0])
            groups = nxt
        return bytes(out)

    def forced_tokens(self) -> list[int]:
        """Forced bytes as tokens: the tokenizer's canonical encoding when the vocabulary
        has one and the matcher accepts it, else a greedy longest-match tokenization."""
        data = self.forced_bytes()
        if not data:
            return []
        c = self.compiled
        encode = getattr(c.vocab, "encode", None)
        if encode is not None:
            try:
                ids = list(encode(data.decode("utf-8")))
            except UnicodeDecodeError:
                ids = []
            if ids and b"".join(c.vocab.token_bytes[i] or b"\0" for i in ids) == data:
                return ids
        return c.index.greedy_tokenize(data, c.vocab)
