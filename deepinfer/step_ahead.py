"""Async scheduling: the next decode step launched before this step's tokens reach the host.

A plain decode step ends with the host waiting on the device: the sampled tokens are read back,
each sequence takes its token (stop tokens, stop strings, lengths), the scheduler commits and
plans the next step, and only then is the next forward launched. The device idles for that
turn-around (0.1-0.6 ms a step on an H100's host at 16-64 rows: docs/async-scheduling.md).

With async scheduling (``LLM(async_scheduling=...)``, on by default on CUDA) a step whose rows
all sample (a decode step, or one where the prompts end) and whose next step can be known
without its tokens launches that next step at once: the same rows, each one position on, its
token taken on the device from the sampler's output (the model runner's ``step_ahead``), and
its own token sampled on the device too where no row needs the host first (below). Then the
host reads this step's tokens (a copy recorded before that launch, so it does not wait for it),
accepts them and commits, and the next engine step takes the step already running
(``StepAhead.take``) instead of launching one: its forward started while the host worked.

What is sampled does not change: a row's token is a function of its logits, seed and step
(docs/sampling-kernel.md), and the step ahead runs the rows the next step would run, at the same
positions. A row that finishes (a stop token, a stop string, its length, an abort) is left out
of the next step, and the step ahead's result for it is dropped. A request that arrives meanwhile
is admitted one step later (``Scheduler.schedule(admit=False)``): the step already running is
taken first. When the next step is not that decode all the same (DSpark drafts), the step ahead
is dropped and the step runs as usual: its rows write the same K/V at the same positions again.

A step launches ahead only when nothing its tokens decide is needed to launch the next forward
(``may_step_ahead``): DSpark will not draft next step, no request is waiting for admission,
every running row is in the step, and not every row is at its last token.

A row with a constraint (its mask needs this step's token) or asking for logprobs (read on the
host) cannot be sampled on the device at once: the forward of the step launched ahead runs, and
the next engine step samples its logits once the host has read this step's tokens, advanced the
matchers and filled the masks. The host's turn-around and the fill then run while that forward
does, so a step takes the longer of the two (forward and draw, or turn-around and fill) where
without the step ahead it takes the forward (the fill beside it) plus the turn-around. Such
steps launch ahead unless ``LLM.host_rows_ahead`` is off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sequence import Sequence


@dataclass
class StepAhead:
    """A decode step in flight: ``rows`` (in step order), each at position ``starts[i]`` (its
    ``num_cached`` when launched), their logits and, when sampled ahead, their tokens (on the
    device)."""

    rows: list[Sequence]
    starts: list[int]
    logits: torch.Tensor  # [len(rows), V]
    tokens: torch.Tensor | None  # [len(rows)] int64; None: the step that takes it samples
    _at: dict[int, int] = field(init=False, repr=False)  # id(row) -> its index

    def __post_init__(self) -> None:
        self._at = {id(s): i for i, s in enumerate(self.rows)}

    def take(self, rows: list[Sequence], decode: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The logits and tokens (None: not sampled) of ``rows`` (a decode step's rows, each one
        token) when this step ran them all at their current positions, in that order: the step
        already computed them. None otherwise (the caller runs its own step)."""
        if not decode or not rows:
            return None
        idx = []
        for s in rows:
            i = self._at.get(id(s))
            if i is None or self.starts[i] != s.num_cached:
                return None
            idx.append(i)
        if len(idx) == len(self.rows):  # (idx is increasing: the running order is kept)
            return self.logits, self.tokens
        at = torch.tensor(idx, dtype=torch.int64).to(self.logits.device, non_blocking=True)
        return self.logits[at], None if self.tokens is None else self.tokens[at]


def may_step_ahead(rows: list[Sequence], running: int, waiting: int, may_draft) -> bool:
    """May the step of ``rows`` (each of them sampling) launch the next decode step's forward
    before its tokens are read?
    ``running``: the scheduler's running requests; ``waiting``: requests not yet admitted;
    ``may_draft(rows)``: may DSpark draft for these rows next step."""
    if waiting or len(rows) != running:
        return False
    if all(len(s.output_token_ids) + 1 >= s.max_tokens for s in rows):
        return False  # every row ends with this step's token
    return not may_draft(rows)


def samples_ahead(rows: list[Sequence]) -> bool:
    """Are the tokens of a step launched ahead over ``rows`` sampled at once? Not where a row's
    mask (its constraint) or its logprobs need the host first."""
    return all(s.constraint is None and s.params.logprobs is None for s in rows)


class TokenRead:
    """Tokens on the device read back without waiting for work queued after them: on CUDA a
    copy into a pinned buffer (kept from read to read) and an event, recorded by ``start``;
    ``wait`` waits for that event only."""

    def __init__(self) -> None:
        self._host: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None
        self._tokens: torch.Tensor | None = None

    def start(self, tokens: torch.Tensor) -> None:
        self._tokens = tokens
        if tokens.device.type != "cuda":
            return
        n = tokens.numel()
        if self._host is None or self._host.numel() < n:
            self._host = torch.empty(max(n, 256), dtype=tokens.dtype, pin_memory=True)
            self._event = torch.cuda.Event()
        self._host[:n].copy_(tokens, non_blocking=True)
        self._event.record()

    def wait(self) -> list[int]:
        tokens, self._tokens = self._tokens, None
        if tokens.device.type != "cuda":
            return tokens.tolist()
        self._event.synchronize()
        return self._host[: tokens.numel()].tolist()
