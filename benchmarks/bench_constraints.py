#!/usr/bin/env python
"""JSON Schema constraint benchmark: deepinfer.constraints against xgrammar, llguidance and
outlines-core on the MaskBench schemas (``maskbench-dev``), single thread.

For each tokenizer and engine, per schema: compile the schema, create a matcher, fill the
first mask; then teacher-force every VALID instance (``json.dumps`` compact, tokenized as the
tokenizer encodes it), timing each ``fill mask`` and ``accept`` call. A valid instance whose
token the engine refuses (accept fails, or its bit is off in the mask), or that cannot end
(EOS bit off) at the end, is a false rejection (the instance stops there). Every INVALID
instance that the engine accepts to the end with EOS allowed is a false acceptance.

Each engine runs in its own worker process (spawned, one at a time, so the measurement is
single-threaded and a hang or crash costs one schema): a schema over its time limit
(``--timeout`` for outlines-core, ``--engine-timeout`` for the others) counts as not compiled.

The schemas are the ``*.json`` files of ``--data DIR``, by default
``$DEEPINFER_SHARED_DATA/maskbench-dev`` (the variable the tests use for the shared data).

Usage (from the repository root)::

    DEEPINFER_SHARED_DATA=/path/to/data .venv/bin/python benchmarks/bench_constraints.py \\
        --tokenizer both --limit 100

Not a test: it prints tables (and, for deepinfer, where the time goes).
"""

from __future__ import annotations

import os

# One thread everywhere, set before any engine is imported (workers inherit the env).
for _var in (
    "RAYON_NUM_THREADS",
    "OMP_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "TORCH_NUM_THREADS",
):
    os.environ[_var] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import collections  # noqa: E402
import gc  # noqa: E402
import glob  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import multiprocessing as mp  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DATA_ENV = "DEEPINFER_SHARED_DATA"  # a folder holding maskbench-dev/ (as for the tests)
DEFAULT_DATA = os.path.join(os.environ[DATA_ENV], "maskbench-dev") if os.environ.get(DATA_ENV) else None
ENGINES = ("deepinfer", "xgrammar", "llguidance", "outlines")
ENGINE_MODULES = {
    "deepinfer": "deepinfer.constraints",
    "xgrammar": "xgrammar",
    "llguidance": "llguidance",
    "outlines": "outlines_core",
}
PEERS = ENGINES[1:]
ns = time.perf_counter_ns


# ============================================================================ engines
# Adapters run inside the worker process. Each keeps one [1, ceil(V/32)] int32 bitmask
# (``self.row`` is a numpy view of it) and exposes compile / matcher / fill / accept.


class _Engine:
    name = "?"

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.V = len(cfg["token_bytes"])
        self.eos = cfg["eos_id"]
        self.bitmask = np.zeros((1, (self.V + 31) // 32), dtype=np.int32)
        self.row = self.bitmask[0]

    def allowed(self, token: int) -> bool:
        return bool((int(self.row[token >> 5]) >> (token & 31)) & 1)

    def version(self) -> str:
        return ""

    def warmup(self) -> None:
        schema = {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
            "required": ["a"],
        }
        c = self.compile(schema)
        m = self.matcher(c)
        self.fill(m)

    def phases(self, schema: Any) -> dict | None:
        return None


class DeepInferEngine(_Engine):
    name = "deepinfer"

    def __init__(self, cfg: dict) -> None:
        super().__init__(cfg)
        from tokenizers import Tokenizer

        from deepinfer.constraints import Compiler, Matcher, Vocabulary

        self._Compiler, self._Matcher = Compiler, Matcher
        t = ns()
        tok = Tokenizer.from_str(cfg["tokenizer_json"])
        self.vocab = Vocabulary.from_tokenizer(tok, eos_ids=[self.eos])
        self.vocab_s = (ns() - t) / 1e9  # (the tokenizer's part of the init: see fresh_process)
        self.compiler = Compiler(self.vocab)  # builds the shared vocabulary trie now
        self.ws = cfg["whitespace"]

    def version(self) -> str:
        try:
            import subprocess

            return subprocess.run(
                ["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
            ).stdout.strip()
        except Exception:  # noqa: BLE001
            return ""

    def compile(self, schema):
        # a fresh compiler per schema would rebuild nothing (the trie lives on the vocabulary),
        # but its cache must not answer: schemas are distinct, so it never does.
        return self.compiler.json_schema(
            schema,
            whitespace=self.ws,
            lenient=self.cfg["lenient"],
            key_order=self.cfg.get("key_order", "schema"),
        )

    def matcher(self, compiled):
        return self._Matcher(compiled)

    def fill(self, m) -> None:
        m.fill_bitmask(self.bitmask, 0)

    def accept(self, m, token: int) -> bool:
        return m.accept(token)

    def phases(self, schema: Any) -> dict | None:
        """Redo the compile in its phases (cold, not cached) for the analysis."""
        try:
            from deepinfer.constraints.compiled import CompiledConstraint
            from deepinfer.constraints.json_schema import schema_to_grammar
            from deepinfer.constraints.key_order import attach, compile_unique

            t0 = ns()
            g = schema_to_grammar(
                schema,
                whitespace=self.ws,
                strict=False,
                lenient=self.cfg["lenient"],
                key_order=self.cfg.get("key_order", "schema"),
            )
            t1 = ns()
            a, tags = compile_unique(g, self.compiler.limits)
            t2 = ns()
            cc = attach(CompiledConstraint(a, self.vocab, "json_schema", "phases", g.notes), tags)
            m = self._Matcher(cc)
            t3 = ns()
            m.fill_bitmask(self.bitmask, 0)
            t4 = ns()
            return {
                "front_end": (t1 - t0) / 1e9,
                "automaton": (t2 - t1) / 1e9,
                "join": (t3 - t2) / 1e9,
                "first_mask": (t4 - t3) / 1e9,
                "rules": len(g.rules),
                "states": int(a.n_states),
                "regular": bool(a.is_regular),
                "schema_bytes": len(json.dumps(schema)),
            }
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {e}"[:200]}


class XGrammarEngine(_Engine):
    name = "xgrammar"

    def __init__(self, cfg: dict) -> None:
        super().__init__(cfg)
        import xgrammar as xgr

        self.xgr = xgr
        # decoded bytes (RAW); special tokens as "" so xgrammar treats them as special
        vocab = [b if b is not None else b"" for b in cfg["token_bytes"]]
        self.info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=self.V, stop_token_ids=[self.eos])
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        # strict_mode=True (xgrammar's default) forbids undeclared properties and items: a smaller
        # language than the schema's, so it is off unless --xgrammar-strict asks for it
        self.strict = cfg["xgrammar_strict"]
        try:  # xgrammar fills numpy arrays through DLPack; fall back to its torch bitmask
            m = xgr.GrammarMatcher(self.compiler.compile_builtin_json_grammar())
            m.fill_next_token_bitmask(self.bitmask, 0)
            self.target = self.bitmask
        except Exception:  # noqa: BLE001
            self.target = xgr.allocate_token_bitmask(1, self.V)
            self.bitmask = self.target
            self.row = self.target[0].numpy()

    def version(self) -> str:
        from importlib.metadata import version

        return version("xgrammar")

    def compile(self, schema):
        if self.cfg["whitespace"] == "compact":
            return self.compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=self.strict
            )
        return self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=True, strict_mode=self.strict
        )

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m) -> None:
        m.fill_next_token_bitmask(self.target, 0)

    def accept(self, m, token: int) -> bool:
        return m.accept_token(token)


class LLGuidanceEngine(_Engine):
    name = "llguidance"

    def __init__(self, cfg: dict) -> None:
        super().__init__(cfg)
        import llguidance
        import llguidance.numpy

        self.llg = llguidance
        self._fill = llguidance.numpy.fill_next_token_bitmask
        self.tok = llguidance.LLTokenizer(cfg["tokenizer_json"], n_vocab=self.V, eos_token=self.eos)
        self.opts = {"whitespace_flexible": cfg["whitespace"] == "flexible", "lenient": cfg["lenient"]}

    def version(self) -> str:
        from importlib.metadata import version

        return version("llguidance")

    def compile(self, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, overrides=self.opts)
        m = self.llg.LLMatcher(self.tok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m  # a pristine matcher: each instance gets a deep copy

    def matcher(self, compiled):
        return compiled.deep_copy()

    def fill(self, m) -> None:
        self._fill(m, self.bitmask, 0)

    def accept(self, m, token: int) -> bool:
        return m.consume_token(token)


class OutlinesEngine(_Engine):
    name = "outlines"

    def __init__(self, cfg: dict) -> None:
        super().__init__(cfg)
        import outlines_core

        self.oc = outlines_core
        by_bytes: dict[bytes, list[int]] = {}
        for i, b in enumerate(cfg["token_bytes"]):
            if b is not None:
                by_bytes.setdefault(b, []).append(i)
        self.vocab = outlines_core.Vocabulary(self.eos, by_bytes)
        self.ws = "" if cfg["whitespace"] == "compact" else None
        self.ptr = self.bitmask.ctypes.data

    def version(self) -> str:
        from importlib.metadata import version

        return version("outlines-core")

    def compile(self, schema):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema), whitespace_pattern=self.ws)
        return self.oc.Index(regex, self.vocab)

    def matcher(self, compiled):
        return self.oc.Guide(compiled)

    def fill(self, m) -> None:
        m.write_mask_into(self.ptr, self.row.size, 4)

    def accept(self, m, token: int) -> bool:
        try:
            m.advance(token, return_tokens=False)
            return True
        except Exception:  # noqa: BLE001 - outlines raises on a token the index lacks
            return False


ENGINE_CLASSES = {c.name: c for c in (DeepInferEngine, XGrammarEngine, LLGuidanceEngine, OutlinesEngine)}


# ============================================================================ worker


def error_reason(e: BaseException) -> str:
    """A short, groupable reason: exception type + message without pointers and numbers."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    msg = re.sub(r"\s*\((at|line|position) [^)]*\)\s*$", "", msg)  # ConstraintError's "where"
    msg = re.sub(r"\bat #?/[^\s,;)]*", "at <ptr>", msg)
    msg = re.sub(r"'#[^']*'|\"#[^\"]*\"", "<ptr>", msg)
    msg = re.sub(r"\d[\d,._]*", "N", msg)
    return f"{type(e).__name__}: {msg}"[:110]


def _teacher_force(eng: _Engine, compiled, instances: list[list[int]], first):
    """Feed each valid instance token by token, timing every mask fill and accept.

    ``first``: (matcher, ns) whose first mask is already filled and timed, or None.
    Returns mask times, their (instance, token index) positions, accept times and per
    instance None (accepted and may end) or (token index, "accept" | "mask" | "end")."""
    masks: list[int] = []
    where: list[tuple[int, int]] = []
    accepts: list[int] = []
    results = []
    for k, toks in enumerate(instances):
        if first is not None:
            m, t = first
            masks.append(t)
            where.append((k, 0))
            filled, first = True, None
        else:
            m, filled = eng.matcher(compiled), False
        res = None
        for i, t in enumerate(toks):
            if not filled:
                a = ns()
                eng.fill(m)
                masks.append(ns() - a)
                where.append((k, i))
            filled = False
            bit = eng.allowed(t)
            a = ns()
            try:
                ok = eng.accept(m, t)
            except Exception:  # noqa: BLE001
                ok = False
            accepts.append(ns() - a)
            if not ok or not bit:
                res = (i, "accept" if not ok else "mask")
                break
        if res is None:
            a = ns()
            eng.fill(m)
            masks.append(ns() - a)
            where.append((k, len(toks)))
            if not eng.allowed(eng.eos):
                res = (len(toks), "end")
        results.append(res)
    return masks, where, accepts, results


def run_schema(eng: _Engine, job: dict) -> dict:
    schema = job["schema"]
    gc.collect()
    t0 = ns()
    try:
        compiled = eng.compile(schema)
    except Exception as e:  # noqa: BLE001 - any failure is "not compiled"
        return {"status": "error", "reason": error_reason(e), "compile_s": (ns() - t0) / 1e9}
    t1 = ns()
    try:
        m = eng.matcher(compiled)
        t2 = ns()
        eng.fill(m)
        t3 = ns()
    except Exception as e:  # noqa: BLE001
        return {"status": "error", "reason": "first mask: " + error_reason(e), "compile_s": (t1 - t0) / 1e9}
    out: dict[str, Any] = {
        "status": "ok",
        "compile_s": (t1 - t0) / 1e9,
        "first_mask_s": (t3 - t2) / 1e9,
        "ttfm_s": (t3 - t0) / 1e9,
    }
    first = (m, t3 - t2)
    masks, where, accepts, valid_res = _teacher_force(eng, compiled, job["valid"], first)
    # a second pass over the same instances: what a memoising engine costs once warm
    masks2, _, _, _ = _teacher_force(eng, compiled, job["valid"], None)
    invalid_res = []
    for toks in job["invalid"]:
        m = eng.matcher(compiled)
        accepted = True
        for t in toks:
            eng.fill(m)
            try:
                ok = eng.allowed(t) and eng.accept(m, t)
            except Exception:  # noqa: BLE001
                ok = False
            if not ok:
                accepted = False
                break
        if accepted:
            eng.fill(m)
            accepted = eng.allowed(eng.eos)
        invalid_res.append(accepted)
    out["masks_ns"] = np.asarray(masks, dtype=np.int64)
    out["masks_warm_ns"] = np.asarray(masks2, dtype=np.int64)
    top = np.argsort(out["masks_ns"])[::-1][:3]
    out["slowest"] = [(int(out["masks_ns"][k]), *where[k]) for k in top]  # (ns, instance, token index)
    out["accepts_ns"] = np.asarray(accepts, dtype=np.int64)
    out["valid"] = valid_res
    out["invalid"] = invalid_res
    if job.get("phases"):
        del compiled
        gc.collect()
        out["phases"] = eng.phases(schema)
    return out


def worker_main(conn, engine: str, cfg: dict) -> None:
    try:
        t = ns()
        eng = ENGINE_CLASSES[engine](cfg)
        t_init = (ns() - t) / 1e9
        eng.warmup()  # JIT / lazy imports out of the first schema's figures
        # what lives as long as the worker (the vocabulary, an engine's tokenizer tables) is left
        # out of the collector's full passes, as deepinfer's LLM does once built: such a pass
        # walks every token's entry and would land, some milliseconds long, on one mask
        gc.freeze()
        if engine == "xgrammar" and not cfg.get("verbose"):  # its C++ warnings go to fd 2, per schema
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
        conn.send({"ready": True, "init_s": t_init, "version": eng.version()})
    except BaseException as e:  # noqa: BLE001
        conn.send({"ready": False, "error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()})
        return
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            conn.send(run_schema(eng, job))
        except BaseException as e:  # noqa: BLE001
            conn.send({"status": "error", "reason": "harness: " + error_reason(e)})


class Worker:
    """One engine in a spawned process; respawned after a timeout or a crash."""

    def __init__(self, engine: str, cfg: dict, init_timeout: float = 600.0) -> None:
        self.engine, self.cfg, self.init_timeout = engine, cfg, init_timeout
        self.ctx = mp.get_context("spawn")
        self.proc = None
        self.info: dict = {}
        self.start()

    def start(self) -> None:
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=worker_main, args=(child, self.engine, self.cfg), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        if not parent.poll(self.init_timeout):
            self.kill()
            raise RuntimeError(f"{self.engine}: worker did not start in {self.init_timeout:.0f} s")
        info = parent.recv()
        if not info.get("ready"):
            self.kill()
            raise RuntimeError(f"{self.engine}: {info.get('error')}\n{info.get('tb', '')}")
        if not self.info:
            self.info = info

    def kill(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
        if self.proc is not None:
            self.proc.join(5)
        self.proc = None

    def run(self, job: dict, timeout: float) -> dict:
        try:
            self.conn.send(job)
            if self.conn.poll(timeout):
                return self.conn.recv()
            status, reason = "timeout", f"timeout > {timeout:g} s"
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            code = self.proc.exitcode if self.proc is not None else None
            status, reason = "crash", f"worker died (exit code {code})"
        self.kill()
        self.start()
        return {"status": status, "reason": reason, "compile_s": timeout if status == "timeout" else None}

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        if self.proc is not None:
            self.proc.join(10)
        self.kill()


# ============================================================================ fresh process


def fresh_main(engine: str, cfg_path: str) -> None:
    """In a new process: import the engine, make its vocabulary and compiler, then compile
    one schema and fill its first mask; print the times as JSON (see :func:`fresh_process`)."""
    import pickle

    with open(cfg_path, "rb") as f:
        cfg = pickle.load(f)
    schema = cfg.pop("schema")
    t0 = ns()
    importlib.import_module(ENGINE_MODULES[engine])  # the engine's Python package
    t1 = ns()
    eng = ENGINE_CLASSES[engine](cfg)  # imports the engine, reads the tokenizer, builds its tables
    t2 = ns()
    m = eng.matcher(eng.compile(schema))
    eng.fill(m)
    t3 = ns()
    out = {"init_s": (t2 - t1) / 1e9, "first_s": (t3 - t2) / 1e9, "import_s": (t1 - t0) / 1e9}
    out["vocab_s"] = getattr(eng, "vocab_s", 0.0)  # the tokenizer's part (deepinfer: Vocabulary)
    if engine == "deepinfer":
        from deepinfer.constraints import native

        out["kernels"] = native.STATE.mode
    print("FRESH " + json.dumps(out), flush=True)


def fresh_process(engine: str, cfg: dict, schema: Any, runs: int) -> dict | None:
    """Median over ``runs`` new processes of :func:`fresh_main`'s times: what a new
    process pays before its first schema's first mask (kernels, tries and tables loaded or
    built, never cached in memory)."""
    import pickle
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("wb", suffix=".pkl", delete=False) as f:
        pickle.dump({**cfg, "schema": schema}, f)
    rows = []
    try:
        for _ in range(runs):
            code = (
                f"import sys; sys.path.insert(0, {HERE!r}); import bench_constraints as b; "
                f"b.fresh_main({engine!r}, {f.name!r})"
            )
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
            line = [x for x in out.stdout.splitlines() if x.startswith("FRESH ")]
            if not line:
                print(f"  {engine}: fresh process failed: {out.stderr.strip()[-300:]}", flush=True)
                return None
            rows.append(json.loads(line[-1][6:]))
    finally:
        os.unlink(f.name)
    med = {k: float(np.median([r[k] for r in rows])) for k in ("import_s", "init_s", "first_s", "vocab_s")}
    med["kernels"] = rows[-1].get("kernels", "")
    return med


def fresh_table(fresh: dict[str, dict]) -> list[str]:
    out = [
        "",
        "A new process (median of the runs): importing the engine's package, its set-up, then the "
        "first schema to its first mask. deepinfer's set-up is Vocabulary.from_tokenizer (the "
        "tokenizer's part) + Compiler(vocab):",
        "",
        "| engine | import | set-up | of which the tokenizer's | first schema → first mask | "
        "set-up less the tokenizer's + first mask | kernels |",
        "|---|---|---|---|---|---|---|",
    ]
    for e, r in fresh.items():
        own = r["init_s"] - r["vocab_s"] + r["first_s"]
        out.append(
            f"| {e} | {fmt_t(r['import_s'])} | {fmt_t(r['init_s'])} | "
            f"{fmt_t(r['vocab_s']) if r['vocab_s'] else '–'} | "
            f"{fmt_t(r['first_s'])} | {fmt_t(own)} | {r['kernels'] or '–'} |"
        )
    return out


# ============================================================================ data


def load_schemas(folder: str, limit: int | None, seed: int, only: str | None) -> list[tuple[str, dict]]:
    files = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not files:
        sys.exit(f"no schemas in {folder}")
    if only:
        files = [f for f in files if re.search(only, os.path.basename(f))]
    if limit is not None and limit < len(files):
        files = sorted(random.Random(seed).sample(files, limit))
    out = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            out.append((os.path.basename(f)[: -len(".json")], json.load(fh)))
    return out


def canonical(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def key_spans(text: str) -> list[tuple[int, int]]:
    """Byte spans [start, end) of object keys (quotes included) in compact JSON text."""
    spans = []
    stack: list[str] = []
    b = text.encode("utf-8")
    i, n = 0, len(b)
    expect_key = False
    while i < n:
        c = b[i]
        if c == 0x22:  # string
            j = i + 1
            while j < n and b[j] != 0x22:
                j += 2 if b[j] == 0x5C else 1
            if expect_key:
                spans.append((i, j + 1))
                expect_key = False
            i = j + 1
            continue
        if c == 0x7B:
            stack.append("{")
            expect_key = True
        elif c == 0x5B:
            stack.append("[")
        elif c in (0x7D, 0x5D):
            stack.pop()
            expect_key = False
        elif c == 0x2C:
            expect_key = bool(stack) and stack[-1] == "{"
        i += 1
    return spans


def prepare(schemas, tok) -> list[dict]:
    """Tokenize every instance canonically; remember where keys sit (to tag false rejections)."""
    jobs = []
    for name, d in schemas:
        valid, invalid, vmeta = [], [], []
        for t in d.get("tests", []):
            text = canonical(t["data"])
            ids = tok.encode(text)
            if b"".join(tok.token_bytes[i] or b"\x00" for i in ids) != text.encode("utf-8"):
                continue  # not representable without special tokens: skip (never happens here)
            if t.get("valid"):
                valid.append(ids)
                offs = np.cumsum([0] + [len(tok.token_bytes[i]) for i in ids]).tolist()
                vmeta.append({"text": text, "offs": offs, "keys": key_spans(text)})
            else:
                invalid.append(ids)
        jobs.append(
            {
                "name": name,
                "schema": d["schema"],
                "valid": valid,
                "invalid": invalid,
                "vmeta": vmeta,
                "size": len(json.dumps(d["schema"])),
            }
        )
    return jobs


def at_key(meta: dict, token_index: int) -> bool:
    """Did the refused token fall inside (or right at) an object key?"""
    if token_index >= len(meta["offs"]) - 1:
        return False
    s, e = meta["offs"][token_index], meta["offs"][token_index + 1]
    return any(ks < e and s < ke for ks, ke in meta["keys"])


# ============================================================================ stats


def pct(a, q) -> float:
    return float(np.percentile(a, q)) if len(a) else float("nan")


def fmt_t(s: float | None) -> str:
    """Seconds → a short human string."""
    if s is None or s != s:
        return "–"
    if s < 1e-3:
        return f"{s * 1e6:.1f}µs" if s < 1e-4 else f"{s * 1e6:.0f}µs"
    if s < 1:
        return f"{s * 1e3:.1f}ms" if s < 0.1 else f"{s * 1e3:.0f}ms"
    return f"{s:.2f}s"


def summarize(results: dict[str, dict], jobs: list[dict], names: set[str] | None = None) -> dict:
    ok = [n for n, r in results.items() if r["status"] == "ok" and (names is None or n in names)]
    comp = np.array([results[n]["compile_s"] for n in ok])
    ttfm = np.array([results[n]["ttfm_s"] for n in ok])
    fm = np.array([results[n]["first_mask_s"] for n in ok])
    masks = np.concatenate([results[n]["masks_ns"] for n in ok]) / 1e9 if ok else np.zeros(0)
    accs = np.concatenate([results[n]["accepts_ns"] for n in ok]) / 1e9 if ok else np.zeros(0)
    warm = np.concatenate([results[n]["masks_warm_ns"] for n in ok]) / 1e9 if ok else np.zeros(0)
    by_name = {j["name"]: j for j in jobs}
    fr = fr_key = fa = nvalid = ninvalid = mism = 0
    for n in ok:
        r = results[n]
        for res, meta in zip(r["valid"], by_name[n]["vmeta"]):
            nvalid += 1
            if res is not None:
                fr += 1
                fr_key += at_key(meta, res[0])
                mism += res[1] == "mask"
        ninvalid += len(r["invalid"])
        fa += sum(bool(x) for x in r["invalid"])
    return {
        "n_ok": len(ok),
        "compile": (pct(comp, 50), pct(comp, 90), comp.max() if len(comp) else float("nan")),
        "ttfm": (pct(ttfm, 50), pct(ttfm, 90)),
        "first_mask": pct(fm, 50),
        "mask": (
            masks.mean() if len(masks) else float("nan"),
            pct(masks, 50),
            pct(masks, 99),
            masks.max() if len(masks) else float("nan"),
        ),
        "accept": (pct(accs, 50), pct(accs, 99)),
        "warm": (pct(warm, 50), pct(warm, 99)),
        "n_masks": len(masks),
        "fr": fr,
        "fr_key": fr_key,
        "mism": mism,
        "fa": fa,
        "nvalid": nvalid,
        "ninvalid": ninvalid,
    }


def print_table(title: str, rows: list[tuple[str, dict, dict]], total: int) -> list[str]:
    head = [
        "engine",
        "compiled",
        "compile p50",
        "p90",
        "max",
        "1st mask p50",
        "TTFM p50",
        "mask mean",
        "p50",
        "p99",
        "max",
        "2nd pass p50",
        "p99",
        "accept p50",
        "p99",
        "false rej (at key)",
        "false acc",
    ]
    lines = [
        [
            name,
            f"{s['n_ok']}/{total}",
            *(fmt_t(x) for x in s["compile"]),
            fmt_t(s["first_mask"]),
            fmt_t(s["ttfm"][0]),
            *(fmt_t(x) for x in s["mask"]),
            *(fmt_t(x) for x in s["warm"]),
            *(fmt_t(x) for x in s["accept"]),
            f"{s['fr']}/{s['nvalid']} ({s['fr_key']})",
            f"{s['fa']}/{s['ninvalid']}",
        ]
        for name, s, _ in rows
    ]
    out = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in lines]
    return out


def ratio_table(peers: dict[str, dict], results: dict[str, dict], jobs) -> list[str]:
    """deepinfer ÷ peer on the schemas both compiled (< 1: deepinfer is faster)."""
    out = [
        "",
        "deepinfer ÷ peer, on the schemas both compiled (below 1 = deepinfer faster):",
        "",
        "| vs | common schemas | compile p50 | TTFM p50 | 1st mask p50 | mask mean | mask p50 | mask p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for peer, pres in peers.items():
        common = {n for n, r in results.items() if r["status"] == "ok"} & {
            n for n, r in pres.items() if r["status"] == "ok"
        }
        if not common:
            continue
        a, b = summarize(results, jobs, common), summarize(pres, jobs, common)

        def r(x, y):
            return f"{x / y:.2f}×" if y and y == y and x == x else "–"

        out.append(
            f"| {peer} | {len(common)} | {r(a['compile'][0], b['compile'][0])} | "
            f"{r(a['ttfm'][0], b['ttfm'][0])} | {r(a['first_mask'], b['first_mask'])} | "
            f"{r(a['mask'][0], b['mask'][0])} | {r(a['mask'][1], b['mask'][1])} | "
            f"{r(a['mask'][2], b['mask'][2])} |"
        )
    return out


def reasons(results: dict[str, dict], top: int = 8) -> list[str]:
    c = collections.Counter(r["reason"] for r in results.values() if r["status"] != "ok")
    return [f"    {n:4d}  {why}" for why, n in c.most_common(top)] + (
        [f"    ({len(c) - top} more reasons)"] if len(c) > top else []
    )


def analysis(results: dict[str, dict], jobs: list[dict], n: int = 5) -> list[str]:
    """Where deepinfer spends its time: slowest compiles in phases, worst mask p99s."""
    by_name = {j["name"]: j for j in jobs}
    ok = [k for k, r in results.items() if r["status"] == "ok"]
    out = [
        "",
        f"deepinfer: the {n} slowest schemas to first mask (TTFM), phases redone cold:",
        "",
        "| schema | bytes | TTFM | compile | front end | automaton | join | first mask | rules | states |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k in sorted(ok, key=lambda k: -results[k]["ttfm_s"])[:n]:
        r, p = results[k], results[k].get("phases") or {}
        if "error" in p:
            out.append(
                f"| {k} | {by_name[k]['size']} | {fmt_t(r['ttfm_s'])} | {fmt_t(r['compile_s'])} | "
                f"phases failed: {p['error']} |||||"
            )
            continue
        out.append(
            f"| {k} | {by_name[k]['size']} | {fmt_t(r['ttfm_s'])} | {fmt_t(r['compile_s'])} | "
            f"{fmt_t(p.get('front_end'))} | {fmt_t(p.get('automaton'))} | {fmt_t(p.get('join'))} | "
            f"{fmt_t(p.get('first_mask'))} | {p.get('rules', '–')} | {p.get('states', '–')} |"
        )
    out += [
        "",
        f"deepinfer: the {n} schemas with the worst per-token mask p99:",
        "",
        "| schema | bytes | masks | p50 | p99 | max | > 100 µs | 2nd pass p99 | states "
        "| slowest mask: after … |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    scored = [(pct(results[k]["masks_ns"], 99), k) for k in ok if len(results[k]["masks_ns"])]
    for p99, k in sorted(scored, reverse=True)[:n]:
        m = results[k]["masks_ns"]
        ctx = ""
        if results[k].get("slowest"):
            _, inst, ti = results[k]["slowest"][0]
            meta = by_name[k]["vmeta"][inst]
            cut = meta["offs"][min(ti, len(meta["offs"]) - 1)]
            ctx = meta["text"].encode()[max(0, cut - 24) : cut].decode("utf-8", "replace")
            ctx = "`" + ctx.replace("|", "\\|").replace("`", "'") + "`"
        out.append(
            f"| {k} | {by_name[k]['size']} | {len(m)} | {fmt_t(pct(m, 50) / 1e9)} | {fmt_t(p99 / 1e9)} | "
            f"{fmt_t(m.max() / 1e9)} | {int((m > 100_000).sum())} | "
            f"{fmt_t(pct(results[k]['masks_warm_ns'], 99) / 1e9)} | "
            f"{(results[k].get('phases') or {}).get('states', '–')} | {ctx} |"
        )
    slow_c = sorted(((r["compile_s"], k) for k, r in results.items() if r["status"] == "ok"), reverse=True)
    over = [k for c, k in slow_c if c > 2.0]
    if over:
        out.append(f"\ndeepinfer compiles over 2 s: {len(over)} ({', '.join(over[:8])})")
    return out


def false_lists(name: str, results: dict[str, dict], jobs: list[dict], limit: int = 12) -> list[str]:
    by_name = {j["name"]: j for j in jobs}
    out = []
    for k, r in sorted(results.items()):
        if r["status"] != "ok":
            continue
        for res, meta in zip(r["valid"], by_name[k]["vmeta"]):
            if res is not None and len(out) < limit:
                cut = meta["offs"][min(res[0], len(meta["offs"]) - 1)]
                b = meta["text"].encode()
                ctx = (
                    b[max(0, cut - 30) : cut].decode("utf-8", "replace")
                    + " ⟦"
                    + b[cut : cut + 20].decode("utf-8", "replace")
                )
                out.append(f"    FR {k}: {res[1]} at token {res[0]}: …{ctx!r}")
        nfa = sum(bool(x) for x in r["invalid"])
        if nfa and len(out) < 2 * limit:
            out.append(f"    FA {k}: {nfa} invalid instance(s) accepted")
    return [f"  {name} false rejections (FR) / acceptances (FA), first ones:"] + out if out else []


# ============================================================================ main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokenizer", choices=("smollm2", "llama3", "both"), default="smollm2")
    ap.add_argument(
        "--engines", default=",".join(ENGINES), help="comma-separated subset of " + ",".join(ENGINES)
    )
    ap.add_argument("--limit", type=int, default=None, help="a seeded sample of N schemas (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=None, help="regex on schema file names")
    ap.add_argument(
        "--data",
        default=DEFAULT_DATA,
        metavar="DIR",
        help=f"the MaskBench schemas (default: ${DATA_ENV}/maskbench-dev)",
    )
    ap.add_argument("--timeout", type=float, default=10.0, help="per-schema limit for outlines-core (s)")
    ap.add_argument("--engine-timeout", type=float, default=60.0, help="per-schema limit for the others (s)")
    ap.add_argument("--whitespace", choices=("compact", "flexible"), default="compact")
    ap.add_argument(
        "--lenient", action="store_true", help="deepinfer/llguidance: relax unenforceable keywords"
    )
    ap.add_argument(
        "--key-order",
        choices=("schema", "any"),
        default="schema",
        help="deepinfer: object keys in schema order, or in any order (a run-time check)",
    )
    ap.add_argument(
        "--xgrammar-strict",
        action="store_true",
        help="xgrammar strict_mode=True (its default): undeclared properties/items forbidden",
    )
    ap.add_argument(
        "--outlines-max-bytes",
        type=int,
        default=20_000,
        help="skip outlines-core on schemas larger than this (counted as not compiled)",
    )
    ap.add_argument(
        "--fresh-runs",
        type=int,
        default=3,
        help="new processes per engine timing set-up + first schema to first mask (0: none)",
    )
    ap.add_argument("--details", action="store_true", help="list false rejections / acceptances")
    ap.add_argument("--verbose", action="store_true", help="keep xgrammar's C++ warnings")
    ap.add_argument("--json-out", default=None, help="write per-schema results here")
    args = ap.parse_args(argv)

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for e in engines:
        if e not in ENGINES:
            ap.error(f"unknown engine {e!r}")
    sys.path.insert(0, HERE)
    import _tokenizers

    toks = ["smollm2", "llama3"] if args.tokenizer == "both" else [args.tokenizer]
    if args.data is None or not os.path.isdir(args.data):
        where = args.data or f"${DATA_ENV}/maskbench-dev (${DATA_ENV} is not set)"
        ap.error(
            f"no MaskBench schemas at {where}: pass --data DIR or set {DATA_ENV} to the folder holding "
            "maskbench-dev/"
        )
    schemas = load_schemas(args.data, args.limit, args.seed, args.only)
    print(
        f"# {len(schemas)} schemas from {args.data}; engines: {', '.join(engines)}; "
        f"whitespace={args.whitespace}; 1 thread; python {sys.version.split()[0]}",
        flush=True,
    )
    report: list[str] = []
    dump: dict = {}
    for tname in toks:
        t0 = time.time()
        tok = _tokenizers.load(tname)
        jobs = prepare(schemas, tok)
        nv, ni = sum(len(j["valid"]) for j in jobs), sum(len(j["invalid"]) for j in jobs)
        ntok = sum(len(x) for j in jobs for x in j["valid"])
        print(
            f"\n## {tname}: {tok.vocab_size:,} tokens ({tok.source}); {nv} valid instances "
            f"({ntok:,} tokens), {ni} invalid; tokenized in {time.time() - t0:.1f} s",
            flush=True,
        )
        cfg = {
            "tokenizer_json": tok.json,
            "token_bytes": tok.token_bytes,
            "eos_id": tok.eos_id,
            "whitespace": args.whitespace,
            "lenient": args.lenient,
            "key_order": args.key_order,
            "xgrammar_strict": args.xgrammar_strict,
            "verbose": args.verbose,
        }
        all_res: dict[str, dict[str, dict]] = {}
        rows = []
        fresh: dict[str, dict] = {}
        for eng in engines:
            if args.fresh_runs > 0 and jobs:
                r = fresh_process(eng, cfg, jobs[0]["schema"], args.fresh_runs)
                if r is not None:
                    fresh[eng] = r
            t_e = time.time()
            try:
                w = Worker(eng, cfg)
            except Exception as e:  # noqa: BLE001 - engine not installed / broken: skip its row
                print(f"  {eng}: skipped ({str(e).splitlines()[0][:200]})", flush=True)
                continue
            res: dict[str, dict] = {}
            for k, job in enumerate(jobs):
                if eng == "outlines" and job["size"] > args.outlines_max_bytes:
                    res[job["name"]] = {
                        "status": "skipped",
                        "reason": f"schema over {args.outlines_max_bytes} bytes",
                    }
                    continue
                payload = {
                    "schema": job["schema"],
                    "valid": job["valid"],
                    "invalid": job["invalid"],
                    "phases": eng == "deepinfer",
                }
                limit = args.timeout if eng == "outlines" else args.engine_timeout
                res[job["name"]] = w.run(payload, limit)
                if (k + 1) % 25 == 0:
                    print(f"  {eng}: {k + 1}/{len(jobs)} schemas, {time.time() - t_e:.0f} s", flush=True)
            w.close()
            all_res[eng] = res
            s = summarize(res, jobs)
            rows.append((eng, s, w.info))
            print(
                f"  {eng} {w.info.get('version', '')}: vocabulary init {w.info['init_s']:.2f} s; "
                f"{s['n_ok']}/{len(jobs)} compiled in {time.time() - t_e:.0f} s",
                flush=True,
            )
            rs = reasons(res)
            if rs:
                print("  not compiled, by reason:\n" + "\n".join(rs), flush=True)
            if args.details:
                print("\n".join(false_lists(eng, res, jobs)), flush=True)
        title = (
            f"{tname} ({tok.vocab_size:,} tokens), {len(jobs)} schemas, {nv} valid / {ni} invalid "
            f"instances, whitespace={args.whitespace}"
        )
        lines = print_table(title, rows, len(jobs))
        lines.append("")
        lines.append(
            "vocabulary init (once per tokenizer): "
            + ", ".join(f"{e} {info['init_s']:.2f} s" for e, _, info in rows)
        )
        if fresh:
            lines += fresh_table(fresh)
        if "deepinfer" in all_res:
            peers = {p: all_res[p] for p in PEERS if p in all_res}
            if peers:
                lines += ratio_table(peers, all_res["deepinfer"], jobs)
            lines += analysis(all_res["deepinfer"], jobs)
        print("\n" + "\n".join(lines), flush=True)
        report += [""] + lines
        dump[tname] = {
            e: {
                k: {kk: (vv.tolist() if isinstance(vv, np.ndarray) else vv) for kk, vv in r.items()}
                for k, r in res.items()
            }
            for e, res in all_res.items()
        }
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(dump, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
