"""Greedy verification and Leviathan/Chen rejection sampling: exact cases and distribution tests."""

from __future__ import annotations

import pytest
import torch

from accel.runtime.rejection import greedy_verify, rejection_sample
from tests.conftest import make_tiny_llama

# chi-square critical values at p = 0.001 (df -> value); a correct sampler fails these 1 time in 1000
CHI2_CRIT_001 = {3: 16.27, 8: 26.12, 15: 37.70}


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def one_hot(ids: list[list[int]], vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(ids), vocab).float()


# ---- greedy ---------------------------------------------------------------------------------------------
def test_greedy_verify_exact_cases():
    drafts = torch.tensor([[5, 6, 7], [5, 6, 7], [5, 6, 7], [9, 9, 9], [1, 0, 0]])
    num = [3, 3, 3, 0, 1]
    target = torch.tensor([
        [5, 6, 7, 8],  # all accepted -> bonus 8
        [5, 1, 7, 8],  # mismatch at 1 -> recovered 1
        [4, 6, 7, 8],  # mismatch at 0
        [3, 9, 9, 9],  # no drafts: plain decode token 3
        [1, 2, 0, 0],  # one draft accepted; padding columns never count
    ])
    res = greedy_verify(drafts, num, target)
    assert res.num_accepted == [3, 1, 0, 0, 1]
    assert res.output_token_ids == [[5, 6, 7, 8], [5, 1], [4], [3], [1, 2]]


def test_greedy_verify_padding_does_not_accept():
    # row has 1 draft but padding matches the target: must still stop after position 0
    res = greedy_verify(torch.tensor([[4, 7, 7]]), [1], torch.tensor([[4, 7, 7, 7]]))
    assert res.num_accepted == [1] and res.output_token_ids == [[4, 7]]


@pytest.mark.parametrize("kwargs, msg", [
    (dict(draft_token_ids=torch.zeros(2, 3, dtype=torch.long), num_draft_tokens=[3, 3],
          target_argmax=torch.zeros(2, 3, dtype=torch.long)), "k\\+1=4"),
    (dict(draft_token_ids=torch.zeros(2, 3, dtype=torch.long), num_draft_tokens=[3],
          target_argmax=torch.zeros(2, 4, dtype=torch.long)), "one per row"),
    (dict(draft_token_ids=torch.zeros(2, 3, dtype=torch.long), num_draft_tokens=[3, 4],
          target_argmax=torch.zeros(2, 4, dtype=torch.long)), "\\[0, k=3\\]"),
    (dict(draft_token_ids=torch.zeros(3, dtype=torch.long), num_draft_tokens=[3],
          target_argmax=torch.zeros(1, 4, dtype=torch.long)), "\\[N, k\\]"),
])
def test_greedy_verify_bad_inputs(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        greedy_verify(**kwargs)


def test_rejection_sample_on_one_hot_target_equals_greedy():
    # greedy rows (target one-hot) give the greedy result whatever q is and whatever the seed
    torch.manual_seed(0)
    v = 8
    drafts = torch.tensor([[5, 6, 7], [5, 6, 7], [2, 2, 2]])
    argmax = torch.tensor([[5, 6, 7, 1], [5, 3, 7, 1], [0, 2, 2, 2]])
    q = torch.rand(3, 3, v).softmax(-1)
    for seed in range(5):
        gens = [torch.Generator().manual_seed(seed + i) for i in range(3)]
        for dp in (q, None):
            res = rejection_sample(drafts, [3, 3, 3], dp, one_hot(argmax.tolist(), v), gens)
            ref = greedy_verify(drafts, [3, 3, 3], argmax)
            assert res == ref


# ---- distribution: output ~ p ------------------------------------------------------------------------------
P = torch.tensor([0.1, 0.2, 0.3, 0.4])
Q = torch.tensor([0.4, 0.3, 0.2, 0.1])


def _draft_from(q: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    return torch.multinomial(q, n, replacement=True, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("use_q", [True, False])
def test_first_token_distribution_is_p_over_many_seeds(use_q):
    n = 4000
    d = _draft_from(Q, n, 1)[:, None]  # [n, 1]
    gens = [torch.Generator().manual_seed(1000 + i) for i in range(n)]
    dp = Q.expand(n, 1, 4) if use_q else None
    tp = torch.stack([P, P]).expand(n, 2, 4)  # position 0 and bonus position
    res = rejection_sample(d, [1] * n, dp, tp, gens)
    first = torch.tensor([o[0] for o in res.output_token_ids])
    counts = torch.bincount(first, minlength=4).float()
    assert chi_square(counts, P) < CHI2_CRIT_001[3]
    # the test can fail: the draft distribution itself is rejected
    assert chi_square(counts, Q) > CHI2_CRIT_001[3]


def test_acceptance_rate_matches_theory():
    # expected acceptance = sum_x min(p(x), q(x)) = 0.1 + 0.2 + 0.2 + 0.1 = 0.6
    n = 20000
    torch.manual_seed(3)
    d = _draft_from(Q, n, 2)[:, None]
    res = rejection_sample(d, [1] * n, Q.expand(n, 1, 4), torch.stack([P, P]).expand(n, 2, 4), [None] * n)
    rate = sum(res.num_accepted) / n
    assert abs(rate - 0.6) < 0.02  # ~5 standard deviations (sd = 0.0035)


def test_two_positions_joint_distribution_is_p1_times_p2():
    # context-independent target/draft distributions at each position, k = 2: the first two output tokens
    # must be independent draws from p0 and p1 (whichever path produced them: accepted, recovered, bonus)
    n = 12000
    p0, p1, p2 = P, torch.tensor([0.5, 0.25, 0.15, 0.1]), torch.tensor([0.25] * 4)
    q0, q1 = Q, torch.tensor([0.1, 0.1, 0.1, 0.7])
    torch.manual_seed(7)
    d = torch.stack([_draft_from(q0, n, 3), _draft_from(q1, n, 4)], dim=1)  # [n, 2]
    dp = torch.stack([q0, q1]).expand(n, 2, 4)
    tp = torch.stack([p0, p1, p2]).expand(n, 3, 4)
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    res = rejection_sample(d, [2] * n, dp, tp, gens)
    # only rows whose first token was accepted carry a second token from the same step; a rejected first
    # position ends the step, so test the marginal of token 0 on all rows and token 1 given token 0 accepted
    first = torch.tensor([o[0] for o in res.output_token_ids])
    assert chi_square(torch.bincount(first, minlength=4).float(), p0) < CHI2_CRIT_001[3]
    second = torch.tensor([o[1] for o in res.output_token_ids if len(o) >= 2])
    assert len(second) > 3000
    assert chi_square(torch.bincount(second, minlength=4).float(), p1) < CHI2_CRIT_001[3]
    assert all(1 <= len(o) <= 3 for o in res.output_token_ids)


def test_ragged_rows_with_no_drafts_sample_from_first_position():
    n = 4000
    d = torch.zeros(n, 2, dtype=torch.long)
    tp = torch.stack([P, Q, Q]).expand(n, 3, 4)
    res = rejection_sample(d, [0] * n, None, tp, [torch.Generator().manual_seed(i) for i in range(n)])
    assert res.num_accepted == [0] * n and all(len(o) == 1 for o in res.output_token_ids)
    counts = torch.bincount(torch.tensor([o[0] for o in res.output_token_ids]), minlength=4).float()
    assert chi_square(counts, P) < CHI2_CRIT_001[3]


def test_seeded_rows_do_not_depend_on_batch_composition():
    torch.manual_seed(0)
    v, k = 16, 3
    tp = torch.rand(4, k + 1, v).softmax(-1)
    dp = torch.rand(4, k, v).softmax(-1)
    d = torch.randint(0, v, (4, k))
    alone = [rejection_sample(d[i:i + 1], [k], dp[i:i + 1], tp[i:i + 1],
                              [torch.Generator().manual_seed(10 + i)]).output_token_ids[0] for i in range(4)]
    batch = rejection_sample(d, [k] * 4, dp, tp, [torch.Generator().manual_seed(10 + i) for i in range(4)])
    assert batch.output_token_ids == alone


def test_tiny_model_distributions_total_variation():
    """Target and draft are two tiny random Llamas at temperature 1: the output token is distributed as p."""
    target, draft = make_tiny_llama(seed=0, vocab_size=64), make_tiny_llama(seed=1, vocab_size=64)
    ctx = torch.tensor([[1, 17, 42, 9, 7]])
    with torch.no_grad():
        p = (target(ctx).logits[0, -1] * 8).softmax(-1)  # sharpen: tiny random models are near-uniform
        q = (draft(ctx).logits[0, -1] * 8).softmax(-1)
    v = p.shape[0]
    n = 20000
    d = torch.multinomial(q, n, replacement=True, generator=torch.Generator().manual_seed(5))[:, None]
    torch.manual_seed(11)
    res = rejection_sample(d, [1] * n, q.expand(n, 1, v), torch.stack([p, p]).expand(n, 2, v), [None] * n)
    emp = torch.bincount(torch.tensor([o[0] for o in res.output_token_ids]), minlength=v).float() / n
    tv = 0.5 * float((emp - p).abs().sum())
    tv_pq = 0.5 * float((p - q).abs().sum())
    assert tv_pq > 0.3  # the draft is clearly different, so the test can fail
    assert tv < 0.05
    # and the acceptance rate is sum min(p, q)
    assert abs(sum(res.num_accepted) / n - float(torch.minimum(p, q).sum())) < 0.02


def test_greedy_accept_on_host_lists_equals_greedy_verify():
    from accel.runtime.rejection import greedy_accept

    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(0, 6, (1,), generator=g))
        target = torch.randint(0, 3, (n + 1,), generator=g)  # small vocabulary: matches and mismatches both
        drafts = torch.randint(0, 3, (n,), generator=g)
        ref = greedy_verify(drafts[None], [n], target[None]).output_token_ids[0]
        assert greedy_accept(drafts.tolist(), target.tolist()) == ref
    assert greedy_accept([], [7]) == [7]  # no drafts: the target's token
    with pytest.raises(ValueError, match="target_argmax has 2 tokens for 2 drafts"):
        greedy_accept([1, 2], [1, 2])
