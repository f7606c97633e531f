"""Sensitivity on a tiny random Llama: zero for fp16, int4 worse than int8, suffix caching exact."""

from __future__ import annotations

import pytest
import torch

from accel.quant.allocate import joint_quality
from accel.quant.schemes import fake_quant_int4, fake_quant_int8, fake_quantized, quantizable_linears
from accel.quant.sensitivity import SensitivityResult, measure_sensitivity, rank_agreement, spearman
from tests.conftest import make_tiny_llama


def _model(**kw):
    # init std 0.1 instead of 0.02 so the tiny model's outputs are far from uniform and damage is well above noise
    return make_tiny_llama(**{"initializer_range": 0.1, **kw})


def _batches(seed=0, n=2, b=2, s=16, vocab=256):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (b, s), generator=g) for _ in range(n)]


def test_quantizable_linears_names_in_order():
    names = quantizable_linears(make_tiny_llama())
    assert len(names) == 14
    assert names[:7] == [f"model.layers.0.{m}" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                         "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                         "mlp.down_proj")]
    assert "lm_head" not in names


def test_fake_quant_int8_exact_small():
    w = torch.tensor([[1.0, -0.5, 0.25, 0.0], [2.0, 1.0, -2.0, 0.3]])
    q = fake_quant_int8(w)
    s0, s1 = torch.tensor(1 / 127.5).half().item(), torch.tensor(2 / 127.5).half().item()  # scales stored in fp16
    # row 0: scale ~1/127.5 -> 0.25 / s0 = 31.88 -> 32
    assert q[0, 2].item() == pytest.approx(32 * s0)
    assert q[0, 0].item() == pytest.approx(127 * s0)  # 1 / s0 = 127.6 rounds to 128, clamped to 127
    assert q[0, 1].item() == pytest.approx(-64 * s0)  # -63.8 -> -64
    assert q[1, 3].item() == pytest.approx(19 * s1)  # 0.3 / s1 = 19.1 -> 19


def test_fake_quant_int4_levels_and_zero():
    torch.manual_seed(0)
    w = torch.randn(4, 64)
    q = fake_quant_int4(w, 32)
    for r in range(4):
        for g in range(2):
            assert len(torch.unique(q[r, g * 32:(g + 1) * 32])) <= 16
    assert fake_quant_int4(torch.zeros(2, 32), 32).abs().max() == 0
    with pytest.raises(ValueError, match="group_size=48 is invalid"):
        fake_quant_int4(w, 48)


def test_fake_quantized_restores_and_keeps_tied_embeddings():
    m = _model(tie_word_embeddings=True)
    assert m.lm_head.weight is m.model.embed_tokens.weight
    emb = m.model.embed_tokens.weight.detach().clone()
    seen = {}
    m.lm_head.register_forward_hook(lambda mod, args, out: seen.update(head=mod.weight.detach().clone()))
    with fake_quantized(m, {"lm_head": "int4", "model.layers.0.mlp.up_proj": "int8"}, 32):
        m(torch.tensor([[1, 2, 3]]))
        assert not torch.equal(seen["head"], emb)  # the head ran with its quantized weight
        assert torch.equal(m.model.embed_tokens.weight, emb)
        assert m.lm_head.weight is m.model.embed_tokens.weight  # swapped only while the head runs
    assert m.lm_head.weight is m.model.embed_tokens.weight
    assert torch.equal(m.model.embed_tokens.weight, emb)


def test_a_whole_plan_fake_quantized_holds_one_linears_copy_at_a_time():
    """Each Linear computes with its quantized weight, made as it runs and dropped after: while one runs, every
    other holds its original Parameter (a plan quantized up front held a second copy of the model), and the
    logits equal quantizing every weight first."""
    m = _model(tie_word_embeddings=False)
    names = quantizable_linears(m) + ["lm_head"]
    modules = dict(m.named_modules())
    originals = {n: modules[n].weight for n in names}
    swapped_at_once = []

    def count(_mod, _args, _out):
        swapped_at_once.append(sum(modules[n].weight is not originals[n] for n in names))

    handles = [modules[n].register_forward_hook(count) for n in names]
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with fake_quantized(m, dict.fromkeys(names, "int8"), 32):
        lazily = m(ids).logits
    for h in handles:
        h.remove()
    assert swapped_at_once == [1] * len(names)
    assert all(modules[n].weight is originals[n] for n in names)
    upfront = {n: fake_quant_int8(originals[n].detach()) for n in names}
    with torch.no_grad():
        for n in names:
            modules[n].weight = torch.nn.Parameter(upfront[n], requires_grad=False)
        torch.testing.assert_close(m(ids).logits, lazily, rtol=0, atol=0)


def test_sensitivity_kl_fp16_zero_int4_worse_than_int8():
    m = _model()
    res = measure_sensitivity(m, _batches(), ["int4", "int8", "fp16"], group_size=32, progress=False)
    assert res.num_tokens == 64
    assert all(d["fp16"] == 0.0 for d in res.damage.values())
    assert all(d["int8"] > 0 and d["int4"] > 0 for d in res.damage.values())
    mean4 = sum(d["int4"] for d in res.damage.values()) / len(res.damage)
    mean8 = sum(d["int8"] for d in res.damage.values()) / len(res.damage)
    assert mean4 > 10 * mean8


def test_suffix_cache_equals_full_forward():
    """The layer-cached measurement equals quantizing the layer and running the whole model."""
    m = _model(num_hidden_layers=3)
    batches = _batches(n=1)
    qkv = [f"model.layers.1.self_attn.{p}_proj" for p in "qkv"]
    res = measure_sensitivity(m, batches, ["int4"], group_size=32, progress=False, modules=qkv)
    full = joint_quality(m, {n: "int4" for n in qkv}, 32, batches)  # a unit is measured with all its members
    assert res.damage["model.layers.1.self_attn.qkv_proj"]["int4"] == pytest.approx(full.mean_kl, rel=1e-4)
    unit = "model.layers.1.self_attn.qkv_proj"
    v_only = measure_sensitivity(m, batches, ["int4"], group_size=32, progress=False, modules=qkv[2:])
    assert v_only.damage[unit]["int4"] < res.damage[unit]["int4"]


def test_proxy_and_json_round_trip(tmp_path):
    m = _model()
    res = measure_sensitivity(m, _batches(), ["int4", "int8"], group_size=32, metric="proxy", progress=False)
    assert all(d["int4"] > d["int8"] > 0 for d in res.damage.values())
    res.to_json(tmp_path / "s.json")
    back = SensitivityResult.from_json(tmp_path / "s.json")
    assert back == res
    kl = measure_sensitivity(m, _batches(), ["int4", "int8"], group_size=32, progress=False)
    agree = rank_agreement(kl, res)
    assert set(agree) == {"int4", "int8", "pooled"}
    assert agree["pooled"] > 0.5  # int4 >> int8 in both tables at least


def test_bad_inputs():
    m = _model()
    with pytest.raises(ValueError, match="metric 'mse'"):
        measure_sensitivity(m, _batches(), metric="mse")
    with pytest.raises(ValueError, match="unknown scheme 'int3'"):
        measure_sensitivity(m, _batches(), ["int3"])
    with pytest.raises(ValueError, match="LongTensor"):
        measure_sensitivity(m, [torch.zeros(2, 4)], ["int8"])


def test_spearman_hand_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)


def test_the_fisher_proxy_estimates_the_measured_kl_in_its_own_units():
    """The proxy is a second-order estimate of the KL the kl metric measures: per unit within a factor ~2.5 here,
    and it ranks the units alike."""
    m = _model()
    batches = _batches(n=2, b=6)
    proxy = measure_sensitivity(m, batches, ["int4", "int8"], 32, metric="proxy", progress=False)
    kl = measure_sensitivity(m, batches, ["int4", "int8"], 32, progress=False)
    ratios = [proxy.damage[u][c] / kl.damage[u][c] for u in kl.damage for c in ("int4", "int8")]
    assert all(0.33 < r < 2.5 for r in ratios), ratios
    assert rank_agreement(kl, proxy)["pooled"] > 0.9


@pytest.mark.parametrize("metric", ["kl", "proxy"])
def test_sensitivity_measures_the_quantizers_own_weights_where_given(metric):
    """`given` weights (what GPTQ made of a Linear) replace RTN's for that Linear and scheme only."""
    m = _model()
    batches = _batches()
    target = "model.layers.1.mlp.down_proj"
    w = m.get_submodule(target).weight.detach()
    rtn = measure_sensitivity(m, batches, ["int4", "int8"], 32, metric, progress=False)
    exact = measure_sensitivity(m, batches, ["int4", "int8"], 32, metric, progress=False,
                                given={"int4": {target: w.clone()}})
    assert exact.damage[target]["int4"] < 1e-9 < rtn.damage[target]["int4"]  # the given weight is the original
    noisy = measure_sensitivity(m, batches, ["int4", "int8"], 32, metric, progress=False,
                                given={"int4": {target: fake_quant_int4(w, 32) + 0.1 * torch.randn_like(w)}})
    assert noisy.damage[target]["int4"] > 2 * rtn.damage[target]["int4"]
    for res in (exact, noisy):  # the other units, and int8 everywhere, are RTN's
        for u, d in res.damage.items():
            assert d["int8"] == pytest.approx(rtn.damage[u]["int8"], rel=1e-6)
            if u != target:
                assert d["int4"] == pytest.approx(rtn.damage[u]["int4"], rel=1e-6)


def test_kl_sum_runs_in_bounded_float64_chunks_and_equals_the_whole_kl(monkeypatch):
    import accel.quant.sensitivity as sens

    assert sens.f64_rows(151_936) * 8 * 151_936 <= sens.F64_CHUNK_BYTES  # Qwen2.5's vocabulary: 55 rows a chunk
    g = torch.Generator().manual_seed(0)
    ref, other = torch.randn(37, 1000, generator=g), torch.randn(37, 1000, generator=g)
    a, b = ref.double().log_softmax(-1), other.double().log_softmax(-1)
    whole = float((a.exp() * (a - b)).sum())
    monkeypatch.setattr(sens, "F64_CHUNK_BYTES", 8 * 1000 * 5)  # 5 rows a chunk: 8 chunks, the last of 2 rows
    assert sens.f64_rows(1000) == 5
    assert sens.kl_sum(ref, other) == pytest.approx(whole, rel=1e-12)
    assert sens.kl_sum(ref, ref) == 0.0
