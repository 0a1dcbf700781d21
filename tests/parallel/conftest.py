"""Tiny random checkpoints for the parallel tests, and one spawned pool of 4 ranks shared by them
(spawning is the slow part: the ranks load each model themselves, in parallel)."""

from __future__ import annotations

import pytest
import torch

from tests.models.conftest import VOCAB, save_folder

SMALL = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,  # TP=4 needs 4 KV heads
    "head_dim": 8,
    "max_position_embeddings": 256,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
MODELS = {
    "llama": {},
    "qwen2": {},  # q/k/v biases
    "phi3": {"sliding_window": 5},  # fused qkv_proj and gate_up_proj
    "gemma3_text": {  # (1 + w) norms, sandwich norms, GeGLU, a q scale, windows, soft-cap, tied head
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 24,
        "final_logit_softcapping": 3.0,
        "tie_word_embeddings": True,
    },
    "qwen3_moe": {
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "mlp_only_layers": [1],
    },
}


def tiny(model_type: str, seed: int = 0):
    import transformers

    cfg = transformers.AutoConfig.for_model(model_type, **{**SMALL, **MODELS[model_type]})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((0.0 if model_type.startswith("gemma") else 1.0) + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.3 if "embed" in name else 0.15))
    return model


@pytest.fixture(scope="session")
def parallel_folder(tmp_path_factory):
    made = {}

    def get(model_type: str) -> str:
        if model_type not in made:
            made[model_type] = save_folder(tiny(model_type), tmp_path_factory.mktemp(model_type))
        return made[model_type]

    return get


@pytest.fixture(scope="session")
def pool4():
    """Ranks 1..3 spawned once for every parallel test; models of 2 ranks use the first two."""
    from deepinfer.parallel import workers

    p = workers.pool(4, "cpu", timeout=30.0)
    yield p
    workers.shutdown_pool()
