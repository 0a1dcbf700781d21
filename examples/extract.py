"""Schema-validated batch extraction: one JSON object per input row, resumable.

    .venv/bin/python examples/extract.py --schema examples/sample_data/schema.json \\
        --input examples/sample_data/docs.jsonl --output out.jsonl
    .venv/bin/python examples/extract.py --schema examples/sample_data/person.py:Person ...

--schema is a JSON Schema file, or ``module:Model`` / ``path/to/file.py:Model`` naming a
pydantic model. Each input line is a JSON object with the text in --text-field (and an
optional id in --id-field; else the line number is the id). Each row becomes a chat prompt
asking for the schema's fields, generated with ``json_schema=``; every output is validated
again here with jsonschema. One output line per input row, in input order:

    {"id": ..., "line": N, "ok": true|false, "data": {...}|null, "error": str|null,
     "finish_reason": ...}

("line" is the row's input line number in the run that wrote it; failed rows also hold the
model's "text".) Every input row appears exactly once in the output: a row that cannot be
processed is written with an error naming its input line, never dropped, and the run goes
on. Blank lines are no rows. Rows that fail:

- output cut by --max-tokens, output invalid under the schema, a text longer than the model's
  context;
- a line that is not UTF-8 (the error gives the byte offset in the line), not JSON, not a
  JSON object, or longer than --max-line-bytes (default 1 MiB; never read into memory whole);
- a missing or non-string text field, or a text or id holding a lone surrogate (JSON such as
  "\\ud800": not Unicode text, so no prompt can be made of it);
- an id that is not a string or an integer (a float, bool, null, list or object): the id of
  that error row is the line number;
- a repeated id: the first row with an id is processed, a later one becomes an error row
  naming the first one's line (it keeps the repeated id). Rows whose id stands in for a bad
  line (a line number) claim no id.

Where a row has no usable id (a line that is not a JSON object with a valid id) its line
number is its id. Output is written as UTF-8 JSON; a row holding a lone surrogate is written
with ASCII escapes instead, which read back to the same string, so a re-run recognises it.

Rows are appended and fsync'ed after every batch, so an interrupted run loses no finished
row; re-running skips the rows already in --output (matched by id: the k-th input row with an
id is done when the output holds k rows with it; a truncated last line left by a crash is
dropped and its row redone). The output file is locked (flock) for the whole run: a second run
on the same file exits at once. --output is checked (its folder exists, it can be opened, no
other run holds it) before the model loads.

Exit status: 0 when every row was processed (even if some failed), 2 on bad arguments, a
bad schema, an output file that cannot be opened, is locked by another run or is corrupt,
3 when --stop-after ended the run early.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import json
import os
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

try:
    import fcntl
except ImportError:  # (not on Windows: runs there take no lock)
    fcntl = None

# The user message; {fields} is the schema's fields in words (describe_fields), {schema} its
# JSON, {text} the row's text. This prompt, with no system message, is the one
# benchmarks/bench_quality.py measures.
DEFAULT_TEMPLATE = "Extract the following fields from the text as JSON: {fields}.\n\nText: {text}"


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


# -- input: lines -> rows --------------------------------------------------------------------
DEFAULT_MAX_LINE_BYTES = 1 << 20
_BOM = b"\xef\xbb\xbf"


@dataclass
class Row:
    line: int  # 1-based line number in the input
    id: Any
    text: str | None  # None: a row that is not processed, see error
    error: str | None = None


def _brief(value: Any, limit: int = 40) -> str:
    """A value as (at most ``limit`` characters of) JSON, for an error message."""
    try:
        s = json.dumps(value)
    except (ValueError, TypeError, RecursionError):
        s = type(value).__name__
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _lone_surrogate(s: str) -> int | None:
    """Index of the first lone surrogate in ``s`` (JSON "\\ud800": not encodable), or None."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def iter_lines(fh: BinaryIO, max_line_bytes: int) -> Iterator[tuple[int, bytes | None, int]]:
    """(line number, line without its newline, its length in bytes) for each line of a binary
    file; the line is None where it is longer than ``max_line_bytes`` (its bytes are skipped
    in chunks, never held whole)."""
    line_no = 0
    while True:
        chunk = fh.readline(max_line_bytes + 1)
        if not chunk:
            return
        line_no += 1
        if chunk.endswith(b"\n"):
            yield line_no, chunk[:-1], len(chunk) - 1
        elif len(chunk) <= max_line_bytes:  # the last line, with no newline
            yield line_no, chunk, len(chunk)
        else:
            size = len(chunk)
            while chunk and not chunk.endswith(b"\n"):
                chunk = fh.readline(1 << 16)
                size += len(chunk)
            yield line_no, None, size - chunk.endswith(b"\n")


def parse_line(line_no: int, raw: bytes, text_field: str = "text", id_field: str = "id") -> Row:
    """One input line (bytes, no newline) as a Row; a line that cannot be processed gets an
    error naming it (and the line number as id where it has no usable id of its own)."""

    def bad(why: str, row_id: Any = line_no) -> Row:
        return Row(line_no, row_id, None, f"input line {line_no}: {why}")

    skip = len(_BOM) if line_no == 1 and raw.startswith(_BOM) else 0  # a UTF-8 byte order mark
    try:
        line = raw[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        return bad(f"not valid UTF-8 at byte offset {skip + e.start} ({e.reason})")
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        return bad(f"not valid JSON: {e.msg} (column {e.colno})")
    except RecursionError:
        return bad("not readable JSON: nested too deeply")
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        return bad(f"not readable JSON: {str(e)[:80]}")
    if not isinstance(obj, dict):
        return bad(f"expected a JSON object, got {type(obj).__name__}")
    row_id = obj.get(id_field, line_no)
    if not isinstance(row_id, str | int) or isinstance(row_id, bool):
        return bad(f"the {id_field!r} field is {_brief(row_id)}, not a string or an integer")
    if isinstance(row_id, str) and (i := _lone_surrogate(row_id)) is not None:
        return bad(
            f"the {id_field!r} field holds a lone surrogate ({row_id[i]!r} at character {i}): "
            "not Unicode text",
            row_id,
        )
    text = obj.get(text_field)
    if not isinstance(text, str):
        if text_field not in obj:
            return bad(f"no {text_field!r} field", row_id)
        return bad(f"the {text_field!r} field is {_brief(text)}, not a string", row_id)
    if (i := _lone_surrogate(text)) is not None:
        return bad(
            f"the {text_field!r} field holds a lone surrogate ({text[i]!r} at character {i}): "
            "not Unicode text",
            row_id,
        )
    return Row(line_no, row_id, text)


def read_rows(
    source: str | os.PathLike | BinaryIO,
    text_field: str = "text",
    id_field: str = "id",
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> Iterator[Row]:
    """Every non-blank line of a JSONL file (a path, or a file opened in binary) as a Row;
    one that cannot be processed carries an error naming its line. Never raises on content."""
    if isinstance(source, str | os.PathLike):
        with open(source, "rb") as fh:
            yield from read_rows(fh, text_field, id_field, max_line_bytes)
        return
    for line_no, raw, size in iter_lines(source, max_line_bytes):
        if raw is None:
            yield Row(
                line_no,
                line_no,
                None,
                f"input line {line_no}: {size} bytes, longer than --max-line-bytes {max_line_bytes}",
            )
        elif (raw[len(_BOM) :] if line_no == 1 and raw.startswith(_BOM) else raw).strip():  # not blank
            yield parse_line(line_no, raw, text_field, id_field)


def _key(row_id: Any) -> str:
    return json.dumps(row_id)  # 1 and "1" are different ids; a lone surrogate is escaped


def plan_rows(rows: Iterable[Row], done: Counter[str] | None = None) -> Iterator[tuple[Row, bool]]:
    """Each row with whether the output already holds it (``done``: output rows per id key,
    from ``done_ids``): the k-th row with an id is done when k output rows have it. A row whose
    id an earlier processed row already has becomes an error row naming that row's line (it
    keeps the id, so a re-run counts it); error rows claim no id."""
    done = done if done is not None else Counter()
    seen: Counter[str] = Counter()
    first: dict[str, int] = {}  # id key -> line of the row processed under it
    for row in rows:
        key = _key(row.id)
        seen[key] += 1
        if row.error is None:
            if key in first:
                row = Row(
                    row.line,
                    row.id,
                    None,
                    f"input line {row.line}: id {_brief(row.id, 60)} repeats the id of line {first[key]}; "
                    "ids must be unique (--id-field names them)",
                )
            else:
                first[key] = row.line
        yield row, seen[key] <= done[key]


# -- output ----------------------------------------------------------------------------------
def dumps_row(rec: dict) -> bytes:
    """One output line: UTF-8 JSON, or ASCII-escaped JSON where a string holds a lone
    surrogate (escaped, it reads back as the same string)."""
    try:
        return (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(rec) + "\n").encode("ascii")


def error_record(row: Row, error: str, finish_reason: str | None = None) -> dict:
    return {
        "id": row.id,
        "line": row.line,
        "ok": False,
        "data": None,
        "error": error,
        "finish_reason": finish_reason,
    }


def open_output(path: str) -> tuple[BinaryIO, bool]:
    """The output file opened for appending and locked (flock, non-blocking), and whether this
    call created it. Refuses (UsageError) a missing folder, a file that cannot be opened, and a
    file another run holds."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--output {path}: folder {folder} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"--output {path}: is a folder")
    if os.path.exists(path) and not os.path.isfile(path):  # e.g. /dev/stdout: nothing to resume from
        raise UsageError(f"--output {path}: not a regular file")
    while True:
        created = True
        try:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                created = False
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except OSError as e:
            raise UsageError(f"--output {path}: cannot open it for writing: {e.strerror or e}") from e
        fh = os.fdopen(fd, "ab")
        if fcntl is None:  # (no flock here: no lock)
            return fh, created
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            fh.close()
            if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise UsageError(
                    f"--output {path}: another run holds the lock on it (one run per output file)"
                ) from e
            raise UsageError(f"--output {path}: cannot lock it: {e.strerror or e}") from e
        try:  # still the file at that path (a run that gave up may have removed it meanwhile)?
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fh, created
        except FileNotFoundError:
            pass
        fh.close()


def done_ids(path: str) -> Counter[str]:
    """How many output rows each id (as ``_key``) has in the output file. A truncated last
    line (a crash mid-write) is cut off the file; any other unreadable line is an error."""
    ids: Counter[str] = Counter()
    if not os.path.exists(path):
        return ids
    with open(path, "rb") as fh:
        data = fh.read()
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
        except (ValueError, RecursionError) as e:
            if last or all(not x.strip() for x in lines[i + 1 :]):
                print(
                    f"repairing {path}: dropping a truncated last line ({len(raw)} bytes); its row is redone",
                    file=sys.stderr,
                )
                break
            raise UsageError(
                f"output file {path}: line {i + 1} is not an output row ({str(e)[:80]}); fix or move it"
            ) from e
        ids[_key(rec["id"])] += 1
        good_end += len(raw) + (0 if last else 1)
        if last:  # a complete row without its newline: keep it, end the line
            with open(path, "ab") as fh:
                fh.write(b"\n")
            good_end += 1
    if good_end < len(data):
        os.truncate(path, good_end)
    return ids


# -- extraction ------------------------------------------------------------------------------
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
        "--max-line-bytes",
        type=int,
        default=DEFAULT_MAX_LINE_BYTES,
        help="a longer input line is an error row (default: 1 MiB)",
    )
    ap.add_argument(
        "--prompt-template",
        default=DEFAULT_TEMPLATE,
        help="user message with {text} in it (optionally {fields}: the fields in words; {schema}: its JSON)",
    )
    ap.add_argument("--system", default=None, help="a system message before it (default: none)")
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
    if args.max_line_bytes < 1:
        raise UsageError(f"--max-line-bytes must be >= 1, got {args.max_line_bytes}")
    if "{text}" not in args.prompt_template:
        raise UsageError("--prompt-template must contain {text}")
    for name, low in (("limit", 0), ("stop_after", 1)):
        value = getattr(args, name)
        if value is not None and value < low:
            raise UsageError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")
    if not os.path.isfile(args.input):
        what = "not a regular file" if os.path.exists(args.input) else "no such file"
        raise UsageError(f"--input {args.input}: {what}")
    if os.path.exists(args.output) and os.path.samefile(args.input, args.output):
        raise UsageError(f"--output {args.output} is the --input file")
    schema = load_schema(args.schema)  # before the model loads: a bad schema costs nothing
    out_fh, created = open_output(args.output)  # likewise a bad output path, or a busy one
    try:
        return _extract(args, llm, schema, out_fh)
    except BaseException:
        try:  # leave no empty file behind where this run created it and wrote nothing
            if created and os.fstat(out_fh.fileno()).st_size == 0:
                os.unlink(args.output)
        except OSError:
            pass
        raise
    finally:
        out_fh.close()  # (and the lock with it)


def _extract(args: argparse.Namespace, llm: Any, schema: Schema, out_fh: BinaryIO) -> int:
    def rows() -> Iterator[Row]:
        try:
            fh = open(args.input, "rb")
        except OSError as e:
            raise UsageError(f"--input {args.input}: cannot read it: {e.strerror or e}") from e
        with fh:
            yield from read_rows(fh, args.text_field, args.id_field, args.max_line_bytes)

    total = sum(1 for _ in rows())
    done = done_ids(args.output)

    from deepinfer import LLM, SamplingParams

    try:
        params = SamplingParams(
            json_schema=schema.spec,
            strict=args.strict,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=args.seed,
        )
    except ValueError as e:  # e.g. --max-tokens 0: refused before the model loads
        raise UsageError(str(e)) from e
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
        convs = [build_prompt(args.prompt_template, schema, r.text, args.system) for r in rows]
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

    bar = tqdm(total=total, desc="extract", unit="row", disable=args.no_progress)

    def flush(rows: list[Row]) -> None:
        outs = generate([r for r in rows if r.text is not None])
        lines = []
        for r in rows:
            if r.text is None:  # a row that is not processed
                rec = error_record(r, r.error)
            elif isinstance(out := outs.pop(0), str):  # the engine refused it
                rec = error_record(r, out, "error")
            else:
                rec = {"id": r.id, "line": r.line, **result_row(out, schema)}
                if rec["finish_reason"] == "error" and rec["error"]:  # name the row, as above
                    rec["error"] = f"input line {r.line}: {rec['error']}"
            lines.append(dumps_row(rec))
        out_fh.write(b"".join(lines))
        out_fh.flush()
        os.fsync(out_fh.fileno())  # a finished batch survives a crash from here on
        bar.update(len(rows))

    todo: list[Row] = []
    new = batches = 0
    for row, is_done in plan_rows(rows(), done):
        if is_done:
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
                print(f"stopped after {batches} batch(es) (--stop-after); re-run to resume", file=sys.stderr)
                return 3
    if todo:
        flush(todo)
    bar.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
