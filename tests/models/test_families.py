"""Every model family's logits against transformers' on a tiny random-weight checkpoint (CPU,
float32): written by save_pretrained, read by our Hugging Face loader, a ragged batch prefilled
together through shuffled block tables, then decode steps (the eager forward and the fixed-shape
`decode_static`), each row at its own position past the sliding windows; and, in bfloat16, short
chunks' attention as decode rows in the C call (`llama.CHUNK_ROWS`)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from deepinfer.loader import load_model  # noqa: E402
from deepinfer.models.llama import ForwardBatch, LlamaModel  # noqa: E402

from .conftest import FAMILIES, VOCAB  # noqa: E402

ATOL = 3e-5
BS = 4  # block size
LENS = (7, 3, 12)


def _to(x):
    return torch.tensor(x, dtype=torch.int64)


def _ref(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0]  # [T, V]


def _setup(family_folder, model_type):
    folder, hf = family_folder(model_type)
    lm = load_model(folder)
    assert lm.config.architecture == model_type
    ours = LlamaModel(lm.config, lm.weights, dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in LENS]
    blocks = torch.randperm(18, generator=g).add(1).tolist()
    tables = [blocks[0:6], blocks[6:12], blocks[12:18]]  # room for 24 positions each
    return hf, ours, prompts, tables


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_prefill_and_decode_match_transformers(family_folder, model_type):
    hf, ours, prompts, tables = _setup(family_folder, model_type)
    cache = ours.new_cache(19, BS)
    got = ours.forward(ForwardBatch.of_chunks(_to, tables, [0] * 3, prompts, BS, logits="all"), cache)
    for p, part in zip(prompts, got.split(LENS)):  # every position of every prompt
        torch.testing.assert_close(part, _ref(hf, p), atol=ATOL, rtol=0)
    seqs = [list(p) for p in prompts]
    last = torch.stack([part[-1] for part in got.split(LENS)])
    for _ in range(3):  # eager decode steps
        nxt = last.argmax(-1).tolist()
        starts = [len(s) for s in seqs]
        for s, t in zip(seqs, nxt):
            s.append(t)
        last = ours.forward(ForwardBatch.of_chunks(_to, tables, starts, [[t] for t in nxt], BS), cache)
        for b, s in enumerate(seqs):
            torch.testing.assert_close(last[b], _ref(hf, s)[-1], atol=ATOL, rtol=0)
    # the fixed-shape decode (CUDA graphs' path) over the same cache: one more token a row
    nxt = last.argmax(-1).tolist()
    pos = [len(s) for s in seqs]
    slots = [t[p // BS] * BS + p % BS for t, p in zip(tables, pos)]
    width = torch.tensor(tables, dtype=torch.int32)
    for s, t in zip(seqs, nxt):
        s.append(t)
    want = torch.stack([_ref(hf, s)[-1] for s in seqs])
    for attention in ("sdpa", "rows"):
        out = ours.decode_static(_to(nxt), _to(pos), _to(slots), width, cache, kv_len=24, attention=attention)
        torch.testing.assert_close(out, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("model_type", "attention"),
    [("gemma2", "triton"), ("gemma3_text", "prefill"), ("qwen3_moe", "prefill"), ("phi3", "triton")],
)
def test_triton_paths_match_transformers(family_folder, model_type, attention):
    """The Triton attention kernels (per-token: Gemma 2's windowed and soft-capped layers; the
    query-tiled prefill), the Triton grouped-matmul experts and the fused layer kernels (add +
    norm, RoPE + cache store, GLU: Gemma's sandwich norms and GeGLU, Qwen3's q/k norms, Gemma 3's
    local RoPE), under TRITON_INTERPRET=1: a prefill, then a `decode_static` step (attention
    "split", the default CUDA decode), then a two-position verify step (attention "prefill")."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the Triton kernels on the CPU: needs TRITON_INTERPRET=1")
    from deepinfer.kernels.moe_experts import moe_experts_triton

    hf, ours, prompts, tables = _setup(family_folder, model_type)
    ours.fused = True
    for layer in ours.layers:  # the CUDA path of the experts, run on the CPU
        if layer.moe is not None:
            layer.moe.experts = moe_experts_triton
    cache = ours.new_cache(19, BS)
    batch = ForwardBatch.of_chunks(_to, tables, [0] * 3, prompts, BS, logits="all")
    got = ours.forward(batch, cache, attention=attention)
    for p, part in zip(prompts, got.split(LENS)):
        torch.testing.assert_close(part, _ref(hf, p), atol=ATOL, rtol=0)
    nxt = torch.stack([part[-1] for part in got.split(LENS)]).argmax(-1).tolist()
    pos = list(LENS)
    slots = [t[p // BS] * BS + p % BS for t, p in zip(tables, pos)]
    # the default CUDA decode: the paged kernel split over the keys (one run of these short rows)
    out = ours.decode_static(_to(nxt), _to(pos), _to(slots), torch.tensor(tables, dtype=torch.int32), cache,
                             kv_len=24, attention="split")  # fmt: skip
    want = torch.stack([_ref(hf, p + [t])[-1] for p, t in zip(prompts, nxt)])
    torch.testing.assert_close(out, want, atol=ATOL, rtol=0)
    # DSpark's verify forward outside deterministic mode: two positions a row, one query tile
    # (the query-tiled kernel: windows, soft-caps), the logits at both positions
    toks = [[t, 5] for t in nxt]
    pos2 = [[p, p + 1] for p in pos]
    slots2 = [[t[q // BS] * BS + q % BS for q in ps] for t, ps in zip(tables, pos2)]
    tab = torch.tensor(tables, dtype=torch.int32)
    out = ours.decode_static(_to(toks), _to(pos2), _to(slots2), tab, cache, kv_len=24, attention="prefill")
    want = torch.stack([_ref(hf, p + t)[-2:] for p, t in zip(prompts, toks)])
    torch.testing.assert_close(out, want, atol=ATOL, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_cuda_prefill_and_graph_decode_match_transformers(family_folder, model_type):
    """On CUDA (float32): the query-tiled prefill kernel, then a decode step through
    decode_static(attention="triton") captured in a CUDA graph and replayed (the MoE experts
    through the Triton grouped matmul)."""
    hf, ours, prompts, tables = _setup(family_folder, model_type)
    lm = load_model(family_folder(model_type)[0])
    ours = LlamaModel(lm.config, lm.weights, dtype=torch.float32, device="cuda")

    def dev(x):
        return torch.tensor(x, dtype=torch.int64, device="cuda")

    cache = ours.new_cache(19, BS)
    got = ours.forward(ForwardBatch.of_chunks(dev, tables, [0] * 3, prompts, BS), cache, attention="prefill")
    for b, p in enumerate(prompts):
        torch.testing.assert_close(got[b].cpu(), _ref(hf, p)[-1], atol=1e-4, rtol=0)
    nxt = got.argmax(-1).tolist()
    pos = [len(p) for p in prompts]
    inputs = [dev(nxt), dev(pos), dev([t[p // BS] * BS + p % BS for t, p in zip(tables, pos)])]
    width = torch.tensor(tables, dtype=torch.int32, device="cuda")
    out = torch.empty(3, VOCAB, device="cuda")

    def step():
        ours.decode_static(*inputs, width, cache, kv_len=24, attention="triton", out=out)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up: compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for b, (p, t) in enumerate(zip(prompts, nxt)):
        torch.testing.assert_close(out[b].cpu(), _ref(hf, [*p, t])[-1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_engine_greedy_matches_transformers_generate(family_folder, model_type):
    """Through the engine (LLM: scheduler, paged cache, runner; deterministic mode's fixed-shape
    decode for the windowed families): greedy tokens equal transformers' generate."""
    from deepinfer import LLM, SamplingParams

    folder, hf = family_folder(model_type)
    deterministic = model_type in ("gemma2", "gemma3_text", "mistral")
    llm = LLM(folder, dtype="float32", device="cpu", seed=0, deterministic=deterministic)
    prompts = [[5, 9, 13, 40, 7, 3, 3, 8], [4, 4, 90]]
    out = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    for o, p in zip(out, prompts):
        with torch.no_grad():
            want = hf.generate(torch.tensor([p]), max_new_tokens=6, min_new_tokens=6, do_sample=False)
        assert o.token_ids == want[0, len(p) :].tolist()


def test_deterministic_mode_refuses_a_mixture_of_experts(family_folder):
    from deepinfer import LLM

    with pytest.raises(ValueError, match="deterministic mode does not cover mixture-of-experts"):
        LLM(family_folder("qwen3_moe")[0], dtype="float32", device="cpu", deterministic=True)


@pytest.mark.parametrize("model_type", ["qwen3", "mistral", "phi3", "gemma3_text"])
def test_short_chunks_attend_as_decode_rows(family_folder, model_type, monkeypatch):
    """Bfloat16 on the CPU, where the C attention is built: a forward of at most CHUNK_ROWS query
    rows in chunks (DSpark's verify forward, a short prompt) takes each row's attention as a
    decode row's, its position's keys (sliding windows included), in one C call a layer; the
    logits are within bfloat16 rounding of the torch attention it replaces (one SDPA call and a
    causal mask a sequence)."""
    from deepinfer.kernels import decode_attention_c
    from deepinfer.models import llama

    if decode_attention_c.STATE.attention_rows is None:
        pytest.skip("the C attention is not built (./build.sh install builds it with cc)")
    folder, hf = family_folder(model_type)
    lm = load_model(folder)
    ours = LlamaModel(lm.config, lm.weights, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (9, 5)]
    tables = [[3, 1, 4], [6, 2, 5]]
    calls = []
    real = decode_attention_c.decode_attention_rows

    def spy(q, *a):
        calls.append(q.shape[0])
        return real(q, *a)

    monkeypatch.setattr(decode_attention_c, "decode_attention_rows", spy)

    more = [[7, 8, 9], [10, 11, 12]]  # after the prompts, a verify-like step: 3 positions a row

    def run():
        cache = ours.new_cache(8, BS)
        ours.forward(ForwardBatch.of_chunks(_to, tables, [0, 0], prompts, BS), cache)  # 14 rows
        return ours.forward(ForwardBatch.of_chunks(_to, tables, [9, 5], more, BS, logits="all"), cache)

    got = run()
    assert set(calls) == {14, 6} and len(calls) == 2 * len(ours.layers)  # one call a layer
    monkeypatch.setattr(llama, "CHUNK_ROWS", 0)
    calls.clear()
    want = run()
    assert not calls
    # against transformers in float32: as close as the torch attention's bfloat16 logits are
    ref = torch.cat([_ref(hf, p + m)[-3:] for p, m in zip(prompts, more)])
    err, base = ((x.float() - ref).abs().max().item() for x in (got, want))
    assert err <= 1.5 * base + 0.01, (err, base)
