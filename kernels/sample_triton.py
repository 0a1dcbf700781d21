"""Triton backend of ``sample()``: the fused mask + temperature + top-k/top-p/min-p + sampling,
and the choice of launches a call makes.

Sampling is by inverse CDF with counter-based uniforms (``sample_reference.draw_bits``, the same
32-bit integer hash in both backends) over integer weights (``sample_reference.chunk_weights`` /
``inverse_cdf``): draw j walks the running sums to a chunk (hash id 2j), then to a token in it
(id 2j + 1); the sums are exact, so every path picks the same token. The kept set of top-k /
top-p / min-p is ``{i : s_i >= tau}`` for an unknown threshold tau; it is never searched for,
except that top-k's own threshold, the k-th largest score, is found exactly (``sample_topk``)
and a top-k row draws only above it:

    pass 1: m = max(s), Z = sum exp(s - m)            (greedy: m and the lowest argmax only;
            top-k rows: the maxima of each chunk's groups of 32 tokens, ``sample_topk``)
    top-k rows, in the per-row kernel: the groups whose max reaches the k-th largest group
            max (or a little below), their tokens gathered; the k-th largest score from them,
            then the draws, the top-p / min-p test and any rounds below, all on those tokens
    draws:  x_0..x_3 = 4 inverse-CDF draws from softmax(s) (u_0..u_3), one tile each, and
            each one's verdict from pass 1's chunk maxima and sums (``sample_filters.verdict``):
            kept or cut for sure, or left to the test pass
    test pass (top-k / top-p only): count and mass above s_x0..s_x3 at once, over the chunks
            whose max is above a draw left to it (none when the verdicts settle the row)
    token = the first kept x_j (rejection sampling: exact for the kept distribution)
    all four cut (probability ~ (1 - kept mass)**4): rounds r = 1, 2, ... of four draws
      x_4r..x_4r+3 from {s > low} (low = the highest cut score so far: every token at or below
      it is cut), tested in one pass; the token is the first kept one

Passes over V: greedy 1; sampling 1 plus 4 tiles; top-k / top-p 2 plus 4 tiles (1 plus 4 when the
verdicts settle the row, as on most rows of a real model's peaked logits); no host
synchronisation, no sort, no per-token random numbers (no hashing of the vocabulary).

Where the kernels live: ``triton_common`` (the shared helpers), ``sample_filters`` (verdicts,
test pass, decision), ``sample_topk`` (the k-th largest score and the draws above it),
``sample_rows`` (the per-row kernel: every pass when the row is one chunk,
else the split passes' combine), ``sample_split`` (the (row, chunk) passes), ``sample_greedy``
(an all-greedy call in one launch). ``SampleTuning`` (``tuning``) picks among the layouts, none
of which changes a token.
"""

from __future__ import annotations

import torch
import triton

from . import sample_greedy, sample_rows, sample_split
from .sample_reference import chunk_size
from .triton_common import pdl_device, row_args
from .tuning import DEFAULT_TUNING, SampleTuning, topk_groups


def use_split(V: int, tuning: SampleTuning = DEFAULT_TUNING) -> bool:
    """Whether a call over V tokens a row runs the split passes ((row, chunk) programs)."""
    return tuning.split == "always" or (tuning.split == "auto" and V > chunk_size(V, tuning.chunk_max))


def sample(
    logits: torch.Tensor,
    bitmask: torch.Tensor | None,
    indices: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seed: torch.Tensor,
    step: torch.Tensor,
    return_logprobs: bool = False,
    kinds: str = "filter",
    tuning: SampleTuning = DEFAULT_TUNING,
    top_k_bound: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Triton version of :func:`sample_reference.sample`.

    Arguments are validated [B] tensors on logits' device: temperature / top_p / min_p float32,
    top_k / seed / step int64 (``deepinfer.kernels.sample`` prepares them). One launch when V
    is one chunk; else up to four (pass 1, the draws, the test pass, the per-row decision),
    plus one small scatter when ``indices`` is given. ``kinds`` (known on the host) leaves out
    launches no row needs: "greedy" (every row greedy: no draws), "plain" (no row samples with
    a filter: pass 1, then one program a row draws and ends it), "top_k" (every sampling row
    has top-k: pass 1 stores the group maxima, the per-row kernel draws from the top groups: two
    launches),
    "sample" (no row samples with top-k or top-p: no test pass), "top_p" (no row samples with
    top-k: the test pass without the counts), "filter" (all of them). ``tuning`` picks the
    layout (the same tokens in any); ``top_k_bound`` (the rows' largest top_k, known on the
    host, or None) how many groups a top-k row gathers (:func:`~.tuning.topk_groups`).
    """
    B, V = logits.shape
    dev = logits.device
    tokens = torch.empty(B, dtype=torch.int64, device=dev)
    empty = torch.empty(B, dtype=torch.bool, device=dev)
    logprobs = torch.empty(B, dtype=torch.float32, device=dev) if return_logprobs else tokens
    if B == 0:
        return tokens, empty, (logprobs if return_logprobs else None)
    rows = row_args(logits, bitmask, indices, tokens)
    split = use_split(V, tuning)
    split2 = split and kinds in ("top_p", "filter") and tuning.split2
    chunk = chunk_size(V, tuning.chunk_max)
    S = triton.cdiv(V, chunk)
    pm = pz = pi = dx = dq = dv = ps = tokens  # unused without the split
    cand = (tokens, tokens)
    if split and kinds == "greedy" and not return_logprobs and tuning.greedy1:
        sample_greedy.launch(rows, tokens, empty, V, chunk, tuning)
        return tokens, empty, None
    pdl = split and tuning.pdl and pdl_device(dev)
    kc = topk_groups(tuning, top_k_bound)
    if split:
        call = sample_split.SplitCall(rows, V, S, chunk, pdl)
        topk = kinds in ("top_k", "filter")  # some row may have top-k: pass 1 stores its groups' maxima
        pm, pz, pi, got = sample_split.pass1(call, temperature, return_logprobs, tuning.split_warps,
                                             top_k if topk else None, kc)  # fmt: skip
        cand = got if topk else (pm, pi)  # (placeholders of the top-k buffers' types, never read)
        if kinds == "plain":  # no filter: the draw (or the argmax) ends the row
            sample_split.plain(call, temperature, seed, step, (pm, pz, pi), (tokens, empty, logprobs),
                               return_logprobs, tuning.draw_warps)  # fmt: skip
            return tokens, empty, (logprobs if return_logprobs else None)
        if kinds not in ("greedy", "top_k"):  # (top-k rows draw in the per-row kernel)
            dx, dq, dv = sample_split.draws(call, temperature, top_k, top_p, min_p, seed, step, pm, pz,
                                            tuning.draw_warps, topk)  # fmt: skip
        if split2:
            ps = sample_split.pass2(call, temperature, top_k, top_p, min_p, pm, dq, dv, kinds == "filter",
                                    tuning.pass2_warps)  # fmt: skip
    sample_rows.launch(
        rows,
        temperature,
        top_k,
        top_p,
        min_p,
        seed,
        step,
        (tokens, empty, logprobs),
        (pm, pz, pi, dx, dq, dv, ps, *cand),
        V,
        S,
        chunk,
        return_logprobs,
        split,
        split2,
        pdl,
        tuning,
        split and kinds in ("top_k", "filter"),
        kc,
    )
    return tokens, empty, (logprobs if return_logprobs else None)


__all__ = ["sample", "use_split"]
