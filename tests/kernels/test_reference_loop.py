"""The torch reference (the CPU sampler) against its docstring's loop, written out literally:
one row at a time, kept() as sums over the row's tokens, top-k's k-th largest score by a sort,
the draws one at a time. The
reference evaluates only the filters some row has on, draws once when no row has one, and
skips row copies; on random batches (greedy, sampling and emptied rows; every filter on and
off; bf16 and fp32) it must give the loop's tokens."""

from __future__ import annotations

import torch

from deepinfer.kernels import sample_reference


def _loop_row(x, temperature, top_k, top_p, min_p, seed, step) -> int:
    """The token of one row (x: masked float32 logits [V]; the rest [1] tensors)."""
    if bool((x == float("-inf")).all()):
        return -1
    if float(temperature) == 0:
        return int(torch.nonzero(x == x.max())[0])  # lowest id on ties
    s = x * (1.0 / temperature.float())
    e = torch.exp(s - s.max())  # 0 where masked
    z = e.sum()

    def kept(i: int) -> bool:
        above = s > s[i]
        return bool(
            s[i] > float("-inf")
            and (top_k <= 0 or above.sum() < top_k)
            and (top_p >= 1 or torch.where(above, e, 0.0).sum() < top_p.float() * z)
            and torch.exp(s[i] - s.max()) >= min_p.float()
        )

    def draw(j: int, low: float) -> int:
        mc, q, zq = sample_reference.chunk_weights(s[None], torch.tensor([low], dtype=torch.float32))
        t = sample_reference.draw_bits(seed, step, 2 * j + 2)
        return int(sample_reference.inverse_cdf(mc, q, zq, t[:, 2 * j], t[:, 2 * j + 1])[0])

    low, j = float("-inf"), 0
    n_allowed = int((s > float("-inf")).sum())
    if 0 < int(top_k) < len(s) and n_allowed >= int(top_k):  # top-k: draw from s >= the k-th largest
        v_k = sorted(s.tolist(), reverse=True)[int(top_k) - 1]
        low = float(torch.nextafter(torch.tensor(v_k), torch.tensor(float("-inf"))))
    while True:  # four draws, the first kept one; all cut: four more above the highest
        xs = [draw(i, low) for i in range(j, j + 4)]
        for i in xs:
            if kept(i):
                return i
        low, j = max(float(s[i]) for i in xs), j + 4


def _loop_sample(logits, bitmask, temperature, top_k, top_p, min_p, seed, step) -> list[int]:
    B, V = logits.shape
    allowed = (
        sample_reference.unpack_bitmask(bitmask, V)
        if bitmask is not None
        else torch.ones(B, V, dtype=torch.bool)
    )
    x = logits.float().masked_fill(~allowed, float("-inf"))
    return [
        _loop_row(x[b], *(a[b : b + 1] for a in (temperature, top_k, top_p, min_p, seed, step)))
        for b in range(B)
    ]


def test_reference_is_its_loop():
    g = torch.Generator().manual_seed(0)
    for it in range(40):
        B = int(torch.randint(1, 5, (1,), generator=g))
        V = int(torch.randint(5, 300, (1,), generator=g))
        logits = torch.randn(B, V, generator=g) * float(torch.rand(1, generator=g) * 4 + 0.2)
        if it % 3 == 0:
            logits = logits.to(torch.bfloat16)
        bitmask = None
        if it % 2:
            bitmask = torch.randint(-(2**31), 2**31 - 1, (B, (V + 31) // 32), generator=g).to(torch.int32)
            bitmask[0] = 0  # an emptied row
        temp = torch.where(torch.rand(B, generator=g) < 0.3, 0.0, torch.rand(B, generator=g) + 0.3)
        if it % 4 == 0:
            temp = torch.rand(B, generator=g) + 0.3  # every row samples (no row copies)
        top_k = torch.where(torch.rand(B, generator=g) < 0.5, 0, torch.randint(1, 20, (B,), generator=g))
        top_p = torch.where(torch.rand(B, generator=g) < 0.5, 1.0, torch.rand(B, generator=g) * 0.9 + 0.05)
        min_p = torch.where(torch.rand(B, generator=g) < 0.6, 0.0, torch.rand(B, generator=g) * 0.3)
        if it % 5 == 0:  # no filter anywhere: one draw
            top_k[:], top_p[:], min_p[:] = 0, 1.0, 0.0
        seed = torch.randint(0, 2**40, (B,), generator=g)
        step = torch.randint(0, 1000, (B,), generator=g)
        want = _loop_sample(logits, bitmask, temp, top_k, top_p, min_p, seed, step)
        got, empty, _ = sample_reference.sample(logits, bitmask, None, temp, top_k, top_p, min_p, seed, step)
        assert got.tolist() == want, (it, got.tolist(), want)
        assert empty.tolist() == [w == -1 for w in want]
