"""Weight-only int4 matmul (kernels/int4_weights.py): the packed layout against torch's own
converter, the packed CPU kernel against its float32 reference on random planes (one and two
planes), a row's bits alone and in any batch, row lookups, and the shapes refused."""

from __future__ import annotations

import pytest
import torch

from deepinfer.kernels.int4_weights import (
    GROUP,
    Int4Plane,
    Int4Weight,
    dequantize_int4,
    int4_matmul,
    int4_matmul_reference,
    int4_rows,
    join,
    make_plane,
    pack_nibbles,
    stack_planes,
    torch_layout_problem,
)
from deepinfer.kernels.quantized import matmul_torch

# torch's kernel (int4_matmul) reads the planes only where torch packs them so: its AVX-512 build
torch_kernel = pytest.mark.skipif(torch_layout_problem() is not None, reason=str(torch_layout_problem()))


def _weight(K: int, N: int, planes: int, gen: torch.Generator) -> Int4Weight:
    """Random planes, scales and zeros of a trained matrix's size (about 1 / sqrt(K))."""
    made = []
    for _ in range(planes):
        q = torch.randint(0, 16, (N, K), generator=gen)
        scale = torch.rand(N, K // GROUP, generator=gen) * 0.02 / K**0.5 + 1e-4
        zero = torch.randn(N, K // GROUP, generator=gen) * 0.02 / K**0.5
        made.append(make_plane(q, scale, zero))
    return stack_planes(made, K, N)


@pytest.mark.parametrize("K,N", [(64, 64), (576, 960), (1536, 576), (96, 192)])
def test_packed_layout_is_torchs(K, N):
    """pack_nibbles is torch's AVX-512 layout; where torch dispatches another build, the probe
    says so (and the CPU default then keeps no int4 planes: tests/engine/test_gguf_int4.py)."""
    q = torch.randint(0, 16, (N, K), generator=torch.Generator().manual_seed(K + N))
    ours = pack_nibbles(q)
    theirs = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    assert ours.dtype == torch.uint8 and torch.equal(ours, theirs) == (torch_layout_problem() is None)


def test_dequantize_is_the_planes_definition():
    g = torch.Generator().manual_seed(1)
    q = torch.randint(0, 16, (128, 64), generator=g)
    scale, zero = torch.rand(128, 2, generator=g), torch.randn(128, 2, generator=g)
    w = stack_planes([make_plane(q, scale, zero)], 64, 128)
    s, z = (t.bfloat16().float().repeat_interleave(GROUP, dim=1) for t in (scale, zero))
    assert torch.equal(dequantize_int4(w), ((q.float() - 8) * s + z).t())


@torch_kernel
@pytest.mark.parametrize("planes", [1, 2])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_packed_kernel_equals_reference_on_random_inputs(planes, rows):
    g = torch.Generator().manual_seed(10 * planes + rows)
    for K, N in [(576, 960), (1536, 576), (64, 128)]:
        w = _weight(K, N, planes, g)
        x = torch.randn(2, rows, K, generator=g).bfloat16()
        got, want = int4_matmul(x, w), int4_matmul_reference(x, w)
        assert got.shape == (2, rows, N) and got.dtype == torch.bfloat16
        # float32 accumulation in both (the kernel's over every plane at once), one rounding
        scale = want.float().abs().amax()
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=float(scale) * 2**-7)
        assert torch.equal(matmul_torch(x, w), got)  # (a few rows: kernels/int4_gemv.py in `matmul`)


def test_a_rows_bits_do_not_depend_on_the_batch():
    """The property deterministic mode on the CPU needs of its matmuls: a row alone, first, last
    or in the middle of a batch of any size gives the same bits."""
    g = torch.Generator().manual_seed(3)
    w = _weight(576, 960, 2, g)
    xs = torch.randn(40, 576, generator=g).bfloat16()
    alone = torch.cat([int4_matmul(xs[r : r + 1], w) for r in range(40)])
    for start, size in [(0, 8), (5, 3), (1, 39), (0, 40), (17, 16)]:
        assert torch.equal(int4_matmul(xs[start : start + size], w), alone[start : start + size])


def test_rows_and_joins():
    g = torch.Generator().manual_seed(4)
    a, b = _weight(64, 192, 2, g), _weight(64, 64, 2, g)
    ab = join([a, b])
    assert ab.shape == (64, 256) and torch.equal(
        dequantize_int4(ab), torch.cat([dequantize_int4(a), dequantize_int4(b)], 1)
    )
    index = torch.tensor([0, 31, 32, 63, 64, 200, 255, 5, 5])
    assert torch.equal(int4_rows(ab, index), dequantize_int4(ab)[:, index].t())


@torch_kernel
def test_stacked_planes_are_the_sum_of_the_planes():
    """Two planes side by side along K (one kernel call) stand for the sum of the two matrices,
    each a weight of its own; the product is their products' sum, rounded once."""
    g = torch.Generator().manual_seed(6)
    K, N = 576, 192
    planes = [_weight(K, N, 1, g) for _ in range(2)]
    as_planes = [Int4Plane(w.packed, w.scale_zeros) for w in planes]
    both = stack_planes(as_planes, K, N)
    assert both.count == 2 and both.nbytes == sum(w.nbytes for w in planes)
    assert torch.equal(dequantize_int4(both), dequantize_int4(planes[0]) + dequantize_int4(planes[1]))
    index = torch.tensor([0, 63, 64, 191, 100])
    assert torch.equal(int4_rows(both, index), dequantize_int4(both)[:, index].t())
    x = torch.randn(5, K, generator=g).bfloat16()
    two = sum(int4_matmul_reference(x, w).float() for w in planes)  # each rounded, then added
    torch.testing.assert_close(int4_matmul(x, both).float(), two, rtol=0, atol=float(two.abs().max()) * 2**-7)
    with pytest.raises(ValueError, match=r"planes of one \[576, 64\] matrix expected"):
        stack_planes(as_planes, K, 64)


def test_bad_shapes_are_refused():
    g = torch.Generator().manual_seed(5)
    w = _weight(64, 64, 1, g)
    with pytest.raises(ValueError, match="x has 32 features, the int4 matrix takes 64"):
        int4_matmul(torch.randn(1, 32).bfloat16(), w)
    with pytest.raises(ValueError, match="bfloat16 activations, got torch.float32"):
        int4_matmul(torch.randn(1, 64), w)
    q, s = torch.zeros(64, 48, dtype=torch.long), torch.ones(64, 1)
    with pytest.raises(ValueError, match="K a multiple of 32 and N of 64; got K=48, N=64"):
        make_plane(q, s, s)
    with pytest.raises(ValueError, match="K a multiple of 32 and N of 64; got K=64, N=48"):
        make_plane(torch.zeros(48, 64, dtype=torch.long), torch.ones(48, 2), torch.ones(48, 2))
    with pytest.raises(ValueError, match="one K and one number of planes"):
        join([w, _weight(64, 64, 2, g)])
