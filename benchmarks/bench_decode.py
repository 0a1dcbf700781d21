"""Decode benchmark: prints tables, asserts nothing.

CPU (default): the embedded SmolLM2-135M-Instruct, DeepInfer next to transformers' `generate`
on the same GGUF weights, same dtype, same process; then DeepInfer's deterministic mode:
    .venv/bin/python benchmarks/bench_decode.py [--dtype bfloat16|float32] [--steps 32]

CUDA: random weights at real model shapes, bf16, batch 1/16/64, decode eager, as CUDA graphs,
and as CUDA graphs in deterministic mode, beside the memory-bandwidth floor ((weight + KV-cache
bytes read per step) / measured device-to-device copy bandwidth):
    python benchmarks/bench_decode.py --device cuda --shapes smollm2-135m,llama3-8b
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from deepinfer import LLM, SamplingParams  # noqa: E402
from deepinfer.model_runner import ModelRunner  # noqa: E402
from deepinfer.models.kv_cache import DEFAULT_BLOCK_SIZE as BLOCK_SIZE  # noqa: E402

SHAPES = {
    # name: (layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, tied, rope_theta)
    "smollm2-135m": (30, 576, 1536, 9, 3, 64, 49152, True, 100000.0),
    "llama3-8b": (32, 4096, 14336, 32, 8, 128, 128256, False, 500000.0),
    "tiny": (2, 64, 128, 4, 2, 16, 1024, False, 10000.0),  # checks the code path without a GPU
    # SmolLM2's vocabulary on a 2-layer model: the host side of a step (masks, sampler, Python)
    # dominates, so bench_e2e on the CPU shows what constraints cost the host per token
    "smollm2-tiny": (2, 64, 128, 4, 2, 16, 49152, True, 10000.0),
}


def _row(cells, widths):
    return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"


def _table(header, rows):
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(_row(header, widths))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(_row(r, widths))


def _timed(fn, repeat=1):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


# -- CPU: ours vs transformers on the embedded model -----------------------------------------
def bench_cpu(args) -> None:
    from deepinfer._threads import configure_torch_threads

    threads = configure_torch_threads()
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    t = time.perf_counter()
    llm = LLM(None, dtype=dtype, device="cpu", seed=0)
    ours_load = time.perf_counter() - t
    words = ("the quick brown fox jumps over the lazy dog and then " * 40).split()
    prompt_ids = llm.tokenizer.encode(" ".join(words))[: args.prompt_len]
    assert len(prompt_ids) == args.prompt_len

    def ours_gen(batch: int, n: int) -> float:
        sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        return _timed(lambda: llm.generate([prompt_ids] * batch, sp, use_tqdm=False), args.repeat)

    ours_gen(1, 2)  # warm-up
    ours = {"load": ours_load, "prefill": args.prompt_len / ours_gen(1, 1)}
    dec_prompt = prompt_ids[:16]

    def ours_decode(batch):
        sp1 = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        spn = SamplingParams(temperature=0, max_tokens=args.steps + 1, ignore_eos=True)
        t1 = _timed(lambda: llm.generate([dec_prompt] * batch, sp1, use_tqdm=False), args.repeat)
        tn = _timed(lambda: llm.generate([dec_prompt] * batch, spn, use_tqdm=False), args.repeat)
        return batch * args.steps / (tn - t1)

    for b in (1, 8):
        ours[f"decode b={b}"] = ours_decode(b)
    det = {}
    if not args.no_deterministic:
        default_runner = llm.runner
        llm.runner = ModelRunner(llm.model, deterministic=True)  # same weights, deterministic mode
        ours_gen(1, 2)
        for b in (1, 8):
            det[f"decode b={b}"] = ours_decode(b)
        llm.runner = default_runner
    llm.runner.cache = None  # free memory before transformers loads

    hf = {}
    if not args.no_transformers:
        from transformers import AutoModelForCausalLM

        from deepinfer.loader import default_gguf_path

        folder, name = os.path.split(default_gguf_path())
        t = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype).eval()
        hf["load"] = time.perf_counter() - t

        def hf_gen(batch, n, ids):
            x = torch.tensor([ids] * batch)
            kw = dict(
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=2,
            )
            with torch.inference_mode():
                return _timed(lambda: model.generate(x, **kw), args.repeat)

        hf_gen(1, 2, prompt_ids)
        hf["prefill"] = args.prompt_len / hf_gen(1, 1, prompt_ids)
        for b in (1, 8):
            t1, tn = hf_gen(b, 1, dec_prompt), hf_gen(b, args.steps + 1, dec_prompt)
            hf[f"decode b={b}"] = b * args.steps / (tn - t1)

    print(
        f"\nCPU, embedded SmolLM2-135M-Instruct (Q4_1 GGUF dequantized), {args.dtype}, "
        f"{threads} torch thread(s), load average {os.getloadavg()[0]:.1f}"
    )
    rows = []
    for key, unit in [("load", "s"), ("prefill", "tok/s"), ("decode b=1", "tok/s"), ("decode b=8", "tok/s")]:
        label = f"prefill ({args.prompt_len}-token prompt)" if key == "prefill" else key
        o, h = ours[key], hf.get(key)
        ratio = "" if h is None else (f"{h / o:.2f}x faster" if unit == "s" else f"{o / h:.2f}x")
        rows.append(
            [
                f"{label} [{unit}]",
                f"{o:.2f}" if unit == "s" else f"{o:.1f}",
                "-" if h is None else (f"{h:.2f}" if unit == "s" else f"{h:.1f}"),
                ratio,
            ]
        )
    _table(["metric", "deepinfer", "transformers", "deepinfer vs transformers"], rows)
    if det:
        print("\nDeterministic mode (same process, same weights)")
        _table(
            ["metric", "default", "deterministic", "deterministic vs default"],
            [
                [f"{k} [tok/s]", f"{ours[k]:.1f}", f"{det[k]:.1f}", f"{det[k] / ours[k] - 1:+.0%}"]
                for k in det
            ],
        )


# -- CUDA: random weights at real shapes -----------------------------------------------------
def _random_weights(shape, device, dtype):
    L, H, I, nh, nkv, hd, V, tied, _ = shape
    g = torch.Generator(device=device).manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, device=device, dtype=dtype, generator=g) * 0.02

    w = {
        "model.embed_tokens.weight": rnd(V, H),
        "model.norm.weight": torch.ones(H, device=device, dtype=dtype),
    }
    if not tied:
        w["lm_head.weight"] = rnd(V, H)
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(H, device=device, dtype=dtype)
        w[p + "post_attention_layernorm.weight"] = torch.ones(H, device=device, dtype=dtype)
        w[p + "self_attn.q_proj.weight"] = rnd(nh * hd, H)
        w[p + "self_attn.k_proj.weight"] = rnd(nkv * hd, H)
        w[p + "self_attn.v_proj.weight"] = rnd(nkv * hd, H)
        w[p + "self_attn.o_proj.weight"] = rnd(H, nh * hd)
        w[p + "mlp.gate_proj.weight"] = rnd(I, H)
        w[p + "mlp.up_proj.weight"] = rnd(I, H)
        w[p + "mlp.down_proj.weight"] = rnd(H, I)
    return w


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _copy_bandwidth(device) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    x = torch.empty(1 << (30 if device.type == "cuda" else 26), dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    _sync(device)
    t = time.perf_counter()
    n = 10
    for _ in range(n):
        y.copy_(x)
    _sync(device)
    bw = 2 * x.numel() * n / (time.perf_counter() - t)
    del x, y
    return bw


MODES = {  # name: ModelRunner keywords
    "eager": dict(cuda_graphs=False),
    "graphs": dict(cuda_graphs=True),  # decode attention: the paged Triton kernel
    "graphs-sdpa": dict(cuda_graphs=True, attention="sdpa"),  # keys gathered, torch SDPA, a length mask
    # batch-invariant Triton matmul, RMSNorm and attention in the same bucketed graphs
    "deterministic": dict(cuda_graphs=True, deterministic=True),
    # torch kernels over fixed tiles of rows, attention in fixed 256-key blocks (the CPU way)
    "deterministic-tiles": dict(cuda_graphs=True, deterministic=True, invariant_kernels=False),
}


def _decode_seconds(runner, batch, args, device) -> float:
    """Mean seconds per decode step: prefill a batch of equal prompts, then greedy steps with a
    host read of the tokens each step (as the engine's loop does)."""
    from deepinfer.sequence import Sequence

    sp = SamplingParams(temperature=0, max_tokens=args.steps + 1, ignore_eos=True)
    seqs = [
        Sequence(i, None, list(range(1, args.prompt_len + 1)), sp, seed=0, eos_token_ids=(), max_len=1 << 20)
        for i in range(batch)
    ]
    per = -(-(args.prompt_len + args.steps + 8) // BLOCK_SIZE)  # each row's blocks, scattered over the pool
    if runner.cache is None or runner.cache.num_blocks != 1 + per * batch:  # (the graphs go with the cache)
        runner.allocate(1 + per * batch, BLOCK_SIZE, batch)
    ids = list(range(1, 1 + per * batch))
    random.Random(0).shuffle(ids)
    for i, s in enumerate(seqs):
        s.block_table = ids[i * per : (i + 1) * per]
    logits = runner.step(seqs, [len(s) for s in seqs])
    _sync(device)
    t = time.perf_counter()
    for _ in range(args.steps):
        nxt = logits.argmax(-1).tolist()
        for s, tok in zip(seqs, nxt):
            s.output_token_ids.append(tok)
        logits = runner.step(seqs, [1] * batch)
    _sync(device)
    return (time.perf_counter() - t) / args.steps


def bench_cuda(args) -> None:
    from deepinfer.config import ModelConfig
    from deepinfer.models.llama import LlamaModel

    device, dtype = torch.device(args.device), torch.bfloat16
    bw = _copy_bandwidth(device)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    modes = args.modes.split(",")
    if device.type != "cuda":  # the tiny check on CPU: no graphs, no Triton
        modes = [m for m in modes if m in ("eager", "deterministic")]
    print(
        f"\n{dev_name}: measured copy bandwidth {bw / 1e9:.0f} GB/s; bf16, random weights, "
        f"{args.steps} decode steps after a {args.prompt_len}-token prompt; modes: {', '.join(modes)}"
    )
    rows = []
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        L, H, I, nh, nkv, hd, V, tied, theta = shape
        cfg = ModelConfig(
            vocab_size=V,
            hidden_size=H,
            intermediate_size=I,
            num_layers=L,
            num_heads=nh,
            num_kv_heads=nkv,
            head_dim=hd,
            rope_theta=theta,
            tie_word_embeddings=tied,
            max_position_embeddings=4096,
        )
        weights = _random_weights(shape, device, dtype)
        model = LlamaModel(cfg, weights, dtype=dtype, device=device, max_len=args.prompt_len + args.steps + 8)
        del weights
        weight_bytes = sum(
            t.numel() * t.element_size()
            for t in [model.lm_head] + [x for ly in model.layers for x in (ly.wqkv, ly.wo, ly.wgu, ly.wd)]
        )
        step = {}
        for mode in modes:
            kw = (
                MODES[mode]
                if device.type == "cuda"
                else {k: v for k, v in MODES[mode].items() if k != "cuda_graphs"}
            )
            runner = ModelRunner(model, **kw)
            for batch in args.batches:
                try:
                    _decode_seconds(runner, batch, args, device)  # warm-up: captures this batch's graphs
                    step[mode, batch] = _decode_seconds(runner, batch, args, device)
                except Exception as e:  # a broken mode leaves its cells empty; the others still run
                    print(f"  {name} {mode} batch {batch}: FAILED {type(e).__name__}: {e}", flush=True)
                    step[mode, batch] = float("nan")
                    continue
                print(f"  {name} {mode} batch {batch}: {step[mode, batch] * 1e3:.2f} ms/step", flush=True)
            del runner
            if device.type == "cuda":
                torch.cuda.empty_cache()
        for batch in args.batches:
            # each step reads every weight once, plus each row's K/V (mean context over the run),
            # at the copy's rate (bytes read + written per second: what HBM moves in all)
            kv_bytes = batch * (args.prompt_len + args.steps / 2) * L * 2 * nkv * hd * 2
            floor = (weight_bytes + kv_bytes) / bw
            best = min(
                (step[m, batch] for m in modes if step[m, batch] == step[m, batch]), default=float("nan")
            )
            row = [name, batch] + [f"{step[m, batch] * 1e3:.2f}" for m in modes]
            row += [f"{batch / best:.0f}", f"{floor * 1e3:.3f}", f"{floor / best:.0%}"]
            if "graphs" in modes and "deterministic" in modes:
                row.append(f"{step['graphs', batch] / step['deterministic', batch] - 1:+.0%}")
            rows.append(row)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    header = (
        ["shape", "batch"]
        + [f"{m} ms/step" for m in modes]
        + ["best tok/s", "floor ms/step", "best of floor"]
    )
    if "graphs" in modes and "deterministic" in modes:
        header.append("deterministic tok/s vs graphs")
    _table(header, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--shapes", default="smollm2-135m,llama3-8b")
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--batches", type=lambda x: [int(b) for b in x.split(",")], default=[1, 16, 64],
                    help="decode batch sizes (CUDA)")  # fmt: skip
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--no-deterministic", action="store_true")
    ap.add_argument("--modes", default=",".join(MODES), help="decode modes to time (CUDA)")
    args = ap.parse_args()
    if args.device.startswith("cuda") or args.shapes == "tiny":
        bench_cuda(args)
    else:
        bench_cpu(args)


if __name__ == "__main__":
    main()
