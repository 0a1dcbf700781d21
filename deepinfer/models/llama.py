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
from ..kernels.decode_attention import (
    ATTN_CHUNK,
    decode_attention_rows,
    decode_attention_torch,
    decode_attention_triton,
)
from .kv_cache import KVCache

DECODE_ATTENTION = ("sdpa", "torch", "triton", "rows")


@dataclass
class ForwardBatch:
    """One forward pass over B rows of T tokens each (right-padded when ragged).

    tokens:       [B, T] int64
    positions:    [B, T] int64, position of each token in its sequence (padding continues on)
    slots:        [B]    int64, KV-cache slot of each row
    kv_len:       keys attended = cache positions [0, kv_len); kv_len = max(positions) + 1
    slot_start:   when slots == range(slot_start, slot_start + B), the cache is sliced, not gathered
    logits_index: [B] int64 index along T of the token whose logits are wanted, or None for all T
    from_zero:    every row's positions are 0..T-1 (a fresh, right-padded prefill). Padded
                  queries come after a row's real ones, so the causal mask is exact.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    kv_len: int
    slot_start: int | None = None
    logits_index: torch.Tensor | None = None
    from_zero: bool = False  # every row's positions are 0..T-1 (fresh prefill): causal, no mask

    @classmethod
    def of_rows(
        cls,
        to,
        slots: list[int],
        tokens: list[list[int]],
        positions: list[list[int]],
        *,
        logits_index: list[int] | None = None,
        from_zero: bool = False,
    ) -> ForwardBatch:
        """A batch from host lists; ``to`` moves an int list to the device as int64."""
        contiguous = slots == list(range(slots[0], slots[0] + len(slots)))
        return cls(
            tokens=to(tokens),
            positions=to(positions),
            slots=to(slots),
            kv_len=max(p[-1] for p in positions) + 1,
            slot_start=slots[0] if contiguous else None,
            logits_index=to(logits_index) if logits_index is not None else None,
            from_zero=from_zero,
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

    def new_cache(
        self, num_slots: int, max_len: int, *, spare_slots: int = 0, len_multiple: int = 1
    ) -> KVCache:
        """A cache of `num_slots` usable slots (+ `spare_slots` the runner pads with, the last one
        a scratch row that padding writes into) and max_len positions, capped at the model's and
        rounded up to `len_multiple`."""
        c = self.config
        n = -(-min(max_len, self.max_len) // len_multiple) * len_multiple
        return KVCache(
            c.num_layers,
            num_slots,
            c.num_kv_heads,
            min(n, self.cos.shape[0]),
            c.head_dim,
            spare_slots=spare_slots,
            dtype=self.dtype,
            device=self.device,
        )

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: KVCache, *, invariant: bool = False) -> torch.Tensor:
        """Logits float32: [B, V] at `batch.logits_index`, or [B, T, V] when it is None.

        invariant: matmuls and norms through deepinfer.kernels.invariant and attention through the
        Triton decode kernel with one row per token (its slot, its position): each token's
        result is the same bits whatever else is in the batch and however it is padded
        (deterministic mode's batched prefill)."""
        c = self.config
        tokens, pos = batch.tokens, batch.positions
        B, T = tokens.shape
        nh, nkv, hd, L = c.num_heads, c.num_kv_heads, c.head_dim, batch.kv_len
        if L > cache.max_len:
            raise ValueError(f"sequence length {L} exceeds the KV cache ({cache.max_len} positions)")

        x = F.embedding(tokens, self.embed)  # [B, T, H]
        cos = self.cos[pos].unsqueeze(2)  # [B, T, 1, hd]
        sin = self.sin[pos].unsqueeze(2)
        # mask[b, 0, t, j]: key position j is visible to query (b, t) iff j <= pos[b, t]
        causal = False
        if invariant or (B == 1 and T == 1):
            mask = None  # each row reads its own keys / the single query sees all L = pos + 1 keys
        elif batch.from_zero and T == L:
            mask, causal = None, True  # every row is positions 0..T-1: the plain causal mask
        else:
            key_pos = torch.arange(L, device=tokens.device)
            mask = (key_pos.view(1, 1, L) <= pos.unsqueeze(-1)).unsqueeze(1)  # [B, 1, T, L]
        slot_idx = batch.slots.view(B, 1)
        s0 = batch.slot_start
        eps = c.rms_norm_eps
        nqk = nh + nkv
        mm, norm = _ops(invariant, eps)
        if invariant:  # attention rows: one per token, with its sequence's slot and its position
            row_slots, row_pos = slot_idx.expand(B, T).contiguous().view(-1), pos.reshape(-1)

        for i, layer in enumerate(self.layers):
            h = norm(x, layer.ln1)
            qkv = _qkv(h, layer, mm, invariant).view(
                B, T, nqk + nkv, hd
            )  # heads: nh of q, nkv of k, nkv of v
            qk = qkv[:, :, :nqk]
            qk = qk * cos + _rotate_half(qk) * sin  # RoPE on q and k heads in one go
            kc, vc = cache.k[i], cache.v[i]  # [S, nkv, max_len, hd]
            kc[slot_idx, :, pos] = qk[:, :, nh:]  # [B, T, nkv, hd] at (slot, :, pos)
            vc[slot_idx, :, pos] = qkv[:, :, nqk:]
            if invariant:
                qr = qk[:, :, :nh].reshape(B * T, nkv, nh // nkv, hd)
                o = decode_attention_triton(qr, kc, vc, row_pos, slots=row_slots).view(B, T, nh * hd)
            else:
                if s0 is not None:
                    keys, values = kc[s0 : s0 + B, :, :L], vc[s0 : s0 + B, :, :L]
                else:
                    keys, values = kc[batch.slots, :, :L], vc[batch.slots, :, :L]
                q = qk[:, :, :nh].transpose(1, 2)  # [B, nh, T, hd]
                o = (
                    F.scaled_dot_product_attention(
                        q, keys, values, attn_mask=mask, is_causal=causal, enable_gqa=nkv != nh
                    )
                    .transpose(1, 2)
                    .reshape(B, T, nh * hd)
                )
            x = x + mm(o, layer.wo)
            h = norm(x, layer.ln2)
            g, u = mm(h, layer.wgu).chunk(2, dim=-1)
            x = x + mm(F.silu(g) * u, layer.wd)

        if batch.logits_index is not None:
            x = x[torch.arange(B, device=x.device), batch.logits_index]  # [B, H]
        x = norm(x, self.norm)
        return mm(x, self.lm_head).float()

    @torch.inference_mode()
    def decode_static(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        write_slots: torch.Tensor,
        cache: KVCache,
        *,
        slot_start: int,
        kv_len: int,
        attention: str = "sdpa",
        out: torch.Tensor | None = None,
        invariant: bool = False,
    ) -> torch.Tensor:
        """T new tokens per row (T = 1: decode; T > 1: DSpark's verify forward), shapes fixed by
        (B, T, kv_len): logits float32 [B, V] for 1-D inputs, [B, T, V] for 2-D ones (written
        into ``out``, a float32 tensor of that shape, when given).

        Row b is cache slot `slot_start + b` (slot-major: keys are a slice, never a gather); it
        writes its new K/V at (write_slots[b], positions[b, t]) -- its own slot, or the scratch
        slot for a padding row -- and its query t attends to keys [0, positions[b, t]] of its
        slot. No host sync, no data-dependent shapes: capturable in a CUDA graph.

        tokens, positions: [B] or [B, T] int64 on the model's device; write_slots: [B].
        attention: "sdpa" (torch SDPA over kv_len >= max(positions) + 1 keys with a length mask),
        or, for T = 1, a batch-invariant one from decode_attention.py: "torch" (fixed 256-key
        blocks; kv_len a multiple of 256), "triton" (reads each row's length on the device;
        kv_len unused) or "rows" (CPU: one SDPA call per decoded row over its own keys, the
        lengths read on the host; padding rows, which write the scratch slot, are skipped).
        invariant: matmuls and norms through deepinfer.kernels.invariant (Triton kernels whose per-row
        arithmetic does not depend on B) with attention="triton": a row's logits are then the
        same bits at any B and any row (deterministic mode on CUDA, no fixed tiles needed).
        """
        c = self.config
        one = tokens.dim() == 1
        if one:
            tokens, positions = tokens[:, None], positions[:, None]
        B, T = tokens.shape
        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        g, nqk, eps, s0 = nh // nkv, nh + nkv, c.rms_norm_eps, slot_start
        if attention not in DECODE_ATTENTION:
            raise ValueError(f"attention must be one of {DECODE_ATTENTION}, got {attention!r}")
        if attention != "sdpa" and T > 1:
            raise ValueError(f"attention={attention!r} decodes one token a row, got {T}")
        if kv_len > cache.max_len or s0 + B > cache.k.shape[1]:
            raise ValueError(f"decode of slots [{s0}, {s0 + B}) x {kv_len} keys exceeds the KV cache")
        if attention == "torch" and kv_len % ATTN_CHUNK:
            raise ValueError(f"attention='torch' needs kv_len a multiple of {ATTN_CHUNK}, got {kv_len}")
        if attention == "rows" and tokens.device.type != "cpu":
            raise ValueError("attention='rows' reads the rows' lengths on the host: CPU only")
        if invariant and attention != "triton":
            raise ValueError(f"invariant=True needs attention='triton' (batch-invariant), got {attention!r}")
        mm, norm = _ops(invariant, eps)

        x = F.embedding(tokens, self.embed)  # [B, T, H]
        cos = self.cos[positions].unsqueeze(2)  # [B, T, 1, hd]
        sin = self.sin[positions].unsqueeze(2)
        visible = bias = lengths = None
        if attention == "rows":  # decoded rows write their own slot; padding rows the scratch one
            lengths = [
                p + 1 if w == s0 + b else None
                for b, (p, w) in enumerate(zip(positions[:, 0].tolist(), write_slots.tolist()))
            ]
        elif attention != "triton":  # the kernel reads each row's length itself
            visible = torch.arange(kv_len, device=tokens.device) <= positions.unsqueeze(2)  # [B, T, kv_len]
        if attention == "sdpa":  # additive mask, one row per (batch row, query): [B, 1, g*T or 1, kv_len]
            zero = torch.zeros((), dtype=self.dtype, device=tokens.device)
            bias = torch.where(visible, zero, float("-inf")).view(B, 1, T, kv_len)
            if T > 1:  # queries are (head in group, position) pairs, position fastest
                bias = bias.repeat(1, 1, g, 1)
        if one and visible is not None:
            visible = visible[:, 0]  # [B, kv_len], as the "torch" attention takes it
        write = write_slots.view(B, 1)
        for i, layer in enumerate(self.layers):
            h = norm(x, layer.ln1)
            qkv = _qkv(h, layer, mm, invariant).view(
                B, T, nqk + nkv, hd
            )  # heads: nh of q, nkv of k, nkv of v
            qk = qkv[:, :, :nqk]
            qk = qk * cos + _rotate_half(qk) * sin
            kc, vc = cache.k[i], cache.v[i]  # [S, nkv, max_len, hd]
            kc[write, :, positions] = qk[:, :, nh:]  # [B, T, nkv, hd] at (slot, :, pos)
            vc[write, :, positions] = qkv[:, :, nqk:]
            # GQA: the g query heads of a KV group (x T positions) act as g*T queries of one head
            # (each row's mask per position), so no K/V is repeated. q: [B, nkv, g*T, hd]
            q = qk[:, :, :nh].reshape(B, T, nkv, g, hd).permute(0, 2, 3, 1, 4).reshape(B, nkv, g * T, hd)
            if attention == "triton":
                o = decode_attention_triton(q, kc, vc, positions[:, 0], s0)
            elif attention == "rows":
                o = decode_attention_rows(q, kc, vc, lengths, s0)
            else:
                keys, values = kc[s0 : s0 + B, :, :kv_len], vc[s0 : s0 + B, :, :kv_len]
                if attention == "torch":
                    o = decode_attention_torch(q, keys, values, visible)
                else:
                    o = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)
            o = o.reshape(B, nkv, g, T, hd).permute(0, 3, 1, 2, 4).reshape(B, T, nh * hd)
            x = x + mm(o, layer.wo)
            h = norm(x, layer.ln2)
            gate, up = mm(h, layer.wgu).chunk(2, dim=-1)
            x = x + mm(F.silu(gate) * up, layer.wd)
        if one:
            x = x[:, 0]
        x = norm(x, self.norm)
        if out is not None:
            return out.copy_(mm(x, self.lm_head))
        return mm(x, self.lm_head).float()
