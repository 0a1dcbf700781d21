"""StepTrace: a record of an engine loop, step by step, for finding where serving time goes.

Each step gives one row: when it began and ended, its kind (``decode``, ``prefill``, ``verify``,
from ``LLM.metrics``'s step counters), the prompt tokens it computed, the requests running
after it, and the requests that arrived since the step before. The times requests were sent
to the engine, reached it and finished are kept too. ``summary`` turns them into what a serving
run is short of against an offline one: the time no step ran (the engine waiting for requests),
the rows a step ran on average, the prefill steps by how many prompt tokens they held, how long
after a request finished the next one was sent (a closed-loop client's round trip: HTTP, the
client, the server) and how long a request then waited for the running step to end.

The server's engine process keeps one when ``DEEPINFER_STEP_TRACE`` names a file (JSON, written
when the engine stops); ``benchmarks/bench_serve.py --trace`` sets it and traces its offline run
the same way.
"""

from __future__ import annotations

import json
import time
from typing import Any

KINDS = ("decode", "prefill", "verify")
# Prefill steps grouped by the prompt tokens they computed: (label, upper bound inclusive).
PREFILL_SIZES = (("<=64", 64), ("65-256", 256), ("257-1024", 1024), (">1024", None))


class StepTrace:
    """Rows ``(start, end, kind, prompt tokens, running, arrived)`` of the steps it ran."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, float, str, int, int, int]] = []
        self.arrivals: list[float] = []  # when the engine took each request
        self.posted: list[float] = []  # when it was sent to the engine (= arrival offline)
        self.finishes: list[float] = []
        self._arrived = 0

    def arrived(self, posted: float | None = None) -> None:
        """A request reached the engine (counted on the next step's row); ``posted``: when it was
        sent (``time.perf_counter()`` of the sender; default now)."""
        self._arrived += 1
        now = time.perf_counter()
        self.arrivals.append(now)
        self.posted.append(now if posted is None else posted)

    def finished(self) -> None:
        """A request's final output left the engine."""
        self.finishes.append(time.perf_counter())

    def step(self, llm: Any) -> list:
        """``llm.step()``, timed and recorded; returns its outputs."""
        m0 = llm.metrics()
        t0 = time.perf_counter()
        outs = llm.step()
        t1 = time.perf_counter()
        m1 = llm.metrics()
        kind = next((k for k in KINDS if m1.get(k + "_steps", 0) > m0.get(k + "_steps", 0)), "none")
        tokens = m1["prefill_tokens"] - m0["prefill_tokens"]
        self.rows.append((t0, t1, kind, tokens, m1["running"], self._arrived))
        self._arrived = 0
        return outs

    def since(self, n: int) -> StepTrace:
        """The trace after its first ``n`` steps (a run's own, when a warm-up came before it).
        Between step n-1 and step n the loop records step n-1's finishes (the warm-up's) and
        takes the requests that step n runs (the run's)."""
        out = StepTrace()
        out.rows = self.rows[n:]
        t = self.rows[n - 1][1] if 0 < n <= len(self.rows) else float("-inf")
        keep = [i for i, a in enumerate(self.arrivals) if a > t]
        out.arrivals = [self.arrivals[i] for i in keep]
        out.posted = [self.posted[i] for i in keep]
        if 0 < n < len(self.rows):
            t = self.rows[n][0]  # (after step n-1's finishes)
        out.finishes = [f for f in self.finishes if f > t]
        return out

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump({"rows": self.rows, "arrivals": self.arrivals, "posted": self.posted,
                       "finishes": self.finishes}, f)  # fmt: skip

    @classmethod
    def load(cls, path: str) -> StepTrace:
        with open(path) as f:
            d = json.load(f)
        out = cls()
        out.rows = [tuple(r) for r in d["rows"]]
        out.arrivals, out.posted, out.finishes = d["arrivals"], d["posted"], d["finishes"]
        return out


def replacement_gaps(arrivals: list[float], finishes: list[float]) -> list[float]:
    """Seconds from each finish to the first arrival after it not already matched to an earlier
    finish (oldest first): in a closed loop, how long a finished request's slot waited for the
    client's next one."""
    gaps, i = [], 0
    for a in arrivals:
        if i < len(finishes) and finishes[i] < a:
            gaps.append(a - finishes[i])
            i += 1
    return gaps


def summary(trace: StepTrace) -> dict[str, Any]:
    """What a run's steps add up to: ``wall`` (first step's start to last step's end), ``busy``
    (seconds inside steps), ``idle`` (the rest) and ``idle_gaps`` (gaps over 1 ms: count,
    seconds); ``rows``: requests running after a step, on average; ``kinds``: {kind: (steps,
    mean seconds)}; ``prefill``: [(size label, steps, mean seconds, mean requests arrived before
    them)]; ``replacement``: mean seconds from a finish to the next request sent
    (``replacement_gaps``), or None; ``wait``: mean seconds a request sent waited to be taken."""
    rows = trace.rows
    if not rows:
        return {"wall": 0.0, "busy": 0.0, "idle": 0.0, "idle_gaps": (0, 0.0), "rows": 0.0, "kinds": {},
                "prefill": [], "replacement": None, "wait": None}  # fmt: skip
    wall = rows[-1][1] - rows[0][0]
    busy = sum(r[1] - r[0] for r in rows)
    gaps = [b[0] - a[1] for a, b in zip(rows, rows[1:])]
    long = [g for g in gaps if g > 1e-3]
    kinds: dict[str, tuple[int, float]] = {}
    for kind in sorted({r[2] for r in rows}):
        ts = [r[1] - r[0] for r in rows if r[2] == kind]
        kinds[kind] = (len(ts), sum(ts) / len(ts))
    prefill = []
    lo = 0
    for label, hi in PREFILL_SIZES:
        sel = [r for r in rows if r[2] == "prefill" and r[3] > lo and (hi is None or r[3] <= hi)]
        if sel:
            mean = sum(r[1] - r[0] for r in sel) / len(sel)
            prefill.append((label, len(sel), mean, sum(r[5] for r in sel) / len(sel)))
        lo = hi or lo
    gaps = replacement_gaps(sorted(trace.posted), trace.finishes)
    waits = [a - p for a, p in zip(trace.arrivals, trace.posted)]
    return {"wall": wall, "busy": busy, "idle": wall - busy, "idle_gaps": (len(long), sum(long)),
            "rows": sum(r[4] for r in rows) / len(rows), "kinds": kinds, "prefill": prefill,
            "replacement": sum(gaps) / len(gaps) if gaps else None,
            "wait": sum(waits) / len(waits) if waits else None}  # fmt: skip


def describe(trace: StepTrace) -> str:
    """``summary`` in one line: 'wall W ms, idle I ms (G gaps > 1 ms), R rows a step, next
    request sent X ms after a finish, taken Y ms after it was sent, prefill <=64: n x m ms (a
    arrived), ...'."""
    s = summary(trace)
    gaps = s["idle_gaps"][0]
    parts = [f"wall {s['wall'] * 1e3:.0f} ms, idle {s['idle'] * 1e3:.0f} ms ({gaps} gaps > 1 ms)",
             f"{s['rows']:.1f} rows a step"]  # fmt: skip
    if s["replacement"] is not None:
        parts.append(f"next request sent {s['replacement'] * 1e3:.1f} ms after a finish")
    if s["wait"] is not None:
        parts.append(f"taken {s['wait'] * 1e3:.1f} ms after it was sent")
    parts += [f"prefill {lab}: {n} x {m * 1e3:.1f} ms ({a:.1f} arrived)" for lab, n, m, a in s["prefill"]]
    return ", ".join(parts)
