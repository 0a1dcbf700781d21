"""Decode benchmark: prints tables, asserts nothing.

CPU (default): the embedded SmolLM2-135M-Instruct, DeepInfer next to transformers' `generate`
on the same GGUF weights dequantized (quantization=None), same dtype, same process; then
DeepInfer's deterministic mode (benchmarks/bench_cpu.py measures the CPU default, which keeps
the file's blocks, beside llama.cpp):
    .venv/bin/python benchmarks/bench_decode.py [--dtype bfloat16|float32] [--steps 32]

CUDA: random weights at real model shapes, bf16, batch 1/16/64, decode eager, as CUDA graphs,
and as CUDA graphs in deterministic mode, beside the memory-bandwidth floor ((weight + KV-cache
bytes read per step) / measured device-to-device copy bandwidth). "best: device ms/step" is the
fastest mode's own device time a step (CUDA events around each step's launch), without the
device's idle time between steps while the host reads the tokens back and plans the next:
    python benchmarks/bench_decode.py --device cuda --shapes smollm2-135m,llama3-8b

The engine's own decode steps (`LLM.step`: schedule, forward, sampling, the tokens read back,
commit) with async scheduling off and on, beside the same floor (needs the tokenizers that
bench_e2e.py uses); with --constrained also rows under bench_e2e's JSON Schemas, each row's
tokens/s beside the free rows' (DSpark off: the constraint's own cost):
    python benchmarks/bench_decode.py --device cuda --engine --constrained --shapes llama3-8b \
        --batches 1,16,64 --repeat 3

The model families (FAMILY_SHAPES: Qwen3, Mistral with its sliding window, Phi-3, Gemma 2 and 3,
the Qwen3-30B-A3B mixture of experts). A MoE decode step's floor counts k experts a layer (the
least any routing reads; uniform routing of b rows reads E (1 - (1 - k/E)^b)):
    python benchmarks/bench_decode.py --device cuda --shapes qwen3-8b,qwen3-30b-a3b --modes graphs

Prefill (--prefill-len, one or more lengths): one prompt in one eager forward, in the default mode
and in deterministic mode, beside the compute floor: the model's FLOPs (2 x active parameters x
tokens, the LM head once; plus the causal attention's 4 x heads x head_dim per (query, seen key)
pair) at --peak-tflops; then one layer's attention alone (layer 0's window), the default prefill
kernel against deterministic mode's batch-invariant one:
    python benchmarks/bench_decode.py --device cuda --shapes llama3-8b --modes graphs,deterministic \
        --prefill-len 2048,8192,32768
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


# name: config.json of the family at that model's real shape (random weights)
_GQA = {
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 32768,
}
FAMILY_SHAPES = {
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "vocab_size": 151936,
        "rope_theta": 1e6,
        **_GQA,
    },
    "mistral-7b-swa": {
        "architectures": ["MistralForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "vocab_size": 32768,
        "sliding_window": 4096,
        **_GQA,
    },
    "phi3-mini": {
        "architectures": ["Phi3ForCausalLM"],
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32064,
        "sliding_window": 2047,
        "max_position_embeddings": 4096,
    },
    "gemma3-4b": {
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 34,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 262208,
        "sliding_window": 1024,
        "query_pre_attn_scalar": 256,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
    },
    "gemma2-9b": {
        "architectures": ["Gemma2ForCausalLM"],
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_hidden_layers": 42,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "vocab_size": 256000,
        "sliding_window": 4096,
        "query_pre_attn_scalar": 256,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
    },
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "max_position_embeddings": 32768,
    },
    # the code paths without a GPU
    "tiny-gemma3": {
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 1024,
        "sliding_window": 64,
        "sliding_window_pattern": 2,
    },
    "tiny-qwen3-moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 1024,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    },
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
    llm = LLM(None, dtype=dtype, device="cpu", seed=0, quantization=None)  # transformers' weights
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
    q8 = {}
    if not args.no_int8:  # the same model with int8 matrices (LLM(quantization="int8"))
        llm.runner.cache = None
        t = time.perf_counter()
        base, llm = llm, LLM(None, quantization="int8", device="cpu", seed=0)
        q8["load"] = time.perf_counter() - t
        ours_gen(1, 2)
        q8["prefill"] = args.prompt_len / ours_gen(1, 1)
        for b in (1, 8):
            q8[f"decode b={b}"] = ours_decode(b)
        llm = base
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
    if q8:
        print('\nint8 weights (LLM(quantization="int8"), same process)')
        _table(
            ["metric", args.dtype, "int8", "int8 vs " + args.dtype],
            [
                [f"{k} [{'s' if k == 'load' else 'tok/s'}]", f"{ours[k]:.2f}", f"{q8[k]:.2f}",
                 f"{ours[k] / q8[k]:.2f}x" if k == "load" else f"{q8[k] / ours[k]:.2f}x"]
                for k in q8
            ],
        )  # fmt: skip
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
def _config(name: str):
    from deepinfer.config import ModelConfig

    if name in FAMILY_SHAPES:
        return ModelConfig.from_hf(FAMILY_SHAPES[name])
    L, H, I, nh, nkv, hd, V, tied, theta = SHAPES[name]
    return ModelConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_layers=L, num_heads=nh,
                       num_kv_heads=nkv, head_dim=hd, rope_theta=theta, tie_word_embeddings=tied,
                       max_position_embeddings=4096)  # fmt: skip


def _random_weights(cfg, device, dtype):
    """Every weight the config implies (norms 1 (Gemma: 0, as it scales by 1 + w), the rest
    N(0, 0.02))."""
    g = torch.Generator(device=device).manual_seed(0)
    shapes = cfg.weight_shapes()
    norm = 0.0 if cfg.family.norm_offset else 1.0

    def make(name: str, pattern: str) -> torch.Tensor:
        size = [d for d, _ in shapes[pattern]]
        if "norm" in name:
            return torch.full(size, norm, device=device, dtype=dtype)
        return torch.randn(*size, device=device, dtype=dtype, generator=g) * 0.02

    names = ["embed_tokens.weight", "norm.weight"] + ([] if cfg.tie_word_embeddings else ["lm_head.weight"])
    w = {("" if n == "lm_head.weight" else "model.") + n: make(n, n) for n in names}
    for i in range(cfg.num_layers):
        for part in cfg.layer_weights(i):
            pattern = part if ".experts." not in part else "mlp.experts.*." + part.split(".", 3)[3]
            w[f"model.layers.{i}.{part}"] = make(part, pattern)
    return w


def _read_bytes(model) -> tuple[int, int]:
    """(bytes of weights a decode step reads at least, parameters a token runs through)."""
    dense = [model.lm_head] + [
        t for ly in model.layers for t in (ly.wqkv, ly.wo, ly.wgu, ly.wd) if t is not None
    ]
    read = sum(t.numel() * t.element_size() for t in dense)
    active = sum(t.numel() for t in dense)
    for ly in model.layers:
        if ly.moe is not None:
            k = ly.moe.top_k
            per = ly.moe.w_gate_up[0].numel() + ly.moe.w_down[0].numel()
            read += k * per * ly.moe.w_gate_up.element_size()  # (at least k experts: any routing)
            read += ly.moe.router.numel() * ly.moe.router.element_size()
            active += k * per + ly.moe.router.numel()
    return read, active


def _decode_floor(cfg, weight_bytes: int, batch: int, args, bw: float) -> float:
    """Seconds a decode step needs at least: every weight read once, plus each row's K/V (the
    mean context over the run, a sliding-window layer's window at most), at the copy's rate
    (bytes read + written per second: what HBM moves in all)."""
    ctx = args.prompt_len + args.steps / 2
    kv = sum(batch * min(ctx, cfg.window(i) or ctx) * 2 * cfg.num_kv_heads * cfg.head_dim * 2
             for i in range(cfg.num_layers))  # fmt: skip
    return (weight_bytes + kv) / bw


def _prefill_seconds(runner, n: int, device) -> float:
    """Seconds of one prefill step of an n-token prompt (the eager forward), the best of 3."""
    from deepinfer.sequence import Sequence

    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    per = -(-n // BLOCK_SIZE)
    runner.allocate(1 + per, BLOCK_SIZE, 1)
    best = float("inf")
    for _ in range(3):
        s = Sequence(0, None, [1 + i % 1000 for i in range(n)], sp, seed=0, eos_token_ids=(), max_len=1 << 20)
        s.block_table = list(range(1, 1 + per))
        _sync(device)
        t = time.perf_counter()
        runner.step([s], [n])
        _sync(device)
        best = min(best, time.perf_counter() - t)
    runner.cache = runner.graphs = None
    return best


def _attention_flops(cfg, n: int, layers=None) -> int:
    """FLOPs of the causal attention of an n-token prompt: 2 dots (q k, p v) of 2 x head_dim
    FLOPs per (query head, query, key it sees), over ``layers`` (default: every layer; a windowed
    layer's query sees at most its window)."""
    total = 0
    for i in range(cfg.num_layers) if layers is None else layers:
        w = min(cfg.window(i) or n, n)
        pairs = w * (w + 1) // 2 + (n - w) * w  # the sum over positions p of min(p + 1, w)
        total += 4 * cfg.num_heads * cfg.head_dim * pairs
    return total


def _attention_seconds(cfg, n: int, device, dtype) -> tuple[float, float]:
    """(default, deterministic) seconds of one layer's attention over an n-token prompt in one
    chunk: paged_prefill_triton against paged_invariant_triton, random q / K / V in blocks of
    BLOCK_SIZE (layer 0's window and soft-cap), the median of 10 launches by CUDA events."""
    from deepinfer.kernels.paged_attention import paged_invariant_triton, paged_prefill_triton

    nkv, hd = cfg.num_kv_heads, cfg.head_dim
    g = cfg.num_heads // nkv
    kw = dict(window=cfg.window(0), softcap=cfg.attn_softcap or 0.0)
    blocks = -(-n // BLOCK_SIZE)
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (1 + blocks, BLOCK_SIZE, nkv, hd)
    k, v = (torch.randn(shape, device=device, dtype=dtype, generator=gen) for _ in "kv")
    q = torch.randn(n, nkv, g, hd, device=device, dtype=dtype, generator=gen)
    table = torch.arange(1, 1 + blocks, device=device, dtype=torch.int32)[None]
    qs = torch.tensor([0, n], device=device)
    lens = torch.tensor([n], device=device)
    pos = torch.arange(n, device=device)
    calls = [
        lambda: paged_prefill_triton(q, k, v, table, qs, lens, n, **kw),
        lambda: paged_invariant_triton(q, k, v, table, qs, pos, n, **kw),
    ]
    return _event_seconds(calls[0]), _event_seconds(calls[1])


def _event_seconds(call) -> float:
    """The median of 10 launches, by CUDA events (after one untimed: compiles)."""
    call()
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return sorted(times)[len(times) // 2]


def _graph_seconds(calls, device) -> float:
    """Seconds a call: the calls captured in one CUDA graph, the best of 5 replays (each call runs
    once outside the capture first: compiles, sizes buffers); on the CPU the first call, once."""
    if device.type != "cuda":
        t = time.perf_counter()
        calls[0]()
        return time.perf_counter() - t
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for c in dict.fromkeys(calls):
            c()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    _sync(device)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        graph.replay()
        _sync(device)
        best = min(best, (time.perf_counter() - t) / len(calls))
    return best


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


def _prefill_row(name: str, model, n: int, args, device) -> list:
    """A row of the prefill table: an n-token prompt in the default and in deterministic mode."""
    t = _prefill_seconds(ModelRunner(model, cuda_graphs=False), n, device)
    print(f"  {name} prefill {n}: {t * 1e3:.1f} ms", flush=True)
    try:
        t_det = _prefill_seconds(ModelRunner(model, cuda_graphs=False, deterministic=True), n, device)
        print(f"  {name} prefill {n}, deterministic: {t_det * 1e3:.1f} ms", flush=True)
    except ValueError as e:  # (a mixture of experts has no deterministic mode)
        print(f"  {name} prefill {n}, deterministic: {e}", flush=True)
        t_det = float("nan")
    head = model.lm_head.numel()  # (the LM head runs for the last token only)
    dense = 2 * (_read_bytes(model)[1] - head) * n + 2 * head
    attention = _attention_flops(model.config, n)
    floor = (dense + attention) / (args.peak_tflops * 1e12)
    total = dense + attention
    return [name, n, f"{t * 1e3:.1f}", f"{t_det * 1e3:.1f}", f"{t_det / t:.2f}x", f"{n / t:.0f}",
            f"{total / 1e12:.1f} ({attention / total:.0%})", f"{floor * 1e3:.1f}", f"{floor / t:.0%}",
            f"{floor / t_det:.0%}"]  # fmt: skip


_PDL_DEFAULTS: list = []  # (fused.PDL_ROWS, norm_matmul.PDL) as the modules set them


def _set_pdl(on: bool) -> None:
    """Programmatic dependent launches of the Triton layer kernels as by default, or none (module
    settings)."""
    from deepinfer.kernels import fused, norm_matmul

    if not _PDL_DEFAULTS:
        _PDL_DEFAULTS.extend((fused.PDL_ROWS, norm_matmul.PDL))
    fused.PDL_ROWS, norm_matmul.PDL = _PDL_DEFAULTS if on else (0, False)


MODES = {  # name: ModelRunner keywords (and the model's fused_matmul, the kernels' pdl)
    "eager": dict(cuda_graphs=False),
    "graphs": dict(cuda_graphs=True),  # decode attention: the paged Triton kernel split over the keys
    "graphs-unsplit": dict(cuda_graphs=True, attention="triton"),  # the same, one program per row and KV head
    # the same, every matmul cuBLAS's and the norms, RoPE and GLU apart (no kernels/norm_matmul.py)
    "graphs-cublas": dict(cuda_graphs=True, fused_matmul=False),
    # the same, each Triton kernel launched after the one before it ends (no programmatic
    # dependent launches: the fused kernels, the attention and norm_matmul's)
    "graphs-serial": dict(cuda_graphs=True, pdl=False),
    "graphs-sdpa": dict(cuda_graphs=True, attention="sdpa"),  # keys gathered, torch SDPA, a length mask
    # batch-invariant Triton matmul, RMSNorm and attention in the same bucketed graphs
    "deterministic": dict(cuda_graphs=True, deterministic=True),
    # torch kernels over fixed tiles of rows, attention in fixed 256-key blocks (the CPU way)
    "deterministic-tiles": dict(cuda_graphs=True, deterministic=True, invariant_kernels=False),
}


def prefilled(runner, batch: int, prompt_len: int, steps: int):
    """(sequences, logits): a batch of equal prompts of ``prompt_len`` tokens prefilled, each
    row's blocks (room for ``steps`` more tokens) scattered over the pool."""
    from deepinfer.sequence import Sequence

    sp = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    seqs = [
        Sequence(i, None, list(range(1, prompt_len + 1)), sp, seed=0, eos_token_ids=(), max_len=1 << 20)
        for i in range(batch)
    ]
    per = -(-(prompt_len + steps + 8) // BLOCK_SIZE)  # each row's blocks, scattered over the pool
    if runner.cache is None or runner.cache.num_blocks != 1 + per * batch:  # (the graphs go with the cache)
        runner.allocate(1 + per * batch, BLOCK_SIZE, batch)
    ids = list(range(1, 1 + per * batch))
    random.Random(0).shuffle(ids)
    for i, s in enumerate(seqs):
        s.block_table = ids[i * per : (i + 1) * per]
    return seqs, runner.step(seqs, [len(s) for s in seqs])


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """Each row's greedy token, read back to the host, as the engine's step samples: its sampler
    (``deepinfer.kernels.sample``, the fused kernel on CUDA) with the per-row values copied from
    the host in two tensors. (torch's argmax over one row of a large vocabulary is one program:
    27 µs on the H200 at 128,256 tokens, where the sampler's greedy launch takes about 3.)"""
    from deepinfer import kernels

    B, dev = logits.shape[0], logits.device
    f = torch.tensor([[0.0] * B, [1.0] * B, [0.0] * B], dtype=torch.float32).to(dev, non_blocking=True)
    i = torch.tensor([[0] * B, [0] * B, [0] * B], dtype=torch.int64).to(dev, non_blocking=True)
    out = kernels.sample(logits, temperature=f[0], top_k=i[0], top_p=f[1], min_p=f[2], seed=i[1], step=i[2],
                         validate=False, kinds="greedy")  # fmt: skip
    return out.tokens.tolist()


def _decode_seconds(runner, batch, args, device, busy: list | None = None) -> float:
    """Mean seconds per decode step: prefill a batch of equal prompts, then greedy steps with a
    host read of the tokens each step (as the engine's loop does: ``greedy_tokens``). ``busy``
    (CUDA): gets the mean device seconds of a step's own work (CUDA events around ``runner.step``,
    so the device's idle time between steps, while the host samples, reads the tokens back and
    plans, is left out)."""
    seqs, logits = prefilled(runner, batch, args.prompt_len, args.steps)
    _sync(device)
    timed = busy is not None and device.type == "cuda"
    marks = []
    t = time.perf_counter()
    for _ in range(args.steps):
        nxt = greedy_tokens(logits)
        for s, tok in zip(seqs, nxt):
            s.output_token_ids.append(tok)
        if timed:
            marks.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            marks[-1][0].record()
        logits = runner.step(seqs, [1] * batch)
        if timed:
            marks[-1][1].record()
    _sync(device)
    seconds = (time.perf_counter() - t) / args.steps
    if timed:
        busy.append(sum(a.elapsed_time(b) for a, b in marks) / 1e3 / args.steps)
    return seconds


def bench_cuda(args) -> None:
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
    rows, prefill_rows, attention_rows = [], [], []
    for name in args.shapes.split(","):
        cfg = _config(name)
        weights = _random_weights(cfg, device, dtype)
        max_len = max(args.prompt_len + args.steps + 8, max(args.prefill_len, default=0) + 8)
        model = LlamaModel(cfg, weights, dtype=dtype, device=device, max_len=max_len)
        del weights
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for n in args.prefill_len:
            prefill_rows.append(_prefill_row(name, model, n, args, device))
            if device.type == "cuda":
                torch.cuda.empty_cache()
                t, t_det = _attention_seconds(cfg, n, device, dtype)
                flops = _attention_flops(cfg, n, [0])
                attention_rows.append([name, n, f"{t * 1e3:.2f}", f"{t_det * 1e3:.2f}", f"{t_det / t:.2f}x",
                                       f"{flops / t / 1e12:.0f}", f"{flops / t_det / 1e12:.0f}"])  # fmt: skip
        step, busy = {}, {}  # wall and device seconds a step, by (mode, batch)
        for mode in modes:
            # (a copy: the CPU check leaves graphs out, and fused_matmul is a model setting)
            kw = {k: v for k, v in MODES[mode].items() if device.type == "cuda" or k != "cuda_graphs"}
            model.fused_matmul = kw.pop("fused_matmul", True)
            _set_pdl(kw.pop("pdl", True))
            runner = ModelRunner(model, **kw)
            for batch in args.batches:
                try:
                    _decode_seconds(runner, batch, args, device)  # warm-up: captures this batch's graphs
                    step[mode, batch] = _decode_seconds(runner, batch, args, device)
                    got: list[float] = []  # the device's own time, in a run of its own (its events
                    _decode_seconds(runner, batch, args, device, got)  # cost the host time a step)
                    busy[mode, batch] = got[0] if got else float("nan")
                except Exception as e:  # a broken mode leaves its cells empty; the others still run
                    print(f"  {name} {mode} batch {batch}: FAILED {type(e).__name__}: {e}", flush=True)
                    step[mode, batch] = busy[mode, batch] = float("nan")
                    continue
                own = busy[mode, batch]
                print(f"  {name} {mode} batch {batch}: {step[mode, batch] * 1e3:.2f} ms/step"
                      + (f", of which the device's own work {own * 1e3:.2f}" if own == own else ""),
                      flush=True)  # fmt: skip
            del runner
            if device.type == "cuda":
                torch.cuda.empty_cache()
        for batch in args.batches:
            floor = _decode_floor(cfg, _read_bytes(model)[0], batch, args, bw)
            ok = [m for m in modes if step[m, batch] == step[m, batch]]
            fastest = min(ok, key=lambda m: step[m, batch], default=None)
            best = step[fastest, batch] if fastest else float("nan")
            dev = busy[fastest, batch] if fastest else float("nan")
            row = [name, batch] + [f"{step[m, batch] * 1e3:.2f}" for m in modes]
            row += [f"{batch / best:.0f}", f"{floor * 1e3:.3f}", f"{floor / best:.0%}"]
            row += [f"{dev * 1e3:.2f}", f"{floor / dev:.0%}"] if dev == dev else ["-", "-"]
            if "graphs" in modes and "deterministic" in modes:
                row.append(f"{step['graphs', batch] / step['deterministic', batch] - 1:+.0%}")
            rows.append(row)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    header = (
        ["shape", "batch"]
        + [f"{m} ms/step" for m in modes]
        + ["best tok/s", "floor ms/step", "best of floor", "best: device ms/step", "device of floor"]
    )
    if "graphs" in modes and "deterministic" in modes:
        header.append("deterministic tok/s vs graphs")
    _table(header, rows)
    if prefill_rows:
        print(f"\nPrefill, one prompt in one eager forward, default and deterministic mode; model FLOPs: 2 x "
              f"active parameters x tokens (the LM head once) + causal attention (its share in brackets); "
              f"floor: them at {args.peak_tflops:g} TFLOP/s")  # fmt: skip
        header = ["shape", "tokens", "default ms", "deterministic ms", "det / default", "default tok/s",
                  "model TFLOP", "floor ms", "default of floor", "deterministic of floor"]  # fmt: skip
        _table(header, prefill_rows)
    if attention_rows:
        print(
            "\nOne layer's attention over the prompt (one chunk): paged_prefill_triton (default) against "
            "paged_invariant_triton (deterministic); TFLOP/s of the causal attention's FLOPs"
        )
        _table(["shape", "tokens", "default ms", "deterministic ms", "det / default", "default TFLOP/s",
                "deterministic TFLOP/s"], attention_rows)  # fmt: skip


def _engine_seconds(llm, batch: int, args, schemas: list | None = None) -> tuple[float, int]:
    """Mean wall seconds of the engine's decode steps (``LLM.step``: schedule, forward, masks,
    sampling, tokens read back, accept, commit) at ``batch`` rows of ``args.prompt_len``-token
    prompts (each its own, so no prefix is shared), free or each under one of ``schemas``, and
    how many of them ran ahead (async scheduling). The prompts' prefill steps and the first
    decode step are left out of the timing."""
    n = args.steps + 4
    for i in range(batch):
        if schemas is None:
            sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        else:
            sp = SamplingParams(temperature=0, max_tokens=n, json_schema=schemas[i % len(schemas)])
        llm.add_request([1 + (i * 7919 + j * 31) % 20000 for j in range(args.prompt_len)], sp)
    sch = llm.scheduler
    while sch.waiting or any(not s.output_token_ids for s in sch.running):
        llm.step()
    llm.step()
    taken = llm.metrics()["decode_steps_ahead_taken"]
    t = time.perf_counter()
    for _ in range(args.steps):
        llm.step()
    seconds = (time.perf_counter() - t) / args.steps
    taken = llm.metrics()["decode_steps_ahead_taken"] - taken
    while llm.has_unfinished_requests():
        llm.step()
    return seconds, taken


def bench_engine(args) -> None:
    """The engine's decode steps with async scheduling off and on: one engine (random weights at
    each shape), free rows and (``--constrained``) rows under JSON Schemas, the modes in turn
    ``--repeat`` times after an untimed round, the best of each beside the floor of
    bench_cuda's table."""
    from bench_e2e import _schemas, _tokenizer_for, forced_length

    from deepinfer.loader.types import LoadedModel

    device = torch.device(args.device)
    bw = _copy_bandwidth(device)
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    kinds: dict[str, list | None] = {"free": None}
    if args.constrained:  # the maskbench schemas bench_e2e takes, each then a long string (no early end)
        kinds["constrained"] = [forced_length(x) for x in _schemas(16)]
    print(f"\n{dev_name}: copy bandwidth {bw / 1e9:.0f} GB/s; the engine's decode (LLM.step), bf16, random "
          f"weights, DSpark off, {args.steps} greedy steps after {args.prompt_len}-token prompts; best of "
          f"{args.repeat} runs a mode, the modes in turn")  # fmt: skip
    rows = []
    for name in args.shapes.split(","):
        cfg = _config(name)
        tok, eos, _ = _tokenizer_for(name)
        w = _random_weights(cfg, device, torch.bfloat16)
        loaded = LoadedModel(config=cfg, weights=w, tokenizer=tok, source=f"random {name}", eos_token_ids=eos)
        del w
        t0 = time.perf_counter()  # (DSpark off: no verify graphs to capture, no drafting)
        llm = LLM(loaded, device=args.device, dtype="bfloat16", max_num_seqs=max(args.batches),
                  max_model_len=args.prompt_len + args.steps + 64, seed=0, dspark=False)  # fmt: skip
        del loaded
        print(f"  {name}: engine built in {time.perf_counter() - t0:.0f} s", flush=True)
        async_default = llm.async_scheduling
        weight_bytes = _read_bytes(llm.model)[0]
        for batch in args.batches:
            got: dict[tuple[str, bool], list] = {(k, on): [] for k in kinds for on in (False, True)}
            for r in range(args.repeat + 1):  # (the first round warms up)
                for kind, schemas in kinds.items():
                    for on in (False, True):
                        llm.async_scheduling = on and async_default
                        seconds, taken = _engine_seconds(llm, batch, args, schemas)
                        if r:
                            got[kind, on].append((seconds, taken))
            floor = _decode_floor(cfg, weight_bytes, batch, args, bw)
            free_on = min(x[0] for x in got["free", True])
            for kind in kinds:
                off, on = min(x[0] for x in got[kind, False]), min(x[0] for x in got[kind, True])
                taken = min(x[1] for x in got[kind, True])
                print(f"  {name} {kind} batch {batch}: off {[f'{x[0] * 1e3:.2f}' for x in got[kind, False]]} "
                      f"ms, on {[f'{x[0] * 1e3:.2f}' for x in got[kind, True]]} ms", flush=True)  # fmt: skip
                rows.append([name, kind, batch, f"{off * 1e3:.2f}", f"{on * 1e3:.2f}", f"{off / on:.2f}x",
                             f"{taken}/{args.steps}", f"{floor * 1e3:.3f}", f"{floor / off:.0%}",
                             f"{floor / on:.0%}", f"{batch / on:.0f}", f"{free_on / on:.2f}x"])  # fmt: skip
        llm.async_scheduling = async_default
        del llm
        if device.type == "cuda":
            torch.cuda.empty_cache()
    _table(["shape", "rows", "batch", "async off ms/step", "async on ms/step", "on speed-up",
            "steps taken ahead", "floor ms/step", "off of floor", "on of floor", "on tok/s",
            "on, tok/s vs free"], rows)  # fmt: skip


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
    ap.add_argument("--prefill-len", type=lambda x: [int(n) for n in x.split(",") if n], default=[],
                    help="time a prefill of each of these many tokens, e.g. 2048,8192,32768")  # fmt: skip
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak (H200: 989)")
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--no-deterministic", action="store_true")
    ap.add_argument("--no-int8", action="store_true", help="CPU: skip the int8-weights column")
    ap.add_argument("--modes", default=",".join(MODES), help="decode modes to time (CUDA)")
    ap.add_argument("--engine", action="store_true",
                    help="the engine's decode steps (LLM.step), async scheduling off and on")  # fmt: skip
    ap.add_argument("--constrained", action="store_true",
                    help="--engine: rows under JSON Schemas too (from $DEEPINFER_SHARED_DATA)")  # fmt: skip
    args = ap.parse_args()
    if args.engine:
        bench_engine(args)
    elif args.device.startswith("cuda") or args.shapes.startswith("tiny"):
        bench_cuda(args)
    else:
        bench_cpu(args)


if __name__ == "__main__":
    main()
