"""Damage-weighted calibration rows: every domain keeps part of its source share, the spare goes to the most damaged
domain, exact row counts."""

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


def test_shares_keep_the_base_share_and_give_the_spare_to_the_most_damaged_domain():
    s = shares_from_damage({"a": 3.0, "b": 1.0, "c": 0.0}, base={"a": 10, "b": 60, "c": 30}, keep=0.8)
    assert sum(s.values()) == pytest.approx(1.0)
    assert s["b"] >= 0.8 * 0.6 and s["c"] == pytest.approx(0.8 * 0.3)  # nobody below keep x its base share
    # gamma 0.15: b's damage is 1/3 of a's, so b gets (1/3)^(1/0.15) ~ 0.0007 of the spare: nearly all goes to a
    assert s["a"] == pytest.approx(0.8 * 0.1 + 0.2 / (1 + 3 ** (-1 / 0.15)))
    # two domains with equal damage split the spare; keep=1 is the base; no base = equal base
    t = shares_from_damage({"a": 2.0, "b": 2.0, "c": 1.0}, base={"a": 1, "b": 1, "c": 2}, keep=0.5)
    assert t["a"] == pytest.approx(t["b"]) and t["a"] > 0.125 + 0.24
    assert shares_from_damage({"a": 3.0, "b": 1.0}, base={"a": 1, "b": 3}, keep=1.0) == {"a": 0.25, "b": 0.75}
    assert shares_from_damage({"a": 0.0, "b": 0.0}) == {"a": 0.5, "b": 0.5}
    with pytest.raises(ValueError, match="keep=2"):
        shares_from_damage({"a": 1.0}, keep=2)


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
    # draw's own tokens as base (50/50), keep 0.5: easy 0.25, hard 0.25 + 0.5
    batches, w = damage_weighted_batches(None, {}, 32, samples, 32, total_rows=12, keep=0.5)
    assert w.shares == pytest.approx({"easy": 0.25, "hard": 0.75}, abs=1e-3) and w.rows == {"easy": 3, "hard": 9}
    rows = torch.cat(batches)
    assert (rows >= 100).all(dim=1).sum() == 9 and (rows < 100).all(dim=1).sum() == 3
    # the source's token counts as base: a source with 9x more easy text keeps easy at 0.8 x 0.9
    _, w = damage_weighted_batches(None, {}, 32, samples, 32, total_rows=50, base={"easy": 900, "hard": 100})
    assert w.shares["easy"] == pytest.approx(0.72, abs=1e-3) and w.rows == {"easy": 36, "hard": 14}
