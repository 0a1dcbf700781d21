"""Tiny random-weight checkpoints of every model family, written by transformers' save_pretrained
with a small tokenizer.json, so that our Hugging Face loader reads them as it reads a real one."""

from __future__ import annotations

import os

import pytest
import torch

VOCAB = 96
BASE = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
# model_type -> config fields beyond BASE. Windows of 4 keys, shorter than the prompts, so that the
# sliding-window masks matter in prefill and decode.
FAMILIES = {
    "qwen3": {},
    "mistral": {"sliding_window": 4},
    "phi3": {"sliding_window": 5},
    "gemma3_text": {
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 24,  # a softmax scale other than 1/sqrt(head_dim)
        "final_logit_softcapping": 3.0,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
        "tie_word_embeddings": True,
    },
    "gemma2": {
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 24,
        "attn_logit_softcapping": 1.5,  # small enough that tanh bends the scores
        "final_logit_softcapping": 3.0,
        "tie_word_embeddings": True,
    },
    "qwen3_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "mlp_only_layers": [1],  # layer 1 dense, layer 0 sparse
    },
}


def hf_model(model_type: str, seed: int = 0, **overrides):
    """A transformers model (float32, eval) of the family with random weights spread wide enough
    that an argmax or a router's top-k is not a tie."""
    import transformers

    cfg = transformers.AutoConfig.for_model(model_type, **{**BASE, **FAMILIES[model_type], **overrides})
    torch.manual_seed(seed)
    # eager: transformers' reference attention (its SDPA path drops Gemma 2's soft-capping)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    gemma = model_type.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # Gemma scales by (1 + w)
                p.copy_((0.0 if gemma else 1.0) + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.3 if "embed" in name else 0.15))
    return model


def tiny_tokenizer():
    """A word-level tokenizer of VOCAB tokens (the loader needs a tokenizer.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def save_folder(model, folder) -> str:
    model.save_pretrained(folder)
    tiny_tokenizer().save(os.path.join(folder, "tokenizer.json"))
    return str(folder)


@pytest.fixture(scope="session")
def family_folder(tmp_path_factory):
    """model_type -> (folder written by save_pretrained, the transformers model), built once."""
    made = {}

    def get(model_type: str):
        if model_type not in made:
            model = hf_model(model_type)
            made[model_type] = save_folder(model, tmp_path_factory.mktemp(model_type)), model
        return made[model_type]

    return get
