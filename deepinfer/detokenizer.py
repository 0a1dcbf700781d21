"""IncrementalDetokenizer: a streamed request's text, decoded a few new tokens at a time.

Decoding the whole output at every step costs O(n) per step (O(n^2) per request). Instead
each step decodes only a short window: the tokens since the last stable point, with a few
tokens before them as context (so that tokenizers which treat a token differently at the
start of a text -- SentencePiece's leading space -- decode it as they would in the middle).
Text is released only when it is final:

- a window whose text ends in U+FFFD (a character split across tokens) waits for its next
  token;
- with stop strings, the last ``hold`` characters wait, since they may begin a stop string
  that the final text cuts off.

So every partial text is a prefix of the next one and of the final text: a client that
appends the deltas gets exactly the final text. ``reference_text`` (a full decode) is the
oracle the tests compare with.
"""

from __future__ import annotations

from collections.abc import Sequence


class IncrementalDetokenizer:
    """Parameters
    ----------
    tokenizer : deepinfer.tokenizer.Tokenizer
    skip_special_tokens : bool
    hold : int
        Characters kept back from the released text (stop strings: longest - 1).
    """

    CONTEXT = 4  # tokens decoded before the new ones, for context

    def __init__(self, tokenizer, *, skip_special_tokens: bool = True, hold: int = 0) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._hold = hold
        self._text = ""  # decoded text of ids[:read]
        self._prefix = 0  # window start (context)
        self._read = 0  # ids decoded into _text

    def text(self, ids: Sequence[int]) -> str:
        """The releasable text of ``ids`` (the output so far; earlier calls saw a prefix of it)."""
        if len(ids) > self._read:
            decode = self._tok.decode
            before = decode(ids[self._prefix : self._read], skip_special_tokens=self._skip)
            after = decode(ids[self._prefix :], skip_special_tokens=self._skip)
            if after.startswith(before):
                if not after.endswith("\ufffd"):  # (else: a split character, wait for the rest)
                    self._advance(self._text + after[len(before) :], len(ids))
            else:  # the window decodes differently in context: resynchronise on a full decode
                full = self.reference_text(ids)
                if full.startswith(self._text) and not full.endswith("\ufffd"):
                    self._advance(full, len(ids))
        return self._text[: len(self._text) - self._hold] if self._hold else self._text

    def _advance(self, text: str, read: int) -> None:
        self._text, self._read = text, read
        self._prefix = max(read - self.CONTEXT, 0)

    def reference_text(self, ids: Sequence[int]) -> str:
        """The whole output decoded at once (what the final output holds)."""
        return self._tok.decode(list(ids), skip_special_tokens=self._skip)
