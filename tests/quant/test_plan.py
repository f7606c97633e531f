"""The quantize stages' pieces end to end on a tiny Llama saved with a throwaway tokenizer: sensitivity, the
plan (allocation + held-out fallback), llm-compressor, the runtime loading the checkpoint."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from accel.quant.allocate import Plan, Rules
from accel.kernels.loader import load_hf_model
from accel.quant.plan import build_plan, token_batches
from accel.recipe import parse_recipe
from tests.conftest import make_tiny_llama
from tests.quant.test_quantize import _tokenizer

BASE = {"name": "t", "model": {"path": "smollm2-135m"}}


def _draw(seed, n):
    g = torch.Generator().manual_seed(seed)
    return [SimpleNamespace(token_ids=tuple(torch.randint(3, 256, (16,), generator=g).tolist())) for _ in range(n)]


@pytest.mark.parametrize("metric", ["kl", "proxy"])
def test_plan_quantize_and_load_on_a_tiny_model(tmp_path, metric):
    from accel.quant.quantize import oneshot_quantize, save_checkpoint
    from accel.quant.sensitivity import measure_sensitivity

    src = tmp_path / "tiny"
    make_tiny_llama(initializer_range=0.1).save_pretrained(src)
    _tokenizer().save_pretrained(src)
    recipe = parse_recipe({
        "name": "t", "model": {"path": str(src)}, "calibration": {"num_samples": 8, "max_seq_len": 16},
        "quantization": {"method": "rtn", "int4_group_size": 32, "lm_head": "fp16", "budget": {"max_mean_kl": 0.01},
                         "sensitivity": {"num_samples": 4, "max_seq_len": 16, "metric": metric},
                         "overrides": {r"layers\.0\.self_attn\.q_proj$": "int4"}},
    })
    q = recipe.quantization
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()  # oneshot needs its folder
    sens = measure_sensitivity(model, token_batches(_draw(0, 8), 16, 4), q.candidates, 32, metric, progress=False)
    assert sens.num_tokens == 64 and len(sens.damage) == 8  # 2 layers x (qkv, o, gate_up, down)
    assert sens.units["model.layers.0.self_attn.qkv_proj"] == [f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]
    plan = build_plan(model, sens, q, _draw(1, 2))
    # an override that names one member of a fused unit sets the whole unit, and holds through the fallback
    assert {plan.schemes[f"model.layers.0.self_attn.{p}_proj"] for p in "qkv"} == {"int4"}
    assert all(len({plan.schemes[m] for m in ms}) == 1 for ms in plan.units.values())
    assert plan.measured_kl is not None and plan.measured_kl <= 0.01
    assert Plan.from_json(plan.to_json()) == plan
    with pytest.raises(ValueError, match="needs held-out calibration text to be checked on: the holdout has 0 unit"):
        build_plan(model, sens, q, ())  # a quality budget is never left unchecked
    ck = save_checkpoint(oneshot_quantize(model, plan, token_batches(_draw(0, 8), 16, 8), "rtn").model, plan,
                         tmp_path / "ck")
    loaded = load_hf_model(ck)
    x = torch.randint(3, 256, (1, 16))
    assert loaded(x).logits.shape == (1, 16, 256)


def test_token_batches_cap_keeps_rows_from_every_stratum_not_a_prefix():
    # a stratified draw lists samples stratum by stratum; capping the packed rows must not keep only the first strata
    from types import SimpleNamespace

    from accel.quant.plan import rows, token_batches

    samples = [SimpleNamespace(token_ids=[100 * d + i for i in range(40)], domain=f"d{d}") for d in range(6)]
    got = torch.cat(token_batches(samples, 20, max_rows=6, batch_size=4))  # 12 rows of 20, 2 per domain -> keep 6
    assert got.shape == (6, 20)
    assert sorted({int(r[0]) // 100 for r in got}) == [0, 1, 2, 3, 4, 5]  # every domain kept
    assert [b.shape[0] for b in token_batches(samples, 20, max_rows=6, batch_size=4)] == [4, 2]
    # no cap / a cap above the row count keeps everything, in order
    assert torch.equal(torch.cat(token_batches(samples, 20, max_rows=None)), torch.cat(token_batches(samples, 20, 99)))
    assert rows([torch.zeros(2, 20)], 20, 0) == []
    assert rows([torch.zeros(1, 7)], 20, 5) == []  # the short tail row is not a calibration row


def _never_loaded():
    raise AssertionError("the draw's own rows need no model")


def test_calibration_batches_mix_by_damage_by_default_and_keep_the_draw_when_they_cannot(monkeypatch):
    from accel.quant import allocate
    from accel.quant.plan import calibration_batches

    monkeypatch.setattr(allocate, "joint_quality",
                        lambda m, s, g, batches: SimpleNamespace(mean_kl=0.3 if batches[0].min() >= 100 else 0.1))
    plan = Plan(schemes={}, group_size=32, avg_bits=16.0, estimated_kl=0.0)
    recipe = parse_recipe({**BASE, "calibration": {"num_samples": 12, "max_seq_len": 16}})
    assert recipe.quantization.calibration_mix == "damage"

    def unit(domain, base, n=32):
        return SimpleNamespace(token_ids=tuple(base + i % 50 for i in range(n)), num_tokens=n, domain=domain)

    train = [unit("easy", 3) for _ in range(3)] + [unit("hard", 100) for _ in range(3)]  # 6 + 6 rows of 16
    batches, mix = calibration_batches(lambda: None, plan, train, recipe, {"easy": 900, "hard": 100})
    rows = torch.cat(batches)
    assert rows.shape == (12, 16) and mix is not None
    # easy keeps 0.8 of its 90% source share (~8.6 rows), the spare goes to the more damaged domain
    assert mix.rows == {"easy": 9, "hard": 3} and (rows >= 100).all(dim=1).sum() == 3
    # one domain, or a domain without a full row: the draw's own rows, no mix
    for t in ([unit("easy", 3) for _ in range(6)], train + [unit("tiny", 200, n=8)]):
        batches, mix = calibration_batches(_never_loaded, plan, t, recipe)
        assert mix is None and sum(b.shape[0] for b in batches) == sum(len(u.token_ids) for u in t) // 16
    draw_recipe = parse_recipe({**BASE, "calibration": {"num_samples": 12, "max_seq_len": 16},
                                "quantization": {"calibration_mix": "draw"}})
    assert calibration_batches(_never_loaded, plan, train, draw_recipe)[1] is None  # no model is loaded for it


def test_int4f_joins_int4_where_the_weights_sit_on_a_float_min_grid_unless_vllm_must_load_them():
    from accel.quant.plan import joining_candidates
    from tests.quant.test_quantize import _q4_1_grid

    grid = make_tiny_llama(initializer_range=0.1)
    _q4_1_grid(grid)  # every Linear on a GGUF Q4_1 grid (fp16 d and min per 32), as SmolLM2's release is
    cands, ratios = joining_candidates(grid, ["int4", "int8", "fp16"], 32, "transformers")
    assert cands == ["int4", "int8", "fp16", "int4f"] and ratios["int4f"] < 0.01
    assert joining_candidates(grid, ["int4"], 32, None)[0] == ["int4", "int4f"]
    assert joining_candidates(grid, ["int8", "fp16"], 32, None) == (["int8", "fp16"], {})  # the recipe asked no 4 bits
    assert joining_candidates(grid, ["int4", "int8"], 32, "vllm") == (["int4", "int8"], {})  # no float-zero kernel
    assert joining_candidates(grid, ["int4f", "int4"], 32, None) == (["int4f", "int4"], {})  # asked for
    assert joining_candidates(grid, ["int4", "int8"], 64, None)[1]["int4f"] > 0.5  # a grid of 32 is not one of 64
    plain = make_tiny_llama(initializer_range=0.1)  # gaussian weights: the float zero point gains little
    cands, ratios = joining_candidates(plain, ["int4", "int8"], 32, "transformers")
    assert cands == ["int4", "int8"] and 0.5 < ratios["int4f"] < 1.0


def test_int4f_is_offered_only_at_the_group_sizes_where_it_was_measured():
    """int4f joins the group-32 measurement only (exact there); the allocator must not read its missing group-64
    damage as zero. At 5 bits it undercuts int8 wherever it is exact."""
    from accel.quant.allocate import Budget, allocate
    from accel.quant.sensitivity import SensitivityResult, with_group_sizes

    at64 = SensitivityResult(metric="kl", group_size=64, candidates=["int4", "int8"], num_tokens=1,
                             damage={"a": {"int4": 0.5, "int8": 0.01}, "b": {"int4": 0.4, "int8": 0.01}})
    at32 = SensitivityResult(metric="kl", group_size=32, candidates=["int4", "int8", "int4f"], num_tokens=1,
                             damage={"a": {"int4": 0.3, "int8": 0.01, "int4f": 0.0},
                                     "b": {"int4": 0.2, "int8": 0.01, "int4f": 0.0}})
    counts = {"a": 64 * 64, "b": 64 * 64}
    plan = allocate(with_group_sizes([at64, at32]), Budget(target_avg_bits=5.0), counts,
                    in_features={"a": 64, "b": 64})
    assert plan.schemes == {"a": "int4f", "b": "int4f"} and plan.sizes()["a"] == 32 and plan.estimated_kl == 0.0
    plan = allocate(with_group_sizes([at64, at32]), Budget(target_avg_bits=4.7), counts,
                    in_features={"a": 64, "b": 64})  # room for one int4f unit: b, which loses less at int4
    assert plan.schemes == {"a": "int4f", "b": "int4"} and plan.sizes()["b"] == 64


def test_the_allocator_chooses_each_units_int4_group_size():
    """Unit a loses much more at group 64 than at 32, unit b hardly anything: under a size budget with room for one
    unit at 32, a gets it."""
    from accel.quant.allocate import Budget, allocate
    from accel.quant.sensitivity import SensitivityResult, with_group_sizes

    units = {"a": ["m.layers.0.a1", "m.layers.0.a2"], "b": ["m.layers.0.b"]}
    names = [m for ms in units.values() for m in ms]
    pc, inf = {"m.layers.0.a1": 64, "m.layers.0.a2": 64, "m.layers.0.b": 128}, dict.fromkeys(names, 64)

    def sens(g, da, db):
        return SensitivityResult(metric="proxy", group_size=g, candidates=["int4", "int8"], num_tokens=1,
                                 damage={"a": {"int4": da, "int8": 0.0}, "b": {"int4": db, "int8": 0.0}}, units=units)

    both = with_group_sizes([sens(64, 1.0, 0.11), sens(32, 0.1, 0.1)])
    half = (4.625 + 4.3125) / 2
    plan = allocate(both, Budget(target_avg_bits=half), pc, Rules(lm_head="fp16"), inf)
    assert plan.counts()["int4"] == 3 and plan.avg_bits == pytest.approx(half)
    assert plan.group_size == 64 and plan.group_sizes == {"m.layers.0.a1": 32, "m.layers.0.a2": 32}
    assert plan.size_counts() == {"32": 2, "64": 1}
    assert plan.estimated_kl == pytest.approx(0.1 + 0.11)
    assert Plan.from_json(plan.to_json()) == plan
    # with b the one that gains, b gets group 32
    flipped = allocate(with_group_sizes([sens(64, 0.11, 1.0), sens(32, 0.1, 0.1)]), Budget(target_avg_bits=half),
                       pc, Rules(lm_head="fp16"), inf)
    assert flipped.group_sizes == {"m.layers.0.b": 32}
    # group 64's bits for all is the floor
    floor = allocate(both, Budget(target_avg_bits=4.4), pc, Rules(lm_head="fp16"), inf)
    assert floor.group_sizes == {} and set(floor.schemes.values()) == {"int4"}


def test_build_plan_gives_each_unit_one_int4_group_size_among_those_measured():
    from accel.quant.schemes import quantizable_linears
    from accel.quant.sensitivity import SensitivityResult, measure_sensitivity, with_group_sizes

    model = make_tiny_llama(initializer_range=0.1)
    batches = token_batches(_draw(0, 8), 16, 4)
    measured = [measure_sensitivity(model, batches, ["int4", "int8", "fp16"], g, "proxy", progress=False)
                for g in (64, 32)]
    sens = SensitivityResult.from_json(with_group_sizes(measured).to_json())  # one file holds both
    assert sorted(sens.by_group_size()) == [32, 64]
    assert sens.by_group_size()[32].damage == measured[1].damage
    q = parse_recipe({**BASE, "quantization": {"int4_group_size": [64, 32], "budget": {"target_avg_bits": 4.5},
                                                "lm_head": "fp16"}}).quantization
    plan = build_plan(model, sens, q)
    assert plan.avg_bits <= 4.5 and plan.group_size == 64
    sizes = plan.sizes()
    for members in plan.unit_map().values():  # a fused module has one group size
        assert len({(plan.schemes[m], sizes[m]) for m in members}) == 1
    assert set(plan.size_counts()) <= {"32", "64"}
    assert sum(plan.size_counts().values()) == plan.counts()["int4"] == len(quantizable_linears(model))
    assert Plan.from_json(plan.to_json()) == plan
