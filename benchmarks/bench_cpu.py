"""The embedded default on the CPU beside llama.cpp: prints a table, asserts nothing.

The same GGUF file (the embedded SmolLM2-135M-Instruct, Q4_1 with a Q8_0 embedding), the same
prompts (token ids), greedy decoding at batch 1. Every measurement runs in a fresh process
(load time and peak memory are a process's), and the engines take turns, round after round,
so that a neighbour's load on a shared machine falls on both; the table gives each metric's
median over the rounds:

    .venv/bin/python benchmarks/bench_cpu.py [--rounds 5] [--prompt-len 256] [--decode 64]
        [--threads default|N] [--dense] [--quality TOKENS] [--breakdown STEPS]

- load: building the engine from the file (``LLM()``, ``Llama()``), imports excluded. The runs
  share a plane cache of their own (deepinfer/loader/plane_cache.py), written by one run
  before the rounds: its load is the "first load" row;
- prefill: prompt tokens a second, to the first sampled token (each repeat's prompt differs in
  its first token, so neither engine's prefix cache serves it);
- decode: tokens a second after the first, each engine's own generation loop (``LLM.step``;
  llama-cpp-python's ``Llama.generate``), sampling included;
- peak memory: the process's peak resident set (VmHWM), imports included (torch's own is about
  220 MiB; the row below it gives each process's resident set after its imports).

``--threads default``: each engine's own thread policy (DeepInfer: deepinfer/_threads.py;
llama-cpp-python: half the cores for decode, every core for prompts); N: both use N threads.
``--dense``: a third column, DeepInfer with ``quantization=None`` (the weights dequantized to
bfloat16). ``--quality N``: instead, greedy outputs of N tokens and next-token logits of the
default and of the weights dequantized to bfloat16, each against float32 weights.
``--breakdown N``: instead, where N decode steps of the default go (one thread, in this process:
the int4 matmuls by shape, the attention, the rest), beside the matmuls' floor (their bytes over
the read bandwidth). ``--batches 1,2,4,8,16``: instead, decode steps of B rows together, the
attention of the B rows in one C call against torch's ops for it, beside the floor of a step's
weight reads (in this process; ``--prompt-len`` sets the prompts). The llama.cpp column needs
llama-cpp-python (in the ``bench`` extra; it builds llama.cpp from source in about 8 minutes);
without it that column is skipped, with a message.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _table(header, rows):
    """bench_decode's Markdown table (imported here, not at the top: a llama.cpp child process
    must not import torch, whose memory it would count)."""
    sys.path.insert(0, HERE)
    from bench_decode import _table as table

    table(header, rows)


GOALS = {"decode": 1.0, "prefill": 1.0, "peak_mib": 2.0, "load_s": 0.5}


def _rss_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _prompts(n: int, length: int) -> list[list[int]]:
    """n prompts of ``length`` token ids of ordinary text, differing in their first token."""
    from deepinfer.loader import load_model

    tok = load_model(None, keep_blocks=True).tokenizer
    text = " ".join(
        "The committee reviewed the annual report on regional water supplies and asked for a revised "
        "budget, a timeline for the new pumping stations, and a survey of household use.".split()
        * (length // 20 + 2)
    )
    ids = tok.encode(text).ids[: length - 1]
    return [[100 + i] + ids for i in range(n)]


# -- workers: one engine, one process --------------------------------------------------------
def _work_deepinfer(args, prompts) -> dict:
    t = time.perf_counter()
    from deepinfer import LLM, SamplingParams

    imports = time.perf_counter() - t
    rss_import = _rss_mib("VmRSS")
    kw = {} if args.variant == "default" else {"quantization": None}
    t = time.perf_counter()
    llm = LLM(None, device="cpu", seed=0, **kw)
    load = time.perf_counter() - t
    st = llm._step_threads  # (every core on steps while no other process keeps one busy)
    threads = (
        f"{st.base}-{st.cores} by load" if st is not None and st.enabled else str(st.current if st else 1)
    )
    llm.generate([[1, 2, 3, 4, 5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                 use_tqdm=False)  # fmt: skip
    prefill, decode = [], []
    for p in prompts:
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=args.decode + 1, ignore_eos=True))
        t0 = time.perf_counter()
        llm.step()  # the prompt, and the first token
        t1 = time.perf_counter()
        while llm.has_unfinished_requests():
            llm.step()
        t2 = time.perf_counter()
        prefill.append(len(p) / (t1 - t0))
        decode.append(args.decode / (t2 - t1))
    return dict(load_s=load, imports_s=imports, prefill=max(prefill), decode=max(decode),
                threads=threads, peak_mib=_rss_mib("VmHWM"), import_mib=rss_import,
                quantization=str(llm.quantization))  # fmt: skip


def _work_llama_cpp(args, prompts) -> dict:
    t = time.perf_counter()
    from llama_cpp import Llama

    from deepinfer.loader import default_gguf_path

    imports = time.perf_counter() - t
    rss_import = _rss_mib("VmRSS")
    path = default_gguf_path()
    kw = (
        {}
        if args.threads == "default"
        else dict(n_threads=int(args.threads), n_threads_batch=int(args.threads))
    )
    t = time.perf_counter()
    m = Llama(model_path=path, n_ctx=args.n_ctx, verbose=False, seed=0, **kw)
    load = time.perf_counter() - t

    def run(tokens, n):
        """Seconds to the first token and to the n-th, llama-cpp-python's greedy loop."""
        t0 = time.perf_counter()
        first = None
        for i, _ in enumerate(m.generate(tokens, temp=0.0, top_k=1, reset=True)):
            if i == 0:
                first = time.perf_counter()
            if i == n - 1:
                break
        return first - t0, time.perf_counter() - first

    run([1, 2, 3, 4, 5, 6, 7, 8], 4)
    prefill, decode = [], []
    for p in prompts:
        a, b = run(p, args.decode + 1)
        prefill.append(len(p) / a)
        decode.append(args.decode / b)
    return dict(load_s=load, imports_s=imports, prefill=max(prefill), decode=max(decode),
                threads=f"{m.context_params.n_threads}/{m.context_params.n_threads_batch}",
                peak_mib=_rss_mib("VmHWM"), import_mib=rss_import)  # fmt: skip


# -- quality: the default against the dequantized weights -------------------------------------
QUALITY_PROMPTS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis briefly.",
    "List three prime numbers.", "What is 12 times 7?", "Translate 'good morning' into Spanish.",
    "Name a famous painting by Leonardo da Vinci.", "Give me a synonym for 'happy'.",
    "What does a CPU do?", "Describe a cat in five words.", "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in Celsius?", "Suggest a name for a pet goldfish.",
    "Write a Python function that adds two numbers.", "Why is the sky blue?", "What is JSON?",
]  # fmt: skip


def quality(tokens: int) -> None:
    """Greedy text and next-token logits of the default (int4 planes, bfloat16 activations), of
    the default with int8 activations in every matmul (the C GEMV of a batch-1 decode) and of the
    weights dequantized to bfloat16, each against the weights dequantized to float32."""
    import torch

    from deepinfer import LLM, SamplingParams

    kw = dict(device="cpu", seed=0, kv_cache_memory=64 << 20)
    engines = {"default": LLM(None, **kw), "bfloat16": LLM(None, quantization=None, dtype="bfloat16", **kw),
               "float32": LLM(None, quantization=None, dtype="float32", **kw)}  # fmt: skip
    ref = engines["float32"]
    msgs = [[{"role": "user", "content": p}] for p in QUALITY_PROMPTS]
    sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    outs = {k: [o.token_ids for o in e.chat(msgs, sp, use_tqdm=False)] for k, e in engines.items()}
    ids = [ref.tokenizer.encode(ref.tokenizer.apply_chat_template(m, True)) for m in msgs]
    last = {k: torch.stack([x[-1] for x in e.model.logits(ids)]) for k, e in engines.items()}
    # a batch-1 decode's matmuls (kernels/int4_gemv.py: int8 activations) for every row here
    # (16 prompts decode at once, prompts prefill: torch's bfloat16 kernel in "default")
    from deepinfer.kernels import int4_gemv, quantized

    if int4_gemv.available():
        rows, quantized.GEMV_ROWS = quantized.GEMV_ROWS, 1 << 20
        try:
            e = engines["default"]
            outs["default, int8 activations"] = [o.token_ids for o in e.chat(msgs, sp, use_tqdm=False)]
            last["default, int8 activations"] = torch.stack([x[-1] for x in e.model.logits(ids)])
        finally:
            quantized.GEMV_ROWS = rows

    def agree(a, b):  # tokens before the first difference
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    print(f"\nQuality: {len(msgs)} chat prompts, greedy, {tokens} tokens; each against float32 weights "
          "(the file's blocks dequantized to float32)")  # fmt: skip
    rows = []
    for k in ("default", "default, int8 activations", "bfloat16"):
        if k not in outs:
            continue
        same = [agree(a, b) for a, b in zip(outs[k], outs["float32"])]
        p, q = torch.softmax(last[k].float(), -1), torch.softmax(last["float32"], -1)
        top = (last[k].argmax(-1) == last["float32"].argmax(-1)).float().mean()
        rows.append([k, f"{sum(x == tokens for x in same)}/{len(same)}", f"{sum(same) / len(same):.1f}",
                     f"{top:.0%}", f"{(last[k].float() - last['float32']).abs().amax(-1).mean():.3f}",
                     f"{0.5 * (p - q).abs().sum(-1).mean():.4f}"])  # fmt: skip
    header = ["weights", f"identical {tokens}-token outputs", "mean tokens before a difference",
              "first token agrees", "max logit error (mean)", "total variation, next token"]  # fmt: skip
    _table(header, rows)


# -- breakdown: where a decode step goes ------------------------------------------------------
def breakdown(steps: int, prompt_len: int) -> None:
    """The default's decode steps at batch 1 on one thread, in this process: each step's CPU time
    (``time.thread_time``: the time this thread ran, so a neighbour taking the core is left out)
    and its pieces, the int4 matmuls by shape and the attention, medians over the steps; beside
    the floor of the matmuls, their bytes over this machine's read bandwidth (a sum, one thread)."""
    import torch

    from deepinfer import LLM, SamplingParams
    from deepinfer.kernels import quantized
    from deepinfer.models import llama

    llm = LLM(None, device="cpu", seed=0)
    if llm._step_threads is not None:
        llm._step_threads.enabled = False
    torch.set_num_threads(1)
    spent: dict[str, float] = {}
    calls: dict[str, int] = {}
    nbytes: dict[str, int] = {}

    def timed(name, fn, size=0):
        def run(*a, **k):
            t = time.thread_time()
            out = fn(*a, **k)
            spent[name] = spent.get(name, 0.0) + time.thread_time() - t
            calls[name] = calls.get(name, 0) + 1
            nbytes[name] = nbytes.get(name, 0) + size
            return out

        return run

    mm, attend = quantized.matmul, llama.paged_decode_torch

    def matmul(x, w):
        k, n = w.shape
        name = "LM head" if n == llm.model.logits_width else f"int4 {k}x{n}"
        return timed(name, mm, getattr(w, "nbytes", 0))(x, w)

    quantized.matmul, llama.paged_decode_torch = matmul, timed("attention (30 layers)", attend)
    try:
        prompt = _prompts(1, prompt_len)[0]
        llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=steps + 9, ignore_eos=True))
        for _ in range(8):  # the prompt, then a few steps
            llm.step()
        per_step: dict[str, list[float]] = {}
        step_times = []
        for _ in range(steps):
            spent.clear()
            t = time.thread_time()
            llm.step()
            step_times.append(time.thread_time() - t)
            for k, v in spent.items():
                per_step.setdefault(k, []).append(v)
    finally:
        quantized.matmul, llama.paged_decode_torch = mm, attend
    bandwidth = _read_bandwidth()
    med = {k: statistics.median(v) for k, v in per_step.items()}
    step = statistics.median(step_times)
    mats = sorted(k for k in med if k != "attention (30 layers)")
    weight_bytes = sum(nbytes[k] / calls[k] * (calls[k] // (steps + 8)) for k in mats)
    print(f"\nA decode step at batch 1, one thread: {steps} steps from position {prompt_len + 8}; "
          f"CPU time of the thread, medians; read bandwidth {bandwidth / 1e9:.1f} GB/s; load average "
          f"{os.getloadavg()[0]:.1f}; commit {_commit()}")  # fmt: skip
    rows = []
    for k in [*mats, "attention (30 layers)"]:
        n = calls[k] // (steps + 8) if k != "attention (30 layers)" else 30
        gbs = f"{nbytes[k] / calls[k] * n / med[k] / 1e9:.1f}" if k in mats else ""
        rows.append([k, str(n), f"{med[k] * 1e3:.2f}", gbs])
    inside = sum(med.values())
    rows.append(["the rest (norms, RoPE, GLU, the engine, ...)", "", f"{(step - inside) * 1e3:.2f}", ""])
    rows.append(["step", "", f"{step * 1e3:.2f}", f"({1 / step:.0f} tok/s)"])
    floor = weight_bytes / bandwidth
    rows.append(
        [
            "floor of the matmuls (bytes / read bandwidth)",
            "",
            f"{floor * 1e3:.2f}",
            f"{weight_bytes / 1e6:.0f} MB",
        ]
    )
    _table(["piece", "calls a step", "ms a step", "GB/s read"], rows)


def _read_bandwidth() -> float:
    """This machine's read bandwidth in bytes a second: a sum over 256 MiB, one thread."""
    import torch

    a = torch.ones(256 << 20, dtype=torch.uint8).view(torch.int64)
    reads = []
    for _ in range(5):
        t = time.thread_time()
        a.sum()
        reads.append(time.thread_time() - t)
    return 8 * a.numel() / min(reads[1:])


def batched(batches: list[int], prompt_len: int, rounds: int = 8, steps: int = 4) -> None:
    """Decode steps of B rows together (B greedy requests of ``prompt_len``-token prompts), in
    this process, with the engine's own thread policy: each step's wall time with the B rows'
    attention in one C call (`decode_attention_c.decode_attention_rows`) and with torch's ops
    for it (that call unloaded: the gather of every row's keys padded to the longest, two
    batched matmuls and a softmax), ``steps`` steps of each in turn for ``rounds`` rounds over
    the same requests, medians; beside the floor of a step, its weights' bytes read once at
    this machine's read bandwidth."""
    import torch

    from deepinfer import LLM, SamplingParams
    from deepinfer.kernels import quantized
    from deepinfer.kernels.int4_gemv import STATE

    llm = LLM(None, device="cpu", seed=0)
    rows_call = STATE.attention_rows
    if rows_call is None:
        print(f"the C library is not loaded ({STATE.why}): nothing to compare")
        return
    bandwidth = _read_bandwidth()
    seen: dict[int, int] = {}  # the bytes of every matrix a step multiplies by, once each
    mm = quantized.matmul

    def counted(x, w):
        seen[id(w)] = getattr(w, "nbytes", 0)
        return mm(x, w)

    table = []
    for b in batches:
        for i, prompt in enumerate(_prompts(b, prompt_len)):
            sp = SamplingParams(temperature=0, max_tokens=2 + rounds * 2 * (steps + 1), ignore_eos=True)
            llm.add_request(prompt, sp, request_id=f"b{b}-{i}")
        llm.step()  # the prompts
        quantized.matmul = counted
        try:
            llm.step()
        finally:
            quantized.matmul = mm
        times: dict[str, list[float]] = {"C": [], "torch": []}
        try:
            for _ in range(rounds):
                for mode in times:
                    STATE.attention_rows = rows_call if mode == "C" else None
                    llm.step()  # (the first step of a mode is not timed)
                    for _ in range(steps):
                        t = time.perf_counter()
                        llm.step()
                        times[mode].append(time.perf_counter() - t)
        finally:
            STATE.attention_rows = rows_call
        for i in range(b):
            llm.abort_request(f"b{b}-{i}")
        c, ref = (statistics.median(times[m]) for m in ("C", "torch"))
        floor = sum(seen.values()) / bandwidth
        table.append([str(b), f"{c * 1e3:.2f}", f"{ref * 1e3:.2f}", f"{c / ref:.2f}x", f"{b / c:.0f}",
                      f"{b / ref:.0f}", f"{floor * 1e3:.2f}", f"{floor / c:.0%}"])  # fmt: skip
    print(f"\nDecode steps of B rows together, prompts of {prompt_len} tokens, greedy, the engine's "
          f"threads ({torch.get_num_threads()} at the end); {rounds} rounds of {steps} steps of each, "
          f"medians; read bandwidth {bandwidth / 1e9:.1f} GB/s; load average {os.getloadavg()[0]:.1f}; "
          f"commit {_commit()}")  # fmt: skip
    _table(["B", "C attention ms/step", "torch attention ms/step", "C / torch", "tok/s (C)",
            "tok/s (torch)", "floor ms/step", "of floor (C)"], table)  # fmt: skip


# -- the parent: interleaved rounds ----------------------------------------------------------
def _run(engine: str, variant: str, args, prompts_file: str, cache: str) -> dict | None:
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", DEEPINFER_PLANE_CACHE=cache)
    if args.threads != "default":
        env["DEEPINFER_NUM_THREADS"] = str(args.threads)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--variant", variant,
           "--prompts", prompts_file, "--decode", str(args.decode), "--threads", str(args.threads),
           "--n-ctx", str(args.n_ctx)]  # fmt: skip
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        how = f"signal {signal.Signals(-r.returncode).name}" if r.returncode < 0 else f"exit {r.returncode}"
        print(f"{engine} ({variant}) failed ({how}):\n{r.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def _machine() -> str:
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True
        )
        return out.stdout.strip() or "?"
    except OSError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--decode", type=int, default=64, help="tokens decoded after the first")
    ap.add_argument("--repeats", type=int, default=2, help="prompts per process (its best counts)")
    ap.add_argument("--threads", default="default")
    ap.add_argument("--n-ctx", type=int, default=2048, help="llama.cpp's context (its KV cache)")
    ap.add_argument("--dense", action="store_true", help="also DeepInfer with quantization=None")
    ap.add_argument("--quality", type=int, default=0, metavar="TOKENS",
                    help="only the quality table: TOKENS-token greedy outputs, against float32")  # fmt: skip
    ap.add_argument("--breakdown", type=int, default=0, metavar="STEPS",
                    help="only where STEPS decode steps go (one thread, in this process)")  # fmt: skip
    ap.add_argument("--batches", default="", metavar="B,B,...",
                    help="only batched decode: B rows a step, C attention against torch")  # fmt: skip
    ap.add_argument("--worker", choices=["deepinfer", "llama_cpp"], help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="default", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        with open(args.prompts) as f:
            prompts = json.load(f)
        work = _work_deepinfer if args.worker == "deepinfer" else _work_llama_cpp
        print(json.dumps(work(args, prompts)))
        return

    if args.quality:
        return quality(args.quality)
    if args.breakdown:
        return breakdown(args.breakdown, args.prompt_len)
    if args.batches:
        return batched([int(b) for b in args.batches.split(",")], args.prompt_len)
    import importlib.util
    import tempfile

    engines = [("deepinfer", "default")] + ([("deepinfer", "dense")] if args.dense else [])
    if importlib.util.find_spec("llama_cpp") is None:
        print("llama-cpp-python is not installed: the llama.cpp column is skipped. Install it with "
              "`.venv/bin/pip install -e \".[bench]\"` (it builds llama.cpp from source, about 8 minutes; "
              "CMAKE_ARGS=\"-DGGML_NATIVE=ON\" builds for this CPU; where the CPU reports AMX but the OS "
              "does not enable it, add -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF with "
              "GGML_NATIVE=OFF, as benchmarks/RESULTS.md shows).\n")  # fmt: skip
    else:
        engines.insert(0, ("llama_cpp", "default"))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(_prompts(args.repeats, args.prompt_len), f)
        prompts_file = f.name
    load_before = os.getloadavg()[0]
    results: dict[tuple[str, str], list[dict]] = {e: [] for e in engines}
    cache = tempfile.mkdtemp(prefix="bench_cpu_cache_")  # the plane cache of these runs only
    try:
        first = _run("deepinfer", "default", args, prompts_file, cache)  # converts, writes the cache
        for r in range(args.rounds):
            order = engines if r % 2 == 0 else engines[::-1]  # who goes first alternates
            for e in order:
                out = _run(*e, args, prompts_file, cache)
                if out is not None:
                    results[e].append(out)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        os.unlink(prompts_file)
        shutil.rmtree(cache, ignore_errors=True)
    load_after = os.getloadavg()[0]

    def med(e, key):
        vals = [x[key] for x in results[e]]
        return statistics.median(vals) if vals else float("nan")

    names = {("llama_cpp", "default"): "llama.cpp", ("deepinfer", "default"): "DeepInfer (default)",
             ("deepinfer", "dense"): "DeepInfer (quantization=None)"}  # fmt: skip
    cols = [e for e in engines if results[e]]
    peer = ("llama_cpp", "default") if results.get(("llama_cpp", "default")) else None
    ours = ("deepinfer", "default")
    print(f"\nCPU: {_machine()}; load average {load_before:.1f} before, {load_after:.1f} after; commit "
          f"{_commit()}; {args.rounds} rounds, medians; prompt {args.prompt_len} tokens, decode "
          f"{args.decode} tokens at batch 1, greedy")  # fmt: skip
    rows = [
        ("decode, batch 1 [tok/s]", "decode", "{:.1f}"),
        (f"prefill, {args.prompt_len}-token prompt [tok/s]", "prefill", "{:.0f}"),
        ("peak memory [MiB]", "peak_mib", "{:.0f}"),
        ("  of which after imports [MiB]", "import_mib", "{:.0f}"),
        ("load [s]", "load_s", "{:.2f}"),
    ]
    header = ["metric", *(names[e] for e in cols)] + (
        ["DeepInfer / llama.cpp", "goal", "met"] if peer else []
    )
    table = []
    for label, key, fmt in rows:
        row = [label, *(fmt.format(med(e, key)) for e in cols)]
        if peer:
            ratio = med(ours, key) / med(peer, key)
            goal, met = "", ""
            if key in ("decode", "prefill"):
                goal, met = f">= {GOALS[key]:.2f}x", "yes" if ratio >= GOALS[key] else "no"
            elif key == "peak_mib":
                goal, met = f"<= {GOALS[key]:.2f}x", "yes" if ratio <= GOALS[key] else "no"
            elif key == "load_s":
                goal, met = f"<= {GOALS[key]} s", "yes" if med(ours, key) <= GOALS[key] else "no"
            row += [f"{ratio:.2f}x", goal, met]
        table.append(row)
    if first is not None:  # the first load of a file: no plane cache yet
        row = ["first load (writes the plane cache) [s]"]
        row += [f"{first['load_s']:.2f}" if e == ours else "" for e in cols]
        if peer:
            met = "yes" if first["load_s"] <= GOALS["load_s"] else "no"
            row += [f"{first['load_s'] / med(peer, 'load_s'):.2f}x", f"<= {GOALS['load_s']} s", met]
        table.append(row)
    table.append(["threads (decode/prompt)", *(str(results[e][0]["threads"]) for e in cols)]
                 + (["", "", ""] if peer else []))  # fmt: skip
    _table(header, table)
    for e in cols:
        spread = [f"{x['decode']:.0f}" for x in results[e]]
        print(f"{names[e]}: decode per round {', '.join(spread)} tok/s")


if __name__ == "__main__":
    main()
