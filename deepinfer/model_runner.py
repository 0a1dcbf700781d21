"""ModelRunner: the only code that touches the device. Builds batch tensors, runs the model.

Prefill: ragged prompts are right-padded to the longest; each row keeps its own positions, so
padding only writes cache rows past the prompt, which the masks never read.
Decode: one token per running sequence, rows ordered by KV slot so contiguous slots are a
slice of the cache rather than a gather.
"""

from __future__ import annotations

import torch

from . import _threads  # noqa: F401  (OMP policy before torch)
from .models.kv_cache import KVCache
from .models.llama import ForwardBatch, LlamaModel
from .sequence import Sequence


class ModelRunner:
    def __init__(self, model: LlamaModel):
        self.model = model
        self.device = model.device
        self.cache: KVCache | None = None

    def ensure_cache(self, num_slots: int, max_len: int) -> None:
        """(Re)allocate the KV cache when it is smaller than asked; only between requests."""
        if self.cache is None or not self.cache.fits(num_slots, max_len):
            self.cache = None  # free the old one first
            self.cache = self.model.new_cache(num_slots, max_len)

    def _to(self, rows: list[list[int]]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)

    def prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Run every uncached token of each sequence; logits [B, V] of each one's last token."""
        chunks = [s.all_token_ids[s.num_cached :] for s in seqs]
        T = max(len(c) for c in chunks)
        tokens = [c + [0] * (T - len(c)) for c in chunks]
        positions = [list(range(s.num_cached, s.num_cached + T)) for s in seqs]
        from_zero = all(s.num_cached == 0 for s in seqs)
        logits = self._forward(seqs, tokens, positions, [len(c) - 1 for c in chunks], from_zero)
        for s in seqs:
            s.num_cached = len(s)
        return logits

    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One step for sequences whose last token is not cached yet; logits [B, V]."""
        tokens = [[s.output_token_ids[-1] if s.output_token_ids else s.prompt_token_ids[-1]] for s in seqs]
        positions = [[len(s) - 1] for s in seqs]
        logits = self._forward(seqs, tokens, positions, None)
        for s in seqs:
            s.num_cached = len(s)
        return logits

    def _forward(
        self,
        seqs: list[Sequence],
        tokens: list[list[int]],
        positions: list[list[int]],
        last: list[int] | None,
        from_zero: bool = False,
    ) -> torch.Tensor:
        assert self.cache is not None, "ensure_cache() first"
        slots = [s.slot for s in seqs]
        contiguous = slots == list(range(slots[0], slots[0] + len(slots)))
        batch = ForwardBatch(
            tokens=self._to(tokens),
            positions=self._to(positions),
            slots=self._to([slots])[0],
            kv_len=max(p[-1] for p in positions) + 1,
            slot_start=slots[0] if contiguous else None,
            logits_index=self._to([last])[0] if last is not None and len(tokens[0]) > 1 else None,
            from_zero=from_zero,
        )
        logits = self.model.forward(batch, self.cache)
        return logits if logits.dim() == 2 else logits[:, -1]
