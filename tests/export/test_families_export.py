"""Each family's quantized export, end to end on a tiny random model: a plan of one scheme per fused unit
(INT4 / INT8 / 16-bit in turn) quantized by llm-compressor, exported; transformers loads it and decodes what accel
decodes (greedy), and vLLM's own parser and loaders take it where the side venv exists."""

from __future__ import annotations

import pytest
import torch
import transformers

from accel.export.compatibility import run_vllm_check, vllm_python
from accel.runtime.sampling_params import SamplingParams
from tests.runtime.helpers import hf_greedy, mixed_prompts
from tests.runtime.test_families import family_config

# hidden 256: shapes vLLM's kernels take. Phi-3's plan names its fused qkv_proj / gate_up_proj as one unit each
KINDS = ["llama_tied", "qwen2", "qwen3", "mistral_window", "gemma3", "phi3"]


def _quantized(kind: str, root, head: str = "int8", table: str = "fp16"):
    """A tiny random `kind` model saved under root / "base", quantized (RTN) by a plan of one scheme per fused unit
    (INT4 / INT8 / 16-bit in turn) and the lm_head at `head`; returns the checkpoint folder."""
    from accel.quant.allocate import Plan
    from accel.quant.quantize import oneshot_quantize, save_checkpoint
    from accel.quant.schemes import expand_units, quant_units, quantizable_linears
    from tests.conftest import make_tiny_tokenizer

    config = family_config(kind)
    config.hidden_size, config.intermediate_size, config.vocab_size = 256, 512, 320
    config.initializer_range = 0.05
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(root / "base")
    make_tiny_tokenizer().save_pretrained(root / "base")
    model = transformers.AutoModelForCausalLM.from_pretrained(root / "base", dtype=torch.float32).eval()
    units = quant_units(quantizable_linears(model))
    schemes = expand_units({u: ("int4", "int8", "fp16")[i % 3] for i, u in enumerate(units)}, units)
    plan = Plan(schemes=schemes, group_size=64, avg_bits=0, estimated_kl=0, lm_head=head, units=units,
                table=table, tied=bool(model.config.tie_word_embeddings))
    cal = [torch.randint(3, 320, (2, 32), generator=torch.Generator().manual_seed(0))]
    return save_checkpoint(oneshot_quantize(model, plan, cal, "rtn").model, plan, root / "ck")


@pytest.fixture(scope="module", params=KINDS)
def export(request, tmp_path_factory):
    from accel.export.checkpoint import write_export

    root = tmp_path_factory.mktemp(request.param)
    return request.param, write_export(root / "export", _quantized(request.param, root))


@pytest.mark.parametrize("head", ["int8", "int8g"])
@torch.no_grad()
def test_gemmas_scaled_table_stored_once_at_8_bits_loads_alike_everywhere(tmp_path, head):
    """Gemma 3's tied table scaled by sqrt(hidden) on lookup, stored once at INT8 (per row, or per 32 values):
    transformers, accel's module loader (the evaluation's) and the runtime compute the same model."""
    from accel.kernels.linear import Int8Embedding
    from accel.kernels.loader import load_hf_model
    from accel.runtime.engine import Engine

    ck = _quantized("gemma3", tmp_path, head, table=head)
    hf = transformers.AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32).eval()
    mods = load_hf_model(ck)
    assert isinstance(mods.model.embed_tokens, Int8Embedding)
    x = torch.randint(3, 320, (1, 24), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(mods(x).logits, hf(x).logits, atol=2e-3, rtol=2e-3)
    prompts = mixed_prompts(3, seed=4, lo=4, hi=16, vocab=320)
    engine = Engine.from_pretrained(ck, num_kv_blocks=64, block_size=4)
    outs = engine.generate(prompts, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 10) for p in prompts]


def test_transformers_decodes_what_accel_decodes(export):
    from accel.export.load import load_engine

    kind, path = export
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = mixed_prompts(4, seed=9, lo=4, hi=20, vocab=320)
    refs = [hf_greedy(hf, p, 12) for p in prompts]
    engine = load_engine(path, num_kv_blocks=64, block_size=4)
    outs = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    assert [o.token_ids for o in outs] == refs


@pytest.mark.skipif(not vllm_python().is_file(),
                    reason=f"no vLLM side venv at {vllm_python()} (bash scripts/peers/setup_vllm_check.sh)")
def test_vllm_parses_and_loads_it_with_identical_values(export):
    kind, path = export
    rep = run_vllm_check(path)
    assert rep["ok"], rep
    assert rep["load"]["ints_equal"] and not rep["load"]["params_not_loaded"]
