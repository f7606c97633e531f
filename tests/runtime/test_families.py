"""Every architecture the runtime runs, against transformers (the oracle) on tiny random models built here: logits
of a chunked prompt longer than any window (fp32, 1e-4) and greedy output in a batch, under prefix caching and
preemption. An architecture accel cannot run is refused from its config, before any weight is read."""

from __future__ import annotations

import pytest
import torch
import transformers
from tests.runtime.helpers import hf_greedy, mixed_prompts
from tests.runtime.test_model import chunk_logits, hf_logits

from accel.runtime.engine import Engine, EngineConfig
from accel.runtime.models import family_of, load_model
from accel.runtime.sampling_params import SamplingParams

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=256, initializer_range=0.3, bos_token_id=1, eos_token_id=2,
            pad_token_id=0)
WINDOW = 8  # shorter than the prompts: the windowed layers must drop keys


def family_config(kind: str):
    if kind == "llama_untied":
        return transformers.LlamaConfig(**BASE, tie_word_embeddings=False)
    if kind == "llama_tied":
        return transformers.LlamaConfig(**BASE, tie_word_embeddings=True)
    if kind == "llama3_rope":
        return transformers.LlamaConfig(**BASE, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if kind == "linear_rope":
        return transformers.LlamaConfig(**BASE, rope_parameters={"rope_type": "linear", "rope_theta": 1e4,
                                                                 "factor": 2.0})
    if kind == "qwen2":
        return transformers.Qwen2Config(**BASE, use_sliding_window=False)
    if kind == "qwen2_window":  # layers from max_window_layers on slide (transformers' rule)
        return transformers.Qwen2Config(**BASE, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    if kind == "mistral_window":
        return transformers.MistralConfig(**BASE, sliding_window=WINDOW)
    if kind == "phi3":  # q/k/v and gate/up fused in the checkpoint
        return transformers.Phi3Config(**BASE)
    if kind == "qwen3":
        return transformers.Qwen3Config(**BASE, head_dim=32, use_sliding_window=False)
    if kind == "gemma3":
        return transformers.Gemma3TextConfig(
            **{**BASE, "num_hidden_layers": 7, "num_key_value_heads": 1}, head_dim=32, query_pre_attn_scalar=24,
            sliding_window=WINDOW, rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    raise ValueError(kind)


WINDOWED = ("qwen2_window", "mistral_window", "gemma3")
KINDS = ["llama_untied", "llama_tied", "llama3_rope", "linear_rope", "qwen2", "qwen2_window", "mistral_window",
         "qwen3", "phi3", "gemma3"]


@pytest.fixture(scope="module", params=KINDS)
def family(request, tmp_path_factory):
    config = family_config(request.param)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # zero-initialised biases and norms (Gemma's w = 0 is a scale of 1) would hide mistakes
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.3)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return request.param, path, hf


def test_logits_equal_transformers_over_chunks_past_the_window(family):
    kind, path, hf = family
    ours = load_model(path, torch.float32, torch.device("cpu"))
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == bool(hf.config.tie_word_embeddings)
    prompt = mixed_prompts(1, seed=5, lo=100, hi=100)[0]
    engine = Engine(ours, EngineConfig(model=str(path), num_kv_blocks=64, block_size=4, max_num_batched_tokens=48))
    engine.add_request(prompt, SamplingParams(max_tokens=4, temperature=0), request_id="x")
    got = chunk_logits(engine)["x"]  # three chunks (48 + 48 + 4), then decode steps (the native step on CPU)
    full = prompt + got[len(prompt) - 1:].argmax(-1).tolist()[:3]
    want = hf_logits(hf, full)[:got.shape[0]]
    n = len(prompt)
    torch.testing.assert_close(got[:n], want[:n], atol=1e-4, rtol=1e-4)
    # decode rows: accel's GEMV kernels sum in another order than torch's GEMM
    torch.testing.assert_close(got[n:], want[n:], atol=5e-4, rtol=1e-4)


def test_greedy_equals_transformers_in_a_batch_and_alone(family):
    kind, path, hf = family
    shared = mixed_prompts(1, seed=3, lo=12, hi=12)[0]  # a shared prefix: prefix-cache hits
    prompts = [shared + p for p in mixed_prompts(10, seed=2, lo=1, hi=40)]
    refs = [hf_greedy(hf, p, 12) for p in prompts]
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    # a pool too small for all ten at once: preemption, recompute and cached prefixes on the way
    engine = Engine.from_pretrained(path, num_kv_blocks=48, block_size=4,
                                    max_num_batched_tokens=64)
    assert [o.token_ids for o in engine.generate(prompts, greedy)] == refs
    # (a windowed model's requests hold few blocks: `test_sliding_groups_survive_preemption` preempts them)
    assert (kind in WINDOWED or engine.stats().num_preemptions > 0) and engine.stats().prefix_cache_hit_rate > 0
    (alone,) = Engine.from_pretrained(path, num_kv_blocks=64, block_size=4).generate([prompts[3]], greedy)
    assert alone.token_ids == refs[3]


@pytest.mark.parametrize("overrides, message", [
    (dict(model_type="phi", architectures=["PhiForCausalLM"]), "model_type='phi' is not supported; supported: llama"),
    (dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}), "rope_type='dynamic'"),
    (dict(hidden_act="relu"), "hidden activation 'relu' is not supported"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75}),
     "partial_rotary_factor=0.75 is not supported"),
])
def test_an_architecture_accel_cannot_run_is_refused_before_loading(overrides, message):
    config = transformers.LlamaConfig(**BASE)
    for k, v in overrides.items():
        setattr(config, k, v)
    with pytest.raises(NotImplementedError, match=message):
        family_of(config)


@pytest.mark.parametrize("kind", ["mistral_window", "gemma3"])
def test_window_blocks_go_back_to_the_pool_so_a_pool_shorter_than_the_context_serves_it(kind, tmp_path):
    """Blocks behind every sliding window are freed, not masked: a 100-token prompt generating 60 more runs,
    equal to transformers, in a pool whose sliding groups hold far fewer blocks than the 160 positions need."""
    from accel.runtime.kv_cache_manager import KVLayout

    config = family_config(kind)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    hf.save_pretrained(tmp_path)
    prompt = mixed_prompts(1, seed=7, lo=100, hi=100)[0]
    ref = hf_greedy(hf, prompt, 60)
    engine = Engine.from_pretrained(tmp_path, num_kv_blocks=14, block_size=4, max_num_batched_tokens=16)
    layout = engine.model.kv_layout
    full = sum(w is None for w in layout.windows)
    # full-attention groups need all 40 blocks; each sliding group (window 8) at most (8 - 1 + 16) / 4 + 2
    assert engine.kv.pool.num_blocks < 40 * layout.num_groups and engine.kv.pool.num_blocks >= 40 * full + 8 * (
        layout.num_groups - full)
    rid = engine.add_request(prompt, SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))
    most, out = 0, None
    while engine.has_unfinished():
        for o in engine.step():
            out = o
        most = max(most, engine.kv.num_held_blocks())
    assert out.request_id == rid and out.token_ids == ref and engine.stats().num_preemptions == 0
    assert most <= 40 * full + 8 * (layout.num_groups - full)
    assert engine.kv.num_held_blocks() == 0
    # groups as large as the rarer kind: 2 global layers, 5 sliding ones in groups of 2, 2 and 1
    mixed = KVLayout.of([None, 8, 8, 8, 8, 8, None])
    assert mixed.windows == (None, 8, 8, 8) and mixed.num_tensors == 2
    assert mixed.layer_group == (0, 1, 1, 2, 2, 3, 0) and mixed.layer_tensor == (0, 0, 1, 0, 1, 0, 1)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("kind", ["mistral_window", "gemma3"])
def test_sliding_groups_survive_preemption(kind, mode, tmp_path):
    """Six requests whose global layers outgrow a small pool: preempted (recomputed, or swapped out and back into
    other blocks, only the blocks inside each window), then equal to transformers."""
    config = family_config(kind)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    hf.save_pretrained(tmp_path)
    prompts = mixed_prompts(6, seed=11, lo=20, hi=30)
    refs = [hf_greedy(hf, p, 40) for p in prompts]
    engine = Engine.from_pretrained(tmp_path, num_kv_blocks=10 if kind == "gemma3" else 9, block_size=4,
                                    max_num_batched_tokens=16, preemption_mode=mode)
    outs = engine.generate(prompts, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    assert [o.token_ids for o in outs] == refs
    assert engine.stats().num_preemptions > 0 and engine.kv.num_held_blocks() == 0
