"""Load a Hugging Face checkpoint (repo id or local folder) from safetensors + tokenizer.json.

Only data formats are read: config/tokenizer JSON and safetensors (memory-mapped). No pickle,
no `trust_remote_code`.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import torch

from ..config import ModelConfig
from .types import LoadedModel

_PATTERNS = ["*.json", "*.safetensors", "*.jinja"]


def resolve_folder(model: str) -> str:
    """A local folder for `model`: itself if it is a folder, else a hub snapshot (cache first)."""
    if os.path.isdir(model):
        return model
    looks_local = model.startswith((".", "/", "~")) or model.count("/") != 1
    if looks_local or os.path.exists(model):
        raise FileNotFoundError(f"model path {model!r} does not exist (or is not a folder / .gguf file)")
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(model, allow_patterns=_PATTERNS)
    except Exception as e:  # hub errors are many classes (offline, 404, gated, bad id)
        raise FileNotFoundError(
            f"model {model!r} is not a local folder or .gguf file, and the hub snapshot failed "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). "
            "Pass a folder with config.json, *.safetensors and tokenizer.json, a .gguf file, or None "
            "for the embedded SmolLM2-135M-Instruct."
        ) from e


def _read_json(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _token_id(tok, value: Any) -> int | None:
    if isinstance(value, dict):
        value = value.get("content")
    return tok.token_to_id(value) if isinstance(value, str) else None


def load_hf(model: str) -> LoadedModel:
    from safetensors import safe_open
    from tokenizers import Tokenizer

    folder = resolve_folder(model)
    cfg_path = os.path.join(folder, "config.json")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"{folder!r} has no config.json: not a Hugging Face model folder")
    try:
        config = ModelConfig.from_hf(_read_json(cfg_path))
    except ValueError as e:
        raise ValueError(f"{cfg_path!r}: {e}") from e

    tok_path = os.path.join(folder, "tokenizer.json")
    tekken_path = os.path.join(folder, "tekken.json")  # Mistral's Tekken, where there is no tokenizer.json
    if not os.path.isfile(tok_path) and not os.path.isfile(tekken_path):
        raise FileNotFoundError(
            f"{folder!r} has no tokenizer.json (nor Mistral's tekken.json): a fast (tokenizers) "
            "tokenizer file is required"
        )
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise FileNotFoundError(
            f"{folder!r} has no *.safetensors weights (pickled .bin files are never loaded)"
        )
    tekken: dict[str, Any] = {}
    if not os.path.isfile(tok_path):
        from ..tokenizer import tekken_tokenizer

        try:
            data = _read_json(tekken_path)
        except ValueError as e:
            raise ValueError(f"{tekken_path!r} is not valid JSON: {e}") from e
        tokenizer, tekken = tekken_tokenizer(data, tekken_path)
    else:
        try:
            tokenizer = Tokenizer.from_file(tok_path)
        except Exception as e:  # tokenizers raises a bare Exception
            raise ValueError(f"{tok_path!r} is not a readable tokenizer.json: {e}") from e
    shapes = {}  # every shape checked against config.json before any tensor is read
    for path in files:
        with safe_open(path, framework="pt") as fh:
            for name in fh.keys():
                shapes[name] = tuple(fh.get_slice(name).get_shape())
    try:
        config.check_weights(shapes)
    except ValueError as e:
        raise ValueError(f"{folder!r}: the weights do not match config.json: {e}") from e
    weights: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(path, framework="pt") as fh:
            for name in fh.keys():
                weights[name] = fh.get_tensor(name)

    tcfg_path = os.path.join(folder, "tokenizer_config.json")
    tcfg = _read_json(tcfg_path) if os.path.isfile(tcfg_path) else {}
    template = tcfg.get("chat_template")
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if template is None and os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as fh:
            template = fh.read()
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next(
            (t["template"] for t in template if t.get("name") == "default"), template[0]["template"]
        )

    eos_ids = list(config.eos_token_ids)
    gen_path = os.path.join(folder, "generation_config.json")
    if os.path.isfile(gen_path):
        g = _read_json(gen_path).get("eos_token_id")
        eos_ids += [g] if isinstance(g, int) else list(g or [])
    tok_eos = _token_id(tokenizer, tcfg.get("eos_token"))
    if tok_eos is not None:
        eos_ids.append(tok_eos)
    eos_ids += tekken.get("eos_token_ids", [])
    bos = _token_id(tokenizer, tcfg.get("bos_token"))
    if bos is None:
        bos = tekken.get("bos_token_id")
    return LoadedModel(
        config=config,
        weights=weights,
        tokenizer=tokenizer,
        source=model,
        bos_token_id=bos if bos is not None else config.bos_token_id,
        eos_token_ids=list(dict.fromkeys(eos_ids)),
        chat_template=template,
        add_bos_token=False,  # tokenizer.json's post-processor adds BOS where the model wants it
    )
