import pytest

from accel.calibration import allocate, bucket_index, bucket_labels, largest_remainder


def test_bucket_labels_and_index():
    assert bucket_labels([64, 256, 1024]) == ["<=64", "65-256", "257-1024", ">1024"]
    assert [bucket_index(n, [64, 256]) for n in (1, 64, 65, 256, 257, 10_000)] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("bad", [[], [64, 64], [256, 64], [0, 10]])
def test_bucket_labels_reject_bad_bounds(bad):
    with pytest.raises(ValueError, match="strictly increasing"):
        bucket_labels(bad)


def test_largest_remainder_sums_exactly_and_breaks_ties_by_order():
    assert largest_remainder(10, {"x": 6, "y": 3, "z": 1}) == {"x": 6, "y": 3, "z": 1}
    assert largest_remainder(7, {"x": 1, "y": 1, "z": 1}) == {"x": 3, "y": 2, "z": 2}
    assert largest_remainder(5, {"x": 1, "y": 2, "z": 3}) == {"x": 1, "y": 2, "z": 2}  # 0.83, 1.67, 2.5
    assert largest_remainder(0, {"x": 1}) == {"x": 0}


def test_largest_remainder_errors():
    with pytest.raises(ValueError, match="total must be >= 0, got -1"):
        largest_remainder(-1, {"x": 1})
    with pytest.raises(ValueError, match="sum to 0"):
        largest_remainder(3, {"x": 0})


def test_allocate_caps_and_redistributes():
    quota, capped = allocate(10, {"x": 1, "y": 1, "z": 1, "w": 1, "v": 1}, {"x": 6, "y": 3, "z": 1, "w": 10, "v": 10})
    assert quota == {"x": 3, "y": 2, "z": 1, "w": 2, "v": 2}
    assert capped == ["z"]


def test_allocate_cascading_caps_and_shortage():
    # Shares of 3 each: y and z are both capped; their shortfall (1 + 2) all goes to x.
    quota, capped = allocate(9, {"x": 1, "y": 1, "z": 1}, {"x": 10, "y": 2, "z": 1})
    assert quota == {"x": 6, "y": 2, "z": 1} and capped == ["y", "z"]
    # A stratum capped only in the second round.
    # Round 1: 5 each, z capped (x5 y5 z1). Round 2: 4 over x, y -> 2 each, y has room for 1 only.
    # Round 3: the last unit goes to x.
    quota, capped = allocate(15, {"x": 1, "y": 1, "z": 1}, {"x": 20, "y": 6, "z": 1})
    assert quota == {"x": 8, "y": 6, "z": 1} and capped == ["z", "y"]
    # Asking for more than exists gives everything with positive weight.
    quota, _ = allocate(50, {"x": 1, "y": 0, "z": 2}, {"x": 4, "y": 5, "z": 3})
    assert quota == {"x": 4, "y": 0, "z": 3}
