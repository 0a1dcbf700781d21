"""LLM(quantization="int8"): the dense matrices kept as int8 on the CPU, logits close to the
bfloat16 model's, and the combinations it cannot run refused by name."""

from __future__ import annotations

import pytest
import torch

from deepinfer import LLM, SamplingParams
from deepinfer.kernels.int8_weights import Int8Weight


def test_int8_model_generates_close_to_bfloat16(tiny_folder, monkeypatch_session):
    ref = LLM(tiny_folder[0], dtype="bfloat16", device="cpu", seed=0, kv_cache_memory=8 << 20)
    q = LLM(tiny_folder[0], quantization="int8", device="cpu", seed=0, kv_cache_memory=8 << 20)
    layer = q.model.layers[0]
    assert q.dtype == torch.bfloat16 and q.model.int8
    assert all(
        isinstance(m, Int8Weight) for m in (layer.wqkv, layer.wo, layer.wgu, layer.wd, q.model.lm_head)
    )
    prompts = [[1, 5, 9, 300, 301], [1, 7, 7]]
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5)
    a, b = ref.generate(prompts, sp, use_tqdm=False), q.generate(prompts, sp, use_tqdm=False)
    for x, y in zip(a, b):
        assert len(y.token_ids) == 8
        # the first token's top-5 distribution: the int8 model's differs by rounding only
        lx = {t: v for t, v in x.logprobs[0].top}
        ly = {t: v for t, v in y.logprobs[0].top}
        common = set(lx) & set(ly)
        assert len(common) >= 3
        assert max(abs(lx[t] - ly[t]) for t in common) < 0.1


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(quantization="int4"), "quantization must be 'auto', None, 'gguf' or 'int8', got 'int4'"),
        (dict(quantization="int8", dtype="float32"), "computes in bfloat16; dtype='float32'"),
        (dict(quantization="int8", deterministic=True), "not with deterministic=True"),
    ],
)
def test_what_int8_cannot_run_is_refused(tiny_folder, monkeypatch_session, kw, msg):
    with pytest.raises(ValueError, match=msg):
        LLM(tiny_folder[0], device="cpu", **kw)
