"""Decode attention alone: the paged Triton kernel (kernels/paged_attention.py) with one program
per (row, KV head) and split over the keys (``splits``), beside its memory floor. Prints a table,
asserts nothing.

    python benchmarks/bench_attention.py [--shapes llama3-8b,smollm2-135m] [--batches 1,16,64]
        [--contexts 232,1024,8192] [--splits 1,16,decode]

``--prefill 2048,8192,32768``: the prefill kernel instead (``paged_prefill_triton``, one prompt
of each length in one chunk), with its default tiles and each of ``--tunings`` (tile rows,
keys a step, warps, pipeline stages): TFLOP/s of causal attention and the largest difference
from the default's output. A tuning that does not fit the device is reported as such. With
``--peers``, torch's SDPA backends on the same prompt with its keys contiguous (cuDNN's is
what the forward runs for all-new long prompts: kernels/dense_prefill.py).

Per head shape, batch and context (every row that many keys, blocks of 16 scattered over the
pool, bf16): µs a launch, timed as a CUDA graph of 20 launches replayed (no launch gaps of the
host), and the floor: the K/V bytes the launch must read / the measured copy bandwidth. On the
CPU (TRITON_INTERPRET=1, tiny shapes) it checks the script only.
"""

from __future__ import annotations

import argparse
import os
from functools import partial

import torch
from bench_decode import _copy_bandwidth, _event_seconds, _graph_seconds, _table

HEADS = {  # name: (KV heads, query heads per KV head, head_dim)
    "llama3-8b": (8, 4, 128),
    "smollm2-135m": (3, 3, 64),
    "tiny": (2, 2, 16),
}
BLOCK_SIZE = 16
LAUNCHES = 20


def _inputs(nkv: int, g: int, hd: int, batch: int, ctx: int, device, dtype):
    """q [batch, nkv, g, hd]; a cache of batch * ceil(ctx / 16) blocks (+ the null block) in
    shuffled order; each row's table and its position ctx - 1."""
    per = -(-ctx // BLOCK_SIZE)
    blocks = 1 + batch * per
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(blocks, BLOCK_SIZE, nkv, hd, generator=gen).to(device, dtype)
    v = torch.randn(blocks, BLOCK_SIZE, nkv, hd, generator=gen).to(device, dtype)
    ids = (torch.randperm(blocks - 1, generator=gen) + 1).view(batch, per)
    q = torch.randn(batch, nkv, g, hd, generator=gen).to(device, dtype)
    seq_ids = torch.arange(batch, device=device)
    positions = torch.full((batch,), ctx - 1, device=device)
    return q, k, v, ids.to(device, torch.int32), seq_ids, positions


def _seconds(call, device) -> float:
    """Seconds a launch: LAUNCHES calls captured in one CUDA graph, replayed (once, eagerly, on the
    CPU)."""
    return _graph_seconds([call] * LAUNCHES, device)


DEFAULT_TUNINGS = ",".join(
    f"{r}:{n}:{w}:{st}" for r in (64, 128) for n in (32, 64, 128) for w in (4, 8) for st in (2, 3, 4)
)


def prefill(args, device, dtype) -> None:
    """The prefill kernel at each prompt length, default tiles and each tuning (see the docstring)."""
    import math

    from deepinfer.kernels.paged_prefill_triton import config, launch

    tunings = [None] + [tuple(int(x) for x in t.split(":")) for t in args.tunings.split(",") if t]
    lengths = [int(n) for n in args.prefill.split(",")]
    for shape in args.shapes.split(","):
        nkv, g, hd = HEADS[shape]
        block_m, rows_d, warps = config(g, hd, False)
        print(f"{shape}: default tiles {rows_d} rows ({block_m} tokens x {g} heads), 64 keys, {warps} warps")
        table, results = [], {}
        for n in lengths:
            blocks = -(-n // BLOCK_SIZE)
            gen = torch.Generator().manual_seed(0)
            k = torch.randn(1 + blocks, BLOCK_SIZE, nkv, hd, generator=gen).to(device, dtype)
            v = torch.randn(1 + blocks, BLOCK_SIZE, nkv, hd, generator=gen).to(device, dtype)
            q = torch.randn(n, nkv, g, hd, generator=gen).to(device, dtype)
            ids = (torch.randperm(blocks, generator=gen) + 1).to(device, torch.int32)[None]
            qs = torch.tensor([0, n], device=device)
            lens = torch.tensor([n], device=device)
            flops = 4 * nkv * g * hd * n * (n + 1) / 2
            ref = None
            for t in tunings:
                out = torch.empty_like(q)
                call = partial(launch, q, k, v, out, ids, qs, lens, n, 1.0 / math.sqrt(hd), tuning=t)
                try:
                    if device.type == "cuda":
                        sec = _event_seconds(call)
                    else:  # (the interpreter: a check of the script, not timed)
                        call()
                        sec = 0.0
                except Exception as e:  # noqa: BLE001 - out of shared memory or registers: skipped
                    results[(t, n)] = f"{type(e).__name__}"
                    print(f"  {shape} {n} {t}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                if ref is None:
                    ref = out.float()
                diff = (out.float() - ref).abs().max().item()
                tf = flops / sec / 1e12 if sec else float("nan")
                results[(t, n)] = (tf, diff)
                ms = f"{sec * 1e3:.3f} ms, {tf:.0f} TFLOP/s"
                print(f"  {shape} {n} {t or 'default'}: {ms}, max diff {diff:.2e}", flush=True)
            if args.peers and device.type == "cuda":
                for name, tf, diff in _sdpa_peers(q, k, v, ids, n, flops, ref):
                    results[(name, n)] = tf if isinstance(tf, str) else (tf, diff)
        base = {n: results[(None, n)][0] for n in lengths}
        if args.peers and device.type == "cuda":
            tunings = tunings + [name for name in SDPA_BACKENDS]
        for t in tunings:
            row = [shape, "default" if t is None else t if isinstance(t, str) else ":".join(map(str, t))]
            for n in lengths:
                r = results[(t, n)]
                row.append(r if isinstance(r, str) else f"{r[0]:.0f} ({r[0] / base[n]:.2f}x, {r[1]:.0e})")
            table.append(row)
        cols = [f"{n} tokens TFLOP/s (vs default, max diff)" for n in lengths]
        _table(["heads", "rows:keys:warps:stages", *cols], table)


SDPA_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")


def _sdpa_peers(q, k, v, ids, n, flops, ref):
    """(backend, TFLOP/s, max diff from the default kernel) of torch's causal SDPA on the same
    prompt with its keys contiguous, for each of torch's fused backends (GQA without repeating
    K/V); a backend that refuses the shape gives its error's name."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _, nkv, g, hd = q.shape
    qh = q.reshape(n, nkv * g, hd).transpose(0, 1)[None].contiguous()
    kh, vh = (c[ids[0].long()].reshape(-1, nkv, hd)[:n].transpose(0, 1)[None].contiguous() for c in (k, v))
    rows = []
    for name in SDPA_BACKENDS:

        def call(name=name):
            with sdpa_kernel(getattr(SDPBackend, name)):
                return torch.nn.functional.scaled_dot_product_attention(
                    qh, kh, vh, is_causal=True, enable_gqa=True
                )

        try:
            sec = _event_seconds(call)
        except Exception as e:  # noqa: BLE001 - the backend does not take this shape
            rows.append((name, type(e).__name__, None))
            continue
        out = call()[0].transpose(0, 1).reshape(n, nkv, g, hd).float()
        tf = flops / sec / 1e12
        diff = (out - ref).abs().max().item()
        print(
            f"  torch sdpa {name} {n}: {sec * 1e3:.3f} ms, {tf:.0f} TFLOP/s, max diff {diff:.2e}", flush=True
        )
        rows.append((name, tf, diff))
    return rows


def main() -> None:
    from deepinfer.kernels.paged_attention import decode_splits, paged_attention_triton

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script (needs TRITON_INTERPRET=1)")
    ap.add_argument("--shapes", default="llama3-8b,smollm2-135m")
    ap.add_argument("--batches", type=lambda x: [int(b) for b in x.split(",")], default=[1, 16, 64])
    ap.add_argument("--contexts", type=lambda x: [int(c) for c in x.split(",")], default=[232, 1024, 8192])
    ap.add_argument(
        "--splits",
        type=lambda x: [c if c == "decode" else int(c) for c in x.split(",")],
        default=[1, 16],
        help="caps on a row's runs; 'decode': the decode's own (decode_splits)",
    )
    ap.add_argument("--prefill", default=None, help="prompt lengths: time the prefill kernel instead")
    ap.add_argument("--tunings", default=DEFAULT_TUNINGS, help="rows:keys:warps:stages,... (with --prefill)")
    ap.add_argument("--peers", action="store_true", help="with --prefill: torch SDPA's backends beside it")
    args = ap.parse_args()
    device, dtype = torch.device(args.device), torch.bfloat16
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("on the CPU the kernel runs under the interpreter: set TRITON_INTERPRET=1")
    if args.prefill:
        return prefill(args, device, dtype)
    bw = _copy_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}: copy bandwidth {bw / 1e9:.0f} GB/s; bf16, blocks of {BLOCK_SIZE}", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        nkv, g, hd = HEADS[shape]
        for batch in args.batches:
            for ctx in args.contexts:
                x = _inputs(nkv, g, hd, batch, ctx, device, dtype)
                floor = batch * ctx * nkv * hd * 2 * dtype.itemsize / bw  # K and V, each key once
                row = [shape, batch, ctx, f"{floor * 1e6:.1f}"]
                best = float("inf")
                for splits in args.splits:
                    if splits == "decode":
                        splits = decode_splits(batch, nkv, device)
                    t = _seconds(partial(paged_attention_triton, *x, splits=splits), device)
                    best = min(best, t)
                    row.append(f"{t * 1e6:.1f}")
                row.append(f"{floor / best:.0%}")
                rows.append(row)
                print(f"  {shape} batch {batch} context {ctx}: " + ", ".join(row[4:-1]) + " µs", flush=True)
                del x
    header = ["heads", "batch", "keys a row", "floor µs"] + [f"splits={s} µs" for s in args.splits]
    _table(header + ["best of floor"], rows)


if __name__ == "__main__":
    main()
