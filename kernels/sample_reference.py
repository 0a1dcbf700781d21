"""Plain torch reference of the sampling kernels: the definition of what ``sample_triton``
computes.

Each function here is both the CPU fallback (``backend="torch"``) and the test oracle for the
Triton kernels. Docstrings state the behaviour as a Python loop over rows and tokens.

Random numbers are a pure function of ``(seed, step, hash id)`` computed in 32-bit integer
arithmetic (:func:`draw_bits`), written so that torch integer ops and Triton ``uint32`` ops
give identical bits. A sampled token is an inverse-CDF draw over integer weights: the
vocabulary is cut into chunks of :func:`chunk_size` tokens, a token's weight is
``floor(exp(s_i - chunk max) * 2**32)`` and a chunk's is its weight sum scaled by
``exp(chunk max - max)``, so every running sum is an exact integer, the same in any summation
order: the Triton kernels (split over chunks or not) and this reference choose the same token
(up to float rounding of ``exp``, which moves a weight by a few units in 2**32).
"""

from __future__ import annotations

import torch

from .bitmask_reference import rows_mask, unpack_bitmask

_M32 = 0xFFFFFFFF
# exp's argument floor: exp(-87.33) is float32's smallest normal (2**-126) or just above. On
# the CPU, torch's vectorised exp leaves its fast path below about -87.4: a row with masked
# tokens (-inf) or scores far below its max took 4 to 100 times as long (denormal and 0
# results). exp of the floor is 0 in a token's 2**32 quanta, and adds nothing a float32 sum of
# terms that include exp(0) = 1 can show, so the clamp changes no result here.
EXP_FLOOR = -87.33


def _exp(d: torch.Tensor) -> torch.Tensor:
    """exp(max(d, EXP_FLOOR)) of a fresh tensor d, in its place (a row-sized temporary fewer)."""
    return d.clamp_min_(EXP_FLOOR).exp_()


# lowbias32 multipliers (Chris Wellons' hash-prospector; good avalanche for two multiplies)
_C1 = 0x21F0AAAD
_C2 = 0x735A2D97
# salts so that the row key of (seed=0, step=0) is not mix32(0)
_SALT_STEP = 0x9E3779B9
_SALT_TOKEN = 0x85EBCA6B


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32) and a 32-bit constant c, without int64 overflow
    (a Python int x gives the same)."""
    lo = x * (c & 0xFFFF)  # < 2**48
    hi = ((x * (c >> 16)) & 0xFFFF) << 16  # only the low 16 bits survive the shift mod 2**32
    return (lo + hi) & _M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash on int64 tensors holding uint32 values, or on a Python int (same bits
    as the Triton one)."""
    x = x ^ (x >> 16)
    x = _mul32(x, _C1)
    x = x ^ (x >> 15)
    x = _mul32(x, _C2)
    x = x ^ (x >> 15)
    return x


def row_keys(seed: torch.Tensor, step: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two uint32 keys per row (as int64) from ``seed`` [B] int64 and ``step`` [B] int64."""
    return _keys(seed.to(torch.int64), step.to(torch.int64))


def _keys(seed, step):
    """`row_keys` of int64 tensors, or of one row's Python ints."""
    k = mix32((step >> 32) & _M32 ^ _SALT_STEP)
    k = mix32((step & _M32) ^ k)
    k = mix32(((seed >> 32) & _M32) ^ k)
    k0 = mix32((seed & _M32) ^ k)
    k1 = mix32(k0 ^ _SALT_TOKEN)
    return k0, k1


HOST_DRAW_ROWS = 16  # CPU calls of at most this many rows hash in Python ints (draw_bits)


def _draw_bits_host(seed: torch.Tensor, step: torch.Tensor, n: int) -> torch.Tensor:
    """`draw_bits` in Python ints, row by row: the same arithmetic and bits. On tensors a hash is
    about 40 torch ops on a few elements each, 0.3-0.6 ms on the CPU whatever the rows; on ints
    it takes some tens of µs a row."""
    out = []
    for sd, st in zip(seed.tolist(), step.tolist()):
        k0, k1 = _keys(sd, st)
        out.append([(mix32(mix32((j + k0) & _M32) ^ k1) >> 9) * 2 + 1 for j in range(n)])
    return torch.tensor(out, dtype=torch.int64).view(len(out), n)


def draw_bits(seed: torch.Tensor, step: torch.Tensor, n: int) -> torch.Tensor:
    """t [B, n] int64, odd, in (0, 2**24): a counter-based hash of (seed[b], step[b], hash id j).

    ``for b, j: r = mix32(mix32((j + k0[b]) mod 2**32) ^ k1[b]); t = 2 * (r >> 9) + 1``; the
    uniform of id j is ``u = t / 2**24`` (exact in float32, never 0 or 1).
    """
    if seed.device.type == "cpu" and seed.numel() <= HOST_DRAW_ROWS:
        return _draw_bits_host(seed, step, n)
    k0, k1 = row_keys(seed, step)
    ids = torch.arange(n, dtype=torch.int64, device=seed.device)
    r = mix32(mix32((ids[None, :] + k0[:, None]) & _M32) ^ k1[:, None])
    return (r >> 9) * 2 + 1


# sample(kinds=...) hints, fewest launches first (the Triton path's; this reference needs none)
KINDS = ("greedy", "plain", "top_k", "sample", "top_p", "filter")
# tokens per chunk of the inverse-CDF draws (part of what a seed samples): the default of
# ``SampleTuning.chunk_max``, which both backends take
CHUNK_MAX = 4096


def chunk_size(vocab_size: int, chunk_max: int = CHUNK_MAX) -> int:
    """Tokens per chunk: ``min(chunk_max, next power of 2 >= vocab_size)``."""
    return min(chunk_max, 1 << max(vocab_size - 1, 0).bit_length())


def scale_bits(total: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """floor(total * t / 2**24), exactly, for int64 total < 2**50 and t < 2**24 (no overflow)."""
    return (total >> 24) * t + (((total & 0xFFFFFF) * t) >> 24)


def chunk_weights(
    s: torch.Tensor, low: torch.Tensor, chunk_max: int = CHUNK_MAX
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scores s [R, V] (-inf where not allowed) -> (chunk max [R, S], token quanta [R, S, C],
    chunk quanta sums [R, S]): ``q_i = floor(exp(s_i - chunk max) * 2**32)`` on {s > low[r]},
    0 elsewhere; chunks of :func:`chunk_size` tokens, the last padded with -inf."""
    R, V = s.shape
    C = chunk_size(V, chunk_max)
    S = -(-V // C)
    if S * C == V:  # no padding: a view
        s3 = s.float().contiguous().view(R, S, C)
    else:
        s3 = torch.full((R, S * C), float("-inf"), dtype=torch.float32, device=s.device)
        s3[:, :V] = s
        s3 = s3.view(R, S, C)
    mc = s3.amax(dim=2)
    safe = torch.where(mc == float("-inf"), torch.zeros_like(mc), mc)
    q = _exp(s3 - safe[:, :, None]).mul_(4294967296.0).to(torch.int64)
    if bool((low > float("-inf")).any()):  # (at low = -inf only s = -inf is cut, whose q is 0)
        q = torch.where(s3 > low[:, None, None], q, torch.zeros_like(q))
    return mc, q, q.sum(dim=2)


def inverse_cdf(mc: torch.Tensor, q: torch.Tensor, z: torch.Tensor, t_chunk: torch.Tensor,
                t_token: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """One draw per row from :func:`chunk_weights` -> token ids [R]: the chunk c with
    ``cum_{c-1} <= floor(W * t_chunk / 2**24) < cum_c`` over the chunk weights
    ``W_c = int64(float32(z_c) * exp(mc_c - max mc))``, then the token of chunk c whose running
    quanta sum passes ``floor(z_c * t_token / 2**24)`` the same way. With t_chunk and t_token
    [R, n]: n draws a row, [R, n] (integer sums: each draw's token is the one it gets alone)."""
    R, S, C = q.shape
    one = t_chunk.dim() == 1
    t_chunk, t_token = (t_chunk[:, None], t_token[:, None]) if one else (t_chunk, t_token)
    m = mc.amax(dim=1, keepdim=True)
    safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    w = (z.to(torch.float32) * torch.exp(mc - safe)).to(torch.int64)
    w = torch.where(mc == float("-inf"), torch.zeros_like(w), w)
    cum = torch.cumsum(w, dim=1)
    c = (cum[:, None, :] <= scale_bits(cum[:, -1:], t_chunk)[:, :, None]).sum(dim=2)  # [R, n]
    r = torch.arange(R, device=q.device)[:, None]
    cq = torch.cumsum(q[r, c], dim=2)  # [R, n, C]
    i = (cq <= scale_bits(z[r, c], t_token)[:, :, None]).sum(dim=2)
    x = c * C + i
    return x[:, 0] if one else x


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
    chunk_max: int = CHUNK_MAX,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Masked, filtered, seeded sampling; returns (tokens [B] int64, empty [B] bool, logprobs [B] | None).

    Arguments are already validated tensors of length B (see ``deepinfer.kernels.sample``);
    ``chunk_max`` is ``SampleTuning.chunk_max`` (the chunks of :func:`inverse_cdf`). As a loop::

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
            t = draw_bits(seed[b], step[b], ...)                          # hash ids 0, 1, 2, ...
            low = -inf
            if 0 < top_k[b] < V and count(s > -inf) >= top_k[b]:        # top-k: draw only above
                low = nextafter(v_k, -inf)  # v_k: the k-th largest s, with multiplicity; s > low
                                            # is s >= v_k: exactly the tokens top-k keeps
            x_j = inverse_cdf(s, low, t[2j], t[2j + 1]) for j in 0..3    # x_j ~ softmax(s) on s > low
            if some x_j is kept: tokens[b] = the first kept x_j; continue
            low = max(s[x_0..x_3]); j = 4                                 # all cut: so is s <= low
            while True:                                                   # rounds of four draws
                x_i = inverse_cdf(s, low, t[2i], t[2i + 1]) for i in j..j+3  # ~ softmax(s) on s > low
                if some x_i is kept: tokens[b] = the first kept x_i; break
                low = max(s[x_j..x_j+3]); j += 4

    The three filters are thresholds on the same score, so the kept set is an upper set of
    the scores (ties at the boundary are all kept) and top-k / top-p / min-p are applied
    jointly to the tempered distribution (top-p's mass is that of the unfiltered
    distribution, as FlashInfer's ``filter_apply_order="joint"``). The token is then a sample
    from softmax(s) restricted to the kept set (rejection sampling: the first kept draw). With
    top-k the draws start from the top-k set itself (a superset of the kept set), found by the
    k-th largest score: the top-k test then never cuts, and no round is spent on it.
    ``logprobs[b] = log_softmax(x * (1/t))[tokens[b]]`` with ``t = temperature[b]`` or 1 when it
    is 0: the masked, tempered distribution before top-k / top-p / min-p; -inf on empty rows.
    """
    B, V = logits.shape
    x = logits.float()
    greedy = temperature == 0
    if bitmask is not None:
        if not return_logprobs and bool(greedy.all()):
            return (*greedy_masked(x, bitmask, indices), None)
        x = x.masked_fill(~rows_mask(bitmask, V, B, indices), float("-inf"))
    if bool(greedy.any()):  # greedy rows' tokens (lowest id on ties); sampled rows replaced below
        m_raw, tokens = x.max(dim=1)  # (one pass: on the CPU max and argmax each cost ~0.1 ms a row)
    else:
        m_raw = x.amax(dim=1)
        tokens = torch.zeros(B, dtype=torch.int64, device=x.device)
    empty = m_raw == float("-inf")

    # Only rows that sample pay for the draws; kept() is evaluated at the drawn tokens only
    # (count and mass above one score are a masked sum: no sort of the vocabulary)
    rows = torch.nonzero(~greedy & ~empty).flatten()
    if rows.numel():
        sel = slice(None) if rows.numel() == B else rows  # every row samples: views, no copies
        s_rows = x[sel] * (1.0 / temperature[sel]).float()[:, None]
        keep = _Kept(s_rows, top_k[sel].to(torch.int64), top_p[sel].float(), min_p[sel].float())
        tokens[sel] = _draw_kept(s_rows, keep, seed[sel], step[sel], chunk_max)
    tokens = torch.where(empty, torch.full_like(tokens, -1), tokens)
    logprobs = None
    if return_logprobs:
        inv_t = torch.where(greedy, torch.ones_like(temperature), 1.0 / temperature).float()
        s = x * inv_t[:, None]  # [B, V]
        m = s.amax(dim=1, keepdim=True)
        z = _exp(s - m).sum(dim=1, keepdim=True)
        lp = s.gather(1, tokens.clamp(min=0)[:, None]) - m - torch.log(z)
        logprobs = torch.where(empty, float("-inf"), lp[:, 0])
    return tokens, empty, logprobs


def greedy_masked(
    x: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample`'s (tokens, empty) where every row is greedy, without masking every row
    (also DSpark's verify of greedy rows: ``verify_reference``).
    A row's argmax over the whole vocabulary (lowest id on ties) is its argmax over the
    tokens its mask allows whenever the mask allows it: an allowed token as large is a
    maximum too, and none has a lower id. So only the rows whose mask refuses their argmax
    are masked and searched again (every row, where more than a quarter are). Masking a row
    costs more than the search itself on the CPU (``masked_fill`` of a 49,152-token row:
    about 50 µs); a model that follows its constraint rarely needs the second search."""
    B, V = x.shape
    m, tokens = x.max(dim=1)
    rows = torch.arange(B, device=x.device) if indices is None else indices.to(torch.int64)
    t = tokens[rows]
    words = bitmask[rows, t >> 5].to(torch.int64)
    refused = rows[((words >> (t & 31)) & 1) == 0]
    if 4 * refused.numel() > B:  # many: every row masked at once (no copies of rows)
        m, tokens = x.masked_fill(~rows_mask(bitmask, V, B, indices), float("-inf")).max(dim=1)
    elif refused.numel():
        xr = x[refused].masked_fill(~unpack_bitmask(bitmask[refused], V), float("-inf"))
        m[refused], tokens[refused] = xr.max(dim=1)
    empty = m == float("-inf")
    return torch.where(empty, torch.full_like(tokens, -1), tokens), empty


class _Kept:
    """kept(i) of :func:`sample` for sampling rows s [R, V], evaluated at given tokens: count and
    mass of the scores strictly above s_i against top-k / top-p, and e_i against min-p. A filter
    no row has on is not evaluated (without any, every allowed token is kept)."""

    def __init__(self, s: torch.Tensor, k: torch.Tensor, p: torch.Tensor, mp: torch.Tensor):
        self.s, self.k, self.p, self.mp = s, k, p, mp
        self.k_on = bool(((k > 0) & (k < s.shape[1])).any())  # (top-k >= V keeps every token)
        self.p_on = bool((p < 1).any())
        self.mp_on = bool((mp > 0).any())
        self.any_on = self.k_on or self.p_on or self.mp_on
        if self.p_on or self.mp_on:
            self.m = s.amax(dim=1)  # (max with its indices costs 15 times as much on the CPU)
        if self.p_on:
            self.e = _exp(s - self.m[:, None])  # (masked: exp(EXP_FLOOR), never "above")
            self.z = self.e.sum(dim=1)

    def __call__(self, rows: torch.Tensor | None, tok: torch.Tensor) -> torch.Tensor:
        """[n] bool: is token tok[i] of row rows[i] kept (rows None: row i)."""
        s = self.s if rows is None else self.s[rows]
        pick = (lambda t: t) if rows is None else (lambda t: t[rows])  # noqa: E731
        q = s.gather(1, tok[:, None])
        ok = q[:, 0] > float("-inf")
        if self.k_on or self.p_on:
            above = s > q
            if self.k_on:
                k = pick(self.k)
                ok &= (k <= 0) | (above.sum(dim=1) < k)
            if self.p_on:
                p = pick(self.p)
                mass = (pick(self.e) * above).sum(
                    dim=1
                )  # (e is finite: the masked sum, 4x faster than where)
                ok &= (p >= 1) | (mass < p * pick(self.z))
        if self.mp_on:
            ok &= torch.exp(q[:, 0] - pick(self.m)) >= pick(self.mp)
        return ok


def topk_low(s: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[R] float32: the score just below the k-th largest of each row of s [R, V] (with
    multiplicity; ``nextafter(v_k, -inf)``), so that ``s > low`` is exactly the set top-k keeps;
    -inf where top-k is off (k <= 0 or k >= V) or the row has fewer than k allowed tokens."""
    R, V = s.shape
    on = (k > 0) & (k < V) & ((s > float("-inf")).sum(dim=1) >= k)
    low = torch.full((R,), float("-inf"), device=s.device)
    if bool(on.any()):
        kmax = int(k[on].max())
        vals = s.topk(kmax, dim=1).values  # [R, kmax], descending
        v = vals.gather(1, (k.clamp(1, kmax) - 1)[:, None])[:, 0]
        below = torch.nextafter(v, torch.full_like(v, float("-inf")))
        low = torch.where(on, below, low)
    return low


def _draw_kept(
    s: torch.Tensor, kept: _Kept, seed: torch.Tensor, step: torch.Tensor, chunk_max: int
) -> torch.Tensor:
    """The first kept of four inverse-CDF draws per row, then rounds of four (see :func:`sample`)."""
    R = s.shape[0]
    low0 = topk_low(s, kept.k) if kept.k_on else torch.full((R,), float("-inf"), device=s.device)
    mc, q, z = chunk_weights(s, low0, chunk_max)
    t = draw_bits(seed, step, 8)
    if not kept.any_on:  # no filter: every drawn token is kept, the first one is the token
        return inverse_cdf(mc, q, z, t[:, 0], t[:, 1])
    x = inverse_cdf(mc, q, z, t[:, 0:8:2], t[:, 1:8:2])  # [R, 4]: draws 0..3
    tokens = x[:, 0].clone()
    cut = ~kept(None, x[:, 0])  # rows whose draws so far were all cut: draw j tested on those only
    for j in range(1, 4):
        rows = cut.nonzero().flatten()
        if not rows.numel():
            break
        ok = kept(rows, x[rows, j])
        tokens[rows[ok]] = x[rows[ok], j]
        cut[rows[ok]] = False
    for r in cut.nonzero().flatten().tolist():  # all four cut: rare
        low = s[r, x[r]].max()
        j = 4
        r4 = torch.full((4,), r, device=s.device)
        while True:  # rounds of four draws from {s > low}, tested together
            mc_r, q_r, z_r = chunk_weights(s[r : r + 1], low[None], chunk_max)
            t = draw_bits(seed[r : r + 1], step[r : r + 1], 2 * j + 8)
            xs = inverse_cdf(mc_r, q_r, z_r, t[:, 2 * j : 2 * j + 8 : 2], t[:, 2 * j + 1 : 2 * j + 8 : 2])[0]
            ok = kept(r4, xs)
            if bool(ok.any()):
                tokens[r] = xs[int(ok.to(torch.int8).argmax())]
                break
            low = s[r, xs].max()
            j += 4
    return tokens


__all__ = [
    "CHUNK_MAX",
    "KINDS",
    "chunk_size",
    "chunk_weights",
    "draw_bits",
    "inverse_cdf",
    "mix32",
    "row_keys",
    "sample",
    "scale_bits",
    "topk_low",
    "unpack_bitmask",
]
