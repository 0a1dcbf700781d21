"""``python -m deepinfer.batch``: the batch extraction command line."""

import sys

from deepinfer.batch.cli import main

sys.exit(main())
