"""A decode row's matmuls as one kernel each, with the ops around them fused in.

    norm_matmul(x, d, ln, w, eps) -> (s, y):            s = x + d (d None: s = x)
                                                        y = rms_norm(s, ln) @ w   (ln None: s @ w)
    norm_matmul(x, d, ln, wgu, eps, glu=act) -> (s, y): y = act(h @ gate) * (h @ up),
                                                        h = rms_norm(s, ln), gate|up the halves of wgu

    norm_qkv_rope(x, d, ln, w, eps, cos, sin, positions, k_flat, v_flat, slots, nh) -> (s, q):
        norm_matmul's q|k|v, then RoPE on the q and k heads, k and v written at the rows' slots

A decode step of a small model at batch 1 is launch-bound: each of a layer's matmuls reads a
megabyte or two of weights, less than a launch costs, and cuBLAS's kernel for one row takes
about 4 µs on the H200 (SmolLM2's shapes). These kernels compute one row's block of columns a
program, summing the products elementwise over K and reducing once at the end. With the ops
around the matmuls fused in, a layer runs five kernels instead of nine (``LlamaModel``: the
attention's norm, q|k|v, RoPE and K/V store; the attention output's projection; the MLP's norm,
gate|up and GLU; the down projection). Each launch is a programmatic dependent launch where
the device has it (compute capability 9): it starts while the kernel before it ends and waits
for it before reading.

The reference, ``norm_matmul_reference``, is the unfused layer's ops: `add_rms_norm_reference`,
the matmul, `glu_reference`. The kernel rounds the residual sum, the matmul's output, the
activation and the product where they do. It computes the norm as rms_norm(s) @ w =
((s * ln) @ w) / rms(s) in one pass over K: s * ln is rounded to the dtype, and the sums are
scaled by the row's 1 / rms before the output's rounding. The reference rounds s / rms(s), then
its product with ln, so a value may be an ulp or two off the reference's, as cuBLAS's order of
additions is off another kernel's. Each row is computed alone, so a row's bits do not depend on
the other rows.

``use_fused(x, w)`` says where the kernel serves: 16-bit weights on CUDA (or the interpreter),
at most ``MAX_ROWS`` rows, and matrices of at most ``MAX_BYTES`` (the H200's figures in
benchmarks/RESULTS.md, "Decode at batch 1"). A plain product of one row (``plain``: no norm, no
GLU, as the attention's output projection) also takes larger matrices, up to ``WIDE_MAX_BYTES``
and of at least ``WIDE_MIN_COLUMNS`` columns, with ``WIDE_TILES``: Llama-3-8B's output
projection, where cuBLAS splits K and adds a reduction kernel after it (RESULTS.md, "Decode on
the H100"). Elsewhere the op is the reference.
"""

from __future__ import annotations

import os

import torch

from .fused import ACTIVATIONS, add_rms_norm_reference, check_rope_rows, glu_reference, rope_store_reference

MAX_ROWS = 2  # rows up to which the kernel serves (each row's programs read the weights again)
MAX_BYTES = 8 << 20  # weight bytes up to which it serves (above, cuBLAS streams the weights faster)
# (columns, K a step, warps, pipeline stages) of a program: one row, more rows (the H200's best)
TILES = {1: (8, 1024, 4, 2), 2: (16, 512, 4, 2)}
# a plain one-row product past MAX_BYTES: up to this many bytes, of at least this many columns
# (16 of them a program: two programs an SM and more), with these tiles (the H100's best)
WIDE_MAX_BYTES = 32 << 20
WIDE_MIN_COLUMNS = 4096
WIDE_TILES = (16, 512, 4, 3)
PDL = True  # programmatic dependent launches where the device has them


def norm_matmul_reference(x, d, ln, w, eps: float, glu: str | None = None, norm=None, mm=torch.matmul):
    """(s, y) with the unfused ops (``norm``, ``mm``: the forward's own, e.g. deterministic mode's;
    ``ln`` None: no norm)."""
    if ln is None:
        s = x if d is None else x + d
        y = mm(s, w)
    else:
        s, h = add_rms_norm_reference(x, d, ln, eps, norm)
        y = mm(h, w)
    return s, (y if glu is None else glu_reference(y, glu))


def use_fused(x: torch.Tensor, w: torch.Tensor, plain: bool = False) -> bool:
    """Whether `norm_matmul` runs the Triton kernel for input rows x and matrix w (``plain``: a
    product with no norm and no GLU, which may take a wide matrix at one row)."""
    if not (
        type(w) is torch.Tensor
        and w.dtype in (torch.bfloat16, torch.float16)
        and x.dtype == w.dtype
        and w.stride(1) == 1
        and (w.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")  # (read only off CUDA)
    ):
        return False
    rows, size = x.reshape(-1, x.shape[-1]).shape[0], w.numel() * w.element_size()
    return (rows <= MAX_ROWS and size <= MAX_BYTES) or (plain and rows == 1 and _wide(w))


def _wide(w: torch.Tensor) -> bool:
    """A matrix past MAX_BYTES that a plain one-row product takes WIDE_TILES for."""
    size = w.numel() * w.element_size()
    return MAX_BYTES < size <= WIDE_MAX_BYTES and w.shape[1] >= WIDE_MIN_COLUMNS


def _rows(op: str, x: torch.Tensor, d: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x and d [..., H] as contiguous rows [M, H] (d: x's shape, or None)."""
    if d is not None and d.shape != x.shape:
        raise ValueError(f"{op}: d of shape {tuple(d.shape)}, expected x's {tuple(x.shape)}")
    H = x.shape[-1]
    return x.reshape(-1, H).contiguous(), None if d is None else d.reshape(-1, H).contiguous()


def _launch(x2: torch.Tensor, w: torch.Tensor, tiles, pdl: bool | None) -> tuple:
    """(w with unit column stride, the tiles for x2's rows, whether to launch as a programmatic
    dependent launch: by default where the device has it)."""
    from .triton_common import pdl_device

    pdl = PDL and pdl_device(x2.device) if pdl is None else pdl
    if tiles is None:
        tiles = WIDE_TILES if x2.shape[0] == 1 and _wide(w) else TILES[min(x2.shape[0], 2)]
    return w if w.stride(1) == 1 else w.contiguous(), tiles, pdl


def norm_matmul(x: torch.Tensor, d: torch.Tensor | None, ln: torch.Tensor | None, w: torch.Tensor, eps: float,
                glu: str | None = None, tiles: tuple[int, int, int, int] | None = None,
                pdl: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The Triton kernel of `norm_matmul_reference` (x, d: [..., H]; ln [H] or None; w [H, N], or
    [H, 2 I] with ``glu``): (s [..., H], y [..., N or I]). ``tiles`` overrides `TILES`'s; ``pdl``:
    launched as a programmatic dependent launch (default: where the device has it)."""
    from . import norm_matmul_triton as kt

    H = x.shape[-1]
    if glu is not None and glu not in ACTIVATIONS:
        raise ValueError(f"norm_matmul: glu must be one of {ACTIVATIONS} or None, got {glu!r}")
    if (ln is not None and ln.shape != (H,)) or w.dim() != 2 or w.shape[0] != H:
        ln_shape = None if ln is None else tuple(ln.shape)
        raise ValueError(f"norm_matmul: x [..., {H}], ln {ln_shape}, w {tuple(w.shape)}: expected ln [{H}] "
                         f"and w [{H}, N]")  # fmt: skip
    if glu is not None and w.shape[1] % 2:
        raise ValueError(f"norm_matmul: gate|up of odd width {w.shape[1]}")
    x2, d2 = _rows("norm_matmul", x, d)
    w, tiles, pdl = _launch(x2, w, tiles, pdl)
    s, y = kt.norm_matmul(x2, d2, None if ln is None else ln.contiguous(), w, eps, glu, tiles, pdl)
    return (x if d is None else s.view(x.shape)), y.view(*x.shape[:-1], y.shape[-1])


def norm_qkv_rope_reference(x, d, ln, w, eps: float, cos, sin, positions, k_flat, v_flat, slots, nh: int):
    """(s, q): `norm_matmul_reference`'s q|k|v projection, then `rope_store_reference` (RoPE on
    the q and k heads, k and v written at the rows' cache slots)."""
    s, qkv = norm_matmul_reference(x, d, ln, w, eps)
    nkv, hd = k_flat.shape[1:]
    qkv = qkv.view(qkv.shape[0], nh + 2 * nkv, hd)
    return s, rope_store_reference(
        qkv[:, : nh + nkv], qkv[:, nh + nkv :], cos, sin, positions, k_flat, v_flat, slots, nh
    )


def norm_qkv_rope(x: torch.Tensor, d: torch.Tensor | None, ln: torch.Tensor, w: torch.Tensor, eps: float,
                  cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, k_flat: torch.Tensor,
                  v_flat: torch.Tensor, slots: torch.Tensor, nh: int,
                  tiles: tuple[int, int, int, int] | None = None,
                  pdl: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The Triton kernel of `norm_qkv_rope_reference`: the attention's norm, q|k|v projection,
    RoPE and K/V store as one launch (x, d [..., H]; w [H, (nh + 2 nkv) hd]; cos, sin [L, hd]
    tables; positions, slots [M]; k_flat, v_flat [slots, nkv, hd], `KVCache.flat`) -> (s, q
    [M, nh, hd]). Positions must lie in the tables and slots in the cache (not checked: no host
    sync)."""
    from . import norm_matmul_triton as kt

    H = x.shape[-1]
    nkv, hd = k_flat.shape[1:]
    if ln.shape != (H,) or w.shape != (H, (nh + 2 * nkv) * hd) or hd % 2:
        raise ValueError(f"norm_qkv_rope: x [..., {H}], ln {tuple(ln.shape)}, w {tuple(w.shape)}, k_flat "
                         f"{tuple(k_flat.shape)}, nh={nh}: expected ln [{H}] and w [{H}, (nh + 2 nkv) hd] "
                         f"of an even head_dim")  # fmt: skip
    if v_flat.shape != k_flat.shape or k_flat.stride()[1:] != (hd, 1) or v_flat.stride() != k_flat.stride():
        raise ValueError(f"norm_qkv_rope: k_flat {tuple(k_flat.shape)}, v_flat {tuple(v_flat.shape)}: "
                         f"expected one shape, each slot's heads contiguous")  # fmt: skip
    x2, d2 = _rows("norm_qkv_rope", x, d)
    check_rope_rows("norm_qkv_rope", x2.shape[0], hd, cos, sin, positions, slots)
    w, tiles, pdl = _launch(x2, w, tiles, pdl)
    s, q = kt.norm_qkv_rope(x2, d2, ln.contiguous(), w, eps, cos.contiguous(), sin.contiguous(),
                            positions.contiguous(), k_flat, v_flat, slots.contiguous(), nh, hd, tiles,
                            pdl)  # fmt: skip
    return (x if d is None else s.view(x.shape)), q
