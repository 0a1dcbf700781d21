"""Confidence-scheduled verification: how many draft positions each step verifies.

Confidence of a draft = the probability that it is accepted given that the drafts before it
were: per request and per source, an exponential moving average of observed acceptance
(forced drafts start near-certain, n-gram drafts at a coin flip). A request's j-th draft is
worth ``g_j = a_1 * ... * a_j`` expected tokens (it only counts if every draft before it is
accepted too). The step then verifies T positions (T - 1 drafts per row, each row padded to T)
where T maximises

    expected tokens per second = (B + sum_b sum_{j < T} g_{b,j}) / cost(B, T)

with T = 1 meaning a plain decode step (no drafts). ``cost`` is fit online from measured step
times (``CostModel``), so the choice follows the device: on a GPU a few more positions cost
almost nothing and long draft runs pay; on a CPU each position costs compute and only confident
drafts pay. A source whose acceptance falls below ``min_acceptance`` is switched off for its
request and probed again after a back-off that doubles each time: drafting is turned off where
it does not pay.
"""

from __future__ import annotations

from dataclasses import dataclass

from .drafts import FORCED, K_COPY1, K_COPY2, K_COPY3, K_COPY_NEXT, K_FORCED, NGRAM

# acceptance before anything is observed: by source (the on/off switch) and by confidence class
PRIOR_SOURCE = {FORCED: 0.9, NGRAM: 0.5}
PRIOR_KIND = {K_FORCED: 0.9, K_COPY1: 0.3, K_COPY2: 0.45, K_COPY3: 0.6, K_COPY_NEXT: 0.75}
RATE = 0.2  # weight of one observation in the moving average
MIN_OBSERVED = 4  # observations before a source may be switched off
BACKOFF = (8, 64)  # steps a switched-off source waits before a probe: first, most


class SourceStats:
    """Acceptance of one draft source (or confidence class) for one request."""

    __slots__ = ("rate", "seen", "off_until", "backoff")

    def __init__(self, prior: float) -> None:
        self.rate = prior
        self.seen = 0
        self.off_until = -1
        self.backoff = BACKOFF[0]

    def observe(self, accepted: bool) -> None:
        self.rate += RATE * (float(accepted) - self.rate)
        self.seen += 1

    def enabled(self, step: int, min_acceptance: float) -> bool:
        if step < self.off_until:
            return False
        if self.seen >= MIN_OBSERVED and self.rate < min_acceptance:
            self.off_until = step + self.backoff  # off; the probe after it starts from here
            self.backoff = min(2 * self.backoff, BACKOFF[1])
            self.seen = MIN_OBSERVED - 1
            self.rate = min_acceptance  # one failed probe switches it off again
            return False
        return True


class RequestStats:
    """Per-request draft statistics (the scheduler's memory of what paid): acceptance by source
    (to switch a source off) and by confidence class (to weigh drafts). A new request starts
    from ``prior`` (the rates of the requests before it), else from PRIOR_KIND."""

    __slots__ = ("sources", "kinds", "drafted", "accepted")

    def __init__(self, prior: RequestStats | None = None) -> None:
        self.sources = {s: SourceStats(p) for s, p in PRIOR_SOURCE.items()}
        self.kinds = {k: SourceStats(prior.kinds[k].rate if prior else p) for k, p in PRIOR_KIND.items()}
        self.drafted = 0
        self.accepted = 0

    def confidence(self, kinds: list[int]) -> list[float]:
        """g_j: probability that drafts 1..j are all accepted."""
        g, out = 1.0, []
        for k in kinds:
            g *= self.kinds[k].rate
            out.append(g)
        return out

    def observe(self, sources: list[int], kinds: list[int], accepted: int) -> None:
        """Drafts before `accepted` were accepted, the one at `accepted` rejected, the rest unseen."""
        seen = min(accepted + 1, len(sources))
        for j in range(seen):
            ok = j < accepted
            self.sources[sources[j]].observe(ok)
            self.kinds[kinds[j]].observe(ok)
        self.drafted += len(sources)
        self.accepted += accepted


@dataclass
class _Fit:
    """Exponentially weighted least squares of seconds = a + b * n, pulled towards b = slope * a."""

    slope: float
    decay: float = 0.95
    w: float = 0.0
    sn: float = 0.0
    snn: float = 0.0
    st: float = 0.0
    snt: float = 0.0

    def observe(self, n: float, t: float) -> None:
        d = self.decay
        self.w, self.sn, self.snn = d * self.w + 1, d * self.sn + n, d * self.snn + n * n
        self.st, self.snt = d * self.st + t, d * self.snt + n * t

    def coefficients(self) -> tuple[float, float] | None:
        if self.w == 0:
            return None
        # penalty kappa * nbar^2 * (b - s a)^2: one observation's worth, in seconds^2
        s, nbar = self.slope, self.sn / self.w
        kap = nbar * nbar
        a11, a12, a22 = self.w + kap * s * s, self.sn - kap * s, self.snn + kap
        det = a11 * a22 - a12 * a12
        a = (self.st * a22 - a12 * self.snt) / det
        b = (a11 * self.snt - a12 * self.st) / det
        return max(a, 0.0), max(b, 0.0)


class CostModel:
    """Seconds per step as a + b * (tokens in the forward), one fit per path ("decode": the
    engine's own decode step; "verify": DSpark's multi-position forward)."""

    def __init__(self, slope: float) -> None:
        self.slope = slope
        self.fits = {"decode": _Fit(slope), "verify": _Fit(slope)}

    def observe(self, path: str, tokens: int, seconds: float) -> None:
        self.fits[path].observe(float(tokens), seconds)

    def predict(self, path: str, tokens: int) -> float:
        """Predicted seconds (or, before any measurement, the prior in units of the fixed cost)."""
        coef = self.fits[path].coefficients() or self.fits["decode" if path == "verify" else "verify"].coefficients()
        a, b = coef if coef is not None else (1.0, self.slope)
        return a + b * tokens


def choose_positions(confidence: list[list[float]], cost: CostModel, max_tokens: int) -> int:
    """T in 1..max(len)+1 maximising expected tokens per second (T = 1: plain decode).

    confidence[b] = g_{b,1..n_b}; ``max_tokens`` caps B * T (the step's token budget).
    """
    B = len(confidence)
    longest = max((len(g) for g in confidence), default=0)
    best_t, best = 1, B / max(cost.predict("decode", B), 1e-12)
    gain = [0.0] * (longest + 1)  # gain[j] = sum_b g_{b,j}
    for g in confidence:
        for j, x in enumerate(g, 1):
            gain[j] += x
    expected = float(B)
    for T in range(2, longest + 2):
        if B * T > max_tokens:
            break
        expected += gain[T - 1]
        rate = expected / max(cost.predict("verify", B * T), 1e-12)
        if rate > best * (1 + 1e-9):
            best_t, best = T, rate
    return best_t
