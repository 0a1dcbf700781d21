"""DSpark verification kernel: Triton == torch reference token for token, the reference equals
its definition (sample() at each position + longest matching prefix), ragged drafts, masks per
position, index lists, strides, dtypes, empty positions, argument errors."""

from __future__ import annotations

import pytest
import torch

from deepinfer import kernels
from deepinfer.kernels.bitmask_reference import unpack_bitmask

from ._util import random_bitmask

B, K = 4, 3
# (id, V, dtype, sampling args per row)
CASES = [
    ("greedy", 100, torch.float32, dict(temperature=0.0)),
    ("sampled", 70, torch.float32, dict(temperature=[1.0, 0.5, 0.0, 2.0])),
    ("filters", 45, torch.bfloat16, dict(temperature=0.8, top_k=[1, 5, 0, 9], top_p=[1.0, 0.9, 0.5, 1.0],
                                         min_p=[0.0, 0.0, 0.1, 0.05])),
    ("fp16-wide", 1030, torch.float16, dict(temperature=[0.0, 1.0, 0.7, 1.2], top_p=0.95)),
]  # fmt: skip


def _inputs(V: int, dtype: torch.dtype, seed: int = 0, match: float = 0.7):
    """Logits [B, K+1, V], drafts [B, K] that equal the greedy target with probability `match`
    (so some rows accept several drafts), per-position masks with an empty position."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, K + 1, V, generator=gen) * 3).to(dtype)
    bitmask = random_bitmask(B * (K + 1), V, 0.6, gen).view(B, K + 1, -1)
    bitmask[3, 2] = 0  # row 3: nothing allowed at position 2
    masked = logits.float().masked_fill(
        ~unpack_bitmask(bitmask.view(B * (K + 1), -1), V).view(B, K + 1, V), float("-inf")
    )
    drafts = masked.argmax(-1)[:, :K]
    noise = torch.randint(0, V, (B, K), generator=gen)
    drafts = torch.where(torch.rand(B, K, generator=gen) < match, drafts, noise)
    return logits, drafts, bitmask


def _verify(impl, logits, drafts, **kw):
    backend, device = impl
    kw.setdefault("seed", torch.arange(10, 10 + logits.shape[0]))
    kw.setdefault("step", torch.tensor([0, 3, 17, 1 << 40]))
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    out = kernels.verify(logits.to(device), drafts.to(device), backend=backend, **kw)
    return kernels.VerifyOutput(*(t.cpu() for t in out))


def _equal(got, want):
    for name in ("accepted", "bonus", "tokens"):
        g, w = getattr(got, name), getattr(want, name)
        assert g.dtype == torch.int64, name
        torch.testing.assert_close(g, w, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_reference(impl, case):
    _, V, dtype, args = case
    logits, drafts, bitmask = _inputs(V, dtype)
    n = torch.tensor([3, 2, 0, 3])
    # target tokens do not depend on the drafts: draft them (mostly) so that prefixes get accepted
    target = _verify(("torch", "cpu"), logits, drafts, bitmask=bitmask, num_drafts=n, **args).tokens[:, :K]
    right = torch.tensor([[1, 1, 1], [1, 0, 1], [1, 1, 1], [1, 1, 0]]).bool()
    drafts = torch.where(right, target, (target + 1) % V)
    want = _verify(("torch", "cpu"), logits, drafts, bitmask=bitmask, num_drafts=n, **args)
    got = _verify(impl, logits, drafts, bitmask=bitmask, num_drafts=n, **args)
    _equal(got, want)
    assert (want.tokens[2, 1:] == -1).all() and (want.tokens[1, 3] == -1)  # past num_drafts
    assert want.accepted.tolist() == [3, 1, 0, 2]  # all, up to a wrong draft, none drafted, empty position


def test_reference_is_sample_at_each_position():
    """The definition: position k's target token is sample() with step + k; drafts are accepted
    up to the first mismatch; the bonus is the target token there."""
    V = 300
    logits, drafts, bitmask = _inputs(V, torch.float32, seed=3, match=0.8)
    temperature = torch.tensor([0.0, 0.9, 1.0, 0.0])
    seed, step = torch.tensor([5, 6, 7, 8]), torch.tensor([0, 4, 9, 2])
    out = kernels.verify(logits, drafts, bitmask=bitmask, temperature=temperature, top_p=0.9,
                         seed=seed, step=step, backend="torch")  # fmt: skip
    for k in range(K + 1):
        s = kernels.sample(
            logits[:, k],
            bitmask=bitmask[:, k].contiguous(),
            temperature=temperature,
            top_p=0.9,
            seed=seed,
            step=step + k,
            backend="torch",
        )
        assert out.tokens[:, k].tolist() == s.tokens.tolist()
    for b in range(B):
        t, d = out.tokens[b].tolist(), drafts[b].tolist()
        a = next((k for k in range(K) if t[k] != d[k]), K)
        assert out.accepted[b] == a and out.bonus[b] == t[a]
    assert out.accepted.tolist() != [0] * B  # the inputs exercise accepted prefixes
    assert out.tokens[3, 2] == -1 and out.accepted[3] <= 2  # the empty position rejects


def test_all_accepted_rows_and_no_drafts(impl):
    V = 64
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(B, K + 1, V, generator=gen)
    greedy = logits.argmax(-1)
    out = _verify(impl, logits, greedy[:, :K], temperature=0.0)
    assert out.accepted.tolist() == [K] * B and out.bonus.tolist() == greedy[:, K].tolist()
    zero = _verify(impl, logits[:, :1], torch.empty(B, 0, dtype=torch.int64), temperature=0.0)
    assert zero.accepted.tolist() == [0] * B and zero.bonus.tolist() == greedy[:, 0].tolist()


def test_index_list_strides_and_batch_invariance(impl):
    """Masks on some rows only; logits as a strided view; a row's result alone == in the batch."""
    V = 90
    logits, drafts, bitmask = _inputs(V, torch.float32, seed=5)
    wide = torch.zeros(B, K + 1, 2 * V)
    wide[:, :, ::2] = logits
    view = wide[:, :, ::2]  # stride 2 along V
    args = dict(temperature=[0.0, 1.0, 0.8, 0.0], top_k=[0, 4, 0, 0])
    idx = [0, 2]
    want = _verify(("torch", "cpu"), logits, drafts, bitmask=bitmask, indices=idx, **args)
    got = _verify(impl, view, drafts, bitmask=bitmask, indices=idx, **args)
    _equal(got, want)
    one = _verify(impl, logits[2:3], drafts[2:3], bitmask=bitmask[2:3], temperature=0.8,
                  seed=torch.tensor([12]), step=torch.tensor([17]))  # fmt: skip
    assert one.tokens[0].tolist() == want.tokens[2].tolist()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(logits=torch.zeros(2, 5)), r"3-D tensor \[batch, drafts \+ 1, vocab\]"),
        (
            dict(drafts=torch.zeros(2, 3, dtype=torch.int64)),
            r"drafts must be an integer tensor of shape \[2, 2\]",
        ),
        (dict(bitmask=torch.zeros(2, 3, 2, dtype=torch.int32)), r"bitmask must have shape .* = \[2, 3, 1\]"),
        (dict(bitmask=torch.zeros(2, 3, 1, dtype=torch.int64)), "int32"),
        (dict(num_drafts=[0, 3]), r"num_drafts must be in \[0, 2\]"),
        (dict(indices=[0]), "indices given without a bitmask"),
    ],
)
def test_errors(kwargs, match):
    args = dict(
        logits=torch.zeros(2, 3, 10),
        drafts=torch.zeros(2, 2, dtype=torch.int64),
        temperature=0.0,
        seed=0,
        step=0,
    )
    args.update(kwargs)
    logits, drafts = args.pop("logits"), args.pop("drafts")
    with pytest.raises(ValueError, match=match):
        kernels.verify(logits, drafts, backend="torch", **args)
