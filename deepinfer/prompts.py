"""Prompts: text, token ids or a chat conversation, checked and turned into token ids. A prompt
that cannot run raises ValueError naming what is wrong, which fails its own request only."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from ._text import clip_repr, lone_surrogate
from .tokenizer import Message, Tokenizer


class Rendered(str):
    """A chat prompt rendered by the template (its special tokens are text: encoded as such)."""


class Refused(str):
    """A prompt that failed before tokenising (e.g. its chat template refused it): the text is
    the request's error."""


def render_chat(tokenizer: Tokenizer, messages: Seq[Message], add_generation_prompt: bool = True,
                chat_template_kwargs: dict[str, Any] | None = None) -> str:  # fmt: skip
    """One conversation rendered by the model's chat template: a ``Rendered`` prompt, or a
    ``Refused`` one carrying the template's message."""
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt, **(chat_template_kwargs or {}))
    except ValueError as e:
        return Refused(str(e))
    return Rendered(text)  # the template holds any BOS/special tokens as text


def prompt_ids(
    prompt: Any, tokenizer: Tokenizer, vocab_size: int, limit: int
) -> tuple[str | None, list[int]]:
    """(text, token ids) of a prompt for a context of ``limit`` tokens; ValueError naming what is
    wrong with it. A text too long for the context is refused before it is tokenised (no text of
    more than ``tokenizer.max_prompt_chars`` characters fits)."""
    if isinstance(prompt, Refused):
        raise ValueError(str(prompt))
    if isinstance(prompt, str):
        bad = lone_surrogate(prompt)
        if bad is not None:
            raise ValueError(
                f"the prompt is not valid text: a lone surrogate {prompt[bad]!r} at character {bad}"
            )
        if len(prompt) > tokenizer.max_prompt_chars:
            raise ValueError(
                f"the prompt has {len(prompt)} characters, more than a context of {limit} tokens "
                f"can hold ({tokenizer.max_prompt_chars})"
            )
        # a rendered chat template holds its special tokens as text: encoded as specials
        text, ids = str(prompt), tokenizer.encode(prompt, add_special_tokens=not isinstance(prompt, Rendered))
    elif isinstance(prompt, Seq) and not isinstance(prompt, bytes | bytearray):
        if len(prompt) > limit:
            raise ValueError(f"the prompt has {len(prompt)} tokens, the model's context is {limit}")
        text, ids = None, []
        for i, t in enumerate(prompt):
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab_size:
                raise ValueError(
                    f"prompt token {i} is {clip_repr(t, 60)}, not a token id in [0, {vocab_size})"
                )
            ids.append(int(t))
    else:
        raise ValueError(f"a prompt is text or a list of token ids, got {type(prompt).__name__}")
    if not ids:
        raise ValueError("the prompt is empty (no tokens)")
    if len(ids) >= limit:
        raise ValueError(
            f"the prompt has {len(ids)} tokens, the model's context is {limit}; no room to generate"
        )
    return text, ids
