"""Allocation on a hand-made sensitivity table (exact plans) and the accuracy-driven fallback."""

from __future__ import annotations

import pytest
import torch

from accel.quant.allocate import Budget, Plan, Rules, allocate, average_bits, check_and_fallback, promotion_order
from accel.quant.schemes import in_features_of, param_counts, quantizable_linears
from accel.quant.sensitivity import SensitivityResult
from tests.conftest import make_tiny_llama

# 100 params each, in_features 16 -> int8 = 8 + 16/16 = 9 bits; group 20 -> int4 = 4 + 20/20 = 5 bits; fp16 = 16.
SENS = SensitivityResult(metric="kl", group_size=20, candidates=["int4", "int8", "fp16"], num_tokens=1, damage={
    "a": {"int4": 0.1, "int8": 0.001, "fp16": 0.0},
    "b": {"int4": 0.01, "int8": 0.002, "fp16": 0.0},
    "c": {"int4": 0.5, "int8": 0.0005, "fp16": 0.0},
})
P = {"a": 100, "b": 100, "c": 100}
IN = {"a": 16, "b": 16, "c": 16}


def test_max_mean_kl_exact_plan():
    plan = allocate(SENS, Budget(max_mean_kl=0.02), P, Rules(), IN)
    # ratios: c->int8, a->int8, b->int8, then b->int4 (kl .0115); a->int4 / c->int4 would break the budget
    assert plan.schemes == {"a": "int8", "b": "int4", "c": "int8"}
    assert plan.estimated_kl == pytest.approx(0.0115)
    assert plan.avg_bits == pytest.approx((9 + 5 + 9) / 3)


def test_target_avg_bits_exact_plan():
    plan = allocate(SENS, Budget(target_avg_bits=7.0), P, Rules(), IN)
    assert plan.schemes == {"a": "int4", "b": "int4", "c": "int8"}
    assert plan.avg_bits == pytest.approx(19 / 3)


def test_bits_a_demotion_overshoots_go_back_to_the_units_that_need_them():
    # small costs less damage per bit and is demoted first, but big must go too: its 7,000 bits overshoot the
    # target, and small (700 bits) goes back to 16-bit within it
    sens = SensitivityResult(metric="kl", group_size=20, candidates=["int8", "fp16"], num_tokens=1, damage={
        "big": {"int8": 0.01, "fp16": 0.0}, "small": {"int8": 0.0001, "fp16": 0.0}})
    p, inf = {"big": 1000, "small": 100}, {"big": 16, "small": 16}
    plan = allocate(sens, Budget(target_avg_bits=10.0), p, Rules(), inf)
    assert plan.schemes == {"big": "int8", "small": "fp16"}
    assert plan.avg_bits == pytest.approx((9000 + 1600) / 1100) and plan.estimated_kl == pytest.approx(0.01)


def test_max_ppl_increase_uses_log_kl_budget():
    # 1% -> KL budget ln(1.01) = 0.00995: b->int4 (.0115) no longer fits
    plan = allocate(SENS, Budget(max_ppl_increase_pct=1.0), P, Rules(), IN)
    assert plan.schemes == {"a": "int8", "b": "int8", "c": "int8"}
    assert plan.estimated_kl == pytest.approx(0.0035)


def test_overrides_are_fixed_and_rules_recorded():
    rules = Rules(lm_head="fp16", overrides={"^c$": "fp16"})
    plan = allocate(SENS, Budget(max_mean_kl=0.02), P, rules, IN)
    assert plan.schemes == {"a": "int8", "b": "int4", "c": "fp16"}
    assert plan.lm_head == "fp16"
    assert plan.all_schemes()["lm_head"] == "fp16"


def test_candidates_restrict_allocation():
    sens = SensitivityResult(**{**SENS.__dict__, "candidates": ["int8", "fp16"]})
    plan = allocate(sens, Budget(target_avg_bits=9.5), P, Rules(), IN)
    assert plan.schemes == {"a": "int8", "b": "int8", "c": "int8"}
    with pytest.raises(ValueError, match="unreachable"):
        allocate(sens, Budget(target_avg_bits=6.0), P, Rules(), IN)


def test_budget_exactly_one():
    with pytest.raises(ValueError, match="exactly one"):
        Budget(max_mean_kl=0.1, target_avg_bits=5)
    with pytest.raises(ValueError, match="exactly one"):
        Budget()


def test_plan_json_round_trip(tmp_path):
    plan = allocate(SENS, Budget(max_mean_kl=0.02), P, Rules(), IN)
    plan.to_json(tmp_path / "plan.json")
    assert Plan.from_json(tmp_path / "plan.json") == plan


def test_promotion_order_worst_first():
    plan = Plan(schemes={"a": "int4", "b": "int4", "c": "fp16"}, group_size=32, avg_bits=0, estimated_kl=0)
    assert promotion_order(plan, SENS, SENS.candidates) == ["a", "b"]
    plan.schemes["b"] = "int8"
    assert promotion_order(plan, SENS, SENS.candidates) == ["a", "b"]  # .1 > .002


def _tiny():
    return make_tiny_llama(initializer_range=0.1)


def _hand_sens(names, worst):
    """Every layer cheap except `worst`, so the fallback must promote `worst` first."""
    dmg = {n: {"int4": 1e-4, "int8": 1e-6, "fp16": 0.0} for n in names}
    dmg[worst] = {"int4": 1.0, "int8": 1e-3, "fp16": 0.0}
    return SensitivityResult(metric="kl", group_size=32, candidates=["int4", "int8", "fp16"], damage=dmg,
                             num_tokens=1)


def test_fallback_promotes_worst_layer_first():
    m = _tiny()
    names = quantizable_linears(m)
    worst = "model.layers.1.mlp.up_proj"
    sens = _hand_sens(names, worst)
    plan = Plan(schemes={n: "int4" for n in names}, group_size=32, avg_bits=5.0, estimated_kl=0.0, lm_head="fp16")
    hold = [torch.randint(3, 256, (2, 16), generator=torch.Generator().manual_seed(1))]
    out = check_and_fallback(m, plan, hold, Budget(max_mean_kl=1e-12), sens, param_counts(m, names),
                             in_features_of(m, names), step=1, max_rounds=1, progress=False)
    assert out.promoted == [worst]
    assert out.schemes[worst] == "int8"
    assert sum(s == "int4" for s in out.schemes.values()) == len(names) - 1
    assert out.measured_kl > 1e-12


def test_fallback_reaches_budget_or_stops_at_fp16():
    m = _tiny()
    names = quantizable_linears(m)
    sens = _hand_sens(names, names[0])
    plan = Plan(schemes={n: "int4" for n in names}, group_size=32, avg_bits=5.0, estimated_kl=0.0, lm_head="fp16")
    hold = [torch.randint(3, 256, (2, 16), generator=torch.Generator().manual_seed(1))]
    pc, inf = param_counts(m, names), in_features_of(m, names)
    loose = check_and_fallback(m, plan, hold, Budget(max_mean_kl=10.0), sens, pc, inf, progress=False)
    assert loose.promoted == [] and loose.schemes == plan.schemes
    tight = check_and_fallback(m, plan, hold, Budget(max_mean_kl=1e-12), sens, pc, inf, step=14, progress=False)
    assert set(tight.schemes.values()) == {"fp16"}
    assert tight.measured_kl == 0.0
    assert tight.avg_bits == 16.0
    assert average_bits(plan.schemes, pc, inf, 32) == pytest.approx(4 + 20 / 32)  # fp16 scale + 4-bit zero per group


# A fused q/k/v unit (three Linears of 100 params) and a lone o_proj: members always share one scheme.
UNITS = {"l.qkv_proj": ["l.q_proj", "l.k_proj", "l.v_proj"], "l.o_proj": ["l.o_proj"]}
USENS = SensitivityResult(metric="kl", group_size=20, candidates=["int4", "int8", "fp16"], num_tokens=1, units=UNITS,
                          damage={"l.qkv_proj": {"int4": 0.03, "int8": 0.001, "fp16": 0.0},
                                  "l.o_proj": {"int4": 0.004, "int8": 0.0001, "fp16": 0.0}})
UP = {m: 100 for ms in UNITS.values() for m in ms}
UIN = {m: 16 for m in UP}


def test_allocation_gives_every_member_of_a_fused_unit_one_scheme():
    plan = allocate(USENS, Budget(max_mean_kl=0.01), UP, Rules(), UIN)
    # demotions by damage per bit saved: qkv -> int8 (.001 / 2100), o -> int8, o -> int4 (.004 KL); qkv -> int4
    # would pass the budget
    assert plan.schemes == {"l.q_proj": "int8", "l.k_proj": "int8", "l.v_proj": "int8", "l.o_proj": "int4"}
    assert plan.unit_schemes() == {"l.qkv_proj": "int8", "l.o_proj": "int4"}
    assert plan.units == UNITS and plan.estimated_kl == pytest.approx(0.005)
    assert plan.avg_bits == pytest.approx((3 * 9 + 5) / 4)


def test_an_override_naming_one_member_sets_its_whole_unit():
    plan = allocate(USENS, Budget(max_mean_kl=0.01), UP, Rules(overrides={r"k_proj$": "fp16"}), UIN)
    assert plan.unit_schemes()["l.qkv_proj"] == "fp16"
    assert {plan.schemes[m] for m in UNITS["l.qkv_proj"]} == {"fp16"}


def test_fallback_promotes_whole_units():
    from accel.quant.schemes import quant_units

    m = _tiny()
    names = quantizable_linears(m)
    units = quant_units(names)
    worst = "model.layers.1.mlp.gate_up_proj"
    dmg = {u: {"int4": 1e-4, "int8": 1e-6, "fp16": 0.0} for u in units}
    dmg[worst] = {"int4": 1.0, "int8": 1e-3, "fp16": 0.0}
    sens = SensitivityResult(metric="kl", group_size=32, candidates=["int4", "int8", "fp16"], damage=dmg,
                             num_tokens=1, units=units)
    plan = Plan(schemes={n: "int4" for n in names}, group_size=32, avg_bits=5.0, estimated_kl=0.0, lm_head="fp16",
                units=units)
    hold = [torch.randint(3, 256, (2, 16), generator=torch.Generator().manual_seed(1))]
    out = check_and_fallback(m, plan, hold, Budget(max_mean_kl=1e-12), sens, param_counts(m, names),
                             in_features_of(m, names), step=1, max_rounds=1, progress=False)
    assert out.promoted == [worst]
    assert out.schemes["model.layers.1.mlp.gate_proj"] == out.schemes["model.layers.1.mlp.up_proj"] == "int8"
    assert sum(s == "int4" for s in out.schemes.values()) == len(names) - 2
