#!/usr/bin/env python
"""Sampling benchmark: the fused Triton kernel against plain torch and xgrammar + torch.

For B in {1, 16, 128, 512}, V in {49152, 128256, 262144}, fp32 and bf16 logits, a random
bitmask (half the tokens allowed), µs per call of

- fused greedy    ``deepinfer.kernels.sample(temperature=0)`` (mask + argmax over (row, tile)
                  programs; the row's last program combines them: one launch)
- fused top-p     temperature 1, top_p 0.9
- fused top-k     temperature 1, top_k 50
- fused top-k+p   temperature 1, top_k 50, top_p 0.9
- torch           unpack the bitmask + masked_fill, softmax, sort-based top-p, multinomial
- xgr+torch       xgrammar's ``apply_token_bitmask_inplace``, then the same torch sampling
                  (column left empty if xgrammar is not importable)
- FlashInfer      with ``--flashinfer``: the bitmask applied (xgrammar's kernel, else ours),
                  FlashInfer's softmax, then its top-p / top-k / top-k + top-p sampling from
                  the probabilities, as vLLM's FlashInfer sampler calls it (flashinfer_peer.py
                  builds it from the wheel's headers); "FI bad" counts rows whose token the
                  mask forbids or that is below the 50th largest allowed score (0 expected)

(``--no-peers``: the last two left out), the top-k calls' tokens against the torch reference
on the device (``≠ ref``: rows that differ), and the bandwidth of the fused greedy call
(logits read once + the bitmask) against the ``--floor`` (4.3 TB/s: device-to-device copy
measured on the H200). Each call is timed by ``triton.testing.do_bench_cudagraph`` (CUDA-graph
replay: device time without Python launch overhead), falling back to ``do_bench`` where
capture fails (marked ``*``). Not a test: it prints a table and asserts nothing.

Usage (from the repository root, on a CUDA machine)::

    python benchmarks/bench_sampling.py [--quick] [--batches 128 512] [--vocabs 128256] [--dtypes float32]
    python benchmarks/bench_sampling.py --compare --batches 128 512   # per-row vs split pass 1
    python benchmarks/bench_sampling.py --split-sweep --compare --batches 128 --vocabs 128256
    python benchmarks/bench_sampling.py --quick --tuning pdl=0      # A/B of a SampleTuning field
    python benchmarks/bench_sampling.py --topk-sweep --batches 1 128 --vocabs 128256  # top-k layouts
    python benchmarks/bench_sampling.py --cpu [--logits model] [--threads 2]  # the CPU path vs torch
    python benchmarks/bench_sampling.py --flashinfer --dtypes float32   # FlashInfer's columns too
"""

from __future__ import annotations

import argparse
import dataclasses
import os

os.environ.setdefault("TRITON_INTERPRET", "0")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

from deepinfer import kernels  # noqa: E402
from deepinfer.kernels import DEFAULT_TUNING, SampleTuning  # noqa: E402

try:  # optional peer
    from xgrammar import apply_token_bitmask_inplace as _xgr_apply
except Exception:  # noqa: BLE001 - any import failure means "not available"
    _xgr_apply = None

BATCHES = (1, 16, 128, 512)
VOCABS = (49152, 128256, 262144)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _bench(fn) -> tuple[float, bool]:
    """(µs per call, True if CUDA-graph replay was used)."""
    fn()
    torch.cuda.synchronize()
    try:
        ms = triton.testing.do_bench_cudagraph(fn, rep=20)
        return ms * 1e3, True
    except Exception:  # noqa: BLE001 - capture unsupported by this op: time eagerly
        torch.cuda.synchronize()
        return triton.testing.do_bench(fn, warmup=10, rep=20) * 1e3, False


def torch_sample(logits: torch.Tensor, allowed: torch.Tensor | None, top_p: float) -> torch.Tensor:
    """Plain torch: mask, softmax, sort-based top-p, multinomial."""
    x = logits.float()
    if allowed is not None:
        x = x.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    cum = sorted_p.cumsum(dim=-1)
    sorted_p = sorted_p.masked_fill(cum - sorted_p >= top_p, 0.0)
    choice = torch.multinomial(sorted_p, 1)
    return order.gather(1, choice).squeeze(1)


def torch_unpack(bitmask: torch.Tensor, V: int) -> torch.Tensor:
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().view(bitmask.shape[0], -1)[:, :V]


MODEL_LOGITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache", "smollm2-logits.pt")
_recorded: dict[str, torch.Tensor] = {}  # the recorded logits, by device


def record_logits(path: str, rows: int = 64) -> None:
    """Save ``rows`` next-token logit rows of the embedded SmolLM2-135M-Instruct (CPU, real chat
    prompts, sampled at temperature 0.8) as float16 [rows, 49152]: ``--logits model`` tiles them."""
    from deepinfer import LLM, SamplingParams

    llm = LLM(None, device="cpu")
    got: list[torch.Tensor] = []
    sample = llm.sample_fn

    def recording(logits, **kw):
        got.append(logits.detach().to(torch.float16).cpu())
        return sample(logits, **kw)

    llm.sample_fn = recording
    asks = ["Write a haiku about rain.", "List three uses of copper.", "What is a prime number?",
            "Describe Paris as JSON with name and population."]  # fmt: skip
    msgs = [[{"role": "user", "content": a}] for a in asks]
    llm.chat(msgs, SamplingParams(temperature=0.8, seed=0, max_tokens=-(-rows // len(asks)), ignore_eos=True),
             use_tqdm=False)  # fmt: skip
    out = torch.cat(got)[:rows].contiguous()
    torch.save(out, path)
    print(f"saved {tuple(out.shape)} float16 logits of the embedded model to {path}")


def make_logits(
    B: int, V: int, dtype: torch.dtype, gen, kind: str, device: str = "cuda"
) -> torch.Tensor | None:
    """[B, V] logits on ``device`` (``gen``'s): N(0, 4) noise ("random"), or the embedded model's
    recorded rows tiled to B rows ("model", V = 49,152 only: None for other V)."""
    if kind == "random":
        return (torch.randn(B, V, device=device, generator=gen) * 2).to(dtype)
    rec = _recorded.get(device)
    if rec is None:
        rec = _recorded[device] = torch.load(MODEL_LOGITS).to(device)
    if rec.shape[1] != V:
        return None
    reps = -(-B // rec.shape[0])
    return rec.repeat(reps, 1)[:B].to(dtype).contiguous()


def _mask_inplace(x: torch.Tensor, bitmask: torch.Tensor) -> None:
    """The bitmask applied to float logits in place, in one launch: xgrammar's kernel, else
    ``kernels.apply_bitmask_`` (the same work: one read of the mask, a store of each forbidden
    token's -inf)."""
    if _xgr_apply is not None:
        _xgr_apply(x, bitmask)
    else:
        kernels.apply_bitmask_(x, bitmask)


def flashinfer_row(row: dict, fi, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """FlashInfer's columns (``flashinfer_peer.Sampler``): µs of top-p 0.9, top-k 50 and both, and
    the rows of those calls whose token the mask forbids or that lies below the 50th largest
    allowed score."""
    masked = logits.to(torch.float32, copy=True)
    _mask_inplace(masked, bitmask)
    # float32 logits: each call masks this copy in place again (a no-op), as the xgrammar column
    # does; bfloat16: the cast to float32 is part of each call
    cast = logits.dtype != torch.float32

    def call(k, p):
        return lambda: fi(logits.float() if cast else masked, bitmask, k, p)

    kth = masked.topk(50, dim=-1).values[:, -1:]
    bad = 0
    for name, k, p in (("fi_top_p", 0, 0.9), ("fi_top_k", 50, 1.0), ("fi_top_kp", 50, 0.9)):
        row[name], g = _bench(call(k, p))
        row["graph"] &= g
        got = masked.gather(1, call(k, p)().long()[:, None])
        bad += int((got == float("-inf")).sum()) if k == 0 else int((got < kth).sum())
    row["fi_bad"] = bad


def run(dtype: torch.dtype, B: int, V: int, floor_tbs: float, peers: bool = True, kind: str = "random",
        tuning: SampleTuning = DEFAULT_TUNING, fi=None) -> dict | None:  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(B * V)
    logits = make_logits(B, V, dtype, gen, kind)
    if logits is None:
        return None
    W = (V + 31) // 32
    bitmask = torch.randint(-(2**31), 2**31 - 1, (B, W), device="cuda", dtype=torch.int32, generator=gen)
    f32 = lambda v: torch.full((B,), v, device="cuda", dtype=torch.float32)  # noqa: E731
    i64 = lambda v: torch.full((B,), v, device="cuda", dtype=torch.int64)  # noqa: E731
    seed, step = torch.arange(B, device="cuda", dtype=torch.int64), i64(3)
    common = dict(bitmask=bitmask, seed=seed, step=step, min_p=f32(0.0), validate=False, backend="triton",
                  tuning=tuning)  # fmt: skip

    def fused(t, k, p, backend="triton"):
        # kinds and the largest top_k: what the engine tells the kernel from its host-side parameters
        kinds = kernels.sample_kinds(t, k, p, V, 0.0)
        args = dict(common, temperature=f32(t), top_k=i64(k), top_p=f32(p), kinds=kinds, backend=backend,
                    top_k_bound=kernels.top_k_max(k))  # fmt: skip
        return lambda: kernels.sample(logits, **args)

    def differ(k, p) -> int:  # rows whose fused token is not the torch reference's
        return int((fused(1.0, k, p)().tokens != fused(1.0, k, p, "torch")().tokens).sum())

    row = {}
    nbytes = B * V * logits.element_size() + B * W * 4
    row["floor"] = nbytes / (floor_tbs * 1e12) * 1e6  # µs
    row["greedy"], g1 = _bench(fused(0.0, 0, 1.0))
    row["top_p"], g2 = _bench(fused(1.0, 0, 0.9))
    row["top_k"], g3 = _bench(fused(1.0, 50, 1.0))
    row["top_kp"], g3b = _bench(fused(1.0, 50, 0.9))
    row["differ"] = differ(50, 1.0) + differ(50, 0.9)
    if peers == "topk":
        return row
    if not peers:
        row["plain"], _ = _bench(fused(1.0, 0, 1.0))  # sampling without a filter: no test pass
        return row
    row["graph"] = g1 and g2 and g3 and g3b
    if fi is not None:
        flashinfer_row(row, fi, logits, bitmask)
    if peers == "none":
        row["gbs"] = nbytes / (row["greedy"] * 1e-6) / 1e9
        return row
    row["torch"], g4 = _bench(lambda: torch_sample(logits, torch_unpack(bitmask, V), 0.9))
    row["graph"] &= g4
    if _xgr_apply is not None:
        work = logits.clone()

        def xgr():
            _xgr_apply(work, bitmask)
            return torch_sample(work, None, 0.9)

        try:
            row["xgr"], g5 = _bench(xgr)
            row["graph"] &= g5
        except Exception as e:  # noqa: BLE001 - a peer failing must not stop the table
            print(f"# xgrammar failed at B={B} V={V}: {type(e).__name__}: {str(e)[:200]}")
    row["gbs"] = nbytes / (row["greedy"] * 1e-6) / 1e9
    return row


def sweep(base: SampleTuning) -> None:
    """Greedy / top-p µs for kernel tile sizes and warp counts (tuning; not part of the table)."""
    print("| dtype | B | V | BLOCK | warps | greedy | top-p |")
    print("|---|---|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        for B, V in ((128, 128256),):
            for block in (2048, 4096, 8192):
                for warps in (4, 8, 16):
                    tuning = dataclasses.replace(base, block_max=block, num_warps=warps)
                    r = run(dtype, B, V, 4.3, peers=False, tuning=tuning)
                    print(
                        f"| {str(dtype)[6:]} | {B} | {V} | {block} | {warps} "
                        f"| {r['greedy']:.1f} | {r['top_p']:.1f} |"
                    )


def compare(shapes: list[tuple[int, int]], floor_tbs: float, base: SampleTuning) -> None:
    """Greedy, plain sampling (T 1, no filter: pass 1 only) and top-p µs for three layouts:
    "row" = one program per row for everything (split off), "split1" = pass 1 over (row, chunk)
    programs and the top-p test pass in the per-row kernel, "split" = both passes over (row,
    chunk) programs (the default); with greedy's % of the floor and top-p / greedy."""
    modes = {
        "row": dataclasses.replace(base, split="never"),
        "split1": dataclasses.replace(base, split="always", split2=False),
        "split": dataclasses.replace(base, split="always", split2=True),
    }
    head = (
        "| dtype | B | V | floor µs | greedy row | greedy split | % floor split | plain row | plain split "
        "| top-p row | top-p split1 | top-p split | top-p / greedy |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for dtype in (torch.float32, torch.bfloat16):
        for B, V in shapes:
            r = {
                name: run(dtype, B, V, floor_tbs, peers=False, tuning=tuning)
                for name, tuning in modes.items()
            }
            f = r["row"]["floor"]
            g = r["split"]["greedy"]
            print(f"| {str(dtype)[6:]} | {B} | {V} | {f:.1f} | {r['row']['greedy']:.1f} | {g:.1f} "
                  f"| {100 * f / g:.0f}% | {r['row']['plain']:.1f} | {r['split']['plain']:.1f} "
                  f"| {r['row']['top_p']:.1f} | {r['split1']['top_p']:.1f} | {r['split']['top_p']:.1f} "
                  f"| {r['split']['top_p'] / g:.2f} |", flush=True)  # fmt: skip
            torch.cuda.empty_cache()


def split_sweep(vocabs: list[int], floor_tbs: float, base: SampleTuning) -> None:
    """Greedy / top-p µs of the split path for chunk sizes and warp counts at B = 128 (tuning;
    the chunk size is part of what a seed samples: other chunks, other tokens)."""
    print("| dtype | B | V | CHUNK | warps | greedy | % floor | top-p |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16):
        for V in vocabs:
            for chunk in (2048, 4096, 8192):
                for warps in (4, 8):
                    tuning = dataclasses.replace(base, split="always", chunk_max=chunk, split_warps=warps)
                    r = run(dtype, 128, V, floor_tbs, peers=False, tuning=tuning)
                    print(
                        f"| {str(dtype)[6:]} | 128 | {V} | {chunk} | {warps} | {r['greedy']:.1f} "
                        f"| {100 * r['floor'] / r['greedy']:.0f}% | {r['top_p']:.1f} |",
                        flush=True,
                    )


def topk_sweep(shapes: list[tuple[int, int]], floor_tbs: float, base: SampleTuning,
               dtypes: tuple[torch.dtype, ...] = tuple(DTYPES.values())) -> None:  # fmt: skip
    """Top-k 50 and top-k 50 + top-p 0.9 µs against top-p 0.9 for the top-k layouts
    (``topk_max`` groups a row gathers, ``topk_warps``); the same tokens in every one."""
    print("| dtype | B | V | topk_max | topk_warps | top-p | top-k | top-k+p | top-k / top-p "
          "| top-k+p / top-p |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dtype in dtypes:
        for B, V in shapes:
            for kc in (64, 128):
                for warps in (4, 8, 16):
                    tuning = dataclasses.replace(base, topk_max=kc, topk_warps=warps, topk_small_warps=warps)
                    r = run(dtype, B, V, floor_tbs, peers="topk", tuning=tuning)
                    print(f"| {str(dtype)[6:]} | {B} | {V} | {kc} | {warps} | {r['top_p']:.1f} "
                          f"| {r['top_k']:.1f} | {r['top_kp']:.1f} | {r['top_k'] / r['top_p']:.2f} "
                          f"| {r['top_kp'] / r['top_p']:.2f} |", flush=True)  # fmt: skip
            torch.cuda.empty_cache()


CPU_MASKS = {"none": None, "half": 0.5, "1%": 0.01}  # bitmask kinds of the CPU table: share allowed


def _cpu_ms(fns: dict, calls: int) -> dict:
    """Median ms a call of each function, the functions taking turns call by call."""
    import time

    times: dict = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(calls):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}


def _cpu_calls(logits: torch.Tensor, allowed: torch.Tensor | None) -> dict:
    """The CPU table's calls on these logits: ours (top-p; top-k + top-p), the same without the exp
    floor, and plain torch."""
    from deepinfer.kernels import sample_reference
    from deepinfer.kernels.bitmask_reference import pack_bitmask

    B = logits.shape[0]
    full = lambda v, dt=torch.float32: torch.full((B,), v, dtype=dt)  # noqa: E731
    common = dict(bitmask=None if allowed is None else pack_bitmask(allowed), temperature=full(0.8),
                  top_p=full(0.9), min_p=full(0.0), seed=torch.arange(B), step=full(3, torch.int64),
                  validate=False)  # fmt: skip

    def ours(k: int, floor: float = sample_reference.EXP_FLOOR):
        def call():
            keep, sample_reference.EXP_FLOOR = sample_reference.EXP_FLOOR, floor
            try:
                return kernels.sample(logits, top_k=full(k, torch.int64), **common)
            finally:
                sample_reference.EXP_FLOOR = keep

        return call

    def greedy(refused: bool):
        # the mask with each row's argmax allowed (a model that follows its constraint) or not
        mask = None
        if allowed is not None:
            a = allowed.clone()
            a[torch.arange(B), logits.argmax(dim=1)] = not refused
            mask = pack_bitmask(a)
        g = dict(common, bitmask=mask, temperature=full(0.0))
        return lambda: kernels.sample(logits, top_k=full(0, torch.int64), **g)

    inf = float("-inf")
    return {"p": ours(0), "kp": ours(50), "p0": ours(0, inf), "kp0": ours(50, inf),
            "torch": lambda: torch_sample(logits / 0.8, allowed, 0.9),
            "g": greedy(False), "gr": greedy(True)}  # fmt: skip


def cpu_table(batches: list[int], kind: str, threads: int, calls: int) -> None:
    """The CPU path (``kernels.sample`` on CPU tensors: the torch reference) against plain torch
    (`torch_sample`), V = 49,152, temperature 0.8, top-p 0.9 and top-k 50 + top-p 0.9, no bitmask,
    half the tokens allowed, or 1% (a constraint's row). "no exp floor" is the same reference with
    ``sample_reference.EXP_FLOOR`` at -inf (exp of every score: its slow path on masked tokens).
    Greedy: the same mask with each row's argmax allowed (only refused rows are masked) or
    refused (every row masked and searched again)."""
    torch.set_num_threads(threads)
    V = 49152
    print(f"# CPU, {threads} thread(s), torch {torch.__version__}; logits {kind}; ms a call, "
          f"median of {calls}")  # fmt: skip
    print("| B | bitmask | top-p | top-k+p | top-p, no exp floor | top-k+p, no exp floor | torch top-p "
          "| torch / top-p | greedy, argmax allowed | greedy, argmax refused |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for B in batches:
        gen = torch.Generator().manual_seed(B)
        logits = make_logits(B, V, torch.float32, gen, kind, "cpu")
        for name, share in CPU_MASKS.items():
            allowed = None if share is None else torch.rand(B, V, generator=gen) < share
            ms = _cpu_ms(_cpu_calls(logits, allowed), calls)
            print(f"| {B} | {name} | {ms['p']:.2f} | {ms['kp']:.2f} | {ms['p0']:.2f} | {ms['kp0']:.2f} "
                  f"| {ms['torch']:.2f} | {ms['torch'] / ms['p']:.1f}x | {ms['g']:.2f} | {ms['gr']:.2f} |",
                  flush=True)  # fmt: skip


def parse_tuning(items: list[str]) -> SampleTuning:
    """``["pdl=0", "split=never", "num_warps=8"]`` -> SampleTuning (0/1/true/false for the bools)."""
    kw: dict[str, object] = {}
    types = {f.name: f.type for f in dataclasses.fields(SampleTuning)}
    for item in items:
        name, _, value = item.partition("=")
        if name not in types:
            raise SystemExit(f"--tuning: no field {name!r}; fields: {', '.join(types)}")
        if types[name] == "bool":
            if value.lower() not in ("0", "1", "false", "true"):
                raise SystemExit(f"--tuning {name}: 0/1/true/false, got {value!r}")
            kw[name] = value.lower() in ("1", "true")
        elif types[name] == "int":
            kw[name] = int(value)
        else:
            kw[name] = value
    try:
        return SampleTuning(**kw)
    except ValueError as e:
        raise SystemExit(f"--tuning: {e}") from e


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--floor", type=float, default=4.3, help="bandwidth floor, TB/s")
    ap.add_argument("--quick", action="store_true", help="B=128, V=128256 only")
    ap.add_argument("--sweep", action="store_true", help="first time BLOCK x num_warps variants")
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), help="batch sizes")
    ap.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS), help="vocabulary sizes")
    ap.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES), help="logits dtypes")
    ap.add_argument(
        "--compare",
        action="store_true",
        help="only greedy and top-p, pass 1 per row vs split over (row, chunk), side by side",
    )
    ap.add_argument("--split-sweep", action="store_true", help="first time split chunk x num_warps variants")
    ap.add_argument("--topk-sweep", action="store_true", help="only top-k: topk_max x topk_warps variants")
    ap.add_argument("--no-peers", action="store_true", help="leave out the torch and xgrammar columns")
    ap.add_argument(
        "--logits",
        choices=("random", "model"),
        default="random",
        help="N(0, 4) logits, or the embedded model's recorded rows (V = 49,152; see --record-logits)",
    )
    ap.add_argument(
        "--record-logits",
        action="store_true",
        help=f"CPU: record the embedded model's logits to {MODEL_LOGITS} and exit",
    )
    ap.add_argument(
        "--tuning",
        nargs="+",
        default=[],
        metavar="FIELD=VALUE",
        help="SampleTuning fields every run starts from, e.g. pdl=0 greedy1=0 split=never",
    )
    import flashinfer_peer

    ap.add_argument(
        "--flashinfer",
        nargs="?",
        const=flashinfer_peer.DEFAULT_DEST,
        metavar="DIR",
        help="FlashInfer's columns too: its headers, extracted by flashinfer_peer.py --extract "
        "(default benchmarks/.cache/flashinfer)",
    )
    ap.add_argument("--cpu", action="store_true", help="the CPU path against plain torch (--batches)")
    ap.add_argument("--threads", type=int, default=1, help="--cpu: torch threads")
    ap.add_argument("--calls", type=int, default=15, help="--cpu: timed calls of each setting")
    args = ap.parse_args()
    tuning = parse_tuning(args.tuning)
    if args.record_logits:
        os.makedirs(os.path.dirname(MODEL_LOGITS), exist_ok=True)
        record_logits(MODEL_LOGITS)
        return
    if args.cpu:
        batches = args.batches if args.batches != list(BATCHES) else [1, 8, 32]
        cpu_table(batches, args.logits, args.threads, args.calls)
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench_sampling.py needs a CUDA device")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"xgrammar {'yes' if _xgr_apply else 'not importable'}; µs per call; floor {args.floor} TB/s; "
          f"logits {args.logits}; {tuning}")  # fmt: skip
    fi = None
    if args.flashinfer:
        fi = flashinfer_peer.Sampler(flashinfer_peer.load(args.flashinfer), _mask_inplace)
    head = ("| dtype | B | V | fused greedy | fused top-p | fused top-k | fused top-k+p | top-k / top-p "
            "| top-k+p / top-p | ≠ ref | torch | xgr+torch | floor µs | greedy GB/s | % floor | top-p/greedy "
            "| torch/top-p |")  # fmt: skip
    if fi is not None:
        head += " FlashInfer top-p | FlashInfer top-k | FlashInfer top-k+p | FI bad | FI / fused top-p |"
    if args.sweep:
        sweep(tuning)
    if args.split_sweep:
        split_sweep(args.vocabs, args.floor, tuning)
    shapes = [(128, 128256)] if args.quick else [(B, V) for V in args.vocabs for B in args.batches]
    if args.topk_sweep:
        topk_sweep(shapes, args.floor, tuning, tuple(DTYPES[d] for d in args.dtypes))
        return
    if args.compare:
        compare(shapes, args.floor, tuning)
        return
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for dtype in (DTYPES[d] for d in args.dtypes):
        for B, V in shapes:
            r = run(dtype, B, V, args.floor, peers="none" if args.no_peers else True, kind=args.logits,
                    tuning=tuning, fi=fi)  # fmt: skip
            if r is None:
                continue
            xgr = f"{r['xgr']:.1f}" if "xgr" in r else "-"
            th = f"{r['torch']:.1f}" if "torch" in r else "-"
            tp = f"{r['torch'] / r['top_p']:.1f}x" if "torch" in r else "-"
            mark = "" if r["graph"] else "*"
            print(
                f"| {str(dtype)[6:]} | {B} | {V} | {r['greedy']:.1f}{mark} | {r['top_p']:.1f} "
                f"| {r['top_k']:.1f} | {r['top_kp']:.1f} | {r['top_k'] / r['top_p']:.2f} "
                f"| {r['top_kp'] / r['top_p']:.2f} | {r['differ']} | {th} | {xgr} | {r['floor']:.1f} "
                f"| {r['gbs']:.0f} | {100 * r['floor'] / r['greedy']:.0f}% | {r['top_p'] / r['greedy']:.2f} "
                f"| {tp} |"
                + (
                    f" {r['fi_top_p']:.1f} | {r['fi_top_k']:.1f} | {r['fi_top_kp']:.1f} | {r['fi_bad']} "
                    f"| {r['fi_top_p'] / r['top_p']:.1f}x |"
                    if "fi_top_p" in r
                    else ""
                ),
                flush=True,
            )
            del r
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
