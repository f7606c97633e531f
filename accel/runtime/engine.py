"""The offline engine: add_request / step / abort, generate, stats; `stream_generate` yields one request's text.

One step is three lines (schedule, run, update) plus detokenization and stop strings.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from accel.runtime.detokenizer import IncrementalDetokenizer
from accel.runtime.kv_cache_manager import KVCacheManager
from accel.runtime.models import CausalLM, fuse_projections, load_model
from accel.runtime.config import RuntimeConfig
from accel.runtime.model_runner import ModelRunner, RunnerConfig, kv_bytes_per_block
from accel.runtime.outputs import SpecBurst
from accel.runtime.sampling_params import SamplingParams
from accel.runtime.scheduler import QueueFullError, Scheduler, SchedulerConfig
from accel.runtime.sequence import FinishReason, RequestMetrics, Sequence
from accel.speculative.config import SpeculativeConfig
from accel.speculative.decoder import SpecDecoder, build_proposer
from accel.speculative.stats import SpecDecodeStats

__all__ = ["EngineConfig", "Engine", "RequestOutput", "EngineStats", "QueueFullError", "stream_generate"]

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
# A burst of steps in one call (num_scheduler_steps) holds new arrivals, and in the server the event loop, until it
# ends: a serving loop cuts bursts to about this long (`Engine.max_burst_s`). Offline, where nothing can arrive
# during a step, only num_scheduler_steps bounds them.
MAX_BURST_S = 0.025
log = logging.getLogger("accel.engine")


@dataclass(kw_only=True)
class EngineConfig(RuntimeConfig):
    """Everything the engine needs: the runtime's settings (`RuntimeConfig`, declared there once) and what comes
    with the model."""

    model: str
    """The model folder (or a name for the logs)."""
    dtype: str = "auto"
    """Compute dtype: auto (float32 on CPU, no fast bf16 matmul there; bfloat16 on CUDA) or one of DTYPES."""
    quant_plan: dict[str, str] | None = None
    """{hf_module_name: "int8" | "int4" | "int4f" | "fp16" | "fp32"} applied at load (None: as stored)."""
    quant_group_size: int = 64
    """INT4 group size of the plan's int4 / int4f modules."""
    fuse_projections: bool = True
    """Fuse unquantized q/k/v and gate/up Linears after the plan is applied."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding (n-gram lookup or a draft model); None: off."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is invalid; allowed: 'auto' or one of {sorted(DTYPES)}")

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={self.device!r} was asked for but torch sees no CUDA device; use 'cpu'")
        return torch.device(self.device)

    def resolve_weight_dtype(self, device: torch.device) -> torch.dtype | None:
        """The dtype the unquantized Linears' weights are held in (`weight_dtype`; None: the compute dtype), checked
        before anything loads."""
        if self.weight_dtype == "auto":
            return None
        from accel.kernels import cpu

        if device.type != "cpu" or self.resolve_dtype(device) != torch.float32 or not cpu.has_avx512():
            raise ValueError(f"weight_dtype={self.weight_dtype!r} needs an fp32 CPU model and accel's AVX-512 kernels "
                             f"(here: {device.type}, {self.resolve_dtype(device)}, AVX-512 kernels "
                             f"{'on' if cpu.has_avx512() else 'off'}); allowed here: 'auto'")
        return torch.float16

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype != "auto":
            return DTYPES[self.dtype]
        return torch.bfloat16 if device.type == "cuda" else torch.float32


@dataclass
class RequestOutput:
    """One request's progress after a step (deltas) and its totals so far."""

    request_id: str
    prompt_token_ids: list[int]
    new_token_ids: list[int]
    text_delta: str
    token_ids: list[int]  # all output tokens so far
    text: str  # all output text so far (truncated before a stop string)
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    stop_reason: str | int | None  # the stop string or stop token id that ended it, if any
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # SamplingParams.prompt_logprobs: per prompt token, its raw logprob (None for the first, which nothing predicts)
    # and its top-k alternatives; complete once the prompt is
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None
    spec_decode: SpecDecodeStats | None = None  # None unless the request was verified against drafts
    error: str | None = None  # finish_reason "error": what failed (this request only; the others go on)


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of blocks held by requests
    num_kv_blocks: int  # the pool's blocks (each one KV group's: `KVLayout`)
    prefix_cache_hit_rate: float  # hit tokens / queried tokens over all admissions
    num_preemptions: int
    num_steps: int
    # speculative decoding, from raw counters (None when the engine does not speculate)
    spec_decode: SpecDecodeStats | None = None
    spec_decode_per_domain: dict[str, SpecDecodeStats] = field(default_factory=dict)
    # per proposer when one step mixes two (draft_ngram_first: "ngram" lookup drafts, "draft" model drafts)
    spec_decode_per_source: dict[str, SpecDecodeStats] = field(default_factory=dict)


@dataclass
class _RequestState:
    seq: Sequence
    detok: IncrementalDetokenizer
    num_reported: int = 0
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_logprobs: list[float | None] = field(default_factory=lambda: [None])
    prompt_top_logprobs: list[list[tuple[int, float]] | None] = field(default_factory=lambda: [None])

    def add_prompt_logprobs(self, first: int, logprobs: list[float], top: list | None) -> None:
        """Prompt tokens first.. scored by a step; a recomputed (preempted) prefix is not recorded twice."""
        skip = len(self.prompt_logprobs) - first
        if skip < 0:
            raise RuntimeError(f"prompt logprobs from position {first}, {len(self.prompt_logprobs)} recorded")
        self.prompt_logprobs.extend(logprobs[skip:])
        self.prompt_top_logprobs.extend((top or [[]] * len(logprobs))[skip:])


def check_memory(path: str | Path, config: EngineConfig, device) -> None:
    """Refuse, before a weight is read, a CPU model whose weights (as `load_model` will hold them) and KV cache do
    not fit this process's memory budget (`accel.memory`), in one line with the numbers."""
    if device.type != "cpu":
        return
    from accel.schemes import quantized as quantizes
    from accel.kernels.loader import is_compressed, planned_bytes, table_dtype_for
    from accel.memory import Need, check_fits
    from accel.runtime.models.hf_config import load_config

    hf = load_config(path)
    dtype = config.resolve_dtype(device)
    plan = config.quant_plan or {}
    quantized = is_compressed(path) or any(quantizes(s) for s in plan.values())
    linear_dtype = config.resolve_weight_dtype(device)
    table_dtype = table_dtype_for(quantized or linear_dtype is not None, dtype, device)
    weights, transient = planned_bytes(path, dtype, bool(getattr(hf, "tie_word_embeddings", False)), plan,
                                       config.quant_group_size, table_dtype, linear_dtype)
    if config.num_kv_blocks is None:
        kv = config.kv_cache_memory_bytes
    else:
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        kv = config.num_kv_blocks * config.block_size * hf.num_hidden_layers * 2 * hf.num_key_value_heads * \
            head_dim * (1 if config.kv_cache_dtype == "int8" else torch.empty(0, dtype=dtype).element_size())
    schemes = sorted({s for s in plan.values() if quantizes(s)})
    what = f"{path}" + (f" at {'/'.join(schemes)}" if schemes else "")
    check_fits(Need(what, {"weights": weights, "KV cache": kv, "loading": max(0, transient - kv)}),
               "lower kv_cache_memory_gb, quantize further (--quant int4), or raise the limit")


class Engine:
    def __init__(self, model: CausalLM, config: EngineConfig, tokenizer=None, proposer=None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """proposer: a `speculative.proposer.Proposer` to use instead of building one from `config.speculative`.
        clock: seconds for the measured costs (step and draft times) the engine decides by; tests inject one."""
        self.clock = clock
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        p = next(model.parameters())
        layout = model.kv_layout
        num_blocks = config.num_kv_blocks
        if num_blocks is None:
            budget = config.kv_cache_memory_bytes
            num_blocks = budget // kv_bytes_per_block(model, config.block_size, config.kv_cache_dtype, p.dtype)
        else:  # blocks of every layer: the pool's blocks are one KV group's (`KVLayout`), as many bytes in all
            num_blocks = num_blocks * model.num_layers // layout.num_tensors
        if num_blocks < 1:
            raise ValueError(f"the KV cache budget holds {num_blocks} blocks; give it at least one block's bytes")
        max_model_len = config.max_model_len or model.config.max_position_embeddings
        self.max_model_len = max_model_len
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching, layout.windows)
        spec = config.speculative or (SpeculativeConfig() if proposer is not None else None)
        self.scheduler = Scheduler(SchedulerConfig(config, max_model_len=max_model_len,
                                                   max_step_rows=spec.max_step_rows if spec else None), self.kv)
        if hasattr(model, "prepare_cpu_decode"):  # before the KV cache: its transients then peak below the end
            model.prepare_cpu_decode()  # 2 MB pages; decode steps in one native call where every layer fits it
            if config.kv_cache_dtype != "auto":
                model.native_decode = None  # the native step reads an fp32 cache
        self.runner = ModelRunner(model, RunnerConfig(num_blocks, config))

        self.eos_token_id = _eos_id(model.config, tokenizer)
        self._states: dict[str, _RequestState] = {}
        self._grammar = None  # runtime.structured.GrammarCompiler, built on the first constrained request
        self._ids = itertools.count()
        self._decode_step_s: float | None = None  # the last decode-only step's time per decode step
        self.max_burst_s: float | None = None  # seconds a burst of steps may take (None: num_scheduler_steps alone)
        self.spec = None
        if spec is not None:
            proposer = proposer or build_proposer(spec, config.model, num_blocks, config.block_size, self.runner.device,
                                                  self.runner.dtype, target_runner=self.runner)
            self.spec = SpecDecoder(spec, proposer, max_model_len, clock=clock)

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs) -> Engine:
        """Load an HF folder (config.json + safetensors [+ tokenizer]); kwargs are EngineConfig fields. Refused
        before a weight is read when it cannot fit this process's memory (`check_memory`)."""
        from accel.memory import large_blocks_mapped

        with large_blocks_mapped():
            return cls._load(path, **kwargs)

    @classmethod
    def _load(cls, path: str | Path, **kwargs) -> Engine:
        from accel.kernels.loader import is_compressed

        config = EngineConfig(model=str(path), **kwargs)
        if config.quant_plan and is_compressed(path):
            raise ValueError(f"{path} is already quantized (compressed-tensors); do not pass quant_plan")
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        device = config.resolve_device()
        weight_dtype = config.resolve_weight_dtype(device)
        check_memory(path, config, device)
        model = load_model(path, config.resolve_dtype(device), device, config.quant_plan, config.quant_group_size,
                           linear_dtype=weight_dtype)
        if config.fuse_projections:
            fuse_projections(model)
        from accel.kernels.linear import pack_float_linears

        pack_float_linears(model, weight_dtype or torch.float32)  # CPU: accel's weight panels; a no-op elsewhere
        tokenizer = None
        if (Path(path) / "tokenizer_config.json").exists() or (Path(path) / "tokenizer.json").exists():
            from accel.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(path)
        return cls(model, config, tokenizer)

    @property
    def max_waiting(self) -> int:
        """Requests that may wait; one more is refused (`RuntimeConfig.max_waiting`, the server's 429 too)."""
        return self.config.max_waiting

    def memory(self) -> dict[str, int]:
        """Bytes this engine holds: the model's weights (kernel layouts included) and its KV cache."""
        from accel.kernels.linear import module_bytes

        kv = {t.data_ptr(): t.numel() * t.element_size() for c in self.runner.kv_caches
              for t in (c.k, c.v, getattr(c, "k_scale", None), getattr(c, "v_scale", None)) if t is not None}
        return {"weights": module_bytes(self.model), "KV cache": sum(kv.values())}

    # ---- requests --------------------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, priority: int = 0, domain: str | None = None) -> str:
        """Queue a prompt (text or token ids); returns its request id. Raises QueueFullError when full.

        domain: a label (e.g. the calibration domain) under which speculative-decoding stats are also summed."""
        params = params or SamplingParams()
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; this engine has none, pass token ids")
            token_ids = self.tokenizer.encode(prompt)
        else:
            token_ids = list(prompt)
        vocab = self.model.config.vocab_size
        bad = [t for t in token_ids if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are invalid; allowed: integers in [0, {vocab})")
        params.check_vocab(vocab)
        matcher = self.structured_matcher(params)
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        seq = Sequence(request_id, token_ids, params, priority=priority, eos_token_id=self.eos_token_id)
        self.runner.add_request(seq, matcher)
        try:
            self.scheduler.add(seq)
        except BaseException:
            self.runner.release(request_id)
            raise
        self._states[request_id] = _RequestState(seq, IncrementalDetokenizer(self.tokenizer, token_ids, params.stop))
        if self.spec is not None:
            self.spec.add(request_id, domain)
        return request_id

    def abort(self, request_id: str) -> bool:
        """Abort a request at any point; its blocks are freed at once. False if unknown or finished."""
        ok = self.scheduler.abort(request_id)
        self.runner.release(request_id)
        if self.spec is not None:
            self.spec.finish(request_id)
        self._states.pop(request_id, None)
        return ok

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step --------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; returns an output for every request that got tokens or finished."""
        draft_probs, burst = None, None
        t_call = self.clock()  # proposing included: what the speculation gate weighs
        if self.spec is not None:
            burst = self._spec_burst()
            if burst is None:
                drafts, draft_probs = self.spec.propose(self.scheduler.running, self.runner.generator_for,
                                                        self.scheduler.draft_budget())
                self.scheduler.update_draft_token_ids(drafts)
        t0 = self.clock()
        sched = self.scheduler.schedule(burst.num_positions if burst is not None else self._num_steps())
        if sched.is_empty:
            self.runner.swap(sched.swap_out, sched.swap_in)  # preemptions may still have to move K/V
            return []
        if burst is not None:
            out = self.runner.execute(sched, burst=burst)
        else:
            out = self.runner.execute(sched, draft_probs) if draft_probs else self.runner.execute(sched)
        if sched.num_scheduled_tokens == len(sched.scheduled):  # decode rows only: what one decode step costs
            self._decode_step_s = (self.clock() - t0) / max(1, max(len(t) for t in out.sampled_token_ids))
        results = [self._fail(self._states[rid], error) for rid, error in out.failed.items()]
        touched = self.scheduler.update_from_output(sched, out)
        if self.spec is not None and all(r.num_tokens == 1 + len(r.spec_token_ids) for r in sched.scheduled) or \
                out.spec_steps is not None:
            steps = len(out.spec_steps) if out.spec_steps is not None else sched.num_steps
            self.spec.record_rate(len(sched.scheduled), sum(len(t) for t in out.sampled_token_ids),
                                  self.clock() - t_call, steps)
        if out.spec_steps is not None:
            self.spec.observe_burst(sched.scheduled[0].seq, out.spec_steps)
        elif self.spec is not None and sched.num_steps == 1:  # a burst of plain decode steps verified nothing
            self.spec.observe(sched, out, self.clock() - t0)
        by_id = dict(zip(out.request_ids, range(len(out.request_ids))))
        for rid, scored in zip(out.request_ids, out.prompt_logprobs):  # every prompt chunk's, sampling or not
            if scored is not None and rid in self._states:
                self._states[rid].add_prompt_logprobs(*scored)
        for seq in touched:
            st = self._states[seq.request_id]
            i = by_id[seq.request_id]
            try:
                if out.logprobs[i] is not None:
                    st.logprobs.extend(out.logprobs[i])
                    st.top_logprobs.extend(out.top_logprobs[i] or [])
                results.append(self._output(st))
            except Exception as e:  # noqa: BLE001 - detokenization / stop strings of this request only
                log.exception("request %s failed after its step", seq.request_id)
                results.append(self._fail(st, f"{type(e).__name__}: {e}"))
        return results

    def _num_steps(self) -> int:
        """Decode steps the next step may run in a row: num_scheduler_steps, as many as fit in `max_burst_s` at the
        last decode step's cost, where the runner can (`max_decode_steps`); 1 while speculation may draft."""
        if self.config.num_scheduler_steps == 1 or self._decode_step_s is None:
            return 1
        if self.spec is not None and self.spec.may_draft(len(self.scheduler.running)):
            return 1
        steps = self.config.num_scheduler_steps
        if self.max_burst_s is not None:
            steps = min(steps, max(1, int(self.max_burst_s / max(self._decode_step_s, 1e-6))))
        return self.runner.max_decode_steps(self.scheduler.running, steps, self.max_model_len)

    def _spec_burst(self) -> SpecBurst | None:
        """Several verify steps in one native call where the one running request may take them (`SpecDecoder.burst`,
        `max_decode_steps`), within `max_burst_s`; None for a step of its own."""
        if self.config.num_scheduler_steps == 1 or self.runner.max_decode_steps(
                self.scheduler.running, 2, self.max_model_len) == 1 or self.scheduler.waiting:
            return None
        burst = self.spec.burst(self.scheduler.running, self.config.num_scheduler_steps,
                                math.inf if self.max_burst_s is None else self.max_burst_s,
                                self.scheduler.draft_budget())
        return burst if burst is not None and self.scheduler.lookahead_fits(burst.num_positions) else None

    def grammar_compiler(self, tokenizer=None):
        """The structured-output compiler of this engine's tokenizer and vocabulary (`runtime.structured`), built
        on first use (slow for a large vocabulary such as Gemma 3's) from `tokenizer` (a copy of the engine's, for
        another thread) or the engine's own; its cache serves the server's compiles too."""
        if self._grammar is None:
            tokenizer = tokenizer if tokenizer is not None else self.tokenizer
            if tokenizer is None:
                raise ValueError("structured output needs a tokenizer; this engine has none")
            from accel.runtime.structured import GrammarCompiler

            self._grammar = GrammarCompiler(tokenizer, self.model.config.vocab_size)
        return self._grammar

    def structured_matcher(self, params: SamplingParams):
        return None if params.structured is None else self.grammar_compiler().matcher(params.structured)

    def _fail(self, st: _RequestState, error: str) -> RequestOutput:
        """End one request with finish reason "error" (its blocks freed); the rest of the batch goes on."""
        seq = st.seq
        self.scheduler.finish(seq, FinishReason.ERROR)
        self.runner.release(seq.request_id)
        self._states.pop(seq.request_id, None)
        if self.spec is not None:
            self.spec.finish(seq.request_id)
        return RequestOutput(
            request_id=seq.request_id, prompt_token_ids=seq.prompt_token_ids, new_token_ids=[], text_delta="",
            token_ids=list(seq.output_token_ids), text=st.detok.output_text, finished=True,
            finish_reason=FinishReason.ERROR.value, stop_reason=None, metrics=seq.metrics,
            num_cached_tokens=seq.num_cached_prompt_tokens, error=error)

    def _output(self, st: _RequestState) -> RequestOutput:
        seq = st.seq
        new = seq.output_token_ids[st.num_reported:]
        st.num_reported = seq.num_output_tokens
        stop_reason: str | int | None = None
        if (st.detok.update(new) or self.runner.structured_done(seq.request_id)) and not seq.is_finished:
            self.scheduler.finish(seq, FinishReason.STOP)
        if st.detok.stopped_by is not None:
            stop_reason = st.detok.stopped_by
        elif seq.finish_reason == FinishReason.STOP and seq.output_token_ids[-1] != self.eos_token_id:
            stop_reason = seq.output_token_ids[-1]
        if seq.is_finished:
            self.runner.release(seq.request_id)
            self._states.pop(seq.request_id, None)
            if self.spec is not None:
                self.spec.finish(seq.request_id)
        return RequestOutput(
            request_id=seq.request_id, prompt_token_ids=seq.prompt_token_ids, new_token_ids=new,
            text_delta=st.detok.take_delta(seq.is_finished), token_ids=list(seq.output_token_ids),
            text=st.detok.output_text, finished=seq.is_finished,
            finish_reason=seq.finish_reason.value if seq.finish_reason else None, stop_reason=stop_reason,
            metrics=seq.metrics, num_cached_tokens=seq.num_cached_prompt_tokens,
            logprobs=list(st.logprobs) if seq.params.logprobs is not None else None,
            top_logprobs=list(st.top_logprobs) if seq.params.logprobs else None,
            prompt_logprobs=list(st.prompt_logprobs) if seq.params.prompt_logprobs is not None else None,
            prompt_top_logprobs=list(st.prompt_top_logprobs) if seq.params.prompt_logprobs else None,
            spec_decode=seq.spec if seq.spec.num_drafts else None)

    def generate(self, prompts: str | list[int] | list[str] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = False) -> list[RequestOutput]:
        """Run prompts to completion; returns the final output of each, in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts; pass one or one each")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        final: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="generate", unit="req")
        while self.has_unfinished():
            for o in self.step():
                if o.finished:
                    final[o.request_id] = o
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [final[i] for i in ids]

    def stats(self) -> EngineStats:
        return EngineStats(num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
                           kv_cache_usage=self.kv.usage, num_kv_blocks=self.kv.pool.num_blocks,
                           prefix_cache_hit_rate=self.kv.prefix_cache_hit_rate,
                           num_preemptions=self.scheduler.num_preemptions, num_steps=self.scheduler.num_steps,
                           spec_decode=None if self.spec is None else self.spec.tally.total,
                           spec_decode_per_domain={} if self.spec is None else dict(self.spec.tally.per_domain),
                           spec_decode_per_source={} if self.spec is None else dict(self.spec.tally.per_source))


def _eos_id(config, tokenizer) -> int | None:
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if eos is None:
        eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos


def stream_generate(engine: Engine, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> Iterator[str]:
    """Yield the text deltas of one request as they are produced."""
    rid = engine.add_request(prompt, params, request_id=request_id)
    try:
        while True:
            for o in engine.step():
                if o.request_id != rid:
                    continue
                if o.text_delta:
                    yield o.text_delta
                if o.finished:
                    return
            if not engine.has_unfinished():
                return
    finally:
        engine.abort(rid)  # no-op when finished; frees blocks if the consumer stopped early
