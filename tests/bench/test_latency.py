"""Latency math on hand-made timestamps: every number is computed by hand in the comments."""

from __future__ import annotations

import pytest

from accel.bench.latency import (SLO, BenchResult, RequestRecord, SweepResult, find_knee, percentile, request_latency,
                                summarize, throughput_spread)


def rec(rid, start, end, out, chunks, queue=None, error=None, prompt=10):
    return RequestRecord(request_id=rid, start=start, end=end, prompt_tokens=prompt, output_tokens=out,
                         chunk_times=chunks, queue_time=queue, error=error)


def test_request_latency_follows_vllm_definitions():
    # sent at 1.0, chunks at 1.5, 1.7, 2.0 (2 tokens), stream ends at 2.1; 4 output tokens
    lat = request_latency(rec("a", 1.0, 2.1, 4, [1.5, 1.7, 2.0]))
    assert lat.ttft == pytest.approx(0.5)
    assert lat.e2e == pytest.approx(1.1)
    assert lat.tpot == pytest.approx((1.1 - 0.5) / 3)  # (e2e - ttft) / (n - 1)
    assert lat.itl == pytest.approx([0.2, 0.3])  # per chunk, not per token


def test_single_token_has_no_tpot_and_no_first_token_has_no_ttft():
    one = request_latency(rec("a", 0.0, 0.4, 1, [0.3]))
    assert one.tpot is None and one.ttft == pytest.approx(0.3) and one.itl == []
    none = request_latency(rec("b", 0.0, 0.4, 0, []))
    assert none.ttft is None and none.tpot is None


def test_end_before_start_is_rejected():
    with pytest.raises(ValueError, match="before start"):
        request_latency(rec("a", 2.0, 1.0, 1, []))


def test_percentile_is_linear_interpolation():
    vals = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(vals, 50) == 3.0
    assert percentile(vals, 95) == pytest.approx(4.0 + 0.8 * 6.0)  # rank 3.8 between 4 and 10
    assert percentile(vals, 99) == pytest.approx(4.0 + 0.96 * 6.0)
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match="q=101"):
        percentile(vals, 101)


def test_summarize_counts_throughput_and_errors():
    records = [
        rec("a", 0.0, 1.0, 5, [0.2, 0.4, 0.6, 0.8, 1.0], queue=0.1),  # ttft 0.2, tpot 0.2
        rec("b", 0.5, 2.0, 3, [1.0, 1.5, 2.0], queue=0.3),  # ttft 0.5, tpot 0.5
        rec("c", 0.5, 0.6, 0, [], error="http_503"),
        rec("d", 1.0, 1.2, 0, [], error="timeout"),
    ]
    r = summarize(records, config={"concurrency": 2})
    assert r.duration_s == pytest.approx(2.0)  # first start 0.0 .. last end 2.0
    assert (r.num_requests, r.num_completed, r.num_errors) == (4, 2, 2)
    assert r.errors_by_kind == {"http_503": 1, "timeout": 1}
    assert r.total_output_tokens == 8 and r.total_prompt_tokens == 20
    assert r.output_throughput == pytest.approx(4.0) and r.request_throughput == pytest.approx(1.0)
    assert r.total_token_throughput == pytest.approx(14.0)
    assert r.ttft_ms.p50 == pytest.approx(350.0) and r.ttft_ms.max == pytest.approx(500.0)
    assert r.tpot_ms.mean == pytest.approx(350.0)
    assert r.itl_ms.n == 6 and r.itl_ms.max == pytest.approx(500.0)
    assert r.queue_time_ms.p50 == pytest.approx(200.0)
    assert r.goodput is None  # no SLO given


def test_goodput_counts_requests_meeting_every_slo():
    records = [
        rec("a", 0.0, 1.0, 5, [0.2, 0.4, 0.6, 0.8, 1.0]),  # ttft 200 ms, tpot 200 ms
        rec("b", 0.0, 2.0, 3, [1.0, 1.5, 2.0]),  # ttft 1000 ms, tpot 500 ms
        rec("c", 0.0, 0.5, 1, [0.1]),  # ttft 100 ms, no tpot
        rec("d", 0.0, 0.5, 0, [], error="http_500"),
    ]
    assert summarize(records, slo=SLO(ttft_ms=300)).goodput == pytest.approx(2 / 2.0)  # a, c
    assert summarize(records, slo=SLO(tpot_ms=300)).goodput == pytest.approx(2 / 2.0)  # a, c (trivially)
    assert summarize(records, slo=SLO(ttft_ms=2000, tpot_ms=600)).goodput == pytest.approx(3 / 2.0)
    assert summarize(records, slo=SLO(e2e_ms=600)).goodput == pytest.approx(1 / 2.0)  # c only


@pytest.mark.parametrize("bad", [{"ttft_ms": 0}, {"tpot_ms": -1}, {"e2e_ms": float("inf")}])
def test_bad_slo_is_rejected(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SLO(**bad)


def test_bench_result_json_round_trip():
    records = [rec("a", 0.0, 1.0, 5, [0.2, 0.4, 0.6, 0.8, 1.0], queue=0.1), rec("b", 0.1, 0.2, 0, [], error="x")]
    r = summarize(records, config={"concurrency": 1}, slo=SLO(ttft_ms=100))
    back = BenchResult.from_json(r.to_json())
    assert back == r
    assert back.latencies()[0].tpot == pytest.approx(0.2)
    assert "TPOT" in back.definitions and "(output tokens - 1)" in back.definitions["TPOT"]


def test_find_knee():
    # +100%, +50%, +5% with TTFT growing -> the knee is the point before the +5% step
    assert find_knee([10, 20, 30, 31.5], [100, 110, 130, 400]) == 2
    # flat throughput but TTFT not growing: not a knee yet
    assert find_knee([10, 20, 20.5], [100, 110, 90]) is None
    assert find_knee([10, 20, 40], [1, 2, 3]) is None
    with pytest.raises(ValueError, match="pair up"):
        find_knee([1, 2], [1])


def test_sweep_result_round_trip():
    p = summarize([rec("a", 0.0, 1.0, 2, [0.5, 1.0])], config={"concurrency": 1})
    s = SweepResult(points=[p, p], knee_index=None, knee_rule="rule")
    assert SweepResult.from_dict(s.to_dict()) == s


def test_throughput_spread():
    assert throughput_spread([100.0, 104.0]) == pytest.approx(4.0 / 102.0)
    with pytest.raises(ValueError, match="at least two"):
        throughput_spread([1.0])
