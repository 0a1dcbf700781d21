#!/usr/bin/env python
"""Where deepinfer's slow masks come from, on the MaskBench schemas (one process, one thread).

Compiles each schema as ``bench_constraints.py``'s worker does, teacher-forces its valid
instances, and times every mask fill. Each fill is classified: warm (the row was cached),
or cold, and then by the automaton's kind (a DFA, a DFA with counters, a pushdown
automaton, a pushdown with counters) and by the time spent in the parts of a cold row
(the context-independent walk of a state, a continuation through calls and returns, the
closures of the pushdown, the near-state searches of counted automata). Prints the slowest
masks and totals per class.

Usage (from the repository root)::

    DEEPINFER_SHARED_DATA=/path/to/data .venv/bin/python benchmarks/profile_masks.py [--only REGEX]

Not a test: a diagnostic.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import collections  # noqa: E402
import gc  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

ns = time.perf_counter_ns


def _instrument(cc_cls, pd_mod, compiled_mod, acc: dict) -> None:
    """Time the parts of a cold row (inclusive times, outermost call of each part only)."""
    depth = collections.Counter()

    def wrap(owner, name, label):
        fn = getattr(owner, name)

        def timed(*a, **k):
            depth[label] += 1
            t = ns()
            try:
                return fn(*a, **k)
            finally:
                depth[label] -= 1
                if not depth[label]:
                    acc[label] += ns() - t

        setattr(owner, name, timed)

    wrap(cc_cls, "_context_independent", "_context_independent")
    wrap(cc_cls, "_continue", "_continue")
    wrap(cc_cls, "_compute_counted", "_compute_counted")
    wrap(cc_cls, "_bottom_counted", "_bottom_counted")
    wrap(pd_mod.Automaton, "closure", "_closure")
    wrap(compiled_mod, "_within", "_within")
    wrap(cc_cls, "_canonical_unquoted", "_canonical")
    wrap(cc_cls, "_walk_memo", "_walk_memo")
    wrap(cc_cls, "_walk_below", "_walk_below")
    ci = cc_cls._context_independent

    def counted_ci(self, state, inner):
        if (state, inner) not in self._ci:
            acc["ci_miss"] += 1
        return ci(self, state, inner)

    cc_cls._context_independent = counted_ci


def kind_of(a) -> str:
    if a.is_regular:
        return "dfa+counters" if a.counters is not None else "dfa"
    return "pushdown+counters" if a.counters is not None else "pushdown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, metavar="DIR")
    ap.add_argument("--only", default=None, help="regex on schema file names")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", choices=("smollm2", "llama3"), default="smollm2")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--over-us", type=float, default=100.0, help="list parts of masks slower than this")
    args = ap.parse_args(argv)

    import _tokenizers
    from bench_constraints import DEFAULT_DATA, load_schemas, prepare
    from tokenizers import Tokenizer

    from deepinfer.constraints import Compiler, Matcher, Vocabulary
    from deepinfer.constraints import compiled as compiled_mod
    from deepinfer.constraints.automaton import pushdown as pd_mod

    data = args.data or DEFAULT_DATA
    tok = _tokenizers.load(args.tokenizer)
    jobs = prepare(load_schemas(data, args.limit, args.seed, args.only), tok)
    vocab = Vocabulary.from_tokenizer(Tokenizer.from_str(tok.json), eos_ids=[tok.eos_id])
    compiler = Compiler(vocab)
    w = compiler.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    Matcher(w).mask_row()
    gc.freeze()  # (as bench_constraints' workers: the vocabulary out of full collections)
    acc: dict = collections.Counter()
    _instrument(compiled_mod.CompiledConstraint, pd_mod, compiled_mod, acc)

    rows = []  # (ns, schema, kind, cold, stacks, depth, parts, instance, token)
    ttfm = []
    for job in jobs:
        gc.collect()
        t0 = ns()
        try:
            c = compiler.json_schema(job["schema"], whitespace="compact")
        except Exception:  # noqa: BLE001
            continue
        m = Matcher(c)
        cfg = m.mask_row  # (warm the attribute lookups)
        del cfg
        a = c.automaton
        kind = kind_of(a)
        for k, toks in enumerate(job["valid"]):
            m = Matcher(c)
            for i in range(len(toks) + 1):
                inner = getattr(m, "_plain", m)  # (a check's matcher wraps a plain one)
                cfg = inner._hist[-1] if hasattr(inner, "_hist") else None
                key = c._row_key(cfg) if (cfg is not None and c._counters is not None) else cfg
                cold = cfg is not None and c._rows.get(cfg) is None and c._rows.get(key) is None
                acc.clear()
                t = ns()
                m.mask_row()
                dt = ns() - t
                if k == 0 and i == 0:
                    ttfm.append((t + dt - t0) / 1e6)
                stacks = depth = 0
                if cfg is not None and not a.is_regular:
                    stacks = len(cfg[0])
                    depth = max((len(s) for s in cfg[0]), default=0)
                rows.append((dt, job["name"], kind, cold, stacks, depth, dict(acc), k, i))
                if i < len(toks) and not m.accept(toks[i]):
                    break
    t_all = np.array([r[0] for r in rows]) / 1e3
    print(
        f"# {len(jobs)} schemas, {len(rows)} masks; p50 {np.percentile(t_all, 50):.1f} µs, "
        f"p99 {np.percentile(t_all, 99):.1f} µs, max {t_all.max() / 1e3:.1f} ms; "
        f"over 100 µs: {(t_all > 100).sum()}, over 5 ms: {(t_all > 5000).sum()}; "
        f"TTFM p50 {np.median(ttfm):.2f} ms"
    )
    by = collections.defaultdict(list)
    for r in rows:
        by[(r[2], r[3], r[6].get("ci_miss", 0) > 0)].append(r[0] / 1e3)
    print("\n| kind | cold | first walk | masks | sum ms | p50 µs | p99 µs | max ms | >100 µs | >5 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (kind, cold, miss), ts in sorted(by.items()):
        ts = np.array(ts)
        print(
            f"| {kind} | {cold} | {miss} | {len(ts)} | {ts.sum() / 1e3:.1f} | {np.percentile(ts, 50):.1f} | "
            f"{np.percentile(ts, 99):.1f} | {ts.max() / 1e3:.2f} | {(ts > 100).sum()} | {(ts > 5000).sum()} |"
        )
    slow = [r for r in rows if r[0] / 1e3 > args.over_us]
    tot = collections.Counter()
    for r in slow:
        for p, v in r[6].items():
            tot[p] += v
        tot["n_ci_miss>0"] += 1_000_000 * (r[6].get("ci_miss", 0) > 0)
    print(
        f"\nparts of the {len(slow)} masks over {args.over_us:g} µs (ms, inclusive): "
        + ", ".join(f"{p} {v / 1e6:.1f}" for p, v in tot.most_common())
    )
    dominant = collections.Counter()
    for r in slow:
        parts = {p: v for p, v in r[6].items() if p != "ci_miss"}
        inner = {
            p: v for p, v in parts.items() if p in ("_canonical", "_walk_below", "_within", "_walk_memo")
        }
        top = max(inner or parts or {"(none)": 0}, key=lambda p: (inner or parts or {"(none)": 0})[p])
        if inner and inner[top] < 0.5 * r[0]:
            top = max(parts, key=parts.get)
        dominant[top] += 1
    print(
        "\ncount of those masks by the part that took most of it: "
        + ", ".join(f"{p} {n}" for p, n in dominant.most_common())
    )
    per_schema = collections.Counter()
    for r in slow:
        per_schema[(r[1], r[2])] += r[0]
    print(
        "\nschemas by time in those masks (ms): "
        + "; ".join(f"{n} [{k}] {v / 1e6:.1f}" for (n, k), v in per_schema.most_common(15))
    )
    print(f"\nslowest {args.top}:")
    for r in sorted(rows, key=lambda r: -r[0])[: args.top]:
        parts = ", ".join(
            f"{p[1:] if p[0] == '_' else p} {v / 1e6:.2f}"
            for p, v in r[6].items()
            if v > 50_000 and p != "ci_miss"
        )
        parts += f" ci_miss={r[6].get('ci_miss', 0)}"
        print(
            f"  {r[0] / 1e6:8.2f} ms  {r[1][:48]:48s} {r[2]:18s} cold={r[3]!s:5s} stacks={r[4]} depth={r[5]} "
            f"inst={r[7]} tok={r[8]}  [{parts}]"
        )
    # what a long-running process's full collection walks now: the compiler's cached
    # constraints (their rows and step memos) and the front end's memos, not these records
    del rows, slow, by, t_all
    gc.collect()
    tracked = len(gc.get_objects())
    t = ns()
    gc.collect()
    print(
        f"\nafter all schemas: {tracked:,} objects tracked (besides the frozen), "
        f"a full collection {(ns() - t) / 1e6:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
