"""The vocabulary as the constraint compiler sees it: each token id's exact bytes.

Byte-level BPE tokenizers (GPT-2, Llama 3, SmolLM2, Qwen, Mistral's Tekken) write bytes with
GPT-2's ``bytes_to_unicode`` alphabet; SentencePiece tokenizers (Llama 2, Mistral v1-v3,
Gemma) write a space as ``▁`` and fall back to ``<0xNN>`` tokens for single bytes. Which one a
tokenizer is, is read from its decoder. Special tokens have no bytes (``None``): a constraint
never allows them, except EOS where the constraint may end. ``Vocabulary.encode`` tokenises
text that continues a sequence (without SentencePiece's dummy-prefix space). See
docs/tokenizers.md.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Sequence
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


def _byte_level_bytes_reference(piece: str) -> bytes | None:
    """A byte-level piece's bytes, character by character (the definition)."""
    table = _unicode_to_byte()
    try:
        return bytes(table[ch] for ch in piece)
    except KeyError:
        return None


_NOT_A_BYTE = 0xFFFF  # what a character outside GPT-2's alphabet translates to


@lru_cache(maxsize=1)
def _byte_level_translation() -> dict[int, int]:
    """``str.translate`` table: each character of GPT-2's alphabet to the code point of its
    byte; every other character below 256 to one that latin-1 cannot encode (characters above
    255 outside the alphabet are left as they are, which it cannot encode either)."""
    table = {ord(ch): b for ch, b in _unicode_to_byte().items()}
    for c in range(256):
        table.setdefault(c, _NOT_A_BYTE)
    return table


def _byte_level_bytes(piece: str) -> bytes | None:
    """A byte-level piece's bytes (None where a character is outside GPT-2's alphabet): one
    ``translate`` and one encode in C, where the reference maps character by character in
    Python (about 45 ms over a 49k vocabulary, against about 10)."""
    try:
        return piece.translate(_byte_level_translation()).encode("latin-1")
    except UnicodeEncodeError:
        return None


def _decoder_steps(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The decoder's steps, a ``Sequence`` flattened."""

    def flat(node: Any) -> list[dict[str, Any]]:
        if not isinstance(node, dict):
            return []
        if node.get("type") == "Sequence":
            return [step for d in node.get("decoders", []) for step in flat(d)]
        return [node]

    return flat(spec.get("decoder"))


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


def _piece_decoder(spec: dict[str, Any]):
    """``piece -> bytes`` for the model's own pieces, as the tokenizer's decoder writes them.

    Byte-level BPE: GPT-2's alphabet. SentencePiece (a ``Metaspace`` or ``Replace("▁", " ")``
    decoder): ``▁`` is a space, and with byte fallback ``<0xNN>`` is the single byte 0xNN
    (``Strip``, which drops the dummy prefix's space at the start of a whole text, does not
    change a token's bytes inside generated text).
    """
    if _is_byte_level(spec):
        return _byte_level_bytes
    steps = _decoder_steps(spec)
    model = spec.get("model") or {}
    byte_fallback = bool(model.get("byte_fallback")) or any(d.get("type") == "ByteFallback" for d in steps)
    marker = None
    for d in steps:
        if d.get("type") == "Metaspace":
            marker = d.get("replacement", "▁")
        elif d.get("type") == "Replace" and d.get("content") == " ":
            marker = (d.get("pattern") or {}).get("String", marker)

    def piece_bytes(piece: str) -> bytes:
        if byte_fallback:
            m = _BYTE_FALLBACK.match(piece)
            if m:
                return bytes([int(m.group(1), 16)])
        if marker:
            piece = piece.replace(marker, " ")
        return piece.encode("utf-8")

    return piece_bytes


def _added_token_bytes(tok: Any, token_id: int, anchor: int | None) -> bytes:
    """A non-special added token's bytes: its text as the tokenizer decodes it after an
    ordinary token (so a decoder's start-of-text ``Strip`` does not touch it)."""
    if anchor is None:
        return tok.decode([token_id], skip_special_tokens=False).encode("utf-8")
    head = tok.decode([anchor], skip_special_tokens=False)
    text = tok.decode([anchor, token_id], skip_special_tokens=False)
    return text[len(head) :].encode("utf-8") if text.startswith(head) else text.encode("utf-8")


def token_bytes_from_tokenizer(tok: Any) -> tuple[list[bytes | None], set[int]]:
    """Each token id's bytes (``None`` for special tokens) and the special ids.

    ``tok`` is a ``tokenizers.Tokenizer``. Special added tokens and the model's unknown token
    have no bytes; a non-special added token has the bytes its decoded text has.
    """
    return _token_bytes(tok, _tokenizer_spec(tok))


def _token_bytes(tok: Any, spec: dict[str, Any]) -> tuple[list[bytes | None], set[int]]:
    size = tok.get_vocab_size(with_added_tokens=True)
    id_to_piece: list[str | None] = [None] * size
    for piece, i in tok.get_vocab(with_added_tokens=True).items():
        if i >= len(id_to_piece):
            id_to_piece.extend([None] * (i + 1 - len(id_to_piece)))
        id_to_piece[i] = piece
    added = spec.get("added_tokens") or []
    special = {t["id"] for t in added if t.get("special")}
    model = spec.get("model") or {}
    unk = (
        model.get("unk_id")
        if model.get("type") == "Unigram"
        else tok.token_to_id(model.get("unk_token") or "")
    )
    if unk is not None:
        special.add(int(unk))
    piece_bytes = _piece_decoder(spec)
    out: list[bytes | None] = [
        None if piece is None or i in special else piece_bytes(piece) for i, piece in enumerate(id_to_piece)
    ]
    plain = [t["id"] for t in added if not t.get("special") and t["id"] < len(out)]
    if plain:
        plain_set = set(plain)
        anchor = next(
            (i for i, b in enumerate(out) if b and b.isalpha() and b.isascii() and i not in plain_set), None
        )
        for i in plain:
            out[i] = _added_token_bytes(tok, i, anchor)
    return out, special


def _tokenizer_spec(tok: Any) -> dict[str, Any]:
    """The parts of ``tok``'s tokenizer.json that a vocabulary reads: the added tokens (id and
    whether special), the model's type, unknown token and byte fallback, and the normalizer,
    pre-tokenizer and decoder, each serialised from the component itself. ``to_str`` would
    write the model's vocabulary and merges too, and writing and parsing those is most of the
    time (about 40 ms for 49k tokens). A Unigram model, whose unknown id the bindings do not
    expose, is read whole."""
    model = tok.model
    kind = type(model).__name__
    if kind not in ("BPE", "WordPiece", "WordLevel"):
        return json.loads(tok.to_str())

    def part(component: Any) -> Any:
        return None if component is None else json.loads(component.__getstate__())

    return {
        "added_tokens": [{"id": i, "special": t.special} for i, t in tok.get_added_tokens_decoder().items()],
        "model": {
            "type": kind,
            "unk_token": getattr(model, "unk_token", None),
            "byte_fallback": bool(getattr(model, "byte_fallback", False)),
        },
        "normalizer": part(tok.normalizer),
        "pre_tokenizer": part(tok.pre_tokenizer),
        "decoder": part(tok.decoder),
    }


def continuation_encoder(tok: Any, spec: dict[str, Any] | None = None) -> Callable[[str], list[int]]:
    """``text -> ids`` for text that continues a sequence (forced bytes in generated text).

    A SentencePiece tokenizer prefixes the start of a text with ``▁`` (a space), which text in
    the middle of a sequence does not have: the encoder returned is a copy of ``tok`` without
    that prefix (``Prepend`` normalizers and ``Replace`` normalizers anchored at the start of
    the text dropped, ``Metaspace``/``ByteLevel`` not prepending), or ``tok`` itself when it
    prepends nothing.
    """
    spec = _tokenizer_spec(tok) if spec is None else spec
    parts = {k: copy.deepcopy(spec.get(k)) for k in ("normalizer", "pre_tokenizer")}
    if _drop_prefix(parts):
        tok = _with_parts(tok, parts) or _whole_without_prefix(tok)
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def _whole_without_prefix(tok: Any) -> Any:
    """A copy of the whole tokenizer (its tokenizer.json written, edited and read back: about
    150 ms for 32k pieces) that adds no prefix to a text."""
    whole = json.loads(tok.to_str())
    _drop_prefix(whole)
    return type(tok).from_str(json.dumps(whole))


def _with_parts(tok: Any, parts: dict[str, Any]) -> Any | None:
    """``tok`` with ``parts``' normalizer and pre-tokenizer (tokenizer.json dicts): a new
    tokenizer on the same model object (shared, not copied), with ``tok``'s decoder, post-processor
    and added tokens. None where that cannot be made to match ``tok`` (truncation or padding
    set, an added token that gets another id): the caller copies the whole tokenizer then."""
    if tok.truncation is not None or tok.padding is not None:
        return None
    shell = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
             "post_processor": None, "decoder": None,
             "model": {"type": "BPE", "vocab": {}, "merges": []}, **parts}  # fmt: skip
    read = type(tok).from_str(json.dumps(shell))
    out = type(tok)(tok.model)
    if read.normalizer is not None:
        out.normalizer = read.normalizer
    if read.pre_tokenizer is not None:
        out.pre_tokenizer = read.pre_tokenizer
    if tok.decoder is not None:
        out.decoder = tok.decoder
    if tok.post_processor is not None:
        out.post_processor = tok.post_processor
    added = sorted(tok.get_added_tokens_decoder().items())
    out.add_tokens([t for _, t in added])
    out.encode_special_tokens = tok.encode_special_tokens
    got = out.get_added_tokens_decoder()
    if any(i not in got or got[i].content != t.content or got[i].special != t.special for i, t in added):
        return None
    return out


def _drop_prefix(spec: dict[str, Any]) -> bool:
    """Make ``spec`` (a tokenizer.json dict) add no prefix to a text; True if it changed."""
    changed = False

    def at_start(n: dict[str, Any]) -> bool:
        """A ``Prepend``, or a ``Replace`` of a pattern anchored at the start of the text."""
        pattern = (n.get("pattern") or {}).get("Regex", "") if n.get("type") == "Replace" else ""
        return n.get("type") == "Prepend" or pattern.startswith(("\\A", "^"))

    norm = spec.get("normalizer")
    if isinstance(norm, dict):
        if at_start(norm):
            spec["normalizer"] = None
            changed = True
        elif norm.get("type") == "Sequence":
            kept = [n for n in norm.get("normalizers", []) if not at_start(n)]
            changed = len(kept) != len(norm.get("normalizers", []))
            norm["normalizers"] = kept

    def walk(node: Any) -> None:
        nonlocal changed
        if isinstance(node, list):
            for n in node:
                walk(n)
        elif isinstance(node, dict):
            if node.get("type") == "Metaspace":
                if node.get("prepend_scheme", "never") != "never" or node.get("add_prefix_space"):
                    node["prepend_scheme"] = "never"
                    node.pop("add_prefix_space", None)
                    changed = True
            elif node.get("type") == "ByteLevel" and node.get("add_prefix_space"):
                node["add_prefix_space"] = False
                changed = True
            walk(node.get("pretokenizers"))

    walk(spec.get("pre_tokenizer"))
    return changed


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
        *,
        pieces: tuple[list[bytes | None], set[int]] | None = None,
    ) -> Vocabulary:
        """Build from a ``tokenizers.Tokenizer`` (or a ``transformers`` fast tokenizer).

        Without ``eos_ids``, the tokenizer's ``</s>``, ``<|endoftext|>``, ``<|im_end|>``,
        ``<|eot_id|>`` or ``<eos>`` tokens are used where present. ``pieces``: what
        :func:`token_bytes_from_tokenizer` gave for ``tok``, where it was already read.
        """
        if hasattr(tok, "backend_tokenizer"):  # transformers PreTrainedTokenizerFast
            tok = tok.backend_tokenizer
        spec = _tokenizer_spec(tok)
        token_bytes, special = _token_bytes(tok, spec) if pieces is None else pieces
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
        vocab.encode = continuation_encoder(tok, spec)
        return vocab

    def __len__(self) -> int:
        return self.vocab_size

    def split_index(self, byte: int) -> tuple[Any, Any]:
        """Two tries: tokens without ``byte`` and tokens with it (built once, cached)."""
        cache = self.__dict__.setdefault("_split", {})
        hit = cache.get(byte)
        if hit is None:
            from .tokens.trie_cache import trie

            ch = bytes([byte])
            hit = (
                trie(self, f"without-{byte:02x}", keep=lambda b: ch not in b),
                trie(self, f"with-{byte:02x}", keep=lambda b: ch in b),
            )
            cache[byte] = hit
        return hit

    def length_split(self, byte: int, most: int) -> tuple[Any, Any]:
        """Two tries of the tokens without ``byte``: those of at most ``most`` bytes, and the
        longer ones (built once, cached)."""
        cache = self.__dict__.setdefault("_length_split", {})
        hit = cache.get((byte, most))
        if hit is None:
            from .tokens.trie_cache import trie

            ch = bytes([byte])
            hit = (
                trie(self, f"without-{byte:02x}-upto-{most}", keep=lambda b: ch not in b and len(b) <= most),
                trie(self, f"without-{byte:02x}-over-{most}", keep=lambda b: ch not in b and len(b) > most),
            )
            for t in hit:
                t.subtree_columns()
            cache[(byte, most)] = hit
        return hit

    def split_index_if_built(self, byte: int) -> tuple[Any, Any] | None:
        """:meth:`split_index` where it was built (or loaded) before, else None."""
        return self.__dict__.get("_split", {}).get(byte)

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
            from .tokens.trie_cache import trie

            self._index = trie(self, "all")
            warm_up(self._index)  # the cold-row kernels: loaded now, not on the first mask
        return self._index
