"""Sequence: one request's running state, and the two per-step hooks of the step loop.

Per step the loop calls, for each running sequence:
  1. `mask_source()` before sampling: the allowed-token bits of this step as an int32 row
     (shared, read-only), `MASK_FAILED` when the constraint failed to give one, or None when
     unconstrained (`fill_bitmask(row)` writes them into a row);
  2. `on_token(token_id)` after sampling: the token is accepted into the sequence (a
     constraint matcher advances here) and stop conditions are checked.
The structured-generation work attaches a matcher as `self.constraint` and fills these in.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

import numpy as np

from .sampling_params import SamplingParams

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


# mask_source() when the constraint failed to give a mask: the row allows no token, and the
# request fails with the error in on_token (the rest of the batch goes on)
MASK_FAILED = np.zeros(0, dtype=np.int32)


def write_mask(row: np.ndarray, src: np.ndarray) -> None:
    """Write a `mask_source()` row (not None) into the bitmask row `row`: its bits, or no token
    at all for `MASK_FAILED`."""
    if src is MASK_FAILED:
        row[:] = 0
    else:
        row[: src.shape[0]] = src


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(
        self,
        request_id: int,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        seed: int,
        eos_token_ids: tuple[int, ...],
        max_len: int,
    ):
        # (the prompt is checked by the engine: a bad one is a failed Sequence, never run)
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.seed = seed  # params.seed, or one drawn at admission
        self.output_token_ids: list[int] = []
        self.status = Status.WAITING
        # the KV cache (the scheduler's): blocks held, in position order, one table per KV-cache
        # group (a sliding-window group's entries behind its window point at the null block),
        # and what they hold
        self.block_tables: list[list[int]] = [[]]
        self.num_slid = 0  # leading entries of the sliding-window group's table given back
        self.num_cached = 0  # tokens whose K/V are in the cache (the first ones)
        self.num_registered = 0  # full blocks keyed for reuse (prefix caching)
        self.block_keys: list = []  # (hash, tokens) of full blocks, computed once
        self.arrival = 0  # order of arrival (the youngest running request is preempted first)
        self.prefill_end = 0  # length when last admitted: tokens below it are prefill
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.constraint: Any = None  # a constraint matcher, set by structured generation
        self.error: str | None = None  # why the request failed (its batch goes on)
        # params.logprobs: one TokenLogprob per sampled token (a dropped token's entry is cut
        # off when the output is read: entries past len(output_token_ids) are not its tokens')
        self.logprobs: list | None = None if params.logprobs is None else []
        self.detokenizer: Any = None  # streamed: an IncrementalDetokenizer, made on first use
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids.update(eos_token_ids)
        self._stop_ids = frozenset(stop_ids)
        budget = max(max_len - len(self.prompt_token_ids), 0)
        self.max_tokens = min(params.max_tokens or budget, budget)
        self.text: str | None = None  # final text, set when finished

    # -- sizes -------------------------------------------------------------------------------
    @property
    def block_table(self) -> list[int]:
        """The block table of the first KV-cache group (the only one of most models)."""
        return self.block_tables[0]

    @block_table.setter
    def block_table(self, table: list[int]) -> None:
        self.block_tables[0] = table

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def completes(self, n: int) -> bool:
        """Computing its next ``n`` uncached tokens caches all it has (the row then samples)."""
        return self.num_cached + n == len(self)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    # -- per-step hooks ----------------------------------------------------------------------
    def mask_source(self) -> np.ndarray | None:
        """This step's allowed-token bits: the matcher's int32 row (shared: read it, do not
        write it), `MASK_FAILED` when the constraint raised (the request then fails in
        `on_token`, not the batch), or None when unconstrained."""
        if self.constraint is None:
            return None
        try:
            return self.constraint.mask_row()
        except Exception as e:  # this request fails (empty row: -1 from the sampler), not the batch
            self._mask_error = f"the constraint failed to give a mask: {type(e).__name__}: {e}"
            return MASK_FAILED

    def fill_bitmask(self, row: np.ndarray) -> bool:
        """Write this step's allowed-token bits into `row` (int32 [ceil(V/32)], host memory);
        False = no constraint this step."""
        src = self.mask_source()
        if src is None:
            return False
        write_mask(row, src)
        return True

    _mask_error: str | None = None

    def fail(self, message: str, tokenizer: Tokenizer) -> None:
        """End this request with an error; the rest of the batch goes on."""
        self.error = message
        self._finish("error", None, tokenizer)

    def abort(self, tokenizer: Tokenizer) -> None:
        """End this request at the caller's asking (``LLM.abort_request``): finish_reason "abort"."""
        self._finish("abort", None, tokenizer)

    def defers(self, token_id: int) -> bool:
        """Could this token's matcher work wait (``push_token`` now, ``settle`` later)? Only
        when nothing but the constraint could end the request at it: a constrained row, a
        sampled token that is no stop token, no stop strings, not the last allowed token."""
        return (
            self.constraint is not None
            and token_id >= 0
            and token_id not in self._stop_ids
            and not self.params.stop
            and len(self.output_token_ids) + 1 < self.max_tokens
        )

    def push_token(self, token_id: int) -> None:
        """The first half of ``on_token`` for a token that ``defers``: it joins the output (the
        next forward reads it); the matcher sees it in ``settle``."""
        self.output_token_ids.append(token_id)

    def settle(self, token_id: int, tokenizer: Tokenizer) -> None:
        """The second half: the matcher accepts the pushed token; the request ends as
        ``on_token`` would have ended it (rejected token: error; constraint complete: stop)."""
        m = self.constraint
        if not self._accepts(token_id, tokenizer):
            self.output_token_ids.pop()
            if not self.is_finished:
                self.fail(f"the constraint rejected sampled token {token_id}", tokenizer)
        elif m.is_terminated():
            self._finish("stop", None, tokenizer)

    def on_token(self, token_id: int, tokenizer: Tokenizer) -> None:
        """Accept a sampled token, then finish on a stop token, stop string or length (or
        when the constraint is complete)."""
        m = self.constraint
        if token_id < 0:
            if self._mask_error is not None:
                self.fail(self._mask_error, tokenizer)
                return
            why = _safe(m.empty_reason) if m is not None else None
            self.fail(
                "the constraint allows no token at this point (empty mask)" + (f": {why}" if why else ""),
                tokenizer,
            )
            return
        if m is not None and not self._accepts(token_id, tokenizer):
            if not self.is_finished:
                self.fail(f"the constraint rejected sampled token {token_id}", tokenizer)
            return
        self.output_token_ids.append(token_id)
        if m is not None and token_id not in self._stop_ids and m.is_terminated():
            self._finish("stop", None, tokenizer)
            return
        if token_id in self._stop_ids:
            self.output_token_ids.pop()  # stop tokens are not part of the output
            self._finish("stop", token_id, tokenizer)
            return
        if self.params.stop and self._check_stop_strings(tokenizer):
            return
        if len(self.output_token_ids) >= self.max_tokens:
            self._finish("length", None, tokenizer)

    # -- helpers -----------------------------------------------------------------------------
    def _accepts(self, token_id: int, tokenizer: Tokenizer) -> bool:
        """The matcher accepts the token; a matcher that raises fails this request (False,
        and the request is finished with the failure as its error)."""
        try:
            return bool(self.constraint.accept(token_id))
        except Exception as e:
            self.fail(f"the constraint failed on token {token_id}: {type(e).__name__}: {e}", tokenizer)
            return False

    def _check_stop_strings(self, tokenizer: Tokenizer) -> bool:
        # Decode a tail window: a stop string ends inside the last few tokens' text.
        longest = max(len(s) for s in self.params.stop)
        window = self.output_token_ids[-(longest + 8) :]
        tail = tokenizer.decode(window, skip_special_tokens=self.params.skip_special_tokens)
        if not any(s in tail for s in self.params.stop):
            return False
        text = self._decode(tokenizer)
        hits = [(text.find(s), s) for s in self.params.stop if s in text]
        at, s = min(hits)
        self._finish("stop", s, tokenizer)
        self.text = text[: at + len(s)] if self.params.include_stop_str_in_output else text[:at]
        return True

    def _decode(self, tokenizer: Tokenizer) -> str:
        return tokenizer.decode(self.output_token_ids, skip_special_tokens=self.params.skip_special_tokens)

    def _finish(self, reason: str, stop_reason: str | int | None, tokenizer: Tokenizer) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.text = self._decode(tokenizer)


def _safe(f) -> Any:
    try:
        return f()
    except Exception:
        return None
