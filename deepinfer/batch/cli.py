"""Schema-validated batch extraction: one JSON object per input row, resumable; in one
process, or on a Ray cluster (--ray).

    .venv/bin/python -m deepinfer.batch --schema examples/sample_data/schema.json \\
        --input examples/sample_data/docs.jsonl --output out.jsonl
    .venv/bin/python -m deepinfer.batch --schema examples/sample_data/person.py:Person ...
    .venv/bin/python -m deepinfer.batch --ray auto --num-actors 2 --input docs/ --output out.parquet ...

--schema is a JSON Schema file, or ``module:Model`` / ``path/to/file.py:Model`` naming a
pydantic model. Each input line is a JSON object with the text in --text-field (and an
optional id in --id-field; else the line number is the id). Each row becomes a chat prompt
asking for the schema's fields, generated with ``json_schema=``; every output is validated
again here with jsonschema. One output line per input row, in input order (on Ray: as batches finish):

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

--output ending in .parquet is a folder of Parquet parts with the same columns ("id" and
"data" as JSON text), each written whole or not at all, every 10,000 rows and at the end
(an interrupted run redoes the rows after its last part); re-runs resume from it the same way.

With --ray auto (a running cluster, else one started for the run) or --ray ADDRESS, Ray Data
reads --input (a JSONL or Parquet file, or a folder of them: rows of a file in a folder name
it, "file"), an actor pool of --num-actors engines (one LLM and one compiled constraint each,
--cpus-per-actor / --gpus-per-actor each) extracts, and this process commits the rows as they
come: every row once (a batch Ray runs again after a worker died is not written twice), the
same checks and error rows, and re-runs skip the ids already written. docs/batch.md tells more.

Exit status: 0 when every row was processed (even if some failed), 2 on bad arguments, a
bad schema, an output file that cannot be opened, is locked by another run or is corrupt,
3 when --stop-after ended the run early.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .extractor import DEFAULT_TEMPLATE, EngineConfig
from .output import open_sink
from .rows import DEFAULT_MAX_LINE_BYTES
from .schema import UsageError, load_schema


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="extract", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--schema", required=True, help="schema.json, module:Model or file.py:Model")
    ap.add_argument("--input", required=True, help="JSONL, one object per line (--ray: or Parquet, a folder)")
    ap.add_argument(
        "--output", required=True, help="JSONL, appended to (resumable); *.parquet: a folder of parts"
    )
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
    ap.add_argument(
        "--deterministic",
        action="store_true",
        help="batch-invariant engine: a row's output is the same whatever rows, process or threads run it",
    )
    ap.add_argument("--limit", type=int, default=None, help="process at most this many new rows, then exit 0")
    ap.add_argument(
        "--stop-after",
        type=int,
        default=None,
        metavar="N",
        help="end the run after N batches with exit status 3 (to try resuming)",
    )
    ap.add_argument("--no-progress", action="store_true")
    ray = ap.add_argument_group("on a Ray cluster (pip install 'deepinfer[ray]')")
    ray.add_argument(
        "--ray",
        default=None,
        metavar="auto|ADDRESS",
        help="run on Ray: 'auto' (a running cluster, else a local one) or a cluster's address",
    )
    ray.add_argument("--num-actors", type=int, default=1, help="engines in the actor pool (default 1)")
    ray.add_argument("--cpus-per-actor", type=float, default=1.0, help="CPUs each actor holds (default 1)")
    ray.add_argument(
        "--gpus-per-actor", type=float, default=0.0, help="GPUs each actor holds (default 0: on CPU)"
    )
    return ap


def main(argv: list[str] | None = None, llm: Any = None) -> int:
    """Run the extraction; ``llm`` lets a caller pass an already loaded LLM (one process)."""
    args = parser().parse_args(argv)
    try:
        return _run(args, llm)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _check(args: argparse.Namespace) -> None:
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
    if args.ray is None:
        for name in ("num_actors", "cpus_per_actor", "gpus_per_actor"):
            if getattr(args, name) != parser().get_default(name):
                raise UsageError(f"--{name.replace('_', '-')} needs --ray")
        if not os.path.isfile(args.input):
            what = "not a regular file" if os.path.exists(args.input) else "no such file"
            raise UsageError(f"--input {args.input}: {what}")
    else:
        if args.num_actors < 1:
            raise UsageError(f"--num-actors must be >= 1, got {args.num_actors}")
        if not args.cpus_per_actor > 0:
            raise UsageError(f"--cpus-per-actor must be > 0, got {args.cpus_per_actor}")
        if not args.gpus_per_actor >= 0:
            raise UsageError(f"--gpus-per-actor must be >= 0, got {args.gpus_per_actor}")
        if not os.path.exists(args.input):
            raise UsageError(f"--input {args.input}: no such file or folder")
    if os.path.exists(args.output) and os.path.samefile(args.input, args.output):
        raise UsageError(f"--output {args.output} is the --input file")


def _run(args: argparse.Namespace, llm: Any) -> int:
    _check(args)
    schema = load_schema(args.schema)  # before the model loads: a bad schema costs nothing
    config = EngineConfig(
        schema=schema,
        model=args.model,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
        strict=args.strict,
        template=args.prompt_template,
        system=args.system,
        deterministic=args.deterministic,
    )
    config.params()  # a bad --max-tokens etc.: refused before the output is touched
    sink = open_sink(args.output)  # likewise a bad output path, or a busy one
    try:
        if args.ray is not None:
            from .on_ray import run_on_ray

            status = run_on_ray(args, config, sink)
        else:
            from .local import run_local

            status = run_local(args, config, sink, llm)
    except BaseException:
        sink.close(failed=True)
        raise
    sink.close()
    return status
