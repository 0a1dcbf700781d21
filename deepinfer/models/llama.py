"""The decoder of every family (Llama 2/3, SmolLM, Mistral, Qwen2/3, Qwen3-MoE, Phi-3, Gemma 3) as
plain tensors + functional ops.

Weights are fused at load time (q|k|v into one matrix, gate|up into one) so a layer is six
matmuls and one attention call; the per-layer loop body touches only local tensors. What a family
adds (`deepinfer.models.families`) is data on a `layers.Layer`: q/k norms before RoPE, norms
after attention and after the MLP, a sliding window and its own RoPE table, a mixture of experts
(`moe.MoE`) in place of the dense MLP; an embedding scale and a final logit soft-cap on the model.

Two forward passes:
- `forward(ForwardBatch)`: any shapes (prefill, eager decode); attends over exactly the keys needed.
- `decode_static(...)`: one token per row with shapes fixed by (rows, kv_len) alone, so a CUDA graph
  can capture it and a batch-invariant (deterministic) decode can run it in fixed tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..kernels import decode_attention_c, int4_gemv
from ..kernels import dense_prefill as dense
from ..kernels.decode_attention import ATTN_CHUNK, decode_attention_torch
from ..kernels.fused import signed_sin
from ..kernels.int4_weights import Int4Weight, int4_rows
from ..kernels.int4_weights import join as join_int4
from ..kernels.paged_attention import (
    DecodeKeys,
    attend,
    decode_keys,
    decode_splits,
    paged_attention_torch,
    paged_attention_triton,
    paged_decode_torch,
    paged_invariant_triton,
    paged_prefill_triton,
)
from ..loader.gguf_blocks import GGUFMatrix
from ..loader.plane_cache import PlaneCache
from .kv_cache import DEFAULT_BLOCK_SIZE, KVCache, kv_groups
from .layers import Layer, ops, rope_inv_freq, rope_tables, softcap
from .moe import MoE

DECODE_ATTENTION = ("sdpa", "torch", "triton", "split", "rows")
STATIC_ATTENTION = DECODE_ATTENTION + ("prefill",)  # decode_static's: "prefill" for verify rows only
# a torch-attention forward of at most this many query rows, in chunks of several tokens, takes
# each row's attention as a decode row's (`_chunk_rows`): a verify forward of T positions then
# computes each position as a decode step there does, in one C call where SDPA took a call and
# a causal mask per sequence (on the CPU at 2-4 positions about a third of the forward)
CHUNK_ROWS = 16


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
    more:         (slots, block_tables) of KV-cache groups 1.. (a model with sliding-window and
                  full-attention layers, ``kv_cache.kv_groups``); empty: every layer reads the
                  ones above
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
    more: tuple = ()

    def group(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots, block_tables) of KV-cache group g."""
        return (self.slots, self.block_tables) if g == 0 or not self.more else self.more[g - 1]

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
        more: tuple = (),
    ) -> ForwardBatch:
        """Sequence b feeds ``chunks[b]`` at positions ``starts[b]..``, through its block table
        ``tables[b]`` (covering those positions). ``logits``: "last" (each chunk's last token)
        or "all". ``to`` moves a host int list (or list of lists) to the device as int64.
        ``more``: the sequences' block tables of KV-cache groups 1.. (one list per group)."""
        tokens, positions, seq_ids, query_start = [], [], [], [0]
        for b, (p0, c) in enumerate(zip(starts, chunks)):
            tokens += c
            positions += range(p0, p0 + len(c))
            seq_ids += [b] * len(c)
            query_start.append(len(tokens))
        seq_lens = [p0 + len(c) for p0, c in zip(starts, chunks)]

        def placed(tables: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
            slots = []
            for t, p0, c in zip(tables, starts, chunks):
                for p in range(p0, p0 + len(c)):
                    slots.append(t[p // block_size] * block_size + p % block_size)
            W = max(len(t) for t in tables)
            return to(slots), to([t + [0] * (W - len(t)) for t in tables]).to(torch.int32)

        slots, block_tables = placed(tables)
        return cls(
            tokens=to(tokens),
            positions=to(positions),
            slots=slots,
            seq_ids=to(seq_ids),
            block_tables=block_tables,
            query_start=query_start,
            seq_lens=seq_lens,
            logits_index=to([q - 1 for q in query_start[1:]]) if logits == "last" else None,
            per_row=per_row,
            more=tuple(placed(t) for t in more),
        )


def _chunk_rows(query_start: list[int], seq_lens: list[int], device) -> tuple[torch.Tensor, list[int]]:
    """The query rows of chunks at their sequences' ends as decode rows: each row's sequence
    (an index into the batch's block tables) and its key count (its position + 1)."""
    seq, lens = [], []
    for b, (a, e) in enumerate(zip(query_start, query_start[1:])):
        n = seq_lens[b]
        seq += [b] * (e - a)
        lens += range(n - (e - a) + 1, n + 1)
    return torch.tensor(seq, dtype=torch.int64, device=device), lens


def _qkv(h: torch.Tensor, layer: Layer, mm, invariant: bool) -> torch.Tensor:
    if layer.bqkv is None:
        return mm(h, layer.wqkv)
    if invariant or mm is not torch.matmul:
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
        int4: bool = False,
        planes: PlaneCache | None = None,
    ):
        self.config = c = config
        self.dtype = dtype
        self.device = torch.device(device)
        if int4 and (self.device.type != "cpu" or dtype != torch.bfloat16):
            raise ValueError(
                "int4 matrices run on the CPU with bfloat16 activations (torch's packed int4 matmul)"
            )
        # matrices given as GGUF blocks (`GGUFMatrix`) kept as int4 planes where those hold them
        # exactly, the embedding's rows dequantized as they are looked up (else: dequantized)
        self.int4 = int4
        w = {k.removeprefix("model.") if k.startswith("model.") else k: v for k, v in weights.items()}

        def take(name: str) -> torch.Tensor:
            if name not in w:
                raise ValueError(f"checkpoint lacks weight {name!r}")
            t = w[name]
            if isinstance(t, GGUFMatrix):
                dense = t.dequantize().to(device=self.device, dtype=dtype)
                t.release()
                return dense
            return t.to(device=self.device, dtype=dtype)

        def matrix(*names: str, dense: bool = False) -> torch.Tensor | Int4Weight:
            """The matrices ``names`` ([out, in] each) stacked on out, as ``x @ w`` takes them:
            int4 planes (``int4``, blocks that planes hold; not ``dense``), else dense [in, out]."""
            parts = [w.get(n) for n in names]
            if int4 and not dense and all(isinstance(p, GGUFMatrix) for p in parts):
                key = "+".join(names)
                done = None if planes is None else planes.get(key)  # converted by an earlier load
                if done is not None:
                    return done
                made = [p.int4() for p in parts]
                if all(m is not None for m in made):
                    for p in parts:
                        p.release()
                    done = made[0] if len(made) == 1 else join_int4(made)
                    if planes is not None:
                        planes.put(key, done)
                    return done
            return torch.cat([take(n) for n in names]).t().contiguous()

        def opt(name: str) -> torch.Tensor | None:
            return take(name) if name in w else None

        f = c.family
        off = 1.0 if f.norm_offset else 0.0  # Gemma's RMSNorm scales by (1 + w)

        def scale(name: str) -> torch.Tensor:  # a norm's weight as the scale it applies
            return (w[name].float() + off).to(self.device, dtype) if off and name in w else take(name)

        tied = c.tie_word_embeddings or "lm_head.weight" not in w
        self.lm_head = matrix("embed_tokens.weight" if tied else "lm_head.weight")  # [H, V]
        embed = w.get("embed_tokens.weight")
        if tied and isinstance(self.lm_head, Int4Weight):  # the head's planes, a column a token
            self.embed = self.lm_head
        elif int4 and isinstance(embed, GGUFMatrix):  # [V, H] in blocks (a copy: the file's map closes)
            embed.check_finite()
            self.embed = embed.with_rows(embed.raw.clone())
            embed.release()
        else:
            self.embed = take("embed_tokens.weight")  # [V, H]
        self.logits_width = self.lm_head.shape[1]  # V (a tensor-parallel shard's head holds V / N)
        # tensor parallel (deepinfer.parallel): the rank's collectives, or None on one device; then
        # wo and wd are row shards (their products summed over ranks) and lm_head a vocabulary shard
        self.tp = None
        self.norm = scale("norm.weight")
        # Gemma: embeddings times sqrt(hidden), rounded to the model's dtype as transformers does
        self.embed_scale = torch.tensor(c.hidden_size**0.5, dtype=dtype).item() if f.embed_scale else None
        self.act = f.hidden_act
        # the fused Triton kernels of deepinfer.kernels.fused (their torch references when False)
        self.fused = self.device.type == "cuda"
        # with fused: a norm and the matmul after it as one kernel where it serves (small matrices
        # at a few rows: deepinfer.kernels.norm_matmul), outside deterministic mode
        self.fused_matmul = True
        self.int8 = False  # matrices as int8 (quantize_int8)
        # the softmax scale the kernels apply is 1/sqrt(head_dim): another one (Gemma's
        # query_pre_attn_scalar) is folded into q (its norm, else its projection)
        q_scale = None if c.attn_scale is None else c.attn_scale * c.head_dim**0.5
        nq = c.num_heads * c.head_dim
        self.layers: list[Layer] = []
        for i in range(c.num_layers):
            p = f"layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            if f.fused_qkv:
                names, biases = [a + "qkv_proj.weight"], [None]
            else:
                names = [a + f"{x}_proj.weight" for x in "qkv"]
                biases = [opt(a + f"{x}_proj.bias") for x in "qkv"]
                if any(b is not None for b in biases) and not all(b is not None for b in biases):
                    raise ValueError(f"layer {i}: q/k/v biases must be all present or all absent")
            # [H, (nh + 2 nkv) hd]; dense where q's scale is folded into it
            wqkv = matrix(*names, dense=q_scale is not None and not f.qk_norm)
            bqkv = torch.cat(biases) if biases[0] is not None else None
            q_norm = scale(a + "q_norm.weight") if f.qk_norm else None
            if q_scale is not None:
                if q_norm is not None:
                    q_norm = q_norm * q_scale
                else:
                    wqkv = torch.cat([wqkv[:, :nq] * q_scale, wqkv[:, nq:]], dim=1)
                    bqkv = None if bqkv is None else torch.cat([bqkv[:nq] * q_scale, bqkv[nq:]])
            if f.sandwich_norms:
                ln2, post = (
                    scale(p + "pre_feedforward_layernorm.weight"),
                    scale(p + "post_attention_layernorm.weight"),
                )
            else:
                ln2, post = scale(p + "post_attention_layernorm.weight"), None
            moe = wgu = wd = None
            if c.is_moe_layer(i):
                ex = m + "experts.{}.{}_proj.weight"
                moe = MoE.from_experts(
                    take(m + "gate.weight"),
                    *([take(ex.format(e, x)) for e in range(c.num_experts)] for x in ("gate", "up", "down")),
                    top_k=c.num_experts_per_tok,
                    renormalize=c.norm_topk_prob,
                    act=f.hidden_act,
                )
            else:
                gu = (
                    [m + "gate_up_proj.weight"]
                    if f.fused_qkv
                    else [m + "gate_proj.weight", m + "up_proj.weight"]
                )
                wgu, wd = matrix(*gu), matrix(m + "down_proj.weight")
            window = c.window(i)
            self.layers.append(
                Layer(
                    ln1=scale(p + "input_layernorm.weight"),
                    wqkv=wqkv,
                    bqkv=bqkv,
                    wo=matrix(a + "o_proj.weight"),
                    ln2=ln2,
                    wgu=wgu,
                    wd=wd,
                    q_norm=q_norm,
                    k_norm=scale(a + "k_norm.weight") if f.qk_norm else None,
                    post_attn=post,
                    post_mlp=scale(p + "post_feedforward_layernorm.weight") if f.sandwich_norms else None,
                    moe=moe,
                    window=window,
                    local=bool(window) and c.rope_local_theta is not None,
                    softcap=c.attn_softcap or 0.0,
                )
            )
        if planes is not None:
            planes.save()  # (the planes converted here, for the next load)
        # KV-cache groups: full-attention layers, then sliding-window ones (one group unless mixed)
        self.kv_groups = kv_groups([layer.window for layer in self.layers])
        self.layer_group = [0] * c.num_layers
        for g, (_, members) in enumerate(self.kv_groups):
            for i in members:
                self.layer_group[i] = g
        self.max_len = max_len or c.max_position_embeddings
        # The tables run to a whole number of attention chunks (a deterministic cache's length).
        table_len = -(-self.max_len // ATTN_CHUNK) * ATTN_CHUNK
        self.cos, self.sin = rope_tables(rope_inv_freq(c, w.get("rope_freqs")), table_len, self.device, dtype)
        self.cos_local = self.sin_local = None
        if c.rope_local_theta is not None:
            inv = rope_inv_freq(c, local=True)
            self.cos_local, self.sin_local = rope_tables(inv, table_len, self.device, dtype)

    def new_cache(self, num_blocks: int | list[int], block_size: int = DEFAULT_BLOCK_SIZE) -> KVCache:
        """A paged cache of ``num_blocks`` blocks (block 0, the null block, included) in each
        KV-cache group (a list: per group)."""
        c = self.config
        groups = [members for _, members in self.kv_groups]
        return KVCache(c.num_layers, num_blocks, block_size, c.num_kv_heads, c.head_dim, dtype=self.dtype,
                       device=self.device, groups=groups)  # fmt: skip

    def block_bytes(self, block_size: int = DEFAULT_BLOCK_SIZE, group: int | None = None) -> int:
        """Bytes of one KV block: every layer's K and V, or those of KV-cache group ``group``."""
        c = self.config
        n = c.num_layers if group is None else len(self.kv_groups[group][1])
        return KVCache.bytes_per_block(n, block_size, c.num_kv_heads, c.head_dim, self.dtype)

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
        one per longer chunk; on the CPU, decode rows and a forward of at most ``CHUNK_ROWS``
        rows take ``paged_decode_torch``, in the C call where it can), "triton"
        (``paged_attention_triton``: one program per token and KV head), "split" (the same
        kernel with each token's keys split into runs, a program each, as many as
        ``decode_splits`` gives for N rows: for decode rows) or "prefill" (``paged_prefill_triton``:
        one program per tile of a sequence's query tokens, each key block read once a tile; for
        prompt chunks on CUDA).
        invariant: matmuls and norms through deepinfer.kernels.invariant and the attention
        through ``paged_invariant_triton`` (whatever ``attention`` says): each token's result is
        the same bits whatever else is in the batch and however its prompt is chunked, and the
        bits decode_static(invariant=True) gives at that position (deterministic mode on CUDA)."""
        c = self.config
        N = batch.tokens.shape[0]
        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        g = nh // nkv
        if max(batch.seq_lens) > cache.block_size * batch.block_tables.shape[1]:
            raise ValueError(f"sequence length {max(batch.seq_lens)} exceeds its block table")
        x = self._embed(batch.tokens)  # [N, H]
        op = ops(invariant, c.rms_norm_eps, self.fused, self.int8 or self.int4, self.fused_matmul)
        rope = self._rope(batch.positions)
        if invariant:
            attention = "invariant"
        if attention in ("prefill", "invariant"):  # query-tiled kernels read the varlen layout on the device
            max_q = max(b - a for a, b in zip(batch.query_start, batch.query_start[1:]))
            query_start, seq_lens = (
                torch.tensor(x, dtype=torch.int64).to(self.device, non_blocking=True)
                for x in (batch.query_start, batch.seq_lens)
            )
        # every sequence's first tokens, and long: cuDNN's dense causal attention (dense_prefill)
        fresh = attention == "prefill" and dense.usable(x.device, x.dtype)
        spans = list(zip(batch.query_start, batch.query_start[1:]))
        fresh = fresh and all(b - a == n >= dense.MIN_TOKENS for (a, b), n in zip(spans, batch.seq_lens))
        splits = decode_splits(N, nkv, x.device) if attention == "split" else 1  # runs of a row's keys
        # rows of one token each (a decode step) on the torch path: where each row's keys lie is
        # worked out once (per KV-cache group and window) for every layer
        decode = attention == "torch" and not batch.per_row and N == len(batch.seq_lens)
        # a few rows in short chunks at their sequences' ends (DSpark's verify forward on the
        # CPU): each query row as a decode row of its own, its position's keys, where the C
        # call of decode rows takes them (`_chunk_rows`)
        chunk = None
        if attention == "torch" and not batch.per_row and not decode and N <= CHUNK_ROWS:
            chunk = _chunk_rows(batch.query_start, batch.seq_lens, x.device)
        keys: dict[tuple[int, int], DecodeKeys] = {}
        y = None  # the last layer's MLP output, added to the residual by the next norm
        for i, layer in enumerate(self.layers):
            slots, tables = batch.group(self.layer_group[i])
            flat = cache.flat(i)
            x, q = self._attention_inputs(layer, x, y, rope, slots, flat, op, invariant)
            q = q.reshape(N, nkv, g, hd)
            if decode or (chunk is not None and decode_attention_c.usable(q, *flat, layer.softcap)):
                at = (self.layer_group[i], layer.window)
                if at not in keys:
                    own, lens = (tables, batch.seq_lens) if chunk is None else (tables[chunk[0]], chunk[1])
                    keys[at] = decode_keys(own, lens, cache.block_size, layer.window)
                o = paged_decode_torch(q, *flat, keys[at], layer.softcap)
            elif attention in ("triton", "split"):
                o = paged_attention_triton(q, cache.k[i], cache.v[i], tables, batch.seq_ids,
                                           batch.positions, window=layer.window, softcap=layer.softcap,
                                           splits=splits)  # fmt: skip
            elif attention == "prefill":
                o = None
                if fresh and not layer.softcap and (not layer.window or layer.window >= max_q):
                    o = self._dense_prefill(q, cache.k[i], cache.v[i], tables, spans)
                    fresh = o is not None  # (cuDNN refused: the paged kernel from now on)
                if o is None:
                    o = paged_prefill_triton(q, cache.k[i], cache.v[i], tables, query_start, seq_lens,
                                             max_q, window=layer.window, softcap=layer.softcap)  # fmt: skip
            elif attention == "invariant":
                o = paged_invariant_triton(q, cache.k[i], cache.v[i], tables, query_start, batch.positions,
                                           max_q, window=layer.window, softcap=layer.softcap)  # fmt: skip
            else:
                o = paged_attention_torch(q, cache.k[i], cache.v[i], tables, batch.query_start,
                                          batch.seq_lens, per_row=batch.per_row,
                                          window=layer.window, softcap=layer.softcap)  # fmt: skip
            x, y = self._out_and_mlp(layer, x, o.reshape(N, nh * hd), op)
        if batch.logits_index is not None:
            x, y = x[batch.logits_index], y[batch.logits_index]
        x = op.add_norm(x, y, self.norm)[1]
        return softcap(self._head(x, op.mm).float(), self.config.final_softcap)

    @staticmethod
    def _dense_prefill(q, k_cache, v_cache, tables, spans) -> torch.Tensor | None:
        """Each sequence's rows of q by dense_prefill; None (and the path off for the process,
        dense.REFUSED) where cuDNN refuses the shape."""
        try:
            parts = [
                dense.dense_prefill(q[a:b], k_cache, v_cache, tables[s]) for s, (a, b) in enumerate(spans)
            ]
        except RuntimeError as e:
            dense.REFUSED.append(str(e))
            return None
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        if isinstance(self.embed, Int4Weight):  # a tied head's planes: the columns read, dequantized
            if int4_gemv.STATE.columns is not None and tokens.dtype == torch.int64 and tokens.dim() == 1:
                x = int4_gemv.int4_columns(self.embed, tokens).to(self.dtype)  # int4_rows's bits, in C
            else:
                x = int4_rows(self.embed, tokens).to(self.dtype)
        elif isinstance(self.embed, GGUFMatrix):  # blocks: the rows read are dequantized
            x = self.embed.rows(tokens).to(self.dtype)
        else:
            x = F.embedding(tokens, self.embed)
        return x if self.embed_scale is None else x * self.embed_scale

    def _rope(self, positions: torch.Tensor) -> tuple[tuple, tuple]:
        """(cos, sin, positions) of the global RoPE table, then of the local one, as `rope_store`
        takes them: the tables and the positions for the fused kernel (it gathers the rows);
        for the torch path (`rope_store_torch`) the tokens' rows of cos and of the signed sin
        ([N, 1, hd]: broadcast over the heads), gathered once for every layer, and None."""
        tables = [(self.cos, self.sin), (self.cos_local, self.sin_local)]
        if self.cos_local is None:
            tables = tables[:1]
        if self.fused:
            out = [(cos, sin, positions) for cos, sin in tables]
        else:
            if getattr(self, "_signed", None) is None:  # (made once: the tables never change)
                self._signed = [signed_sin(sin) for _, sin in tables]
            out = [
                (cos[positions, None], s[positions, None], None) for (cos, _), s in zip(tables, self._signed)
            ]
        return out[0], out[-1]

    def _attention_inputs(self, layer: Layer, x: torch.Tensor, d: torch.Tensor | None, rope: tuple,
                          slots: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], op,
                          invariant: bool):  # fmt: skip
        """(the residual stream x + d, q [N, nh, hd]): q of the layer's normed input, with q/k
        norms and RoPE (``rope``: `_rope`) applied; the token's k and v written at its slot of the
        layer's cache ``kv`` (`KVCache.flat`). Without a bias or q/k norms, one ``norm_qkv_rope``
        (on CUDA, one kernel for a decode row)."""
        c = self.config
        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        nqk = nh + nkv
        cos, sin, positions = rope[layer.local]
        if layer.bqkv is None and layer.q_norm is None:
            return op.norm_qkv_rope(x, d, layer.ln1, layer.wqkv, cos, sin, positions, *kv, slots, nh)
        if layer.bqkv is None:
            x, qkv = op.norm_mm(x, d, layer.ln1, layer.wqkv)
        else:
            x, h = op.add_norm(x, d, layer.ln1)
            qkv = _qkv(h, layer, op.mm, invariant)
        qkv = qkv.view(x.shape[0], nqk + nkv, hd)
        qk = qkv[:, :nqk]  # heads: nh q, nkv k, nkv v
        if layer.q_norm is not None:
            qk = torch.cat([op.norm(qk[:, :nh], layer.q_norm), op.norm(qk[:, nh:], layer.k_norm)], dim=1)
        return x, op.rope_store(qk, qkv[:, nqk:], cos, sin, positions, *kv, slots, nh)

    def quantize_int8(self) -> None:
        """Keep every dense matrix (attention, MLP, LM head) as int8 with a scale per output
        column (deepinfer.kernels.int8_weights): the CPU's weight-only int8 matmul. Norms,
        embeddings and mixture-of-experts experts stay as they are."""
        from ..kernels.int8_weights import quantize_int8

        if self.device.type != "cpu":
            raise ValueError("int8 weights run on the CPU only (torch's packed int8 matmul)")

        def q(name: str, w: torch.Tensor):
            try:
                return quantize_int8(w)
            except ValueError as e:
                raise ValueError(f"quantization='int8' cannot hold {name}: {e}") from None

        for i, layer in enumerate(self.layers):
            layer.wqkv, layer.wo = q(f"layer {i}'s qkv", layer.wqkv), q(f"layer {i}'s o_proj", layer.wo)
            if layer.wgu is not None:
                layer.wgu = q(f"layer {i}'s gate/up", layer.wgu)
                layer.wd = q(f"layer {i}'s down_proj", layer.wd)
        self.lm_head = q("the LM head", self.lm_head)
        self.int8 = True

    def _head(self, x: torch.Tensor, mm) -> torch.Tensor:
        """x @ lm_head: the logits [..., V] (under tensor parallel, every rank's shard gathered)."""
        y = mm(x, self.lm_head)
        return y if self.tp is None else self.tp.gather_vocab(y, self.logits_width)

    def _out_and_mlp(self, layer: Layer, x: torch.Tensor, o: torch.Tensor, op):
        """(the residual stream after layer's attention output ``o`` [N, nh hd], the MLP's output to
        add to it: the next norm adds it)."""
        a = op.mm(o, layer.wo)
        if self.tp is not None:
            a = self.tp.all_reduce(a)
        d = a if layer.post_attn is None else op.norm(a, layer.post_attn)
        if layer.moe is not None:
            x, h = op.add_norm(x, d, layer.ln2)
            y = layer.moe(h, op.mm)
        else:
            x, g = op.norm_mm(x, d, layer.ln2, layer.wgu, self.act)
            y = op.mm(g, layer.wd)
            if self.tp is not None:
                y = self.tp.all_reduce(y)
        return x, (y if layer.post_mlp is None else op.norm(y, layer.post_mlp))

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
        more: tuple = (),
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
        the device; batch-invariant), "prefill" (``paged_prefill_triton``: a row's T positions,
        which are consecutive, one query tile, so each key block is read once a row, not once a
        position: DSpark's verify forward outside deterministic mode), "sdpa" (the rows' first
        kv_len keys gathered, torch SDPA with a length mask), for T = 1 "split" (the paged kernel
        with each row's keys split into ``decode_splits(R, ...)`` runs, a program each, merged in
        order: enough programs at a small batch; a row's bits depend on R), "torch" (gathered keys
        in fixed 256-key blocks; kv_len a multiple of 256; batch-invariant) or "rows" (CPU: one
        SDPA call per row over its own keys, the lengths read on the host; batch-invariant).
        invariant: matmuls and norms through deepinfer.kernels.invariant with attention="triton",
        which then runs ``paged_invariant_triton`` (each row's T positions one sequence of the
        query-tiled kernel): a row's logits are then the same bits at any R and any row, and the
        bits forward(invariant=True) gives at those positions.
        more: (slots, block_tables) of KV-cache groups 1.. (shaped as the ones above); empty:
        every layer writes and reads through those.
        """
        c = self.config
        one = tokens.dim() == 1
        if one:
            tokens, positions, slots = tokens[:, None], positions[:, None], slots[:, None]
        R, T = tokens.shape
        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        g, eps, bs = nh // nkv, c.rms_norm_eps, cache.block_size
        if attention not in STATIC_ATTENTION:
            raise ValueError(f"attention must be one of {STATIC_ATTENTION}, got {attention!r}")
        if attention in ("torch", "split", "rows") and T > 1:
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
        windows = sorted({layer.window for layer in self.layers})
        if attention == "torch" and (windows != [0] or self.config.attn_softcap):
            raise ValueError("attention='torch' has no sliding window (its first key block must be visible) "
                             "and no soft-cap: use 'triton', 'sdpa' or 'rows' for this model")  # fmt: skip
        op = ops(invariant, eps, self.fused, self.int8 or self.int4, self.fused_matmul)
        N = R * T
        x = self._embed(tokens.reshape(N))  # [N, H], row-major (row, position)
        flat_pos = positions.reshape(N)
        # per KV-cache group: (slots [N], block tables [R, W])
        io = [(slots.reshape(N), block_tables)] + [(s.reshape(N), t) for s, t in more]
        rope = self._rope(flat_pos)
        seq_ids = None
        bias, visible = {}, {}  # window -> mask
        splits = decode_splits(R, c.num_kv_heads, tokens.device) if attention == "split" else 1
        if attention == "prefill" or (attention == "triton" and invariant):
            # row r: rows [r T, (r + 1) T) of the flat batch, its T consecutive positions
            query_start = torch.arange(0, N + 1, T, device=tokens.device)
            if attention == "prefill":  # (the invariant kernel takes each row's positions)
                seq_lens = positions[:, -1] + 1
        elif attention in ("triton", "split"):
            seq_ids = torch.arange(R, device=tokens.device)
            if T > 1:
                seq_ids = seq_ids.repeat_interleave(T)
        elif attention == "rows":
            lengths = (positions[:, 0] + 1).tolist()
            starts = list(range(R + 1))
        else:
            nb = -(-kv_len // bs)
            gathered = [t[:, :nb].long() for _, t in io]
            cols = torch.arange(kv_len, device=tokens.device)
            for w in windows:
                seen = cols <= positions.unsqueeze(2)  # [R, T, kv_len]
                if w:
                    seen &= cols > positions.unsqueeze(2) - w
                if attention == "sdpa":  # additive mask, one row per (row, query): [R, 1, g*T or 1, kv_len]
                    zero = torch.zeros((), dtype=self.dtype, device=tokens.device)
                    bias[w] = torch.where(seen, zero, float("-inf")).view(R, 1, T, kv_len)
                    if T > 1:  # queries are (head in group, position) pairs, position fastest
                        bias[w] = bias[w].repeat(1, 1, g, 1)
                visible[w] = seen[:, 0]  # [R, kv_len], as the "torch" attention takes it
        y = None  # the last layer's MLP output, added to the residual by the next norm
        for i, layer in enumerate(self.layers):
            gi = self.layer_group[i] if more else 0
            flat_slots, block_tables = io[gi]
            x, qh = self._attention_inputs(layer, x, y, rope, flat_slots, cache.flat(i), op, invariant)
            kc, vc = cache.k[i], cache.v[i]  # [blocks, bs, nkv, hd]
            if attention == "triton" and invariant:
                q = qh.reshape(N, nkv, g, hd)
                o = paged_invariant_triton(q, kc, vc, block_tables, query_start, flat_pos, T,
                                           window=layer.window, softcap=layer.softcap)  # fmt: skip
            elif attention in ("triton", "split"):
                q = qh.reshape(N, nkv, g, hd)
                o = paged_attention_triton(q, kc, vc, block_tables, seq_ids, flat_pos, window=layer.window,
                                           softcap=layer.softcap, splits=splits)  # fmt: skip
            elif attention == "prefill":
                q = qh.reshape(N, nkv, g, hd)
                o = paged_prefill_triton(q, kc, vc, block_tables, query_start, seq_lens, T,
                                         window=layer.window, softcap=layer.softcap)  # fmt: skip
            elif attention == "rows":
                q = qh.reshape(N, nkv, g, hd)
                o = paged_attention_torch(q, kc, vc, block_tables, starts, lengths, per_row=True,
                                          window=layer.window, softcap=layer.softcap)  # fmt: skip
            else:
                tables = gathered[gi]
                keys = kc[tables].view(R, nb * bs, nkv, hd)[:, :kv_len].transpose(1, 2)  # [R, nkv, L, hd]
                values = vc[tables].view(R, nb * bs, nkv, hd)[:, :kv_len].transpose(1, 2)
                # GQA: the g query heads of a KV group (x T positions) act as g*T queries of one
                # head (each row's mask per position), so no K/V is repeated. q: [R, nkv, g*T, hd]
                q = qh.reshape(R, T, nkv, g, hd).permute(0, 2, 3, 1, 4).reshape(R, nkv, g * T, hd)
                if attention == "torch":
                    o = decode_attention_torch(q, keys, values, visible[layer.window])
                else:
                    o = attend(q, keys, values, bias[layer.window], layer.softcap)
            if attention in ("sdpa", "torch"):  # [R, nkv, g * T, hd] -> (row, position) rows
                o = o.reshape(R, nkv, g, T, hd).permute(0, 3, 1, 2, 4)
            x, y = self._out_and_mlp(layer, x, o.reshape(N, nh * hd), op)
        x = op.add_norm(x, y, self.norm)[1]
        if not one:
            x = x.view(R, T, -1)
        logits = softcap(self._head(x, op.mm), self.config.final_softcap)
        if out is not None:
            return out.copy_(logits)
        return logits.float()
