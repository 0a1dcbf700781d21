"""Loading the families from Hugging Face folders: the family found by `architectures`, clear
errors for an unsupported one, for config fields out of range and for weights whose shapes do not
match the config (naming the tensor), and the older config.json spellings of Gemma 3 and Qwen."""

from __future__ import annotations

import json
import os

import pytest
from safetensors.torch import load_file, save_file

from deepinfer.config import ModelConfig
from deepinfer.loader import load_model

from .conftest import BASE, FAMILIES


def _config(model_type: str, **changes) -> dict:
    folder_cfg = {**BASE, **FAMILIES[model_type], "model_type": model_type, **changes}
    return folder_cfg


def _rewrite(folder: str, tmp_path, *, config=None, weights=None) -> str:
    """A copy of ``folder`` with config.json changed by ``config(d)`` and weights by ``weights(sd)``."""
    out = tmp_path / "copy"
    out.mkdir()
    for name in os.listdir(folder):
        (out / name).write_bytes(open(os.path.join(folder, name), "rb").read())
    if config:
        d = json.loads((out / "config.json").read_text())
        config(d)
        (out / "config.json").write_text(json.dumps(d))
    if weights:
        sd = load_file(str(out / "model.safetensors"))
        weights(sd)
        save_file(sd, str(out / "model.safetensors"))
    return str(out)


def test_unsupported_architecture_names_it_and_the_supported_list(family_folder, tmp_path):
    folder = _rewrite(family_folder("qwen3")[0], tmp_path,
                      config=lambda d: d.update(architectures=["GPT2LMHeadModel"]))  # fmt: skip
    match = r"architecture 'GPT2LMHeadModel' .*\(supported: .*Qwen3ForCausalLM.*Gemma3ForCausalLM"
    with pytest.raises(ValueError, match=match):
        load_model(folder)


L0, L1 = "model.layers.0.", "model.layers.1."


def _cut(name: str, n: int):
    return lambda sd: sd.update({name: sd[name][:n].clone()})


def _drop(name: str):
    return lambda sd: sd.pop(name)


def _copy(dst: str, src: str):
    return lambda sd: sd.update({dst: sd[src].clone()})


@pytest.mark.parametrize(
    ("model_type", "edit", "match"),
    [
        ("qwen3", _cut(L1 + "self_attn.q_norm.weight", 8),
         r"tensor 'layers.1.self_attn.q_norm.weight' has shape \[8\], expected \[16\] = \[head_dim=16\]"),
        ("qwen3", _drop(L0 + "self_attn.k_norm.weight"), "lacks weight 'layers.0.self_attn.k_norm.weight'"),
        ("phi3", _cut(L0 + "mlp.gate_up_proj.weight", 96),
         r"tensor 'layers.0.mlp.gate_up_proj.weight' has shape \[96, 64\], expected \[192, 64\] = "
         r"\[2 x intermediate_size=96"),
        ("qwen3_moe", _drop(L0 + "mlp.experts.5.up_proj.weight"), "lacks weight 'layers.0.mlp.experts.5.up"),
        ("qwen3_moe", _copy(L0 + "mlp.experts.8.up_proj.weight", L0 + "mlp.experts.0.up_proj.weight"),
         r"tensor 'layers.0.mlp.experts.8.up_proj.weight' belongs to expert 8, but num_local_experts=8"),
        ("gemma3_text", _drop(L1 + "post_feedforward_layernorm.weight"),
         "lacks weight 'layers.1.post_feedforward_layernorm.weight'"),
    ],
)  # fmt: skip
def test_weights_that_do_not_match_name_the_tensor(family_folder, tmp_path, model_type, edit, match):
    folder = _rewrite(family_folder(model_type)[0], tmp_path, weights=edit)
    with pytest.raises(ValueError, match=match):
        load_model(folder)


@pytest.mark.parametrize(
    ("model_type", "changes", "match"),
    [
        ("qwen3_moe", {"num_experts_per_tok": 9, "num_experts": 8},
         "num_experts_per_tok=9: expected at most num_experts=8"),
        ("qwen3_moe", {"num_experts": 0}, r"num_experts=0: expected an integer in \[1,"),
        ("gemma3_text", {"layer_types": ["full_attention"]}, "layer_types=.*expected a list of 2 layer"),
        ("gemma3_text", {"layer_types": ["full_attention", "chunked"]}, "layer_types='chunked'"),
        ("gemma3_text", {"sliding_window": -4}, r"sliding_window=-4: expected a window size"),
        ("gemma3_text", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar=0: expected a finite number"),
        ("gemma2", {"attn_logit_softcapping": -1}, "attn_logit_softcapping=-1: expected a finite number > 0"),
        ("gemma3_text", {"hidden_activation": "relu"}, "hidden_act='relu': expected one of gelu_pytorch"),
        ("phi3", {"partial_rotary_factor": 0.75}, "partial rotary embeddings are not supported"),
    ],
)  # fmt: skip
def test_config_fields_out_of_range_name_the_key(model_type, changes, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf(_config(model_type, **changes))


def test_family_fields_from_config():
    g = ModelConfig.from_hf(_config("gemma3_text"))
    assert g.layer_windows == [4, 0] and g.rope_local_theta == 1e4 and g.rope_theta == 1e6
    assert g.rope_scaling["factor"] == 2.0 and g.attn_scale == 24**-0.5 and g.final_softcap == 3.0
    # the config.json of checkpoints written before transformers 5: one rope_theta, a local base
    # and a layer pattern
    old = {**_config("gemma3_text"), "rope_theta": 1e6, "rope_local_base_freq": 1e4,
           "sliding_window_pattern": 2, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}  # fmt: skip
    del old["rope_parameters"], old["layer_types"]
    o = ModelConfig.from_hf(old)
    assert (o.layer_windows, o.rope_local_theta, o.rope_theta, o.rope_scaling["factor"]) == (
        [4, 0],
        1e4,
        1e6,
        2.0,
    )
    assert ModelConfig.from_hf(_config("mistral")).layer_windows == [4, 4]
    assert ModelConfig.from_hf(_config("mistral", sliding_window=None)).layer_windows == []
    # Qwen: a sliding_window with use_sliding_window false is no window
    q = ModelConfig.from_hf(
        _config("qwen3", sliding_window=4096, use_sliding_window=False, max_window_layers=1)
    )
    assert q.layer_windows == []
    q = ModelConfig.from_hf(_config("qwen3", sliding_window=8, use_sliding_window=True, max_window_layers=1))
    assert q.layer_windows == [0, 8]
    m = ModelConfig.from_hf(_config("qwen3_moe"))
    assert (m.num_experts, m.num_experts_per_tok, m.moe_layers, m.norm_topk_prob) == (
        8,
        2,
        [True, False],
        True,
    )
