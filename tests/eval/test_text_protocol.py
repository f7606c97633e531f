import pytest

from accel.eval.text_protocol import EvalProtocol, concat_documents, make_windows, tokenize_domain


def spans(windows):
    """(token_ids, scored targets) per window."""
    return [(list(w.token_ids), list(w.token_ids[w.score_from:])) for w in windows]


def test_non_overlapping_windows_score_all_but_first_token_of_each():
    ws = make_windows(list(range(10)), "d", window=4)
    assert spans(ws) == [
        ([0, 1, 2, 3], [1, 2, 3]),
        ([4, 5, 6, 7], [5, 6, 7]),
        ([8, 9], [9]),  # the tail window is kept
    ]
    assert sum(w.num_scored for w in ws) == 7


def test_one_token_tail_is_dropped_because_it_has_no_context():
    ws = make_windows(list(range(9)), "d", window=4)
    assert [list(w.token_ids) for w in ws] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert sum(w.num_scored for w in ws) == 6


def test_strided_windows_score_every_token_after_the_first_exactly_once():
    ws = make_windows(list(range(10)), "d", window=4, stride=2)
    assert spans(ws) == [
        ([0, 1, 2, 3], [1, 2, 3]),
        ([2, 3, 4, 5], [4, 5]),  # [2, 3] are the unscored context prefix
        ([4, 5, 6, 7], [6, 7]),
        ([6, 7, 8, 9], [8, 9]),
    ]
    assert [w.score_from for w in ws] == [1, 2, 2, 2]


def test_strided_window_with_short_remainder():
    ws = make_windows(list(range(7)), "d", window=4, stride=3)
    assert spans(ws) == [([0, 1, 2, 3], [1, 2, 3]), ([3, 4, 5, 6], [4, 5, 6])]


def test_max_windows_keeps_evenly_spread_windows_starting_with_the_first():
    ws = make_windows(list(range(100)), "d", window=10, max_windows=3)  # 10 windows -> indices 0, 3, 6
    assert [w.token_ids[0] for w in ws] == [0, 30, 60]
    assert sum(w.num_scored for w in ws) == 27
    assert make_windows(list(range(100)), "d", window=10, max_windows=10) == make_windows(list(range(100)), "d", 10)


def test_max_windows_with_stride_keeps_each_windows_context_prefix():
    ws = make_windows(list(range(10)), "d", window=4, stride=2, max_windows=2)  # of 4 windows: 0 and 2
    assert spans(ws) == [([0, 1, 2, 3], [1, 2, 3]), ([4, 5, 6, 7], [6, 7])]


@pytest.mark.parametrize("stream", [[], [5]])
def test_streams_too_short_to_score_give_no_windows(stream):
    assert make_windows(stream, "d", window=4) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"window": 1}, "window must be an int >= 2"),
        ({"window": 4, "stride": 5}, "stride must be an int in \\[1, window=4\\], got 5"),
        ({"window": 4, "stride": 0}, "stride must be"),
        ({"window": 4, "max_windows": 0}, "max_windows_per_domain must be None or an int >= 1, got 0"),
    ],
)
def test_bad_window_parameters_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_windows(list(range(10)), "d", **kwargs)


def test_protocol_validates_on_construction():
    with pytest.raises(ValueError, match="stride"):
        EvalProtocol(window=8, stride=9)


def test_documents_are_joined_with_one_separator_between():
    assert concat_documents([[1, 2], [3], [4, 5]], separator_id=0) == [1, 2, 0, 3, 0, 4, 5]
    assert concat_documents([[1, 2], [3]], separator_id=None) == [1, 2, 3]


def test_tokenize_domain_uses_no_special_tokens(byte_tokenizer):
    ids = tokenize_domain(["ab", "c"], byte_tokenizer, separator_id=256)
    assert len(ids) == 4 and ids[2] == 256
    assert byte_tokenizer.decode(ids[:2]) == "ab" and byte_tokenizer.decode(ids[3:]) == "c"
