"""Confidence-scheduled verification: how many draft positions each step verifies, and
whether a step drafts at all.

Confidence of a draft = the probability that it is accepted given that the drafts before it
were: per request and per source, an exponential moving average of observed acceptance
(forced drafts start near-certain, n-gram drafts at a coin flip). A request's j-th draft is
worth ``g_j = a_1 * ... * a_j`` expected tokens (it only counts if every draft before it is
accepted too). The step then verifies T positions (T - 1 drafts per row, each row padded to T)
where T maximises

    expected tokens per second = (B + sum_b sum_{j < T} g_{b,j}) / cost(B, T)

with T = 1 meaning a plain decode step (no drafts; on CUDA the decode graphs). Where the engine
can run a ragged verify step (``choose``'s ``ragged``: each row feeds only its own drafts, every
fed position a row of the decode graphs), the step may instead verify each row's most confident
drafts only: the drafts of all rows, best first, up to M tokens in all, with M chosen the same
way (its cost is a decode step of M rows, so drafts pay where a padded width would not). ``cost`` is
measured online (``CostModel``): the wall time of whole steps, an exponential moving average per
(path, batch bucket, width bucket), so the decision compares this device's verify step at this
batch with its own decode step there; shapes not measured yet are predicted by a linear fit.
A step drafts only when its expected tokens per second beat plain decoding's (gain > 1): on a
GPU at a large batch, where a verify forward of K+1 positions costs more than a CUDA-graph
decode step, drafting turns itself off unless the drafts are confident enough to pay for it.
A shape that looks too expensive is probed again now and then (``PROBE_GAP``, ``PROBE_AGE``).
A source whose acceptance falls below ``min_acceptance`` is switched off for its
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
    """Per-request draft statistics (the policy's memory of what paid): acceptance by source
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


def batch_bucket(B: int) -> int:
    """Rows rounded up to a power of two (the decode graphs' buckets are close to these)."""
    return 1 << max(B - 1, 0).bit_length()


def width_bucket(T: int) -> int:
    """Positions per row rounded up to the verify graphs' buckets (cuda_graphs.T_BUCKETS)."""
    from ..cuda_graphs import t_bucket

    return t_bucket(T) if T > 1 else 1


class StepTime:
    """Measured seconds of one step shape: an exponential moving average (EMA_RATE a sample;
    the first sample of a shape is dropped -- on CUDA it includes the graph capture -- and
    outliers are clipped to OUTLIER x the average)."""

    __slots__ = ("mean", "samples", "last")

    def __init__(self) -> None:
        self.mean, self.samples, self.last = 0.0, 0, -1

    def observe(self, seconds: float, step: int) -> bool:
        """Fold a sample in; False for the dropped first one."""
        self.samples += 1
        self.last = step
        if self.samples == 1:
            return False
        if self.samples == 2:
            self.mean = seconds
        else:
            self.mean += EMA_RATE * (min(seconds, OUTLIER * self.mean) - self.mean)
        return True

    @property
    def measured(self) -> bool:
        return self.samples >= 2


EMA_RATE = 0.1
OUTLIER = 3.0
YIELD_RATE = 0.2  # weight of one verify step in the realized-tokens averages
YIELD_MIN = 3  # verify steps of a batch bucket before its realized tokens are trusted
YIELD_HEADROOM = 1.5  # may_pay: a step may gain up to this x the bucket's realized extra tokens
YIELD_CLAMP = (0.25, 1.25)  # calibration factor bounds
PROBE_GAP = 64  # plain steps between probes of a verify shape the model thinks does not pay
PROBE_AGE = 512  # steps after which a verify shape's measurement is probed again
PROBE_SHARE = 0.01  # a batch's drafting probes cost at most this share of its plain steps' time
PROBE_GAP_MAX = 4096
DRAFT_PROBE_MIN = 4  # fewest steps between drafting probes where drafting was measured not to pay
PROBE_MIN_RATIO = 0.5  # a stale shape is probed only if predicted at least this x plain tokens/s


class Yield:
    """Realized vs expected tokens of the verify steps of one batch bucket (EMAs)."""

    __slots__ = ("expected", "realized", "per_row", "steps")

    def __init__(self) -> None:
        self.expected = self.realized = 0.0  # extra tokens a row (beyond the one plain decode gives)
        self.per_row = 1.0
        self.steps = 0

    def observe(self, B: int, expected: float, realized: float) -> None:
        e, r, pr = (expected - B) / max(B, 1), (realized - B) / max(B, 1), realized / max(B, 1)
        if self.steps == 0:
            self.expected, self.realized, self.per_row = e, r, pr
        else:
            self.expected += YIELD_RATE * (e - self.expected)
            self.realized += YIELD_RATE * (r - self.realized)
            self.per_row += YIELD_RATE * (pr - self.per_row)
        self.steps += 1

    def factor(self) -> float:
        if self.steps < YIELD_MIN or self.expected <= 1e-9:
            return 1.0
        lo, hi = YIELD_CLAMP
        return min(max(self.realized / self.expected, lo), hi)


class Drafting:
    """Drafting steps of one batch bucket, as they turned out: tokens a row and wall seconds
    (EMAs), whether the step verified or, its drafts not worth it, decoded plainly. The first
    step of a bucket is dropped, as ``StepTime`` drops a shape's first: it carries one-time
    work (the verifier's buffers, the prompts' n-gram indexes) that no later step repeats."""

    __slots__ = ("per_row", "seconds", "steps", "dropped")

    def __init__(self) -> None:
        self.per_row = self.seconds = 0.0
        self.steps = 0
        self.dropped = False

    def observe(self, B: int, tokens: int, seconds: float) -> None:
        if not self.dropped:
            self.dropped = True
            return
        pr = tokens / max(B, 1)
        if self.steps == 0:
            self.per_row, self.seconds = pr, seconds
        else:
            self.per_row += YIELD_RATE * (pr - self.per_row)
            self.seconds += YIELD_RATE * (min(seconds, OUTLIER * self.seconds) - self.seconds)
        self.steps += 1


class CostModel:
    """Seconds per step, measured online by the engine (per LLM, so per device).

    ``times[(path, batch bucket, width bucket)]``: an EMA of the measured wall time of whole
    steps ("decode": the engine's own decode step, CUDA graphs where it replays them, width 1;
    "verify": DSpark's multi-position forward of T positions a row, with its masks and kernel).
    ``device[...]``: the forward's device seconds of each shape, timed at warm-up before the
    first step (``seed``; CUDA graphs). A shape not measured online is predicted from its
    device time plus the host overhead a measured decode step showed over its own device time;
    with no device time either, by ``a + b * (tokens in the forward)``, one fit per path (the
    other path's fit, then the prior ``slope``, before any sample).
    """

    def __init__(self, slope: float) -> None:
        self.slope = slope
        self.fits = {"decode": _Fit(slope), "verify": _Fit(slope)}
        self.times: dict[tuple[str, int, int], StepTime] = {}
        self.device: dict[tuple[str, int, int], float] = {}  # warm-up: device seconds of a shape
        self.rows: dict[int, float] = {}  # warm-up: device seconds of the decode graph, by its rows
        self._row_buckets: list[int] = []  # sorted keys of ``rows``
        # per batch bucket: realized vs expected tokens of verify steps (``observe_tokens``)
        self.yields: dict[int, Yield] = {}
        # per (batch bucket, plain?): drafting steps' outcome, and plain steps timed alike
        self.drafting: dict[tuple[int, bool], Drafting] = {}

    def observe_drafting(self, B: int, tokens: int, seconds: float, plain: bool = False) -> None:
        """A step that drafted (``gate`` to the next ``gate``: drafts, matchers brought up to date,
        the forward it chose, verify or plain) emitted ``tokens`` for its B rows; ``plain``: a
        step that did not draft, timed the same way."""
        self.drafting.setdefault((batch_bucket(B), plain), Drafting()).observe(B, tokens, seconds)

    def _bucket_pays(self, b: int) -> bool | None:
        """drafting_pays of batch bucket b from its own drafting steps, None before YIELD_MIN."""
        d = self.drafting.get((b, False))
        if d is None or d.steps < YIELD_MIN:
            return None
        p = self.drafting.get((b, True))
        plain = p.seconds if p is not None and p.steps >= YIELD_MIN else self.step_seconds("decode", b, 1)
        return d.per_row / max(d.seconds, 1e-12) > 1.0 / max(plain, 1e-12)

    def _drafting_bucket(self, B: int) -> int | None:
        """The batch bucket whose drafting steps speak for B: its own once it drafted YIELD_MIN
        times, else the largest smaller bucket where drafting was measured not to pay (a row
        gains the same tokens at any batch, and its verify forward only costs more at a larger
        one), else None. So a batch passing through a bucket it never drafted at (a batch
        filling up) does not pay three drafting steps to learn there what a smaller batch
        already showed."""
        b = batch_bucket(B)
        if self._bucket_pays(b) is not None:
            return b
        smaller = sorted((bb for bb, plain in self.drafting if not plain and bb < b), reverse=True)
        return next((bb for bb in smaller if self._bucket_pays(bb) is False), None)

    def drafting_pays(self, B: int) -> bool | None:
        """Did this batch bucket's drafting steps, all costs in, emit more tokens per second
        than its plain steps (timed alike, else the decode step time)? False also where a
        smaller batch's drafting did not pay and this bucket has not drafted YIELD_MIN times
        (``_drafting_bucket``); else None before YIELD_MIN drafting steps."""
        b = self._drafting_bucket(B)
        return None if b is None else self._bucket_pays(b)

    def drafting_gap(self, B: int) -> int:
        """Steps between drafting probes where drafting does not pay: as many as make the probes
        cost PROBE_SHARE of the plain steps' time, from the extra cost of a drafting step over a
        plain one measured at the bucket that speaks for B (``_drafting_bucket``; a smaller
        bucket's extra cost is scaled by the ratio of the buckets: drafts, masks and matchers are
        work a row), but at least DRAFT_PROBE_MIN. So where a probe costs little (a small batch)
        drafting comes back within a few steps of drafts that pay again (a request leaving a
        free string for structure), and where it costs many plain steps (a large batch) it is
        rare. PROBE_GAP before any bucket has measured drafting."""
        b = self._drafting_bucket(B)
        if b is None:
            return PROBE_GAP
        d = self.drafting[(b, False)]
        p = self.drafting.get((b, True))
        plain = p.seconds if p is not None and p.steps >= YIELD_MIN else self.step_seconds("decode", b, 1)
        extra = max(d.seconds - plain, 0.0) / max(plain, 1e-12)  # in plain steps
        extra *= batch_bucket(B) / b
        return int(min(max(DRAFT_PROBE_MIN, extra / PROBE_SHARE), PROBE_GAP_MAX))

    def seed(self, path: str, B: int, T: int, seconds: float) -> None:
        """The device seconds of a step shape's forward, timed before the first step."""
        self.device[(path, batch_bucket(B), width_bucket(T))] = seconds
        if path == "decode":
            self.rows[B] = seconds
            self._row_buckets = sorted(self.rows)

    def ragged_bucket(self, M: int) -> int:
        """Rows of the decode graph that a ragged verify step feeding M tokens replays: the
        fewest of those timed at warm-up that hold M, else M rounded up to a power of two."""
        for r in self._row_buckets:
            if r >= M:
                return r
        return batch_bucket(M)

    def ragged_sizes(self, B: int, limit: int):
        """The token counts worth weighing for a ragged verify step of B rows feeding at most
        ``limit`` tokens: the most each decode graph size from B + 1 up holds (fewer cost the
        same), the last cut to ``limit``."""
        M = B + 1
        while M <= limit:
            M = min(self.ragged_bucket(M), limit)
            yield M
            M += 1

    def ragged_seconds(self, B: int, M: int) -> float:
        """Seconds of a ragged verify step of B rows feeding M tokens in all: measured where a
        step of this batch bucket and graph size was, else the decode graph's warm-up device
        time at those rows plus a verify step's host overhead, else the verify fit."""
        r = self.ragged_bucket(M)
        t = self.times.get(("ragged", batch_bucket(B), r))
        if t is not None and t.measured:
            return t.mean
        dev = self.rows.get(r)
        if dev is not None:
            return dev + self.overhead(B, "verify")
        return self.predict("verify", r)

    def observe_tokens(self, B: int, expected: float, realized: float) -> None:
        """A verify step of B rows expected ``expected`` tokens (B + the drafts' confidence)
        and emitted ``realized``."""
        self.yields.setdefault(batch_bucket(B), Yield()).observe(B, expected, realized)

    def calibration(self, B: int) -> float:
        """Realized / expected extra tokens (beyond one a row) of verify steps at this batch
        bucket: scales the drafts' confidence in ``choose`` (1.0 before YIELD_MIN steps)."""
        y = self.yields.get(batch_bucket(B))
        return y.factor() if y is not None else 1.0

    def realized_per_row(self, B: int) -> float | None:
        """Tokens a row gained per verify step at this batch bucket (EMA), None before YIELD_MIN."""
        y = self.yields.get(batch_bucket(B))
        return y.per_row if y is not None and y.steps >= YIELD_MIN else None

    def may_pay(self, B: int, max_drafts: int, max_tokens: int, rate: float = 1.0, ragged: int = 0) -> bool:
        """Can any verify step of B rows with at most ``max_drafts`` drafts a row beat a plain
        decode step, even if every draft were accepted at ``rate`` (the best acceptance any
        running request has for any class of draft: 1 + rate + rate^2 + ... tokens a row), or --
        once this batch bucket has verified YIELD_MIN times -- at YIELD_HEADROOM x its realized
        extra tokens a row? ``ragged``: most tokens a ragged verify step may feed (0: none), whose
        drafts are spread evenly over the rows for the bound. False: drafting this step cannot
        pay, so no drafts need be made."""
        plain = B / max(self.step_seconds("decode", B, 1), 1e-12) * (1 + 1e-9)
        real = self.realized_per_row(B)
        cap = 1.0 + YIELD_HEADROOM * (real - 1.0) if real is not None else float("inf")
        bound = 1.0
        for T in range(2, max_drafts + 2):
            if B * T > max_tokens:
                break
            bound += rate ** (T - 1)
            per_row = min(float(T), bound, cap)
            if B * per_row / max(self.step_seconds("verify", B, T), 1e-12) > plain:
                return True
        for M in self.ragged_sizes(B, min(ragged, max_tokens, B * (max_drafts + 1))):
            q, r = divmod(M - B, B)  # q drafts a row, r rows one more
            tokens = B * (1.0 + sum(rate**j for j in range(1, q + 1))) + r * rate ** (q + 1)
            if min(tokens, B * cap) / max(self.ragged_seconds(B, M), 1e-12) > plain:
                return True
        return False

    def observe(self, path: str, tokens: int, seconds: float, rows: int | None = None, step: int = 0) -> None:
        """A measured step: ``tokens`` = rows x positions in its forward (``rows`` = its batch);
        path "ragged": a ragged verify step feeding ``tokens`` in all (keyed by its graph's rows,
        ``ragged_bucket``; the verify fit)."""
        if rows is not None:
            if path == "ragged":
                key = (path, batch_bucket(rows), self.ragged_bucket(tokens))
            else:
                key = (path, batch_bucket(rows), width_bucket(max(tokens // max(rows, 1), 1)))
            if not self.times.setdefault(key, StepTime()).observe(seconds, step):
                return  # a shape's first step: kept out of the fit too
        self.fits["verify" if path == "ragged" else path].observe(float(tokens), seconds)

    def predict(self, path: str, tokens: int) -> float:
        """The linear fit's seconds (or, before any measurement, the prior in units of the fixed cost)."""
        coef = (
            self.fits[path].coefficients()
            or self.fits["decode" if path == "verify" else "verify"].coefficients()
        )
        a, b = coef if coef is not None else (1.0, self.slope)
        return a + b * tokens

    def measured(self, path: str, B: int, T: int) -> StepTime | None:
        t = self.times.get((path, batch_bucket(B), width_bucket(T)))
        return t if t is not None and t.measured else None

    def last_seen(self, path: str, B: int, T: int) -> int | None:
        """The step this shape was last measured (online), -1 if only timed at warm-up, None if never."""
        m = self.measured(path, B, T)
        if m is not None:
            return m.last
        return -1 if (path, batch_bucket(B), width_bucket(T)) in self.device else None

    def overhead(self, B: int, kind: str = "decode") -> float:
        """Host seconds a step adds to its forward's device time: measured steps' wall time over
        their warm-up device time, at this batch bucket if measured, else the nearest. ``kind``
        "decode": decode steps'; "verify": verify steps' (padded or ragged: their masks and
        kernel), decode steps' until one is measured."""
        b = batch_bucket(B)
        paths = ("verify", "ragged") if kind == "verify" else ("decode",)
        best = None
        for (path, bb, wb), t in self.times.items():
            if path not in paths or not t.measured:
                continue
            dev = self.rows.get(wb) if path == "ragged" else self.device.get((path, bb, wb))
            if dev is not None:
                d = abs(bb.bit_length() - b.bit_length())
                if best is None or d < best[0]:
                    best = (d, max(t.mean - dev, 0.0))
        if best is None:
            return self.overhead(B) if kind == "verify" else 0.0
        return best[1]

    def step_seconds(self, path: str, B: int, T: int) -> float:
        """Seconds of a step of B rows x T positions: measured where this shape was, else its
        warm-up device time plus the host overhead, else the fit."""
        t = self.measured(path, B, T)
        if t is not None:
            return t.mean
        dev = self.device.get((path, batch_bucket(B), width_bucket(T)))
        if dev is not None:
            return dev + self.overhead(B, path)
        return self.predict(path, B * width_bucket(T))  # the graphs run the bucketed width


@dataclass
class Choice:
    T: int  # positions per row (1: a plain decode step)
    gain: float  # expected tokens/s of verifying T positions over plain decoding (1.0 for T = 1)
    probe: bool = False  # verified to measure a shape, not because it was predicted to pay
    expected: float = 0.0  # tokens the step expects (B + the drafts' confidence, uncalibrated)
    counts: list[int] | None = None  # a ragged verify step: the drafts each row verifies


def choose(
    confidence: list[list[float]],
    cost: CostModel,
    max_tokens: int,
    *,
    step: int = 0,
    last_probe: int = -(1 << 30),
    probes: bool = True,
    ragged: int = 0,
) -> Choice:
    """The T in 1..max(len)+1 with the most expected tokens per second (T = 1: plain decode),
    or, where ``ragged`` (most tokens a ragged verify step may feed; 0: none) allows, a ragged
    step verifying each row's most confident drafts (``choose_ragged``) if it promises more.

    Expected tokens of a step = B + sum_b sum_{j < T} g_{b,j} (g = confidence: drafts 1..j all
    accepted); seconds = ``cost.step_seconds`` (measured per batch and width bucket). Drafting
    wins only when its expected tokens/s beat plain decoding's (gain > 1). When plain decoding
    wins but a verify shape with expected tokens to gain was never measured, or not for
    PROBE_AGE steps, it is verified anyway at most once every PROBE_GAP steps (a probe), so a
    stale or prior-only estimate cannot keep drafting off for good. Symmetrically, a step that
    would verify is decoded plainly (a probe) while the plain step's time at this batch bucket has
    not been measured, or not for PROBE_AGE steps (then at most once every PROBE_GAP steps), so a
    guessed plain cost cannot keep drafting on for good.
    ``max_tokens`` caps B * T (the step's token budget).
    """
    B = len(confidence)
    longest = max((len(g) for g in confidence), default=0)
    plain = B / max(cost.step_seconds("decode", B, 1), 1e-12)
    gain = [0.0] * (longest + 1)  # gain[j] = sum_b g_{b,j}
    for g in confidence:
        for j, x in enumerate(g, 1):
            gain[j] += x
    cal = cost.calibration(B)  # realized / expected extra tokens of this bucket's verify steps
    best = Choice(1, 1.0)
    stale = None
    expected = raw = float(B)
    raws = {1: raw}
    for T in range(2, longest + 2):
        if B * T > max_tokens:
            break
        raw += gain[T - 1]
        raws[T] = raw
        expected += cal * gain[T - 1]
        ratio = expected / max(cost.step_seconds("verify", B, T), 1e-12) / plain
        if ratio > best.gain * (1 + 1e-9):
            best = Choice(T, ratio, expected=raw)
        seen = cost.last_seen("verify", B, T)
        # never measured: probed; measured (or timed at warm-up) long ago: probed only where
        # it is predicted close enough to paying that the probe costs little
        if gain[T - 1] > 0 and (seen is None or (step - seen > PROBE_AGE and ratio >= PROBE_MIN_RATIO)):
            stale = T  # the widest such shape
    if ragged > B:
        r = choose_ragged(confidence, cost, min(ragged, max_tokens), cal, plain)
        if r is not None and r.gain > best.gain * (1 + 1e-9):
            best = r
    if not probes:
        return best
    if best.T == 1 and stale is not None and step - last_probe >= PROBE_GAP:
        return Choice(stale, 1.0, probe=True, expected=raws[stale])
    seen = cost.last_seen("decode", B, 1)
    if best.T > 1 and (seen is None or (step - seen > PROBE_AGE and step - last_probe >= PROBE_GAP)):
        # the comparison rests on the plain step's time at this batch: measure it first (a fit
        # from other batches or from verify steps can be far off), and again when it is stale
        return Choice(1, 1.0, probe=True)
    return best


def choose_ragged(
    confidence: list[list[float]], cost: CostModel, max_tokens: int, cal: float, plain: float
) -> Choice | None:
    """The best ragged verify step: the m most confident drafts of all rows (a row's drafts
    are taken in order, their confidence never rising), for the m that maximises expected
    tokens per second, M = B + m tokens costing ``cost.ragged_seconds``, M over
    ``cost.ragged_sizes``. None when no row has a draft."""
    B = len(confidence)
    ranked = sorted(((x, b) for b, g in enumerate(confidence) for x in g), key=lambda e: -e[0])
    best, taken, raw = None, 0, 0.0
    for M in cost.ragged_sizes(B, min(max_tokens, B + len(ranked))):
        while taken < M - B:
            raw += ranked[taken][0]
            taken += 1
        ratio = (B + cal * raw) / max(cost.ragged_seconds(B, M), 1e-12) / plain
        if best is None or ratio > best[0] * (1 + 1e-9):
            best = (ratio, M - B, raw)
    if best is None:
        return None
    ratio, m, raw = best
    counts = [0] * B
    for _, b in ranked[:m]:
        counts[b] += 1
    return Choice(max(counts) + 1, ratio, expected=B + raw, counts=counts)


def choose_positions(confidence: list[list[float]], cost: CostModel, max_tokens: int) -> int:
    """``choose(...).T`` without probing."""
    return choose(confidence, cost, max_tokens, probes=False).T
