"""Batch extraction through Ray beside the single-process path, on the same input: prints
tables, asserts nothing.

The same JSONL input (people described in one sentence each, the sample schema) runs through
``deepinfer.batch`` in one process (its LLM loaded once, 1 and 2 torch threads) and on a local
Ray cluster (1 and 2 actors of 1 CPU and 1 thread each). A thread watches the output file:
the steady rate is the rows written after the first batch over the time from the first batch
to the last, without what a run costs before its first rows (Ray: reading and planning the
input, starting the actors, loading a model in each: the "first rows" column, which
includes one batch). The one-process LLM is warmed by a batch first (Ray's actors are not:
their warm-up falls in their first rows). Starting Ray (``ray.init``) is timed apart.

    .venv/bin/python benchmarks/bench_batch.py                  # the embedded model, 48 rows
    .venv/bin/python benchmarks/bench_batch.py --rows 64 --max-tokens 48
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_decode import _table  # noqa: E402

NAMES = ["Maria Lopez", "John Carter", "Kenji Sato", "Claire Dubois", "Amir Haddad", "Ingrid Berg"]
CITIES = ["Madrid", "Brighton", "Osaka", "Lyon", "Amman", "Oslo", "Lima", "Porto"]


def write_input(path: str, rows: int) -> None:
    with open(path, "w") as fh:
        for i in range(rows):
            name, city = NAMES[i % len(NAMES)], CITIES[i % len(CITIES)]
            text = f"{name} ({i}) is {20 + i % 60} years old and lives in {city}."
            fh.write(json.dumps({"id": i, "text": text}) + "\n")


def timed_run(argv: list[str], llm=None) -> tuple[float, float, float]:
    """(seconds in all, seconds to the first rows written, steady rows/s after them)."""
    from deepinfer.batch import main

    out = argv[argv.index("--output") + 1]
    seen: list[tuple[float, int]] = []  # (time, output size) at each change: a stat, no read
    running = True

    def watch():
        last = 0
        while running:
            try:
                size = os.stat(out).st_size
            except FileNotFoundError:
                size = 0
            if size != last:
                seen.append((time.perf_counter(), size))
                last = size
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    t = time.perf_counter()
    watcher.start()
    status = main(argv, llm=llm)
    took = time.perf_counter() - t
    time.sleep(0.05)
    running = False
    watcher.join()
    if status != 0:
        raise SystemExit(f"deepinfer.batch exited {status}: {argv}")
    with open(out, "rb") as fh:
        data = fh.read()
    (t0, s0), (t1, s1) = seen[0], seen[-1]
    rows = data[:s1].count(b"\n") - data[:s0].count(b"\n")
    return took, t0 - t, rows / (t1 - t0) if t1 > t0 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="bench_batch_")
    source = os.path.join(work, "in.jsonl")
    write_input(source, args.rows)
    common = ["--schema", os.path.join(ROOT, "examples", "sample_data", "schema.json")]
    common += ["--max-tokens", str(args.max_tokens), "--batch-size", str(args.batch_size), "--no-progress"]
    common += ["--model", args.model] if args.model else []
    runs = 0

    def argv(*extra: str) -> list[str]:
        nonlocal runs
        runs += 1
        return [*common, "--input", source, "--output", os.path.join(work, f"out{runs}.jsonl"), *extra]

    import torch

    from deepinfer import LLM

    t = time.perf_counter()
    llm = LLM(args.model, seed=0)
    load_s = time.perf_counter() - t
    timed_run(argv("--limit", str(args.batch_size)), llm)  # warm: the constraint's rows, kernels
    load_before = os.getloadavg()[0]
    results = []  # (path, parallelism, (all s, first rows s, steady rows/s))
    for threads in (1, 2):
        torch.set_num_threads(threads)
        results.append(("one process", f"{threads} thread(s)", timed_run(argv(), llm)))

    import ray

    t = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray_init_s = time.perf_counter() - t
    ray.data.DataContext.get_current().enable_progress_bars = False
    for actors in (1, 2):
        extra = ["--ray", "auto", "--num-actors", str(actors), "--cpus-per-actor", "1"]
        results.append(("Ray", f"{actors} actor(s) x 1 thread", timed_run(argv(*extra))))
    ray.shutdown()

    print(
        f"\n{args.rows} rows, max_tokens {args.max_tokens}, batch {args.batch_size}, "
        f"model {args.model or 'embedded SmolLM2-135M'}; {os.cpu_count()} CPUs"
    )
    rate = {par[0]: r[2] for path, par, r in results if path == "one process"}
    rows = []
    for path, par, (took, first, steady) in results:
        vs = f"{100 * (rate[par[0]] / steady - 1):+.1f}%" if path == "Ray" else "-"
        rows.append([path, par, f"{took:.1f}", f"{first:.1f}", f"{args.rows / took:.2f}", f"{steady:.2f}"])
        rows[-1].append(vs)
    head = ["path", "parallelism", "s in all", "s to first rows", "rows/s (all)", "rows/s (steady)"]
    _table([*head, "time cost vs one process (steady)"], rows)
    print(f"\nfixed costs: ray.init {ray_init_s:.1f} s; the one-process LLM load {load_s:.1f} s")
    print(f"load average (1 min) before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
