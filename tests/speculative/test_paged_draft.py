"""The runtime-side draft model: batched drafting over its own paged KV cache, rollback, reduced vocabulary."""

from __future__ import annotations

import pytest
import torch

from accel.recipe import SpeculationConfig
from accel.runtime.models import load_model
from accel.speculative.config import SpeculativeConfig
from accel.speculative.paged_draft import PagedDraftProposer
from accel.speculative.proposer import ProposalRequest
from tests.conftest import make_tiny_llama
from tests.speculative.test_proposer import reference_greedy


@pytest.fixture
def draft(tmp_path):
    hf = make_tiny_llama(seed=3)
    hf.save_pretrained(tmp_path / "d")
    return hf, load_model(tmp_path / "d", torch.float32, torch.device("cpu"))


def test_batched_drafts_match_uncached_greedy_and_roll_back(draft):
    hf, model = draft
    prop = PagedDraftProposer(model, num_blocks=64, block_size=4)
    a, b = [1, 5, 9, 33, 71, 4], [7, 8, 9, 10, 11, 12, 13, 14, 15]
    out = prop.propose([ProposalRequest(a, 4, "a"), ProposalRequest(b, 2, "b"), ProposalRequest([3], 0, "c")])
    assert out.token_ids == [reference_greedy(hf, a, 4), reference_greedy(hf, b, 2), []]
    assert out.probs is None  # greedy: no q needed
    # "a": two drafts accepted, then a different token; "b": all accepted + bonus
    a2 = a + out.token_ids[0][:2] + [17]
    b2 = b + out.token_ids[1] + [8]
    out2 = prop.propose([ProposalRequest(a2, 3, "a"), ProposalRequest(b2, 3, "b")])
    assert out2.token_ids == [reference_greedy(hf, a2, 3), reference_greedy(hf, b2, 3)]
    assert prop.seqs["a"].num_computed_tokens == len(a2) + 2  # verified + fed drafts (the last one is not fed)
    prop.finish("a")
    prop.finish("b")
    assert prop.kv.num_held_blocks() == 0 and not prop.seqs


def test_reduced_vocabulary_and_sampled_q(draft):
    hf, model = draft
    vocab = list(range(100, 140))
    prop = PagedDraftProposer(model, num_blocks=64, block_size=4, vocab_ids=vocab)
    ids = [1, 5, 9, 33]
    assert prop.propose([ProposalRequest(ids, 3, "g")]).token_ids == [reference_greedy(hf, ids, 3, vocab)]
    from accel.runtime.sampling_params import SamplingParams

    out = prop.propose([ProposalRequest(ids, 3, "s", params=SamplingParams(temperature=0.8, top_k=5),
                                        generator=torch.Generator().manual_seed(0))])
    q = out.probs[0]
    assert q.shape == (3, 256) and torch.allclose(q.sum(-1), torch.ones(3))
    assert (q[:, [i for i in range(256) if i not in vocab]] == 0).all() and ((q > 0).sum(-1) <= 5).all()
    assert all(t in vocab for t in out.token_ids[0])


def test_draft_that_does_not_fit_proposes_nothing(draft):
    _, model = draft
    prop = PagedDraftProposer(model, num_blocks=2, block_size=4)
    assert prop.propose([ProposalRequest(list(range(3, 20)), 4, "x")]).token_ids == [[]]


def test_spec_config_from_recipe_and_validation():
    assert SpeculativeConfig.from_recipe(SpeculationConfig(method="none")) is None
    ng = SpeculativeConfig.from_recipe(SpeculationConfig(method="ngram", num_speculative_tokens=5,
                                                  ngram_min_n=1, ngram_max_n=3, disable_above_batch_size=8))
    assert (ng.method, ng.num_speculative_tokens, ng.ngram_min_n, ng.ngram_max_n, ng.disable_above_batch_size) == (
        "ngram", 5, 1, 3, 8)
    dm = SpeculativeConfig.from_recipe(SpeculationConfig(method="draft", draft_model="x", draft_quantization="int8"))
    assert (dm.method, dm.draft_model, dm.draft_quantization) == ("draft", "x", "int8")
    assert SpeculativeConfig.from_recipe(SpeculationConfig(method="distilled"), draft_dir="run/draft").draft_model == "run/draft"
    # "auto" cutoffs: per method (n-gram costs no draft forward; a draft model stops paying from batch 8 on CPU)
    assert dm.disable_above_batch_size == 5 and SpeculativeConfig(method="ngram").disable_above_batch_size == 5
    assert SpeculativeConfig(method="ngram", disable_above_batch_size=None).disable_above_batch_size is None
    with pytest.raises(ValueError, match="disable_above_batch_size='sometimes' is invalid"):
        SpeculativeConfig(method="ngram", disable_above_batch_size="sometimes")
    with pytest.raises(ValueError, match="needs draft_model"):
        SpeculativeConfig(method="draft")
    with pytest.raises(ValueError, match="method='eagle' is invalid"):
        SpeculativeConfig(method="eagle")
    assert SpeculativeConfig(method="ngram", num_speculative_tokens=3).adaptive_config().k_max == 3


def _top_probs(prop, reqs):
    """Run propose with the gate at ~0, recording the top probability the gate reads at each chain position."""
    seen: dict[int, list[float]] = {}
    real = prop._pick

    def spy(last, rs, drafts, reduced=None):
        out = real(last, rs, drafts, reduced)
        for r, p in zip(rs, out[2]):
            seen.setdefault(id(r), []).append(p)
        return out

    prop._pick, prop.min_path_confidence = spy, 1e-300
    try:
        return prop.propose(reqs), [seen.get(id(r), []) for r in reqs]
    finally:
        prop._pick, prop.min_path_confidence = real, None


def test_path_gate_truncates_each_chain_where_the_path_score_drops_below_the_threshold(draft):
    hf, model = draft
    prop = PagedDraftProposer(model, num_blocks=64, block_size=4)
    reqs = [ProposalRequest([1, 5, 9, 33, 71, 4], 6, "a"), ProposalRequest([7, 8, 9, 10], 6, "b")]
    full, tops = _top_probs(prop, reqs)
    assert [len(d) for d in full.token_ids] == [6, 6]
    with torch.no_grad():  # greedy rows: the gate reads the draft's own top probability at each position
        for r, d, t in zip(reqs, full.token_ids, tops):
            probs = hf(torch.tensor([r.token_ids + d[:-1]])).logits[0, len(r.token_ids) - 1:].softmax(-1)
            torch.testing.assert_close(torch.tensor(t), probs.max(-1).values, atol=1e-4, rtol=1e-4)
    scores = [torch.tensor(t).cumprod(0).tolist() for t in tops]
    # thresholds between the path scores of the two requests' chains: every cut point is exercised
    thresholds = sorted({s for sc in scores for s in sc})
    for lo, hi in zip([0.0] + thresholds[:-1], thresholds):
        t = (lo + hi) / 2
        prop.min_path_confidence = t
        gated = prop.propose([ProposalRequest(r.token_ids, r.k, r.request_id) for r in reqs])
        for d, d_full, sc in zip(gated.token_ids, full.token_ids, scores):
            n = sum(1 for s in sc if s >= t)  # path scores only fall along a chain
            assert d == d_full[:n]
    prop.min_path_confidence = 0.999999  # a random tiny draft is never that sure: nothing is proposed
    assert prop.propose([ProposalRequest(r.token_ids, r.k, r.request_id) for r in reqs]).token_ids == [[], []]


def test_first_token_gate_proposes_an_unsure_first_token_and_ends_its_chain_without_another_forward(draft):
    _, model = draft
    prop = PagedDraftProposer(model, num_blocks=64, block_size=4)
    reqs = [ProposalRequest([1, 5, 9, 33, 71, 4], 6, "a"), ProposalRequest([7, 8, 9, 10], 6, "b")]
    full, tops = _top_probs(prop, reqs)
    firsts = [t[0] for t in tops]
    lo, hi = sorted(firsts)
    assert lo < hi

    def again():
        return prop.propose([ProposalRequest(r.token_ids, r.k, r.request_id) for r in reqs])

    # path gate above both first tokens, first-token gate below both: one token each, and one draft forward
    prop.min_path_confidence, prop.min_first_confidence = hi * 1.01, lo * 0.99
    one = again()
    assert one.token_ids == [d[:1] for d in full.token_ids] and one.num_forwards == 1
    # first-token gate between the two: only the surer request drafts
    prop.min_first_confidence = (lo + hi) / 2
    assert again().token_ids == [d[:1] if f == hi else [] for d, f in zip(full.token_ids, firsts)]
    # a first-token gate above the path gate holds the first token to it; the chain then follows the path gate
    scores = [torch.tensor(t).cumprod(0).tolist() for t in tops]
    path = min(sc[1] for sc in scores) * 0.99  # both chains' second positions pass the path gate
    prop.min_path_confidence, prop.min_first_confidence = path, (lo + hi) / 2
    for d, d_full, sc, f in zip(again().token_ids, full.token_ids, scores, firsts):
        assert d == (d_full[:sum(1 for s in sc if s >= path)] if f == hi else [])
    # unset: the path gate alone, as before
    prop.min_first_confidence = None
    for d, d_full, sc in zip(again().token_ids, full.token_ids, scores):
        assert d == d_full[:sum(1 for s in sc if s >= path)]


def test_path_gate_for_sampled_rows_depends_on_the_context_not_the_draw(draft):
    """Rejection sampling stays exact only if whether a position is proposed is fixed before its token is drawn:
    the gate must read the draft's top probability, never the sampled token's."""
    from accel.runtime.sampling_params import SamplingParams

    _, model = draft
    prop = PagedDraftProposer(model, num_blocks=64, block_size=4)
    ids = [1, 5, 9, 33, 71, 4]
    params = SamplingParams(temperature=1.5)
    _, tops = _top_probs(prop, [ProposalRequest(ids, 1, "p", params=params,
                                                generator=torch.Generator().manual_seed(0))])
    prop.min_path_confidence = tops[0][0] * 0.999  # the first position passes, whatever gets drawn
    lengths = set()
    for seed in range(20):
        out = prop.propose([ProposalRequest(ids, 1, f"s{seed}", params=params,
                                            generator=torch.Generator().manual_seed(seed))])
        lengths.add(len(out.token_ids[0]))
        assert out.probs[0].shape[0] == len(out.token_ids[0])
    assert lengths == {1}
    prop.min_path_confidence = tops[0][0] * 1.001  # ... and fails, whatever gets drawn
    for seed in range(20):
        out = prop.propose([ProposalRequest(ids, 1, f"t{seed}", params=params,
                                            generator=torch.Generator().manual_seed(seed))])
        assert out.token_ids == [[]]


@pytest.mark.parametrize("field, ok, bad", [("draft_min_path_confidence", 0.3, (1.0, 0.0)),
                                             ("draft_min_first_confidence", 0.2, (0.0, 1.0))])
def test_path_gate_validation(field, ok, bad):
    """`bad`: a value each of SpeculativeConfig and the recipe's SpeculationConfig refuses."""
    runtime_bad, recipe_bad = bad
    config = SpeculativeConfig.from_recipe(SpeculationConfig(method="distilled", **{field: ok}), draft_dir="d")
    assert getattr(config, field) == ok
    with pytest.raises(ValueError, match=f"{field}={runtime_bad} is invalid"):
        SpeculativeConfig(method="draft", draft_model="d", **{field: runtime_bad})
    with pytest.raises(ValueError, match="needs a draft model; method is .ngram."):
        SpeculativeConfig(method="ngram", **{field: ok})
    with pytest.raises(ValueError, match=field):
        SpeculationConfig(method="distilled", **{field: recipe_bad})


def test_ngram_first_from_the_recipe_carries_the_lookup_sizes():
    cfg = SpeculativeConfig.from_recipe(SpeculationConfig(method="distilled", draft_ngram_first=True,
                                                          ngram_min_n=3, ngram_max_n=5), draft_dir="d")
    assert cfg.draft_ngram_first and (cfg.ngram_min_n, cfg.ngram_max_n) == (3, 5)
    # unset: lookup first with a draft model, never with n-gram alone; False: the draft alone
    assert SpeculativeConfig.from_recipe(SpeculationConfig(method="distilled"), draft_dir="d").draft_ngram_first
    assert not SpeculativeConfig.from_recipe(SpeculationConfig(method="ngram")).draft_ngram_first
    assert not SpeculativeConfig.from_recipe(SpeculationConfig(method="distilled", draft_ngram_first=False),
                                             draft_dir="d").draft_ngram_first
