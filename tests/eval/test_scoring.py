import math

import pytest

from accel.eval.scoring import accuracy_stderr, extract_choice, extract_json_object, extract_number, score_reply


@pytest.mark.parametrize(
    "reply, answer, match, expected",
    [
        # exact: strip + case-fold, nothing else
        ("  Paris \n", "paris", "exact", True),
        ("PARIS", "Paris", "exact", True),
        ("Paris.", "Paris", "exact", True),  # final punctuation is stripped
        ("The capital is Paris", "Paris", "exact", True),  # short sentence containing the answer
        # number: first number in the reply
        ("The answer is 12.", "12", "number", True),
        ("The answer is 12.", 12, "number", True),
        ("12.5", 12.5, "number", True),
        ("It is 1,234 apples", 1234, "number", True),
        ("-7", "-7", "number", True),
        ("3 + 4 = 7", 7, "number", True),  # the last number on the line is the result
        ("no idea", 4, "number", False),
        ("4.0", "4", "number", True),
        # json: first parseable object, fences ignored, key order irrelevant
        ('```json\n{"name": "Ann", "age": 3}\n```', {"age": 3, "name": "Ann"}, "json", True),
        ('Here: {"a": [1, 2]} and {"b": 1}', '{"a": [1, 2]}', "json", True),
        ('{bad} then {"a": 1}', {"a": 1}, "json", True),
        ('{"a": 1', {"a": 1}, "json", False),
        ('{"a": "1"}', {"a": 1}, "json", False),
        # choice: first standalone letter A-D
        ("b) the second option", "B", "choice", True),
        ("B", "B", "choice", True),
        ("The answer is (C).", "C", "choice", True),
        ("Answer: D", "D", "choice", True),
        ("a good answer is C", "C", "choice", True),  # the article "a" is not a choice
        ("ABC", "A", "choice", False),  # not standalone
        ("E", "A", "choice", False),
        ("C", 2, "choice", True),  # index answers map to letters
    ],
)
def test_score_reply_table(reply, answer, match, expected):
    assert score_reply(reply, answer, match) is expected


def test_extractors_return_none_when_nothing_matches():
    assert extract_number("twelve") is None
    assert extract_json_object("no braces [1, 2]") is None
    assert extract_choice("none here") is None


def test_extract_number_ignores_sentence_period_and_keeps_decimals():
    assert extract_number("The answer is 12.") == 12.0
    assert extract_number("pi is 3.14.") == 3.14


def test_extract_json_object_skips_non_object_json():
    assert extract_json_object('{"outer": {"inner": 1}}') == {"outer": {"inner": 1}}


def test_unknown_match_kind_is_rejected():
    with pytest.raises(ValueError, match="match must be one of .*got 'fuzzy'"):
        score_reply("x", "x", "fuzzy")


def test_bad_choice_answer_is_rejected():
    with pytest.raises(ValueError, match="choice answer must be a letter A-D"):
        score_reply("A", "Z", "choice")


def test_accuracy_stderr():
    p, se = accuracy_stderr(3, 4)
    assert p == 0.75 and se == pytest.approx(math.sqrt(0.75 * 0.25 / 4))
    assert accuracy_stderr(0, 5) == (0.0, 0.0)
    assert accuracy_stderr(5, 5) == (1.0, 0.0)


@pytest.mark.parametrize("k, n", [(1, 0), (-1, 3), (4, 3)])
def test_accuracy_stderr_rejects_bad_counts(k, n):
    with pytest.raises(ValueError, match="num_correct"):
        accuracy_stderr(k, n)


def test_quasi_exact_and_last_number_rules():
    assert score_reply("The capital of France is Paris.", "Paris", "exact")
    assert score_reply("**Paris**", "Paris", "exact")
    assert score_reply("paris\n\nParis is the capital and largest city of France.", "Paris", "exact")
    assert not score_reply("Parisian food is famous.", "Paris", "exact")
    long = "Many people think that the answer could be Paris but it is really a matter of opinion here."
    assert not score_reply(long, "Paris", "exact")
    assert score_reply("17 - 2 = 15", "15", "number")
    assert score_reply("The answer is 15.", "15", "number")
    assert not score_reply("15 is wrong, it's 16", "15", "number")
    assert not score_reply("17 - 2 = 15\nso 15 + 1 = 16", "16", "number")
