"""Parallel benchmark: prints tables, asserts nothing.

On a machine with >= 2 CUDA devices (refused, with the reason, on fewer):
    python benchmarks/bench_parallel.py --device cuda
1. Llama-3-8B shape, random bf16 weights: decode tokens/s at TP=1 and TP=2, batch 1 and 64
   (CUDA graphs; the collectives captured), TP=2 / TP=1 beside the ideal 2x.
2. Llama-3-70B shape at TP = --tp-70b (default: every device, at least 2): decode tokens/s at
   batch 1 beside the bandwidth floor (each rank reads its shard of the weights and KV cache once
   a step, at the device-to-device copy bandwidth measured in the same run).
3. DP=2 against one replica: the shared-prefix extraction workload of bench_prefix.py
   (SmolLM2-135M, JSON Schema constrained, prefix caching on), requests/s end to end.

CPU smoke (gloo, tiny shapes; checks the code path, no meaningful times):
    python benchmarks/bench_parallel.py --device cpu --shapes tiny
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from bench_decode import SHAPES, _config, _copy_bandwidth, _decode_seconds, _random_weights, _sync  # noqa: E402

SHAPES = {**SHAPES, "llama3-70b": (80, 8192, 28672, 64, 8, 128, 128256, False, 500000.0)}


def random_shard(name: str, device_type: str, rank: int, size: int):
    """(config, rank's random shard) made on the rank's device: the shard of random weights is
    random weights of the shard's shapes (the LM head: V / size rows)."""
    from deepinfer.parallel.sharding import check_tensor_parallel, shard_config

    cfg = _config(name)
    check_tensor_parallel(cfg, size)
    dev = torch.device(f"cuda:{rank}" if device_type == "cuda" else "cpu")
    dtype = torch.bfloat16 if device_type == "cuda" else torch.float32
    w = _random_weights(shard_config(cfg, size), dev, dtype)
    w["lm_head.weight"] = w["lm_head.weight"][: -(-cfg.vocab_size // size)]
    return cfg, w


def model_at(name: str, tp: int, device: torch.device):
    from deepinfer.models.llama import LlamaModel
    from deepinfer.parallel.tensor_parallel import tensor_parallel_model

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if tp == 1:
        cfg = _config(name)
        return LlamaModel(cfg, _random_weights(cfg, device, dtype), dtype=dtype, device=device, max_len=4096)
    source = partial(random_shard, name, device.type)
    return tensor_parallel_model(source, None, tp, dtype=dtype, device=device, max_len=4096)


def decode_rate(model, batch: int, args) -> float:
    from deepinfer.model_runner import ModelRunner

    runner = ModelRunner(model, cuda_graphs=None if model.device.type == "cuda" else False)
    s = _decode_seconds(runner, batch, args, model.device)
    runner.cache = runner.graphs = None
    return batch / s


def table(header: list[str], rows: list[list]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for r in [header, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |")


def bench_tp(args, device) -> None:
    name = args.shapes.split(",")[0]
    rates = {}
    for tp in (1, 2):
        model = model_at(name, tp, device)
        for b in (1, args.batch):
            rates[tp, b] = decode_rate(model, b, args)
            print(f"  measured TP={tp} B={b}: {rates[tp, b]:.1f} tok/s", flush=True)
        del model
        _sync(device)
    print(f"\n{name}: decode tokens/s, random weights (goal: TP=2 >= 1.6x TP=1 at B=1)")
    table(["batch", "TP=1", "TP=2", "TP=2 / TP=1"],
          [[b, f"{rates[1, b]:.1f}", f"{rates[2, b]:.1f}", f"{rates[2, b] / rates[1, b]:.2f}x"]
           for b in (1, args.batch)])  # fmt: skip


def bench_70b(args, device) -> None:
    from bench_decode import _read_bytes

    tp = args.tp_70b or max(2, torch.cuda.device_count())
    bw = _copy_bandwidth(device)
    model = model_at("llama3-70b", tp, device)
    rate = decode_rate(model, 1, args)
    read, _ = _read_bytes(model)  # rank 0's shard (every rank reads as much)
    c = model.config
    kv = 2 * c.num_layers * (args.prompt_len + args.steps) * c.num_kv_heads * c.head_dim * 2
    floor = bw / (read + kv)
    print(
        f"\nllama3-70b at TP={tp}: batch 1 decode vs the bandwidth floor (copy bandwidth {bw / 1e9:.0f} GB/s)"
    )
    table(
        ["TP", "tok/s", "floor tok/s", "of floor"],
        [[tp, f"{rate:.1f}", f"{floor:.1f}", f"{rate / floor:.0%}"]],
    )


def bench_dp(args) -> None:
    from bench_prefix import SCHEMA, documents, shared_prefix

    from deepinfer import LLM, SamplingParams

    out = {}
    for dp in (1, 2):
        llm = LLM(device=args.device, data_parallel_size=dp, max_num_seqs=64)
        tok = llm.tokenizer
        sp = SamplingParams(json_schema=SCHEMA, temperature=0, max_tokens=args.dp_tokens)
        llm.generate([shared_prefix(tok, 64, " (warm-up)") + d for d in documents(4)], sp, use_tqdm=False)
        prompts = [shared_prefix(tok, args.prefix_tokens) + d for d in documents(args.requests)]
        t = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        out[dp] = args.requests / (time.perf_counter() - t)
        print(f"  measured DP={dp}: {out[dp]:.2f} req/s", flush=True)
        if dp > 1:
            llm.close()
        del llm
    print(f"\nshared-prefix extraction, {args.requests} requests (goal: DP=2 >= 1.9x one replica)")
    table(["replicas", "req/s", "vs one"], [[d, f"{out[d]:.2f}", f"{out[d] / out[1]:.2f}x"] for d in (1, 2)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", default="llama3-8b", help="the TP=1 vs TP=2 shape")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--tp-70b", type=int, default=0, help="ranks of the 70B run (0: every device)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prefix-tokens", type=int, default=512)
    ap.add_argument("--dp-tokens", type=int, default=48)
    ap.add_argument("--only", default="tp,70b,dp", help="which of tp, 70b, dp to run")
    args = ap.parse_args()
    device = torch.device(args.device)
    only = args.only.split(",")
    if device.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < 2:
            raise SystemExit(
                f"bench_parallel.py --device cuda needs at least 2 CUDA devices, this machine has {n}"
            )
    else:  # the CPU smoke: gloo, tiny shapes, no 70B
        only = [x for x in only if x != "70b"]
        args.batch, args.steps, args.prompt_len = (
            min(args.batch, 4),
            min(args.steps, 4),
            min(args.prompt_len, 16),
        )
    if "tp" in only:
        bench_tp(args, device)
    if "70b" in only:
        bench_70b(args, device)
    if "dp" in only:
        bench_dp(args)


if __name__ == "__main__":
    main()
