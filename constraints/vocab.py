"""The vocabulary as the constraint compiler sees it: each token id's exact bytes.

Byte-level BPE tokenizers (GPT-2, Llama 3, SmolLM2, Qwen) write bytes with GPT-2's
``bytes_to_unicode`` alphabet; SentencePiece tokenizers (Llama 2, Gemma) write a space as
``▁`` and fall back to ``<0xNN>`` tokens for single bytes. Special tokens have no bytes
(``None``): a constraint never allows them, except EOS where the constraint may end.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode``."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _byte_level_bytes(piece: str) -> bytes | None:
    table = _unicode_to_byte()
    try:
        return bytes(table[ch] for ch in piece)
    except KeyError:
        return None


def _sentencepiece_bytes(piece: str) -> bytes:
    m = _BYTE_FALLBACK.match(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    return piece.replace("▁", " ").encode("utf-8")


def _is_byte_level(spec: dict[str, Any]) -> bool:
    def has_byte_level(node: Any) -> bool:
        if isinstance(node, dict):
            if node.get("type") == "ByteLevel":
                return True
            return any(has_byte_level(v) for v in node.values())
        if isinstance(node, list):
            return any(has_byte_level(v) for v in node)
        return False

    return has_byte_level(spec.get("decoder")) or has_byte_level(spec.get("pre_tokenizer"))


def token_bytes_from_tokenizer(tok: Any) -> tuple[list[bytes | None], set[int]]:
    """Each token id's bytes (``None`` for special tokens) and the special ids.

    ``tok`` is a ``tokenizers.Tokenizer``.
    """
    spec = json.loads(tok.to_str())
    size = tok.get_vocab_size(with_added_tokens=True)
    id_to_piece: list[str | None] = [None] * size
    for piece, i in tok.get_vocab(with_added_tokens=True).items():
        if i >= len(id_to_piece):
            id_to_piece.extend([None] * (i + 1 - len(id_to_piece)))
        id_to_piece[i] = piece
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    added_plain = {t["id"]: t["content"] for t in spec.get("added_tokens", []) if not t.get("special")}
    byte_level = _is_byte_level(spec)
    out: list[bytes | None] = []
    for i, piece in enumerate(id_to_piece):
        if piece is None or i in special:
            out.append(None)
        elif i in added_plain:
            out.append(added_plain[i].encode("utf-8"))
        elif byte_level:
            out.append(_byte_level_bytes(piece))
        else:
            out.append(_sentencepiece_bytes(piece))
    return out, special


class Vocabulary:
    """Token id → bytes, plus the ids a constraint treats specially.

    Parameters
    ----------
    token_bytes:
        ``token_bytes[i]`` is token ``i``'s exact bytes, or ``None`` for a token that
        never appears inside constrained text (special and control tokens).
    eos_ids:
        Tokens that end generation; allowed exactly where the constraint may end.
    special_ids:
        Tokens never allowed inside a constraint (their bytes are ignored).
    vocab_size:
        The model's logits width: when it exceeds ``len(token_bytes)`` (padded
        embeddings) the extra ids are never allowed; when it is smaller, ids past it are
        dropped (the model cannot produce them).
    """

    def __init__(
        self,
        token_bytes: Sequence[bytes | None],
        eos_ids: Iterable[int] = (),
        special_ids: Iterable[int] = (),
        vocab_size: int | None = None,
    ) -> None:
        eos = set(int(i) for i in eos_ids)
        if vocab_size is not None and vocab_size < len(token_bytes):
            # the model's logits are narrower than the tokenizer: ids past them never occur
            token_bytes = token_bytes[:vocab_size]
            eos = {i for i in eos if i < vocab_size}
        self.eos_ids = tuple(sorted(eos))
        self.special_ids = frozenset(int(i) for i in special_ids) | frozenset(self.eos_ids)
        tb = [None if (i in self.special_ids or b == b"") else b for i, b in enumerate(token_bytes)]
        self.vocab_size = max(len(tb), vocab_size or 0)
        tb.extend([None] * (self.vocab_size - len(tb)))
        self.token_bytes: tuple[bytes | None, ...] = tuple(tb)
        for i in self.eos_ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"eos id {i} is outside the vocabulary of {self.vocab_size} tokens")
        self._index: Any = None  # built lazily: a tokens.trie.VocabIndex
        # canonical tokenization of text, when built from a tokenizer (jump-forward drafts)
        self.encode: Any = None

    @classmethod
    def from_tokenizer(
        cls,
        tok: Any,
        eos_ids: Iterable[int] | None = None,
        vocab_size: int | None = None,
    ) -> Vocabulary:
        """Build from a ``tokenizers.Tokenizer`` (or a ``transformers`` fast tokenizer).

        Without ``eos_ids``, the tokenizer's ``</s>``, ``<|endoftext|>``, ``<|im_end|>``,
        ``<|eot_id|>`` or ``<eos>`` tokens are used where present.
        """
        if hasattr(tok, "backend_tokenizer"):  # transformers PreTrainedTokenizerFast
            tok = tok.backend_tokenizer
        token_bytes, special = token_bytes_from_tokenizer(tok)
        if eos_ids is None:
            names = (
                "</s>",
                "<|endoftext|>",
                "<|im_end|>",
                "<|eot_id|>",
                "<|end_of_text|>",
                "<eos>",
                "<end_of_turn>",
            )
            eos_ids = [i for n in names if (i := tok.token_to_id(n)) is not None]
        vocab = cls(token_bytes, eos_ids, special, vocab_size)
        vocab.encode = lambda text: tok.encode(text, add_special_tokens=False).ids
        return vocab

    def __len__(self) -> int:
        return self.vocab_size

    def split_index(self, byte: int) -> tuple[Any, Any]:
        """Two tries: tokens without ``byte`` and tokens with it (built once, cached)."""
        cache = self.__dict__.setdefault("_split", {})
        hit = cache.get(byte)
        if hit is None:
            from .tokens.trie import VocabIndex

            ch = bytes([byte])
            hit = (VocabIndex(self, keep=lambda b: ch not in b), VocabIndex(self, keep=lambda b: ch in b))
            cache[byte] = hit
        return hit

    def shared_rows(self) -> dict:
        """Rows shared across compilations, keyed by a canonical form of the automaton
        that decides them (e.g. "inside a JSON string"): computed once per vocabulary."""
        return self.__dict__.setdefault("_shared_rows", {})

    def shared_forms(self) -> list:
        """Canonical forms of the automata behind :meth:`shared_rows` (key bytes, int16
        ``[blocks, 256]``), most recently met first: a new state is matched against them
        before its own automaton is minimised."""
        return self.__dict__.setdefault("_shared_forms", [])

    def index(self) -> Any:
        """The shared per-vocabulary token trie (built once, on first use)."""
        if self._index is None:
            from .tokens.rows import warm_up
            from .tokens.trie import VocabIndex

            self._index = VocabIndex(self)
            warm_up(self._index)  # the cold-row kernels: loaded now, not on the first mask
        return self._index
