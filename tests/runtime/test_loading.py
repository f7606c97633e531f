"""Loading a folder module by module (`load_weights`): `--quant` rounds each Linear as it is read into exactly what
rounding the whole fp32 model afterwards gives, a model served quantized keeps its table at 16 bits, the kernels'
layouts become the weights' only copy (`compact_`) without changing a result, and the headers alone predict the
bytes a load holds (`planned_bytes`), which the engine checks against the memory budget before reading."""

from __future__ import annotations

import pytest
import torch

from accel.kernels import cpu
from accel.kernels.linear import Float16Embedding, Int4WeightOnlyLinear, Int8WeightOnlyLinear, module_bytes
from accel.schemes import apply_plan, held_bytes, quantize_rows
from accel.kernels.loader import planned_bytes
from accel.quant.schemes import uniform_plan
from accel.runtime.engine import Engine
from accel.runtime.models import load_model
from tests.runtime.helpers import make_hf_model, tiny_config

CPU = torch.device("cpu")
needs_kernels = pytest.mark.skipif(not cpu.available(), reason="accel's CPU kernels did not build here")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    make_hf_model(tiny_config(hidden_size=128, intermediate_size=256, vocab_size=512)).save_pretrained(path)
    return path


def _buffers(m):
    return {k: v for k, v in m.state_dict().items()}


@pytest.mark.parametrize("scheme,group", [("int8", 64), ("int8g", 64), ("int4", 32), ("int4f", 64), ("w8a8", 64)])
def test_quantize_on_load_equals_quantizing_the_loaded_model(folder, scheme, group):
    plan = uniform_plan(2, scheme)
    streamed = load_model(folder, torch.float32, CPU, plan, group)
    whole = apply_plan(load_model(folder, torch.float32, CPU), plan, group)
    for name in plan:
        a, b = streamed.get_submodule(name), whole.get_submodule(name)
        assert type(a) is type(b), name
        sa, sb = _buffers(a), _buffers(b)
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), name
    assert isinstance(streamed.model.embed_tokens, Float16Embedding)  # the table as an export stores it
    torch.testing.assert_close(streamed.model.embed_tokens.weight, whole.model.embed_tokens.weight.half())


def test_a_float_model_keeps_its_float_table(folder):
    model = load_model(folder, torch.float32, CPU)
    assert type(model.model.embed_tokens) is torch.nn.Embedding
    assert model.model.embed_tokens.weight.dtype == torch.float32


def test_tied_head_quantized_from_the_table_on_load(tmp_path):
    make_hf_model(tiny_config(tie_word_embeddings=True)).save_pretrained(tmp_path)
    plan = uniform_plan(2, "int8")
    streamed = load_model(tmp_path, torch.float32, CPU, plan)
    whole = apply_plan(load_model(tmp_path, torch.float32, CPU), plan)
    assert isinstance(streamed.lm_head, Int8WeightOnlyLinear)
    assert torch.equal(streamed.lm_head.qweight, whole.lm_head.qweight)
    plain = load_model(tmp_path, torch.float32, CPU)
    assert plain.lm_head.weight is plain.model.embed_tokens.weight  # still tied when nothing is quantized


@pytest.mark.parametrize("scheme", ["int8", "int8g", "int4", "int4f"])
def test_rounding_by_blocks_of_rows_is_rounding_at_once(monkeypatch, scheme):
    import accel.kernels.linear as linear

    w, bias = torch.randn(50, 64), torch.randn(50)
    whole = quantize_rows(lambda a, b: w[a:b], 50, 64, scheme, 32, bias)
    monkeypatch.setattr(linear, "_QUANT_CHUNK_ROWS", 7)
    calls = []
    parts = quantize_rows(lambda a, b: calls.append((a, b)) or w[a:b], 50, 64, scheme, 32, bias)
    assert calls[:2] == [(0, 7), (7, 14)] and calls[-1] == (49, 50)
    sa, sb = whole.state_dict(), parts.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@needs_kernels
@pytest.mark.parametrize("scheme,group", [("int8", None), ("int8g", None), ("int4", 64), ("int4f", 32)])
def test_compacted_modules_compute_as_before(scheme, group):
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 96, bias=True)
    if scheme.startswith("int8"):
        m = Int8WeightOnlyLinear.from_linear(lin, group_size=32 if scheme == "int8g" else None)
    else:
        m = Int4WeightOnlyLinear.from_linear(lin, group_size=group, float_zero=scheme == "int4f")
    x = torch.randn(5, 256)
    before, ref = m(x), m.dequantized()
    freed = m.compact_()
    if not m.compact:  # this CPU's INT8 kernel reads the canonical layout itself: nothing to drop
        assert freed == 0 and scheme.startswith("int8")
        return
    assert freed > 0
    assert torch.equal(m(x), before)
    torch.testing.assert_close(m.dequantized(), ref, rtol=0, atol=1e-6)
    with pytest.raises(RuntimeError, match="compacted for serving"):
        m.state_dict()
    with pytest.raises(RuntimeError, match="compacted for serving"):
        m.to(torch.float64)
    held = module_bytes(m) - 96 * 4  # less the bias
    assert held <= held_bytes(scheme, 96, 256, group or 64)


@needs_kernels
@pytest.mark.parametrize("quant", [None, "fp16-weights", "int8", "int4"])
def test_headers_predict_what_the_engine_holds(folder, quant):
    from accel.kernels import cpu

    half = quant == "fp16-weights"
    if half and not cpu.has_avx512():
        pytest.skip("fp16 weight panels need AVX-512")
    plan = uniform_plan(2, quant) if quant and not half else None
    engine = Engine.from_pretrained(folder, quant_plan=plan, quant_group_size=32, num_kv_blocks=8, block_size=16,
                                    weight_dtype="float16" if half else "auto")
    held = engine.memory()["weights"]
    predicted, _ = planned_bytes(folder, torch.float32, False, plan, 32, torch.float16 if quant else None,
                                 torch.float16 if half else None)
    assert held <= predicted * 1.05 + (1 << 16)  # weight panels pad a Linear to whole 48-output panels
    if quant:  # 16-bit weights and table: about half of fp32 (norms and biases stay fp32)
        fp32_engine = Engine.from_pretrained(folder, num_kv_blocks=8, block_size=16)
        assert held < (0.55 if half else 0.5) * fp32_engine.memory()["weights"]


@needs_kernels
def test_generation_is_the_same_after_compaction(folder):
    """Compaction happens as the engine prepares the CPU decode step; greedy tokens equal a module-path engine's."""
    plan = uniform_plan(2, "int4")
    engine = Engine.from_pretrained(folder, quant_plan=plan, quant_group_size=32, num_kv_blocks=16, block_size=16)
    assert any(getattr(m, "compact", False) for m in engine.model.modules())
    from accel.runtime.sampling_params import SamplingParams

    def greedy(e):
        rid = e.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=12, temperature=0))
        out = []
        while e.has_unfinished():
            out += [o.token_ids for o in e.step() if o.request_id == rid and o.finished]
        return out[-1]

    reference = Engine(apply_plan(load_model(folder, torch.float32, CPU), plan, 32), engine.config)
    assert greedy(engine) == greedy(reference)


@needs_kernels
@pytest.mark.parametrize("scheme", ["int8", "int8g", "int4", "int4f"])
def test_kernel_layouts_built_a_block_of_rows_at_a_time_are_the_whole_layout(monkeypatch, scheme):
    import accel.kernels.linear as linear

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 112)  # 112 rows: blocks of 48, 48 and a last one of 16
    make = (lambda: Int8WeightOnlyLinear.from_linear(lin, group_size=32 if scheme == "int8g" else None)) \
        if scheme.startswith("int8") else \
        (lambda: Int4WeightOnlyLinear.from_linear(lin, group_size=32, float_zero=scheme == "int4f"))
    whole = make().avx2_operands()
    monkeypatch.setattr(linear, "_LAYOUT_ROWS", 48)
    blocks = make().avx2_operands()
    assert whole[0] == blocks[0] and torch.equal(whole[1], blocks[1]) and torch.equal(whole[2], blocks[2])
