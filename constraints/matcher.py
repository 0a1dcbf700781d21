"""Per-request cursor over a compiled constraint.

State is persistent: every accepted token pushes one immutable configuration on a
history list, so ``rollback(n)`` is a slice and ``copy()`` is cheap.

A compiled constraint may carry a run-time check that its automaton cannot express
(``compiled.check``: uniqueItems, see :mod:`.unique_items`); ``Matcher(compiled)`` then
returns the check's matcher, which wraps a plain one (:meth:`Matcher.plain`) and has the
same interface.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .bitmask import unpack_bitmask
from .compiled import CompiledConstraint
from .ir import SPECIAL_LEAD, special_id

MAX_FORCED_BYTES = 256
_MISS = object()


class Matcher:
    """Walks one request's output through a :class:`CompiledConstraint`."""

    __slots__ = ("compiled", "_hist", "_ended")

    def __new__(cls, compiled: CompiledConstraint):
        check = getattr(compiled, "check", None) if cls is Matcher else None
        if check is not None:  # the check's matcher (it holds a plain one: see plain)
            return check.matcher()
        return super().__new__(cls)

    def __init__(self, compiled: CompiledConstraint) -> None:
        self.compiled = compiled
        self._hist: list[Any] = [compiled.initial]
        self._ended: list[bool] = [False]  # EOS accepted at this point of history

    @classmethod
    def plain(cls, compiled: CompiledConstraint) -> Matcher:
        """A matcher of the automaton alone, without the constraint's run-time check."""
        m = object.__new__(cls)
        m.__init__(compiled)
        return m

    # ------------------------------------------------------------------ state

    @property
    def state(self):
        return self._hist[-1]

    @property
    def ended(self) -> bool:
        """EOS was accepted."""
        return self._ended[-1]

    def can_end(self) -> bool:
        """May the output end here (is EOS allowed)?"""
        return not self._ended[-1] and self.compiled.automaton.can_end(self._hist[-1])

    def is_terminated(self) -> bool:
        """EOS was accepted, or the constraint is complete and allows nothing more."""
        if self._ended[-1]:
            return True
        a = self.compiled.automaton
        cfg = self._hist[-1]
        if not a.can_end(cfg):
            return False
        if a.counters is not None:  # a count may close the bytes a state has
            return not a.next_bytes(cfg)
        if a.is_regular:
            return not a.has_bytes[cfg]
        return not cfg[0]

    def num_accepted(self) -> int:
        return len(self._hist) - 1

    # ---------------------------------------------------------------- tokens

    def accept(self, token_id: int) -> bool:
        """Advance by one token; on False the state is unchanged."""
        if self._ended[-1]:
            return False
        c = self.compiled
        cfg = self._hist[-1]
        row = c.step_memo.get(cfg)
        nxt = _MISS if row is None else row.get(token_id, _MISS)
        if nxt is _MISS:
            named = c.specials and token_id in c.specials  # a special token the grammar names
            if token_id in c.vocab.eos_ids and not (
                named and c.automaton.step_bytes(cfg, c.specials[token_id])
            ):
                if not c.automaton.can_end(cfg):
                    return False
                self._hist.append(cfg)
                self._ended.append(True)
                return True
            data = c.token_data(token_id)
            nxt = c.automaton.step_bytes(cfg, data) if data else None
            nxt = c.remember_step(cfg, token_id, nxt)
        if nxt is None:
            return False
        self._hist.append(nxt)
        self._ended.append(False)
        return True

    def accept_bytes(self, data: bytes) -> bool:
        """Advance by raw bytes (as one history entry); on False the state is unchanged."""
        if self._ended[-1]:
            return False
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

    def reset(self) -> None:
        del self._hist[1:]
        del self._ended[1:]

    def copy(self) -> Matcher:
        m = object.__new__(Matcher)
        m.compiled = self.compiled
        m._hist = list(self._hist)
        m._ended = list(self._ended)
        return m

    # ----------------------------------------------------------------- masks

    def mask_row(self) -> np.ndarray:
        """This step's allowed tokens as an int32 row (shared; do not modify)."""
        c = self.compiled
        if self._ended[-1]:
            return c.mask_row_eos_only()
        return c.mask_row(self._hist[-1])

    def empty_reason(self) -> str | None:
        """Why this step's mask allows nothing, when the reason is not the grammar itself
        (a run-time check: see :mod:`.unique_items`); None here."""
        return None

    def fill_bitmask(self, bitmask, row: int = 0) -> None:
        """Write this step's allowed tokens into ``bitmask[row]`` (int32 [B, ceil(V/32)];
        a numpy array or a CPU torch tensor)."""
        src = self.mask_row()
        if isinstance(bitmask, np.ndarray):
            bitmask[row, : src.shape[0]] = src
        else:  # torch tensor on the CPU (pinned or not)
            bitmask[row].numpy()[: src.shape[0]] = src

    @staticmethod
    def write_row(bitmask, row: int, src: np.ndarray) -> None:
        """Copy the mask row ``src`` into ``bitmask[row]`` (numpy, or a CPU torch tensor)."""
        if isinstance(bitmask, np.ndarray):
            bitmask[row, : src.shape[0]] = src
        else:  # torch tensor on the CPU (pinned or not)
            bitmask[row].numpy()[: src.shape[0]] = src

    def allowed_tokens(self) -> np.ndarray:
        return Matcher.row_tokens(self.mask_row(), self.compiled.vocab_size)

    @staticmethod
    def row_tokens(row: np.ndarray, vocab_size: int) -> np.ndarray:
        """The token ids a mask row allows."""
        return np.nonzero(unpack_bitmask(row[None], vocab_size)[0])[0]

    # -------------------------------------------------------------- jump-forward

    def forced_bytes(self) -> bytes:
        """The bytes the constraint alone determines next (empty if there is a choice)."""
        if self._ended[-1]:
            return b""
        a = self.compiled.automaton
        cfg = self._hist[-1]
        out = bytearray()
        while len(out) < MAX_FORCED_BYTES and not a.can_end(cfg):
            b = a.forced_byte(cfg)
            if b is None:
                break
            out.append(b)
            cfg = a.step_byte(cfg, b)
            if cfg is None:  # pragma: no cover - forced_byte only gives a live byte
                break
        return bytes(out)

    def forced_tokens(self) -> list[int]:
        """Forced bytes as tokens (:func:`encode_forced`)."""
        return encode_forced(self.compiled, self.forced_bytes())


def encode_forced(compiled: CompiledConstraint, data: bytes) -> list[int]:
    """Forced bytes as tokens: the tokenizer's canonical encoding when the vocabulary has
    one and it spells ``data`` exactly, else a greedy longest-match tokenization."""
    if not data:
        return []
    c = compiled
    if c.specials and SPECIAL_LEAD in data:  # named special tokens: their ids, the text between encoded
        at = data.index(SPECIAL_LEAD)
        tid = special_id(data, at)
        if tid is None:
            return encode_forced(c, data[:at])
        return encode_forced(c, data[:at]) + [tid] + encode_forced(c, data[at + 5 :])
    encode = getattr(c.vocab, "encode", None)
    if encode is not None:
        try:
            ids = list(encode(data.decode("utf-8")))
        except UnicodeDecodeError:
            ids = []
        if ids and b"".join(c.vocab.token_bytes[i] or b"\0" for i in ids) == data:
            return ids
    return c.index.greedy_tokenize(data, c.vocab)
