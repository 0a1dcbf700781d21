"""Weight-only int4 matmuls for the CPU: a matrix kept as 4-bit integers in groups of 32 along
its input dimension, each group with a scale and a zero, multiplied by bfloat16 activations in
torch's packed int4 CPU kernel (``torch.ops.aten._weight_int4pack_mm_for_cpu``). A decode step
on the CPU is bound by the bytes of weights it reads: this reads 5 bits a weight (4 + the
group's two bfloat16 numbers), bfloat16 reads 16.

A matrix is one or more *planes* whose products add up:

    w[k, n]  (for x @ w, w [K, N])  =  sum over planes p of  (q_p[n, k] - 8) s_p[k / 32, n] + z_p[k / 32, n]

with every q_p in [0, 16). One plane holds a llama.cpp Q4_0 or Q4_1 block exactly
(Q4_0: ``(q - 8) d``, scale d, zero 0; Q4_1: ``q d + m``, scale d, zero m + 8 d); two hold a
Q8_0 block (an int8 q is ``16 (h - 8) + l`` with h, l its high and low nibbles of q + 128:
scale 16 d, zero 0, then scale d, zero 8 d). The scales and zeros are bfloat16, the kernel's
format: a float16 block scale of a GGUF file is rounded to bfloat16 (8 significant bits).

The P planes of a matrix are kept side by side along K, as the kernel's layout of one [P K, N]
matrix (`stack_planes`), so that one kernel call multiplies them all: ``[x, x, ...] @ [w_1; w_2;
...]`` is the sum of the planes' products. A Q8_0 LM head (two planes) then streams its 35 MB
once, in one call, with no bfloat16 product per plane to write, read back and add.

``int4_matmul_reference`` is the float32 oracle of the kernel (``dequantize_int4`` then a
float32 matmul); the kernel accumulates in float32 too (the planes' products in one sum) and
rounds once to the activations' dtype.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

GROUP = 32  # weights a scale and a zero cover, along K (a GGUF block)
TILE = 64  # rows of N the CPU kernel's packed layout interleaves (two halves of 32)


class Int4Plane(NamedTuple):
    packed: torch.Tensor  # [N, K / 2] uint8, the CPU kernel's layout
    scale_zeros: torch.Tensor  # [K / GROUP, N, 2] bfloat16: (scale, zero) of each group


class Int4Weight(NamedTuple):
    """A [K, N] matrix (``x @ w``) as P planes of 4-bit integers whose products add up, side by
    side along K: the kernel's layout of a [P K, N] matrix (`stack_planes`)."""

    packed: torch.Tensor  # [N, P K / 2] uint8: a plane's layout, over plane 0's K, then plane 1's...
    scale_zeros: torch.Tensor  # [P K / GROUP, N, 2] bfloat16: plane 0's groups, then plane 1's, ...
    k: int
    n: int

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.k, self.n))

    @property
    def count(self) -> int:
        """P, the number of planes."""
        return self.scale_zeros.shape[0] * GROUP // self.k

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + 2 * self.scale_zeros.numel()


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] of values in [0, 16) (N a multiple of 64) -> [N, K / 2] uint8 in the layout of
    ``torch.ops.aten._convert_weight_to_int4pack_for_cpu``: rows in tiles of 64, and byte j of
    column k of a tile holds row j (low nibble) and row j + 32 (high nibble). Built here with two
    byte ops (torch's converter first widens q to int32)."""
    N, K = q.shape
    t = q.to(torch.uint8).view(N // TILE, 2, TILE // 2, K)
    return torch.bitwise_or(t[:, 0], t[:, 1] << 4).transpose(1, 2).contiguous().view(N, K // 2)


@functools.cache
def torch_layout_problem() -> str | None:
    """Why torch's int4 CPU kernel, as torch dispatches it on this CPU, cannot read the planes,
    or None when it can. torch packs for the kernel it will run: its AVX-512 kernel reads rows in
    tiles of 64 (`pack_nibbles`'s layout, which the GGUF loader and the C kernel read too), its
    AVX2 kernel tiles of 32 and its plain one pairs of rows. One probe of torch's converter, once
    a process."""
    q = (torch.arange(TILE)[:, None] * 7 + torch.arange(2 * GROUP)[None] * 3) % 16
    theirs = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    if theirs.dtype == torch.uint8 and torch.equal(pack_nibbles(q), theirs):
        return None
    return (
        f"torch's int4 CPU kernel here (its {torch.backends.cpu.get_cpu_capability()} build) packs "
        f"rows in another layout than the int4 planes' (tiles of {TILE} rows, its AVX-512 kernel's)"
    )


def check_shape(K: int, N: int) -> str | None:
    """Why int4 planes cannot hold a [K, N] matrix, or None when they can."""
    if K % GROUP or N % TILE or not K or not N:
        return f"int4 planes take K a multiple of {GROUP} and N of {TILE}; got K={K}, N={N}"
    return None


def make_plane(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> Int4Plane:
    """One plane from q [N, K] in [0, 16) and the groups' scale and zero [N, K / GROUP] (any float
    dtype; stored as bfloat16): the weight [k, n] is ``(q[n, k] - 8) * scale + zero``."""
    why = check_shape(q.shape[1], q.shape[0])
    if why:
        raise ValueError(why)
    return packed_plane(pack_nibbles(q), scale, zero)


def packed_plane(packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> Int4Plane:
    """`make_plane` from q already in the kernel's layout (``pack_nibbles``'s [N, K / 2] bytes)."""
    N, K = packed.shape[0], 2 * packed.shape[1]
    why = check_shape(K, N)
    if why:
        raise ValueError(why)
    if packed.dtype != torch.uint8 or scale.shape != (N, K // GROUP) or zero.shape != scale.shape:
        raise ValueError(f"packed uint8 [{N}, {K // 2}] with scale and zero [{N}, {K // GROUP}] expected, "
                         f"got {packed.dtype} {tuple(packed.shape)}, {tuple(scale.shape)} and "
                         f"{tuple(zero.shape)}")  # fmt: skip
    sz = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16)
    return Int4Plane(packed, sz)


def stack_planes(planes: tuple[Int4Plane, ...] | list[Int4Plane], k: int, n: int) -> Int4Weight:
    """The [k, n] matrix that is the sum of ``planes``, as one weight: the planes side by side
    along K (a copy when there are two or more)."""
    if not planes or any(p.packed.shape != (n, k // 2) or p.scale_zeros.shape != (k // GROUP, n, 2)
                         for p in planes):  # fmt: skip
        raise ValueError(f"planes of one [{k}, {n}] matrix expected")
    if len(planes) == 1:
        return Int4Weight(planes[0].packed, planes[0].scale_zeros, k, n)
    packed = torch.cat([p.packed.view(n // TILE, k, TILE // 2) for p in planes], dim=1)
    sz = torch.cat([p.scale_zeros for p in planes])
    return Int4Weight(packed.view(n, -1), sz, k, n)


def join(parts: list[Int4Weight]) -> Int4Weight:
    """Matrices of one K side by side ([K, N1 + N2 + ...]: q|k|v, gate|up, row chunks)."""
    if len({w.k for w in parts}) != 1 or len({w.count for w in parts}) != 1:
        raise ValueError("int4 matrices joined side by side need one K and one number of planes")
    packed = torch.cat([w.packed for w in parts])
    sz = torch.cat([w.scale_zeros for w in parts], dim=1)
    return Int4Weight(packed, sz, parts[0].k, sum(w.n for w in parts))


def _unpack(w: Int4Weight, index: torch.Tensor | None) -> torch.Tensor:
    """The weights of every plane, as float32 [P, K, n]: every column, or the columns ``index``."""
    P, k = w.count, w.k
    b = w.packed.view(-1, P * k, TILE // 2)  # [N / 64, P K, 32]
    if index is None:
        q = torch.stack([b & 15, b >> 4], dim=1).permute(2, 0, 1, 3).reshape(P * k, -1)
        s, z = (w.scale_zeros[..., i].float().repeat_interleave(GROUP, dim=0) for i in (0, 1))
        return ((q.float() - 8) * s + z).view(P, k, -1)
    j = index % TILE
    q = (b[index // TILE, :, j % (TILE // 2)] >> (4 * (j >= TILE // 2)).to(torch.uint8)[:, None]) & 15
    sz = w.scale_zeros[:, index].float().transpose(0, 1)  # [n, P K / 32, 2]
    x = (q.view(len(index), P * k // GROUP, GROUP).float() - 8) * sz[..., :1] + sz[..., 1:]
    return x.view(len(index), P, k).permute(1, 2, 0)


def _planes_sum(x: torch.Tensor) -> torch.Tensor:
    """[P, ...] -> [...]: the planes added in order, in float32."""
    out = x[0]
    for p in x[1:]:
        out = out + p
    return out


def dequantize_int4(w: Int4Weight) -> torch.Tensor:
    """The [K, N] float32 matrix ``w`` stands for (its planes added in float32)."""
    return _planes_sum(_unpack(w, None)).contiguous()


def int4_rows(w: Int4Weight, index: torch.Tensor) -> torch.Tensor:
    """Columns ``index`` (int64 [n]) of the matrix, as rows: float32 [n, K], bit for bit
    ``dequantize_int4(w)[:, index].T`` (an embedding that shares a tied LM head's planes)."""
    return _planes_sum(_unpack(w, index)).t()


def check_activations(x: torch.Tensor, w: Int4Weight) -> None:
    """Raise a ValueError naming what is wrong where ``x`` cannot multiply ``w``: its number of
    features, or a dtype other than bfloat16 (the int4 kernels' activations)."""
    if x.shape[-1] != w.k:
        raise ValueError(f"x has {x.shape[-1]} features, the int4 matrix takes {w.k}")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"the int4 matmul takes bfloat16 activations, got {x.dtype}")


def int4_matmul(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """x [..., K] bfloat16 @ w -> [..., N] bfloat16: one kernel call, over x repeated once a plane.
    Only where `torch_layout_problem` is None (the model's quantization is resolved by it)."""
    if x.shape[-1] != w.k or x.dtype != torch.bfloat16:  # (one test: a decode step calls this ~120 times)
        check_activations(x, w)
    x2 = x if x.dim() == 2 else x.reshape(-1, w.k)
    if 2 * w.packed.shape[1] != w.k:  # two or more planes
        x2 = x2.repeat(1, 2 * w.packed.shape[1] // w.k)
    elif not x2.is_contiguous():
        x2 = x2.contiguous()
    y = _MM(x2, w.packed, GROUP, w.scale_zeros)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], w.n)


_MM = torch.ops.aten._weight_int4pack_mm_for_cpu.default


def int4_matmul_reference(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """The oracle: x @ dequantize(w) in float32, rounded to x's dtype."""
    return (x.float() @ dequantize_int4(w)).to(x.dtype)
