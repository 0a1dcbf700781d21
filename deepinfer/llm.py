"""LLM: the user-facing engine. Load a model, then generate / chat in batches, or drive the
engine core a step at a time: ``add_request`` / ``step`` / ``abort_request`` /
``has_unfinished_requests`` (what ``generate`` does, and what a server loop would do).

One ``step`` reads top to bottom: schedule (``Scheduler``: which requests compute how many
tokens, in which KV blocks) -> forward (``ModelRunner``) with the per-request bitmasks filled
meanwhile -> sample -> per-request on_token -> commit (full KV blocks kept for reuse).
Requests join when the paged KV cache has blocks for them and leave when they finish, between
steps.
"""

from __future__ import annotations

import atexit
import gc
import logging
import random
import time
from collections.abc import Sequence as Seq
from typing import Any

import torch

from . import _threads, kernels
from .block_pool import BlockPool
from .config import ModelConfig
from .detokenizer import IncrementalDetokenizer
from .dspark import DSpark
from .kernels import int4_gemv
from .kernels.int4_weights import torch_layout_problem
from .loader import load_model
from .loader.gguf_blocks import GGUFMatrix
from .model_runner import DETERMINISTIC_CHUNK, ModelRunner
from .models.kv_cache import DEFAULT_BLOCK_SIZE, group_blocks, kv_blocks
from .models.llama import LlamaModel
from .outputs import RequestOutput, TokenLogprob
from .prompts import Rendered, prompt_ids, render_chat
from .sample_args import SampleArgs
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence
from .step_ahead import StepAhead, TokenRead, may_step_ahead, samples_ahead
from .structured import MaskFiller, Structured, judge, split_reasoning
from .tokenizer import Message, Tokenizer

# What an engine step computed, for ``metrics``: one token a row, prompt tokens (with or without
# decode rows beside them), or DSpark's drafts verified.
STEP_KINDS = ("decode", "prefill", "verify")
_unfreeze_at_exit: list[bool] = []  # gc.unfreeze registered with atexit (once a process)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
log = logging.getLogger(__name__)  # construction's warm-up, phase by phase (INFO)


def _resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} asked for, but CUDA is not available here")
    return dev


def _resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        # bf16 halves the bytes a decode step reads (2x faster here); only where the CPU has
        # native bf16 dot products (AVX512-BF16 / AMX), else float32.
        return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def _resolve_quantization(q, device: torch.device, dtype: torch.dtype, asked, deterministic: bool,
                          ranks: int) -> str | None:  # fmt: skip
    """The quantization asked for, checked. "auto" is "gguf" on the CPU in one process where the
    int4 planes run: where the activations are bfloat16 (CPUs with native bf16) and torch's int4
    kernel reads the planes; or, where it reads another layout (AVX2 CPUs), through the C kernel
    of every row when its build is loaded and no dtype other than bfloat16 was asked for."""
    if q == "auto":
        if device.type != "cpu" or ranks != 1:
            return None
        if torch_layout_problem() is None:
            return "gguf" if dtype == torch.bfloat16 else None
        return "gguf" if asked in ("auto", "bfloat16", torch.bfloat16) and int4_gemv.available() else None
    if q is None:
        return None
    if q not in ("int8", "gguf"):
        raise ValueError(f"quantization must be 'auto', None, 'gguf' or 'int8', got {q!r}")
    if device.type != "cpu":
        raise ValueError(f"quantization={q!r} runs on the CPU only, not on {device}")
    if asked != "auto" and dtype != torch.bfloat16:
        raise ValueError(f"quantization={q!r} computes in bfloat16; dtype={asked!r} asked for {dtype}")
    if deterministic and q == "int8":
        raise ValueError("quantization='int8' has no batch-invariant kernel: not with deterministic=True")
    if ranks != 1:
        raise ValueError(f"quantization={q!r} runs in one process: not with tensor or expert parallel")
    return q


class LLM:
    """A loaded model ready to generate.

    Parameters
    ----------
    model : str or None
        None for the embedded SmolLM2-135M-Instruct; a .gguf path; a local Hugging Face folder;
        or a hub repo id (downloaded with huggingface_hub, which honours HF_HUB_OFFLINE).
    dtype : "auto", "float32", "bfloat16", "float16" or torch.dtype
        "auto" is bfloat16 on CUDA and on CPUs with native bf16, else float32; bfloat16 too
        where ``quantization`` resolves to "gguf" (its int4 kernels' activations).
    device : "auto", "cpu", "cuda", ...
    max_num_seqs : int
        Most sequences running together.
    max_model_len : int or None
        Context length cap (default: the model's, at most 8192).
    max_num_batched_tokens : int
        Most tokens computed in one step; a longer prompt is prefilled in chunks, beside the
        running requests' decodes.
    kv_cache_memory : int, float or None
        The paged KV cache's size: bytes (int), or a fraction of the device's free memory
        (float in (0, 1]; on the CPU of its total memory). None: 80% of the free memory on
        CUDA, 1 GiB on the CPU, and never more than ``max_num_seqs`` full-length requests need.
    block_size : int
        Positions a KV block holds (16).
    prefix_caching : bool
        Reuse the KV blocks of prompt prefixes seen before (across requests and ``generate``
        calls); outputs are the same with or without it.
    seed : int or None
        Draws the seeds of requests that give none.
    quantization : "auto", "gguf", "int8" or None
        "gguf": a GGUF file's Q4_0, Q4_1 and Q8_0 matrices kept as int4 planes, bfloat16
        activations (CPU only). "auto" (the default) is "gguf" on the CPU where those kernels run
        (docs/models.md, "Quantized weights on the CPU"), else None. "int8": every dense
        matrix kept as int8 with one scale per output column, multiplied by bfloat16
        activations in torch's packed int8 CPU kernel (CPU only; a decode step reads half the
        bytes of bfloat16). Outputs differ from bfloat16 weights by the rounding of each weight
        to 1 of 255 levels of its column's range (docs/models.md).
    deterministic : bool
        Batch-invariant forward: a request (prompt + seed) gets bit-identical logits and tokens
        alone, in any batch and at any batch position (on CUDA, prefill and decode through
        batch-invariant Triton matmul, RMSNorm and attention kernels; on CPU, prefill one
        request at a time and decode in fixed tiles with per-row attention). Costs throughput:
        README, "Deterministic mode".
    enforce_eager : bool
        Never capture CUDA graphs (decode launches every kernel from Python; for debugging).
    dspark : bool or dict
        DSpark speculative decoding (README, "DSpark"): True (default) = on for requests with
        a constraint, False = off unless a request sets ``speculative=True``, a dict = the
        fields of ``deepinfer.dspark.DSparkConfig``. Lossless: drafts are verified by the model
        (docs/dspark.md says exactly what that means in each mode); where drafting does not
        pay, a cost model stops it (benchmarks/RESULTS.md, "DSpark").
    async_scheduling : bool or None
        Launch a decode step's successor before its tokens are read back, so the
        device does not wait on the host between steps (docs/async-scheduling.md). Outputs are
        the same either way. None: on where the fixed-shape decode runs on CUDA (not with
        ``enforce_eager`` outside deterministic mode, nor tensor parallelism); True where that
        decode cannot take its tokens from the device is a ValueError.
    tensor_parallel_size : int
        Ranks the model is split over, Megatron-style (one worker process per rank besides this
        one; rank r on ``cuda:r``): docs/parallel.md.
    expert_parallel_size : int
        Ranks a mixture-of-experts model's experts are spread over (EPLB placement).
    data_parallel_size : int
        Engine replicas, each in its own process (on ``cuda:i``), behind one router: the
        constructor then returns a `deepinfer.parallel.replicas.Replicas` with this API.

    On CUDA (unless ``enforce_eager``) construction also warms up (``capture_graphs``): every
    decode and verify CUDA graph is captured, and each step shape timed, before the first step.
    """

    def __new__(cls, *args, data_parallel_size: int = 1, **kwargs):
        if data_parallel_size != 1:
            from .parallel.replicas import Replicas

            return Replicas(*args, engine=cls, data_parallel_size=data_parallel_size, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        model: str | None = None,
        *,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device = "auto",
        max_num_seqs: int = 64,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 8192,
        kv_cache_memory: int | float | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        prefix_caching: bool = True,
        seed: int | None = None,
        deterministic: bool = False,
        enforce_eager: bool = False,
        dspark: bool | dict = True,
        async_scheduling: bool | None = None,
        quantization: str | None = "auto",
        tensor_parallel_size: int = 1,
        expert_parallel_size: int = 1,
        data_parallel_size: int = 1,
    ):
        _threads.configure_torch_threads()
        asked_quantization = quantization
        self.device = _resolve_device(device)
        self.dtype = _resolve_dtype(dtype, self.device)
        quantization = _resolve_quantization(quantization, self.device, self.dtype, dtype, deterministic,
                                             tensor_parallel_size * expert_parallel_size)  # fmt: skip
        if quantization is not None:
            self.dtype = torch.bfloat16  # the packed int8 and int4 kernels' activations
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs!r}")
        # CPU threads step by step (deepinfer/_threads.py), made before the load so that its first
        # window of the machine's load spans it; fixed in deterministic mode, whose promise should
        # not rest on every kernel splitting work alike at any thread count
        self._step_threads = (
            _threads.StepThreads() if self.device.type == "cpu" and not deterministic else None
        )
        t0 = time.perf_counter()
        loaded = load_model(model, keep_blocks=quantization == "gguf")
        if quantization == "gguf" and not any(isinstance(w, GGUFMatrix) for w in loaded.weights.values()):
            if asked_quantization == "gguf":
                raise ValueError(f"quantization='gguf' keeps a GGUF file's Q4_0, Q4_1 and Q8_0 matrices in "
                                 f"their blocks; {loaded.source!r} has none")  # fmt: skip
            quantization, self.dtype = None, _resolve_dtype(dtype, self.device)
        why = torch_layout_problem() if quantization == "gguf" and not int4_gemv.available() else None
        if why:  # ("auto" checked it)
            raise ValueError(f"quantization='gguf' cannot run on this CPU: {why}, and the C kernel that "
                             f"would take every row is not loaded ({int4_gemv.STATE.why}); use "
                             "quantization=None")  # fmt: skip
        # what the matrices are kept as: None (dtype), "int8", "gguf" (the file's blocks, int4 planes)
        self.quantization = quantization
        self.config: ModelConfig = loaded.config
        self.tokenizer = Tokenizer.from_loaded(loaded)
        self.max_model_len = min(max_model_len or self.config.max_position_embeddings, 1 << 20)
        if max_model_len is None:
            self.max_model_len = min(self.max_model_len, 8192)
        self.tokenizer.max_prompt_tokens = self.max_model_len  # (a longer text is refused untokenised)
        if tensor_parallel_size != 1 or expert_parallel_size != 1:  # worker ranks hold the other shards
            from .parallel.model import parallel_model

            self.model = parallel_model(
                model, loaded, tensor_parallel_size=tensor_parallel_size,
                expert_parallel_size=expert_parallel_size, dtype=self.dtype, device=self.device,
                max_len=self.max_model_len, deterministic=deterministic,
            )  # fmt: skip
        else:
            self.model = LlamaModel(
                loaded.config,
                loaded.weights,
                dtype=self.dtype,
                device=self.device,
                max_len=self.max_model_len,
                int4=quantization == "gguf",
                planes=loaded.planes,
            )
            if quantization == "int8":
                self.model.quantize_int8()
        del loaded
        self.deterministic = deterministic
        self.runner = ModelRunner(
            self.model,
            cuda_graphs=False if enforce_eager or getattr(self.model, "eager_only", False) else None,
            deterministic=deterministic,
        )
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # One call per step samples every row; the fused Triton kernel (deepinfer.kernels.sample)
        # has the same keyword signature and is swapped in here.
        self.sample_fn = kernels.sample  # fused Triton kernel on CUDA, torch reference on CPU
        self.structured = Structured(self.tokenizer, self.config.vocab_size)
        cuda = self.device.type == "cuda"
        self.masks = MaskFiller(self.config.vocab_size, pin=cuda, inline=cuda)
        self.dspark = DSpark(dspark)  # speculative decoding: drafts verified in one forward
        self._seed_rng = random.Random(seed)
        self._next_id = 0
        self._special_ids = frozenset(self.tokenizer.special_token_ids) | frozenset(
            self.tokenizer.eos_token_ids
        )
        # the paged KV cache and the engine core: requests added and not yet handed back, by id
        if not (
            isinstance(block_size, int) and 1 <= block_size <= 1024 and block_size & (block_size - 1) == 0
        ):
            raise ValueError(f"block_size must be a power of two in [1, 1024], got {block_size!r}")
        worst = self.max_num_seqs * -(-self.max_model_len // block_size) + 1  # every request at full length
        num_blocks = kv_blocks(kv_cache_memory, self.model.block_bytes(block_size), self.device, worst)
        # one pool per KV-cache group (full attention, sliding window: docs/kv-cache.md)
        windows, margin = [w for w, _ in self.model.kv_groups], self.dspark.config.rollback_margin
        nbytes = [self.model.block_bytes(block_size, g) for g in range(len(windows))]
        counts = group_blocks(num_blocks, nbytes, windows, margin, block_size, max_num_seqs,
                              max_num_batched_tokens)  # fmt: skip
        self.runner.allocate(counts if len(counts) > 1 else num_blocks, block_size, max_num_seqs)
        log.info("model on %s in %.1f s; KV cache %s blocks of %d tokens", self.device,
                 time.perf_counter() - t0, "+".join(map(str, counts)), block_size)  # fmt: skip
        # async scheduling (step_ahead.py): a plain decode step launches the next one before
        # its tokens reach the host; on by default where the device runs apart from the host
        on = self.device.type == "cuda" if async_scheduling is None else bool(async_scheduling)
        if async_scheduling and not self.runner.feeds_device_tokens:
            raise ValueError(
                "async_scheduling=True needs the fixed-shape decode (CUDA graphs, or deterministic "
                "mode) of a model on one device"
            )
        self.async_scheduling = on and self.runner.feeds_device_tokens
        self._ahead: StepAhead | None = None  # the next decode step, launched ahead
        self._ahead_counts = [0, 0]  # steps launched ahead, of them taken
        self._read = TokenRead()  # a step's tokens read back behind the step launched ahead
        # do steps with constrained or logprob rows launch ahead too (their draw then waits for
        # the next step, once the host has filled the masks)
        self.host_rows_ahead = True
        pools = [BlockPool(n, block_size, caching=prefix_caching) for n in counts]
        align = DETERMINISTIC_CHUNK if self.runner.tile else None
        self.scheduler = Scheduler(max_num_seqs, max_num_batched_tokens, pools, chunk_align=align,
                                   windows=windows, margin=margin)  # fmt: skip
        self._requests: dict[Any, Sequence] = {}
        self._relaxed: dict[Any, list[str]] = {}  # the notes of a request's constraint
        self._stream: set = set()  # requests whose partial outputs step() returns
        # Deferred matcher work (CUDA, inline masks): a constrained row's sampled token joins
        # its output at once, and its matcher accepts it while the next forward runs (before
        # that step's masks are filled), not between the read-back and the next launch. A row
        # its constraint ends there was decoded one step too many: that token is dropped.
        self._pending: list[tuple[Sequence, int]] = []
        self._compile_seconds, self._compiles = 0.0, 0  # constraints compiled at admission (cache hits too)
        self._steps = {kind: [0, 0.0] for kind in STEP_KINDS}  # steps and their seconds, by kind
        self._recent_step = 0.0  # a step's time lately (halving the weight of each older step)
        self.step_times: dict[tuple[str, int, int], float] = {}  # warm-up: device seconds a step shape
        self.capture_graphs()  # before the first step, no request pays a capture (CUDA)
        # the model, tokenizer tries and kernels live as long as the engine: the collector no
        # longer walks them (a full collection over them takes 0.1-0.6 s, landing on a step or a
        # mask); objects made later are collected as usual. At exit they are handed back, so the
        # interpreter's last collection frees them (native bindings report frozen ones as leaks).
        gc.freeze()
        if not _unfreeze_at_exit:
            atexit.register(gc.unfreeze)
            _unfreeze_at_exit.append(True)
        self.load_seconds = time.perf_counter() - t0

    # -- public API ----------------------------------------------------------------------------
    def generate(
        self,
        prompts: str | Seq[str] | Seq[Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for each prompt (text, or token ids); outputs in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, Seq) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt (text or ids)
        prompts = list(prompts)
        if params is None:
            params = SamplingParams()
        param_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(param_list) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(param_list)} SamplingParams")
        if self.has_unfinished_requests():
            raise RuntimeError("generate() with requests of add_request() unfinished: step() them out first")
        # each prompt checked and tokenised first: a bad one is that request's error output
        seqs = [self._make_sequence(p, sp) for p, sp in zip(prompts, param_list)]
        for s in seqs:
            self._add(s)
        counted = {s.request_id for s in seqs if not s.is_finished}  # the bar counts what runs
        bar = None
        if use_tqdm and counted:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(counted), desc="generate", unit="req", leave=False)
        outputs: dict[Any, RequestOutput] = {}
        try:
            while self.has_unfinished_requests():
                for o in self.step():
                    outputs[o.request_id] = o
                    if bar is not None and o.request_id in counted:
                        bar.update(1)
                        if bar.n % 16 == 0 and self.scheduler.prompt_tokens:  # the prefix cache at work
                            bar.set_postfix_str(f"prefix hits {self.metrics()['prefix_cache_hit_rate']:.0%}")
        except BaseException:
            self._discard(seqs)  # the engine is left as it was before the call
            raise
        finally:
            if bar is not None:
                bar.close()
        return [outputs[s.request_id] for s in seqs]

    # -- engine core ---------------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | Seq[int],
        params: SamplingParams | None = None,
        request_id: Any = None,
        *,
        stream: bool = False,
    ) -> Any:
        """Queue one request (prompt text or token ids); it joins the running batch at a later
        ``step``. Its prompt is checked and its constraint compiled here: a bad one fails this
        request only (its output, finish_reason "error" and the message in ``error``, comes
        back from the next ``step``). ``request_id``: any hashable not in use (default: the
        next integer; an id in use raises ValueError). ``stream``: ``step`` also returns its partial
        outputs (``finished=False``) whenever it gains tokens. Returns the request id."""
        seq = self._make_sequence(prompt, SamplingParams() if params is None else params, request_id)
        self._add(seq, stream)
        return seq.request_id

    def step(self) -> list[RequestOutput]:
        """One engine step: schedule -> forward -> sample -> post-process. Returns an output per
        request that finished (since the last step: ``finished=True``, in no particular order)
        and, for streamed requests, a partial one per request that gained tokens."""
        t0 = time.perf_counter()
        sch = self.scheduler
        drafting = self._gate(sch.running)  # may this step draft (DSpark)?
        if self._pending and (sch.waiting or drafting):
            self._settle()  # a prefill or drafting step next: every matcher up to date first
        # which rows compute how many tokens, in which blocks; with a decode step of the running
        # rows already launched, arrivals are admitted next step (that step is not dropped)
        out = sch.schedule(admit=self._ahead is None)
        for s, why in out.refused:
            s.fail(why, self.tokenizer)
        ahead, self._ahead = self._ahead, None  # a decode step launched ahead: this one, or dropped
        if out.rows:
            if self._step_threads is not None:  # every core, unless masks or a neighbour need one
                host = drafting or (
                    any(s.constraint is not None for s in out.batch)
                    and _threads.host_needs_core(self.masks.recent, self._recent_step)
                )
                self._step_threads.for_step(host, small=out.decode and len(out.rows) <= _threads.SMALL_ROWS)
            masks = self.masks.start(out.batch)  # bitmasks on a host thread while the device runs
            if out.decode:
                out.verify = self._plan_drafts(out.rows)  # DSpark drafts, or None: plain decode
                if out.verify is not None and not sch.reserve(out.verify.seqs, out.verify.T):
                    out.verify = None  # no free blocks for the drafts' positions: a plain step
            if out.verify is not None:  # drafts verified in one multi-position forward
                self.dspark.step(out.verify, masks, forward=self.runner.verify, tokenizer=self.tokenizer,
                                 vocab_size=self.config.vocab_size, device=self.device)  # fmt: skip
            else:
                taken = None if ahead is None else ahead.take(out.rows, out.decode)
                if taken is not None:  # this step's forward (and draws) were launched last step
                    self._ahead_counts[1] += 1
                    for s in out.rows:
                        s.num_cached += 1
                    logits, sampled = taken
                else:
                    logits, sampled = self.runner.step(out.rows, out.counts), None
                self.masks.launched()
                self._settle()  # the previous step's deferred matcher work, behind this forward
                if not out.decode and self.dspark.indexes_ahead(self.device.type):
                    self.dspark.index_prompts(sch.running)  # new prompts' n-grams, behind the prefill
                if sampled is None and out.batch:
                    sampled, lps = self._sample(out.batch, logits, masks.wait()[1])  # masks applied + sampled
                else:
                    masks.wait()
                    lps = None
                if sampled is not None:
                    go = (
                        self.async_scheduling
                        and len(out.batch) == len(out.rows)  # (a decode step, or prompts that end here)
                        and may_step_ahead(out.rows, len(sch.running), len(sch.waiting), self._may_draft)
                    )
                    if go and not self.host_rows_ahead:
                        go = samples_ahead(out.rows)  # no row's draw needs the host
                    if go:
                        self._read.start(sampled)  # (the copy is queued before the next step)
                        self._ahead = self._step_ahead(out.rows, sampled)
                        tokens = self._read.wait()
                    else:
                        tokens = sampled.tolist()
                    self._accept(out.batch, tokens, lps)
            sch.commit(out.rows, ahead=self._ahead is not None)
            kind = self._steps["verify" if out.verify is not None else "decode" if out.decode else "prefill"]
            kind[0] += 1
            took = time.perf_counter() - t0
            kind[1] += took
            self._recent_step += 0.5 * (took - self._recent_step)  # (for the CPU's thread policy)
        return self._outputs(out.finished + sch.reap(), out.batch)

    def metrics(self) -> dict[str, int | float]:
        """Counters of the KV cache and the scheduler since the engine started: prompt tokens
        admitted (``prompt_tokens``), computed (``prefill_tokens``) and found in the prefix
        cache (``prefix_cache_hit_tokens``, ``prefix_cache_hit_rate``); blocks of the pool
        (``kv_blocks_total``, ``kv_blocks_used`` by running requests, ``kv_blocks_cached`` kept
        for reuse, ``kv_block_size``); ``preemptions``, ``evictions``; requests ``running`` and
        ``waiting`` now; constraint work: ``constraints_compiled`` and the seconds it took
        (``constraint_compile_seconds``, cache hits included), of it building the compiler for
        the vocabulary (``constraint_setup_seconds``, once), ``mask_seconds`` spent filling
        bitmasks and ``mask_wait_seconds`` of it the step loop waited for (not hidden behind
        the forward); steps by kind and their host seconds: ``decode_steps`` (one token a row),
        ``prefill_steps`` (prompt tokens, with or without decode rows), ``verify_steps`` (DSpark
        drafts), and ``decode_step_seconds`` etc.; async scheduling: decode steps launched
        ahead (``decode_steps_ahead``) and of those the ones the next step took
        (``decode_steps_ahead_taken``; the others were dropped), and whether steps with
        constrained or logprob rows launch ahead (``host_rows_ahead``: async scheduling on and
        ``LLM.host_rows_ahead``)."""
        sch = self.scheduler
        pool = sch.pool
        return {
            "prompt_tokens": sch.prompt_tokens,
            "prefill_tokens": sch.prefill_tokens,
            "prefix_cache_hit_tokens": sch.hit_tokens,
            "prefix_cache_hit_rate": sch.hit_tokens / sch.prompt_tokens if sch.prompt_tokens else 0.0,
            "kv_blocks_total": pool.capacity,
            "kv_blocks_used": pool.num_used,
            "kv_blocks_cached": pool.num_cached,
            "kv_block_size": pool.block_size,
            "preemptions": sch.preemptions,
            "evictions": sum(p.evictions for p in sch.pools),
            "swa_replays": sch.swa_replays,
            "swa_replay_tokens": sch.swa_replay_tokens,
            "swa_full_recomputes": sch.swa_full_recomputes,
            "running": len(sch.running),
            "waiting": len(sch.waiting),
            "constraints_compiled": self._compiles,
            "constraint_compile_seconds": self._compile_seconds,
            "constraint_setup_seconds": self.structured.setup_seconds,
            "mask_seconds": self.masks.mask_seconds,
            "mask_wait_seconds": self.masks.wait_seconds,
            **{f"{k}_steps": n for k, (n, _) in self._steps.items()},
            **{f"{k}_step_seconds": t for k, (_, t) in self._steps.items()},
            "decode_steps_ahead": self._ahead_counts[0],
            "decode_steps_ahead_taken": self._ahead_counts[1],
            "host_rows_ahead": self.async_scheduling and self.host_rows_ahead,
        }

    def abort_request(self, request_id: Any) -> None:
        """End a request, waiting or running (its KV blocks are freed); its output, finish_reason
        "abort", comes back from the next ``step``. No-op for an unknown or finished request."""
        s = self.scheduler.abort(request_id)
        if s is not None:
            s.abort(self.tokenizer)

    def has_unfinished_requests(self) -> bool:
        """Requests added whose final output ``step`` has not returned yet."""
        return bool(self._requests)

    def capture_graphs(self, max_len: int | None = None, *, verify: bool | None = None) -> int:
        """Capture now the CUDA graphs a step would otherwise capture on first use (~0.1 s each
        at 8B scale): decode for every batch bucket up to ``max_num_seqs`` and key bucket up to
        ``max_len`` (default ``max_model_len``), and DSpark's verify forward at every width up to
        ``max_drafts + 1`` (``verify``: None = unless DSpark is off by default); compile the
        sampler's and the verify kernel's variants and time every step shape on the device
        (DSpark's cost model starts from these). Construction calls it; returns the number
        captured (0 off CUDA, and when everything is captured already)."""
        from .warmup import run_calls, sampling_calls, time_steps, verify_calls, verify_widths

        if not self.runner.cuda_graphs:
            return 0
        max_len = min(max_len or self.max_model_len, self.max_model_len)
        cfg = self.dspark.config
        if verify is None:
            verify = cfg.default != "off" and cfg.cuda_graphs
        widths = verify_widths(cfg.max_drafts) if verify else ()
        t0 = time.perf_counter()
        n = self.runner.capture_graphs(max_len, widths)
        if n:
            log.info("captured %d CUDA graphs in %.1f s", n, time.perf_counter() - t0)
            t0 = time.perf_counter()
            V = self.config.vocab_size
            calls = sampling_calls(V, self.device) + (verify_calls(V, self.device) if widths else [])
            run_calls(calls, self.device)  # one pool: the verifier's variants beside the sampler's
            log.info("compiled the sampler's%s variants in %.1f s", " and verifier's" if widths else "",
                     time.perf_counter() - t0)  # fmt: skip
            t0 = time.perf_counter()
            self.step_times = time_steps(self.runner, widths)
            log.info("timed %d step shapes in %.1f s", len(self.step_times), time.perf_counter() - t0)
        return n

    def compile_constraint(self, params: SamplingParams):
        """Compile ``params``' constraint now (cached and shared with later requests).

        Raises ``deepinfer.constraints.ConstraintError`` (a ValueError) naming what is wrong
        and where; useful to check a schema before a long batch run.
        """
        return self.structured.compile(params)

    def _output(self, s: Sequence, relaxed: list[str]) -> RequestOutput:
        parsed, error = None, s.error
        if s.constraint is not None and error is None and s.finish_reason != "abort":
            parsed, error = judge(s.params, s.text or "", s.finish_reason or "length", s.constraint.compiled)
        reasoning, text = None, s.text or ""
        if s.params.reasoning is not None:  # the block's text apart from what follows it
            markers = getattr(getattr(s.constraint, "compiled", None), "markers", None)
            reasoning, text = split_reasoning(s.params, markers or ("<think>", "</think>"), text)
        return RequestOutput(
            request_id=s.request_id,
            prompt=s.prompt,
            prompt_token_ids=s.prompt_token_ids,
            text=text,
            token_ids=list(s.output_token_ids),
            finish_reason=s.finish_reason or "length",
            stop_reason=s.stop_reason,
            parsed=parsed,
            error=error,
            relaxed=relaxed,
            reasoning=reasoning,
            logprobs=None if s.logprobs is None else s.logprobs[: len(s.output_token_ids)],
        )

    def chat(
        self,
        messages: Seq[Message] | Seq[Seq[Message]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them, then generate."""
        if not messages:
            raise ValueError("chat() needs at least one message")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        prompts = [  # a conversation the template refuses fails alone
            self.chat_prompt(c, add_generation_prompt=add_generation_prompt,
                             chat_template_kwargs=chat_template_kwargs)
            for c in conversations
        ]  # fmt: skip
        outs = self.generate(prompts, params, use_tqdm)
        for o, p in zip(outs, prompts):
            if isinstance(p, Rendered):
                o.prompt = str(p)
        return outs

    def chat_prompt(
        self,
        messages: Seq[Message],
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """One conversation rendered by the model's chat template, as a prompt for
        ``add_request`` (its special tokens are encoded as such). A conversation the template
        refuses gives a prompt whose request fails with the template's message."""
        return render_chat(self.tokenizer, messages, add_generation_prompt, chat_template_kwargs)

    # -- internals -----------------------------------------------------------------------------
    def _make_sequence(self, prompt: Any, params: Any, request_id: Any = None) -> Sequence:
        """The request's Sequence; a prompt or params that cannot run make a failed one (its
        error output comes back from the next ``step``), never an exception for the batch."""
        if request_id is not None and request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        error = None
        text: str | None = None
        ids: list[int] = []
        if not isinstance(params, SamplingParams):
            error = f"params must be SamplingParams, got {type(params).__name__}"
            params = SamplingParams()
        else:
            try:
                text, ids = prompt_ids(prompt, self.tokenizer, self.config.vocab_size, self.max_model_len)
            except ValueError as e:
                error = str(e)
            except Exception as e:  # the tokenizer's own failure: still this request's only
                error = f"the prompt could not be tokenised: {type(e).__name__}: {e}"
        auto = request_id is None
        if auto:
            while self._next_id in self._requests:  # an id a caller chose
                self._next_id += 1
            request_id = self._next_id
        seq = Sequence(
            request_id,
            text,
            ids,
            params,
            seed=params.seed if params.seed is not None else self._seed_rng.getrandbits(63),
            eos_token_ids=self.tokenizer.eos_token_ids,
            max_len=self.max_model_len,
        )
        if auto:
            self._next_id += 1
        if error is not None:
            seq.fail(error, self.tokenizer)
        return seq

    def prepare_constraints(self) -> None:
        """Build the constraint compiler for this model's vocabulary now (the token bytes, the
        vocabulary's tries, the rows shared by JSON strings), which the process's first
        constrained request would otherwise build before its prefill. ``deepinfer serve`` calls
        it before it says it is ready. Its time is ``metrics()["constraint_setup_seconds"]``."""
        self.structured.compiler  # noqa: B018 - built on first access

    def _add(self, s: Sequence, stream: bool = False) -> None:
        """Compile the request's constraint (cached, shared; a bad one fails this request only)
        and queue it."""
        if s.params.constraint_kind is not None and not s.is_finished:
            t0 = time.perf_counter()
            try:
                compiled = self.structured.compile(s.params)
            except ValueError as e:  # ConstraintError: names what is wrong and where
                s.fail(f"{s.params.constraint_kind}: {e}", self.tokenizer)
            except Exception as e:  # an internal failure still fails this request only
                s.fail(f"{s.params.constraint_kind}: {type(e).__name__}: {e}", self.tokenizer)
            else:
                s.constraint = self.structured.matcher(compiled)
                self._relaxed[s.request_id] = list(compiled.notes)
            finally:
                self._compile_seconds += time.perf_counter() - t0
                self._compiles += 1
        self._requests[s.request_id] = s
        if stream:
            self._stream.add(s.request_id)
        self.scheduler.add(s)

    def _discard(self, seqs: list[Sequence]) -> None:
        """Drop these requests and their outputs (generate() interrupted)."""
        for s in seqs:
            if self.scheduler.abort(s.request_id) is not None:
                s.abort(self.tokenizer)
        self.scheduler.reap()
        gone = {s.request_id for s in seqs}
        self._pending = [(s, t) for s, t in self._pending if s.request_id not in gone]
        for rid in gone:
            self._requests.pop(rid, None)
            self._relaxed.pop(rid, None)
            self._stream.discard(rid)

    def _gate(self, running: list[Sequence]) -> bool:
        return bool(running) and self.dspark.gate(
            running, cache_len=self.max_model_len, token_budget=self._verify_budget(),
            device_type=self.device.type, step_times=self.step_times, ragged_tokens=self._ragged_tokens(),
        )  # fmt: skip

    def _plan_drafts(self, seqs: list[Sequence]):
        return self.dspark.plan(
            seqs, cache_len=self.max_model_len, token_budget=self._verify_budget(),
            special_ids=self._special_ids, device_type=self.device.type, step_times=self.step_times,
            ragged_tokens=self._ragged_tokens(),
        )  # fmt: skip

    def _ragged_tokens(self) -> int:
        """Most tokens a ragged verify step may feed (``DSparkConfig.ragged``; 0: none)."""
        ragged = self.dspark.config.ragged
        if ragged is False:
            return 0
        return min(self.runner.ragged_tokens(default=ragged is None), self._verify_budget())

    def _verify_budget(self) -> int:
        """Most tokens a verify step may hold (``ModelRunner.verify_cap``)."""
        cap = self.runner.verify_cap()
        return self.max_num_batched_tokens if cap is None else min(cap, self.max_num_batched_tokens)

    def _step_ahead(self, rows: list[Sequence], sampled: torch.Tensor) -> StepAhead | None:
        """Launch the decode step after this one (``step_ahead.py``): ``rows`` one position on,
        fed this step's ``sampled`` tokens on the device, their own tokens sampled at once unless
        a row's mask or logprobs need the host first; None when the pool has no block for that
        position (the next step then runs as usual)."""
        if not self.scheduler.reserve(rows, 2):
            return None
        logits = self.runner.step_ahead(rows, sampled)
        tokens = self._sample(rows, logits, [], ahead=1)[0] if samples_ahead(rows) else None
        self._ahead_counts[0] += 1
        return StepAhead(rows, [s.num_cached for s in rows], logits, tokens)

    def _may_draft(self, rows: list[Sequence]) -> bool:
        """May DSpark draft for these rows next step (a step launched ahead would be dropped)?"""
        return any(map(self.dspark.speculates, rows)) and not self.dspark.stays_closed(len(rows))

    def _settle(self) -> None:
        for s, t in self._pending:
            if not s.is_finished:  # (unless aborted meanwhile)
                s.settle(t, self.tokenizer)
        self._pending.clear()

    def _accept(self, batch: list[Sequence], tokens: list[int], lps: dict | None = None) -> None:
        defer = self.masks.inline
        for j, (s, t) in enumerate(zip(batch, tokens)):
            if s.is_finished:  # ended by its constraint in settle(): this step's token is dropped
                continue
            if lps and j in lps:
                s.logprobs.append(lps[j])  # (cut to the output's length when it is read)
            if defer and s.defers(t):
                s.push_token(t)
                self._pending.append((s, t))
                continue
            s.on_token(t, self.tokenizer)

    def _outputs(self, finished: list[Sequence], batch: list[Sequence]) -> list[RequestOutput]:
        outs = []
        for s in finished:
            rid = s.request_id
            if self._requests.pop(rid, None) is None:
                continue  # discarded
            self._stream.discard(rid)
            outs.append(self._output(s, self._relaxed.pop(rid, [])))
        if self._stream:
            pending = {s.request_id for s, _ in self._pending}
            for s in batch:
                if s.request_id in self._stream and not s.is_finished:
                    outs.append(self._partial(s, s.request_id in pending))
        return outs

    def _partial(self, s: Sequence, pending: bool) -> RequestOutput:
        """A streamed request's output so far (a deferred token, not yet accepted, left out);
        its text, decoded incrementally, is a prefix of every later text and of the final one."""
        ids = s.output_token_ids[: len(s.output_token_ids) - pending]
        if s.detokenizer is None:
            hold = max(map(len, s.params.stop), default=1) - 1  # (a stop string's start waits)
            s.detokenizer = IncrementalDetokenizer(
                self.tokenizer, skip_special_tokens=s.params.skip_special_tokens, hold=hold
            )
        return RequestOutput(
            request_id=s.request_id,
            prompt=s.prompt,
            prompt_token_ids=s.prompt_token_ids,
            text=s.detokenizer.text(ids),
            token_ids=ids,
            finish_reason=None,
            finished=False,
            logprobs=None if s.logprobs is None else s.logprobs[: len(ids)],
        )

    def _sample(
        self, seqs: list[Sequence], logits: torch.Tensor, constrained: list[int], ahead: int = 0
    ) -> tuple[torch.Tensor, dict | None]:
        """One fused sampler call: the ``constrained`` rows' bitmask (filled on the host while
        the forward ran, in ``self.masks``) and every row's sampling values go to the device in
        one copy; the kernel masks and samples. Returns the tokens on the device (not synced)
        and the logprobs asked for. ``ahead``: tokens each row samples before these (a step
        launched ahead: its draws are those of that step)."""
        dev = logits.device
        # the per-row values (and the constrained rows' bitmask and indices) in one host buffer,
        # one copy to the device (sample_args.py)
        B = len(seqs)
        args = self.masks.args(B) if constrained else SampleArgs.new(B)
        temperature, top_k, top_p, min_p = args.write(seqs, ahead, constrained)
        i, f, bitmask = args.to(dev, bool(constrained))
        # every row constrained: no index list
        indices = i[3, : len(constrained)] if 0 < len(constrained) < B else None
        out = self.sample_fn(
            logits,
            bitmask=bitmask,
            indices=indices,
            temperature=f[0],
            top_k=i[0],
            top_p=f[1],
            min_p=f[2],
            seed=i[1],
            step=i[2],
            validate=False,
            # read on the host, before the copies: the launches no row needs are left out
            kinds=kernels.sample_kinds(temperature, top_k, top_p, logits.shape[1], min_p),
            top_k_bound=kernels.top_k_max(top_k),
        )
        # a row whose mask allows nothing comes back as -1 (out.empty): its sequence fails
        # in on_token, the others go on
        want = [j for j, s in enumerate(seqs) if s.params.logprobs is not None]
        lps = _logprobs(logits, out.tokens, want, [seqs[j].params.logprobs for j in want]) if want else None
        return out.tokens, lps


def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, rows: list[int], ks: list[int]) -> dict:
    """Row -> TokenLogprob of its sampled token under log_softmax(logits) (the model's
    distribution, before mask, temperature and filters), with its ``k`` most likely tokens."""
    idx = torch.tensor(rows, dtype=torch.int64).to(logits.device, non_blocking=True)
    lp = torch.log_softmax(logits.index_select(0, idx).float(), dim=-1)  # [R, V]
    picked = tokens.index_select(0, idx)  # [R]
    chosen = lp.gather(1, picked.clamp(min=0).unsqueeze(1)).squeeze(1).tolist()
    k = max(ks)
    top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
    top_v, top_i = top_v.tolist(), top_i.tolist()
    toks = picked.tolist()
    return {
        j: TokenLogprob(toks[r], chosen[r], list(zip(top_i[r][: ks[r]], top_v[r][: ks[r]])))
        for r, j in enumerate(rows)
    }
