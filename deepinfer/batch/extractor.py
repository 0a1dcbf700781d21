"""One engine's share of a batch run: rows -> prompts -> generations -> validated output rows.

An Extractor holds one LLM (loaded once) and the run's SamplingParams, whose constraint it
compiles once, when it is made. The single-process path makes one; on Ray each actor makes
its own. Every output's data is validated again here with jsonschema (the final word).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from .output import error_record
from .rows import Row, where
from .schema import Schema, UsageError

# The user message; {fields} is the schema's fields in words (describe_fields), {schema} its
# JSON, {text} the row's text. This prompt, with no system message, is the one
# benchmarks/bench_quality.py measures.
DEFAULT_TEMPLATE = "Extract the following fields from the text as JSON: {fields}.\n\nText: {text}"


@dataclass(frozen=True)
class EngineConfig:
    """What an Extractor is made of; plain values (a Ray actor gets a copy)."""

    schema: Schema
    model: str | None = None  # GGUF file, HF folder or repo id; None: the embedded model
    max_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    strict: bool = False
    template: str = DEFAULT_TEMPLATE
    system: str | None = None
    device: str = "auto"
    threads: int | None = None  # CPU threads for torch (DEEPINFER_NUM_THREADS); None: the default
    deterministic: bool = False  # LLM(deterministic=True): outputs independent of batch and threads

    def params(self) -> Any:
        from deepinfer import SamplingParams

        try:
            return SamplingParams(
                json_schema=self.schema.spec,
                strict=self.strict,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                seed=self.seed,
            )
        except ValueError as e:  # e.g. --max-tokens 0: refused before the model loads
            raise UsageError(str(e)) from e


class Extractor:
    """One LLM and the run's compiled constraint; ``records(rows)`` does a batch of rows."""

    def __init__(self, config: EngineConfig, llm: Any = None):
        self.config = config
        self.params = config.params()
        if llm is None:
            if config.threads is not None:
                os.environ["DEEPINFER_NUM_THREADS"] = str(config.threads)
            from deepinfer import LLM

            c = config
            llm = LLM(c.model, device=c.device, seed=c.seed, deterministic=c.deterministic)
        self.llm = llm
        try:  # the compiler's verdict (unsupported keyword, ...) before any generation
            llm.compile_constraint(self.params)
        except ValueError as e:
            raise UsageError(f"schema {config.schema.source}: the engine cannot enforce it: {e}") from e

    def generate(self, rows: list[Row]) -> list[Any]:
        """One RequestOutput per row, or an error message where the engine refused the
        request (e.g. a text longer than the model's context)."""
        if not rows:
            return []
        c = self.config
        convs = [build_prompt(c.template, c.schema, r.text, c.system) for r in rows]
        try:
            return self.llm.chat(convs, self.params, use_tqdm=False)
        except ValueError:
            pass
        outs: list[Any] = []
        for r, conv in zip(rows, convs):  # find which row it was; the others still run
            try:
                outs.append(self.llm.chat(conv, self.params, use_tqdm=False)[0])
            except ValueError as e:
                outs.append(f"{where(r.line, r.file)}: {e}")
        return outs

    def records(self, rows: list[Row]) -> list[dict]:
        """The output row of each row, in order: rows with an error are written as they are."""
        outs = self.generate([r for r in rows if r.text is not None])
        recs = []
        for r in rows:
            if r.text is None:  # a row that is not processed
                rec = error_record(r, r.error)
            elif isinstance(out := outs.pop(0), str):  # the engine refused it
                rec = error_record(r, out, "error")
            else:
                rec = {"id": r.id, "line": r.line, **({"file": r.file} if r.file else {})}
                rec.update(result_row(out, self.config.schema))
                if rec["finish_reason"] == "error" and rec["error"]:  # name the row, as above
                    rec["error"] = f"{where(r.line, r.file)}: {rec['error']}"
            recs.append(rec)
        return recs


def build_prompt(template: str, schema: Schema, text: str, system: str | None = None) -> list[dict]:
    user = template
    if "{fields}" in user:
        user = user.replace(
            "{fields}", describe_fields(schema.as_dict if isinstance(schema.as_dict, dict) else {})
        )
    user = user.replace("{schema}", json.dumps(schema.as_dict)).replace("{text}", text)
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def describe_fields(schema: dict) -> str:
    """The schema's fields in words: 'name (string), age (integer), ...', nested ones spelled out."""
    return ", ".join(f"{name} ({_describe(sub)})" for name, sub in schema.get("properties", {}).items())


def _describe(s: Any) -> str:
    if not isinstance(s, dict):
        return "any value"
    if "enum" in s:
        return "one of " + ", ".join(str(v) for v in s["enum"])
    t = s.get("type")
    if t == "object":
        return "an object with " + describe_fields(s)
    if t == "array":
        inner = s.get("items", {})
        if isinstance(inner, dict) and inner.get("type") == "object":
            return "a list of objects with " + describe_fields(inner)
        return "a list of " + _describe(inner)
    if t == "string" and (s.get("format") == "date" or "[0-9]{4}-" in str(s.get("pattern", ""))):
        return "date as YYYY-MM-DD"
    if t == "boolean":
        return "true or false"
    return str(t) if t else "any value"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def result_row(out: Any, schema: Schema) -> dict:
    """The output row of one generation, re-validated with jsonschema (the final word)."""
    import jsonschema

    rec: dict[str, Any] = {"ok": False, "data": None, "error": out.error, "finish_reason": out.finish_reason}
    if out.finish_reason != "error":
        try:  # strict JSON: NaN/Infinity would make the output line invalid JSON
            data = json.loads(out.text, parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:
            rec["error"] = rec["error"] or f"output is not JSON: {str(e)[:200]}"
        else:
            errors = list(
                jsonschema.validators.validator_for(schema.as_dict)(schema.as_dict).iter_errors(data)
            )
            if errors:
                where = "/".join(str(p) for p in errors[0].absolute_path)
                rec["error"] = f"jsonschema: at /{where}: {errors[0].message}"
            elif out.error is None and out.finish_reason == "stop":
                rec.update(ok=True, data=data)
    if not rec["ok"]:
        rec["text"] = out.text  # what the model wrote, to look at
    return rec
