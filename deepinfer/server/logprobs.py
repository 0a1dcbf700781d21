"""OpenAI's ``logprobs`` objects from ``RequestOutput.logprobs`` (``TokenLogprob`` entries).

Chat completions: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``.
Completions (the legacy shape): ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``.
A token's text is its bytes decoded as UTF-8 (a token holding part of a character shows the
replacement character; its ``bytes`` are exact). -inf (a token the model gives no mass) is
sent as -9999.0, as OpenAI does, since JSON has no infinity.
"""

from __future__ import annotations

import math

FLOOR = -9999.0


class TokenTexts:
    """Each token id's bytes (a special token's: its name) and text."""

    def __init__(self, token_bytes: list[bytes]) -> None:
        self._bytes = token_bytes

    def bytes_of(self, token_id: int) -> bytes:
        return self._bytes[token_id] if 0 <= token_id < len(self._bytes) else b""

    def text_of(self, token_id: int) -> str:
        return self.bytes_of(token_id).decode("utf-8", errors="replace")


def _lp(x: float) -> float:
    return x if math.isfinite(x) else FLOOR


def chat_logprobs(entries, texts: TokenTexts) -> dict:
    def one(tid: int, lp: float) -> dict:
        b = texts.bytes_of(tid)
        return {"token": texts.text_of(tid), "logprob": _lp(lp), "bytes": list(b)}

    content = []
    for e in entries:
        d = one(e.token_id, e.logprob)
        d["top_logprobs"] = [one(t, v) for t, v in e.top]
        content.append(d)
    return {"content": content, "refusal": None}


def completion_logprobs(entries, texts: TokenTexts, offset: int = 0) -> dict:
    """``offset``: characters of text before the first of these tokens (streamed chunks)."""
    tokens, lps, tops, offsets = [], [], [], []
    for e in entries:
        s = texts.text_of(e.token_id)
        tokens.append(s)
        lps.append(_lp(e.logprob))
        tops.append({texts.text_of(t): _lp(v) for t, v in e.top})
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
