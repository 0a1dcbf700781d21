"""DSpark benchmark on an extraction workload: prints tables, asserts nothing.

Workload: instances of ../shared/data/maskbench-dev (schemas that compile, valid test data of a
modest size). Each prompt shows the instance's content as plain "key: value" text and asks for
it as JSON under the schema (shown too), so the answer copies spans of the prompt and the
schema forces keys, quotes and brackets: the two draft sources DSpark has.

CPU (default): the embedded SmolLM2-135M-Instruct, greedy, batch 1 and 8, with and without
DSpark; tokens/s (decode only: a max_tokens=1 run of the same prompts is subtracted), tokens per
verification step, acceptance by draft source, and whether the outputs are the same. Writes the
measured acceptance to benchmarks/dspark_acceptance.json for the device run:
    .venv/bin/python benchmarks/bench_dspark.py [--dtype auto|float32|bfloat16] [--prompts 8]

Device: random weights at Llama-3-8B shape (bf16) cannot produce meaningful drafts' acceptance,
so it is replayed: the real engine runs (drafts, masks, scheduler, verify forward as CUDA graphs,
verify kernel), and after the kernel each row's accepted count is redrawn draft by draft with
the per-source acceptance measured on CPU (the emitted tokens stay valid: accepted drafts plus
the target's own token at the first rejected position):
    python benchmarks/bench_dspark.py --device cuda [--batches 1,8,64] [--trace FILE]
Goals (issue 6): >= 1.5x tokens/s at batch 1, >= 1.0x at batch 64, lossless.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_decode import _table  # noqa: E402

DATA = os.environ.get("DEEPINFER_SHARED_DATA", os.path.join(HERE, "..", "..", "shared", "data"))
TRACE = os.path.join(HERE, "dspark_acceptance.json")
# P(draft accepted | the drafts before it were), by confidence class (drafts.K_*: forced, first
# copied token after a 1 / 2 / 3+ token match, continued copy): used when no trace file exists
DEFAULT_RATES = [0.9, 0.3, 0.45, 0.6, 0.75]
INSTRUCTION = "Extract the record in the text below as one JSON object that follows the JSON Schema."


def render(value, indent: int = 0) -> str:
    """A JSON value as plain text: "key: value" lines, "- item" lists, strings unquoted."""
    pad = "  " * indent
    if isinstance(value, dict):
        lines = []
        for k, v in value.items():
            if isinstance(v, dict | list) and v:
                lines.append(f"{pad}{k}:\n{render(v, indent + 1)}")
            else:
                lines.append(f"{pad}{k}: {render(v)}")
        return "\n".join(lines)
    if isinstance(value, list):
        return "\n".join(f"{pad}- {render(v, indent + 1).lstrip()}" for v in value) if value else "[]"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return str(value)


def workload(n: int, compile_fn, *, max_data: int = 400, max_schema: int = 1500, seed: int = 0) -> list[dict]:
    """n extraction tasks: {name, schema, data, text}; schemas that compile, data of modest size."""
    files = sorted(glob.glob(os.path.join(DATA, "maskbench-dev", "*.json")))
    random.Random(seed).shuffle(files)
    tasks, seen = [], set()
    for f in files:
        d = json.load(open(f))
        schema = d.get("schema")
        data = next((t["data"] for t in d.get("tests", []) if t.get("valid") and isinstance(t.get("data"), dict)
                     and len(t["data"]) >= 2), None)  # fmt: skip
        if data is None or not 40 <= len(json.dumps(data)) <= max_data or len(json.dumps(schema)) > max_schema:
            continue
        if frozenset(data) in seen:  # one instance per record shape
            continue
        try:
            compile_fn(schema)
        except Exception:
            continue
        name = os.path.basename(f).removesuffix(".json")
        seen.add(frozenset(data))
        tasks.append(dict(name=name, schema=schema, data=data, text=render(data)))
        if len(tasks) >= n:
            break
    return tasks


def prompt_text(task: dict) -> str:
    return f"{INSTRUCTION}\n\nJSON Schema:\n{json.dumps(task['schema'])}\n\nText:\n{task['text']}\n"


def _generate(llm, prompts, params, dspark):
    from deepinfer.spec import DSpark

    llm.dspark = dspark if isinstance(dspark, DSpark) else DSpark(dspark)
    llm.dspark.stats.reset()
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return outs, time.perf_counter() - t, llm.dspark.stats


def measure(llm, prompts, params, batch: int, modes: dict) -> dict:
    """Per mode: outputs, decode seconds (full run minus a max_tokens=1 run), stats. Batch 1 runs
    prompt by prompt, alternating the modes, so machine noise falls on both alike."""
    import dataclasses

    one = [dataclasses.replace(p, max_tokens=1) for p in params]
    res = {m: {"outs": [], "decode": 0.0, "rows": 0, "verify_rows": 0, "emitted": 0, "drafted": [0, 0],
               "accepted": [0, 0], "rejected": [0, 0], "kind_accepted": [0] * 5, "kind_rejected": [0] * 5}
           for m in modes}  # fmt: skip
    groups = [list(range(i, min(i + batch, len(prompts)))) for i in range(0, len(prompts), batch)]
    for g in groups:
        ps, sp, sp1 = [prompts[i] for i in g], [params[i] for i in g], [one[i] for i in g]
        _, t_prefill, _ = _generate(llm, ps, sp1, False)
        for m, setting in modes.items():
            outs, t, st = _generate(llm, ps, sp, setting)
            r = res[m]
            r["outs"] += outs
            r["decode"] += max(t - t_prefill, 1e-9)
            r["rows"] += st.rows + st.plain_rows
            r["verify_rows"] += st.rows
            r["emitted"] += st.emitted
            for k in ("drafted", "accepted", "rejected", "kind_accepted", "kind_rejected"):
                r[k] = [a + b for a, b in zip(r[k], getattr(st, k))]
    return res


def _acc(r: dict, source: int) -> str:
    return f"{r['accepted'][source]}/{r['drafted'][source]}" if r["drafted"][source] else "-"


def greedy_by_argmax(logits, *, bitmask=None, indices=None, temperature, top_k, top_p, min_p, seed, step, **_):
    """A drop-in ``LLM.sample_fn`` with the same tokens as ``kernels.sample`` that takes greedy
    rows by masked argmax. The CPU path of ``kernels.sample`` (the torch reference) hashes noise
    for and sorts the whole vocabulary on every row, greedy ones too: 11 ms a row at V = 49,152
    here, while verification takes greedy rows by argmax. Both modes use this, so the table
    compares decoding, not samplers."""
    import torch

    from deepinfer import kernels

    B = logits.shape[0]
    out = kernels.verify(
        logits[:, None], torch.empty(B, 0, dtype=torch.int64, device=logits.device),
        bitmask=None if bitmask is None else bitmask[:, None], indices=indices, temperature=temperature,
        top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, step=step, validate=False,
    )  # fmt: skip
    return kernels.SampleOutput(out.bonus, out.bonus < 0, None)


def bench_cpu(args) -> None:
    from deepinfer import LLM, SamplingParams

    llm = LLM(None, dtype=args.dtype, device="cpu", seed=0)
    if not args.reference_sampler:
        llm.sample_fn = greedy_by_argmax
    tasks = workload(args.prompts, lambda s: llm.compile_constraint(SamplingParams(json_schema=s)))
    msgs = [[{"role": "user", "content": prompt_text(t)}] for t in tasks]
    prompts = [llm.tokenizer.encode(llm.tokenizer.apply_chat_template(m, True), add_special_tokens=False)
               for m in msgs]  # fmt: skip
    params = [SamplingParams(temperature=0, max_tokens=args.max_tokens, json_schema=t["schema"]) for t in tasks]
    print(f"workload: {len(tasks)} maskbench-dev instances, prompt tokens "
          f"{min(map(len, prompts))}-{max(map(len, prompts))}, dtype {llm.dtype}, greedy", flush=True)
    _generate(llm, prompts[:2], [p.__class__(**{**p.__dict__, "max_tokens": 8}) for p in params[:2]], True)  # warm-up
    modes = {"off": False, "DSpark": True}
    if args.fixed:  # every draft found verified, no confidence scheduling
        modes["DSpark fixed"] = {"schedule": "fixed"}
    rows, trace = [], {}
    for batch in args.batches:
        res = measure(llm, prompts, params, batch, modes)
        base = res["off"]
        base_tps = (sum(len(o.token_ids) for o in base["outs"]) - len(prompts)) / base["decode"]
        for m, r in res.items():
            n = sum(len(o.token_ids) for o in r["outs"])
            tps = (n - len(prompts)) / r["decode"]
            same = sum(a.token_ids == b.token_ids for a, b in zip(r["outs"], base["outs"]))
            valid = sum(o.parsed is not None for o in r["outs"])
            rows.append([batch, m, n, f"{tps:.1f}", f"{tps / base_tps:.2f}x",
                         f"{(n - len(prompts)) / max(r['rows'], 1):.2f}",
                         f"{r['emitted'] / r['verify_rows']:.2f}" if r["verify_rows"] else "-",
                         _acc(r, 0), _acc(r, 1), f"{same}/{len(prompts)}", f"{valid}/{len(prompts)}"])  # fmt: skip
            print("  measured", rows[-1], flush=True)
            if m == "DSpark":
                trace[f"batch{batch}"] = {
                    "kinds": [a / max(a + b, 1) for a, b in zip(r["kind_accepted"], r["kind_rejected"])],
                    "tokens_per_verify_step": r["emitted"] / max(r["verify_rows"], 1),
                }
    sampler = "engine sampler" if args.reference_sampler else "greedy by argmax in both modes"
    print(f"\nCPU, embedded SmolLM2-135M-Instruct, {llm.dtype}, greedy ({sampler}), max_tokens {args.max_tokens}, "
          f"{len(prompts)} extraction prompts (maskbench-dev); decode tokens/s (prefill subtracted)")
    _table(["batch", "mode", "tokens", "tok/s", "vs off", "tok/row-step", "tok/verify step",
            "forced acc", "n-gram acc", "same output", "valid"], rows)
    trace["source"] = f"bench_dspark.py CPU run, {llm.dtype}, {len(prompts)} prompts"
    with open(args.trace, "w") as fh:
        json.dump(trace, fh, indent=1)
    print(f"\nacceptance (P(draft accepted | earlier drafts accepted), by class) written to {args.trace}")


# -- device: random weights, acceptance replayed ---------------------------------------------
def _replay_dspark(rates: dict, seed: int = 0):
    """A DSpark whose verify keeps the real kernel's work and then redraws each row's accepted
    count draft by draft with the measured rate of each draft's confidence class."""
    import torch

    from deepinfer import kernels
    from deepinfer.spec import DSpark

    class Replay(DSpark):
        rng = random.Random(seed)

        def step(self, llm, plan, masks):
            self._plan = plan
            return super().step(llm, plan, masks)

        def replay_verify(self, logits, drafts, **kw):
            out = kernels.verify(logits, drafts, **kw)
            tokens = out.tokens.tolist()
            acc = []
            for b, d in enumerate(self._plan.drafts):
                a = 0
                while a < len(d) and self.rng.random() < rates[d.kinds[a]]:
                    a += 1
                tokens[b][:a] = d.tokens[:a]  # accepted drafts, then the target's token at a
                acc.append(a)
            dev = logits.device
            t = torch.tensor(tokens, device=dev)
            a = torch.tensor(acc, device=dev)
            return kernels.VerifyOutput(a, t.gather(1, a[:, None])[:, 0], t)

    d = Replay(True)
    d.verify_fn = d.replay_verify
    return d


def bench_device(args) -> None:
    import torch
    from bench_decode import SHAPES, _random_weights
    from bench_e2e import _tokenizer_for

    from deepinfer import LLM, SamplingParams
    from deepinfer.config import ModelConfig
    from deepinfer.loader.types import LoadedModel

    trace = json.load(open(args.trace)) if os.path.exists(args.trace) else {}
    rates = (trace.get("batch1") or {}).get("kinds") or DEFAULT_RATES
    L, H, I, nh, nkv, hd, V, tied, theta = SHAPES[args.shape]
    tok, eos, _ = _tokenizer_for(args.shape)
    cfg = ModelConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_layers=L, num_heads=nh,
                      num_kv_heads=nkv, head_dim=hd, rope_theta=theta, tie_word_embeddings=tied,
                      max_position_embeddings=4096)  # fmt: skip
    w = _random_weights(SHAPES[args.shape], torch.device(args.device), torch.bfloat16)
    loaded = LoadedModel(config=cfg, weights=w, tokenizer=tok, source=f"random {args.shape}", eos_token_ids=eos)
    llm = LLM(loaded, device=args.device, dtype="bfloat16", max_num_seqs=max(args.batches), max_model_len=2048,
              seed=0)  # fmt: skip
    tasks = workload(args.prompts, lambda s: llm.compile_constraint(SamplingParams(json_schema=s)))
    base_prompts = [llm.tokenizer.encode(prompt_text(t)) for t in tasks]
    print(f"device {args.device}, {args.shape} random weights bf16; replayed acceptance {rates} "
          f"({trace.get('source', 'default rates: no trace file')})", flush=True)
    rows = []
    for batch in args.batches:
        n = max(batch, len(tasks))  # batch 1: every task, one after another
        prompts = [base_prompts[i % len(tasks)] for i in range(n)]
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.max_tokens,
                                 json_schema=tasks[i % len(tasks)]["schema"]) for i in range(n)]  # fmt: skip
        modes = {"off": False, "DSpark (replayed)": _replay_dspark(rates)}
        for setting in modes.values():  # warm-up: graph captures for the buckets this batch uses
            _generate(llm, prompts[:batch], params[:batch], setting)
        res = measure(llm, prompts, params, batch, modes)
        base_tps = None
        for m, r in res.items():
            n = sum(len(o.token_ids) for o in r["outs"])
            tps = (n - len(prompts)) / r["decode"]
            base_tps = base_tps or tps
            rows.append([batch, m, n, f"{tps:.1f}", f"{tps / base_tps:.2f}x",
                         f"{(n - len(prompts)) / max(r['rows'], 1):.2f}",
                         f"{r['emitted'] / r['verify_rows']:.2f}" if r["verify_rows"] else "-"])  # fmt: skip
            print("  measured", rows[-1], flush=True)
    print(f"\n{args.device}, {args.shape} (random weights, bf16), seeded sampling, max_tokens {args.max_tokens}; "
          f"decode tokens/s (prefill subtracted), acceptance replayed from the CPU measurement")
    _table(["batch", "mode", "tokens", "tok/s", "vs off", "tok/row-step", "tok/verify step"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--batches", default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument("--fixed", action="store_true", help="CPU: also DSpark with schedule='fixed'")
    ap.add_argument("--reference-sampler", action="store_true",
                    help="CPU: keep the engine's sampler for plain decode steps (see greedy_by_argmax)")
    ap.add_argument("--replay", action="store_true", help="the random-weights replay on any device (smoke test)")
    args = ap.parse_args()
    if args.device == "cpu" and not args.replay:
        args.batches = [int(x) for x in (args.batches or "1,8").split(",")]
        args.max_tokens = args.max_tokens or 256
        bench_cpu(args)
    else:
        args.batches = [int(x) for x in (args.batches or "1,8,64").split(",")]
        args.max_tokens = args.max_tokens or 128
        bench_device(args)


if __name__ == "__main__":
    main()
