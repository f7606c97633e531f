#!/usr/bin/env python
"""Check the runtime's CUDA path in one bounded run: exactness, quantized weights, speculation, speed.

The runtime (accel.runtime, accel.speculative, accel.kernels.linear) was developed on CPU. This script runs it on a GPU
with random-weight Llamas built here (no network, no checkpoint). Greedy references come from transformers'
`generate` on CPU in fp32 (the oracle). The tiny target (hidden 128, 4 layers, vocab 512) uses
initializer_range=0.3: fp32 reorderings on another device do not flip its argmax, but the model is chaotic (its
residual stream grows by orders of magnitude over the layers), so coarser arithmetic (bf16, int8 KV, quantized
weights) changes a reply from its first flipped token on; those engines are compared token by token given the
same prefix.

Checks, in order (each prints PASS / FAIL / ERROR / SKIP with its details, and the run goes on):

  env                          torch, CUDA, GPU; whether accel's CPU C++ kernels are loaded or disabled
  greedy_fp32/<batch>          fp32 engine on the device == HF greedy, 12 prompts of 1-200 tokens, 24 new
                               tokens: one batch, chunked prefill (32-token steps), preemption by recompute / by
                               swap (a few KV blocks); prefix_cache: prompts sharing a 96-token prefix, hits > 0
  kv_int8, bf16                int8 KV cache (fp32 compute); bf16 weights (CUDA's default dtype): next-token
                               agreement with the oracle given its prefix > 0.5 (free-running agreement reported)
  quant/{int8,int4}            every decoder Linear int8 per channel / int4 group 32 (fp32 activations): device
                               engine vs the same plan on a CPU engine (dequantize + fp32 GEMM) >= 0.9 agreement;
                               one quantized module on the device against the float matmul of its dequantized
                               weight, in fp32 and bf16
  spec/<method>/<batch>        greedy speculation == HF greedy, 16 requests with repeated-chunk prompts; methods
                               ngram, draft (a 1-layer random Llama), self_draft (the target as its own draft:
                               acceptance ~1), self_draft_int8 (partial acceptance), eagle (an EAGLE feature
                               draft); batches one_batch, preempt_recompute, preempt_swap; every KV block of the
                               target and of the draft returned at the end
  sampled_spec/<method>        temperature 0.8, top-p 0.9, seeded requests: two runs give the same tokens
  bench                        SmolLM2-135M-shaped random model in bf16: engine tokens/s at batch 1 / 16 / 64
                               (128-token prompts, 128 new tokens, wall clock with prefill) against HF `generate`
                               at batch 1 / 16 (equal-length prompts: no padding), and their ratios
  cpu_kernels_unused           (cuda) no device check asked for accel's CPU kernels

Usage:

    python scripts/gpu_check.py --json $OUT/gpu_check.json      # on a CUDA machine (the defaults)
    .venv/bin/python scripts/gpu_check.py --device cpu --quick  # dry run on CPU (smaller sizes)

Bounded time: no check starts once --budget-s seconds have passed (SKIP), and each runs under an alarm
(--check-timeout-s, cut to what is left of the budget), so a runtime loop that never ends becomes an ERROR.
The JSON (--json, default $OUT/gpu_check.json when OUT is set) is rewritten after every check: a killed run
still leaves what it had. fp32 matmuls are kept IEEE fp32 (float32 matmul precision "highest"; the TF32 override
variables some CUDA images set are removed). On CUDA, ACCEL_DISABLE_CPU_KERNELS is set: only the CPU
references would use those kernels, and compiling them on a fresh machine would take a share of the budget.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing accel

from accel.draft_training.eagle_train import EagleTrainer  # noqa: E402
from accel.kernels import cpu  # noqa: E402
from accel.kernels.linear import Int4WeightOnlyLinear, Int8WeightOnlyLinear  # noqa: E402
from accel.schemes import apply_plan  # noqa: E402
from accel.runtime.engine import Engine, EngineConfig  # noqa: E402
from accel.runtime.models import fuse_projections, load_model  # noqa: E402
from accel.runtime.sampling_params import SamplingParams  # noqa: E402
from accel.speculative.config import SpeculativeConfig  # noqa: E402
from accel.speculative.eagle import save_eagle_draft  # noqa: E402
from accel.speculative.paged_draft import PagedDraftProposer  # noqa: E402

BLOCK_SIZE = 16
INT4_GROUP_SIZE = 32
DECODER_PROJS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
SPEC_METHODS = ("ngram", "draft", "self_draft", "self_draft_int8", "eagle")
SAMPLED_SPEC_METHODS = ("ngram", "draft", "self_draft_int8", "eagle")
MIN_CHECK_S = 3  # a check is not started with less of the budget left
# environment switches that make fp32 matmuls TF32 behind torch's back (the fp32 exactness checks need IEEE fp32)
TF32_ENV = ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")
# modules the GPU machine does not have: the runtime must never import them
ABSENT_ON_GPU_MACHINE = ("pydantic", "fastapi", "llmcompressor", "compressed_tensors", "datasets", "gguf")


@dataclass(frozen=True)
class Sizes:
    num_prompts: int = 12
    max_prompt_len: int = 200
    max_tokens: int = 24
    spec_prompts: int = 16
    bench_layers: int = 30
    bench_prompt_len: int = 128
    bench_new_tokens: int = 128
    bench_batches: tuple[int, ...] = (1, 16, 64)
    hf_batches: tuple[int, ...] = (1, 16)


QUICK = Sizes(num_prompts=8, max_prompt_len=100, max_tokens=16, spec_prompts=12, bench_layers=2,
              bench_prompt_len=32, bench_new_tokens=16, bench_batches=(1, 4, 8), hf_batches=(1, 4))


# ---- models, prompts, the oracle ------------------------------------------------------------------------
def tiny_config(**overrides) -> transformers.LlamaConfig:
    kw = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=512, max_position_embeddings=512, rms_norm_eps=1e-5,
              initializer_range=0.3, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kw.update(overrides)
    return transformers.LlamaConfig(**kw)


def bench_config(num_layers: int) -> transformers.LlamaConfig:
    """SmolLM2-135M's architecture."""
    return transformers.LlamaConfig(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=num_layers, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=2048,
        rope_theta=100000.0, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def save_random_llama(path: Path, config: transformers.LlamaConfig, seed: int) -> transformers.LlamaForCausalLM:
    """A random LlamaForCausalLM (fp32, CPU, eval) written to `path` with save_pretrained."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    return model


def random_prompts(n: int, seed: int, lo: int, hi: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def hf_greedy(model: transformers.LlamaForCausalLM, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation (the oracle), eos ignored."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def agreement(outs: list[list[int]], refs: list[list[int]]) -> float:
    """Fraction of reference positions where the output has the same token."""
    same = sum(a == b for out, ref in zip(outs, refs) for a, b in zip(out, ref))
    return same / sum(len(r) for r in refs)


def num_exact(outs: list[list[int]], refs: list[list[int]]) -> int:
    return sum(o == r for o, r in zip(outs, refs))


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def load_engine(path: Path, device: str, **config) -> Engine:
    """Engine.from_pretrained, checked to have put its weights and KV cache on `device`."""
    engine = Engine.from_pretrained(path, device=device, **config)
    placed = {next(engine.model.parameters()).device.type, engine.runner.kv_caches[0].k.device.type}
    if placed != {torch.device(device).type}:
        raise RuntimeError(f"engine weights / KV cache are on {sorted(placed)}; asked for {device}")
    return engine


def run_engine(path: Path, prompts: list[list[int]], params, device: str, **config) -> tuple[list[list[int]], Engine]:
    """load_engine(path, device, **config).generate(prompts, params): (token ids per prompt, engine)."""
    engine = load_engine(path, device, **config)
    return [o.token_ids for o in engine.generate(prompts, params)], engine


class Fixtures:
    """Models, prompts and oracle outputs the checks share; each is built by the first check that needs it."""

    def __init__(self, device: str, sizes: Sizes, workdir: Path) -> None:
        self.device, self.sizes, self.workdir = device, sizes, workdir

    @cached_property
    def _target(self) -> tuple[Path, transformers.LlamaForCausalLM]:
        path = self.workdir / "target"
        return path, save_random_llama(path, tiny_config(), seed=0)

    @property
    def target_dir(self) -> Path:
        return self._target[0]

    @property
    def hf(self) -> transformers.LlamaForCausalLM:
        return self._target[1]

    @property
    def vocab(self) -> int:
        return self.hf.config.vocab_size

    @cached_property
    def prompts(self) -> list[list[int]]:
        return random_prompts(self.sizes.num_prompts, seed=0, lo=1, hi=self.sizes.max_prompt_len, vocab=self.vocab)

    @cached_property
    def refs(self) -> list[list[int]]:
        return [hf_greedy(self.hf, p, self.sizes.max_tokens) for p in self.prompts]

    @cached_property
    def prefix_prompts(self) -> list[list[int]]:
        """Prompts sharing a 96-token (6-block) prefix, with suffixes of 1-24 tokens."""
        shared = random_prompts(1, seed=3, lo=96, hi=96, vocab=self.vocab)[0]
        return [shared + s for s in random_prompts(8, seed=4, lo=1, hi=24, vocab=self.vocab)]

    @cached_property
    def prefix_refs(self) -> list[list[int]]:
        return [hf_greedy(self.hf, p, self.sizes.max_tokens) for p in self.prefix_prompts]

    @cached_property
    def spec_prompts(self) -> list[list[int]]:
        """Random chunks repeated 3 times, so that n-gram lookup finds matches in the prompt."""
        return [p * 3 for p in random_prompts(self.sizes.spec_prompts, seed=7, lo=2, hi=20, vocab=self.vocab)]

    @cached_property
    def spec_refs(self) -> list[list[int]]:
        return [hf_greedy(self.hf, p, self.sizes.max_tokens) for p in self.spec_prompts]

    @cached_property
    def draft_dir(self) -> Path:
        """A different tiny random Llama with 1 layer."""
        path = self.workdir / "draft"
        save_random_llama(path, tiny_config(num_hidden_layers=1), seed=5)
        return path

    @cached_property
    def eagle_dir(self) -> Path:
        """An EAGLE draft over the target's features: a fresh EagleTrainer with every weight perturbed (as
        tests/speculative/test_eagle.py builds one), saved with the full vocabulary as its draft vocabulary."""
        torch.manual_seed(0)
        trainer = EagleTrainer(self.hf.config, self.hf.lm_head.weight.detach(), self.hf.model.norm.weight.detach())
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(0.05 * torch.randn_like(p))
        return save_eagle_draft(self.workdir / "eagle", self.hf.config, trainer.runtime_state(),
                                list(range(self.vocab)), {"note": "scripts/gpu_check.py"})

    def preempt_blocks(self, max_prompt_len: int) -> int:
        """A KV pool that fits the longest request with a few blocks to spare: the batch has to preempt."""
        return -(-(max_prompt_len + self.sizes.max_tokens + 4) // BLOCK_SIZE) + 6


# ---- checks ---------------------------------------------------------------------------------------------
class Outcome:
    """What a check found: details (reported as they are) and failed requirements (any one makes it FAIL)."""

    def __init__(self) -> None:
        self.details: dict = {}
        self.failures: list[str] = []

    def record(self, **details) -> None:
        self.details.update({k: round(v, 4) if isinstance(v, float) else v for k, v in details.items()})

    def require(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)


class Skip(Exception):
    pass


def check_env(out: Outcome, device: str, tf32_env_removed: dict[str, str]) -> None:
    out.record(python=platform.python_version(), torch=torch.__version__, torch_cuda=torch.version.cuda,
               transformers=transformers.__version__, cuda_available=torch.cuda.is_available(),
               cpu_capability=torch.backends.cpu.get_cpu_capability(), torch_threads=torch.get_num_threads(),
               cpu_kernels_disabled_by_env=bool(os.environ.get(cpu.DISABLE_ENV)),
               cpu_kernels_extension_loaded=any(m.startswith("accel_cpu_kernels") for m in sys.modules),
               absent_on_gpu_machine_but_imported=[m for m in ABSENT_ON_GPU_MACHINE if m in sys.modules],
               float32_matmul_precision=torch.get_float32_matmul_precision(), tf32_env_removed=tf32_env_removed)
    out.require(not out.details["absent_on_gpu_machine_but_imported"],
                "modules missing on the GPU machine were imported")
    if torch.device(device).type == "cuda":
        out.require(torch.cuda.is_available(), "torch sees no CUDA device")
        props = torch.cuda.get_device_properties(device)
        out.record(gpu=props.name, capability=f"{props.major}.{props.minor}",
                   gpu_memory_gib=props.total_memory / 2**30, tf32_matmul=torch.backends.cuda.matmul.allow_tf32)


GREEDY_BATCHES = {
    "one_batch": dict(max_num_batched_tokens=4096),
    "chunked_prefill": dict(max_num_batched_tokens=32),
    "preempt_recompute": dict(max_num_batched_tokens=64, preemption_mode="recompute"),
    "preempt_swap": dict(max_num_batched_tokens=64, preemption_mode="swap"),
}


def check_greedy(out: Outcome, fx: Fixtures, batch: str) -> None:
    blocks = fx.preempt_blocks(fx.sizes.max_prompt_len) if batch.startswith("preempt") else 512
    outs, engine = run_engine(fx.target_dir, fx.prompts, greedy(fx.sizes.max_tokens), fx.device, dtype="float32",
                              block_size=BLOCK_SIZE, num_kv_blocks=blocks, **GREEDY_BATCHES[batch])
    stats = engine.stats()
    out.record(exact=f"{num_exact(outs, fx.refs)}/{len(outs)}", agreement=agreement(outs, fx.refs),
               num_kv_blocks=blocks, preemptions=stats.num_preemptions, steps=stats.num_steps)
    out.require(outs == fx.refs, "outputs differ from HF greedy")
    out.require(engine.kv.num_held_blocks() == 0, "KV blocks still held after the run")
    if batch.startswith("preempt"):
        out.require(stats.num_preemptions > 0, "no preemption happened")


def check_prefix_cache(out: Outcome, fx: Fixtures) -> None:
    outs, engine = run_engine(fx.target_dir, fx.prefix_prompts, greedy(fx.sizes.max_tokens), fx.device,
                              dtype="float32", block_size=BLOCK_SIZE, num_kv_blocks=512, max_num_batched_tokens=256)
    hit_rate = engine.stats().prefix_cache_hit_rate
    out.record(exact=f"{num_exact(outs, fx.prefix_refs)}/{len(outs)}", prefix_cache_hit_rate=hit_rate)
    out.require(outs == fx.prefix_refs, "outputs differ from HF greedy")
    out.require(hit_rate > 0, "no prefix-cache hit")
    out.require(engine.kv.num_held_blocks() == 0, "KV blocks still held after the run")


def check_agreement(out: Outcome, fx: Fixtures, floor: float, **config) -> None:
    """An approximate engine (int8 KV, bf16) against the fp32 oracle. Whole replies cannot match token for token:
    the random model is chaotic (its residual stream grows by orders of magnitude over 4 layers), so one flipped
    argmax changes the rest of the reply. Reported: the free-running replies' position-wise agreement. Required:
    teacher-forced agreement (each reply position's next token given the oracle's own prefix) above `floor`."""
    engine = load_engine(fx.target_dir, fx.device, block_size=BLOCK_SIZE, num_kv_blocks=1024,
                         max_num_batched_tokens=4096, **config)
    outs = [o.token_ids for o in engine.generate(fx.prompts, greedy(fx.sizes.max_tokens))]
    forced = [p + r[:j] for p, r in zip(fx.prompts, fx.refs) for j in range(len(r))]
    want = [t for r in fx.refs for t in r]
    got = [o.token_ids[0] for o in engine.generate(forced, greedy(1))]
    forced_agree = sum(g == w for g, w in zip(got, want)) / len(want)
    out.record(teacher_forced_agreement=forced_agree, free_running_agreement=agreement(outs, fx.refs),
               exact=f"{num_exact(outs, fx.refs)}/{len(outs)}", dtype=str(engine.runner.dtype),
               kv_dtype=str(engine.runner.kv_caches[0].k.dtype))
    out.require(forced_agree > floor, f"teacher-forced agreement {forced_agree:.3f} <= {floor}")
    out.require(engine.kv.num_held_blocks() == 0, "KV blocks still held after the run")


def decoder_plan(num_layers: int, scheme: str) -> dict[str, str]:
    return {f"model.layers.{i}.{proj}": scheme for i in range(num_layers) for proj in DECODER_PROJS}


def cpu_reference_engine(path: Path, plan: dict[str, str]) -> Engine:
    """The plan on a CPU fp32 engine whose quantized Linears always dequantize and run an fp32 GEMM (their
    float reference path, whatever CPU kernels the machine has)."""
    model = load_model(path, torch.float32, torch.device("cpu"))
    apply_plan(model, plan, group_size=INT4_GROUP_SIZE)
    for m in model.modules():
        if isinstance(m, (Int8WeightOnlyLinear, Int4WeightOnlyLinear)):
            m.dequant_min_rows = 0
    fuse_projections(model)
    return Engine(model, EngineConfig(model=str(path), device="cpu", block_size=BLOCK_SIZE, num_kv_blocks=512,
                                      max_num_batched_tokens=4096))


def check_quant(out: Outcome, fx: Fixtures, scheme: str) -> None:
    plan = decoder_plan(fx.hf.config.num_hidden_layers, scheme)
    params = greedy(fx.sizes.max_tokens)
    outs, engine = run_engine(fx.target_dir, fx.prompts, params, fx.device, dtype="float32", quant_plan=plan,
                              quant_group_size=INT4_GROUP_SIZE, block_size=BLOCK_SIZE, num_kv_blocks=512,
                              max_num_batched_tokens=4096)
    cpu_outs = [o.token_ids for o in cpu_reference_engine(fx.target_dir, plan).generate(fx.prompts, params)]
    agree = agreement(outs, cpu_outs)
    out.record(agreement_vs_cpu=agree, exact_vs_cpu=f"{num_exact(outs, cpu_outs)}/{len(outs)}",
               agreement_vs_fp32_oracle=agreement(outs, fx.refs))
    out.require(agree >= 0.9, f"device vs CPU agreement {agree:.3f} < 0.9")
    mod = engine.model.model.layers[0].mlp.down_proj  # never fused: the plan's module as applied
    out.require(isinstance(mod, (Int8WeightOnlyLinear, Int4WeightOnlyLinear)), f"down_proj is {type(mod).__name__}")
    x = torch.randn(7, mod.in_features, generator=torch.Generator().manual_seed(0)).to(fx.device)
    ref = x.double() @ mod.dequantized().double().T
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        with torch.inference_mode():
            y = mod(x.to(dtype))
        err = float((y.double() - ref).abs().max())
        rel = err / float(ref.abs().max())
        name = str(dtype).removeprefix("torch.")
        out.record(**{f"kernel_{name}": mod.kernel_for(7, x.device, dtype), f"max_abs_err_{name}": err,
                      f"rel_err_{name}": rel})
        out.require(y.dtype == dtype and rel < tol, f"{name} module output: rel err {rel:.2e} >= {tol}")


def spec_config(fx: Fixtures, method: str) -> SpeculativeConfig:
    """Fixed draft length, never switched off: these checks are about exactness, not the adaptive policy.

    ngram looks up single tokens too (min_n 1): a random model's output rarely repeats a longer n-gram of its
    prompt. self_draft_int8 (the target, int8, as its own draft) is the one with partial acceptance: long
    accepted runs and rejections both (the float self-draft accepts everything, the random drafts ~nothing)."""
    kw = dict(adaptive=False, disable_above_batch_size=None, max_step_rows=None)
    if method == "ngram":
        return SpeculativeConfig(method="ngram", ngram_min_n=1, ngram_max_n=3, **kw)
    draft = {"draft": fx.draft_dir, "self_draft": fx.target_dir, "self_draft_int8": fx.target_dir,
             "eagle": fx.eagle_dir}[method]
    scheme = "int8" if method == "self_draft_int8" else None
    return SpeculativeConfig(method="draft", draft_model=str(draft), draft_quantization=scheme, draft_ngram_first=False,
                             **kw)


SPEC_BATCHES = ("one_batch", "preempt_recompute", "preempt_swap")


def spec_engine_config(fx: Fixtures, batch: str) -> dict:
    if batch == "one_batch":
        return dict(num_kv_blocks=512, max_num_batched_tokens=4096)
    longest = max(len(p) for p in fx.spec_prompts)
    return dict(num_kv_blocks=fx.preempt_blocks(longest), max_num_batched_tokens=64,
                preemption_mode=batch.removeprefix("preempt_"))


def record_spec_stats(out: Outcome, engine: Engine) -> None:
    s = engine.stats()
    spec = s.spec_decode
    out.record(num_drafts=spec.num_drafts, num_draft_tokens=spec.num_draft_tokens,
               acceptance_rate=spec.acceptance_rate, mean_acceptance_length=spec.mean_acceptance_length,
               preemptions=s.num_preemptions)
    out.require(engine.kv.num_held_blocks() == 0, "target KV blocks still held after the run")
    proposer = engine.spec.proposer
    if isinstance(proposer, PagedDraftProposer):
        out.require(proposer.kv.num_held_blocks() == 0 and not proposer.seqs, "draft KV blocks still held")


def check_spec(out: Outcome, fx: Fixtures, method: str, batch: str) -> None:
    config = spec_engine_config(fx, batch)
    outs, engine = run_engine(fx.target_dir, fx.spec_prompts, greedy(fx.sizes.max_tokens), fx.device,
                              dtype="float32", block_size=BLOCK_SIZE, speculative=spec_config(fx, method), **config)
    out.record(exact=f"{num_exact(outs, fx.spec_refs)}/{len(outs)}", num_kv_blocks=config["num_kv_blocks"])
    record_spec_stats(out, engine)
    d = out.details
    out.require(outs == fx.spec_refs, "outputs differ from HF greedy")
    out.require(d["num_drafts"] > 0, "nothing was drafted")
    if method == "self_draft":
        out.require((d["acceptance_rate"] or 0.0) >= 0.95, "the target as its own draft was not accepted ~always")
    if method == "self_draft_int8":
        out.require(0.0 < (d["acceptance_rate"] or 0.0) < 1.0, "no partial acceptance")
    if batch != "one_batch":
        out.require(d["preemptions"] > 0, "no preemption happened")


def check_sampled_spec(out: Outcome, fx: Fixtures, method: str) -> None:
    n = fx.sizes.max_tokens
    params = [SamplingParams(max_tokens=n, temperature=0.8, top_p=0.9, seed=1000 + i, ignore_eos=True)
              for i in range(len(fx.spec_prompts))]
    runs = []
    for _ in range(2):
        outs, engine = run_engine(fx.target_dir, fx.spec_prompts, params, fx.device, dtype="float32",
                                  block_size=BLOCK_SIZE, speculative=spec_config(fx, method),
                                  **spec_engine_config(fx, "one_batch"))
        runs.append(outs)
    record_spec_stats(out, engine)
    out.record(same_tokens=f"{num_exact(runs[1], runs[0])}/{len(runs[0])}",
               distinct_outputs=len({tuple(o) for o in runs[0]}))
    out.require(runs[0] == runs[1], "the same seeds gave different tokens")
    out.require(all(len(o) == n and all(0 <= t < fx.vocab for t in o) for o in runs[0]), "malformed outputs")
    out.require(out.details["num_drafts"] > 0, "nothing was drafted")


def check_cpu_kernels_unused(out: Outcome, device: str, results: list[dict]) -> None:
    if torch.device(device).type != "cuda":
        raise Skip("meaningful on CUDA only (CPU engines use the kernels by design)")
    calls = {r["name"]: r["cpu_kernel_calls"] for r in results if r["device_only"] and r["cpu_kernel_calls"]}
    out.record(checks_that_asked=calls)
    out.require(not calls, "device-only checks asked for accel's CPU kernels")


def timed(fn: Callable[[], object], device: str) -> tuple[object, float]:
    """(fn(), wall seconds), the device synchronized before and after."""
    sync(device)
    t0 = time.perf_counter()
    result = fn()
    sync(device)
    return result, time.perf_counter() - t0


def hf_generate(model: transformers.LlamaForCausalLM, prompts: list[list[int]], new_tokens: int) -> torch.Tensor:
    ids = torch.tensor(prompts, device=model.device)
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)


def check_bench(out: Outcome, fx: Fixtures) -> None:
    s, device = fx.sizes, fx.device
    config = bench_config(s.bench_layers)
    torch.manual_seed(0)
    with torch.device(device):
        hf = transformers.LlamaForCausalLM(config)
    hf = hf.to(torch.bfloat16).eval()
    path = fx.workdir / "bench"
    hf.save_pretrained(path)
    max_batch = max(s.bench_batches)
    blocks = max_batch * -(-(s.bench_prompt_len + s.bench_new_tokens) // BLOCK_SIZE) + 16
    engine = load_engine(path, device, dtype="bfloat16", block_size=BLOCK_SIZE, num_kv_blocks=blocks,
                         max_num_seqs=max_batch, enable_prefix_caching=False)

    def prompts(batch: int, seed: int) -> list[list[int]]:
        lo = hi = s.bench_prompt_len
        return random_prompts(batch, seed=seed, lo=lo, hi=hi, vocab=config.vocab_size)

    engine.generate(prompts(max_batch, seed=99), greedy(8))  # warm-up
    n = s.bench_new_tokens
    for b in s.bench_batches:
        finals, wall = timed(lambda: engine.generate(prompts(b, seed=b), greedy(n)), device)
        out.record(**{f"engine_b{b}_tok_s": b * n / wall})
        out.require(all(len(o.token_ids) == n for o in finals), f"engine batch {b}: wrong output lengths")
    hf_generate(hf, prompts(1, seed=98), 8)  # warm-up
    for b in s.hf_batches:
        ids, wall = timed(lambda: hf_generate(hf, prompts(b, seed=b), n), device)
        out.record(**{f"hf_b{b}_tok_s": b * n / wall})
        out.require(tuple(ids.shape) == (b, s.bench_prompt_len + n), f"HF batch {b}: wrong output shape")
        if b in s.bench_batches:
            ratio = out.details[f"engine_b{b}_tok_s"] / out.details[f"hf_b{b}_tok_s"]
            out.record(**{f"ratio_engine_vs_hf_b{b}": ratio})
    if torch.device(device).type == "cuda":
        out.record(peak_gpu_memory_gib=torch.cuda.max_memory_allocated() / 2**30)
    out.record(layers=s.bench_layers, prompt_len=s.bench_prompt_len, new_tokens=n)


# ---- the runner -----------------------------------------------------------------------------------------
@dataclass
class Check:
    name: str
    fn: Callable[[Outcome], None]
    device_only: bool = True  # runs no accel engine on the CPU (see check_cpu_kernels_unused)
    timeout_s: float | None = None  # None: --check-timeout-s


def build_checks(fx: Fixtures, results: list[dict], tf32_env_removed: dict[str, str]) -> list[Check]:
    p = functools.partial
    checks = [Check("env", p(check_env, device=fx.device, tf32_env_removed=tf32_env_removed), device_only=False)]
    checks += [Check(f"greedy_fp32/{b}", p(check_greedy, fx=fx, batch=b)) for b in GREEDY_BATCHES]
    checks += [Check("greedy_fp32/prefix_cache", p(check_prefix_cache, fx=fx)),
               Check("kv_int8", p(check_agreement, fx=fx, floor=0.5, dtype="float32", kv_cache_dtype="int8")),
               Check("bf16", p(check_agreement, fx=fx, floor=0.5, dtype="bfloat16"))]
    checks += [Check(f"quant/{s}", p(check_quant, fx=fx, scheme=s), device_only=False) for s in ("int8", "int4")]
    checks += [Check(f"spec/{m}/{b}", p(check_spec, fx=fx, method=m, batch=b))
               for m in SPEC_METHODS for b in SPEC_BATCHES]
    checks += [Check(f"sampled_spec/{m}", p(check_sampled_spec, fx=fx, method=m)) for m in SAMPLED_SPEC_METHODS]
    checks += [Check("bench", p(check_bench, fx=fx), timeout_s=150),
               Check("cpu_kernels_unused", p(check_cpu_kernels_unused, device=fx.device, results=results),
                     device_only=False)]
    return checks


class CheckTimeout(Exception):
    pass


@contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """Raise CheckTimeout in the main thread after `seconds` (when control is back in Python)."""
    def expire(signum, frame):
        raise CheckTimeout(f"timed out after {seconds:.1f} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def cpu_kernel_calls() -> int:
    """Calls so far of accel's CPU-kernel loader (every `cpu.available()` goes through it)."""
    info = cpu._module.cache_info()
    return info.hits + info.misses


def log(t0: float, msg: str) -> None:
    print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)


def brief(details: dict, width: int = 160) -> str:
    text = " ".join(f"{k}={v}" for k, v in details.items())
    return text if len(text) <= width else text[: width - 3] + "..."


def run_check(check: Check, t0: float, deadline: float, default_timeout_s: float) -> dict:
    res = dict(name=check.name, status="SKIP", seconds=0.0, details={}, failures=[], error=None,
               device_only=check.device_only, cpu_kernel_calls=0)
    left = deadline - time.perf_counter()
    if left < MIN_CHECK_S:
        res["error"] = "time budget spent"
        return res
    log(t0, f"..... {check.name}")
    out, calls, start = Outcome(), cpu_kernel_calls(), time.perf_counter()
    try:
        with alarm(min(check.timeout_s or default_timeout_s, left)):
            check.fn(out)
        res["status"] = "FAIL" if out.failures else "PASS"
    except Skip as e:
        res["error"] = str(e)
    except Exception as e:  # noqa: BLE001 - a broken check is reported, and the run goes on
        res["status"], res["error"] = "ERROR", "".join(traceback.format_exception(e))
    res.update(seconds=round(time.perf_counter() - start, 2), details=out.details, failures=out.failures,
               cpu_kernel_calls=cpu_kernel_calls() - calls)
    return res


def report(t0: float, res: dict) -> None:
    log(t0, f"{res['status']:5} {res['name']}  ({res['seconds']:.1f} s)  {brief(res['details'], 10_000)}")
    for f in res["failures"]:
        print(f"        requirement failed: {f}", flush=True)
    if res["error"]:
        print("        " + res["error"].rstrip().replace("\n", "\n        "), flush=True)


def one_line(res: dict) -> str:
    """The failed requirements, the error's last line, the skip reason, or the details."""
    if res["failures"]:
        return "; ".join(res["failures"])
    if res["status"] in ("ERROR", "SKIP"):
        lines = (res["error"] or "").strip().splitlines()
        return lines[-1] if lines else ""
    return brief(res["details"])


def summary(results: list[dict]) -> str:
    width = max(len(r["name"]) for r in results)
    lines = [f"{'check':{width}}  status  seconds  details", "-" * (width + 120)]
    for r in results:
        lines.append(f"{r['name']:{width}}  {r['status']:6}  {r['seconds']:7.1f}  {one_line(r)}")
    counts = {s: sum(r["status"] == s for r in results) for s in ("PASS", "FAIL", "ERROR", "SKIP")}
    lines.append(" ".join(f"{k}={v}" for k, v in counts.items()))
    return "\n".join(lines)


def write_json(path: Path | None, args: argparse.Namespace, sizes: Sizes, results: list[dict], t0: float) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = dict(device=args.device, quick=args.quick, sizes=asdict(sizes),
                   elapsed_s=round(time.perf_counter() - t0, 1), checks=results)
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (a dry run)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes (for the CPU dry run)")
    default_json = Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None
    ap.add_argument("--json", type=Path, default=default_json, help="write the results here (default: %(default)s)")
    ap.add_argument("--only", default="", help="comma-separated check-name prefixes to run (default: all)")
    ap.add_argument("--budget-s", type=float, default=210.0, help="no check starts or runs past this (default 210)")
    ap.add_argument("--check-timeout-s", type=float, default=60.0, help="per-check alarm (default 60)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if torch.device(args.device).type == "cuda":
        os.environ.setdefault(cpu.DISABLE_ENV, "1")  # CPU references only; no compile of the CPU kernels
    tf32_env_removed = {k: os.environ.pop(k) for k in TF32_ENV if k in os.environ}  # read at cuBLAS init
    torch.set_float32_matmul_precision("highest")
    sizes = QUICK if args.quick else Sizes()
    log(t0, f"gpu_check: device={args.device} quick={args.quick} budget={args.budget_s:.0f}s json={args.json}")
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        fx = Fixtures(args.device, sizes, Path(tmp))
        prefixes = [s for s in args.only.split(",") if s]
        for check in build_checks(fx, results, tf32_env_removed):
            if prefixes and not any(check.name.startswith(s) for s in prefixes):
                continue
            res = run_check(check, t0, deadline, args.check_timeout_s)
            results.append(res)
            report(t0, res)
            write_json(args.json, args, sizes, results, t0)
    print("\n" + summary(results), flush=True)
    log(t0, f"done; results in {args.json}" if args.json else "done")
    return 0 if all(r["status"] in ("PASS", "SKIP") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
