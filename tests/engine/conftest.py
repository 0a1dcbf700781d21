"""Engine test fixtures: tiny random-weight checkpoints written as Hugging Face folders."""

from __future__ import annotations

import json
import os

import pytest
import torch

# Tiny Llama-family configs (HF config.json dicts). Vocabulary = SmolLM2's, so the folders can
# ship the real tokenizer.json.
TINY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
TINY_VARIANTS = {
    "llama-gqa-untied": {},
    "llama3-rope-tied": {
        "tie_word_embeddings": True,
        "num_key_value_heads": 1,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "qwen2-bias": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "num_key_value_heads": 4},
}


def tiny_config(variant: str) -> dict:
    return {**TINY, **TINY_VARIANTS[variant]}


def tiny_hf_model(variant: str, seed: int = 0):
    """A transformers model with random weights spread wide enough that argmax is not a tie."""
    import transformers

    d = tiny_config(variant)
    cls = getattr(transformers, d["architectures"][0])
    cfg_cls = transformers.AutoConfig.for_model(d["model_type"]).__class__
    cfg = cfg_cls(**{k: v for k, v in d.items() if k != "model_type"})
    torch.manual_seed(seed)
    model = cls(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.3 if "embed" in name else 0.15))
    return model, d


# where ``benchmarks/bench_e2e.py --export-tokenizer`` writes the SmolLM2 tokenizer and its facts
EXPORTED_TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", ".cache")


def exported_tokenizer(folder: str):
    """(tokenizers.Tokenizer, special facts) that ``bench_e2e.export_tokenizer`` wrote to
    ``folder``, or None where it has not."""
    from tokenizers import Tokenizer

    tok_path = os.path.join(folder, "smollm2-tokenizer.json")
    special_path = os.path.join(folder, "smollm2-special.json")
    if not (os.path.exists(tok_path) and os.path.exists(special_path)):
        return None
    with open(special_path) as fh:
        return Tokenizer.from_file(tok_path), json.load(fh)


@pytest.fixture(scope="session")
def smollm_tokenizer():
    """The SmolLM2 tokenizers.Tokenizer plus its special facts, built from the GGUF; where the
    GGUF is absent (the device machine, which it cannot travel to), the copy that
    ``bench_e2e.py --export-tokenizer`` wrote from it."""
    from deepinfer.loader import default_gguf_path
    from deepinfer.loader.gguf import build_tokenizer
    from deepinfer.loader.gguf_file import GGUFFile

    try:
        path = default_gguf_path()
    except FileNotFoundError as e:
        pair = exported_tokenizer(EXPORTED_TOKENIZER)
        if pair is None:
            pytest.skip(f"{e}; nor has `python benchmarks/bench_e2e.py --export-tokenizer` written a copy")
        return pair
    f = GGUFFile(path)
    tok, special = build_tokenizer(f.metadata, path)
    f.close()
    return tok, special


def write_hf_folder(folder, model, config: dict, tokenizer_pair, *, tokenizer: bool = True) -> str:
    """Write config.json, model.safetensors, tokenizer.json, tokenizer_config.json."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(config, fh)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        sd.pop("lm_head.weight", None)
    save_file(sd, os.path.join(folder, "model.safetensors"))
    if tokenizer:
        tok, special = tokenizer_pair
        tok.save(os.path.join(folder, "tokenizer.json"))
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as fh:
            json.dump(
                {
                    "chat_template": special["chat_template"],
                    "eos_token": "<|im_end|>",
                    "bos_token": "<|im_start|>",
                },
                fh,
            )
    return str(folder)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory, smollm_tokenizer):
    """(folder, transformers model) for the llama-gqa-untied variant."""
    model, d = tiny_hf_model("llama-gqa-untied")
    folder = write_hf_folder(tmp_path_factory.mktemp("tiny-llama"), model, d, smollm_tokenizer)
    return folder, model


@pytest.fixture(scope="session")
def tiny_llm(tiny_folder, monkeypatch_session):
    from deepinfer import LLM

    return LLM(tiny_folder[0], dtype="float32", device="cpu", seed=0)


@pytest.fixture(scope="session")
def monkeypatch_session():
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    yield mp
    mp.undo()


def give_blocks(
    runner, seqs, positions: int = 64, *, block_size: int = 4, max_rows: int | None = None, seed=0
):
    """Allocate ``runner``'s paged cache and hand each sequence its own blocks for ``positions``
    positions, the block ids shuffled (what the scheduler would do, without one)."""
    import random

    from deepinfer.sequence import Status

    per = -(-positions // block_size)
    runner.allocate(1 + per * len(seqs), block_size, max_rows or len(seqs))
    ids = list(range(1, 1 + per * len(seqs)))
    random.Random(seed).shuffle(ids)
    for i, s in enumerate(seqs):
        s.block_table = ids[i * per : (i + 1) * per]
        s.status = Status.RUNNING
