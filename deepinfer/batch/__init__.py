"""Schema-validated batch extraction: JSONL (or Parquet) in, one validated JSON object per row
out, resumable; in one process or on a Ray cluster. The command line (``python -m
deepinfer.batch``, or examples/extract.py) is described in :mod:`deepinfer.batch.cli`;
docs/batch.md tells how it runs on a cluster.
"""

from .cli import main
from .extractor import DEFAULT_TEMPLATE, EngineConfig, Extractor, build_prompt, describe_fields, result_row
from .output import JsonlSink, ParquetSink, done_ids, dumps_row, error_record, open_output, open_sink
from .rows import DEFAULT_MAX_LINE_BYTES, Row, iter_lines, key_of, parse_line, plan_rows, read_rows
from .schema import Schema, UsageError, load_schema

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_TEMPLATE",
    "EngineConfig",
    "Extractor",
    "JsonlSink",
    "ParquetSink",
    "Row",
    "Schema",
    "UsageError",
    "build_prompt",
    "describe_fields",
    "done_ids",
    "dumps_row",
    "error_record",
    "iter_lines",
    "key_of",
    "load_schema",
    "main",
    "open_output",
    "open_sink",
    "parse_line",
    "plan_rows",
    "read_rows",
    "result_row",
]
