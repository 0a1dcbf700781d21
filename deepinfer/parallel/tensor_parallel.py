"""A tensor-parallel model as rank 0 holds it: its own shard, and every call that runs the model
told to the worker ranks first, which run the same call on theirs (deepinfer.parallel.workers).

`ShardedModel` is a `LlamaModel` whose ``forward``, ``decode_static`` and ``new_cache`` announce
themselves; `TPStepGraphs` is the runner's `StepGraphs` whose captures and replays the workers
mirror with graphs of their own (each rank's graph holds its collectives: NCCL captures them).
The engine above (scheduler, masks, sampling, DSpark) sees one model with full logits.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from ..config import ModelConfig
from ..cuda_graphs import StepGraphs
from ..models.kv_cache import DEFAULT_BLOCK_SIZE, KVCache
from ..models.llama import LlamaModel
from .comm import Group
from .sharding import check_tensor_parallel, shard_config, shard_weights
from .workers import Pool, pool, to_device


@dataclasses.dataclass
class ShardSpec:
    """What a rank needs to build its shard: the checkpoint (a path the ranks load themselves,
    or the config and weights sent along) and how to run it."""

    # load_model's argument (a path or None; None too when config/weights are given), or a
    # picklable callable (rank, size) -> (config, that rank's shard): random weights at real
    # shapes, made on each rank (benchmarks)
    source: Any
    size: int  # ranks of the model's group
    dtype: torch.dtype
    max_len: int | None
    deterministic: bool = False
    config: ModelConfig | None = None
    weights: dict | None = None
    experts: Any = None  # expert parallel: deepinfer.parallel.experts.Placement

    def checkpoint(self, rank: int = 0):
        if self.config is not None:
            return self.config, self.weights
        if callable(self.source):
            return self.source(rank, self.size)
        from ..loader import load_model

        loaded = load_model(self.source)
        return loaded.config, loaded.weights

    def build(self, rank: int, group, device, cls=LlamaModel, checkpoint=None) -> LlamaModel:
        config, weights = checkpoint or self.checkpoint(rank)
        comm = Group(rank, self.size, group, self.deterministic)
        if self.experts is not None:
            from .experts import expert_parallel_model

            return expert_parallel_model(cls, config, weights, self, comm, device)
        if not callable(self.source):  # (a callable gives the rank's shard itself)
            weights = shard_weights(config, weights, rank, self.size)
        model = cls(shard_config(config, self.size), weights, dtype=self.dtype, device=device,
                    max_len=self.max_len)  # fmt: skip
        model.logits_width = config.vocab_size
        model.tp = comm
        return model


class ShardedModel(LlamaModel):
    """Rank 0's shard; its calls run on every rank of its group."""

    pool: Pool
    model_id: int
    _muted = False

    @property
    def step_graphs_class(self):
        return TPStepGraphs

    @contextlib.contextmanager
    def muted(self):
        """Calls inside are rank 0's part of a step already announced (a StepGraphs replay)."""
        was, self._muted = self._muted, True
        try:
            yield
        finally:
            self._muted = was

    def new_cache(self, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE) -> KVCache:
        cache = super().new_cache(num_blocks, block_size)
        cache.rank_id = self.pool.new_id(cache)
        self.pool.send("cache", self.model_id, cache.rank_id, num_blocks, block_size)
        return cache

    def forward(self, batch, cache: KVCache, **kw) -> torch.Tensor:
        return self._call("forward", (batch,), cache, kw)

    def decode_static(self, tokens, positions, slots, block_tables, cache: KVCache, **kw) -> torch.Tensor:
        return self._call("decode_static", (tokens, positions, slots, block_tables), cache, kw)

    def _call(self, method: str, args: tuple, cache: KVCache, kw: dict) -> torch.Tensor:
        if not self._muted:
            sent = {k: v for k, v in kw.items() if k != "out"}  # (rank 0's output buffer)
            self.pool.send("call", self.model_id, cache.rank_id, method, to_device(args, "cpu"), sent)
        try:
            return getattr(super(), method)(*args, cache, **kw)
        except RuntimeError as e:  # (a collective's error; a bad input's ValueError passes as it is)
            raise self.pool.failure(e) from e


class TPStepGraphs(StepGraphs):
    """The runner's fixed-shape steps; each capture and replay is told to the workers first."""

    def __init__(self, model: ShardedModel, cache: KVCache, **kw):
        super().__init__(model, cache, **kw)
        self.rank_id = model.pool.new_id(self)
        model.pool.send("graphs", model.model_id, self.rank_id, cache.rank_id, kw)

    def ensure(self, tile) -> bool:
        if tile in self.graphs:
            return False
        if not self.model._muted:
            self.model.pool.send("ensure", self.rank_id, tile)
        with self.model.muted():
            try:
                return super().ensure(tile)
            except RuntimeError as e:
                raise self.model.pool.failure(e) from e

    def run(self, tile, inputs: torch.Tensor) -> torch.Tensor:
        self.model.pool.send("run", self.rank_id, tile, inputs.cpu())
        with self.model.muted():
            try:
                return super().run(tile, inputs)
            except RuntimeError as e:
                raise self.model.pool.failure(e) from e


def tensor_parallel_model(
    source, loaded, size: int, *, dtype: torch.dtype, device: torch.device, max_len: int | None,
    deterministic: bool = False, experts=None,
) -> LlamaModel:  # fmt: skip
    """Rank 0's `ShardedModel` of ``loaded`` (a `LoadedModel`) over ``size`` ranks, the workers'
    shards built beside it. ``source``: what the workers load (load_model's argument); a
    `LoadedModel` given in memory is sent to them instead; a callable (rank, size) -> (config,
    shard) makes each rank's shard itself (``loaded`` unused)."""
    from ..loader.types import LoadedModel

    if callable(source):  # random shards made on each rank
        loaded = None
    elif experts is None:
        check_tensor_parallel(loaded.config, size)
    p = pool(size, device.type)
    gid, group = p.group(list(range(size)))
    in_memory = isinstance(source, LoadedModel)
    spec = ShardSpec(None if in_memory else source, size, dtype, max_len, deterministic, experts=experts)
    mid = p.new_id()
    if in_memory:
        p.send("load", mid, gid, dataclasses.replace(spec, config=loaded.config, weights=loaded.weights))
    else:
        p.send("load", mid, gid, spec)
    try:
        given = None if loaded is None else (loaded.config, loaded.weights)
        model = spec.build(0, group, device, cls=ShardedModel, checkpoint=given)
    except Exception as e:
        raise p.failure(e) from e
    model.pool, model.model_id = p, mid
    p.track(mid, model)
    return model
