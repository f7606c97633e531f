"""Speculative decoding inside Engine.step: exactness, rollback, prefix cache, counters, adaptive length.

Greedy output must be token-identical with and without speculation whatever the batch holds (requests with and
without drafts, chunked prefill, prefix-cache hits, preemption); sampled output must follow the target's
distribution exactly (chi-square over many seeds on a vocabulary-8 model).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from accel.runtime.block_pool import hash_full_blocks
from accel.runtime.engine import Engine, EngineConfig
from accel.runtime.models import load_model
from accel.runtime.sampler import Sampler
from accel.runtime.sampling_params import SamplingParams
from accel.speculative.adaptive import AdaptiveSpeculation
from accel.speculative.config import SpeculativeConfig
from accel.speculative.paged_draft import PagedDraftProposer
from accel.speculative.proposer import NgramFirstProposer, Proposals, ProposalRequest, Proposer
from accel.speculative.tokenizer_check import TokenizerMismatchError
from tests.runtime.helpers import hf_greedy, make_hf_model, mixed_prompts, tiny_config

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


class OracleProposer(Proposer):
    """Proposes the known greedy continuation, with every third position corrupted (partial acceptance)."""

    def __init__(self, prompts: list[list[int]], refs: list[list[int]], vocab: int = 256) -> None:
        self.refs = {tuple(p): r for p, r in zip(prompts, refs)}
        self.vocab = vocab
        self.calls: list[int] = []

    def propose(self, requests: list[ProposalRequest]) -> Proposals:
        self.calls.append(len(requests))
        out = []
        for r in requests:
            prompt = tuple(r.token_ids[: r.num_prompt_tokens])
            done = len(r.token_ids) - r.num_prompt_tokens
            cont = list(self.refs[prompt][done: done + r.k])
            out.append([(t + 1) % self.vocab if (done + j) % 3 == 2 else t for j, t in enumerate(cont)])
        return Proposals(out)


class GarbageProposer(Proposer):
    """Always proposes k tokens the model would never pick first (token 0 repeated)."""

    def __init__(self) -> None:
        self.proposed = 0

    def propose(self, requests: list[ProposalRequest]) -> Proposals:
        self.proposed += sum(r.k for r in requests)
        return Proposals([[0] * r.k for r in requests])


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    """A different tiny random Llama (1 layer) as the draft model."""
    path = tmp_path_factory.mktemp("tiny_draft")
    make_hf_model(tiny_config(num_hidden_layers=1), seed=5).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def refs16(tiny_llama_dir):
    _, hf = tiny_llama_dir
    # repeated chunks so n-gram lookup finds matches in the prompt
    prompts = [p * 3 for p in mixed_prompts(16, seed=7, lo=2, hi=20)]
    return prompts, [hf_greedy(hf, p, GREEDY.max_tokens) for p in prompts]


def _spec(method: str, draft=None, **kw) -> SpeculativeConfig:
    kw.setdefault("adaptive", False)
    kw.setdefault("disable_above_batch_size", None)
    kw.setdefault("max_step_rows", None)
    return SpeculativeConfig(method=method, draft_model=None if draft is None else str(draft), **kw)


BATCHES = {
    "one-batch": dict(num_kv_blocks=512, max_num_batched_tokens=4096),
    "chunked-prefill": dict(num_kv_blocks=512, max_num_batched_tokens=24),
    "preemption": dict(num_kv_blocks=40, max_num_batched_tokens=64),
    "preemption-swap": dict(num_kv_blocks=40, max_num_batched_tokens=64, preemption_mode="swap"),
    "no-prefix-cache": dict(num_kv_blocks=512, max_num_batched_tokens=64, enable_prefix_caching=False),
}


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("method", ["ngram", "draft", "self-draft", "lookup-first", "oracle"])
def test_greedy_identical_with_speculation(tiny_llama_dir, draft_dir, refs16, batch, method):
    path, _ = tiny_llama_dir
    prompts, refs = refs16
    proposer = OracleProposer(prompts, refs) if method == "oracle" else None
    # fixed k: the test is about exactness, not the adaptive policy; "draft" and "self-draft" run the draft model
    # alone, "lookup-first" the default for a draft model (prompt lookup, the self-draft where it finds nothing)
    spec = {"ngram": _spec("ngram"), "draft": _spec("draft", draft_dir, draft_ngram_first=False),
            "self-draft": _spec("draft", path, draft_ngram_first=False), "lookup-first": _spec("draft", path),
            "oracle": _spec("ngram")}[method]
    engine = Engine(load_model(path, torch.float32, torch.device("cpu")),
                    EngineConfig(model=str(path), block_size=4, speculative=spec, **BATCHES[batch]),
                    proposer=proposer)
    # a mixed batch: every 4th request wants logprobs (drafted too), every 5th stops earlier
    params = [SamplingParams(max_tokens=12 if i % 5 else 7, temperature=0, ignore_eos=True,
                             logprobs=0 if i % 4 == 3 else None) for i in range(len(prompts))]
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == [r[: p.max_tokens] for r, p in zip(refs, params)]
    stats = engine.stats().spec_decode
    if method != "ngram":  # a random model rarely repeats its prompt: n-gram lookup may find nothing to draft
        assert stats.num_drafts > 0
    if method in ("self-draft", "lookup-first", "oracle"):
        assert stats.num_accepted_tokens > 0
    if method == "oracle":
        assert stats.num_accepted_tokens < stats.num_draft_tokens  # rejections happened (rollback exercised)
    if batch.startswith("preemption"):
        assert engine.stats().num_preemptions > 0
    assert all(len(o.logprobs) == len(o.token_ids) for o, p in zip(outs, params) if p.logprobs is not None)
    assert engine.kv.num_held_blocks() == 0
    assert isinstance(engine.spec.proposer, NgramFirstProposer) == (method == "lookup-first")
    draft = getattr(engine.spec.proposer, "draft", engine.spec.proposer)  # NgramFirstProposer wraps the model
    if method in ("draft", "self-draft", "lookup-first"):
        assert isinstance(draft, PagedDraftProposer)
        assert draft.kv.num_held_blocks() == 0 and not draft.seqs


def test_prefix_cache_holds_only_verified_tokens(tiny_llama_dir, refs16):
    path, _ = tiny_llama_dir
    prompts, refs = refs16
    proposer = GarbageProposer()  # every draft (a whole block of them at k = block size) is rejected
    engine = Engine(load_model(path, torch.float32, torch.device("cpu")),
                    EngineConfig(model=str(path), block_size=4, num_kv_blocks=512,
                                 speculative=_spec("ngram", num_speculative_tokens=4)), proposer=proposer)
    outs = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == refs
    assert proposer.proposed > 0 and engine.stats().spec_decode.num_accepted_tokens == 0
    verified = set()
    for p, o in zip(prompts, outs):
        tokens = p + o.token_ids
        verified.update(hash_full_blocks(tokens, 4, len(tokens) // 4))
    cached = set(engine.kv.pool._cached)
    assert cached and cached <= verified
    # the cached K/V are right: a second round served from the cache gives the same tokens
    outs2 = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs2] == refs and all(o.num_cached_tokens > 0 for o in outs2)
    assert engine.kv.num_held_blocks() == 0


def test_counters_per_request_domain_and_global(tiny_llama_dir):
    path, _ = tiny_llama_dir
    engine = Engine.from_pretrained(path, num_kv_blocks=128, block_size=4,
                                    speculative=_spec("draft", path, num_speculative_tokens=4))
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    a = engine.add_request([5, 6, 7], params, domain="chat")
    b = engine.add_request([9, 10, 11, 12], params, domain="code")
    final = {}
    while engine.has_unfinished():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    # self-draft accepts everything: t1 from prefill, then 4 drafts (+ bonus) -> t2..t6, then 3 drafts -> t7..t10
    for rid in (a, b):
        s = final[rid].spec_decode
        assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (2, 7, 7)
        assert s.num_accepted_tokens_per_pos == [2, 2, 2, 1]
    stats = engine.stats()
    assert stats.spec_decode.num_draft_tokens == 14 and stats.spec_decode.acceptance_rate == 1.0
    assert stats.spec_decode.mean_acceptance_length == 1 + 14 / 4
    assert set(stats.spec_decode_per_domain) == {"chat", "code"}
    assert stats.spec_decode_per_domain["chat"].num_accepted_tokens == 7
    assert stats.num_steps == 3


def test_speculation_off_at_large_batch_and_adaptive_length(tiny_llama_dir):
    path, _ = tiny_llama_dir
    spy = OracleProposer([], [])
    spy.propose = lambda reqs: (spy.calls.append(len(reqs)), Proposals([[0] * r.k for r in reqs]))[1]
    engine = Engine(load_model(path, torch.float32, torch.device("cpu")),
                    EngineConfig(model=str(path), block_size=4, num_kv_blocks=128,
                                 speculative=_spec("ngram", adaptive=True, disable_above_batch_size=3)),
                    proposer=spy)
    # a fixed draft cost of 0.2 steps instead of the measured one (a tiny model's timings are noise)
    engine.spec.cost = None
    engine.spec.adaptive = AdaptiveSpeculation(dataclasses.replace(engine.spec.adaptive.config, cost_ratio=0.2))
    short = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    long = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    outs = engine.generate([[5, 6, 7], [8, 9, 10], [11, 12, 13]], [short, short, long])
    # drafting started only once fewer than 3 requests ran, i.e. after the short ones finished
    assert spy.calls and max(spy.calls) == 1
    s = outs[2].spec_decode
    # always rejected: the adaptive length drops to 0 and only probes remain, backing off (8 x 2, 8 x 4, ... steps)
    assert s.num_accepted_tokens == 0
    assert s.num_draft_tokens < 10 and 2 <= s.num_drafts <= 4


class FakeClock:
    """Seconds that pass only where a test says: the measured costs never depend on the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SlowProposer(OracleProposer):
    """The oracle's (mostly right) drafts, `delay` seconds per call on the injected clock: a draft model far
    costlier than the target."""

    def __init__(self, prompts, refs, delay: float, clock: FakeClock) -> None:
        super().__init__(prompts, refs)
        self.delay, self.clock = delay, clock

    def propose(self, requests):
        self.clock.now += self.delay
        return super().propose(requests)


TARGET_STEP_S = 0.01  # what one target step costs on the injected clock


@pytest.mark.parametrize("delay, speculates", [(0.0, True), (0.25, False)])
def test_measured_cost_ratio_switches_off_a_draft_that_costs_more_than_it_returns(tiny_llama_dir, refs16, delay,
                                                                                  speculates, monkeypatch):
    path, _ = tiny_llama_dir
    monkeypatch.setattr("accel.speculative.adaptive.PROBE_INTERVAL", 64)  # no probe within these 12 tokens
    prompts, refs = refs16
    clock = FakeClock()
    proposer = SlowProposer(prompts[:1], refs[:1], delay, clock)
    engine = Engine(load_model(path, torch.float32, torch.device("cpu")),
                    EngineConfig(model=str(path), block_size=4, num_kv_blocks=128,
                                 speculative=_spec("ngram", adaptive=True, num_speculative_tokens=4)),
                    proposer=proposer, clock=clock)
    execute = engine.runner.execute

    def timed_execute(*args, **kwargs):
        clock.now += TARGET_STEP_S
        return execute(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "execute", timed_execute)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    (out,) = engine.generate(prompts[:1], params)
    assert out.token_ids == refs[0][:12]
    meter = engine.spec.cost
    assert meter is not None and meter.propose_ratio is not None
    # acceptance is 2 in 3 either way; only the measured cost differs: 0 against 25 target steps a draft
    if speculates:
        assert meter.propose_ratio == 0.0 and len(proposer.calls) >= 3
    else:
        assert meter.propose_ratio > 5.0 and len(proposer.calls) == 1  # one measured draft, then k = 0


def test_step_row_cap_gives_the_drafts_to_the_best_requests(tiny_llama_dir):
    path, hf = tiny_llama_dir
    spy = OracleProposer([], [])
    ks: list[list[int]] = []
    spy.propose = lambda reqs: (ks.append([r.k for r in reqs]), Proposals([[0] * r.k for r in reqs]))[1]
    engine = Engine(load_model(path, torch.float32, torch.device("cpu")),
                    EngineConfig(model=str(path), block_size=4, num_kv_blocks=128,
                                 speculative=_spec("ngram", num_speculative_tokens=4, max_step_rows=6)), proposer=spy)
    prompts = [[5, 6, 7], [8, 9, 10, 11], [12, 13]]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, 8) for p in prompts]
    # first decode step: 3 decode rows leave 3 draft tokens, all to one request (k_max 4 cut to 3)
    assert ks[0] == [3]
    assert all(sum(k) <= 5 and max(k) <= 4 for k in ks)  # never more than 6 rows (>= 1 decode row)
    with pytest.raises(ValueError, match="max_step_rows=1 is invalid"):
        SpeculativeConfig(method="ngram", max_step_rows=1)


def test_mismatched_draft_tokenizer_is_refused(tmp_path):
    from tests.conftest import make_tiny_tokenizer, save_tiny_model

    target = save_tiny_model(tmp_path / "target")
    draft = save_tiny_model(tmp_path / "draft", seed=1)
    tok = make_tiny_tokenizer()
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(draft)
    with pytest.raises(TokenizerMismatchError, match="does not share the tokenizer"):
        Engine.from_pretrained(target, num_kv_blocks=64, speculative=SpeculativeConfig(method="draft", draft_model=str(draft)))


# ---- temperature > 0: the output distribution is exactly the target's --------------------------------------
V = 8
PROMPT = [3, 5, 7, 3, 5, 1]
SAMPLED = dict(temperature=0.9, top_k=6, top_p=0.95)


def _exact_joint(hf, params: SamplingParams, steps: int) -> torch.Tensor:
    """P(t_1 .. t_steps) of the target under params' processing: [V] * steps."""
    joint = torch.ones(1)
    prefixes = [[]]
    sampler = Sampler()
    for _ in range(steps):
        ids = torch.tensor([PROMPT + p for p in prefixes])
        with torch.no_grad():
            logits = hf(ids).logits[:, -1].float()  # [P, V]
        probs = sampler.probs(logits, [params] * len(prefixes), [PROMPT] * len(prefixes), prefixes)
        joint = (joint[:, None] * probs).reshape(-1)
        prefixes = [p + [t] for p in prefixes for t in range(V)]
    return joint.reshape([V] * steps)


def _chi_square_ok(counts: torch.Tensor, expected_p: torch.Tensor, n: int) -> tuple[float, float]:
    """Pearson chi-square (cells with expected < 5 pooled) and its p = 0.001 critical value (Wilson-Hilferty)."""
    exp = expected_p.reshape(-1) * n
    obs = counts.reshape(-1).double()
    small = exp < 5
    e = torch.cat([exp[~small], exp[small].sum().reshape(1)])
    o = torch.cat([obs[~small], obs[small].sum().reshape(1)])
    keep = e > 0
    stat = float(((o[keep] - e[keep]) ** 2 / e[keep]).sum())
    df = int(keep.sum()) - 1
    z = 3.09  # one-sided 0.001
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit


@pytest.mark.parametrize("method, bias", [("draft", {}), ("ngram", {}), ("draft", {3: 1.5, 4: -100.0})])
def test_sampled_output_follows_the_target_distribution(tmp_path, method, bias):
    cfg = tiny_config(vocab_size=V, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.1)
    hf = make_hf_model(cfg, seed=11)
    hf.save_pretrained(tmp_path / "target")
    make_hf_model(cfg, seed=12).save_pretrained(tmp_path / "draft")  # a different model: q != p
    spec = _spec(method, tmp_path / "draft" if method == "draft" else None, num_speculative_tokens=3,
                 ngram_min_n=1, ngram_max_n=2)
    engine = Engine.from_pretrained(tmp_path / "target", num_kv_blocks=4096, block_size=4, max_num_seqs=512,
                                    max_num_batched_tokens=8192, max_waiting=4096,
                                    speculative=spec)
    n = 3000
    params = [SamplingParams(max_tokens=4, ignore_eos=True, seed=i, logit_bias=bias, **SAMPLED) for i in range(n)]
    outs = engine.generate([PROMPT] * n, params)
    tokens = torch.tensor([o.token_ids for o in outs])  # [n, 4]
    stats = engine.stats().spec_decode
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # both acceptance and rejection happened
    exact = _exact_joint(hf, SamplingParams(max_tokens=4, logit_bias=bias, **SAMPLED), 4)  # [V, V, V, V]
    if bias:
        assert not (tokens == 4).any()  # banned, drafted or not
    for dims, marginal in (((1, 2), exact.sum((0, 3))), ((2, 3), exact.sum((0, 1)))):
        counts = torch.zeros(V, V)
        counts.index_put_((tokens[:, dims[0]], tokens[:, dims[1]]), torch.ones(n), accumulate=True)
        stat, crit = _chi_square_ok(counts, marginal, n)
        assert stat < crit, f"tokens {dims}: chi-square {stat:.1f} >= critical {crit:.1f}"
        tv = 0.5 * float((counts / n - marginal).abs().sum())
        assert tv < 0.08, f"tokens {dims}: total variation {tv:.3f}"


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_self_draft_keeps_greedy_output(tiny_llama_dir, refs16, scheme):
    path, _ = tiny_llama_dir
    prompts, refs = refs16
    engine = Engine.from_pretrained(path, num_kv_blocks=512, block_size=4,
                                    speculative=_spec("draft", path, draft_quantization=scheme))
    outs = engine.generate(prompts[:6], GREEDY)
    assert [o.token_ids for o in outs] == refs[:6]
    # a quantized copy of the target agrees often (int4 with group 64 on a random 64-wide model: less so)
    assert engine.stats().spec_decode.acceptance_rate > (0.5 if scheme == "int8" else 0.1)


def test_logit_bias_steers_greedy_rows_alike_with_and_without_speculation(tiny_llama_dir, refs16):
    """logit_bias (OpenAI's: added to the raw logits) bans (-100) or forces (+100) tokens of greedy rows in a mixed
    batch; drafts of the unbiased continuation are verified against the biased target, so speculation changes
    nothing."""
    path, _ = tiny_llama_dir
    prompts, refs = refs16

    def params(i: int) -> SamplingParams:
        bias = {refs[i][0]: -100.0} if i % 3 == 0 else {7: 100.0} if i % 3 == 1 else {}
        return SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logit_bias=bias)

    ps = [params(i) for i in range(len(prompts))]
    outs = {}
    for name, spec, proposer in (("plain", None, None), ("oracle", _spec("ngram"), OracleProposer(prompts, refs))):
        engine = Engine(load_model(path, torch.float32, torch.device("cpu")),
                        EngineConfig(model=str(path), block_size=4, num_kv_blocks=512, speculative=spec),
                        proposer=proposer)
        outs[name] = [o.token_ids for o in engine.generate(prompts, ps)]
    assert outs["oracle"] == outs["plain"]
    for i, toks in enumerate(outs["plain"]):
        if i % 3 == 0:
            assert toks[0] != refs[i][0]
        elif i % 3 == 1:
            assert toks == [7] * 8
        else:
            assert toks == refs[i][:8]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_drafted_requests_report_the_targets_logprobs(tiny_llama_dir, refs16, temperature):
    """Logprobs of a drafted request are the target's raw ones at each accepted position (from its verify row), as
    decoding without drafts reports them; rejections and bonus tokens included."""
    path, _ = tiny_llama_dir
    prompts, refs = refs16
    params = [SamplingParams(max_tokens=10, temperature=temperature, seed=i, ignore_eos=True, logprobs=2)
              for i in range(len(prompts))]
    outs = {}
    for name, spec, proposer in (("plain", None, None), ("oracle", _spec("ngram"), OracleProposer(prompts, refs))):
        engine = Engine(load_model(path, torch.float32, torch.device("cpu")),
                        EngineConfig(model=str(path), block_size=4, num_kv_blocks=512, speculative=spec),
                        proposer=proposer)
        outs[name] = engine.generate(prompts, params)
        if spec is not None:
            stats = engine.stats().spec_decode
            assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    if temperature == 0.0:
        assert [o.token_ids for o in outs["oracle"]] == [o.token_ids for o in outs["plain"]]
        for a, b in zip(outs["oracle"], outs["plain"]):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)
            assert [[t for t, _ in x] for x in a.top_logprobs] == [[t for t, _ in x] for x in b.top_logprobs]
    # sampled or not: each reported logprob is the target's at that position given the tokens before it
    _, hf = tiny_llama_dir
    for p, o in zip(prompts, outs["oracle"]):
        with torch.no_grad():
            logp = hf(torch.tensor([p + o.token_ids])).logits[0, len(p) - 1:-1].float().log_softmax(-1)
        want = logp.gather(1, torch.tensor(o.token_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(o.logprobs), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_structured_requests_are_drafted_and_never_emit_a_draft_the_grammar_refuses(tmp_path, temperature):
    """Drafts of a constrained request are checked against its grammar row by row (`Matcher.mask_span`): an oracle
    drafting the unconstrained continuation (mostly not JSON) leaves greedy output as it is without drafts, and every
    reply, greedy or sampled, is the schema's."""
    import json

    from accel.runtime.sampling_params import StructuredOutput
    from tests.conftest import save_tiny_model

    d = save_tiny_model(tmp_path / "m")
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "yy", "zzz"]}, "b": {"type": "boolean"},
                                               "c": {"type": "array", "items": {"enum": [1, 2]}, "maxItems": 4}},
              "required": ["a", "b", "c"], "additionalProperties": False}
    prompts = [[5 + i, 9, 17, 30 + i, 9, 17] * 3 for i in range(6)]
    free = Engine.from_pretrained(d, num_kv_blocks=256, block_size=4)
    refs = [o.token_ids for o in free.generate(prompts, SamplingParams(max_tokens=40, temperature=0))]
    params = [SamplingParams(max_tokens=60, temperature=temperature, seed=i,
                             structured=StructuredOutput(json_schema=json.dumps(schema))) for i in range(6)]
    outs = {}
    for name, spec, proposer in (("plain", None, None), ("oracle", _spec("ngram"), OracleProposer(prompts, refs))):
        engine = Engine(load_model(d, torch.float32, torch.device("cpu")),
                        EngineConfig(model=str(d), block_size=4, num_kv_blocks=256, speculative=spec),
                        proposer=proposer, tokenizer=free.tokenizer)
        outs[name] = engine.generate(prompts, params)
        if spec is not None:
            assert engine.stats().spec_decode.num_draft_tokens > 0
    for o in outs["plain"] + outs["oracle"]:
        value = json.loads(o.text)
        assert o.finish_reason == "stop" and set(value) == {"a", "b", "c"}
    if temperature == 0.0:
        assert [o.token_ids for o in outs["oracle"]] == [o.token_ids for o in outs["plain"]]


@pytest.mark.parametrize("delay", [0.0, 0.1])
def test_the_rate_gate_switches_off_a_draft_the_cost_model_keeps(tiny_llama_dir, delay, monkeypatch):
    """A draft whose real cost the adaptive lengths do not see (a fixed cost ratio of 0.2 while each draft call takes
    10 target steps on the injected clock) is switched off on measured tokens per second; the same draft at no cost
    keeps drafting. Output is the target's greedy text either way."""
    path, hf = tiny_llama_dir
    prompt = [5, 6, 7]
    ref = hf_greedy(hf, prompt, 160)
    clock = FakeClock()

    class Exact(SlowProposer):  # every draft token right: acceptance alone says draft
        def propose(self, requests):
            self.clock.now += self.delay
            self.calls.append(len(requests))
            return Proposals([list(ref[len(r.token_ids) - len(prompt):][:r.k]) for r in requests])

    proposer = Exact([prompt], [ref], delay, clock)
    engine = Engine(load_model(path, torch.float32, torch.device("cpu")),
                    EngineConfig(model=str(path), block_size=4, num_kv_blocks=128,
                                 speculative=_spec("ngram", adaptive=True, num_speculative_tokens=2)),
                    proposer=proposer, clock=clock)
    engine.spec.cost = None
    engine.spec.adaptive = AdaptiveSpeculation(dataclasses.replace(engine.spec.adaptive.config, cost_ratio=0.2))
    execute = engine.runner.execute

    def timed_execute(sched, *args, **kwargs):
        clock.now += TARGET_STEP_S * sched.num_steps
        return execute(sched, *args, **kwargs)

    monkeypatch.setattr(engine.runner, "execute", timed_execute)
    (out,) = engine.generate([prompt], SamplingParams(max_tokens=160, temperature=0, ignore_eos=True))
    assert out.token_ids == ref
    gate = engine.spec.gate
    if delay:
        # 3 tokens per 0.11 s drafting against 100 tok/s plain: drafting measured for a phase, re-measured for one
        assert gate.winner is False and len(proposer.calls) <= 2 * 16
        assert clock.now < 1.3 * 160 * TARGET_STEP_S + 2 * 16 * delay
    else:
        assert gate.winner is True and len(proposer.calls) >= 40  # 3 tokens a step: most of the 160 drafted
