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
    say otherwise; one inter-op thread (the engine runs one op at a time). On the CPU the engine
    then raises it to every core for the steps that may use one (`StepThreads`).

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


def _busy_seconds() -> float | None:
    """CPU seconds every core of the machine has been busy since boot (/proc/stat: user, nice,
    system, irq, softirq, steal), or None where there is no /proc/stat."""
    try:
        with open("/proc/stat", "rb") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(v) < 8:
        return None
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


SMALL_ROWS = 4  # a decode step of at most this many rows keeps the base threads (`for_step`)
# host work (constraint masks) below this share of a step's time leaves every core to the
# forward (`host_needs_core`)
HOST_SHARE = 0.1


def host_needs_core(host_seconds: float, step_seconds: float) -> bool:
    """Does a step's host work (constraint masks filled on a host thread while the forward
    runs), ``host_seconds`` a step lately, need a core of its own beside a forward of
    ``step_seconds``? With every core the forward takes about a sixth less time at 8 rows on
    the 2-core machine (torch's int4 matmuls), and the host thread takes a core's time from it
    while it runs: that pays while the host work is a small share of the step. Warm rows are a
    few microseconds each (about 0.1 ms a step at 8 rows, against 40-50 ms); a request's
    first rows or a new schema's can take milliseconds, which the recent average shows.
    With no mask fill measured yet (a process's first constrained step), no: that step is
    the request's prefill, whose forward computes every prompt token while its masks are a
    row per request (one thread doubled a 250-token prompt's time to first token)."""
    return host_seconds > 0.0 and host_seconds >= HOST_SHARE * step_seconds


class StepThreads:
    """Intra-op threads for each engine step on the CPU: every core when the step leaves no host
    work to a core (no drafts, and constraint masks that are a small share of the step:
    `host_needs_core`) and no other process keeps a core busy; else
    the threads ``configure_torch_threads`` chose (cores - 1). Fixed where the user set
    DEEPINFER_NUM_THREADS / OMP_NUM_THREADS, on one core, and where the machine's load cannot be
    read.

    Why measured: on 2 shared cores a 2-thread parallel region waits for a core that another
    process holds, and a step then took 0.5 s instead of 15 ms; with the other core idle, two
    threads decode about 1.4x faster than one. Other processes' use is the machine's busy time
    (/proc/stat) less this process's own (``time.process_time``), over windows of ``window``
    seconds (the first, from the policy's making, of ``first_window``): a quarter of a core or
    more of it keeps the spare core to them, until a window with less than a tenth. Before the
    first window the spare core is theirs."""

    def __init__(self, window: float = 0.25, first_window: float = 0.1):
        import time

        self._clock = time.perf_counter
        self._cpu = time.process_time
        self.window = window
        # the first window may be shorter: until one is measured the policy assumes a busy
        # neighbour, and the engine makes its policy before loading the model, so that the
        # load (this process's own time, left out) is most of that window
        self.first_window = first_window
        self._measured = False
        self.base = configure_torch_threads()
        self.cores = cpu_count()
        fixed = os.environ.get("DEEPINFER_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
        self._busy = _busy_seconds()
        self.enabled = not fixed and self.cores > self.base and self._busy is not None
        self._t, self._own = self._clock(), self._cpu()
        self.others_busy = True  # until a window says otherwise
        self.current = self.base

    def _measure(self) -> None:
        now = self._clock()
        if now - self._t < (self.window if self._measured else self.first_window):
            return
        self._measured = True
        busy, own = _busy_seconds(), self._cpu()
        if busy is None:
            self.enabled = False
            return
        others = (busy - self._busy) - (own - self._own)  # CPU seconds of other processes
        share = others / (now - self._t)  # in cores
        self.others_busy = share >= (0.1 if self.others_busy else 0.25)
        self._t, self._busy, self._own = now, busy, own

    def for_step(self, host_work: bool, small: bool = False) -> int:
        """Set (if it changes) and return the threads for a step; ``host_work``: the step has
        host work that needs a core of its own while the forward runs (drafts, or constraint
        masks where `host_needs_core` says so); ``small``: a decode
        step of at most `SMALL_ROWS` rows, whose ops last microseconds: there a parallel region's
        wake-up of a sleeping thread (OMP_WAIT_POLICY=PASSIVE) costs more than the second core
        saves (benchmarks/bench_cpu.py's decode at batch 1 on the idle 2-core machine: 117 tok/s
        on one thread, 48 on two), so it keeps the base count."""
        if not self.enabled:
            return self.current
        import torch

        self._measure()
        want = self.base if host_work or small or self.others_busy else self.cores
        if want != self.current:
            torch.set_num_threads(want)
            self.current = want
        return want
