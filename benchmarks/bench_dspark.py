"""DSpark benchmark on an extraction workload: prints tables, asserts nothing.

Workload: instances of maskbench-dev, found at $DEEPINFER_SHARED_DATA/maskbench-dev (schemas
that compile, valid test data of a modest size). Each prompt shows the instance's content as
plain "key: value" text and asks for it as JSON under the schema (shown too), so the answer
copies spans of the prompt and the schema forces keys, quotes and brackets: the two draft
sources DSpark has.

CPU (default): the embedded SmolLM2-135M-Instruct, greedy, batch 1 and 8, with and without
DSpark; tokens/s (decode only: a max_tokens=1 run of the same prompts is subtracted), tokens per
verification step, acceptance by draft source, and whether the outputs are the same. Writes the
measured acceptance to benchmarks/dspark_acceptance.json for the device run:
    .venv/bin/python benchmarks/bench_dspark.py [--dtype auto|float32|bfloat16] [--prompts 8]

Device: random weights at Llama-3-8B shape (bf16) write random text, in which DSpark finds
almost nothing to draft (inside a random JSON string nothing is forced and nothing matches the
prompt): the first H200 run accepted no drafts (1.00 tokens per row-step). So the replay makes
the random model write each request's answer (``Script``: the real model's answer recorded by
the CPU run in the trace, else the record as compact JSON), in both modes, and DSpark's drafts
-- proposed by the real sources on that text -- are accepted draft by draft at the per-class
rates measured on CPU (``--accept rates``) or where they are the text's own tokens
(``--accept script``: outputs then equal the plain run's). Everything else is the real engine:
masks, scheduler, verify forward as CUDA graphs, verify kernel:
    python benchmarks/bench_dspark.py --device cuda [--batches 1,8,64] [--accept rates|script] [--fixed]
CPU smoke run of the same path: --replay --shape llama3-small.
Goals (issue 6): >= 1.5x tokens/s at batch 1, >= 1.0x at batch 64, lossless.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import glob
import json
import logging
import os
import random
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_decode import _table  # noqa: E402

DATA = os.environ.get("DEEPINFER_SHARED_DATA")  # the folder holding maskbench-dev/
TRACE = os.path.join(HERE, "dspark_acceptance.json")
# P(draft accepted | the drafts before it were), by confidence class (drafts.K_*: forced, first
# copied token after a 1 / 2 / 3+ token match, continued copy): used when no trace file exists
DEFAULT_RATES = [0.9, 0.3, 0.45, 0.6, 0.75]
# shapes for a quick CPU run of the device path (--replay): the real tokenizers' vocabularies
SMALL_SHAPES = {
    "llama3-small": (2, 256, 512, 4, 2, 64, 128256, False, 500000.0),
    "smollm2-small": (2, 256, 512, 4, 2, 64, 49152, True, 100000.0),
}
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
    files = sorted(glob.glob(os.path.join(DATA, "maskbench-dev", "*.json"))) if DATA else []
    if not files:
        sys.exit(
            f"no maskbench-dev/*.json under DEEPINFER_SHARED_DATA={DATA!r}: "
            "set it to the folder holding maskbench-dev/"
        )
    random.Random(seed).shuffle(files)
    tasks, seen = [], set()
    for f in files:
        d = json.load(open(f))
        schema = d.get("schema")
        data = next(
            (
                t["data"]
                for t in d.get("tests", [])
                if t.get("valid") and isinstance(t.get("data"), dict) and len(t["data"]) >= 2
            ),
            None,
        )
        if (
            data is None
            or not 40 <= len(json.dumps(data)) <= max_data
            or len(json.dumps(schema)) > max_schema
        ):
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
    from deepinfer.dspark import DSpark

    llm.dspark = dspark if isinstance(dspark, DSpark) else DSpark(dspark)
    llm.dspark.stats.reset()
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return outs, time.perf_counter() - t, llm.dspark.stats


def measure(llm, prompts, params, batch: int, modes: dict, replay=None) -> dict:
    """Per mode: outputs, decode seconds (full run minus a max_tokens=1 run), stats. Batch 1 runs
    prompt by prompt, alternating the modes, so machine noise falls on both alike. ``replay``:
    the replay harness, whose host seconds (``Replay.seconds``) in each mode's decode are
    reported ("harness")."""
    import dataclasses

    def spent() -> float:
        return replay.seconds if replay is not None else 0.0

    one = [dataclasses.replace(p, max_tokens=1) for p in params]
    res = {m: {"outs": [], "decode": 0.0, "harness": 0.0, "rows": 0, "verify_rows": 0, "emitted": 0,
               "verify_steps": 0, "ragged_steps": 0,
               "drafted": [0, 0], "accepted": [0, 0], "rejected": [0, 0], "kind_accepted": [0] * 5,
               "kind_rejected": [0] * 5} for m in modes}  # fmt: skip
    groups = [list(range(i, min(i + batch, len(prompts)))) for i in range(0, len(prompts), batch)]
    for g in groups:
        ps, sp, sp1 = [prompts[i] for i in g], [params[i] for i in g], [one[i] for i in g]
        h0 = spent()
        _, t_prefill, _ = _generate(llm, ps, sp1, False)
        h_prefill = spent() - h0
        for m, setting in modes.items():
            h0 = spent()
            outs, t, st = _generate(llm, ps, sp, setting)
            r = res[m]
            r["outs"] += outs
            r["decode"] += max(t - t_prefill, 1e-9)
            r["harness"] += max(spent() - h0 - h_prefill, 0.0)
            r["rows"] += st.rows + st.plain_rows
            r["verify_rows"] += st.rows
            r["emitted"] += st.emitted
            r["verify_steps"] += st.verify_steps
            r["ragged_steps"] += st.ragged_steps
            for k in ("drafted", "accepted", "rejected", "kind_accepted", "kind_rejected"):
                r[k] = [a + b for a, b in zip(r[k], getattr(st, k))]
    return res


def _acc(r: dict, source: int) -> str:
    return f"{r['accepted'][source]}/{r['drafted'][source]}" if r["drafted"][source] else "-"


def greedy_by_argmax(
    logits, *, bitmask=None, indices=None, temperature, top_k, top_p, min_p, seed, step, **_
):
    """A drop-in ``LLM.sample_fn`` with the same tokens as ``kernels.sample`` that takes greedy
    rows by masked argmax through the verify kernel, the path a verify step's rows take. Both
    modes use this, so the table compares decoding, not samplers."""
    import torch

    from deepinfer import kernels

    B = logits.shape[0]
    out = kernels.verify(
        logits[:, None], torch.empty(B, 0, dtype=torch.int64, device=logits.device),
        bitmask=None if bitmask is None else bitmask[:, None], indices=indices, temperature=temperature,
        top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, step=step, validate=False,
    )  # fmt: skip
    return kernels.SampleOutput(out.bonus, out.bonus < 0, None)


def _ws(args) -> dict:
    """The JSON whitespace mode asked for (--whitespace), or SamplingParams' default."""
    return {} if args.whitespace is None else {"whitespace": args.whitespace}


def bench_cpu(args) -> None:
    from deepinfer import LLM, SamplingParams

    llm = LLM(None, dtype=args.dtype, device="cpu", seed=0)
    if not args.reference_sampler:
        llm.sample_fn = greedy_by_argmax
    ws = _ws(args)
    tasks = workload(args.prompts, lambda s: llm.compile_constraint(SamplingParams(json_schema=s, **ws)))
    msgs = [[{"role": "user", "content": prompt_text(t)}] for t in tasks]
    prompts = [llm.tokenizer.encode(llm.tokenizer.apply_chat_template(m, True), add_special_tokens=False)
               for m in msgs]  # fmt: skip
    params = [
        SamplingParams(temperature=0, max_tokens=args.max_tokens, json_schema=t["schema"], **ws)
        for t in tasks
    ]
    print(
        f"workload: {len(tasks)} maskbench-dev instances, prompt tokens "
        f"{min(map(len, prompts))}-{max(map(len, prompts))}, dtype {llm.dtype}, greedy",
        flush=True,
    )
    _generate(
        llm, prompts[:2], [p.__class__(**{**p.__dict__, "max_tokens": 8}) for p in params[:2]], True
    )  # warm-up
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
            rows.append(
                [
                    batch,
                    m,
                    n,
                    f"{tps:.1f}",
                    f"{tps / base_tps:.2f}x",
                    f"{(n - len(prompts)) / max(r['rows'], 1):.2f}",
                    f"{r['emitted'] / r['verify_rows']:.2f}" if r["verify_rows"] else "-",
                    _acc(r, 0),
                    _acc(r, 1),
                    f"{same}/{len(prompts)}",
                    f"{valid}/{len(prompts)}",
                ]
            )
            print("  measured", rows[-1], flush=True)
            if m == "off" and "outputs" not in trace:  # the answers the device replay has its model write
                trace["outputs"] = {t["name"]: o.text for t, o in zip(tasks, r["outs"])}
            if m == "DSpark":
                trace[f"batch{batch}"] = {
                    "kinds": [a / max(a + b, 1) for a, b in zip(r["kind_accepted"], r["kind_rejected"])],
                    "tokens_per_verify_step": r["emitted"] / max(r["verify_rows"], 1),
                }
    sampler = "engine sampler" if args.reference_sampler else "greedy by argmax in both modes"
    print(
        f"\nCPU, embedded SmolLM2-135M-Instruct, {llm.dtype}, greedy ({sampler}), "
        f"max_tokens {args.max_tokens}, "
        f"{len(prompts)} extraction prompts (maskbench-dev); decode tokens/s (prefill subtracted)"
    )
    _table(
        [
            "batch",
            "mode",
            "tokens",
            "tok/s",
            "vs off",
            "tok/row-step",
            "tok/verify step",
            "forced acc",
            "n-gram acc",
            "same output",
            "valid",
        ],
        rows,
    )
    trace["source"] = f"bench_dspark.py CPU run, {llm.dtype}, {len(prompts)} prompts"
    with open(args.trace, "w") as fh:
        json.dump(trace, fh, indent=1)
    print(f"\nacceptance (P(draft accepted | earlier drafts accepted), by class) written to {args.trace}")


# -- device: random weights, the real model's text and acceptance replayed -------------------
class Script:
    """The text one request's replayed "model" writes (the extraction answer), in bytes.

    Random weights write random text: inside a JSON string nothing is forced and nothing in the
    prompt matches, so DSpark finds (almost) no drafts and the measured acceptance rates had
    nothing to apply to (the H200 run's 1.00 tokens per row-step). The replay therefore makes the
    random model write this text instead -- the answer a real extraction model writes -- so the
    draft sources see what they see with the real model (forced keys and brackets, spans copied
    from the prompt). Alignment is by bytes: ``pos`` bytes of the text are written; a token whose
    bytes continue the text advances it (another tokenization of the same text stays aligned), one
    that does not (an accepted draft the text does not have) is an insertion and leaves it.
    """

    def __init__(self, text: str, tokenizer, eos: int) -> None:
        self.data = text.encode()
        self.eos = eos
        self.tok = tokenizer
        self.ids = tokenizer.encode(text, add_special_tokens=False)
        self.bytes = _token_bytes(tokenizer)
        self.at: dict[int, int] = {}  # byte offset -> the token the text's tokenization has there
        off = 0
        for t in self.ids:
            self.at.setdefault(off, t)
            off += len(self.bytes[t] or b"")
        self.mid = _mid_tokens(self.data, tokenizer, eos, self.at)  # next_token at the other offsets
        self._offsets = sorted(self.at)  # the offsets of ``at`` in order, and their tokens
        self._tokens = np.array([self.at[o] for o in self._offsets], dtype=np.int64)
        self.request, self.pos, self.seen = None, 0, 0  # request, bytes written, output tokens consumed
        self.jumps: dict[int, int] = {}  # output index -> offset its token was written from (a resync)
        chars = _char_tokens(tokenizer)  # (offset, token) of each of the text's bytes that is a token alone
        self._char_at = np.array([o for o, b in enumerate(self.data) if chars[b] is not None], dtype=np.int64)
        self._char_tok = np.array([chars[self.data[o]] for o in self._char_at], dtype=np.int64)

    def next_token(self, pos: int) -> int:
        """The token the model writes after ``pos`` bytes (EOS at the end)."""
        if pos >= len(self.data):
            return self.eos
        t = self.at.get(pos)
        if t is None:  # mid-token (a draft tokenized the text differently): tokenized up front
            t = self.at[pos] = self.mid[pos]
            i = bisect.bisect_left(self._offsets, pos)  # (kept in order for _first_in_mask)
            self._offsets.insert(i, pos)
            self._tokens = np.insert(self._tokens, i, t)
        return t

    def after_text(self, pos: int, row) -> tuple[int, int] | None:
        """(offset, token) where the model picks the text up again when an insertion left the
        constraint refusing every one of the text's later tokens: EOS, else the first of the
        text's characters after ``pos`` that is a token alone and the int32 bitmask ``row``
        allows (a '"' that closes), found at once; None: none of them."""
        if _allowed(row, self.eos):
            return len(self.data), self.eos
        return _first_allowed(row, self._char_at, self._char_tok, int(np.searchsorted(self._char_at, pos)))

    def _first_in_mask(self, pos: int, row) -> tuple[int, int] | None:
        """The first (offset, token) of the text's tokens after ``pos`` that the int32 bitmask
        ``row`` allows, found at once (None: none of them)."""
        return _first_allowed(row, self._offsets, self._tokens, bisect.bisect_right(self._offsets, pos))

    def advance(self, pos: int, token: int) -> int:
        b = self.bytes[token] if 0 <= token < len(self.bytes) else None
        return pos + len(b) if b and self.data.startswith(b, pos) else pos

    def sync(self, request_id: int, output_ids: list[int]) -> int:
        """Consume the tokens request ``request_id`` emitted since the last call (a new request
        starts the text over); the byte offset now."""
        if request_id != self.request:
            self.request, self.pos, self.seen, self.jumps = request_id, 0, 0, {}
        for i in range(self.seen, len(output_ids)):
            self.pos = self.advance(self.jumps.pop(i, self.pos), output_ids[i])
        self.seen = len(output_ids)
        return self.pos

    def resync(self, pos: int, index: int, row, forced=()) -> int | None:
        """The first of the text's later tokens that the int32 bitmask ``row`` allows, to be output
        token ``index``, written from its offset (the text picked up again); failing that (an
        inserted key the text does not have), what the constraint forces there (``forced``: the
        tokens, or a function giving them), then a closing character; None if nothing is allowed."""
        first = self._first_in_mask(pos, row)  # the text's tokens, checked at once
        if first is not None:
            self.jumps[index] = first[0]
            return first[1]

        again = self.after_text(pos, row)  # (the text's own tokens: checked above)
        if again is not None:
            self.jumps[index] = again[0]
            return again[1]
        forced = list((forced() if callable(forced) else forced)[:1])
        for t in forced + self.closers():
            if _allowed(row, t):
                return t
        return None

    def closers(self) -> list[int]:
        """The single tokens of the characters that close what an insertion left open."""
        chars = _char_tokens(self.tok)
        return [chars[ord(c)] for c in '"}],:0' if chars[ord(c)] is not None]


_TOKEN_BYTES: dict[int, list] = {}
_CHARS: dict[int, list] = {}


def _first_allowed(row, offsets, tokens: np.ndarray, i: int) -> tuple[int, int] | None:
    """The first (offset, token) from index ``i`` on of the parallel ``offsets`` and ``tokens``
    whose token the int32 bitmask ``row`` allows, found with one numpy test (None: none)."""
    toks = tokens[i:]
    hit = np.flatnonzero((row[toks >> 5] >> (toks & 31)) & 1)
    return (int(offsets[i + hit[0]]), int(toks[hit[0]])) if hit.size else None


def _char_tokens(tokenizer) -> list:
    """byte -> the one token of that ASCII character alone, else None (memoised per tokenizer)."""
    key = id(tokenizer)
    if key not in _CHARS:
        ids = [tokenizer.encode(chr(b), add_special_tokens=False) if b < 128 else [] for b in range(256)]
        _CHARS[key] = [i[0] if len(i) == 1 else None for i in ids]
    return _CHARS[key]


NEXT_WINDOW = 256  # Script.next_token: bytes tokenized from a mid-token offset
_MID: dict[tuple, list[int]] = {}


def _mid_tokens(data: bytes, tokenizer, eos: int, at: dict[int, int]) -> list[int]:
    """The token the model writes after each byte offset of ``data``: the first token of what
    follows, tokenized (a window of it: the first token of the rest is the first token of its
    start), EOS where nothing follows. Tokenized up front, in one batch per text (memoised), so
    that no step of the replay tokenizes: ``Script.next_token`` reads it at the offsets the
    text's own tokenization does not start at (a draft tokenized the text differently)."""
    key = (id(tokenizer), data)
    if key not in _MID:
        todo = [p for p in range(len(data)) if p not in at]
        windows = [data[p : p + NEXT_WINDOW].decode(errors="ignore") for p in todo]
        backend = getattr(tokenizer, "backend", None)
        if backend is not None and hasattr(backend, "encode_batch"):
            ids = [e.ids for e in backend.encode_batch(windows, add_special_tokens=False)]
        else:
            ids = [tokenizer.encode(w, add_special_tokens=False) for w in windows]
        mid = [eos] * (len(data) + 1)
        for p, w, i in zip(todo, windows, ids):
            mid[p] = i[0] if w and i else eos
        for p, t in at.items():
            mid[p] = t
        _MID[key] = mid
    return _MID[key]


def forced_tokens(matcher) -> tuple[int, ...]:
    from deepinfer.dspark.drafts import forced_tokens as memo

    return memo(matcher)


def _token_bytes(tokenizer) -> list:
    key = id(tokenizer)
    if key not in _TOKEN_BYTES:
        _TOKEN_BYTES[key] = tokenizer.token_bytes()
    return _TOKEN_BYTES[key]


def _allowed(row, token: int) -> bool:
    """Bit ``token`` of an int32 bitmask row (numpy or torch, host)."""
    return token >= 0 and token < 32 * len(row) and bool((int(row[token >> 5]) >> (token & 31)) & 1)


class Replay:
    """The replay harness: requests (keyed by seed) write their ``Script``; DSpark's drafts are
    accepted at the measured rates.

    ``install(llm)``: plain decode steps (off mode, and DSpark's steps left plain) run the real
    sampler, then emit the script's next token where the row's mask allows it. ``dspark(...)``: a
    DSpark whose verify runs the real kernel on the real logits, then decides each row's accepted
    count on the drafts the step actually proposed (``plan.drafts``, truncated to the verified
    positions): ``accept="rates"`` draft by draft with the rate of its confidence class (the CPU
    measurement), ``accept="script"`` while the draft is the script's token there (the text
    replayed exactly; outputs then equal the plain run's). The bonus is the script's token at the
    first rejected position when that position's mask allows it, else the kernel's own token
    there (which its mask allows). Accepted drafts were walked through the constraint when they
    were proposed and when the masks were filled, so the matcher, ``num_cached`` and the KV
    entries follow from ``DSpark.step`` as with a real model.

    The harness's host seconds are counted (``host``) and left out of DSpark's clock. A verify
    step's harness work starts once the device is done with the step, where ``DSpark.step``
    waits anyway, so leaving it out gives the engine's own step exactly. A plain step's
    harness work (in the sampler) runs while the forward does, as the engine's next launch
    would, and is not made to wait.
    """

    def __init__(self, scripts: dict[int, Script], rates=None, accept: str = "rates", seed: int = 0) -> None:
        if accept not in ("rates", "script"):
            raise ValueError(f"accept must be 'rates' or 'script', got {accept!r}")
        self.scripts, self.rates, self.accept = scripts, list(rates or DEFAULT_RATES), accept
        self.rng = random.Random(seed)
        self.script_tokens = self.fallback_tokens = 0  # plain-step tokens from the script / the sampler
        # the harness's own host work, which a real model's steps do not have: seconds, steps
        self.host = {"plain": [0.0, 0], "verify": [0.0, 0]}

    def _count(self, kind: str, t0: float) -> None:
        h = self.host[kind]
        h[0] += time.perf_counter() - t0
        h[1] += 1

    @property
    def seconds(self) -> float:
        """The harness's host seconds so far (plain and verify steps)."""
        return self.host["plain"][0] + self.host["verify"][0]

    def clock(self) -> float:
        """``time.perf_counter`` less the harness's host seconds so far: the clock DSpark's cost
        model reads under the replay (``install``), so its step times are the engine's own."""
        return time.perf_counter() - self.seconds

    def host_report(self) -> str:
        """The harness's host milliseconds per plain and per verify step."""
        return ", ".join(f"{k} {1e3 * t / max(n, 1):.2f} ms/step ({n})" for k, (t, n) in self.host.items())

    def install(self, llm) -> None:
        import types

        import torch

        from deepinfer.dspark import dspark as dspark_module

        # DSpark times its steps (the cost model, its gate) on this clock: the harness's work is
        # not a cost a real model's step has (``uninstall`` puts the real one back)
        dspark_module.time = types.SimpleNamespace(perf_counter=self.clock)
        sample = llm.__class__._sample.__get__(llm)

        def scripted_sample(seqs, logits, constrained, ahead=0):
            tokens, lps = sample(seqs, logits, constrained, ahead)
            t0 = time.perf_counter()
            rows = set(constrained)
            host = llm.masks.args(len(seqs)).rows_np if constrained else None  # the step's bitmask
            at, script = [], []  # rows whose token the script gives, and those tokens
            for i, s in enumerate(seqs):
                sc = self.scripts.get(s.seed)
                if sc is None or s.is_finished:
                    continue
                pos = sc.sync(s.request_id, s.output_token_ids)
                t = sc.next_token(pos)
                if i in rows:
                    row = host[i]
                    if not _allowed(row, t):
                        t = sc.resync(
                            pos,
                            len(s.output_token_ids),
                            row,
                            lambda m=s.constraint: forced_tokens(m) if m is not None else (),
                        )
                if t is None:
                    self.fallback_tokens += 1
                else:
                    at.append(i)
                    script.append(t)
                    self.script_tokens += 1
            if at:  # one copy each way, not waiting for the device (``tokens[i] = t`` waits for it)
                dev = tokens.device
                tokens.index_copy_(0, _to_device(at, torch.int64, dev), _to_device(script, tokens.dtype, dev))
            self._count("plain", t0)
            return tokens, lps

        llm._sample = scripted_sample

    @staticmethod
    def uninstall(llm) -> None:
        """Undo ``install``: the class's sampler, and DSpark's own clock."""
        from deepinfer.dspark import dspark as dspark_module

        dspark_module.time = time
        llm.__dict__.pop("_sample", None)

    def dspark(self, config=True, *, inline: bool | None = None):
        """A DSpark for the replay (``config``: its settings; ``inline``: ``Verifier.inline``,
        None for the engine's choice)."""
        import torch

        from deepinfer import kernels
        from deepinfer.dspark import DSpark
        from deepinfer.dspark.verify import Verifier

        replay = self

        class RecordingVerifier(Verifier):
            """The verifier, keeping the step's constrained rows as the host knows them (the
            kernel's ``indices`` are on the device: reading them would wait for the forward)."""

            constrained: list[int] = []

            def bitmask(self, future):
                bitmask, self.constrained = super().bitmask(future)
                return bitmask, self.constrained

        RecordingVerifier.inline = inline

        class ReplayDSpark(DSpark):
            verifier_class = RecordingVerifier

            def step(self, plan, masks, **kw):
                self._plan = plan
                return super().step(plan, masks, **kw)

            def replay_verify(self, logits, drafts, *, bitmask=None, indices=None, **kw):
                # the real kernel runs; then the replay waits for it, as DSpark.step does right
                # after this call (it reads the accepted counts back), and only then does its own
                # host work: that work never overlaps the forward, so taking its seconds out (the
                # cost model's clock, "harness out") leaves exactly the engine's step
                out = kernels.verify(logits, drafts, bitmask=bitmask, indices=indices, **kw)  # the real work
                if logits.device.type == "cuda":
                    torch.cuda.synchronize(logits.device)
                t0 = time.perf_counter()
                plan = self._plan
                B, T = logits.shape[0], logits.shape[1]
                acc, want, pos_at = [], [], []
                for s, d in zip(plan.seqs, plan.drafts):
                    sc = replay.scripts.get(s.seed)
                    pos = sc.sync(s.request_id, s.output_token_ids) if sc is not None else 0
                    a = 0
                    while a < len(d):
                        t = d.tokens[a]
                        if replay.accept == "rates":
                            ok = replay.rng.random() < replay.rates[d.kinds[a]]
                        else:
                            ok = sc is not None and t == sc.next_token(pos)
                        if not ok:
                            break
                        if sc is not None:
                            pos = sc.advance(pos, t)
                        a += 1
                    acc.append(a)
                    want.append(sc.next_token(pos) if sc is not None else -1)
                    pos_at.append(pos)
                rows = set(self._verifier.constrained) if bitmask is not None else set()
                host = self._verifier._host(B, T).numpy() if rows else None  # the masks just copied
                tokens = [[-1] * T for _ in range(B)]
                need_kernel = []
                for b, (s, a) in enumerate(zip(plan.seqs, acc)):
                    d = plan.drafts[b].tokens
                    tokens[b][:a] = d[:a]  # the accepted drafts, then the bonus at a
                    t = want[b]
                    if t >= 0 and b in rows and not _allowed(host[b, a], t):
                        # refused (an accepted draft the text lacks): pick the text up again, judged
                        # by the mask after the accepted drafts (the verifier filled it)
                        t = replay.scripts[s.seed].resync(
                            pos_at[b],
                            len(s.output_token_ids) + a,
                            host[b, a],
                            lambda s=s, d=d[:a]: _forced_after(s.constraint, d),
                        )
                    if t is None or t < 0:
                        replay.fallback_tokens += 1  # the kernel's own token there
                        need_kernel.append(b)
                    else:
                        tokens[b][a] = t
                        replay.script_tokens += 1
                if need_kernel:
                    got = out.tokens.tolist()
                    for b in need_kernel:
                        tokens[b][acc[b]] = got[b][acc[b]]
                dev = logits.device  # (the device is idle: a plain copy waits for nothing)
                t = torch.from_numpy(np.array(tokens, dtype=np.int64)).to(dev)
                a = torch.from_numpy(np.array(acc, dtype=np.int64)).to(dev)
                replay._count("verify", t0)
                return kernels.VerifyOutput(a, t.gather(1, a[:, None])[:, 0], t)

        d = ReplayDSpark(config)
        d.verify_fn = d.replay_verify
        return d


def _to_device(rows: list, dtype, device):
    """``rows`` as a tensor on ``device``, copied from pinned memory so that the copy does not
    wait for the device's queued work (a pageable copy may)."""
    import torch

    return torch.tensor(rows, dtype=dtype, pin_memory=device.type == "cuda").to(device, non_blocking=True)


def _forced_after(m, accepted: list[int]) -> tuple[int, ...]:
    """What the matcher ``m`` forces after ``accepted`` drafts (walked, then rolled back: it ends
    as it started)."""
    n = 0
    try:
        for t in accepted:
            if not m.accept(t):
                return ()
            n += 1
        return forced_tokens(m)
    finally:
        m.rollback(n)


def scripts_for(
    tasks: list[dict], n: int, tokenizer, eos: int, outputs: dict | None = None
) -> dict[int, Script]:
    """seed i -> the script of task i % len(tasks): the real model's recorded answer where the
    trace has one, else the record as JSON."""
    out = {}
    for i in range(n):
        task = tasks[i % len(tasks)]
        text = (outputs or {}).get(task["name"]) or json.dumps(
            task["data"], ensure_ascii=False, separators=(",", ":")
        )
        out[i] = Script(text, tokenizer, eos)
    return out


def bench_device(args) -> None:
    import torch
    from bench_decode import SHAPES, _random_weights
    from bench_e2e import _tokenizer_for

    from deepinfer import LLM, SamplingParams
    from deepinfer.config import ModelConfig
    from deepinfer.loader.types import LoadedModel

    trace = json.load(open(args.trace)) if os.path.exists(args.trace) else {}
    rates = (trace.get("batch1") or {}).get("kinds") or DEFAULT_RATES
    shapes = {**SHAPES, **SMALL_SHAPES}
    L, H, I, nh, nkv, hd, V, tied, theta = shapes[args.shape]
    tok, eos, _ = _tokenizer_for("smollm2-135m" if V == 49152 else "llama3-8b")
    cfg = ModelConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_layers=L, num_heads=nh,
                      num_kv_heads=nkv, head_dim=hd, rope_theta=theta, tie_word_embeddings=tied,
                      max_position_embeddings=4096)  # fmt: skip
    w = _random_weights(cfg, torch.device(args.device), torch.bfloat16)
    loaded = LoadedModel(
        config=cfg, weights=w, tokenizer=tok, source=f"random {args.shape}", eos_token_ids=eos
    )
    llm = LLM(
        loaded,
        device=args.device,
        dtype="bfloat16",
        max_num_seqs=max(args.batches),
        max_model_len=2048,
        seed=0,
    )
    ws = _ws(args)
    t0 = time.perf_counter()
    tasks = workload(args.prompts, lambda s: llm.compile_constraint(SamplingParams(json_schema=s, **ws)))
    print(f"built the LLM in {llm.load_seconds:.1f} s; {len(tasks)} constraints in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
    base_prompts = [llm.tokenizer.encode(prompt_text(t)) for t in tasks]
    t0 = time.perf_counter()  # every decode and verify graph the runs may use, as a server does at start
    capture_len = max(map(len, base_prompts)) + args.max_tokens + 16
    n_graphs = llm.capture_graphs(capture_len, verify=True)
    print(f"captured {n_graphs} CUDA graphs up front in {time.perf_counter() - t0:.1f} s", flush=True)
    if args.profile and llm.runner.cuda_graphs:
        graph_times(llm, max(map(len, base_prompts)) + args.max_tokens // 2, args.batches)
    recorded = trace.get("outputs") or {}
    print(
        f"device {args.device}, {args.shape} random weights bf16, {len(tasks)} tasks "
        f"({sum(t['name'] in recorded for t in tasks)} with the real model's recorded answer, "
        f"the rest the record as JSON); acceptance "
        f"{'replayed ' + str([round(r, 3) for r in rates]) if args.accept == 'rates' else 'by the script'} "
        f"({trace.get('source', 'default rates: no trace file')})",
        flush=True,
    )
    rows = []
    prof = StepProfile() if args.profile else None
    for batch in args.batches:
        n = max(batch, len(tasks))  # batch 1: every task, one after another
        prompts = [base_prompts[i % len(tasks)] for i in range(n)]
        params = [SamplingParams(temperature=1.0, seed=i, max_tokens=args.max_tokens,
                                 json_schema=tasks[i % len(tasks)]["schema"], **ws)
                  for i in range(n)]  # fmt: skip
        replay = Replay(scripts_for(tasks, n, llm.tokenizer, eos[0], recorded), rates, args.accept)
        replay.install(llm)  # both modes write the scripts
        modes = {"off": False, "DSpark (replayed)": replay.dspark(_dspark_setting(args))}
        if args.ab_ragged:  # the same DSpark with every verify step padded, measured beside it
            modes["DSpark, padded verify (A/B)"] = replay.dspark(_dspark_setting(args, ragged=False))
        if args.ab_mask_thread:  # the verify step's masks filled by a thread from before the launch
            modes["DSpark, masks on a thread (A/B)"] = replay.dspark(_dspark_setting(args), inline=False)
        if prof is not None:
            prof.wrap_verify(modes["DSpark (replayed)"])
        for _ in range(2):  # warm-up: graph captures for the shapes this batch uses (two passes: the
            for setting in modes.values():  # scheduler's choices, hence shapes, vary with its state)
                _generate(llm, prompts[:batch], params[:batch], setting)
        if prof is not None:
            prof.reset()
        res = measure(llm, prompts, params, batch, modes, replay=replay)
        if prof is not None:
            prof.report(f"batch {batch}, measured runs (both modes)")
        if args.ab_attention and llm.runner.cuda_graphs:
            # the same runs with the verify graphs recaptured on the per-position paged kernel
            # (a row's keys read once per position, not once a row), off measured again beside it
            with _verify_attention(llm, "triton", capture_len):
                ab = {"off": False, "DSpark, per-position attention": replay.dspark(_dspark_setting(args))}
                for setting in ab.values():
                    _generate(llm, prompts[:batch], params[:batch], setting)
                got = measure(llm, prompts, params, batch, ab, replay=replay)
                res.update({f"{m} (A/B)": r for m, r in got.items()})
        base_tps = base_net = None
        for m, r in res.items():
            n_tok = sum(len(o.token_ids) for o in r["outs"])
            tps = (n_tok - len(prompts)) / r["decode"]
            net = (n_tok - len(prompts)) / max(r["decode"] - r["harness"], 1e-9)  # the harness's time out
            if m.startswith("off"):  # each DSpark row against the off run measured beside it
                base_tps, base_net = tps, net
            valid = sum(o.parsed is not None for o in r["outs"])
            rows.append(
                [
                    batch,
                    m,
                    n_tok,
                    f"{tps:.1f}",
                    f"{tps / base_tps:.2f}x",
                    f"{net / base_net:.2f}x",
                    f"{(n_tok - len(prompts)) / max(r['rows'], 1):.2f}",
                    f"{r['emitted'] / r['verify_rows']:.2f}" if r["verify_rows"] else "-",
                    f"{r['verify_rows']}/{r['rows']}",
                    f"{r['ragged_steps']}/{r['verify_steps']}",
                    _acc(r, 0),
                    _acc(r, 1),
                    f"{valid}/{len(prompts)}",
                ]
            )
            print("  measured", rows[-1], flush=True)
        print(
            f"  script tokens {replay.script_tokens}, sampler's where the mask refused the script "
            f"{replay.fallback_tokens}; replay harness host time {replay.host_report()}",
            flush=True,
        )
    print(
        f"\n{args.device}, {args.shape} (random weights, bf16) writing the extraction answers, "
        f"seeded sampling, max_tokens {args.max_tokens}; decode tokens/s (prefill subtracted); acceptance "
        f"{'replayed from the CPU measurement' if args.accept == 'rates' else 'of the scripts exactly'}"
    )
    _table(
        [
            "batch",
            "mode",
            "tokens",
            "tok/s",
            "vs off",
            "vs off, harness out",
            "tok/row-step",
            "tok/verify step",
            "verify rows",
            "ragged steps",
            "forced acc",
            "n-gram acc",
            "valid",
        ],
        rows,
    )


class StepProfile:
    """Where a DSpark run's time goes (``--profile``), per mode ("off" / "dspark"): every step
    interval the cost model observes, by (path, batch bucket, width bucket); CUDA-graph captures
    (decode and verify); host seconds in DSpark's phases (``plan``, ``step`` and, inside it,
    the verifier's calls). Hooks the classes, so it sees every run."""

    HOST = (
        ("DSpark", "plan", "DSpark.plan"),
        ("DSpark", "step", "DSpark.step"),
        ("Verifier", "start_masks", "Verifier.start_masks"),
        ("ModelRunner", "verify", "ModelRunner.verify"),
        ("Verifier", "bitmask", "Verifier.bitmask"),
        ("Verifier", "inputs", "Verifier.inputs"),
        ("StepGraphs", "_make", "capture graph (decode or verify)"),
    )

    def __init__(self) -> None:
        from deepinfer.cuda_graphs import StepGraphs
        from deepinfer.dspark import dspark, verify
        from deepinfer.dspark import policy as scheduler
        from deepinfer.model_runner import ModelRunner

        self.mode = "off"
        self.steps: dict[tuple, list[float]] = {}
        self.host: dict[tuple[str, str], float] = {}
        self.calls: dict[tuple[str, str], int] = {}
        prof = self

        plan = dspark.DSpark.plan

        def plan_in_mode(d, *a, **kw):  # the mode the following steps and timings belong to
            prof.mode = "off" if d.config.default == "off" else "dspark"
            return plan(d, *a, **kw)

        dspark.DSpark.plan = plan_in_mode
        classes = {"DSpark": dspark.DSpark, "Verifier": verify.Verifier, "ModelRunner": ModelRunner,
                   "StepGraphs": StepGraphs}  # fmt: skip
        for cls, name, key in self.HOST:
            setattr(classes[cls], name, self._timed(getattr(classes[cls], name), key))
        observe = scheduler.CostModel.observe

        def observe_hook(cost, path, tokens, seconds, rows=None, step=0):
            if rows is not None:
                T = max(tokens // max(rows, 1), 1)
                key = (prof.mode, path, scheduler.batch_bucket(rows), scheduler.width_bucket(T))
                prof.steps.setdefault(key, []).append(seconds)
            return observe(cost, path, tokens, seconds, rows=rows, step=step)

        scheduler.CostModel.observe = observe_hook

    def _timed(self, fn, key: str):
        """fn, adding its host seconds and calls under (mode, key)."""

        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                k = (self.mode, key)
                self.host[k] = self.host.get(k, 0.0) + time.perf_counter() - t
                self.calls[k] = self.calls.get(k, 0) + 1

        return timed

    def wrap_verify(self, d) -> None:
        """Time a DSpark instance's verify function (an attribute, not a method)."""
        d.verify_fn = self._timed(d.verify_fn, "verify_fn")

    def reset(self) -> None:
        self.steps.clear()
        self.host.clear()
        self.calls.clear()

    def report(self, title: str) -> None:
        print(f"\n{title}: step intervals seen by the cost model")
        rows = []
        for (mode, path, b, t), xs in sorted(self.steps.items()):
            xs = sorted(xs)
            rows.append(
                [
                    mode,
                    path,
                    b,
                    t,
                    len(xs),
                    f"{1e3 * sum(xs) / len(xs):.2f}",
                    f"{1e3 * xs[len(xs) // 2]:.2f}",
                    f"{1e3 * xs[-1]:.2f}",
                    f"{sum(xs):.3f}",
                ]
            )
        _table(
            [
                "mode",
                "path",
                "batch bucket",
                "width bucket",
                "steps",
                "mean ms",
                "p50 ms",
                "max ms",
                "total s",
            ],
            rows,
        )
        print(
            "host time (s, calls): "
            + "; ".join(f"{m} {k} {v:.3f} ({self.calls[(m, k)]})" for (m, k), v in sorted(self.host.items())),
            flush=True,
        )


def graph_times(llm, kv_need: int, batches=(1, 8, 64), widths=(2, 3, 5, 9), reps: int = 20) -> None:
    """Device time of one replay of the decode graph and of each verify width's, by
    ``warmup.time_steps`` over ``reps`` back-to-back replays: the forward alone, no host work."""
    from deepinfer.cuda_graphs import bucket_for, kv_bucket
    from deepinfer.warmup import time_steps

    runner = llm.runner
    kv = kv_bucket(kv_need, runner.model.max_len)
    buckets = [bucket_for(b, runner.buckets()) for b in batches]
    times = time_steps(runner, widths, reps, kv=kv, buckets=buckets)
    rows = [
        [
            Bp,
            *(f"{times[key] * 1e3:.2f}" for key in [("decode", Bp, 1), *(("verify", Bp, T) for T in widths)]),
        ]
        for Bp in buckets
    ]
    print(f"\ngraph replay, ms on the device ({kv} keys; width 1 = the decode graph)")
    _table(["rows", "width 1"] + [f"width {T}" for T in widths], rows)
    more = [r for r in runner.buckets() if r > max(buckets)]  # what a ragged verify step replays
    if more:
        times = time_steps(runner, (), reps, kv=kv, buckets=more)
        print("decode graphs past the largest batch (ragged verify steps), ms on the device")
        _table(["rows", "width 1"], [[r, f"{times[('decode', r, 1)] * 1e3:.2f}"] for r in more])


@contextlib.contextmanager
def _verify_attention(llm, attention: str, capture_len: int):
    """Within: the verify graphs recaptured with ``decode_static(attention=...)``; after: recaptured
    with the engine's own choice again (``cuda_graphs.verify_attention``)."""
    from deepinfer import cuda_graphs

    own = cuda_graphs.verify_attention

    def recapture():
        graphs = llm.runner.graphs.graphs
        for tile in [t for t in graphs if t.positions > 1]:
            del graphs[tile]
        llm.capture_graphs(capture_len, verify=True)

    cuda_graphs.verify_attention = lambda *_: attention
    recapture()
    try:
        yield
    finally:
        cuda_graphs.verify_attention = own
        recapture()


def _dspark_setting(args, **fields):
    """DSpark's settings for the DSpark modes: --fixed's schedule, and ``fields``."""
    return {**({"schedule": "fixed"} if args.fixed else {}), **fields} or True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument(
        "--whitespace", default=None, help="JSON whitespace mode of the requests (default: SamplingParams')"
    )
    ap.add_argument("--batches", default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--trace", default=TRACE)
    ap.add_argument(
        "--fixed",
        action="store_true",
        help="CPU: also DSpark with schedule='fixed'; device: the replayed DSpark verifies every draft",
    )
    ap.add_argument(
        "--reference-sampler",
        action="store_true",
        help="CPU: keep the engine's sampler for plain decode steps (see greedy_by_argmax)",
    )
    ap.add_argument(
        "--replay", action="store_true", help="the random-weights replay on any device (smoke test)"
    )
    ap.add_argument(
        "--accept",
        default="rates",
        choices=["rates", "script"],
        help="device: drafts accepted at the measured rates, or where they are the script's tokens",
    )
    ap.add_argument(
        "--ab-attention",
        action="store_true",
        help="device: also run each batch with the verify graphs on the per-position paged attention",
    )
    ap.add_argument(
        "--ab-ragged",
        action="store_true",
        help="device: also run DSpark with every verify step padded (DSparkConfig ragged=False)",
    )
    ap.add_argument(
        "--ab-mask-thread",
        action="store_true",
        help="device: also run DSpark with the verify masks filled on a thread (Verifier.inline=False)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="device: print step times by shape, graph captures and DSpark's host time",
    )
    args = ap.parse_args()
    if args.device != "cpu":  # the engine's warm-up, phase by phase (a cut-off run shows where)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
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
