"""Schema-validated batch extraction: one JSON object per input row, resumable.

    .venv/bin/python examples/extract.py --schema examples/sample_data/schema.json \
        --input examples/sample_data/docs.jsonl --output out.jsonl
    .venv/bin/python examples/extract.py --schema examples/sample_data/person.py:Person ...

--schema is a JSON Schema file, or ``module:Model`` / ``path/to/file.py:Model`` naming a
pydantic model. Each input line is a JSON object with the text in --text-field (and an
optional id in --id-field; else the line number is the id). Each row becomes a chat prompt
asking for the schema's fields, generated with ``json_schema=``; every output is validated
again here with jsonschema. One output line per input row:

    {"id": ..., "ok": true|false, "data": {...}|null, "error": str|null, "finish_reason": ...}

Failed rows (output cut by --max-tokens, invalid, a malformed input line, a missing text
field) are written with their error, never dropped. Rows are appended and fsync'ed after
every batch, so an interrupted run loses no finished row; re-running skips the ids already
in --output (a truncated last line left by a crash is dropped and its row redone).
Exit status: 0 when every row was processed (even if some failed), 2 on bad arguments, a
bad schema or a corrupt output file, 3 when --stop-after ended the run early.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

DEFAULT_TEMPLATE = (
    "Extract the information from the text below as one JSON object that follows this JSON "
    "Schema:\n{schema}\n\nText:\n{text}"
)
SYSTEM = "You are an information extraction system. You reply with JSON only."


class UsageError(Exception):
    """A problem with the arguments, the schema or the output file: reported, exit 2."""


# -- the schema ------------------------------------------------------------------------------
@dataclass
class Schema:
    spec: Any  # what SamplingParams(json_schema=...) gets: a dict, or the pydantic model class
    as_dict: dict | bool  # for jsonschema and the prompt
    source: str


def load_schema(spec: str) -> Schema:
    """A JSON Schema file, or ``module:Model`` / ``file.py:Model`` naming a pydantic model."""
    if os.path.isfile(spec) or ":" not in spec or spec.lower().endswith(".json"):
        return _schema_file(spec)
    module_name, _, attr = spec.rpartition(":")
    if module_name.endswith(".py"):
        if not os.path.isfile(module_name):
            raise UsageError(f"--schema {spec}: no such file {module_name!r}")
        mod_spec = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module  # pydantic resolves annotations through it
        try:
            mod_spec.loader.exec_module(module)
        except Exception as e:
            raise UsageError(
                f"--schema {spec}: importing {module_name} failed: {type(e).__name__}: {e}"
            ) from e
    else:
        sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except Exception as e:
            raise UsageError(
                f"--schema {spec}: cannot import {module_name!r}: {type(e).__name__}: {e}"
            ) from e
    model = getattr(module, attr, None)
    if model is None:
        raise UsageError(f"--schema {spec}: module {module_name!r} has no attribute {attr!r}")
    if not (isinstance(model, type) and hasattr(model, "model_json_schema")):
        raise UsageError(f"--schema {spec}: {attr!r} is not a pydantic model class")
    from deepinfer.constraints import ConstraintError, load_schema  # (the one schema loader)

    try:
        return _checked(Schema(model, load_schema(model), spec))
    except ConstraintError as e:
        raise UsageError(f"--schema {spec}: {e}") from e


def _schema_file(path: str) -> Schema:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as e:
        raise UsageError(f"schema file {path}: cannot read it: {e.strerror or e}") from e
    from deepinfer.constraints import ConstraintError, load_schema  # (the one schema loader)

    try:
        schema = load_schema(text)
    except ConstraintError as e:
        bad = e.__cause__
        if isinstance(bad, json.JSONDecodeError):
            raise UsageError(
                f"schema file {path}: not valid JSON: {bad.msg} at line {bad.lineno}, column {bad.colno}"
            ) from e
        raise UsageError(f"schema file {path}: {e}") from e
    return _checked(Schema(schema, schema, path))


def _checked(schema: Schema) -> Schema:
    """Refuse a schema that is not a valid JSON Schema (meta-schema check)."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema.as_dict).check_schema(schema.as_dict)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        raise UsageError(
            f"schema file {schema.source}: not a valid JSON Schema at /{where}: {e.message}"
        ) from e
    return schema


# -- input and output files ------------------------------------------------------------------
@dataclass
class Row:
    line: int  # 1-based line number in the input
    id: Any
    text: str | None  # None: a bad input row, see error
    error: str | None = None


def read_rows(path: str, text_field: str, id_field: str) -> Iterator[Row]:
    """Every non-blank input line as a Row; malformed ones carry an error naming the line."""
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                yield Row(
                    line_no,
                    line_no,
                    None,
                    f"input line {line_no}: not valid JSON: {e.msg} (column {e.colno})",
                )
                continue
            if not isinstance(obj, dict):
                yield Row(
                    line_no,
                    line_no,
                    None,
                    f"input line {line_no}: expected a JSON object, got {type(obj).__name__}",
                )
                continue
            row_id = obj.get(id_field, line_no)
            if isinstance(row_id, dict | list) or row_id is None:
                yield Row(
                    line_no,
                    line_no,
                    None,
                    f"input line {line_no}: field {id_field!r} must be a string or a number",
                )
                continue
            text = obj.get(text_field)
            if not isinstance(text, str):
                why = (
                    f"no {text_field!r} field"
                    if text_field not in obj
                    else f"the {text_field!r} field is {json.dumps(text)[:40]}, not a string"
                )
                yield Row(line_no, row_id, None, f"input line {line_no}: {why}")
                continue
            yield Row(line_no, row_id, text)


def _key(row_id: Any) -> str:
    return json.dumps(row_id)  # 1 and "1" are different ids


def done_ids(path: str) -> set[str]:
    """Ids already in the output file. A truncated last line (a crash mid-write) is cut off
    the file; any other unreadable line is an error."""
    if not os.path.exists(path):
        return set()
    with open(path, "rb") as fh:
        data = fh.read()
    ids: set[str] = set()
    good_end = 0  # byte offset after the last complete row
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        last = i == len(lines) - 1
        if not raw.strip():
            if not last:
                good_end += len(raw) + 1
            continue
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict) or "id" not in rec:
                raise ValueError("not an output row")
        except ValueError as e:
            if last or all(not x.strip() for x in lines[i + 1 :]):
                print(
                    f"repairing {path}: dropping a truncated last line ({len(raw)} bytes); its row is redone",
                    file=sys.stderr,
                )
                break
            raise UsageError(
                f"output file {path}: line {i + 1} is not an output row ({e}); fix or move it"
            ) from e
        ids.add(_key(rec["id"]))
        good_end += len(raw) + (0 if last else 1)
        if last:  # a complete row without its newline: keep it, end the line
            with open(path, "ab") as fh:
                fh.write(b"\n")
            good_end += 1
    if good_end < len(data):
        os.truncate(path, good_end)
    return ids


# -- extraction ------------------------------------------------------------------------------
def build_prompt(template: str, schema: Schema, text: str) -> list[dict]:
    user = template.replace("{schema}", json.dumps(schema.as_dict)).replace("{text}", text)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def result_row(out: Any, schema: Schema) -> dict:
    """The output row of one generation, re-validated with jsonschema (the final word)."""
    import jsonschema

    rec: dict[str, Any] = {"ok": False, "data": None, "error": out.error, "finish_reason": out.finish_reason}
    if out.finish_reason != "error":
        try:
            data = json.loads(out.text)
        except json.JSONDecodeError as e:
            rec["error"] = rec["error"] or f"output is not JSON: {e}"
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


def main(argv: list[str] | None = None, llm: Any = None) -> int:
    """Run the extraction; ``llm`` lets a caller pass an already loaded LLM."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schema", required=True, help="schema.json, module:Model or file.py:Model")
    ap.add_argument("--input", required=True, help="JSONL, one object per line")
    ap.add_argument("--output", required=True, help="JSONL, appended to (resumable)")
    ap.add_argument("--model", default=None, help="GGUF file, HF folder or repo id (default: embedded)")
    ap.add_argument("--text-field", default="text")
    ap.add_argument("--id-field", default="id")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--prompt-template",
        default=DEFAULT_TEMPLATE,
        help="user message with {text} (and optionally {schema}) in it",
    )
    ap.add_argument("--strict", action="store_true", help="forbid properties the schema does not declare")
    ap.add_argument("--limit", type=int, default=None, help="process at most this many new rows, then exit 0")
    ap.add_argument(
        "--stop-after",
        type=int,
        default=None,
        metavar="N",
        help="end the run after N batches with exit status 3 (to try resuming)",
    )
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    try:
        return _run(args, llm)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, llm: Any) -> int:
    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    if "{text}" not in args.prompt_template:
        raise UsageError("--prompt-template must contain {text}")
    if not os.path.isfile(args.input):
        raise UsageError(f"--input {args.input}: no such file")
    schema = load_schema(args.schema)  # before the model loads: a bad schema costs nothing
    first_line: dict[str, int] = {}  # ids must be unique, or resuming could skip the wrong row
    for row in read_rows(args.input, args.text_field, args.id_field):
        if _key(row.id) in first_line:
            raise UsageError(
                f"--input {args.input}: line {row.line} repeats id {row.id!r} of line "
                f"{first_line[_key(row.id)]}; ids must be unique (--id-field names them)"
            )
        first_line[_key(row.id)] = row.line
    done = done_ids(args.output)

    from deepinfer import LLM, SamplingParams

    params = SamplingParams(
        json_schema=schema.spec,
        strict=args.strict,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
    )
    if llm is None:
        llm = LLM(args.model, seed=args.seed)
    try:  # the compiler's verdict (unsupported keyword, ...) before any generation
        llm.compile_constraint(params)
    except ValueError as e:
        raise UsageError(f"schema {schema.source}: the engine cannot enforce it: {e}") from e

    from tqdm.auto import tqdm

    def generate(rows: list[Row]) -> list[Any]:
        """One RequestOutput per row, or an error message where the engine refused the
        request (e.g. a text longer than the model's context)."""
        if not rows:
            return []
        convs = [build_prompt(args.prompt_template, schema, r.text) for r in rows]
        try:
            return llm.chat(convs, params, use_tqdm=False)
        except ValueError:
            pass
        outs: list[Any] = []
        for r, conv in zip(rows, convs):  # find which row it was; the others still run
            try:
                outs.append(llm.chat(conv, params, use_tqdm=False)[0])
            except ValueError as e:
                outs.append(f"input line {r.line}: {e}")
        return outs

    bar = tqdm(total=len(first_line), desc="extract", unit="row", disable=args.no_progress)
    todo: list[Row] = []
    new = batches = 0
    with open(args.output, "a", encoding="utf-8") as out_fh:

        def flush(rows: list[Row]) -> None:
            outs = generate([r for r in rows if r.text is not None])
            for r in rows:
                if r.text is None:  # a bad input row
                    rec = {"ok": False, "data": None, "error": r.error, "finish_reason": None}
                else:
                    out = outs.pop(0)
                    rec = (
                        result_row(out, schema)
                        if not isinstance(out, str)
                        else {"ok": False, "data": None, "error": out, "finish_reason": "error"}
                    )
                out_fh.write(json.dumps({"id": r.id, **rec}, ensure_ascii=False) + "\n")
            out_fh.flush()
            os.fsync(out_fh.fileno())  # a finished batch survives a crash from here on
            bar.update(len(rows))

        for row in read_rows(args.input, args.text_field, args.id_field):
            if _key(row.id) in done:
                bar.update(1)
                continue
            if args.limit is not None and new >= args.limit:
                break
            todo.append(row)
            new += 1
            if sum(r.text is not None for r in todo) >= args.batch_size:
                flush(todo)
                todo, batches = [], batches + 1
                if args.stop_after is not None and batches >= args.stop_after:
                    bar.close()
                    print(
                        f"stopped after {batches} batch(es) (--stop-after); re-run to resume", file=sys.stderr
                    )
                    return 3
        if todo:
            flush(todo)
    bar.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
