"""Batch-extraction fixtures: one local Ray cluster for the whole session (Ray takes seconds to
start), a tiny random-weight model folder, and the run's command line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ..engine.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample_data"
SCHEMA = json.loads((SAMPLE / "schema.json").read_text())


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of 2 CPUs, started once; the runs find it connected."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'deepinfer[ray]')")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # (the workers inherit it)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def _write_tiny_model(folder: Path, tokenizer_pair) -> str:
    """A Llama-family HF folder with random weights (the engine tests' tiny config) and
    SmolLM2's tokenizer and chat template."""
    import torch
    from safetensors.torch import save_file

    cfg = tiny_config("llama-gqa-untied")
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    g = torch.Generator().manual_seed(0)

    def w(*shape, scale=0.15):
        return (torch.randn(*shape, generator=g) * scale).contiguous()

    sd = {"model.embed_tokens.weight": w(v, h, scale=0.3), "lm_head.weight": w(v, h)}
    sd["model.norm.weight"] = torch.ones(h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd |= {
            p + "self_attn.q_proj.weight": w(q, h),
            p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h),
            p + "self_attn.o_proj.weight": w(h, q),
            p + "mlp.gate_proj.weight": w(inter, h),
            p + "mlp.up_proj.weight": w(inter, h),
            p + "mlp.down_proj.weight": w(h, inter),
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
        }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(sd, str(folder / "model.safetensors"))
    tok, special = tokenizer_pair
    tok.save(str(folder / "tokenizer.json"))
    marks = {"chat_template": special["chat_template"], "eos_token": "<|im_end|>"}
    marks["bos_token"] = "<|im_start|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(marks))
    return str(folder)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, embedded_gguf_path) -> str:
    from deepinfer.loader.gguf import build_tokenizer
    from deepinfer.loader.gguf_file import GGUFFile

    f = GGUFFile(embedded_gguf_path)
    pair = build_tokenizer(f.metadata, embedded_gguf_path)
    f.close()
    return _write_tiny_model(tmp_path_factory.mktemp("tiny-batch"), pair)


def argv(schema, input, output, *extra) -> list[str]:
    return [
        "--schema",
        str(schema),
        "--input",
        str(input),
        "--output",
        str(output),
        "--no-progress",
        *map(str, extra),
    ]
