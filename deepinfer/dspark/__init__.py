"""DSpark: speculative decoding with grammar-forced and n-gram drafts, verified by the model.

``drafts.py`` proposes (forced tokens from the constraint, n-gram copies from the prompt and
output), ``policy.py`` decides how many positions to verify from the drafts' confidence and
the measured step cost, ``verify.py`` fills the per-position bitmasks and the kernel's inputs,
``ModelRunner.verify`` runs the multi-position forward, ``deepinfer.kernels.verify`` accepts and
samples the bonus token; ``dspark.py`` joins them for ``LLM.step``. DSpark takes plain inputs
(the running sequences, the cache length, the token budget, the tokenizer, a forward callable),
never the ``LLM``.
"""

from .config import DSparkConfig
from .dspark import DSpark, DSparkStats

__all__ = ["DSpark", "DSparkConfig", "DSparkStats"]
