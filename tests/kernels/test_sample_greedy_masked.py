"""The torch sampler's greedy rows under a bitmask (the CPU path, and DSpark's verify of greedy
rows): a row whose mask allows its argmax over the whole vocabulary keeps that token without
being masked; the others are masked and searched again. On random batches it must give the
tokens of the definition (mask, then the lowest id among the maxima; -1 where the mask allows
nothing), and it must mask only the rows whose argmax their mask refuses."""

from __future__ import annotations

import pytest
import torch

from deepinfer.kernels import sample_reference, verify_reference
from deepinfer.kernels.bitmask_reference import pack_bitmask


def _definition(logits: torch.Tensor, allowed: torch.Tensor) -> tuple[list[int], list[bool]]:
    x = logits.float().masked_fill(~allowed, float("-inf"))
    tokens, empty = [], []
    for row in x:
        if bool((row == float("-inf")).all()):
            tokens.append(-1)
            empty.append(True)
        else:
            tokens.append(int(torch.nonzero(row == row.max())[0]))
            empty.append(False)
    return tokens, empty


def _greedy(logits, bitmask, indices=None, return_logprobs=False):
    B = logits.shape[0]
    return sample_reference.sample(
        logits,
        bitmask,
        indices,
        temperature=torch.zeros(B),
        top_k=torch.zeros(B, dtype=torch.int64),
        top_p=torch.ones(B),
        min_p=torch.zeros(B),
        seed=torch.zeros(B, dtype=torch.int64),
        step=torch.zeros(B, dtype=torch.int64),
        return_logprobs=return_logprobs,
    )


def _allowed(g: torch.Generator, B: int, V: int, kind: str) -> torch.Tensor:
    if kind == "random":
        return torch.rand(B, V, generator=g) < 0.5
    if kind == "dense":
        return torch.rand(B, V, generator=g) < 0.97
    if kind == "sparse":
        return torch.rand(B, V, generator=g) < 0.01
    assert kind == "mixed"  # rows of every kind, one allowing nothing, one everything
    a = torch.rand(B, V, generator=g) < torch.rand(B, 1, generator=g)
    a[0] = False
    a[-1] = True
    return a


@pytest.mark.parametrize("kind", ["random", "dense", "sparse", "mixed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [97, 1000, 4096])
def test_greedy_masked_matches_the_definition(kind, dtype, V):
    g = torch.Generator().manual_seed(V + len(kind))
    for trial in range(6):
        B = 1 + trial * 3
        # small integers: many ties, so "lowest id among the maxima" is exercised
        logits = torch.randint(-4, 4, (B, V), generator=g).to(dtype)
        if trial % 2:
            logits = torch.randn(B, V, generator=g).to(dtype)
        if trial == 5:
            logits[0] = float("-inf")  # a row with nothing finite
        allowed = _allowed(g, B, V, kind)
        bitmask = pack_bitmask(allowed)
        out = _greedy(logits, bitmask)
        tokens, empty = _definition(logits, allowed)
        assert out[0].tolist() == tokens
        assert out[1].tolist() == empty
        # only some rows constrained: the others take their argmax whatever their mask says
        indices = torch.arange(0, B, 2)
        rows_allowed = torch.ones(B, V, dtype=torch.bool)
        rows_allowed[indices] = allowed[indices]
        out = _greedy(logits, bitmask, indices)
        tokens, empty = _definition(logits, rows_allowed)
        assert out[0].tolist() == tokens
        assert out[1].tolist() == empty
        # the path that masks every row (logprobs asked for) gives the same tokens
        full = _greedy(logits, bitmask, indices, return_logprobs=True)
        assert full[0].tolist() == tokens


def test_only_rows_whose_argmax_is_refused_are_masked(monkeypatch):
    g = torch.Generator().manual_seed(0)
    B, V = 16, 49_152
    logits = torch.randn(B, V, generator=g)
    top = logits.argmax(dim=1)
    allowed = torch.rand(B, V, generator=g) < 0.5
    allowed[torch.arange(B), top] = True  # every row's argmax allowed ...
    allowed[3, top[3]] = False  # ... but two rows'
    allowed[11, top[11]] = False
    masked_rows = []
    unpack = sample_reference.unpack_bitmask
    rows_mask = sample_reference.rows_mask

    def counting_unpack(bitmask, vocab_size):
        masked_rows.append(bitmask.shape[0])
        return unpack(bitmask, vocab_size)

    def counting_rows_mask(bitmask, vocab_size, n_rows, indices):
        masked_rows.append(n_rows)
        return rows_mask(bitmask, vocab_size, n_rows, indices)

    monkeypatch.setattr(sample_reference, "unpack_bitmask", counting_unpack)
    monkeypatch.setattr(sample_reference, "rows_mask", counting_rows_mask)
    out = _greedy(logits, pack_bitmask(allowed))
    assert sum(masked_rows) == 2
    tokens, _ = _definition(logits, allowed)
    assert out[0].tolist() == tokens
    assert out[0][3] != top[3] and out[0][0] == top[0]


@pytest.mark.parametrize("kind", ["random", "sparse", "mixed"])
@pytest.mark.parametrize("constrained", [None, [0, 2, 3]])
def test_greedy_verify_matches_the_definition(kind, constrained):
    """DSpark's verify of greedy rows takes the same path: each position's target is the masked
    argmax, and the drafts are accepted up to the first that differs from it."""
    g = torch.Generator().manual_seed(len(kind))
    B, K, V = 5, 4, 1000
    logits = torch.randint(-4, 4, (B, K + 1, V), generator=g).float()
    allowed = _allowed(g, B * (K + 1), V, kind).view(B, K + 1, V)
    bitmask = pack_bitmask(allowed.view(B * (K + 1), V)).view(B, K + 1, -1)
    indices = None
    if constrained is not None:  # rows outside the list take their unmasked argmax
        indices = torch.tensor(constrained)
        allowed = allowed.clone()
        allowed[[b for b in range(B) if b not in constrained]] = True
    targets = torch.tensor(_definition(logits.view(-1, V), allowed.view(-1, V))[0]).view(B, K + 1)
    drafts = targets[:, :K].clone()
    drafts[1, 1] = (drafts[1, 1] + 1) % V  # row 1 diverges at its second draft
    num_drafts = torch.tensor([4, 4, 2, 0, 3])
    z = torch.zeros(B)
    accepted, bonus, tokens = verify_reference.verify(
        logits, drafts, num_drafts, bitmask, indices, z, z.long(), z + 1, z, z.long(), z.long()
    )
    for b in range(B):
        n = int(num_drafts[b])
        acc = next((k for k in range(n) if targets[b, k] != drafts[b, k]), n)
        assert int(accepted[b]) == acc
        assert int(bonus[b]) == int(targets[b, acc])
        assert tokens[b, : n + 1].tolist() == targets[b, : n + 1].tolist()


def test_greedy_verify_masks_no_row_whose_argmax_is_allowed(monkeypatch):
    g = torch.Generator().manual_seed(1)
    B, K, V = 4, 3, 4096
    logits = torch.randn(B, K + 1, V, generator=g)
    allowed = torch.rand(B, K + 1, V, generator=g) < 0.3
    top = logits.argmax(dim=2)
    allowed.view(-1, V)[torch.arange(B * (K + 1)), top.view(-1)] = True
    bitmask = pack_bitmask(allowed.view(-1, V)).view(B, K + 1, -1)
    masked = []

    def counting(bitmask, vocab_size, *rest):
        masked.append(bitmask.shape[0])
        raise AssertionError("a row whose argmax its mask allows was masked")

    monkeypatch.setattr(verify_reference, "rows_mask", counting)
    monkeypatch.setattr(sample_reference, "unpack_bitmask", counting)
    monkeypatch.setattr(sample_reference, "rows_mask", counting)
    z = torch.zeros(B)
    accepted, bonus, tokens = verify_reference.verify(
        logits, top[:, :K], torch.full((B,), K), bitmask, None, z, z.long(), z + 1, z, z.long(), z.long()
    )
    assert masked == []
    assert accepted.tolist() == [K] * B
    assert tokens.tolist() == top.tolist()
