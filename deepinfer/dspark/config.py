"""DSparkConfig: the settings of speculative decoding, from ``LLM(dspark=...)``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

POLICIES = ("constrained", "all", "off")
SCHEDULES = ("confidence", "fixed")


@dataclass(frozen=True)
class DSparkConfig:
    """How DSpark drafts and verifies.

    Parameters
    ----------
    default : "constrained", "all" or "off"
        Which requests speculate when their ``SamplingParams.speculative`` is None: those with a
        constraint (the default: grammar-forced drafts make it pay), every request, or none.
        ``speculative=True/False`` on a request overrides it.
    max_drafts : int
        Most drafts verified per request and step (K; the verify forward runs K + 1 positions).
    ngram_max, ngram_min : int
        Longest and shortest suffix of the text so far looked up in the prompt and output.
    schedule : "confidence" or "fixed"
        "confidence": each step, choose the number of positions that maximises expected tokens
        per second (drafts weighted by their recent acceptance, step time measured online);
        "fixed": always verify every draft found, up to max_drafts (tests, benchmarks).
    min_acceptance : float
        A draft source (forced, n-gram) whose recent acceptance falls below this is turned off
        for that request, then probed again after a back-off that doubles each time.
    cost_slope : float or None
        Prior cost of one more token in the forward relative to the fixed cost of a step (the
        online fit starts from it); None = by device (CPU 0.2, CUDA 0.005).
    cuda_graphs : bool
        Replay the verify forward as CUDA graphs where the engine replays its decode so.
    ragged : bool or None
        Let a verify step feed each row only its own drafts, every fed position a row of the
        decode CUDA graphs, so the step costs by its tokens rather than rows x the widest row
        (the confidence schedule then picks the most confident drafts of all rows). None: where
        the decode graphs run it (CUDA, default mode); True: on the CPU too, and under the
        "fixed" schedule (every draft found, each row its own); False: never.
    """

    default: str = "constrained"
    max_drafts: int = 8
    ngram_max: int = 4
    ngram_min: int = 1
    schedule: str = "confidence"
    min_acceptance: float = 0.1
    cost_slope: float | None = None
    cuda_graphs: bool = True
    ragged: bool | None = None

    def __post_init__(self) -> None:
        if self.default not in POLICIES:
            raise ValueError(f"dspark default must be one of {POLICIES}, got {self.default!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"dspark schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name in ("max_drafts", "ngram_max", "ngram_min"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"dspark {name} must be an int >= 1, got {v!r}")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"dspark ngram_min ({self.ngram_min}) exceeds ngram_max ({self.ngram_max})")
        if not 0 <= self.min_acceptance < 1:
            raise ValueError(f"dspark min_acceptance must be in [0, 1), got {self.min_acceptance!r}")
        if self.ragged not in (None, True, False):
            raise ValueError(f"dspark ragged must be None, True or False, got {self.ragged!r}")
        if self.cost_slope is not None and not self.cost_slope >= 0:
            raise ValueError(f"dspark cost_slope must be >= 0 or None, got {self.cost_slope!r}")

    @property
    def rollback_margin(self) -> int:
        """The most draft positions one verify step can write and then discard: what a
        sliding-window KV group keeps behind its window (docs/kv-cache.md, "Sliding windows")."""
        return self.max_drafts

    @classmethod
    def parse(cls, value: bool | dict[str, Any] | DSparkConfig) -> DSparkConfig:
        """``True`` = the defaults; ``False`` = off unless a request asks; a dict = fields."""
        if isinstance(value, DSparkConfig):
            return value
        if value is True:
            return cls()
        if value is False:
            return cls(default="off")
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"dspark got unknown keys {unknown}; known: {sorted(known)}")
            return cls(**value)
        raise ValueError(f"dspark must be a bool or a dict of DSparkConfig fields, got {value!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
