"""SampleArgs: a sampler call's per-row values and bitmask, packed in one buffer, read back on
the device side as the tensors they stand for; and the engine's draws with it equal the
sampler's own on the same values."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from deepinfer import kernels
from deepinfer.constraints.bitmask import unpack_bitmask
from deepinfer.sample_args import FLOATS, INTS, SampleArgs, buffer_words, header_words
from deepinfer.sampling_params import SamplingParams
from deepinfer.structured import MaskFiller


def _seqs(rng: random.Random, B: int) -> list:
    out = []
    for _ in range(B):
        p = SamplingParams(
            temperature=rng.choice([0.0, 0.7, 1.3]),
            top_k=rng.choice([0, 1, 50]),
            top_p=rng.choice([1.0, 0.9]),
            min_p=rng.choice([0.0, 0.05]),
            seed=rng.randrange(2**62),
        )
        out.append(SimpleNamespace(params=p, seed=p.seed, output_token_ids=[0] * rng.randrange(9)))
    return out


@pytest.mark.parametrize("B", [1, 3, 31, 64, 65])
def test_packed_values_read_back_as_written(B: int) -> None:
    rng = random.Random(B)
    width = 7
    seqs = _seqs(rng, B)
    buf = torch.empty(buffer_words(B, width), dtype=torch.int32)
    args = SampleArgs(buf, B, width)
    rows = (
        np.random.default_rng(B).integers(-(2**31), 2**31, size=(B, width), dtype=np.int64).astype(np.int32)
    )
    args.rows_np[:] = rows
    constrained = sorted(rng.sample(range(B), max(1, B // 2)))
    temperature, top_k, top_p, min_p = args.write(seqs, 2, constrained)
    i, f, bitmask = args.to(torch.device("cpu"), True)
    assert i.dtype == torch.int64 and i.shape == (INTS, B)
    assert f.dtype == torch.float32 and f.shape == (FLOATS, B)
    assert i[0].tolist() == top_k == [s.params.top_k for s in seqs]
    assert i[1].tolist() == [s.seed for s in seqs]
    assert i[2].tolist() == [len(s.output_token_ids) + 2 for s in seqs]
    assert i[3, : len(constrained)].tolist() == constrained
    assert torch.equal(f, torch.tensor([temperature, top_p, min_p], dtype=torch.float32))
    assert torch.equal(bitmask, torch.from_numpy(rows))
    # the bitmask's rows start 128-byte aligned, after the header
    assert header_words(B) % 32 == 0 and header_words(B) >= (2 * INTS + FLOATS) * B
    assert bitmask.storage_offset() == header_words(B)


def test_header_only_buffer_has_no_bitmask() -> None:
    seqs = _seqs(random.Random(0), 5)
    args = SampleArgs.new(5)
    args.write(seqs, 0, [])
    i, f, bitmask = args.to(torch.device("cpu"), False)
    assert bitmask is None and args.rows is None
    assert i[1].tolist() == [s.seed for s in seqs]


def test_mask_filler_views_grow_with_the_batch() -> None:
    """The filler's views for a batch size are its buffer's; a larger batch gets a larger buffer
    and new views, whose rows keep the bitmask's width."""
    filler = MaskFiller(100, pin=False, inline=True)
    small = filler.args(3)
    assert small.rows.shape == (3, 4) and filler.args(3) is small
    big = filler.args(200)
    assert big.rows.shape == (200, 4) and filler.args(3) is not small
    assert filler.args(3).rows.data_ptr() == big.packed.data_ptr() + header_words(3) * 4


def test_draws_from_packed_values_equal_the_sampler_on_tensors() -> None:
    """The fused sampler (torch reference on the CPU) draws the same tokens from the packed
    values as from the tensors built one by one."""
    rng = random.Random(7)
    B, V = 12, 300
    W = (V + 31) // 32
    seqs = _seqs(rng, B)
    logits = torch.randn(B, V, generator=torch.Generator().manual_seed(1))
    allowed = torch.rand(B, V, generator=torch.Generator().manual_seed(2)) < 0.3
    bits = np.zeros((B, W * 32), dtype=np.uint8)
    bits[:, :V] = allowed.numpy()
    rows = np.packbits(bits, axis=1, bitorder="little").view(np.int32)  # bit i of word j: token 32j + i
    assert (unpack_bitmask(rows, V) == allowed.numpy()).all()
    constrained = [0, 2, 3, 7, 11]
    args = SampleArgs(torch.empty(buffer_words(B, W), dtype=torch.int32), B, W)
    args.rows_np[:] = rows
    temperature, top_k, top_p, min_p = args.write(seqs, 0, constrained)
    i, f, bitmask = args.to(torch.device("cpu"), True)
    got = kernels.sample(
        logits, bitmask=bitmask, indices=i[3, : len(constrained)], temperature=f[0], top_k=i[0],
        top_p=f[1], min_p=f[2], seed=i[1], step=i[2],
    ).tokens  # fmt: skip
    want = kernels.sample(
        logits,
        bitmask=torch.from_numpy(rows.copy()),
        indices=torch.tensor(constrained),
        temperature=torch.tensor(temperature, dtype=torch.float32),
        top_k=torch.tensor(top_k),
        top_p=torch.tensor(top_p, dtype=torch.float32),
        min_p=torch.tensor(min_p, dtype=torch.float32),
        seed=torch.tensor([s.seed for s in seqs]),
        step=torch.tensor([len(s.output_token_ids) for s in seqs]),
    ).tokens
    assert torch.equal(got, want)
    for r in constrained:
        assert allowed[r, got[r]]


@pytest.mark.gpu
def test_pinned_buffer_copies_once_to_the_device() -> None:
    """On CUDA the filler's pinned buffer goes over in one copy: the device's views hold what
    the host wrote; a header-only buffer goes over the same way."""
    rng = random.Random(3)
    B, W = 9, 5
    seqs = _seqs(rng, B)
    filler = MaskFiller(W * 32, pin=True, inline=True)
    args = filler.args(B)
    assert args.packed.is_pinned()
    args.rows_np[:] = np.arange(B * W, dtype=np.int32).reshape(B, W)
    args.write(seqs, 1, [1, 4])
    i, f, bitmask = args.to(torch.device("cuda"), True)
    assert i.device.type == "cuda"
    assert i[1].tolist() == [s.seed for s in seqs] and i[3, :2].tolist() == [1, 4]
    assert bitmask.cpu().tolist() == np.arange(B * W).reshape(B, W).tolist()
    assert f[0].tolist() == pytest.approx([s.params.temperature for s in seqs])
    head = SampleArgs.new(B)
    head.write(seqs, 0, [])
    i, f, bitmask = head.to(torch.device("cuda"), False)
    assert bitmask is None and i[2].tolist() == [len(s.output_token_ids) for s in seqs]
