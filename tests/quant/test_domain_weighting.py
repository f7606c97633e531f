"""Damage-weighted calibration rows: shares follow the plan's per-domain damage, floored, exact row counts."""

from __future__ import annotations

import pytest
import torch

from accel.calibration.sampler import DrawnSample
from accel.quant.domain_weighting import damage_weighted_batches, domain_rows, pick_rows, shares_from_damage
from accel.quant.schemes import quantizable_linears
from tests.conftest import make_tiny_llama


def _sample(i: int, domain: str, n: int, base: int) -> DrawnSample:
    ids = tuple(base + (j % 50) for j in range(n))
    return DrawnSample(id=f"{domain}-{i}", domain=domain, bucket="b", text="", token_ids=ids, num_tokens=n,
                       packed_ids=(f"{domain}-{i}",))


def test_shares_follow_damage_with_a_floor_and_sum_to_one():
    s = shares_from_damage({"a": 3.0, "b": 1.0, "c": 0.0}, floor=0.5)
    assert s["c"] == pytest.approx(s["a"] * (0.5 / 3) / 0.75)  # c lifted to floor / D before normalising
    assert s["a"] > s["b"] > s["c"] > 0 and sum(s.values()) == pytest.approx(1.0)
    assert shares_from_damage({"a": 0.0, "b": 0.0}) == {"a": 0.5, "b": 0.5}
    with pytest.raises(ValueError, match="floor=2"):
        shares_from_damage({"a": 1.0}, floor=2)


def test_domain_rows_pack_each_domain_alone_and_pick_rows_cycles():
    samples = [_sample(i, "x", 40, 3) for i in range(3)] + [_sample(i, "y", 40, 100) for i in range(5)]
    rows = domain_rows(samples, 16)
    assert rows["x"].shape == (7, 16) and rows["y"].shape == (12, 16)  # 120 // 16, 200 // 16
    assert rows["x"].max() < 100 <= rows["y"].min()  # a row never mixes domains
    got = pick_rows(rows, {"x": 10, "y": 2})
    assert got.shape == (12, 16) and (got[:10] < 100).all() and (got[10:] >= 100).all()


def test_damage_weighted_batches_measure_real_kl_and_keep_the_row_count():
    model = make_tiny_llama(initializer_range=0.1).eval()
    samples = [_sample(i, "easy", 64, 3) for i in range(4)] + [_sample(i, "hard", 64, 100) for i in range(4)]
    plan = {n: "int4" for n in quantizable_linears(model)}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batches, w = damage_weighted_batches(model, plan, 32, samples, 32, total_rows=12, probe_rows=2)
    assert sum(b.shape[0] for b in batches) == 12 and sum(w.rows.values()) == 12
    assert all(v > 0 for v in w.damage.values())  # the RTN plan's KL on each domain's probe rows
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # model left unquantized
    with pytest.raises(ValueError, match="full row of 4096"):
        damage_weighted_batches(model, plan, 32, samples, 4096, total_rows=4)


def test_damage_weighted_batches_give_the_damaged_domain_more_rows(monkeypatch):
    from accel.quant import allocate

    class Q:
        def __init__(self, kl):
            self.mean_kl = kl

    # damage 3x larger on the "hard" domain's rows (token ids >= 100)
    monkeypatch.setattr(allocate, "joint_quality", lambda m, s, g, batches: Q(0.3 if batches[0].min() >= 100 else 0.1))
    samples = [_sample(i, "easy", 64, 3) for i in range(4)] + [_sample(i, "hard", 64, 100) for i in range(4)]
    batches, w = damage_weighted_batches(None, {}, 32, samples, 32, total_rows=12)
    assert w.shares == pytest.approx({"easy": 0.25, "hard": 0.75}) and w.rows == {"easy": 3, "hard": 9}
    rows = torch.cat(batches)
    assert (rows >= 100).all(dim=1).sum() == 9 and (rows < 100).all(dim=1).sum() == 3
