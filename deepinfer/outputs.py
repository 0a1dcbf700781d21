"""What `LLM.generate` returns: one RequestOutput per prompt, in prompt order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length"]  # the structured-generation work adds "grammar_end"


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | str
    stop_reason: str | int | None = None  # the stop string or token id that ended it, if any

    def __repr__(self) -> str:
        return (
            f"RequestOutput(id={self.request_id}, text={self.text!r}, "
            f"tokens={len(self.token_ids)}, finish_reason={self.finish_reason!r})"
        )
