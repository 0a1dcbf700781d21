"""EngineLoop: the engine core in a process of its own, stepping continuously; the server
process submits requests and reads their outputs from per-request asyncio queues.

The engine runs in a separate process so that the server's Python work (HTTP, JSON, SSE)
and the engine's (scheduling, masks, sampling) run on two cores, not in turns under one GIL.
Between them are two pipes:

- server -> engine: ``("add", rid, payload, params, stream, posted)`` (payload ``("chat",
  messages, template kwargs)``, rendered by the engine's chat template, or ``("prompt", text or
  ids)``; posted: the server's ``time.perf_counter()`` as it sent it, a clock both processes
  share on Linux, for the step trace),
  ``("abort", rid)``, ``("stop",)``;
- engine -> server: ``("ready", info)`` once loaded, then one ``("step", outputs, metrics)``
  per engine step that has outputs, or ``("failed", message)`` if the engine itself fails.

Requests from many clients join the running batch between steps (continuous batching). A
streamed request gets a partial output (its new text and logprobs only) whenever it gains
tokens; every request gets its final output. A reader thread in the server process hands each
step's outputs to the event loop in one ``call_soon_threadsafe``. A client that goes away
calls ``abort``: the request ends before the engine's next step, its KV blocks freed.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .step_trace import StepTrace


@dataclass
class Stats:
    """Counters and timings for /metrics (written by the reader thread only)."""

    requests: dict[str, int] = field(default_factory=dict)  # by finish reason
    prompt_tokens: int = 0
    generated_tokens: int = 0
    ttft: list[float] = field(default_factory=list)  # seconds, bounded (the last 10,000)
    tpot: list[float] = field(default_factory=list)
    steps: int = 0


@dataclass
class Output:
    """A request's output as the server sees it: the whole text and logprobs so far."""

    request_id: str
    text: str = ""
    num_tokens: int = 0
    prompt_tokens: int = 0
    logprobs: list | None = None
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    reasoning: str | None = None  # SamplingParams.reasoning: the block's text (``text`` follows it)


class QueueFull(RuntimeError):
    """More requests waiting than the server accepts (the client should retry later)."""


class EngineLoop:
    """Parameters
    ----------
    factory : callable
        Builds the ``LLM`` in the engine process (picklable: e.g. ``functools.partial(LLM,
        model, ...)``).
    max_waiting : int
        Most requests accepted but not yet finished; past it ``submit`` raises QueueFull.
    """

    def __init__(self, factory: Callable[[], Any], *, max_waiting: int = 1024) -> None:
        self.factory = factory
        self.max_waiting = max_waiting
        self.stats = Stats()
        self.info: dict = {}  # the engine's facts, from its "ready" message
        self.engine_metrics: dict = {}  # LLM.metrics() after its latest step
        # request id -> (its event loop, its queue, streamed?, its output so far)
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue, bool, Output]] = {}
        self._times: dict[str, list[float]] = {}  # request id -> [arrival, first token, last token]
        self._ids = itertools.count()
        self._lock = threading.Lock()  # the pipe to the engine (handlers on any thread)
        self._proc = None
        self._send_conn = None
        self._reader: threading.Thread | None = None
        self.error: BaseException | None = None

    # -- life ------------------------------------------------------------------------------------
    def start(self, timeout: float = 1800) -> None:
        """Start the engine process and wait until its model is loaded (raises its error)."""
        ctx = mp.get_context("spawn")  # no CUDA state or threads inherited
        to_engine_r, to_engine_w = ctx.Pipe(duplex=False)
        from_engine_r, from_engine_w = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=engine_main, args=(self.factory, to_engine_r, from_engine_w),
                                 name="deepinfer-engine", daemon=False)  # fmt: skip
        # (not a daemon: a parallel engine starts worker or replica processes of its own; stop()
        # ends it, and it exits when the server's end of its pipe closes)
        self._proc.start()
        to_engine_r.close()
        from_engine_w.close()
        self._send_conn, self._recv_conn = to_engine_w, from_engine_r
        if not self._recv_conn.poll(timeout):
            raise RuntimeError(f"the engine did not start in {timeout:.0f} s")
        msg = self._recv_conn.recv()
        if msg[0] != "ready":
            raise RuntimeError(f"the engine failed to start: {msg[1]}")
        self.info = msg[1]
        self.engine_metrics = self.info.pop("metrics", {})
        self._reader = threading.Thread(target=self._read, name="deepinfer-engine-reader", daemon=True)
        self._reader.start()

    def stop(self) -> None:
        try:
            self._post(("stop",))
        except (OSError, ValueError):
            pass
        if self._proc is not None:
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()

    @property
    def alive(self) -> bool:
        return self.error is None and self._proc is not None and self._proc.is_alive()

    # -- from the handlers -------------------------------------------------------------------------
    def submit(self, payload: tuple, params: Any, q: asyncio.Queue, *, stream: bool = False) -> str:
        """Queue one request (``payload``: ``("chat", messages, template_kwargs)`` or
        ``("prompt", text_or_ids)``); returns its id. Its outputs arrive on ``q`` (several
        requests may share one): with ``stream``, an :class:`Output` whenever it gains tokens,
        and always its final one (``finished``); or the exception that stopped the engine."""
        if len(self._queues) >= self.max_waiting:
            raise QueueFull(
                f"{len(self._queues)} requests in flight, the server takes at most {self.max_waiting}"
            )
        rid = f"req-{next(self._ids)}"
        self._queues[rid] = (asyncio.get_running_loop(), q, stream, Output(rid))
        self._times[rid] = [time.perf_counter(), 0.0, 0.0]
        self._post(("add", rid, payload, params, stream, time.perf_counter()))
        return rid

    def abort(self, rid: str) -> None:
        """The client went away: end the request before the next step (no-op once finished)."""
        if rid in self._queues:
            try:
                self._post(("abort", rid))
            except (OSError, ValueError):
                pass

    def _post(self, msg: tuple) -> None:
        with self._lock:
            self._send_conn.send(msg)

    # -- the reader thread -----------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                msg = self._recv_conn.recv()
                if msg[0] == "failed":
                    raise RuntimeError(f"the engine failed: {msg[1]}")
                _, outs, metrics = msg
                self.engine_metrics = metrics
                self.stats.steps = metrics.get("steps", self.stats.steps)
                self._deliver(outs, time.perf_counter())
        except (EOFError, OSError) as e:
            self._fail(RuntimeError(f"the engine process exited ({type(e).__name__})"))
        except BaseException as e:  # noqa: BLE001 - every waiter gets the error
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        self.error = e
        batches: dict = {}
        for loop, q, _, _ in list(self._queues.values()):
            batches.setdefault(loop, []).append((q, e))
        self._queues.clear()
        for loop, items in batches.items():
            _call(loop, items)

    def _deliver(self, outs: list, now: float) -> None:
        batches: dict = {}
        st = self.stats
        for rid, delta, num_tokens, lps, final in outs:
            target = self._queues.get(rid)
            if target is None:
                continue
            loop, q, stream, out = target
            t = self._times[rid]
            if num_tokens and not t[1]:
                t[1] = now
                st.ttft.append(now - t[0])
            if num_tokens:
                t[2] = now
            out.text += delta
            out.num_tokens = num_tokens
            if lps is not None:
                out.logprobs = (out.logprobs or []) + lps
            if final is None:
                if stream:
                    batches.setdefault(loop, []).append((q, _copy(out)))
                continue
            out.text, out.prompt_tokens, out.finish_reason, out.error, out.reasoning = final
            out.finished = True
            reason = out.finish_reason or "length"
            st.requests[reason] = st.requests.get(reason, 0) + 1
            st.prompt_tokens += out.prompt_tokens
            st.generated_tokens += num_tokens
            if t[1] and num_tokens > 1:
                st.tpot.append((t[2] - t[1]) / (num_tokens - 1))
            for xs in (st.ttft, st.tpot):
                del xs[:-10_000]
            del self._queues[rid], self._times[rid]
            batches.setdefault(loop, []).append((q, out))
        for loop, items in batches.items():
            _call(loop, items)


def _copy(o: Output) -> Output:
    return Output(o.request_id, o.text, o.num_tokens, o.prompt_tokens,
                  None if o.logprobs is None else list(o.logprobs))  # fmt: skip


def _call(loop: asyncio.AbstractEventLoop, items: list) -> None:
    try:
        loop.call_soon_threadsafe(_put_all, items)
    except RuntimeError:  # the event loop closed
        pass


def _put_all(items: list) -> None:
    for q, item in items:
        q.put_nowait(item)


# -- the engine process --------------------------------------------------------------------------
def engine_main(factory: Callable[[], Any], inbox, outbox) -> None:
    """Build the LLM, say ready, then step while there is work; take requests between steps."""
    try:
        llm = factory()  # (on CUDA its graphs are captured as it is built: no request pays one)
        try:
            llm.prepare_constraints()  # nor does the first constrained request pay the compiler
        except Exception:  # noqa: BLE001 - the first constrained request then fails with its error
            pass
        tok = llm.tokenizer
        token_bytes = [
            b if b is not None else (tok.id_to_token(i) or "").encode()
            for i, b in enumerate(tok.token_bytes())
        ]
        info = {"chat_template": tok.chat_template, "token_bytes": token_bytes, "metrics": llm.metrics()}
        outbox.send(("ready", info))
    except BaseException as e:  # noqa: BLE001 - the server says why it could not start
        outbox.send(("failed", f"{type(e).__name__}: {e}"))
        return
    # request id -> [streamed?, characters sent, logprob entries sent, first token told?]; a
    # request that is not streamed is told only its first token (the server times it) and its
    # final output
    sent: dict[str, list] = {}
    steps = 0
    trace_path = os.environ.get("DEEPINFER_STEP_TRACE")
    trace = StepTrace() if trace_path else None

    def take(msg: tuple) -> bool:
        """One message from the server: False for ``stop``."""
        if msg[0] == "stop":
            return False
        if msg[0] == "abort":
            llm.abort_request(msg[1])
            return True
        _, rid, payload, params, stream, posted = msg
        prompt = payload[1]
        if payload[0] == "chat":
            prompt = llm.chat_prompt(payload[1], chat_template_kwargs=payload[2])
        llm.add_request(prompt, params, request_id=rid, stream=True)
        # reasoning: the text is whole only once split, so it comes at the end
        sent[rid] = [stream and params.reasoning is None, 0, 0, False]
        if trace is not None:
            trace.arrived(posted)
        return True

    try:
        while True:
            busy = llm.has_unfinished_requests()
            if inbox.poll(0 if busy else 0.05):
                while inbox.poll():
                    if not take(inbox.recv()):
                        return
                continue
            if not busy:
                continue
            outs = llm.step() if trace is None else trace.step(llm)
            steps += 1
            packed = []
            for o in outs:
                rid = o.request_id
                s = sent.get(rid)
                if s is None:
                    continue
                stream, chars, entries, told = s
                if not (o.finished or stream):
                    if o.token_ids and not told:
                        packed.append((rid, "", len(o.token_ids), None, None))
                        s[3] = True
                    continue
                lps = None if o.logprobs is None else o.logprobs[entries:]
                if o.finished:
                    final = (o.text, len(o.prompt_token_ids), o.finish_reason, o.error, o.reasoning)
                    packed.append((rid, "", len(o.token_ids), lps, final))
                    del sent[rid]
                    if trace is not None:
                        trace.finished()
                else:
                    packed.append((rid, o.text[chars:], len(o.token_ids), lps, None))
                    s[1], s[2] = len(o.text), len(o.logprobs or ())
            if packed:
                m = llm.metrics()
                m["steps"] = steps
                outbox.send(("step", packed, m))
    except BaseException as e:  # noqa: BLE001 - the engine itself failed: the server learns why
        try:
            outbox.send(("failed", f"{type(e).__name__}: {e}"))
        except OSError:
            pass
    finally:
        if trace is not None:
            trace.dump(trace_path)
