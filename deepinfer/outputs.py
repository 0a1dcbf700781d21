"""What `LLM.generate` returns (one RequestOutput per prompt, in prompt order) and `LLM.step`
returns (one per request that finished, or -- streamed -- gained tokens, that step)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

# "stop": EOS, a stop string/id, or the constraint ended; "length": max_tokens cut it
# (a constrained output cut so is never valid); "error": the request failed (see .error);
# "abort": LLM.abort_request ended it
FinishReason = Literal["stop", "length", "error", "abort"]


class TokenLogprob(NamedTuple):
    """One generated token's log-probability under the model (``SamplingParams.logprobs``)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the most likely tokens at this position: (id, logprob), best first


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None  # None when the prompt was given as token ids
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: FinishReason | str | None  # None while not finished (a streamed partial output)
    stop_reason: str | int | None = None  # the stop string or token id that ended it, if any
    parsed: Any = None  # JSON Schema: the validated object (a pydantic instance for a model)
    error: str | None = None  # why the output is not valid, or why the request failed
    # the constraint's notes: keywords lenient mode relaxed, a narrower whitespace than asked
    relaxed: list[str] = field(default_factory=list)
    finished: bool = True  # False: a partial output of a streamed request (LLM.step)
    # SamplingParams.reasoning: the reasoning block's text (``text`` is then what follows it)
    reasoning: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token of token_ids, when asked for

    @property
    def valid(self) -> bool:
        """The request had a constraint and its output satisfies it (or had none and ran)."""
        return self.error is None and self.finish_reason not in ("error", "abort")

    def __repr__(self) -> str:
        return (
            f"RequestOutput(id={self.request_id}, text={self.text!r}, "
            f"tokens={len(self.token_ids)}, finish_reason={self.finish_reason!r}"
            + (f", error={self.error!r}" if self.error else "")
            + ("" if self.finished else ", finished=False")
            + ")"
        )
