"""Plain torch reference of every kernel in this package: the definition of what they compute.

Each function here is both the CPU fallback (``backend="torch"``) and the test oracle for the
Triton kernels. Docstrings state the behaviour as a Python loop over rows and tokens.

Random numbers are a pure function of ``(seed, step, token id)`` computed in 32-bit integer
arithmetic (:func:`uniform_noise`), written so that torch integer ops and Triton ``uint32`` ops
give identical bits. A sampled token is the Gumbel-max
``argmax_i (s_i - ln2 * log2(-log2(u_i)))`` over the kept tokens, so the Triton kernel and this
reference choose the same token for the same ``(seed, step)`` (up to float rounding of ``log``
on near-exact ties, which the tests have never hit).
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
# lowbias32 multipliers (Chris Wellons' hash-prospector; good avalanche for two multiplies)
_C1 = 0x21F0AAAD
_C2 = 0x735A2D97
# salts so that the row key of (seed=0, step=0) is not mix32(0)
_SALT_STEP = 0x9E3779B9
_SALT_TOKEN = 0x85EBCA6B
_LN2 = 0.6931471805599453


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32) and a 32-bit constant c, without int64 overflow."""
    lo = x * (c & 0xFFFF)  # < 2**48
    hi = ((x * (c >> 16)) & 0xFFFF) << 16  # only the low 16 bits survive the shift mod 2**32
    return (lo + hi) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash on int64 tensors holding uint32 values (same bits as the Triton one)."""
    x = x ^ (x >> 16)
    x = _mul32(x, _C1)
    x = x ^ (x >> 15)
    x = _mul32(x, _C2)
    x = x ^ (x >> 15)
    return x


def row_keys(seed: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two uint32 keys per row (as int64) from ``seed`` [B] int64 and ``step`` [B] int64."""
    seed = seed.to(torch.int64)
    step = step.to(torch.int64)
    k = mix32((step >> 32) & _M32 ^ _SALT_STEP)
    k = mix32((step & _M32) ^ k)
    k = mix32(((seed >> 32) & _M32) ^ k)
    k0 = mix32((seed & _M32) ^ k)
    k1 = mix32(k0 ^ _SALT_TOKEN)
    return k0, k1


def uniform_noise(seed: torch.Tensor, step: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """u [B, V] float32 in (0, 1): a counter-based hash of (seed[b], step[b], token id).

    ``for b, i: r = mix32(mix32((i + k0[b]) mod 2**32) ^ k1[b]); u = ((r >> 9) + 0.5) / 2**23``
    """
    k0, k1 = row_keys(seed, step)
    ids = torch.arange(vocab_size, dtype=torch.int64, device=seed.device)
    r = mix32(mix32((ids[None, :] + k0[:, None]) & _M32) ^ k1[:, None])
    return ((r >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)  # exact in float32, never 0 or 1


def gumbel_noise(seed: torch.Tensor, step: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """g [B, V] float32 = -ln2 * log2(-log2(u)) = Gumbel noise - ln2 * log2(ln2), from :func:`uniform_noise`.

    The constant shift does not change an argmax; base-2 logs are one fast instruction on GPUs.
    """
    u = uniform_noise(seed, step, vocab_size)
    return -_LN2 * torch.log2(-torch.log2(u))


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """allowed [B, V] bool from an int32 bitmask [B, ceil(V/32)]: bit i of word j allows token 32*j+i."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1  # [B, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def _rows_mask(
    bitmask: torch.Tensor, vocab_size: int, n_rows: int, indices: torch.Tensor | None
) -> torch.Tensor:
    """allowed [B, V]: the unpacked bitmask on the rows in ``indices`` (all rows if None), True elsewhere."""
    allowed = unpack_bitmask(bitmask, vocab_size)
    if indices is None:
        return allowed
    out = torch.ones(n_rows, vocab_size, dtype=torch.bool, device=bitmask.device)
    out[indices] = allowed[indices]
    return out


def apply_bitmask_(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> torch.Tensor:
    """Set disallowed logits to -inf, in place; returns ``logits``.

    ``for b in (indices if indices is not None else range(B)): for i in range(V):
    if not (bitmask[b, i // 32] >> (i % 32)) & 1: logits[b, i] = -inf``
    """
    allowed = _rows_mask(bitmask, logits.shape[1], logits.shape[0], indices)
    logits.masked_fill_(~allowed, float("-inf"))
    return logits


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Masked, filtered, seeded sampling; returns (tokens [B] int64, empty [B] bool, logprobs [B] | None).

    Arguments are already validated tensors of length B (see ``deepinfer.kernels.sample``).
    As a loop::

        for b in range(B):
            x = logits[b].float(); x[not allowed(b, i)] = -inf        # bitmask (rows in indices)
            if all(x == -inf): tokens[b] = -1; empty[b] = True; continue
            if temperature[b] == 0:
                tokens[b] = min(i for i if x[i] == max(x))              # greedy, lowest id on ties
                continue
            s = x * (1 / temperature[b]); m = max(s); e = exp(s - m); Z = sum(e)
            kept(i) = (s[i] > -inf
                       and count(j: s[j] > s[i]) < top_k[b]               # 0 disables
                       and (top_p[b] >= 1 or sum(e[j]: s[j] > s[i]) < top_p[b] * Z)
                       and e[i] >= min_p[b])                              # e[i] = p_i / p_max
            g = -ln2 * log2(-log2(u(seed[b], step[b], i)))              # gumbel_noise
            tokens[b] = argmax over kept i of s[i] + g[i]  (lowest id on ties)

    The three filters are thresholds on the same score, so the kept set is an upper set of
    the scores (ties at the boundary are all kept) and top-k / top-p / min-p are applied
    jointly to the tempered distribution (top-p's mass is that of the unfiltered
    distribution, as FlashInfer's ``filter_apply_order="joint"``). The token is then an
    exact sample from softmax(s) restricted to the kept set.
    ``logprobs[b] = log_softmax(x * (1/t))[tokens[b]]`` with ``t = temperature[b]`` or 1 when it
    is 0: the masked, tempered distribution before top-k / top-p / min-p; -inf on empty rows.
    """
    B, V = logits.shape
    x = logits.float()
    if bitmask is not None:
        x = x.masked_fill(~_rows_mask(bitmask, V, B, indices), float("-inf"))
    m_raw = x.max(dim=1).values
    empty = m_raw == float("-inf")
    greedy = temperature == 0
    tokens = x.argmax(dim=1)  # greedy rows (lowest id on ties); sampled rows replaced below

    # Only rows that sample pay for the noise, and only if some of them filter by top-k /
    # top-p for the sort: row-wise maths on a subset gives the same values bit for bit.
    rows = torch.nonzero(~greedy & ~empty).flatten()
    if rows.numel():
        xs = x[rows]
        s_rows = xs * (1.0 / temperature[rows]).float()[:, None]
        m_rows = s_rows.max(dim=1, keepdim=True).values
        e = torch.exp(s_rows - m_rows)  # 0 where masked
        kept = s_rows > float("-inf")
        k = top_k[rows].to(torch.int64)[:, None]
        p = top_p[rows].float()[:, None]
        if bool(((k > 0) | (p < 1)).any()):
            z_rows = e.sum(dim=1, keepdim=True)
            # count / mass strictly above each token, via one sort per row (the fast kernel
            # avoids it)
            sv, order = torch.sort(s_rows, dim=1, descending=True, stable=True)
            se = torch.exp(sv - m_rows)
            excl = torch.cumsum(se, dim=1) - se  # mass of positions before this one
            first = torch.searchsorted(-sv, -sv, side="left")  # first position of its tie group
            count_above = torch.empty_like(first).scatter_(1, order, first)
            mass_above = torch.empty_like(excl).scatter_(1, order, excl.gather(1, first))
            kept &= (k <= 0) | (count_above < k)
            kept &= (p >= 1) | (mass_above < p * z_rows)
        kept &= e >= min_p[rows].float()[:, None]
        key = torch.where(kept, s_rows + gumbel_noise(seed[rows], step[rows], V), float("-inf"))
        tokens[rows] = key.argmax(dim=1)
    tokens = torch.where(empty, torch.full_like(tokens, -1), tokens)
    logprobs = None
    if return_logprobs:
        inv_t = torch.where(greedy, torch.ones_like(temperature), 1.0 / temperature).float()
        s = x * inv_t[:, None]  # [B, V]
        m = s.max(dim=1, keepdim=True).values
        z = torch.exp(s - m).sum(dim=1, keepdim=True)
        lp = s.gather(1, tokens.clamp(min=0)[:, None]) - m - torch.log(z)
        logprobs = torch.where(empty, float("-inf"), lp[:, 0])
    return tokens, empty, logprobs
