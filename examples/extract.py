"""Schema-validated batch extraction: one JSON object per input row, resumable; in one process
or on a Ray cluster. The command line of ``deepinfer.batch`` (``--help`` tells all):

    .venv/bin/python examples/extract.py --schema examples/sample_data/schema.json \\
        --input examples/sample_data/docs.jsonl --output out.jsonl
    .venv/bin/python examples/extract.py --schema examples/sample_data/person.py:Person ...
    .venv/bin/python examples/extract.py --ray auto --num-actors 2 ...   # docs/batch.md
"""

from __future__ import annotations

import sys

from deepinfer.batch import (  # noqa: F401  (the library's names, for scripts that load this file)
    DEFAULT_TEMPLATE,
    Row,
    UsageError,
    describe_fields,
    done_ids,
    dumps_row,
    error_record,
    key_of,
    main,
    parse_line,
    plan_rows,
    read_rows,
)

if __name__ == "__main__":
    sys.exit(main())
