"""The worker processes of a tensor- or expert-parallel engine, and how rank 0 drives them.

Rank 0 is the engine process itself (scheduler, masks, sampling). `Pool` spawns ranks 1..N-1
(torch.multiprocessing, ``spawn``) and joins them into one torch.distributed world over
127.0.0.1: NCCL for the model's collectives on CUDA (rank r on ``cuda:r``), gloo on the CPU, and
always a gloo group for control messages. A worker waits for messages, broadcast by rank 0 on
that control group, and runs what each says on its own shard of the model:

    ("group", gid, ranks)                 every rank makes the process group of ``ranks``
    ("load", mid, gid, spec)              the ranks of group gid build their shard of a model
    ("cache", mid, cid, blocks, size)     a KV cache for model mid
    ("call", mid, cid, method, args, kw)  model.forward / decode_static over cache cid
    ("graphs", mid, gid, cid, kw)         a `StepGraphs` over cache cid, mirroring rank 0's
    ("ensure" | "run", gid, tile[, inputs])   a fixed-shape step: captured / replayed together
    ("stop",)

Each message also lists the ids rank 0 has dropped since (models, caches, graphs), which the
workers free. Inputs travel as CPU tensors inside the message; the forward's own collectives
then run on the model group. A worker that fails puts its traceback on an error queue and exits;
rank 0's next collective then fails (a peer's socket closes, or the group's timeout passes), and
`Pool.failure` turns that into an error naming the rank, its exit code and its traceback.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import itertools
import os
import socket
import traceback
import weakref

import torch
import torch.distributed as dist

CONTROL_TIMEOUT = datetime.timedelta(days=30)  # workers wait on the control group while the engine idles
DEFAULT_TIMEOUT = 120.0  # seconds a model collective may wait for a peer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def to_device(obj, device):
    """obj with every tensor inside (tuples, lists, dicts, dataclasses) moved to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(x, device) for x in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj,
            **{f.name: to_device(getattr(obj, f.name), device) for f in dataclasses.fields(obj) if f.init},
        )
    return obj


class WorkerFailed(RuntimeError):
    """A worker rank died or a collective with it failed."""


class Pool:
    """Ranks 1..size-1 as processes, rank 0 this one. One pool a process (torch.distributed has
    one world a process): `pool(n, device_type)` returns it, spawning or growing it as needed;
    models of fewer ranks than the pool use a subgroup of its first ranks."""

    def __init__(self, size: int, device_type: str, *, timeout: float = DEFAULT_TIMEOUT):
        import torch.multiprocessing as mp

        self.size, self.device_type, self.timeout = size, device_type, timeout
        self.backend = "nccl" if device_type == "cuda" else "gloo"
        self.closed = False
        self._ids = itertools.count(1)
        self._live: dict[int, weakref.ref] = {}  # id -> rank 0's object (its death frees the workers')
        ctx = mp.get_context("spawn")
        self.errors = ctx.SimpleQueue()
        port = _free_port()
        self.procs = [
            ctx.Process(
                target=worker_main,
                args=(r, size, port, device_type, timeout, self.errors),
                name=f"deepinfer-rank{r}",
                daemon=True,
            )  # fmt: skip
            for r in range(1, size)
        ]
        for p in self.procs:
            p.start()
        if device_type == "cuda":
            torch.cuda.set_device(0)
        try:
            _init(0, size, port, self.backend, timeout)
            self.control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        except Exception as e:
            self._kill()
            raise self.failure(e) from e

    # -- messages -------------------------------------------------------------------------------
    def new_id(self, obj=None) -> int:
        i = next(self._ids)
        if obj is not None:
            self._live[i] = weakref.ref(obj)
        return i

    def track(self, i: int, obj) -> None:
        """Free the workers' object ``i`` once rank 0's ``obj`` is gone."""
        self._live[i] = weakref.ref(obj)

    def send(self, *msg) -> None:
        """Broadcast one message to every worker (with the ids dropped since the last one)."""
        if self.closed:
            raise WorkerFailed("the tensor-parallel worker pool is shut down")
        dead = [i for i, ref in self._live.items() if ref() is None]
        for i in dead:
            del self._live[i]
        try:
            dist.broadcast_object_list([(dead, *msg)], src=0, group=self.control)
        except Exception as e:
            raise self.failure(e) from e

    def group(self, ranks: list[int]):
        """(id, process group) of ``ranks``, made by every rank of the pool."""
        gid = self.new_id()
        self.send("group", gid, ranks)
        try:
            return gid, dist.new_group(
                ranks, backend=self.backend, timeout=datetime.timedelta(seconds=self.timeout)
            )
        except Exception as e:
            raise self.failure(e) from e

    # -- failures -------------------------------------------------------------------------------
    def failure(self, e: BaseException) -> WorkerFailed:
        """The error to raise for a failed collective: which ranks died, and why."""
        import time

        deadline = time.monotonic() + 2.0  # a dying worker may need a moment to be seen dead
        dead = []
        while True:
            dead = [(r + 1, p) for r, p in enumerate(self.procs) if not p.is_alive()]
            if dead or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        notes = []
        while not self.errors.empty():
            notes.append(self.errors.get())
        if dead:
            self.closed = True
            self._kill()
            said = ", ".join(f"rank {r} (pid {p.pid}, exit code {p.exitcode})" for r, p in dead)
            msg = f"tensor-parallel worker {said} died; the engine cannot continue"
        else:
            msg = f"a collective with the worker ranks failed: {type(e).__name__}: {e}"
        if notes:
            msg += "\n" + "\n".join(notes)
        return WorkerFailed(msg)

    # -- shutdown -------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the workers (killed if they do not stop) and leave the process's world."""
        if not self.closed:
            try:
                self.send("stop")
            except WorkerFailed:
                pass
            self.closed = True
            for p in self.procs:
                p.join(timeout=10)
        self._kill()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a broken world still lets the process go on
                pass

    def _kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)


_POOL: Pool | None = None


def pool(size: int, device_type: str, *, timeout: float = DEFAULT_TIMEOUT) -> Pool:
    """The process's pool with at least ``size`` ranks on ``device_type`` (a new one replaces a
    smaller or broken one)."""
    global _POOL
    if size < 1:
        raise ValueError(f"a pool needs at least one rank, got {size}")
    p = _POOL
    if p is not None and not p.closed and p.size >= size and p.device_type == device_type:
        return p
    if device_type == "cuda" and size > torch.cuda.device_count():
        raise ValueError(
            f"{size} ranks need {size} CUDA devices, this machine has {torch.cuda.device_count()}"
        )
    if p is not None:
        p.shutdown()
    _POOL = Pool(size, device_type, timeout=timeout)
    return _POOL


def shutdown_pool() -> None:
    global _POOL
    if _POOL is not None:
        _POOL.shutdown()
        _POOL = None


atexit.register(shutdown_pool)


def _init(rank: int, size: int, port: int, backend: str, timeout: float) -> None:
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout))  # fmt: skip


# -- a worker rank ---------------------------------------------------------------------------------
def worker_main(rank: int, size: int, port: int, device_type: str, timeout: float, errors) -> None:
    from .. import _threads

    _threads.configure_torch_threads()
    try:
        device = torch.device(f"cuda:{rank}") if device_type == "cuda" else torch.device("cpu")
        if device_type == "cuda":
            torch.cuda.set_device(device)
        _init(rank, size, port, "nccl" if device_type == "cuda" else "gloo", timeout)
        control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
        _serve(rank, device, control, timeout)
    except BaseException:  # noqa: BLE001 - rank 0 learns why
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        os._exit(1)
    os._exit(0)


def _serve(rank: int, device: torch.device, control, timeout: float) -> None:
    from ..cuda_graphs import StepGraphs

    objs: dict[int, object] = {}  # id -> this rank's model, group, cache or StepGraphs
    with torch.inference_mode():
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0, group=control)
            dead, op, *args = box[0]
            for i in dead:
                objs.pop(i, None)
            if op == "stop":
                return
            if op == "group":
                gid, ranks = args
                g = dist.new_group(
                    ranks, backend=dist.get_backend(), timeout=datetime.timedelta(seconds=timeout)
                )
                if rank in ranks:
                    objs[gid] = (ranks, g)
            elif op == "load":
                mid, gid, spec = args
                if gid in objs:
                    ranks, g = objs[gid]
                    objs[mid] = spec.build(ranks.index(rank), g, device)
            elif op == "cache":
                mid, cid, blocks, block_size = args
                if mid in objs:
                    objs[cid] = objs[mid].new_cache(blocks, block_size)
            elif op == "call":
                mid, cid, method, call_args, kw = args
                if mid in objs:
                    getattr(objs[mid], method)(
                        *to_device(call_args, device), objs[cid], **to_device(kw, device)
                    )
            elif op == "graphs":
                mid, gid, cid, kw = args
                if mid in objs:
                    objs[gid] = StepGraphs(objs[mid], objs[cid], **kw)
            elif op == "ensure":
                gid, tile = args
                if gid in objs:
                    objs[gid].ensure(tile)
            elif op == "run":
                gid, tile, inputs = args
                if gid in objs:
                    objs[gid].run(tile, inputs.to(device))
            else:
                raise RuntimeError(f"unknown message {op!r}")
