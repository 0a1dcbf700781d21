"""DSpark: speculative decoding with grammar-forced and n-gram drafts, verified by the model.

``drafts.py`` proposes (forced tokens from the constraint, n-gram copies from the prompt and
output), ``scheduler.py`` decides how many positions to verify from the drafts' confidence and
the measured step cost, ``verify.py`` runs the multi-position forward and the per-position
bitmasks, ``deepinfer.kernels.verify`` accepts and samples the bonus token; ``dspark.py`` joins
them for ``LLM._run``.
"""

from .config import DSparkConfig
from .dspark import DSpark, DSparkStats

__all__ = ["DSpark", "DSparkConfig", "DSparkStats"]
