"""A failure tied to one request ends that request only (finish reason "error"); the others in the same batch go
on with exactly the tokens they would have produced alone. Each per-request step that can raise is covered:
request set-up (seeded generator), sampling, speculative verification, proposing drafts, detokenization."""

from __future__ import annotations

import pytest
import torch

from accel.runtime.engine import Engine
from accel.runtime.sampler import Sampler
from accel.runtime.sampling_params import SamplingParams
from accel.speculative.config import SpeculativeConfig
from accel.speculative.proposer import NgramProposer, Proposals, ProposalRequest
from tests.runtime.helpers import mixed_prompts

MAGIC_SEED = 4242  # the request whose processing the tests make fail
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=10, temperature=0.8, seed=7, ignore_eos=True)
VICTIM = SamplingParams(max_tokens=10, temperature=0.8, seed=MAGIC_SEED, ignore_eos=True)


class FailingSampler(Sampler):
    """Raises for any batch that holds the MAGIC_SEED request (as a broken logits processor would)."""

    def __call__(self, logits, params, *args, **kwargs):
        if any(p.seed == MAGIC_SEED for p in params):
            raise RuntimeError("this request's logits processor failed")
        return super().__call__(logits, params, *args, **kwargs)


def _engine(tiny_llama_dir, **kw) -> Engine:
    path, _ = tiny_llama_dir
    return Engine.from_pretrained(path, num_kv_blocks=128, block_size=8, **kw)


def _run(engine: Engine, prompts, params) -> dict[str, object]:
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    final = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
    return [final[i] for i in ids]


@pytest.fixture(scope="module")
def prompts():
    return mixed_prompts(3, seed=3, lo=4, hi=20)


@pytest.fixture(scope="module")
def alone(tiny_llama_dir, prompts):
    """The tokens of the two healthy requests (one greedy, one seeded) run without the failing one."""
    outs = _run(_engine(tiny_llama_dir), prompts[:2], [GREEDY, SAMPLED])
    return [o.token_ids for o in outs]


def _assert_only_the_victim_failed(outs, alone):
    good, victim = outs[:2], outs[2]
    assert victim.finish_reason == "error" and victim.error and "failed" in victim.error
    assert [o.finish_reason for o in good] == ["length", "length"]
    assert [o.token_ids for o in good] == alone  # the seeded one drew exactly what it draws alone


def test_a_failing_sampler_row_ends_that_request_only(tiny_llama_dir, prompts, alone):
    engine = _engine(tiny_llama_dir)
    engine.runner.sampler = FailingSampler()
    outs = _run(engine, prompts, [GREEDY, SAMPLED, VICTIM])
    _assert_only_the_victim_failed(outs, alone)
    assert engine.kv.num_held_blocks() == 0 and not engine.runner._generators


def test_a_failing_verification_ends_that_request_only(tiny_llama_dir, prompts, alone, monkeypatch):
    engine = _engine(tiny_llama_dir, speculative=SpeculativeConfig(method="ngram", adaptive=False,
                                                            disable_above_batch_size=None, max_step_rows=None))

    class AlwaysDraft(NgramProposer):  # drafts for everyone, so every request is verified each step
        def propose(self, requests: list[ProposalRequest]) -> Proposals:
            return Proposals([[5] * r.k for r in requests])

    engine.spec.proposer = AlwaysDraft()
    from accel.runtime import row_processors

    verify = row_processors.verify

    def failing_verify(sampler, logits, spec, *args):
        if any(r.seq.params.seed == MAGIC_SEED for r, _ in spec):
            raise RuntimeError("verification failed for this request")
        return verify(sampler, logits, spec, *args)

    monkeypatch.setattr(row_processors, "verify", failing_verify)
    outs = _run(engine, prompts, [GREEDY, SAMPLED, VICTIM])
    # drafts never change a greedy output; the seeded request draws differently when verified, so compare to
    # a run with the same drafts and no victim
    ref = _engine(tiny_llama_dir, speculative=engine.config.speculative)
    ref.spec.proposer = AlwaysDraft()
    expected = [o.token_ids for o in _run(ref, prompts[:2], [GREEDY, SAMPLED])]
    _assert_only_the_victim_failed(outs, expected)
    assert expected[0] == alone[0]


def test_a_failing_proposer_leaves_the_request_undrafted_not_failed(tiny_llama_dir, prompts, alone):
    engine = _engine(tiny_llama_dir, speculative=SpeculativeConfig(method="ngram", adaptive=False,
                                                            disable_above_batch_size=None, max_step_rows=None))

    class FailsForOne(NgramProposer):
        def __init__(self):
            super().__init__(1, 3)
            self.calls = []

        def propose(self, requests):
            self.calls.append([r.request_id for r in requests])
            if any(r.params.seed == MAGIC_SEED for r in requests):
                raise RuntimeError("draft state of this request is broken")
            return Proposals([[r.token_ids[-1]] * r.k for r in requests])

    proposer = engine.spec.proposer = FailsForOne()
    victim = SamplingParams(max_tokens=10, temperature=0, seed=MAGIC_SEED, ignore_eos=True)
    outs = _run(engine, prompts, [GREEDY, GREEDY, victim])
    ref = _run(_engine(tiny_llama_dir), prompts, [GREEDY, GREEDY, GREEDY])
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]  # everyone finished, greedy-identical
    assert all(o.finish_reason == "length" for o in outs)
    victim_id = outs[2].request_id
    later = proposer.calls[-1]
    assert victim_id not in later and len(later) >= 1  # the others keep drafting; the victim no longer asks


def test_a_failing_detokenizer_ends_that_request_only(tiny_llama_dir, prompts, alone):
    engine = _engine(tiny_llama_dir)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, [GREEDY, SAMPLED, VICTIM])]

    def broken(new_token_ids):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "a stop-string check failed")

    engine._states[ids[2]].detok.update = broken
    final = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                final[o.request_id] = o
    _assert_only_the_victim_failed([final[i] for i in ids], alone)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**30])
def test_an_out_of_range_seed_is_refused_at_add_not_in_a_step(tiny_llama_dir, seed):
    with pytest.raises(ValueError, match=r"seed=.* is invalid; allowed: None or an integer in \[-9223372036854775808"):
        SamplingParams(seed=seed)
    engine = _engine(tiny_llama_dir)
    params = SamplingParams(max_tokens=4, temperature=1.0)
    object.__setattr__(params, "seed", seed)  # past validation: set-up itself must still fail at add
    engine.add_request([5, 6, 7], GREEDY)
    with pytest.raises((ValueError, RuntimeError)):
        engine.add_request([5, 6, 7], params)
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.finished]
    assert [o.finish_reason for o in outs] == ["length"]


def test_stop_token_ids_outside_the_vocabulary_are_refused_at_add(tiny_llama_dir):
    engine = _engine(tiny_llama_dir)
    with pytest.raises(ValueError, match=r"stop_token_ids \[1000000\] are invalid; allowed: integers in \[0, 256\)"):
        engine.add_request([5, 6], SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=[10**6]))
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=[-1])


def test_tiny_temperature_is_greedy_and_underflowing_penalty_is_refused(tiny_llama_dir, prompts):
    for t in (1e-300, 5e-324, 1e-6):
        assert SamplingParams(temperature=t).temperature == 0.0
    with pytest.raises(ValueError, match=r"repetition_penalty=1e-300 is invalid; allowed: a number in \[0.01, 10\]"):
        SamplingParams(repetition_penalty=1e-300)
    engine = _engine(tiny_llama_dir)
    tiny = SamplingParams(max_tokens=8, temperature=1e-300, ignore_eos=True)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    a, b = _run(engine, [prompts[0], prompts[0]], [tiny, greedy])
    assert a.token_ids == b.token_ids


def test_sampling_at_the_smallest_allowed_values_stays_finite():
    logits = torch.randn(2, 50) * 30
    params = [SamplingParams(temperature=1e-5 * 1.01, repetition_penalty=0.01, seed=1),
              SamplingParams(temperature=2.0, top_p=1e-30, min_p=1e-30, seed=2)]
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    out = Sampler()(logits, params, gens, [[1, 2, 3], [4]], [[5], []])
    assert out.token_ids.shape == (2,) and bool(((out.token_ids >= 0) & (out.token_ids < 50)).all())
    probs = Sampler().probs(logits, params, [[1, 2, 3], [4]], [[5], []])
    assert torch.isfinite(probs).all()
