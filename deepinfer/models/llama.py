"""Llama-family decoder (Llama 2/3, SmolLM, Mistral, Qwen2) as plain tensors + functional ops.

Weights are fused at load time (q|k|v into one matrix, gate|up into one) so a layer is six
matmuls and one attention call; the per-layer loop body touches only local tensors.

Two forward passes:
- `forward(ForwardBatch)`: any shapes (prefill, eager decode); attends over exactly the keys needed.
- `decode_static(...)`: one token per row with shapes fixed by (rows, kv_len) alone, so a CUDA graph
  can capture it and a batch-invariant (deterministic) decode can run it in fixed tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..kernels.decode_attention import ATTN_CHUNK, decode_attention_torch
from ..kernels.paged_attention import paged_attention_torch, paged_attention_triton, paged_prefill_triton
from .kv_cache import DEFAULT_BLOCK_SIZE, KVCache

DECODE_ATTENTION = ("sdpa", "torch", "triton", "rows")


@dataclass
class ForwardBatch:
    """One forward pass over N tokens of B sequences, flat (no padding): sequence b's tokens are
    rows ``query_start[b] .. query_start[b+1]`` (its newest ones, at consecutive positions), and
    its keys are positions ``[0, seq_lens[b])`` of its blocks (earlier ones cached, the new ones
    written by this forward first).

    tokens, positions, slots, seq_ids: [N] int64 (slots: where each token's K/V is written,
                  ``block * block_size + offset``; seq_ids: the sequence (row of block_tables))
    block_tables: [B, W] int32, each sequence's blocks (0, the null block, past its own)
    query_start, seq_lens: host lists (B + 1 and B ints)
    logits_index: [M] int64, the tokens whose logits are wanted, or None for every token
    per_row:      torch attention one sequence at a time (batch-invariant: deterministic mode)
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    seq_ids: torch.Tensor
    block_tables: torch.Tensor
    query_start: list[int]
    seq_lens: list[int]
    logits_index: torch.Tensor | None = None
    per_row: bool = False

    @classmethod
    def of_chunks(
        cls,
        to,
        tables: list[list[int]],
        starts: list[int],
        chunks: list[list[int]],
        block_size: int,
        *,
        logits: str = "last",
        per_row: bool = False,
    ) -> ForwardBatch:
        """Sequence b feeds ``chunks[b]`` at positions ``starts[b]..``, through its block table
        ``tables[b]`` (covering those positions). ``logits``: "last" (each chunk's last token)
        or "all". ``to`` moves a host int list (or list of lists) to the device as int64."""
        tokens, positions, slots, seq_ids, query_start = [], [], [], [], [0]
        for b, (t, p0, c) in enumerate(zip(tables, starts, chunks)):
            for p in range(p0, p0 + len(c)):
                slots.append(t[p // block_size] * block_size + p % block_size)
            tokens += c
            positions += range(p0, p0 + len(c))
            seq_ids += [b] * len(c)
            query_start.append(len(tokens))
        W = max(len(t) for t in tables)
        seq_lens = [p0 + len(c) for p0, c in zip(starts, chunks)]
        return cls(
            tokens=to(tokens),
            positions=to(positions),
            slots=to(slots),
            seq_ids=to(seq_ids),
            block_tables=to([t + [0] * (W - len(t)) for t in tables]).to(torch.int32),
            query_start=query_start,
            seq_lens=seq_lens,
            logits_index=to([q - 1 for q in query_start[1:]]) if logits == "last" else None,
            per_row=per_row,
        )


@dataclass
class _Layer:
    """Matrices are stored transposed, [in, out], for `x @ w`: on CPU that ran 1.4x faster than
    F.linear's [out, in] at batch 1 (float32, 1 thread, weights beyond the caches)."""

    ln1: torch.Tensor  # [H]
    wqkv: torch.Tensor  # [H, (nh + 2 nkv) hd]
    bqkv: torch.Tensor | None
    wo: torch.Tensor  # [nh hd, H]
    ln2: torch.Tensor  # [H]
    wgu: torch.Tensor  # [H, 2 I]
    wd: torch.Tensor  # [I, H]


def rope_inv_freq(config: ModelConfig, freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    """inv_freq [head_dim / 2] float32, with linear or llama3 scaling as transformers computes it."""
    dim = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = config.rope_scaling
    kind = (s or {}).get("rope_type", (s or {}).get("type", "default"))
    if kind == "linear":
        inv = inv / float(s["factor"])
    elif kind == "llama3":
        factor, lo, hi = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old_len = float(s["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / lo, inv / factor, inv)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / hi) & ~(wavelen > old_len / lo)
        inv = torch.where(medium, smoothed, scaled)
    if freq_factors is not None:  # GGUF's rope_freqs.weight (llama3 scaling baked as divisors)
        inv = inv / freq_factors.float()
    return inv


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _ops(invariant: bool, eps: float):
    """(matmul, rms_norm) of a forward: torch's, or the batch-invariant Triton kernels of
    deepinfer.kernels.invariant (a row's bits do not depend on the other rows)."""
    if invariant:
        from ..kernels import invariant as bi

        return bi.matmul, lambda x, w: bi.rms_norm(x, w, eps)
    return torch.matmul, lambda x, w: F.rms_norm(x, (x.shape[-1],), w, eps)


def _qkv(h: torch.Tensor, layer: _Layer, mm, invariant: bool) -> torch.Tensor:
    if layer.bqkv is None:
        return mm(h, layer.wqkv)
    if invariant:
        return mm(h, layer.wqkv) + layer.bqkv
    return torch.addmm(layer.bqkv, h.reshape(-1, h.shape[-1]), layer.wqkv)


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_len: int | None = None,
    ):
        self.config = c = config
        self.dtype = dtype
        self.device = torch.device(device)
        w = {k.removeprefix("model.") if k.startswith("model.") else k: v for k, v in weights.items()}

        def take(name: str) -> torch.Tensor:
            if name not in w:
                raise ValueError(f"checkpoint lacks weight {name!r}")
            return w[name].to(device=self.device, dtype=dtype)

        def opt(name: str) -> torch.Tensor | None:
            return take(name) if name in w else None

        self.embed = take("embed_tokens.weight")  # [V, H]
        head = self.embed if c.tie_word_embeddings or "lm_head.weight" not in w else take("lm_head.weight")
        self.lm_head = head.t().contiguous()  # [H, V]
        self.norm = take("norm.weight")
        self.layers: list[_Layer] = []
        for i in range(c.num_layers):
            p = f"layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            biases = [opt(a + f"{x}_proj.bias") for x in "qkv"]
            if any(b is not None for b in biases) and not all(b is not None for b in biases):
                raise ValueError(f"layer {i}: q/k/v biases must be all present or all absent")
            self.layers.append(
                _Layer(
                    ln1=take(p + "input_layernorm.weight"),
                    wqkv=torch.cat([take(a + f"{x}_proj.weight") for x in "qkv"]).t().contiguous(),
                    bqkv=torch.cat(biases) if biases[0] is not None else None,
                    wo=take(a + "o_proj.weight").t().contiguous(),
                    ln2=take(p + "post_attention_layernorm.weight"),
                    wgu=torch.cat([take(m + "gate_proj.weight"), take(m + "up_proj.weight")])
                    .t()
                    .contiguous(),
                    wd=take(m + "down_proj.weight").t().contiguous(),
                )
            )
        self.max_len = max_len or c.max_position_embeddings
        inv = rope_inv_freq(c, w.get("rope_freqs"))
        # The tables run to a whole number of attention chunks (a deterministic cache's length).
        table_len = -(-self.max_len // ATTN_CHUNK) * ATTN_CHUNK
        freqs = torch.outer(torch.arange(table_len, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_len, hd]
        self.cos = emb.cos().to(self.device, dtype)
        self.sin = emb.sin().to(self.device, dtype)

    def new_cache(self, num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE) -> KVCache:
        """A paged cache of ``num_blocks`` blocks (block 0, the null block, included)."""
        c = self.config
        return KVCache(c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim, dtype=self.dtype,
                       device=self.device)  # fmt: skip

    def block_bytes(self, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
        """Bytes of one KV block (every layer's K and V)."""
        c = self.config
        return KVCache.bytes_per_block(c.num_layers, block_size, c.num_kv_heads, c.head_dim, self.dtype)

    @torch.inference_mode()
    def logits(self, prompts: list[list[int]], *, block_size: int = DEFAULT_BLOCK_SIZE) -> list[torch.Tensor]:
        """Every position's logits (float32 [len(p), V]) of each prompt, prefilled together in a
        cache of their own (no engine needed: checks against other implementations)."""
        tables, n = [], 1
        for p in prompts:
            k = -(-len(p) // block_size)
            tables.append(list(range(n, n + k)))
            n += k
        batch = ForwardBatch.of_chunks(
            lambda x: torch.tensor(x, dtype=torch.int64, device=self.device),
            tables, [0] * len(prompts), [list(p) for p in prompts], block_size, logits="all",
        )  # fmt: skip
        out = self.forward(batch, self.new_cache(n, block_size))
        return list(out.split([len(p) for p in prompts]))

    @torch.inference_mode()
    def forward(
        self, batch: ForwardBatch, cache: KVCache, *, invariant: bool = False, attention: str = "torch"
    ) -> torch.Tensor:
        """Logits float32 [M, V] of the tokens at ``batch.logits_index`` (M of them), or of every
        token ([N, V]) when it is None.

        attention: "torch" (``paged_attention_torch``: one batched call for the one-token rows,
        one per longer chunk), "triton" (``paged_attention_triton``: one program per token and
        KV head) or "prefill" (``paged_prefill_triton``: one program per tile of a sequence's
        query tokens, each key block read once a tile; for prompt chunks on CUDA).
        invariant: matmuls and norms through deepinfer.kernels.invariant and the per-token
        Triton attention: each token's result is the same bits whatever else is in the batch
        (deterministic mode on CUDA)."""
        c = self.config
        N = batch.tokens.shape[0]
        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        g, nqk = nh // nkv, nh + nkv
        if max(batch.seq_lens) > cache.block_size * batch.block_tables.shape[1]:
            raise ValueError(f"sequence length {max(batch.seq_lens)} exceeds its block table")
        x = F.embedding(batch.tokens, self.embed)  # [N, H]
        cos = self.cos[batch.positions].unsqueeze(1)  # [N, 1, hd]
        sin = self.sin[batch.positions].unsqueeze(1)
        mm, norm = _ops(invariant, c.rms_norm_eps)
        if invariant:
            attention = "triton"
        if attention == "prefill":  # the query-tiled kernel reads the varlen layout on the device
            max_q = max(b - a for a, b in zip(batch.query_start, batch.query_start[1:]))
            query_start, seq_lens = (
                torch.tensor(x, dtype=torch.int64).to(self.device, non_blocking=True)
                for x in (batch.query_start, batch.seq_lens)
            )
        for i, layer in enumerate(self.layers):
            h = norm(x, layer.ln1)
            qkv = _qkv(h, layer, mm, invariant).view(N, nqk + nkv, hd)  # heads: nh q, nkv k, nkv v
            qk = qkv[:, :nqk]
            qk = qk * cos + _rotate_half(qk) * sin  # RoPE on q and k heads in one go
            kf, vf = cache.flat(i)
            kf.index_copy_(0, batch.slots, qk[:, nh:])
            vf.index_copy_(0, batch.slots, qkv[:, nqk:])
            q = qk[:, :nh].reshape(N, nkv, g, hd)
            if attention == "triton":
                o = paged_attention_triton(q, cache.k[i], cache.v[i], batch.block_tables, batch.seq_ids,
                                           batch.positions)  # fmt: skip
            elif attention == "prefill":
                o = paged_prefill_triton(q, cache.k[i], cache.v[i], batch.block_tables, query_start, seq_lens,
                                         max_q)  # fmt: skip
            else:
                o = paged_attention_torch(q, cache.k[i], cache.v[i], batch.block_tables, batch.query_start,
                                          batch.seq_lens, per_row=batch.per_row)  # fmt: skip
            x = x + mm(o.reshape(N, nh * hd), layer.wo)
            h = norm(x, layer.ln2)
            gate, up = mm(h, layer.wgu).chunk(2, dim=-1)
            x = x + mm(F.silu(gate) * up, layer.wd)
        if batch.logits_index is not None:
            x = x[batch.logits_index]
        x = norm(x, self.norm)
        return mm(x, self.lm_head).float()

    @torch.inference_mode()
    def decode_static(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        block_tables: torch.Tensor,
        cache: KVCache,
        *,
        kv_len: int,
        attention: str = "sdpa",
        out: torch.Tensor | None = None,
        invariant: bool = False,
    ) -> torch.Tensor:
        """T new tokens per row (T = 1: decode; T > 1: DSpark's verify forward), shapes fixed by
        (R, T, block_tables' width) alone: logits float32 [R, V] for 1-D inputs, [R, T, V] for
        2-D ones (written into ``out``, a float32 tensor of that shape, when given).

        Row r writes its new K/V at ``slots[r, t]`` (a slot of its own blocks, or of the null
        block for a padding row or position) and its query t attends to keys [0, positions[r, t]]
        of its blocks ``block_tables[r]``. No host sync, no data-dependent shapes: capturable in
        a CUDA graph.

        tokens, positions, slots: [R] or [R, T] int64 on the model's device; block_tables:
        [R, W] int32 (W * block_size >= kv_len).
        attention: "triton" (paged, one program per token and KV head; each row's length read on
        the device; batch-invariant), "sdpa" (the rows' first kv_len keys gathered, torch SDPA
        with a length mask), for T = 1 "torch" (gathered keys in fixed 256-key blocks; kv_len a
        multiple of 256; batch-invariant) or "rows" (CPU: one SDPA call per row over its own
        keys, the lengths read on the host; batch-invariant).
        invariant: matmuls and norms through deepinfer.kernels.invariant with attention="triton":
        a row's logits are then the same bits at any R and any row.
        """
        c = self.config
        one = tokens.dim() == 1
        if one:
            tokens, positions, slots = tokens[:, None], positions[:, None], slots[:, None]
        R, T = tokens.shape
        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        g, nqk, eps, bs = nh // nkv, nh + nkv, c.rms_norm_eps, cache.block_size
        if attention not in DECODE_ATTENTION:
            raise ValueError(f"attention must be one of {DECODE_ATTENTION}, got {attention!r}")
        if attention in ("torch", "rows") and T > 1:
            raise ValueError(f"attention={attention!r} decodes one token a row, got {T}")
        if attention in ("sdpa", "torch") and kv_len > bs * block_tables.shape[1]:
            raise ValueError(
                f"kv_len {kv_len} exceeds the block tables' {bs * block_tables.shape[1]} positions"
            )
        if attention == "torch" and kv_len % ATTN_CHUNK:
            raise ValueError(f"attention='torch' needs kv_len a multiple of {ATTN_CHUNK}, got {kv_len}")
        if attention == "rows" and tokens.device.type != "cpu":
            raise ValueError("attention='rows' reads the rows' lengths on the host: CPU only")
        if invariant and attention != "triton":
            raise ValueError(f"invariant=True needs attention='triton' (batch-invariant), got {attention!r}")
        mm, norm = _ops(invariant, eps)
        N = R * T
        x = F.embedding(tokens.reshape(N), self.embed)  # [N, H], row-major (row, position)
        flat_pos, flat_slots = positions.reshape(N), slots.reshape(N)
        cos = self.cos[flat_pos].unsqueeze(1)  # [N, 1, hd]
        sin = self.sin[flat_pos].unsqueeze(1)
        seq_ids = bias = visible = None
        if attention == "triton":
            seq_ids = torch.arange(R, device=tokens.device).repeat_interleave(T)
        elif attention == "rows":
            lengths = (positions[:, 0] + 1).tolist()
            starts = list(range(R + 1))
        else:
            nb = -(-kv_len // bs)
            tables = block_tables[:, :nb].long()
            visible = torch.arange(kv_len, device=tokens.device) <= positions.unsqueeze(2)  # [R, T, kv_len]
            if attention == "sdpa":  # additive mask, one row per (row, query): [R, 1, g*T or 1, kv_len]
                zero = torch.zeros((), dtype=self.dtype, device=tokens.device)
                bias = torch.where(visible, zero, float("-inf")).view(R, 1, T, kv_len)
                if T > 1:  # queries are (head in group, position) pairs, position fastest
                    bias = bias.repeat(1, 1, g, 1)
            visible = visible[:, 0]  # [R, kv_len], as the "torch" attention takes it
        for i, layer in enumerate(self.layers):
            h = norm(x, layer.ln1)
            qkv = _qkv(h, layer, mm, invariant).view(N, nqk + nkv, hd)
            qk = qkv[:, :nqk]
            qk = qk * cos + _rotate_half(qk) * sin
            kf, vf = cache.flat(i)
            kf.index_copy_(0, flat_slots, qk[:, nh:])
            vf.index_copy_(0, flat_slots, qkv[:, nqk:])
            kc, vc = cache.k[i], cache.v[i]  # [blocks, bs, nkv, hd]
            if attention == "triton":
                q = qk[:, :nh].reshape(N, nkv, g, hd)
                o = paged_attention_triton(q, kc, vc, block_tables, seq_ids, flat_pos).reshape(N, nh * hd)
            elif attention == "rows":
                q = qk[:, :nh].reshape(N, nkv, g, hd)
                o = paged_attention_torch(q, kc, vc, block_tables, starts, lengths, per_row=True)
                o = o.reshape(N, nh * hd)
            else:
                keys = kc[tables].view(R, nb * bs, nkv, hd)[:, :kv_len].transpose(1, 2)  # [R, nkv, L, hd]
                values = vc[tables].view(R, nb * bs, nkv, hd)[:, :kv_len].transpose(1, 2)
                # GQA: the g query heads of a KV group (x T positions) act as g*T queries of one
                # head (each row's mask per position), so no K/V is repeated. q: [R, nkv, g*T, hd]
                q = qk[:, :nh].reshape(R, T, nkv, g, hd).permute(0, 2, 3, 1, 4).reshape(R, nkv, g * T, hd)
                if attention == "torch":
                    o = decode_attention_torch(q, keys, values, visible)
                else:
                    o = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)
                o = o.reshape(R, nkv, g, T, hd).permute(0, 3, 1, 2, 4).reshape(N, nh * hd)
            x = x + mm(o, layer.wo)
            h = norm(x, layer.ln2)
            gate, up = mm(h, layer.wgu).chunk(2, dim=-1)
            x = x + mm(F.silu(gate) * up, layer.wd)
        x = norm(x, self.norm)
        if not one:
            x = x.view(R, T, -1)
        if out is not None:
            return out.copy_(mm(x, self.lm_head))
        return mm(x, self.lm_head).float()
