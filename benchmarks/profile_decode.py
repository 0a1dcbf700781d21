"""Where a decode step's device time goes: torch.profiler over decode steps replayed as CUDA
graphs (random weights at real shapes, bf16), the device time summed by kernel. Settings: the
fused layer kernels (kernels/fused.py) off ("unfused") and on ("fused", with a decode row's
matmuls as the kernels of kernels/norm_matmul.py where they serve; "fused-cublas": every matmul
cuBLAS's, the norms, RoPE and GLU apart); "unsplit": fused, with the decode attention one program
per row and KV head instead of split over the keys; "deterministic" (fused). Prints tables,
asserts nothing.

    python benchmarks/profile_decode.py --shapes smollm2-135m,llama3-8b --batches 1 [--out DIR]

Per shape, batch and setting: ms/step (wall, tokens read back each step, as bench_decode), the
host's ms a step inside ``runner.step`` (plan, input copy, graph launch: it returns before the
device is done), kernels a step and device ms a step, then the kernels by device time. ``--out``
also writes every kernel of each to DIR/profile_decode.txt.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from bench_decode import (
    _config,
    _copy_bandwidth,
    _random_weights,
    _read_bytes,
    _sync,
    _table,
    greedy_tokens,
    prefilled,
)


def _decode(runner, batch: int, prompt_len: int, steps: int, profiled: int):
    """(wall seconds a step over ``steps`` decode steps, host seconds a step inside runner.step,
    the profile of ``profiled`` more): a batch of equal prompts prefilled, then greedy steps with
    the tokens read back each step."""
    from torch.profiler import ProfilerActivity, profile

    seqs, logits = prefilled(runner, batch, prompt_len, steps + profiled)
    host = [0.0]

    def step(logits):
        for s, tok in zip(seqs, greedy_tokens(logits)):
            s.output_token_ids.append(tok)
        t0 = time.perf_counter()
        out = runner.step(seqs, [1] * batch)
        host[0] += time.perf_counter() - t0
        return out

    for _ in range(3):  # captures
        logits = step(logits)
    _sync(runner.device)
    host[0] = 0.0
    t = time.perf_counter()
    for _ in range(steps):
        logits = step(logits)
    _sync(runner.device)
    wall = (time.perf_counter() - t) / steps
    in_step = host[0] / steps
    cuda = runner.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(profiled):
            logits = step(logits)
        _sync(runner.device)
    return wall, in_step, prof


def _kernel_table(prof, steps: int) -> tuple[list[list], int, float]:
    """Rows (kernel, calls a step, device µs a step, share), kernels a step, device ms a step (on
    the CPU: its aten ops and their own time)."""
    totals: dict[str, list] = {}
    events = prof.events()
    cuda = any(e.device_type == torch.autograd.DeviceType.CUDA for e in events)
    for e in events:
        if cuda and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if not cuda and not e.name.startswith("aten::"):
            continue
        name = e.name if len(e.name) <= 70 else e.name[:67] + "..."
        t = totals.setdefault(name, [0, 0.0])
        t[0] += 1
        t[1] += e.device_time_total if cuda else e.self_cpu_time_total
    total = sum(t[1] for t in totals.values())
    rows = [
        [name, f"{n / steps:.1f}", f"{us / steps:.1f}", f"{us / total:.0%}"]
        for name, (n, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])
    ]
    return rows, round(sum(t[0] for t in totals.values()) / steps), total / steps / 1e3


def main() -> None:
    from deepinfer.model_runner import ModelRunner
    from deepinfer.models.llama import LlamaModel

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="smollm2-135m,llama3-8b")
    ap.add_argument("--batches", type=lambda x: [int(b) for b in x.split(",")], default=[1])
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--profile-steps", type=int, default=10)
    ap.add_argument("--settings", default="unfused,fused-cublas,fused",
                    help="unfused, fused-cublas, fused, unsplit, deterministic")  # fmt: skip
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a check of the script (tiny shapes)")
    args = ap.parse_args()
    device, dtype = torch.device(args.device), torch.bfloat16
    graphs = device.type == "cuda"
    bw = _copy_bandwidth(device)
    print(
        f"{torch.cuda.get_device_name(device) if graphs else 'CPU'}: copy bandwidth {bw / 1e9:.0f} GB/s",
        flush=True,
    )
    summary = []
    for name in args.shapes.split(","):
        cfg = _config(name)
        weights = _random_weights(cfg, device, dtype)
        max_len = args.prompt_len + args.steps + args.profile_steps + 64
        model = LlamaModel(cfg, weights, dtype=dtype, device=device, max_len=max_len)
        del weights
        for setting in args.settings.split(","):
            model.fused = setting != "unfused"
            model.fused_matmul = setting != "fused-cublas"
            attention = "triton" if setting == "unsplit" else None
            kw = dict(deterministic=setting == "deterministic", attention=attention)
            runner = ModelRunner(model, cuda_graphs=graphs, **kw)
            for batch in args.batches:
                wall, in_step, prof = _decode(runner, batch, args.prompt_len, args.steps, args.profile_steps)
                rows, kernels, dev_ms = _kernel_table(prof, args.profile_steps)
                ctx = args.prompt_len + args.steps / 2
                kv = sum(batch * ctx * 2 * cfg.num_kv_heads * cfg.head_dim * 2 for _ in range(cfg.num_layers))
                floor = (_read_bytes(model)[0] + kv) / bw
                if kernels < 20:  # this profiler did not see inside the graphs: the same steps eagerly
                    eager = ModelRunner(model, cuda_graphs=False, **kw)
                    eager.static_decode = True
                    prof = _decode(eager, batch, args.prompt_len, 2, args.profile_steps)[2]
                    rows, kernels, dev_ms = _kernel_table(prof, args.profile_steps)
                    del eager
                summary.append([name, batch, setting, f"{wall * 1e3:.3f}", f"{in_step * 1e3:.3f}", kernels,
                                f"{dev_ms:.3f}", f"{floor * 1e3:.3f}", f"{floor / wall:.0%}"])  # fmt: skip
                title = (f"\n{name} batch {batch} {setting}: {wall * 1e3:.3f} ms/step wall, "
                         f"{in_step * 1e3:.3f} ms in runner.step, {kernels} kernels and {dev_ms:.3f} ms "
                         "device a step")  # fmt: skip
                print(title)
                _table(["kernel", "calls/step", "µs/step", "share"], rows[: args.top])
                if args.out:
                    os.makedirs(args.out, exist_ok=True)
                    with open(os.path.join(args.out, "profile_decode.txt"), "a") as f:
                        f.write(title + "\n")
                        for r in rows:
                            f.write(" | ".join(map(str, r)) + "\n")
            del runner
        del model
    print()
    _table(["shape", "batch", "setting", "wall ms/step", "host ms/step in runner.step", "kernels/step",
            "device ms/step", "floor ms", "of floor"], summary)  # fmt: skip


if __name__ == "__main__":
    main()
