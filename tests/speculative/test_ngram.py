"""Prompt-lookup proposals pinned on small token sequences."""

from __future__ import annotations

import random

import numpy as np
import pytest

from accel.speculative.ngram import NgramIndex, propose_ngram
from accel.speculative.proposer import NgramProposer, ProposalRequest


@pytest.mark.parametrize("tokens, k, min_n, max_n, expected", [
    # docstring example: suffix "2 3 4" seen at position 1 -> propose what followed
    ([1, 2, 3, 4, 5, 6, 7, 9, 2, 3, 4], 3, 2, 4, [5, 6, 7]),
    # proposals stop at k
    ([1, 2, 3, 4, 5, 6, 7, 9, 2, 3, 4], 1, 2, 4, [5]),
    # the most recent occurrence wins: "7 8" followed by 1 then later by 2
    ([7, 8, 1, 0, 7, 8, 2, 0, 7, 8], 2, 2, 2, [2, 0]),
    # the longest n wins over a more recent shorter match: "5 7 8" -> 3; "7 8" alone more recently -> 4
    ([5, 7, 8, 3, 9, 7, 8, 4, 5, 7, 8], 1, 2, 3, [3]),
    # falls back to smaller n when the longer suffix never occurred
    ([5, 7, 8, 3, 9, 7, 8, 4, 6, 7, 8], 1, 2, 3, [4]),
    # no match at all
    ([1, 2, 3, 4], 3, 2, 4, []),
    # min_n respected: unigram "4" occurred but min_n = 2
    ([4, 9, 3, 4], 2, 2, 4, []),
    ([4, 9, 3, 4], 2, 1, 4, [9, 3]),
    # overlapping repetition: the most recent match is right before the suffix -> only the tokens that exist
    ([1, 2, 1, 2, 1, 2], 5, 2, 2, [1, 2]),
    ([3, 3, 3, 3], 4, 2, 3, [3]),
    # too short for any n-gram
    ([1], 3, 1, 2, []),
    ([], 3, 1, 2, []),
    # k = 0 proposes nothing
    ([1, 2, 1, 2], 0, 1, 2, []),
])
def test_exact_proposals(tokens, k, min_n, max_n, expected):
    assert propose_ngram(tokens, k, min_n, max_n) == expected


def test_accepts_numpy_and_returns_python_ints():
    out = propose_ngram(np.array([1, 2, 3, 1, 2]), 2, 2, 2)
    assert out == [3, 1] and all(type(t) is int for t in out)


@pytest.mark.parametrize("k, min_n, max_n, msg", [
    (-1, 2, 4, "k=-1"),
    (2, 0, 4, "min_n=0"),
    (2, 3, 2, "min_n=3, max_n=2"),
])
def test_bad_arguments(k, min_n, max_n, msg):
    with pytest.raises(ValueError, match=msg):
        propose_ngram([1, 2, 3], k, min_n, max_n)


def test_index_gives_propose_ngrams_answer_on_every_prefix_of_a_growing_sequence():
    rng = random.Random(0)
    for min_n, max_n in ((2, 4), (1, 3), (3, 3)):
        tokens = [rng.randrange(6) for _ in range(400)]  # a small vocabulary: many repeats
        index = NgramIndex(min_n, max_n)
        length = 1
        while length <= len(tokens):
            k = rng.randrange(0, 6)
            assert index.propose(tokens[:length], k) == propose_ngram(tokens[:length], k, min_n, max_n), length
            length += rng.randrange(1, 5)  # verify steps add one or several tokens
        other = [5, 4, 3, 5, 4]  # not a continuation: the index starts over
        assert index.propose(other, 3) == propose_ngram(other, 3, min_n, max_n)


def test_proposer_keeps_an_index_per_request_until_finish():
    prop = NgramProposer(2, 3)
    a, b = [1, 2, 3, 4, 1, 2], [7, 8, 9, 7, 8]
    assert prop.propose([ProposalRequest(a, 2, "a"), ProposalRequest(b, 2, "b")]).token_ids == [[3, 4], [9, 7]]
    assert prop.propose([ProposalRequest(a + [3, 9, 1, 2, 3], 3, "a")]).token_ids == [[9, 1, 2]]
    assert set(prop._index) == {"a", "b"}
    prop.finish("a")
    assert set(prop._index) == {"b"}


def test_guess_is_the_last_tokens_most_frequent_follower_most_recent_on_ties():
    assert NgramIndex(2, 3).guess([4, 9, 3, 4]) == 9
    assert NgramIndex(2, 3).guess([4, 9, 3, 4, 1, 5, 4, 1, 6, 4]) == 1  # 4 -> 1 twice, 4 -> 9 once
    assert NgramIndex(2, 3).guess([4, 9, 3, 4, 1, 2, 4, 1, 3, 4, 9, 7, 4]) == 9  # twice each: the most recent
    assert NgramIndex(2, 3).guess([4, 9, 7]) is None and NgramIndex(2, 3).guess([]) is None
    index = NgramIndex(2, 3)  # counts grow with the request
    assert index.guess([4, 9, 3, 4]) == 9 and index.guess([4, 9, 3, 4, 1, 5, 4, 1, 6, 4]) == 1


def test_proposer_guesses_one_token_from_a_weak_match_only_when_asked():
    prop = NgramProposer(2, 3)
    weak = [4, 9, 3, 4]  # only the 1-gram "4" matches
    out = prop.propose([ProposalRequest(weak, 3, "a", guess=True), ProposalRequest(weak, 3, "b"),
                        ProposalRequest(weak, 0, "c", guess=True)])
    assert out.token_ids == [[9], [], []] and out.guesses == [True, False, False]
    strong = [1, 2, 3, 1, 2]  # "1 2" matches: a real draft, guess or not
    out = prop.propose([ProposalRequest(strong, 3, "c", guess=True)])
    assert out.token_ids == [[3, 1, 2]] and out.guesses is None
    assert prop.propose([ProposalRequest(weak, 3, guess=True)]).token_ids == [[9]]  # no id: indexed from scratch
