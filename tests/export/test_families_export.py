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


@pytest.fixture(scope="module", params=KINDS)
def export(request, tmp_path_factory):
    from accel.export.checkpoint import write_export
    from accel.quant.allocate import Plan
    from accel.quant.quantize import oneshot_quantize, save_checkpoint
    from accel.quant.schemes import expand_units, quant_units, quantizable_linears
    from tests.conftest import make_tiny_tokenizer

    config = family_config(request.param)
    config.hidden_size, config.intermediate_size, config.vocab_size = 256, 512, 320
    config.initializer_range = 0.05
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    root = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(root / "base")
    make_tiny_tokenizer().save_pretrained(root / "base")
    model = transformers.AutoModelForCausalLM.from_pretrained(root / "base", dtype=torch.float32).eval()
    units = quant_units(quantizable_linears(model))
    schemes = expand_units({u: ("int4", "int8", "fp16")[i % 3] for i, u in enumerate(units)}, units)
    plan = Plan(schemes=schemes, group_size=64, avg_bits=0, estimated_kl=0, lm_head="int8", units=units)
    cal = [torch.randint(3, 320, (2, 32), generator=torch.Generator().manual_seed(0))]
    ck = save_checkpoint(oneshot_quantize(model, plan, cal, "rtn").model, plan, root / "ck")
    return request.param, write_export(root / "export", ck)


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
