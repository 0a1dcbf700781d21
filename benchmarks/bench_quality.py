"""Extraction quality: free text against JSON-Schema-constrained output, same prompts (issue 27).

    python benchmarks/bench_quality.py --check-data          # the data set's own check, no model
    python benchmarks/bench_quality.py --limit 12            # a quick greedy run
    python benchmarks/bench_quality.py                       # 60 documents, greedy
    python benchmarks/bench_quality.py --temperature 0.7 --seeds 0,1,2 --by-domain
    python benchmarks/bench_quality.py --modes free,default,compact,flexible

Data: benchmarks/quality/docs.jsonl (short documents in five domains, each with the true
value of every field) and benchmarks/quality/schemas.json (one JSON Schema per domain). Every
document gets the same chat prompt in every mode (a user message, no system message):
"Extract the following fields from the text as JSON: <fields>.\\n\\nText: <text>".

Modes: ``free`` is unconstrained text, scored on the first JSON object found in it;
``default`` is ``json_schema=`` without ``whitespace=``; ``extract`` runs
``examples/extract.py`` itself (its own prompt: a system message and the schema; the default
mode) on each domain's documents, so its row is what a user of the example gets; any other
name is passed as ``SamplingParams(whitespace=<name>)`` (``compact``, ``flexible``, ...). A
mode that SamplingParams refuses is reported as such.

Per mode it reports:
  - field accuracy: every leaf field of the true answer (array items by position) matches the
    output's value at the same path, after stripping surrounding space and folding case;
    numbers compare as numbers (52 == 52.0; a numeric string counts as its number, a bool as
    "true"/"false": accuracy measures the values, validity the types). A missing or
    unparseable output counts all its fields wrong. A constrained output is parsed whole.
  - valid: the output parses and validates against the domain's schema (jsonschema, with
    format checks);
  - finished: finish_reason == "stop" (not cut by max_tokens);
  - tok/s: generated tokens / wall time of the one batched ``llm.chat`` call (constraints are
    compiled, and a 2-token request of the mode is run, before the clock starts).

max_tokens: the free mode runs first (at --calibrate-tokens); every mode then gets 1.5x the
longest free answer in tokens (the output up to the end of its first JSON object; outputs
without one are not answers and do not count), rounded up, unless --max-tokens is given. The
free row is that run again at the new max_tokens (skipped when every free output already
ended within it: the rerun would give the same tokens). Greedy (temperature 0) by
default; with a temperature > 0, each seed of --seeds runs and the table gives the mean
figures, followed by the per-seed ones. Prints tables and asserts nothing.

Repeatability: the default engine is not batch-invariant (DSpark verify forwards and the rows
still running change the kernels' shapes), so a near-tie between two tokens can flip from one
run or mode to the next; with the compact constraint such ties are common (an age of 18 one
run, 23 the next). ``--deterministic`` (``LLM(deterministic=True)``, about 3x slower on the
CPU) makes every greedy output repeat exactly.

The functions a test can import (no model needed for the first three): ``load_data``,
``first_json_object``, ``field_accuracy``, ``run_mode``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
import time
from collections import defaultdict
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_decode import _table  # noqa: E402  (the benchmarks' one Markdown table printer)

DATA_DIR = os.path.join(HERE, "quality")
MISSING = object()


# -- data --------------------------------------------------------------------------------------
def load_data(data_dir: str = DATA_DIR) -> tuple[list[dict], dict[str, dict]]:
    """(documents, schemas by domain): docs.jsonl rows {id, domain, text, answer} in file order."""
    with open(os.path.join(data_dir, "schemas.json"), encoding="utf-8") as fh:
        schemas = json.load(fh)
    with open(os.path.join(data_dir, "docs.jsonl"), encoding="utf-8") as fh:
        docs = [json.loads(line) for line in fh if line.strip()]
    return docs, schemas


def describe_fields(schema: dict) -> str:
    """The prompt's field list: examples/extract.py's, so both send the same prompt."""
    return extract_module().describe_fields(schema)


def extract_module():
    """examples/extract.py as a module (loaded once)."""
    import importlib.util

    name = "deepinfer_example_extract"
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "extract.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)  # (its dataclasses need it)
        spec.loader.exec_module(module)
    return sys.modules[name]


def prompt_for(doc: dict, schema: dict) -> list[dict]:
    """The chat conversation of one document: the same in every mode."""
    template = extract_module().DEFAULT_TEMPLATE  # the example's own prompt
    content = template.replace("{fields}", describe_fields(schema)).replace("{text}", doc["text"])
    return [{"role": "user", "content": content}]


# -- scoring -----------------------------------------------------------------------------------
def first_json_span(text: str) -> tuple[int, int, dict] | None:
    """(start, end, object) of the first balanced ``{...}`` in ``text`` that json.loads takes
    as an object; braces inside JSON strings (and escaped quotes) do not count. None if none."""
    start = text.find("{")
    while start != -1:
        depth, in_str, esc = 0, False, False
        for i in range(start, len(text)):
            c = text[i]
            if in_str:
                if esc:
                    esc = False
                elif c == "\\":
                    esc = True
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    try:
                        obj = json.loads(text[start : i + 1])
                    except ValueError:
                        break
                    if isinstance(obj, dict):
                        return start, i + 1, obj
                    break
        start = text.find("{", start + 1)
    return None


def first_json_object(text: str) -> dict | None:
    """The first JSON object in free text (prose or a ``` fence around it is fine), or None."""
    found = first_json_span(text)
    return None if found is None else found[2]


def leaves(value: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """(path, value) of every scalar in a JSON value; a path holds keys and list indices."""
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in leaves(v, (*path, k))]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in leaves(v, (*path, i))]
    return [(path, value)]


def _lookup(obj: Any, path: tuple) -> Any:
    for p in path:
        if isinstance(p, int):
            if not isinstance(obj, list) or p >= len(obj):
                return MISSING
        elif not isinstance(obj, dict) or p not in obj:
            return MISSING
        obj = obj[p]
    return obj


def _norm(s: str) -> str:
    return s.strip().casefold()


def _as_number(x: Any) -> float | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int | float):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x.strip())
        except ValueError:
            return None
    return None


def same_value(want: Any, got: Any) -> bool:
    """One leaf: the true value against the output's (see the module doc for the rules)."""
    if got is MISSING:
        return False
    if isinstance(want, bool):
        if isinstance(got, bool):
            return got == want
        return isinstance(got, str) and _norm(got) == ("true" if want else "false")
    if isinstance(want, int | float):
        n = _as_number(got)
        return n is not None and math.isclose(n, float(want), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(want, str):
        if isinstance(got, str):
            return _norm(got) == _norm(want)
        if isinstance(got, int) and not isinstance(got, bool):  # a postal code written as 2000
            return str(got) == want.strip()
        return False
    return got == want


def field_matches(answer: dict, output: Any) -> list[tuple[tuple, bool]]:
    """(path, right?) for every leaf field of the true answer."""
    return [
        (path, output is not None and same_value(want, _lookup(output, path)))
        for path, want in leaves(answer)
    ]


def field_accuracy(answer: dict, output: Any) -> tuple[int, int]:
    """(fields right, fields in the answer); an output of None gets none right."""
    m = field_matches(answer, output)
    return sum(ok for _, ok in m), len(m)


def field_name(path: tuple) -> str:
    """A path as a field name, list indices folded: items[].quantity."""
    out = ""
    for p in path:
        out += "[]" if isinstance(p, int) else ("." if out else "") + p
    return out


def _validator(schema: dict):
    import jsonschema

    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


# -- running -----------------------------------------------------------------------------------
class ModeRun(list):
    """Per-document results of one mode (dicts) plus the batch's wall time and token count."""

    mode: str
    seconds: float = 0.0
    error: str | None = None  # the mode could not run (SamplingParams refused it)

    @property
    def tokens(self) -> int:
        return sum(r["n_tokens"] for r in self)


def params_for(mode: str, schema: dict, temperature: float, seed: int, max_tokens: int):
    from deepinfer import SamplingParams

    kw: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "seed": seed}
    if mode == "free":
        return SamplingParams(**kw)
    if mode == "default":
        return SamplingParams(json_schema=schema, **kw)
    return SamplingParams(json_schema=schema, whitespace=mode, **kw)


def run_mode(
    llm: Any,
    docs: list[dict],
    mode: str,
    temperature: float,
    seed: int,
    max_tokens: int,
    schemas: dict[str, dict] | None = None,
) -> ModeRun:
    """Generate every document in one ``llm.chat`` call and score each output.

    Each result: id, domain, mode, text, n_tokens, finish_reason, finished, parsed (the
    object scored, or None), valid, correct, total, wrong (field names), answer_tokens (free
    mode: tokens up to the end of the first JSON object; None without one)."""
    if schemas is None:
        schemas = load_data()[1]
    if mode == "extract":
        return run_extract(llm, docs, temperature, seed, max_tokens, schemas)
    run = ModeRun()
    run.mode = mode
    try:
        params = [params_for(mode, schemas[d["domain"]], temperature, seed, max_tokens) for d in docs]
    except ValueError as e:
        run.error = str(e)
        return run
    if mode != "free":
        for dom in sorted({d["domain"] for d in docs}):  # compiled (and cached) before the clock
            llm.compile_constraint(params_for(mode, schemas[dom], temperature, seed, max_tokens))
    convs = [prompt_for(d, schemas[d["domain"]]) for d in docs]
    if docs:  # untimed: first-use work of this mode's path (kernels, matchers) stays off the clock
        llm.chat(
            convs[:1], params_for(mode, schemas[docs[0]["domain"]], temperature, seed, 2), use_tqdm=False
        )
    t = time.perf_counter()
    outs = llm.chat(convs, params, use_tqdm=False) if docs else []
    run.seconds = time.perf_counter() - t
    validators = {dom: _validator(s) for dom, s in schemas.items()}
    for d, o in zip(docs, outs):
        span = first_json_span(o.text) if mode == "free" else None
        if mode == "free":
            parsed = None if span is None else span[2]
        else:
            try:
                parsed = json.loads(o.text)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                parsed = None
        valid = parsed is not None and not any(True for _ in validators[d["domain"]].iter_errors(parsed))
        matches = field_matches(d["answer"], parsed)
        run.append(
            {
                "id": d["id"],
                "domain": d["domain"],
                "mode": mode,
                "seed": seed,
                "text": o.text,
                "n_tokens": len(o.token_ids),
                "finish_reason": o.finish_reason,
                "finished": o.finish_reason == "stop",
                "parsed": parsed,
                "valid": valid,
                "correct": sum(ok for _, ok in matches),
                "total": len(matches),
                "wrong": [field_name(p) for p, ok in matches if not ok],
                "answer_tokens": _tokens_to(llm, o, span[1]) if span else None,
            }
        )
    return run


def run_extract(
    llm: Any, docs: list[dict], temperature: float, seed: int, max_tokens: int, schemas: dict[str, dict]
) -> ModeRun:
    """``examples/extract.py`` on each domain's documents (its main(), this LLM), scored like
    the other modes; the time is the whole run's (prompts, batching and file writes included)."""
    import tempfile

    extract = extract_module()
    run = ModeRun()
    run.mode = "extract"
    validators = {dom: _validator(s) for dom, s in schemas.items()}
    by_id = {d["id"]: d for d in docs}
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        for dom in sorted({d["domain"] for d in docs}):
            paths = {k: os.path.join(tmp, f"{dom}.{k}") for k in ("schema.json", "in.jsonl", "out.jsonl")}
            with open(paths["schema.json"], "w", encoding="utf-8") as f:
                json.dump(schemas[dom], f)
            with open(paths["in.jsonl"], "w", encoding="utf-8") as f:
                for d in docs:
                    if d["domain"] == dom:
                        f.write(json.dumps({"id": d["id"], "text": d["text"]}) + "\n")
            argv = ["--schema", paths["schema.json"], "--input", paths["in.jsonl"]]
            argv += ["--output", paths["out.jsonl"]]
            argv += ["--max-tokens", str(max_tokens), "--temperature", str(temperature), "--seed", str(seed)]
            status = extract.main([*argv, "--batch-size", str(len(docs)), "--no-progress"], llm=llm)
            if status != 0:
                run.error = f"examples/extract.py exited {status} on {dom}"
                return run
            with open(paths["out.jsonl"], encoding="utf-8") as f:
                rows = [json.loads(line) for line in f if line.strip()]
            for row in rows:
                d = by_id[row["id"]]
                parsed = row["data"] if isinstance(row.get("data"), dict) else None
                valid = parsed is not None and not any(True for _ in validators[dom].iter_errors(parsed))
                matches = field_matches(d["answer"], parsed)
                run.append(
                    {
                        "id": d["id"], "domain": dom, "mode": "extract", "seed": seed,
                        "text": row.get("text") or json.dumps(parsed), "n_tokens": 0,
                        "finish_reason": row["finish_reason"], "finished": row["finish_reason"] == "stop",
                        "parsed": parsed, "valid": valid, "correct": sum(ok for _, ok in matches),
                        "total": len(matches), "wrong": [field_name(p) for p, ok in matches if not ok],
                        "answer_tokens": None,
                    }
                )  # fmt: skip
        run.seconds = time.perf_counter() - t
    return run


def choice_questions(docs: list[dict], schemas: dict[str, dict]) -> list[tuple[dict, str, list[str], str]]:
    """(document, field, options, question): every enum field of a document, and the person
    documents' city and occupation with the options every person document gives."""
    out = []
    people = [d for d in docs if d["domain"] == "person"]
    for d in docs:
        for f, spec in schemas[d["domain"]].get("properties", {}).items():
            if "enum" in spec and f in d["answer"]:
                out.append((d, f, [str(x) for x in spec["enum"]], f"Which {f} is it?"))
    for f in ("city", "occupation"):
        opts = sorted({str(p["answer"][f]) for p in people if f in p["answer"]})
        out += [(d, f, opts, f"What is the person's {f}?") for d in people if f in d["answer"]]
    return [(d, f, o, f"Text: {d['text']}\n\n{q} Answer with one of: {', '.join(o)}.") for d, f, o, q in out]


def run_choice(llm: Any, docs: list[dict], schemas: dict[str, dict]) -> int:
    """Does `choice` lose answers by forbidding the quotes a model may put around its answer?"""
    from deepinfer import SamplingParams

    qs = choice_questions(docs, schemas)
    convs = [[{"role": "user", "content": q}] for _, _, _, q in qs]
    modes = {
        "free": lambda o: SamplingParams(temperature=0, max_tokens=12),
        "choice": lambda o: SamplingParams(temperature=0, max_tokens=12, choice=o),
        "choice, quotes allowed": lambda o: SamplingParams(
            temperature=0, max_tokens=12, choice=o + [f'"{x}"' for x in o]
        ),
    }
    rows = []
    for name, make in modes.items():
        outs = llm.chat(convs, [make(o) for _, _, o, _ in qs], use_tqdm=False)
        right = quoted = 0
        for (d, f, o, _), out in zip(qs, outs):
            text = out.text.strip()
            quoted += text.startswith('"')
            answer = text.strip("\"'. ").lower()
            if name == "free":  # the one option the free answer names, if exactly one
                named = [x for x in o if re.search(r"\b" + re.escape(x.lower()) + r"\b", text.lower())]
                answer = named[0].lower() if len(named) == 1 else answer
            right += answer == str(d["answer"][f]).lower()
        rows.append([name, _pct(right, len(qs)), str(quoted)])
    print(f"\n### choice: {len(qs)} one-word questions, greedy\n")
    _table(["mode", "right", "answers in quotes"], rows)
    return 0


def _tokens_to(llm: Any, out: Any, end: int) -> int:
    """How many of the output's tokens it takes to write its text up to ``end``."""
    ids = list(out.token_ids)
    lo, hi = 1, len(ids)
    if hi == 0 or len(llm.tokenizer.decode(ids)) < end:
        return len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(llm.tokenizer.decode(ids[:mid])) >= end:
            hi = mid
        else:
            lo = mid + 1
    return lo


# -- reporting ---------------------------------------------------------------------------------
def _pct(k: int, n: int) -> str:
    return f"{k / n:.1%} ({k}/{n})" if n else "-"


def summary(run: ModeRun) -> dict:
    return {
        "correct": sum(r["correct"] for r in run),
        "total": sum(r["total"] for r in run),
        "valid": sum(r["valid"] for r in run),
        "finished": sum(r["finished"] for r in run),
        "n": len(run),
        "tps": run.tokens / run.seconds if run.seconds else 0.0,
    }


def _brief(run: ModeRun) -> str:
    s = summary(run)
    return (
        f"{s['correct']}/{s['total']} fields, {s['valid']}/{s['n']} valid, {s['finished']}/{s['n']} "
        f"finished, {run.tokens} tokens in {run.seconds:.1f} s"
    )


def report(runs: dict[str, list[ModeRun]], modes: list[str], args: argparse.Namespace) -> None:
    """Mean table (pooled counts over seeds; tok/s averaged), then per seed, domain, field."""
    rows = []
    for m in modes:
        rs = runs[m]
        if rs and rs[0].error:
            rows.append([m, f"refused: {rs[0].error}", "-", "-", "-"])
            continue
        s = [summary(r) for r in rs]
        tot = {k: sum(x[k] for x in s) for k in ("correct", "total", "valid", "finished", "n")}
        tps = sum(x["tps"] for x in s) / len(s)
        rows.append(
            [
                m,
                _pct(tot["correct"], tot["total"]),
                _pct(tot["valid"], tot["n"]),
                _pct(tot["finished"], tot["n"]),
                f"{tps:.1f}" if tps else "-",  # (extract: not counted)
            ]
        )
    _table(["mode", "field accuracy", "valid", "finished", "tok/s"], rows)
    ok_modes = [m for m in modes if runs[m] and not runs[m][0].error]
    if len(next(iter(runs.values()), [])) > 1:
        print("\nper seed:\n")
        rows = []
        for m in ok_modes:
            for r in runs[m]:
                s = summary(r)
                rows.append(
                    [
                        m,
                        r[0]["seed"] if r else "-",
                        _pct(s["correct"], s["total"]),
                        _pct(s["valid"], s["n"]),
                        _pct(s["finished"], s["n"]),
                        f"{s['tps']:.1f}" if s["tps"] else "-",
                    ]
                )
        _table(["mode", "seed", "field accuracy", "valid", "finished", "tok/s"], rows)
    if args.by_domain:
        doms = list(dict.fromkeys(r["domain"] for m in ok_modes for run in runs[m] for r in run))
        rows = []
        for m in ok_modes:
            cells = []
            for dom in doms:
                rr = [r for run in runs[m] for r in run if r["domain"] == dom]
                c, t = sum(r["correct"] for r in rr), sum(r["total"] for r in rr)
                v = sum(r["valid"] for r in rr)
                cells.append(f"{c / t:.0%} ({v}/{len(rr)} valid)" if t else "-")
            rows.append([m, *cells])
        print("\nfield accuracy by domain:\n")
        _table(["mode", *doms], rows)
    if args.by_field:
        counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        for m in ok_modes:
            for run in runs[m]:
                for r in run:
                    names = [f"{r['domain']}.{field_name(p)}" for p, _ in leaves(args.answers[r["id"]])]
                    wrong = [f"{r['domain']}.{w}" for w in r["wrong"]]
                    for n in names:
                        counts[n][m][1] += 1
                    for w in wrong:
                        counts[w][m][0] += 1
        rows = []
        for n, per in counts.items():
            rows.append([n, *(f"{1 - per[m][0] / per[m][1]:.0%}" if per[m][1] else "-" for m in ok_modes)])
        print("\nfield accuracy by field:\n")
        _table(["field", *ok_modes], rows)
    if args.show_errors:
        print()
        for m in ok_modes:
            shown = 0
            for run in runs[m]:
                for r in run:
                    if shown >= args.show_errors or not (r["wrong"] or not r["valid"]):
                        continue
                    shown += 1
                    text = r["text"] if len(r["text"]) < 300 else r["text"][:300] + "..."
                    print(f"[{m} seed {r['seed']}] {r['id']} wrong={r['wrong']} finish={r['finish_reason']}")
                    print(f"    {text!r}")


# -- the data check ----------------------------------------------------------------------------
def check_data(data_dir: str = DATA_DIR) -> int:
    """Every answer valid under its domain's schema, every schema valid and compiled by the
    engine, ids unique, every string and number of an answer stated in its text."""
    import jsonschema

    docs, schemas = load_data(data_dir)
    problems = []
    for dom, s in schemas.items():
        try:
            jsonschema.validators.validator_for(s).check_schema(s)
        except jsonschema.SchemaError as e:
            problems.append(f"schema {dom}: {e.message}")
        try:
            from deepinfer.constraints.json_schema import schema_to_grammar

            schema_to_grammar(s)
        except ImportError:
            pass
        except Exception as e:
            problems.append(f"schema {dom}: the engine cannot compile it: {type(e).__name__}: {e}")
    validators = {dom: _validator(s) for dom, s in schemas.items()}
    seen = set()
    per_domain: dict[str, int] = defaultdict(int)
    n_fields = 0
    for d in docs:
        if set(d) != {"id", "domain", "text", "answer"}:
            problems.append(f"{d.get('id')}: keys {sorted(d)}")
            continue
        if d["id"] in seen:
            problems.append(f"{d['id']}: repeated id")
        seen.add(d["id"])
        if d["domain"] not in schemas:
            problems.append(f"{d['id']}: no schema for domain {d['domain']!r}")
            continue
        per_domain[d["domain"]] += 1
        for e in validators[d["domain"]].iter_errors(d["answer"]):
            where = "/".join(str(p) for p in e.absolute_path)
            problems.append(f"{d['id']}: answer at /{where}: {e.message}")
        numbers = {float(x) for x in re.findall(r"\d+(?:\.\d+)?", d["text"])}
        low = d["text"].casefold()
        for path, v in leaves(d["answer"]):
            n_fields += 1
            if isinstance(v, bool):
                stated = ("out of stock" in low or "not in stock" in low) != v and ("stock" in low)
            elif isinstance(v, int | float):
                stated = float(v) in numbers
            else:
                stated = v.casefold() in low
            if not stated:
                problems.append(f"{d['id']}: {field_name(path)} = {v!r} is not stated in the text")
        n_sent = len(re.findall(r"[.!?](?:\s|$)", d["text"]))
        if not 1 <= n_sent <= 3:
            problems.append(f"{d['id']}: {n_sent} sentences (want 1-3)")
    print(
        f"{len(docs)} documents, {n_fields} fields: " + ", ".join(f"{k} {v}" for k, v in per_domain.items())
    )
    print(f"{len(schemas)} schemas: {', '.join(schemas)}")
    for p in problems:
        print("  PROBLEM", p)
    print("data OK" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


# -- main --------------------------------------------------------------------------------------
def machine(llm: Any) -> str:
    import torch

    dev = llm.device
    if dev.type == "cuda":
        what = torch.cuda.get_device_name(dev)
    else:
        what = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as fh:
                what = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), what)
        except OSError:
            pass
        what += f", {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    return f"{dev.type} ({what}), torch {torch.__version__}, dtype {str(llm.dtype).replace('torch.', '')}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-data", action="store_true", help="check the data set and exit (no model)")
    ap.add_argument("--modes", default="free,compact,flexible")
    ap.add_argument("--temperature", default="0", help="one value or a comma list: a table each")
    ap.add_argument("--seeds", default="0", help="seeds for temperatures > 0 (greedy runs seed 0 once)")
    ap.add_argument("--max-tokens", type=int, default=None, help="default: 1.5x the longest free answer")
    ap.add_argument(
        "--calibrate-tokens", type=int, default=384, help="max_tokens of the free calibration run"
    )
    ap.add_argument("--limit", type=int, default=None, help="N documents, round-robin over the domains")
    ap.add_argument("--domains", default=None, help="comma list, e.g. person,invoice")
    ap.add_argument("--model", default=None, help="GGUF file, HF folder or repo id (default: embedded)")
    ap.add_argument("--device", default=None)
    ap.add_argument(
        "--deterministic",
        action="store_true",
        help="LLM(deterministic=True): batch-invariant, so greedy outputs repeat run to run",
    )
    ap.add_argument("--by-domain", action="store_true", help="field accuracy per domain")
    ap.add_argument("--by-field", action="store_true", help="field accuracy per field")
    ap.add_argument("--show-errors", type=int, default=0, metavar="N", help="print N wrong outputs per mode")
    ap.add_argument("--dump", default=None, metavar="FILE", help="write every per-document result (JSONL)")
    ap.add_argument("--no-dspark", action="store_true", help="LLM(dspark=False): no speculative decoding")
    ap.add_argument("--quantization", default="auto",
                    help="LLM(quantization=...): auto (default), none (dequantized), gguf, int8")  # fmt: skip
    ap.add_argument(
        "--repeat", type=int, default=1, help="run the modes N times, interleaved (tok/s is their mean)"
    )
    ap.add_argument(
        "--choice",
        action="store_true",
        help="instead: one-word questions (enum fields, person cities and occupations) as free text, "
        "choice=, and choice= with each option also in quotes",
    )
    args = ap.parse_args()
    if args.check_data:
        return check_data()

    docs, schemas = load_data()
    if args.domains:
        want = args.domains.split(",")
        unknown = [d for d in want if d not in schemas]
        if unknown:
            ap.error(f"--domains: unknown {unknown}; known: {list(schemas)}")
        docs = [d for d in docs if d["domain"] in want]
    if args.limit is not None:
        docs = _spread(docs, args.limit)
    args.answers = {d["id"]: d["answer"] for d in docs}
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    temps = [float(t) for t in args.temperature.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]

    from deepinfer import LLM
    from deepinfer.loader import default_gguf_path

    llm = LLM(
        args.model,
        seed=0,
        deterministic=args.deterministic,
        quantization=None if args.quantization == "none" else args.quantization,
        **({"dspark": False} if args.no_dspark else {}),
        **({"device": args.device} if args.device else {}),
    )
    model = args.model or f"embedded SmolLM2-135M-Instruct ({os.path.basename(default_gguf_path())})"
    print(f"machine: {machine(llm)}")
    print(
        f"model: {model}, loaded in {llm.load_seconds:.1f} s, DSpark default {llm.dspark.config.default}, "
        f"deterministic {llm.deterministic}, quantization {llm.quantization}, {llm.dtype}"
    )
    counts = defaultdict(int)
    for d in docs:
        counts[d["domain"]] += 1
    print(f"documents: {len(docs)} ({', '.join(f'{k} {v}' for k, v in counts.items())}); modes: {modes}")

    if args.choice:
        return run_choice(llm, docs, schemas)
    dump = open(args.dump, "w", encoding="utf-8") if args.dump else None
    for temp in temps:
        run_seeds = seeds if temp > 0 else [0]
        runs: dict[str, list[ModeRun]] = {m: [] for m in modes}
        free: list[ModeRun] = []
        max_tokens = args.max_tokens
        if max_tokens is None:
            cal = args.calibrate_tokens
            free = [run_mode(llm, docs, "free", temp, s, cal, schemas) for s in run_seeds]
            lengths = [r["answer_tokens"] for run in free for r in run if r["answer_tokens"] is not None]
            longest = max(lengths, default=cal)
            max_tokens = math.ceil(1.5 * longest)
            cut = sum(not r["finished"] for run in free for r in run)
            print(
                f"\ncalibration: free mode at max_tokens {cal}: longest free answer {longest} tokens; "
                f"{cut} output(s) cut at {cal}, {sum(len(x) for x in free) - len(lengths)} without a JSON "
                f"object (not counted) -> max_tokens {max_tokens}"
            )
            for run in free:
                print(f"  calibration run, free seed {run[0]['seed'] if run else '-'}: {_brief(run)}")
            # an identical rerun is skipped: every free output already ended within max_tokens
            if any(not r["finished"] or r["n_tokens"] > max_tokens for run in free for r in run):
                free = []
        for rep in range(args.repeat):  # repeats interleave the modes (tok/s on a shared machine)
            for m in modes:
                if m == "free" and free and rep == 0:
                    runs[m] = list(free)
                    continue
                for s in run_seeds:
                    if runs[m] and runs[m][0].error:
                        break
                    run = run_mode(llm, docs, m, temp, s, max_tokens, schemas)
                    runs[m].append(run)
                    print(f"  ran {m} seed {s}{f' (repeat {rep})' if rep else ''}: {_brief(run)}", flush=True)
        if dump:
            for m in modes:
                for run in runs[m]:
                    for r in run:
                        dump.write(json.dumps({"temperature": temp, **r}, ensure_ascii=False) + "\n")
        label = "greedy" if temp == 0 else f"seeds {','.join(map(str, run_seeds))}, mean"
        print(f"\n### temperature {temp:g} ({label}), max_tokens {max_tokens}, {len(docs)} documents\n")
        report(runs, modes, args)
    if dump:
        dump.close()
    return 0


def _spread(docs: list[dict], n: int) -> list[dict]:
    """The first n documents taken round-robin over the domains (so --limit 10 covers all)."""
    by_dom: dict[str, list[dict]] = defaultdict(list)
    for d in docs:
        by_dom[d["domain"]].append(d)
    out: list[dict] = []
    i = 0
    while len(out) < min(n, len(docs)):
        for lst in by_dom.values():
            if i < len(lst) and len(out) < n:
                out.append(lst[i])
        i += 1
    return out


if __name__ == "__main__":
    sys.exit(main())
