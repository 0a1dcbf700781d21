"""CPU thread policy. Imported before torch by every engine module that uses torch.

The machines here have 2 cores. OpenMP's default spin-wait made decode ~20x slower when a
second busy process shared the cores; PASSIVE waiting fixes that and costs nothing measurable
alone. It must be in the environment before torch (and its OpenMP runtime) loads.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_configured = False


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def configure_torch_threads() -> int:
    """Intra-op threads = cores - 1 (at least 1), unless DEEPINFER_NUM_THREADS / OMP_NUM_THREADS
    say otherwise; one inter-op thread (the engine runs one op at a time).

    Why cores - 1: one core stays free for the host side of a step (tokenizer, scheduler,
    constraint masks) and for neighbours. Measured here on 2 shared cores (bf16 decode, batch 1):
    1 thread 9.7 tok/s, 2 threads 4.9 tok/s; a 2-thread parallel region stalls whenever the
    other core is busy, and small ops then cost ~100 ms instead of ~2 ms.
    """
    global _configured
    import torch

    if not _configured:
        _configured = True
        wanted = os.environ.get("DEEPINFER_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
        n = int(wanted) if wanted else cpu_count() - 1
        torch.set_num_threads(max(1, n))
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set, or parallel work already started
            pass
    return torch.get_num_threads()
