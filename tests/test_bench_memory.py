"""accel.bench.memory: the read-bandwidth probe benchmarks record beside each repeat."""

import pytest

from accel.bench.memory import read_bandwidth_gbs


def test_read_bandwidth_is_a_positive_rate():
    assert read_bandwidth_gbs(1, megabytes=4, reads=2) > 0


@pytest.mark.parametrize("kw", [{"threads": 0}, {"threads": 1, "megabytes": 0}, {"threads": 1, "reads": 0}])
def test_read_bandwidth_rejects_bad_arguments(kw):
    with pytest.raises(ValueError, match="must be >= 1"):
        read_bandwidth_gbs(**kw)
