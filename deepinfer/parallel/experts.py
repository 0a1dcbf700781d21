"""Expert parallel for the mixture-of-experts family: each rank holds some experts (and attention
whole); tokens reach their experts by all-to-all.

Placement (EPLB-style). A calibration run of the whole model counts, per MoE layer, the
(token, slot) pairs the router sends to each expert. Each rank has ``slots`` expert slots, more
than E / ranks, so the spare slots hold replicas: the expert with the most load per replica gets
one more, until the slots are all used; then the replicas, heaviest first, go to the rank with
the least load that has a free slot and no copy of that expert yet. A rank's load is the sum of
its replicas' shares; imbalance is the most loaded rank over the mean, reported before (experts
in order, E / ranks a rank, no replicas) and after.

A forward (`ExpertParallelMoE`), with x the same [N, H] on every rank (attention is replicated):
rank r routes its slice of the tokens; each (token, slot) pair goes to a replica of its expert
(replica ``(token + slot) % copies``); pairs are sorted by the rank holding that replica and
sent there by ``all_to_all_single`` (rows of x and the slot's index); the rank runs its experts
on what it got (`moe_experts_torch` / the Triton grouped matmul) and sends the rows back the same
way; the slice's outputs are weighted and summed over the k slots, and the slices all-gathered.
"""

from __future__ import annotations

import dataclasses

import torch

from ..kernels.moe_experts import moe_experts_torch, moe_experts_triton
from ..models.moe import MoE


@dataclasses.dataclass
class Placement:
    """Per MoE layer (by layer index): ``slots[layer][rank]``, the experts in that rank's slots."""

    ranks: int
    slots: dict[int, list[list[int]]]
    before: dict[int, float]  # imbalance (max rank load / mean) of the plain placement
    after: dict[int, float]

    def report(self) -> str:
        lines = [f"expert placement over {self.ranks} ranks (imbalance = busiest rank's load / mean)"]
        for i in sorted(self.slots):
            lines.append(f"  layer {i}: {self.before[i]:.3f} -> {self.after[i]:.3f}")
        return "\n".join(lines)


def imbalance(rank_loads: list[float]) -> float:
    mean = sum(rank_loads) / len(rank_loads)
    return max(rank_loads) / mean if mean else 1.0


def eplb(load: list[float], ranks: int, slots: int) -> tuple[list[list[int]], float, float]:
    """(experts in each rank's ``slots`` slots, imbalance before, after) for per-expert ``load``."""
    E = len(load)
    if E % ranks:
        raise ValueError(f"expert_parallel_size={ranks} does not divide num_experts={E}")
    if slots * ranks < E or slots > E:
        raise ValueError(f"{slots} slots a rank cannot place {E} experts over {ranks} ranks")
    per = E // ranks
    before = imbalance([sum(load[r * per : (r + 1) * per]) for r in range(ranks)])
    copies = [1] * E
    for _ in range(slots * ranks - E):  # the spare slots: replicas of the hottest per copy
        e = max(range(E), key=lambda x: (load[x] / copies[x], -x))
        copies[e] += 1
    items = sorted(
        ((load[e] / copies[e], e) for e in range(E) for _ in range(copies[e])), key=lambda t: (-t[0], t[1])
    )
    held: list[list[int]] = [[] for _ in range(ranks)]
    rank_load = [0.0] * ranks
    for share, e in items:
        free = [r for r in range(ranks) if len(held[r]) < slots]
        fresh = [r for r in free if e not in held[r]] or free
        r = min(fresh, key=lambda r: (rank_load[r], r))
        held[r].append(e)
        rank_load[r] += share
    return held, before, imbalance(rank_load)


def calibrate(loaded, prompts: list[list[int]] | None = None) -> dict[int, list[float]]:
    """Per MoE layer, the (token, slot) pairs routed to each expert over ``prompts`` (default: 8
    seeded random prompts of 64 tokens), the whole model run once on the CPU in float32."""
    from ..models.llama import LlamaModel

    c = loaded.config
    if prompts is None:
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(
            0, c.vocab_size, (8, min(64, c.max_position_embeddings)), generator=g
        ).tolist()
    model = LlamaModel(c, loaded.weights)
    counts: dict[int, torch.Tensor] = {}
    for i, layer in enumerate(model.layers):
        if layer.moe is not None:
            counts[i] = torch.zeros(c.num_experts, dtype=torch.int64)

            def counting(x, wgu, wd, w, ids, act, i=i):
                counts[i] += torch.bincount(ids.reshape(-1), minlength=c.num_experts)
                return moe_experts_torch(x, wgu, wd, w, ids, act)

            layer.moe.experts = counting
    model.logits(prompts)
    return {i: v.double().tolist() for i, v in counts.items()}


def plan_experts(loaded, ranks: int, *, slots: int | None = None, prompts=None) -> Placement:
    """The placement of ``loaded``'s experts over ``ranks`` from a calibration run (one spare slot
    a rank unless ``slots`` says otherwise)."""
    c = loaded.config
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"expert_parallel_size must be an integer >= 1, got {ranks!r}")
    if not c.num_experts:
        raise ValueError(f"expert_parallel_size={ranks}: {c.architecture} has no experts")
    if c.num_experts % ranks:
        raise ValueError(f"expert_parallel_size={ranks} does not divide num_experts={c.num_experts}")
    slots = slots or min(c.num_experts, c.num_experts // ranks + 1)
    if slots < c.num_experts_per_tok:
        slots = c.num_experts_per_tok
    loads = calibrate(loaded, prompts)
    placed, before, after = {}, {}, {}
    for i, load in loads.items():
        placed[i], before[i], after[i] = eplb(load, ranks, slots)
    return Placement(ranks, placed, before, after)


class ExpertParallelMoE:
    """A MoE layer whose experts are spread over the ranks of ``comm`` (see the module docstring)."""

    def __init__(self, moe: MoE, held: list[list[int]], comm) -> None:
        self.moe, self.comm = moe, comm  # moe: the router and this rank's slots' experts
        E = moe.router.shape[1]
        replicas = [
            [(r, s) for r in range(len(held)) for s, e in enumerate(held[r]) if e == x] for x in range(E)
        ]
        n = max(len(x) for x in replicas)
        dev = moe.router.device
        self.copies = torch.tensor([len(x) for x in replicas], dtype=torch.int64, device=dev)
        # [E, most copies]: the rank and slot of each replica (padded by repeating the first)
        self.rank_of = torch.tensor([[x[j % len(x)][0] for j in range(n)] for x in replicas], device=dev)
        self.slot_of = torch.tensor([[x[j % len(x)][1] for j in range(n)] for x in replicas], device=dev)

    def __call__(self, x: torch.Tensor, mm) -> torch.Tensor:
        comm, N = self.comm, x.shape[0]
        bounds = [N * r // comm.size for r in range(comm.size + 1)]
        lo, hi = bounds[comm.rank], bounds[comm.rank + 1]
        weights, ids = self.moe.route(x[lo:hi], mm)  # [n, k]
        n, k = ids.shape
        token = torch.arange(lo, hi, device=x.device).unsqueeze(1)
        pick = (token + torch.arange(k, device=x.device)) % self.copies[ids]  # which replica
        dest = self.rank_of[ids, pick].reshape(-1)
        slot = self.slot_of[ids, pick].reshape(-1)
        order = torch.argsort(dest, stable=True)
        send = torch.bincount(dest, minlength=comm.size)
        recv = torch.empty_like(send)
        torch.distributed.all_to_all_single(recv, send, group=comm.group)
        send, recv = send.tolist(), recv.tolist()
        rows = comm.all_to_all(x[lo:hi][order // k], send, recv)
        got_slot = comm.all_to_all(slot[order], send, recv)
        experts = self.moe.experts or (moe_experts_triton if x.device.type == "cuda" else moe_experts_torch)
        ones = torch.ones(len(rows), 1, dtype=x.dtype, device=x.device)
        done = experts(rows, self.moe.w_gate_up, self.moe.w_down, ones, got_slot.unsqueeze(1), self.moe.act)
        back = comm.all_to_all(done, recv, send)  # [n k, H] in `order`
        pairs = torch.empty_like(back)
        pairs[order] = back
        y = (pairs.view(n, k, -1) * weights.unsqueeze(-1)).sum(1)  # [n, H]
        width = max(b - a for a, b in zip(bounds, bounds[1:]))
        padded = torch.zeros(width, x.shape[1], dtype=y.dtype, device=y.device)
        padded[:n] = y
        parts = comm.all_gather(padded)
        return torch.cat([p[: b - a] for p, a, b in zip(parts, bounds, bounds[1:])])


def expert_parallel_model(cls, config, weights: dict, spec, comm, device):
    """Rank ``comm.rank``'s model: attention and routers whole, the experts of its slots only."""
    placement: Placement = spec.experts
    slots = {i: held[comm.rank] for i, held in placement.slots.items()}
    S = len(next(iter(slots.values())))
    prefix = "model." if any(k.startswith("model.") for k in weights) else ""
    local = {k: v for k, v in weights.items() if ".mlp.experts." not in k}
    for i, held in slots.items():
        for s, e in enumerate(held):
            for x in ("gate", "up", "down"):
                local[f"{prefix}layers.{i}.mlp.experts.{s}.{x}_proj.weight"] = weights[
                    f"{prefix}layers.{i}.mlp.experts.{e}.{x}_proj.weight"
                ]
    model = cls(dataclasses.replace(config, num_experts=S), local, dtype=spec.dtype, device=device,
                max_len=spec.max_len)  # fmt: skip
    for i, layer in enumerate(model.layers):
        if layer.moe is not None:
            layer.moe = ExpertParallelMoE(layer.moe, placement.slots[i], comm)
    model.expert_placement = placement
    model.eager_only = True  # the all-to-all sizes are read on the host: no CUDA graph captures it
    return model
