"""KV-cache capacity: how many requests run at once, without preemption, in a KV budget. Prints
a table, asserts nothing; plain data (the engine's own Scheduler and BlockPool, no tensors).

Requests of 4,096 tokens (a 3,968-token prompt, 128 generated) whose max_tokens leaves them
room to reach max_model_len. A contiguous slot cache reserves max_model_len positions a
request; the paged cache holds only the blocks a request has filled. At Llama-3-8B shape
(32 layers, 8 KV heads of 128, bf16: 128 KiB a token) with a 60 GB budget:
    python benchmarks/bench_capacity.py [--budget-gb 60] [--max-model-len 8192,32768,131072]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_decode import _table  # noqa: E402

from deepinfer.block_pool import BlockPool  # noqa: E402
from deepinfer.sampling_params import SamplingParams  # noqa: E402
from deepinfer.scheduler import Scheduler  # noqa: E402
from deepinfer.sequence import Sequence, Status  # noqa: E402

TOKEN_BYTES = 32 * 8 * 128 * 2 * 2  # layers x KV heads x head_dim x (K, V) x bf16
BLOCK = 16


def runs_without_preemption(n: int, budget: int, max_model_len: int, prompt: int, generated: int) -> bool:
    """n requests added at once run to the end, all together, with no preemption (the scheduler,
    stepped; the prompts differ from their first token: no prefix hits)."""
    pool = BlockPool(budget // (TOKEN_BYTES * BLOCK), BLOCK)
    sch = Scheduler(1 << 20, 1 << 30, pool)
    for i in range(n):
        sch.add(
            Sequence(
                i, None, [i + 1] * prompt, SamplingParams(), seed=0, eos_token_ids=(), max_len=max_model_len
            )
        )
    while sch.has_unfinished():
        out = sch.schedule()
        if sch.preemptions or sch.waiting:
            return False
        for s, k in zip(out.rows, out.counts):
            s.num_cached += k
        for s in out.batch:
            s.output_token_ids.append(7)
            if len(s.output_token_ids) == generated:
                s.status = Status.FINISHED
        sch.commit(out.rows)
    return True


def paged_capacity(budget: int, max_model_len: int, prompt: int, generated: int) -> int:
    """The largest n that ``runs_without_preemption`` (bisected)."""
    lo, hi = 1, budget // (TOKEN_BYTES * prompt) + 1  # hi: more than fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (
            (mid, hi) if runs_without_preemption(mid, budget, max_model_len, prompt, generated) else (lo, mid)
        )
    return lo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-gb", type=float, default=60)
    ap.add_argument("--max-model-len", default="8192,32768,131072")
    ap.add_argument("--prompt", type=int, default=3968)
    ap.add_argument("--generated", type=int, default=128)
    args = ap.parse_args()
    budget = int(args.budget_gb * 1e9)
    rows = []
    for mml in (int(x) for x in args.max_model_len.split(",")):
        contiguous = budget // (TOKEN_BYTES * mml)  # one max_model_len slot a request
        paged = paged_capacity(budget, mml, args.prompt, args.generated)
        rows.append([mml, args.prompt + args.generated, contiguous, paged, f"{paged / contiguous:.1f}x"])
    print(f"\nLlama-3-8B shape, {args.budget_gb:g} GB of KV cache, block {BLOCK}")
    _table(["max_model_len", "request tokens", "contiguous slots", "paged: requests at once", "ratio"], rows)


if __name__ == "__main__":
    main()
