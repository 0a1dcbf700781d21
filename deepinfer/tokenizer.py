"""Tokenizer wrapper: encode/decode, chat template, special and EOS ids, per-token bytes.

Wraps a `tokenizers.Tokenizer` (built from GGUF metadata or read from tokenizer.json). The
constraint compiler takes `.vocabulary()`; the byte decoding of each token lives in
`deepinfer.constraints.vocab`, not here.
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
    #: the prompt length (characters) past which a text cannot fit ``max_len`` tokens is
    #: ``max_len * longest_token_chars``; LLM sets ``max_prompt_chars`` from its context
    max_prompt_chars: int = 4 << 20

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
        from deepinfer.constraints.vocab import token_bytes_from_tokenizer

        return token_bytes_from_tokenizer(self.backend)[0]

    def vocabulary(self, vocab_size: int | None = None):
        """The constraint compiler's `Vocabulary` (built once, cached): token bytes, our EOS ids,
        special ids; `vocab_size` = the model's logits width when wider than the tokenizer."""
        if self._vocabulary is None or (vocab_size and self._vocabulary.vocab_size != vocab_size):
            from deepinfer.constraints.vocab import Vocabulary

            self._vocabulary = Vocabulary.from_tokenizer(
                self.backend, eos_ids=self.eos_token_ids, vocab_size=vocab_size
            )
        return self._vocabulary

    _vocabulary = None
