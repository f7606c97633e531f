"""AsyncEngine without HTTP: streams, aborts, failures and shutdown, driven with asyncio.run (bounded)."""

from __future__ import annotations

import asyncio

import pytest

from accel.runtime.sampling_params import SamplingParams
from accel.server.async_engine import AdmissionError, AdmissionPolicy, AsyncEngine, RequestFailed
from tests.server.conftest import wait_until
from tests.server.fake_engine import FakeEngine


def run(coro, timeout: float = 20.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_generate_streams_deltas_then_the_final_output():
    async def main():
        ae = AsyncEngine(FakeEngine())
        ae.start()
        outs = [o async for o in ae.generate(ids("ab"), SamplingParams(max_tokens=4), "r1")]
        await ae.shutdown(1)
        return outs

    outs = run(main())
    assert [o.text_delta for o in outs] == ["H", "e", "l", "l"]
    assert [o.finished for o in outs] == [False, False, False, True] and outs[-1].finish_reason == "length"


def test_serving_cuts_bursts_of_steps_short():
    """The event loop answers nothing while a step runs: under the server, a burst of steps (num_scheduler_steps,
    n-gram verify steps) is cut to MAX_BURST_S; an engine used directly has no cut."""
    from accel.runtime.engine import MAX_BURST_S

    engine = FakeEngine()
    AsyncEngine(engine)
    assert engine.max_burst_s == MAX_BURST_S


def test_concurrent_requests_each_get_their_own_stream():
    async def main():
        ae = AsyncEngine(FakeEngine(reply="xyz"))
        ae.start()

        async def one(rid, n):
            return "".join([o.text_delta async for o in ae.generate(ids("p"), SamplingParams(max_tokens=n), rid)])

        texts = await asyncio.gather(*(one(f"r{i}", i + 1) for i in range(6)))
        await ae.shutdown(1)
        return texts

    assert run(main()) == ["x", "xy", "xyz", "xyzx", "xyzxy", "xyzxyz"]


def test_closing_the_stream_early_aborts_and_frees_blocks():
    engine = FakeEngine(step_delay=0.005)

    async def main():
        ae = AsyncEngine(engine)
        ae.start()
        agen = ae.generate(ids("p"), SamplingParams(max_tokens=100), "r1")
        await agen.__anext__()
        await agen.aclose()
        ok = await asyncio.to_thread(wait_until, lambda: engine.kv.num_held_blocks() == 0, 5)
        await ae.shutdown(1)
        return ok

    assert run(main())
    assert engine.aborted == ["r1"] and engine.num_steps < 100


def test_add_errors_go_to_the_caller_and_the_loop_keeps_serving():
    async def main():
        ae = AsyncEngine(FakeEngine(vocab_size=10))
        ae.start()
        with pytest.raises(ValueError, match="invalid"):
            await ae.add([99], SamplingParams(max_tokens=2), "bad")
        outs = [o async for o in ae.generate([1], SamplingParams(max_tokens=2), "good")]
        await ae.shutdown(1)
        return outs

    assert run(main())[-1].token_ids == ids("He")


def test_step_failure_fails_the_requests_inside_and_later_requests_succeed():
    engine = FakeEngine()

    async def main():
        ae = AsyncEngine(engine)
        ae.start()
        with pytest.raises(RequestFailed, match="BOOM"):
            async for _ in ae.generate(ids("BOOM"), SamplingParams(max_tokens=3), "boom"):
                pass
        outs = [o async for o in ae.generate(ids("ok"), SamplingParams(max_tokens=3), "ok")]
        await ae.shutdown(1)
        return ae, outs

    ae, outs = run(main())
    assert outs[-1].text == "Hel" and engine.kv.num_held_blocks() == 0 and ae.num_in_flight == 0


def test_after_shutdown_new_requests_are_refused_with_503():
    async def main():
        ae = AsyncEngine(FakeEngine(), AdmissionPolicy(retry_after_s=3))
        ae.start()
        await ae.shutdown(1)
        with pytest.raises(AdmissionError) as e:
            await ae.add([1], SamplingParams(max_tokens=2), "late")
        return e.value

    err = run(main())
    assert (err.status, err.reason, err.retry_after) == (503, "shutting_down", 3)


def test_shutdown_deadline_tells_in_flight_requests():
    engine = FakeEngine(step_delay=0.01)

    async def main():
        ae = AsyncEngine(engine)
        ae.start()
        stream = await ae.add([1], SamplingParams(max_tokens=120), "long")
        shutdown = asyncio.ensure_future(ae.shutdown(0.1))
        with pytest.raises(RequestFailed) as e:
            async for _ in stream:
                pass
        await shutdown
        return e.value

    err = run(main())
    assert err.status == 503 and "shutting down" in err.message
    assert engine.kv.num_held_blocks() == 0 and engine.aborted == ["long"]


def test_the_engine_steps_on_the_event_loop_thread_and_outputs_are_sent_before_the_next_step():
    """No engine thread: a step's outputs reach their consumer before the next step begins (a step fills every
    core, so the loop's sending could not overlap it)."""
    import threading

    engine = FakeEngine(reply="abc")
    seen: list[tuple[int, int]] = []  # (thread, outputs consumed so far) at each step
    consumed = []
    step = engine.step

    def traced_step():
        seen.append((threading.get_ident(), len(consumed)))
        return step()

    engine.step = traced_step

    async def main():
        ae = AsyncEngine(engine)
        ae.start()
        async for o in ae.generate(ids("p"), SamplingParams(max_tokens=3), "r1"):
            consumed.append(o)
        await ae.shutdown(1)
        return threading.get_ident()

    loop_thread = run(main())
    assert {t for t, _ in seen} == {loop_thread}
    assert [n for _, n in seen] == [0, 1, 2]


def test_a_step_only_buffers_metrics_and_a_scrape_folds_them_in():
    """No Prometheus object is touched per step (Python right after a decode step runs with cold caches): the
    counters read 0 until a scrape renders them, and then they hold every token, gap and finished request."""
    from accel.server.metrics import ServerMetrics

    metrics = ServerMetrics("m")

    def value(name: str, **labels) -> float | None:
        return metrics.registry.get_sample_value(name, {"model_name": "m", **labels})

    async def main():
        ae = AsyncEngine(FakeEngine(), metrics=metrics)
        ae.start()
        outs = [o async for o in ae.generate(ids("abc"), SamplingParams(max_tokens=5), "r1")]
        before = (value("vllm:generation_tokens_total"), value("vllm:inter_token_latency_seconds_count"),
                  value("vllm:request_success_total", finished_reason="length"))
        ae.refresh()
        text = metrics.render().decode()
        await ae.shutdown(1)
        return outs, before, text

    outs, before, text = run(main())
    assert len(outs) == 5 and before == (0.0, 0.0, None)
    assert value("vllm:generation_tokens_total") == 5.0
    assert value("vllm:inter_token_latency_seconds_count") == 4.0
    assert value("vllm:request_success_total", finished_reason="length") == 1.0
    assert value("vllm:prompt_tokens_total") == 3.0
    assert 'vllm:num_requests_running{model_name="m"} 0.0' in text


def test_unscraped_metrics_stay_bounded():
    from types import SimpleNamespace

    from accel.server.metrics import ServerMetrics

    metrics = ServerMetrics("m")
    times: list[float] = []
    for i in range(10_000):
        times.append(i * 0.01)
        metrics.observe_output(SimpleNamespace(new_token_ids=[1], finished=False, metrics=SimpleNamespace(
            token_times=times)))
    assert len(metrics._gaps) < 4096
    assert metrics.registry.get_sample_value("vllm:inter_token_latency_seconds_count", {"model_name": "m"}) >= 8192


def test_a_stream_nobody_reads_is_cancelled_not_buffered_without_end():
    """A client that reads nothing (its stream blocked on a full socket): once max_unread outputs wait unread, the
    request is aborted in the engine and the stream ends with an error; the others go on."""
    async def main():
        engine = FakeEngine(reply="z" * 100)
        ae = AsyncEngine(engine, max_unread=5)
        ae.start()
        stalled = await ae.add(ids("p"), SamplingParams(max_tokens=60), "stalled")
        read = [o.text_delta async for o in ae.generate(ids("q"), SamplingParams(max_tokens=30), "read")]
        await asyncio.sleep(0.1)
        outs = []
        with pytest.raises(RequestFailed, match="read none of this request's last 5 outputs"):
            async for o in stalled:
                outs.append(o)
        await ae.shutdown(1)
        return engine, read, outs

    engine, read, outs = run(main())
    assert len(read) == 30 and len(outs) == 5
    assert "stalled" in engine.aborted and engine.kv.num_held_blocks() == 0
