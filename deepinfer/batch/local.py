"""The single-process run: one engine, the input read in order, one batch written at a time."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

from .extractor import EngineConfig, Extractor
from .output import JsonlSink, ParquetSink, dumps_row
from .rows import Row, plan_rows, read_rows
from .schema import UsageError


def run_local(
    args: argparse.Namespace, config: EngineConfig, sink: JsonlSink | ParquetSink, llm: Any = None
) -> int:
    """Extract every row of ``args.input`` not yet in ``sink``; the exit status (0, or 3 where
    --stop-after ended the run)."""

    def rows() -> Iterator[Row]:
        try:
            fh = open(args.input, "rb")
        except OSError as e:
            raise UsageError(f"--input {args.input}: cannot read it: {e.strerror or e}") from e
        with fh:
            yield from read_rows(fh, args.text_field, args.id_field, args.max_line_bytes)

    total = sum(1 for _ in rows())
    done = sink.done()
    extractor = Extractor(config, llm)  # (params checked before the model loads)

    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="extract", unit="row", disable=args.no_progress)

    pending: list[bytes] = []  # written once the sink's min_rows are there (JSONL: every batch)

    def flush(rows: list[Row], last: bool = False) -> None:
        pending.extend(dumps_row(rec) for rec in extractor.records(rows))
        bar.update(len(rows))
        if pending and (last or len(pending) >= sink.min_rows):
            sink.write(pending)
            pending.clear()

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
            batches += 1
            stop = args.stop_after is not None and batches >= args.stop_after
            flush(todo, last=stop)
            todo = []
            if stop:
                bar.close()
                print(f"stopped after {batches} batch(es) (--stop-after); re-run to resume", file=sys.stderr)
                return 3
    flush(todo, last=True)
    bar.close()
    return 0
