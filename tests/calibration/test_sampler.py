"""Stratified and random draws on a tiny synthetic set (word tokenizer: one token per word)."""
from collections import Counter

import pytest

from accel.calibration import random_draw, stratified_draw
from accel.recipe import CalibrationConfig

from .conftest import make_samples

A20, A40, A_LONG, B20, B40 = ("a", "<=20"), ("a", "21-40"), ("a", ">40"), ("b", "<=20"), ("b", "21-40")


def cfg(**kw):
    base = dict(num_samples=10, length_buckets=[20, 40], min_tokens=5, max_seq_len=64, holdout_fraction=0.0)
    return CalibrationConfig(**(base | kw))


def drawn(draw):
    return {k: r.drawn for k, r in draw.strata.items()}


def test_proportional_counts(base_samples, tok):
    d = stratified_draw(base_samples, tok, cfg())
    # shares 10 x [6, 3, 1, 10, 10] / 30 = [2, 1, .33, 3.33, 3.33]; the one leftover goes to the first tie (a, >40)
    assert drawn(d) == {A20: 2, A40: 1, A_LONG: 1, B20: 3, B40: 3}
    assert {k: r.available for k, r in d.strata.items()} == {A20: 6, A40: 3, A_LONG: 1, B20: 10, B40: 10}
    assert Counter((u.domain, u.bucket) for u in d.train) == Counter(drawn(d))
    assert len(d.train) == 10 and len({u.id for u in d.train}) == 10


def test_equal_counts_redistribute_short_stratum(base_samples, tok):
    d = stratified_draw(base_samples, tok, cfg(allocation="equal"))
    # 2 each, but (a, >40) has 1: its missing unit goes to the first of the others
    assert drawn(d) == {A20: 3, A40: 2, A_LONG: 1, B20: 2, B40: 2}
    assert any("('a', '>40') has only 1 unit(s)" in n and "redistributed" in n for n in d.notes)


def test_balanced_counts_give_the_smaller_domain_sqrt_share(base_samples, tok):
    d = stratified_draw(base_samples, tok, cfg(allocation="balanced", num_samples=20))
    # domains by sqrt(size): a sqrt(10), b sqrt(20) -> 8.28 / 11.72 units; within a by size [6, 3, 1] / 10
    assert drawn(d) == {A20: 5, A40: 2, A_LONG: 1, B20: 6, B40: 6}
    prop = stratified_draw(base_samples, tok, cfg(num_samples=20))
    a = lambda x: sum(n for (dom, _), n in drawn(x).items() if dom == "a")  # noqa: E731
    assert a(prop) < a(d) < 10  # more than its proportional 1/3, less than an equal half


def test_weight_counts(base_samples, tok):
    d = stratified_draw(base_samples, tok, cfg(allocation="weights", weights={"a": 3, "b": 1}, num_samples=8))
    # stratum weights a: 3 x [6, 3, 1]/10, b: 1 x [10, 10]/20 -> shares [3.6, 1.8, .6, 1, 1]
    assert drawn(d) == {A20: 4, A40: 2, A_LONG: 0, B20: 1, B40: 1}


def test_domain_without_weight_gets_none(base_samples, tok):
    d = stratified_draw(base_samples, tok, cfg(allocation="weights", weights={"b": 1}, num_samples=6))
    assert drawn(d) == {A20: 0, A40: 0, A_LONG: 0, B20: 3, B40: 3}
    assert any("domains without a weight get none: ['a']" in n for n in d.notes)


def test_more_than_available_takes_everything_and_says_so(base_samples, tok):
    d = stratified_draw(base_samples, tok, cfg(num_samples=100))
    assert len(d.train) == 30
    assert any("only 30 unit(s) available" in n for n in d.notes)


def test_seed_determinism_and_variation(base_samples, tok):
    ids = lambda seed: [u.id for u in stratified_draw(base_samples, tok, cfg(seed=seed)).train]
    assert ids(0) == ids(0)
    assert ids(0) != ids(1)
    assert sorted(ids(0)) != sorted(ids(1))  # a different set, not just a different order


def test_holdout_is_shared_over_the_strata_like_the_draw_and_disjoint(base_samples, tok):
    d = stratified_draw(base_samples, tok, cfg(holdout_fraction=0.5))
    # half of the 10 drawn (2, 1, 1, 3, 3 per stratum) by largest remainder; (a, >40) has nothing left after train
    assert {k: r.held_out for k, r in d.strata.items()} == {A20: 1, A40: 0, A_LONG: 0, B20: 2, B40: 2}
    assert not {u.id for u in d.train} & {u.id for u in d.holdout}
    assert len(d.train) == 10
    # a tenth of 10 is one unit, though no stratum's own share reaches half a unit
    assert len(stratified_draw(base_samples, tok, cfg(holdout_fraction=0.1)).holdout) == 1


@pytest.mark.parametrize("draw", [stratified_draw, random_draw])
def test_train_holdout_and_unused_split_the_source(base_samples, tok, draw):
    """Every unit is drawn, held out or unused, exactly once: scale tuning reads train + unused and must never see
    the holdout the plan is checked on."""
    d = draw(base_samples, tok, cfg(holdout_fraction=0.2))
    ids = [u.id for u in d.train + d.holdout + d.unused]
    assert len(ids) == len(set(ids)) == len(base_samples) == 30
    assert len(d.unused) == 30 - 10 - 2


def test_packs_short_samples_with_a_note(tok):
    samples = make_samples({"c": [(7, 2), (2, 10)]})
    d = stratified_draw(samples, tok, cfg(num_samples=100))
    packed = [u for u in d.train if len(u.packed_ids) > 1]
    # 7 two-token samples: pairs reach 2 + 1 (EOS separator) + 2 = 5 tokens; the 7th joins the last pack
    assert sorted(len(u.packed_ids) for u in packed) == [2, 2, 3]
    assert sorted(u.num_tokens for u in packed) == [5, 5, 8]
    assert sorted(i for u in packed for i in u.packed_ids) == [f"c-{i}" for i in range(7)]
    assert all(u.token_ids[2] == 0 for u in packed)  # EOS between packed pieces
    assert len(d.train) == 5
    assert "stratum ('c', '<=20'): packed 7 sample(s) shorter than min_tokens=5 into 3 unit(s)" in d.notes


def test_pad_policy_keeps_short_samples_and_says_so(tok):
    samples = make_samples({"c": [(7, 2), (2, 10)]})
    d = stratified_draw(samples, tok, cfg(num_samples=100, short_policy="pad"))
    assert len(d.train) == 9 and all(len(u.packed_ids) == 1 for u in d.train)
    assert any("7 sample(s) shorter than min_tokens=5 kept as is" in n for n in d.notes)


def test_truncation(tok):
    samples = make_samples({"a": [(2, 30)]})
    d = stratified_draw(samples, tok, cfg(max_seq_len=16, num_samples=2))
    assert [u.num_tokens for u in d.train] == [16, 16]
    assert all(u.full_tokens == 30 and u.truncated and len(u.token_ids) == 16 for u in d.train)
    assert d.train[0].bucket == "21-40"  # bucket from the full length
    assert any(n.startswith("truncated 2 drawn unit(s) to max_seq_len=16") for n in d.notes)


def test_random_draw_same_size(base_samples, tok):
    c = cfg(holdout_fraction=0.2)
    s, r = stratified_draw(base_samples, tok, c), random_draw(base_samples, tok, c)
    assert (len(r.train), len(r.holdout)) == (len(s.train), len(s.holdout)) == (10, 2)
    assert r.method == "random" and s.method == "stratified"
    assert sum(x.drawn for x in r.strata.values()) == 10
    assert [u.id for u in random_draw(base_samples, tok, c).train] == [u.id for u in r.train]
    # both record the source's tokens per domain (the share a random draw gives a domain on average)
    assert r.source_tokens == s.source_tokens and set(s.source_tokens) == {x.domain for x in base_samples}
    assert sum(s.source_tokens.values()) == sum(len(tok([x.text], add_special_tokens=False)["input_ids"][0])
                                                for x in base_samples)


def test_domains_filter_and_errors(base_samples, tok):
    d = stratified_draw(base_samples, tok, cfg(domains=["b"], num_samples=4))
    assert {u.domain for u in d.train} == {"b"}
    with pytest.raises(ValueError, match=r"domains names domain\(s\) \['z'\].*available domains: \['a', 'b'\]"):
        stratified_draw(base_samples, tok, cfg(domains=["z"]))
    with pytest.raises(ValueError, match=r"weights names domain\(s\) \['q'\]"):
        stratified_draw(base_samples, tok, cfg(allocation="weights", weights={"q": 1.0}))
    with pytest.raises(ValueError, match="no calibration samples"):
        stratified_draw([], tok, cfg())


def test_real_transformers_tokenizer():
    """The sampler works with a real `transformers` fast tokenizer (word-level, built in memory)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "</s>": 1} | {f"w{i}": i + 2 for i in range(60)}
    core = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = WhitespaceSplit()
    hf = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="</s>", unk_token="[UNK]")
    samples = make_samples({"a": [(3, 10), (3, 30)]})
    d = stratified_draw(samples, hf, cfg(num_samples=4))
    assert drawn(d) == {A20: 2, A40: 2}
    assert sorted(u.num_tokens for u in d.train) == [10, 10, 30, 30]
