"""A decode row's matmuls through the kernel of kernels/norm_matmul.py, beside the ops it replaces
(the fused add + RMSNorm kernel, cuBLAS's matmul, the GLU kernel) and the memory floor. Prints
a table, asserts nothing.

    python benchmarks/bench_norm_matmul.py [--shapes smollm2-135m,llama3-8b] [--rows 1,2,4]
        [--tiles 16:512:4:2,32:256:4:3] [--no-pdl]

Per model shape, a layer's four matmuls (the attention's norm and q|k|v, its output, the MLP's
norm, gate|up and GLU, its down projection) at each row count, bf16: µs a layer, timed as one
CUDA graph over as many copies of the weights as the model has layers, replayed (each launch
reads its own matrix from memory, as a decode step does), and the floor: the matrix's bytes /
the measured copy bandwidth. "fused" is the default tiles (``norm_matmul.TILES``, by rows), then each of
``--tiles`` (columns a program, K a step, warps, pipeline stages); "serves" is whether
``use_fused`` picks the kernel there. On the CPU (TRITON_INTERPRET=1, the tiny shape) it checks
the script only.
"""

from __future__ import annotations

import argparse
import os
from functools import partial

import torch
from bench_decode import _config, _copy_bandwidth, _graph_seconds, _table


def _unfused(x, d, ln, w, eps, glu):
    """The ops norm_matmul replaces: the fused add + RMSNorm (with a norm), cuBLAS's matmul, the
    GLU kernel."""
    from deepinfer.kernels import fused as fk

    h = x if ln is None else fk.add_rms_norm(x, d, ln, eps)[1]
    y = h @ w
    return y if glu is None else fk.glu(y, glu)


def _rope_args(cfg, M: int, device, dtype):
    """(cos, sin, positions, k_flat, v_flat, slots) of M rows at positions 200.. of a 64-slot cache."""
    from deepinfer.models.layers import rope_inv_freq, rope_tables

    cos, sin = rope_tables(rope_inv_freq(cfg), 512, device, dtype)
    kv = [torch.zeros(64, cfg.num_kv_heads, cfg.head_dim, device=device, dtype=dtype) for _ in range(2)]
    positions = torch.arange(200, 200 + M, device=device)
    return cos, sin, positions, *kv, torch.arange(M, device=device) * 3


def _unfused_rope(x, d, ln, w, eps, cos, sin, positions, k_flat, v_flat, slots, nh):
    """The ops norm_qkv_rope replaces: the fused add + RMSNorm, cuBLAS's matmul, the RoPE + K/V
    store kernel."""
    from deepinfer.kernels import fused as fk

    qkv = (fk.add_rms_norm(x, d, ln, eps)[1] @ w).view(x.shape[0], -1, k_flat.shape[-1])
    nqk = nh + k_flat.shape[1]
    return fk.rope_store(qkv[:, :nqk], qkv[:, nqk:], cos, sin, positions, k_flat, v_flat, slots, nh)


def main() -> None:
    from deepinfer.kernels import norm_matmul as nm

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="smollm2-135m,llama3-8b")
    ap.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16])
    ap.add_argument("--tiles", default="", help="more tilings to time: BN:BK:warps:stages,...")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--no-pdl", action="store_true", help="launch the kernel without programmatic dependent launch"
    )
    args = ap.parse_args()
    device, dtype = torch.device(args.device), torch.bfloat16
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("on the CPU the Triton kernels need TRITON_INTERPRET=1")
    pdl = False if args.no_pdl else None
    tilings = [None] + [tuple(int(v) for v in t.split(":")) for t in args.tiles.split(",") if t]
    bw = _copy_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (a check of the script)"
    pdl_says = "off" if args.no_pdl else "where the device has it"
    print(f"{name}: copy bandwidth {bw / 1e9:.0f} GB/s; bf16; default tiles {nm.TILES}; programmatic "
          f"dependent launch {pdl_says}", flush=True)  # fmt: skip
    rows_out = []
    for shape in args.shapes.split(","):
        cfg = _config(shape)
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        layers = cfg.num_layers if device.type == "cuda" else 2
        q, I = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, cfg.intermediate_size
        ops = [  # (op, K, N, with the norm, GLU or "rope")
            ("norm, q|k|v", H, q, True, None),
            ("norm, q|k|v, RoPE, K/V store", H, q, True, "rope"),
            ("o", cfg.num_heads * cfg.head_dim, H, False, None),
            ("norm, gate|up, GLU", H, 2 * I, True, "silu"),
            ("down", I, H, False, None),
        ]
        for op, K, N, norm, glu in ops:
            g = torch.Generator(device=device).manual_seed(0)
            ws = [torch.randn(K, N, device=device, dtype=dtype, generator=g) * K**-0.5 for _ in range(layers)]
            ln = torch.ones(K, device=device, dtype=dtype) if norm else None
            floor = ws[0].numel() * ws[0].element_size() / bw
            for M in args.rows:
                x = torch.randn(M, K, device=device, dtype=dtype, generator=g)
                d = torch.randn(M, K, device=device, dtype=dtype, generator=g) if norm else None

                if glu == "rope":
                    rope = _rope_args(cfg, M, device, dtype)
                    ref = [partial(_unfused_rope, x, d, ln, w, eps, *rope, cfg.num_heads) for w in ws]
                else:
                    ref = [partial(_unfused, x, d, ln, w, eps, glu) for w in ws]
                t_ref = _graph_seconds(ref, device)
                cells = []
                for tiles in tilings:
                    try:
                        if glu == "rope":
                            kw = dict(tiles=tiles, pdl=pdl)
                            calls = [
                                partial(nm.norm_qkv_rope, x, d, ln, w, eps, *rope, cfg.num_heads, **kw)
                                for w in ws
                            ]
                        else:
                            kw = dict(tiles=tiles, pdl=pdl)
                            calls = [partial(nm.norm_matmul, x, d, ln, w, eps, glu, **kw) for w in ws]
                        t = _graph_seconds(calls, device)
                        cells.append(f"{t * 1e6:.1f} ({t_ref / t:.2f}x)")
                    except Exception as e:  # a tiling that does not fit the device
                        cells.append(f"failed: {type(e).__name__}")
                serves = nm.use_fused(x, ws[0]) if device.type == "cuda" else "-"
                rows_out.append([shape, op, M, f"{floor * 1e6:.1f}", f"{t_ref * 1e6:.1f}", *cells, serves])
            del ws
    head = ["shape", "op", "rows", "floor µs", "unfused (norm, cuBLAS, GLU) µs"]
    head += [f"fused {':'.join(map(str, t)) if t else 'default'} µs (speed-up)" for t in tilings] + ["serves"]
    _table(head, rows_out)


if __name__ == "__main__":
    main()
