"""EngineLoop: one thread owns the ``LLM`` and steps its engine core; asyncio handlers submit
requests and read their outputs from per-request queues.

Requests from many clients join the running batch between steps (continuous batching). A
handler never touches the model: it puts a submission on a thread-safe inbox and awaits an
``asyncio.Queue`` that the loop feeds with ``loop.call_soon_threadsafe``. A client that goes
away calls ``abort``; the request is aborted before the next step and its KV blocks are freed.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..outputs import RequestOutput


@dataclass
class Stats:
    """Counters and timings for /metrics (written by the loop thread only)."""

    requests: dict[str, int] = field(default_factory=dict)  # by finish reason
    prompt_tokens: int = 0
    generated_tokens: int = 0
    ttft: list[float] = field(default_factory=list)  # seconds, bounded (the last 10,000)
    tpot: list[float] = field(default_factory=list)
    steps: int = 0


class QueueFull(RuntimeError):
    """More requests waiting than the server accepts (the client should retry later)."""


class EngineLoop:
    """Parameters
    ----------
    llm : deepinfer.LLM
        The engine (built by the caller; used only from the loop thread once started).
    max_waiting : int
        Most requests accepted but not yet finished; past it ``submit`` raises QueueFull.
    """

    def __init__(self, llm, *, max_waiting: int = 1024) -> None:
        self.llm = llm
        self.max_waiting = max_waiting
        self.stats = Stats()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._queues: dict[Any, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._times: dict[Any, list[float]] = {}  # request id -> [arrival, first token, last token]
        self._ids = itertools.count()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="deepinfer-engine", daemon=True)
        self.error: BaseException | None = None

    # -- from the handlers (any thread, usually the event loop's) -------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def submit(self, prompt: Any, params: Any) -> tuple[Any, asyncio.Queue]:
        """Queue one request; its outputs (partial, then final) arrive on the returned queue,
        then None."""
        if len(self._queues) >= self.max_waiting:
            raise QueueFull(
                f"{len(self._queues)} requests in flight, the server takes at most {self.max_waiting}"
            )
        rid = f"req-{next(self._ids)}"
        q: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = (asyncio.get_running_loop(), q)
        self._inbox.put(("add", rid, prompt, params, time.perf_counter()))
        self._wake.set()
        return rid, q

    def abort(self, rid: Any) -> None:
        """The client went away: end the request before the next step (no-op once finished)."""
        self._inbox.put(("abort", rid))
        self._wake.set()

    # -- the loop thread ------------------------------------------------------------------------
    def _run(self) -> None:
        llm = self.llm
        try:
            while not self._stop:
                self._drain_inbox()
                if not llm.has_unfinished_requests():
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                outs = llm.step()
                self.stats.steps += 1
                now = time.perf_counter()
                for o in outs:
                    self._deliver(o, now)
        except BaseException as e:  # the engine itself failed: every waiter gets the error
            self.error = e
            for rid in list(self._queues):
                self._send(rid, e)
                self._send(rid, None)
            self._queues.clear()

    def _drain_inbox(self) -> None:
        llm = self.llm
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if msg[0] == "add":
                _, rid, prompt, params, t0 = msg
                self._times[rid] = [t0, 0.0, 0.0]
                llm.add_request(prompt, params, request_id=rid, stream=True)
            else:  # (an abort always follows its add in the inbox)
                llm.abort_request(msg[1])

    def _deliver(self, o: RequestOutput, now: float) -> None:
        rid = o.request_id
        t = self._times.get(rid)
        st = self.stats
        if t is not None and o.token_ids and not t[1]:
            t[1] = now
            st.ttft.append(now - t[0])
        if t is not None and o.token_ids:
            t[2] = now
        self._send(rid, o)
        if o.finished:
            st.requests[o.finish_reason or "length"] = st.requests.get(o.finish_reason or "length", 0) + 1
            st.prompt_tokens += len(o.prompt_token_ids)
            st.generated_tokens += len(o.token_ids)
            if t is not None and t[1] and len(o.token_ids) > 1:
                st.tpot.append((t[2] - t[1]) / (len(o.token_ids) - 1))
            for xs in (st.ttft, st.tpot):
                del xs[:-10_000]
            self._times.pop(rid, None)
            self._send(rid, None)
            self._queues.pop(rid, None)

    def _send(self, rid: Any, item: Any) -> None:
        target = self._queues.get(rid)
        if target is not None:
            loop, q = target
            try:
                loop.call_soon_threadsafe(q.put_nowait, item)
            except RuntimeError:  # the event loop closed
                pass
