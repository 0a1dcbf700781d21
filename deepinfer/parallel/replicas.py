"""Data-parallel replicas: N engines, each an `LLM` in a process of its own (replica i on
``cuda:i``), behind one front with the `LLM` API (``LLM(data_parallel_size=N)`` returns one).

The front holds the tokenizer (for chat templates and the router's prompt ids), a `Router`,
and per request its prompt, parameters (with a seed drawn here, so a re-run draws the same
tokens) and owner. Replicas step on their own and send each step's outputs with their free KV
blocks. A replica that dies (its pipe closes or its process ends) has its unfinished requests
re-queued on the others, from the start; a request's output is taken only from its current
owner, so each request is answered exactly once.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import random
from multiprocessing.connection import wait
from typing import Any

from ..loader import load_model
from ..models.kv_cache import DEFAULT_BLOCK_SIZE
from ..sampling_params import SamplingParams
from ..tokenizer import Tokenizer
from .router import Router


@dataclasses.dataclass
class _Request:
    prompt: Any
    params: SamplingParams
    stream: bool
    ids: list[int]  # the router's view of the prompt
    tokens: int  # its queued cost
    owner: int = -1


class Replicas:
    """``data_parallel_size`` engines behind one router; the other arguments are `LLM`'s, given to
    every replica. Methods: generate, chat, chat_prompt, add_request, step, abort_request,
    has_unfinished_requests, metrics, close."""

    def __init__(self, model: Any = None, *, engine: type, data_parallel_size: int, seed: int | None = None,
                 block_size: int = DEFAULT_BLOCK_SIZE, start_timeout: float = 600.0, **kwargs):  # fmt: skip
        """``engine``: the `LLM` class (each replica builds one; chat templates go through it)."""
        import torch

        n = data_parallel_size
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"data_parallel_size must be an integer >= 1, got {n!r}")
        for k in ("tensor_parallel_size", "expert_parallel_size"):
            if kwargs.get(k, 1) != 1:
                raise ValueError(f"data_parallel_size={n} with {k}={kwargs[k]}: not supported together")
        device = str(kwargs.get("device", "auto"))
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.engine = engine
        if self.device.type == "cuda" and n > torch.cuda.device_count():
            raise ValueError(
                f"data_parallel_size={n} needs {n} CUDA devices, found {torch.cuda.device_count()}"
            )
        loaded = load_model(model)
        self.config = loaded.config
        self.tokenizer = Tokenizer.from_loaded(loaded)
        del loaded
        self.router = Router(n, block_size)
        self._requests: dict[Any, _Request] = {}
        self._seed_rng = random.Random(seed)
        self._next_id = 0
        self.requeued = 0  # requests moved off a dead replica
        self._metrics: list[dict] = [{} for _ in range(n)]
        ctx = mp.get_context("spawn")
        self._procs, self._conns = [], []
        for i in range(n):
            kw = dict(kwargs, block_size=block_size)
            if self.device.type == "cuda":
                kw["device"] = f"cuda:{i}"
            here, there = ctx.Pipe()
            p = ctx.Process(
                target=replica_main,
                args=(engine, model, kw, there),
                name=f"deepinfer-replica{i}",
                daemon=True,
            )
            p.start()
            there.close()
            self._procs.append(p)
            self._conns.append(here)
        for i, c in enumerate(self._conns):
            if not c.poll(start_timeout):
                self.close()
                raise RuntimeError(f"replica {i} did not start in {start_timeout:.0f} s")
            msg = c.recv()
            if msg[0] != "ready":
                self.close()
                raise RuntimeError(f"replica {i} failed to start: {msg[1]}")
            self._metrics[i] = msg[1]
            self.router.report(
                i, msg[1]["kv_blocks_total"] - msg[1]["kv_blocks_used"], msg[1]["kv_blocks_total"]
            )

    # -- the LLM API ---------------------------------------------------------------------------
    def generate(self, prompts, params=None, use_tqdm: bool = True) -> list:
        """Each prompt's final output, in prompt order (as `LLM.generate`)."""
        if isinstance(prompts, str) or (
            isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        params = SamplingParams() if params is None else params
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(plist)} SamplingParams")
        rids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        want, outs = set(rids), {}
        while want - outs.keys():
            for o in self.step():
                if o.finished and o.request_id in want:
                    outs[o.request_id] = o
        return [outs[r] for r in rids]

    def chat(self, messages, params=None, use_tqdm: bool = True, **kw) -> list:
        return self.engine.chat(self, messages, params, use_tqdm, **kw)

    def chat_prompt(self, messages, **kw) -> str:
        return self.engine.chat_prompt(self, messages, **kw)

    def add_request(self, prompt, params: SamplingParams | None = None, request_id: Any = None, *,
                    stream: bool = False) -> Any:  # fmt: skip
        """Queue one request on the replica the router picks; returns its id."""
        params = SamplingParams() if params is None else params
        if request_id is None:
            while self._next_id in self._requests:
                self._next_id += 1
            request_id, self._next_id = self._next_id, self._next_id + 1
        elif request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if isinstance(params, SamplingParams) and params.seed is None:  # one seed wherever it runs
            params = dataclasses.replace(params, seed=self._seed_rng.getrandbits(63))
        ids = self._ids(prompt)
        cost = len(ids) + (getattr(params, "max_tokens", None) or 16)
        req = _Request(prompt, params, stream, ids, cost)
        self._requests[request_id] = req
        self._send(request_id, req)
        return request_id

    def step(self, timeout: float = 0.05) -> list:
        """The outputs the replicas sent since the last call (waiting up to ``timeout`` seconds
        for one while requests are unfinished)."""
        outs: list = []
        live = [c for i, c in enumerate(self._conns) if self.router.alive[i]]
        ready = wait(live, timeout if self._requests else 0)
        for c in ready:
            i = self._conns.index(c)
            while self.router.alive[i]:
                try:
                    if not c.poll():
                        break
                    msg = c.recv()
                except (EOFError, OSError):
                    self._lost(i, "its pipe closed")
                    break
                if msg[0] == "failed":
                    self._lost(i, msg[1])
                    break
                _, got, m = msg
                self._metrics[i] = m
                self.router.report(i, m["kv_blocks_total"] - m["kv_blocks_used"], m["kv_blocks_total"])
                for o in got:
                    req = self._requests.get(o.request_id)
                    if req is None or req.owner != i:
                        continue  # (a re-queued request's output from before: not its owner now)
                    if o.finished:
                        del self._requests[o.request_id]
                        self.router.finish(i, req.tokens)
                    outs.append(o)
        for i, p in enumerate(self._procs):
            if self.router.alive[i] and not p.is_alive() and not self._conns[i].poll():
                self._lost(i, f"exit code {p.exitcode}")
        return outs

    def abort_request(self, request_id: Any) -> None:
        req = self._requests.get(request_id)
        if req is not None:
            self._post(req.owner, ("abort", request_id))

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def metrics(self) -> dict:
        """The replicas' `LLM.metrics` summed (rates recomputed), with ``replicas`` alive,
        ``requeued`` requests and each replica's ``queued_tokens``."""
        out: dict = {}
        for i, m in enumerate(self._metrics):
            if not self.router.alive[i]:
                continue
            for k, v in m.items():
                if isinstance(v, (int, float)) and k != "kv_block_size":
                    out[k] = out.get(k, 0) + v
        if out.get("prompt_tokens"):
            out["prefix_cache_hit_rate"] = out["prefix_cache_hit_tokens"] / out["prompt_tokens"]
        out["replicas"] = sum(self.router.alive)
        out["requeued"] = self.requeued
        out["queued_tokens"] = list(self.router.queued)
        return out

    def replica_metrics(self, i: int) -> dict:
        """Replica i's `LLM.metrics` after its latest step."""
        return dict(self._metrics[i])

    def owner(self, request_id: Any) -> int:
        """The replica an unfinished request runs on."""
        return self._requests[request_id].owner

    def capture_graphs(self, *a, **kw) -> int:
        return 0  # (each replica captures its own at start)

    def close(self) -> None:
        for i in range(len(self._procs)):
            self._post(i, ("stop",))
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- internals -----------------------------------------------------------------------------
    def _ids(self, prompt) -> list[int]:
        """The prompt's token ids as the router sees them ([] when it cannot tell: routed by load)."""
        if isinstance(prompt, str):
            try:
                return self.tokenizer.encode(prompt, add_special_tokens=False)
            except Exception:  # noqa: BLE001 - the replica reports a bad prompt
                return []
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        return []

    def _send(self, rid: Any, req: _Request) -> None:
        r = self.router.choose(req.ids)
        req.owner = r
        self.router.assign(r, req.ids, req.tokens)
        self._post(r, ("add", rid, req.prompt, req.params, req.stream))

    def _post(self, i: int, msg: tuple) -> None:
        if not self.router.alive[i]:
            return
        try:
            self._conns[i].send(msg)
        except (OSError, ValueError):
            self._lost(i, "its pipe closed")

    def _lost(self, i: int, why: str) -> None:
        """Replica i is gone: its unfinished requests go to the others."""
        if not self.router.alive[i]:
            return
        self.router.drop(i)
        if self._procs[i].is_alive():
            self._procs[i].kill()
        if not any(self.router.alive):
            raise RuntimeError(f"every data-parallel replica is gone (replica {i}: {why})")
        for rid, req in list(self._requests.items()):
            if req.owner == i:
                self.requeued += 1
                self._send(rid, req)


def replica_main(engine: type, model: Any, kwargs: dict, conn) -> None:
    """One replica: an ``engine`` (LLM) stepping while it has work, taking requests between steps."""
    try:
        llm = engine(model, **kwargs)  # (on CUDA its graphs are captured as it is built)
        conn.send(("ready", llm.metrics()))
    except BaseException as e:  # noqa: BLE001 - the front says why
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    steps = 0
    try:
        while True:
            busy = llm.has_unfinished_requests()
            if conn.poll(0 if busy else 0.05):
                while conn.poll():
                    msg = conn.recv()
                    if msg[0] == "stop":
                        return
                    if msg[0] == "abort":
                        llm.abort_request(msg[1])
                    else:
                        _, rid, prompt, params, stream = msg
                        llm.add_request(prompt, params, request_id=rid, stream=stream)
                continue
            if busy:
                outs = llm.step()
                steps += 1
                if outs or steps % 8 == 0:  # (the router's view of its free KV blocks, now and then)
                    conn.send(("step", outs, llm.metrics()))
    except (EOFError, OSError):
        return  # the front went away
    except BaseException as e:  # noqa: BLE001
        try:
            conn.send(("failed", f"{type(e).__name__}: {e}"))
        except OSError:
            pass
