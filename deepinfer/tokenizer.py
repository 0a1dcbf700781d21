"""Tokenizer wrapper: encode/decode, chat template, special and EOS ids, per-token bytes.

Wraps a `tokenizers.Tokenizer`: read from tokenizer.json, or built here from what
tokenizers cannot read itself, SentencePiece GGUF metadata (`sentencepiece_tokenizer`) and
Mistral's tekken.json (`tekken_tokenizer`); byte-level BPE GGUFs are built in
`deepinfer.loader.gguf`. The constraint compiler takes `.vocabulary()`; the byte decoding of
each token lives in `deepinfer.constraints.vocab`, not here. See docs/tokenizers.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ._text import clip_repr

if TYPE_CHECKING:
    import tokenizers

    from .loader.types import LoadedModel

Message = dict[str, Any]


class Tokenizer:
    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None = None,
        eos_token_ids: Sequence[int] = (),
        chat_template: str | None = None,
        add_bos_token: bool = False,
    ):
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids)
        self.chat_template = chat_template
        self.add_bos_token = add_bos_token

    @classmethod
    def from_loaded(cls, loaded: LoadedModel) -> Tokenizer:
        return cls(
            loaded.tokenizer,
            bos_token_id=loaded.bos_token_id,
            eos_token_ids=loaded.eos_token_ids,
            chat_template=loaded.chat_template,
            add_bos_token=loaded.add_bos_token,
        )

    # -- ids ---------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows (the model's logits may be wider)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @cached_property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of the added special tokens (control tokens such as `<|im_end|>`)."""
        return frozenset(i for i, t in self.backend.get_added_tokens_decoder().items() if t.special)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    # -- text --------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`. Special-token text such as "<|im_end|>" maps to its id."""
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # -- chat --------------------------------------------------------------------------------
    @cached_property
    def _template(self):
        if not self.chat_template:
            raise ValueError("this model has no chat template: use generate() with plain prompts")
        from .chat_template import ChatTemplate

        return ChatTemplate(self.chat_template, max_chars=self.max_prompt_chars)

    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render a conversation with the model's own Jinja template (sandboxed, bounded in time
        and size: ``deepinfer.chat_template``). Raises ValueError naming the bad message or
        the template's failure."""
        if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
            raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m:
                raise ValueError(f"message {i} must be a dict with 'role' and 'content', got {clip_repr(m)}")
        tok = self.backend.id_to_token
        return self._template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=tok(self.bos_token_id) if self.bos_token_id is not None else "",
            eos_token=tok(self.eos_token_id) if self.eos_token_id is not None else "",
            **kwargs,
        )

    # -- bounds ------------------------------------------------------------------------------
    #: the context (tokens) a prompt must fit; LLM sets it. A text past ``max_prompt_chars``
    #: characters cannot fit ``max_prompt_tokens`` tokens (x4: normalisers may shorten text)
    max_prompt_tokens: int | None = None

    @property
    def max_prompt_chars(self) -> int:
        """Characters past which a text cannot fit ``max_prompt_tokens`` tokens (worked out on
        first use: reading the vocabulary costs ~50 ms, not worth paying while loading)."""
        if self.max_prompt_tokens is None:
            return 4 << 20
        return 4 * self.max_prompt_tokens * self.longest_token_chars

    @cached_property
    def longest_token_chars(self) -> int:
        """Characters of the longest token's text: no text of more than ``n`` times this
        encodes to ``n`` tokens or fewer (so a prompt too long for the context is refused
        before it is tokenised)."""
        longest = max((len(t) for t in self.backend.get_vocab(with_added_tokens=True)), default=1)
        return max(longest, 1)

    # -- bytes (for the constraint compiler) ---------------------------------------------------
    def token_bytes(self) -> list[bytes | None]:
        """Each id's exact bytes (None for special tokens), from deepinfer.constraints.vocab."""
        return list(self._pieces()[0])

    def _pieces(self) -> tuple[list[bytes | None], set[int]]:
        """``token_bytes_from_tokenizer`` of the backend, read once (the server's token bytes
        and the constraint vocabulary both start from it)."""
        if self._pieces_read is None:
            from deepinfer.constraints.vocab import token_bytes_from_tokenizer

            self._pieces_read = token_bytes_from_tokenizer(self.backend)
        return self._pieces_read

    def vocabulary(self, vocab_size: int | None = None):
        """The constraint compiler's `Vocabulary` (built once, cached): token bytes, our EOS ids,
        special ids; `vocab_size` = the model's logits width when wider than the tokenizer."""
        if self._vocabulary is None or (vocab_size and self._vocabulary.vocab_size != vocab_size):
            from deepinfer.constraints.vocab import Vocabulary

            self._vocabulary = Vocabulary.from_tokenizer(
                self.backend, eos_ids=self.eos_token_ids, vocab_size=vocab_size, pieces=self._pieces()
            )
        return self._vocabulary

    _vocabulary = None
    _pieces_read = None


# -- tokenizers from formats other than tokenizer.json -------------------------------------------
# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE_MARKER = "▁"


def sentencepiece_tokenizer(
    tokens: Sequence[str],
    scores: Sequence[float],
    types: Sequence[int] | None = None,
    *,
    add_space_prefix: bool = True,
    unk_id: int | None = None,
) -> tokenizers.Tokenizer:
    """A SentencePiece BPE tokenizer (Llama 2, Mistral v1-v3, Gemma; GGUF ``tokenizer.ggml.model
    = "llama"``) as a ``tokenizers.Tokenizer``.

    Pieces write a space as ``▁``; a character no piece covers falls back to its UTF-8 bytes
    as ``<0xNN>`` tokens. Two adjacent pieces merge into the piece they spell with the highest
    score first (SentencePiece's BPE), so the merges are every split of a NORMAL piece into two
    NORMAL pieces, ordered by the merged piece's score. CONTROL, UNKNOWN and UNUSED tokens are
    special; USER_DEFINED tokens are matched whole in the text. ``add_space_prefix`` puts a ``▁``
    before the text and after each special token (SentencePiece's dummy prefix), and decoding
    drops it at the start of the text.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    n = len(tokens)
    if types is None:
        types = [BYTE if _is_byte_piece(t) else NORMAL for t in tokens]
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    normal = {t: (float(scores[i]), i) for i, t in enumerate(tokens) if types[i] == NORMAL and vocab[t] == i}
    ranked = []
    for piece, (score, i) in normal.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in normal and right in normal:
                ranked.append((-score, i, left, right))
    ranked.sort()
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < n else None
    model = models.BPE(
        vocab=vocab,
        merges=[(left, right) for _, _, left, right in ranked],
        unk_token=unk,
        fuse_unk=True,
        byte_fallback=True,
    )
    tok = Tokenizer(model)
    escape = [normalizers.Replace(" ", SPACE_MARKER)]
    tok.normalizer = normalizers.Sequence(
        ([normalizers.Prepend(SPACE_MARKER)] if add_space_prefix else []) + escape
    )
    steps = [decoders.Replace(SPACE_MARKER, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    special = [i for i in range(n) if types[i] in (UNKNOWN, CONTROL, UNUSED) and vocab[tokens[i]] == i]
    user = [i for i in range(n) if types[i] == USER_DEFINED and vocab[tokens[i]] == i]
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in special])
    if user:
        tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])
    return tok


def _is_byte_piece(piece: str) -> bool:
    return len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")


#: Tekken files older than v7 name no special tokens: these are the first 20 ids.
TEKKEN_DEFAULT_SPECIALS = (
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]",
    "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]",
)  # fmt: skip


def tekken_tokenizer(data: dict[str, Any], source: str = "tekken.json") -> tuple[tokenizers.Tokenizer, dict]:
    """Mistral's Tekken (``tekken.json``) as a ``tokenizers.Tokenizer``, plus its special facts
    (``bos_token_id``, ``eos_token_ids``) for `LoadedModel`.

    Tekken is tiktoken-style byte-level BPE: the text is split by ``config.pattern``; a piece
    that is a token is that token, else adjacent parts merge lowest rank first. Ids
    ``0 .. default_num_special_tokens - 1`` are the special tokens (``special_tokens``, padded
    with ``<SPECIAL_i>``); vocabulary rank ``r`` is id ``default_num_special_tokens + r``, for the
    first ``default_vocab_size - default_num_special_tokens`` ranks. ValueError names the field
    of ``source`` that is wrong.
    """
    import base64

    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    def bad(field: str, why: str) -> ValueError:
        return ValueError(f"{source!r}: {field} {why}")

    cfg = data.get("config")
    if not isinstance(cfg, dict):
        raise bad("config", "is missing: not a Tekken file")
    pattern, size, n_special = (
        cfg.get(k) for k in ("pattern", "default_vocab_size", "default_num_special_tokens")
    )
    if not isinstance(pattern, str) or not pattern:
        raise bad("config.pattern", "must be a non-empty regex string")
    entries = data.get("vocab")
    if not isinstance(entries, list):
        raise bad("vocab", "must be a list of {rank, token_bytes, token_str}")
    if not isinstance(n_special, int) or n_special < 1:
        raise bad("config.default_num_special_tokens", f"={n_special!r}: expected a positive integer")
    if not isinstance(size, int) or not n_special + 256 <= size <= n_special + len(entries):
        raise bad(
            "config.default_vocab_size",
            f"={size!r}: expected an integer in [{n_special + 256}, {n_special + len(entries)}] "
            "(the special tokens plus at most every vocab entry)",
        )
    named = data.get("special_tokens")
    if named is None:
        names = list(TEKKEN_DEFAULT_SPECIALS)
    elif isinstance(named, list) and all(
        isinstance(t, dict) and isinstance(t.get("token_str"), str) for t in named
    ):
        names = [t["token_str"] for t in sorted(named, key=lambda t: t.get("rank", 0))]
    else:
        raise bad("special_tokens", "must be a list of {rank, token_str, is_control}")
    if len(names) > n_special or len(set(names)) != len(names):
        raise bad("special_tokens", f"must be at most {n_special} distinct tokens")
    names += [f"<SPECIAL_{i}>" for i in range(len(names), n_special)]

    spell_table = dict(enumerate(_bytes_to_unicode()))  # byte -> its character, for str.translate
    ranks: dict[bytes, int] = {}
    for r, e in enumerate(entries[: size - n_special]):
        try:
            b = base64.b64decode(e["token_bytes"], validate=True)
        except Exception as err:  # KeyError, TypeError, binascii.Error
            raise bad(f"vocab[{r}].token_bytes", f"is not base64 bytes ({err})") from None
        if e.get("rank") != r or (r < 256 and b != bytes([r])) or not b or b in ranks:
            raise bad(
                f"vocab[{r}]", "must have rank r, the single byte r for r < 256, and bytes not seen before"
            )
        ranks[b] = r
    vocab = {name: i for i, name in enumerate(names)}
    spell = {b: b.decode("latin-1").translate(spell_table) for b in ranks}
    for b, r in ranks.items():
        piece = spell[b]
        if piece in vocab:
            raise bad(f"vocab[{r}]", f"spells {piece!r}, the name of a special token")
        vocab[piece] = n_special + r
    merges = []
    for b, r in ranks.items():
        for k in range(1, len(b)):
            left = b[:k]
            if left in ranks and (right := b[k:]) in ranks:
                merges.append((r, ranks[left], ranks[right], left, right))
    merges.sort()
    model = models.BPE(
        vocab=vocab,
        merges=[(spell[left], spell[right]) for *_, left, right in merges],
        ignore_merges=True,  # tiktoken: a piece that is a token is that token
    )
    tok = Tokenizer(model)
    try:
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    except Exception as err:  # tokenizers raises a bare Exception
        raise bad("config.pattern", f"is not a valid regex: {err}") from None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in names])
    bos = vocab.get("<s>")
    if bos is not None:  # Mistral's models read BOS first, as mistral-common's encode(bos=True) writes
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos)]
        )
    return tok, {"bos_token_id": bos, "eos_token_ids": [vocab["</s>"]] if "</s>" in vocab else []}


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table (byte-level BPE's alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]
