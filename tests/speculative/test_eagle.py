"""EAGLE-style feature draft: teacher features, trainer <-> runtime equivalence, exact speculation, training."""

from __future__ import annotations

import json
import time

import pytest
import torch

from accel.draft_training.eagle_train import (EagleTrainer, attach_teacher, eagle_loss, engine_feature_samples,
                                              heldout_agreement)
from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams
from accel.speculative.config import SpeculativeConfig
from accel.speculative.eagle import EagleProposer, is_eagle_draft, load_eagle_draft, save_eagle_draft
from accel.speculative.proposer import ProposalRequest

PROMPTS = [[1, 5, 6, 7, 8], [1, 9, 10, 11], [1, 5, 6, 7, 8, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42]]


def _target(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _trainer(target, vocab_ids, seed=0):
    """An EagleTrainer with every weight perturbed (a fresh one starts from identities)."""
    torch.manual_seed(seed)
    head = target.lm_head.weight.detach()[torch.tensor(vocab_ids)]
    m = EagleTrainer(target.config, head, target.model.norm.weight.detach())
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def _save(tmp_path, tiny_model_dir, vocab_ids, seed=0):
    target = _target(tiny_model_dir)
    m = _trainer(target, vocab_ids, seed)
    out = save_eagle_draft(tmp_path / "eagle", target.config, m.runtime_state(), vocab_ids, {"note": "test"},
                           tokenizer_dir=tiny_model_dir)
    return target, m, out


def test_engine_features_are_the_targets_teacher_forced_hidden_states(tiny_model_dir):
    target = _target(tiny_model_dir)
    samples = engine_feature_samples(tiny_model_dir, PROMPTS, 10, [2], time.monotonic() + 600)
    assert len(samples) == 3
    for s in samples:
        assert s.token_ids[: s.num_prompt] in PROMPTS and s.features.shape == (len(s.token_ids) - 1, 64)
        with torch.no_grad():
            out = target(torch.tensor([s.token_ids]), output_hidden_states=False)
            h = target.model(input_ids=torch.tensor([s.token_ids])).last_hidden_state[0, :-1]
        torch.testing.assert_close(s.features, h, atol=1e-4, rtol=1e-4)
        # the replies are the target's greedy tokens
        assert out.logits[0, s.num_prompt - 1: -1].argmax(-1).tolist() == s.token_ids[s.num_prompt:]


def test_teacher_is_the_targets_distribution_over_the_draft_vocabulary(tiny_model_dir):
    target = _target(tiny_model_dir)
    samples = engine_feature_samples(tiny_model_dir, PROMPTS[:1], 8, [2], time.monotonic() + 600)
    vid = torch.arange(0, 320, 3)
    rows = target.lm_head.weight.detach()[vid]
    attach_teacher(samples, rows, top_m=5)
    s = samples[0]
    assert s.top_ids.shape == (len(s.token_ids) - 2, 5)
    full = (s.features[1:] @ rows.T).log_softmax(-1)
    torch.testing.assert_close(full.topk(5, -1).values, s.top_logprobs)


def test_trainer_and_runtime_draft_compute_the_same_features(tmp_path, tiny_model_dir):
    from accel.runtime.kv_cache_manager import KVCacheManager
    from accel.runtime.config import RuntimeConfig
    from accel.runtime.model_runner import ModelRunner, RunnerConfig
    from accel.runtime.outputs import ScheduledRequest
    from accel.runtime.sequence import Sequence

    vocab = list(range(0, 320, 2))
    target, trainer, folder = _save(tmp_path, tiny_model_dir, vocab)
    assert is_eagle_draft(folder) and not is_eagle_draft(tiny_model_dir)
    embed = target.get_input_embeddings().weight.detach()
    draft, vocab_ids = load_eagle_draft(folder, target.get_input_embeddings(), torch.float32, torch.device("cpu"))
    assert vocab_ids == vocab
    tokens = list(range(3, 40))
    feats = torch.randn(len(tokens), 64)
    with torch.no_grad():
        want = trainer.eval()(embed[torch.tensor(tokens)][None], feats[None], torch.ones(1, len(tokens)))[0]
    runner = ModelRunner(draft, RunnerConfig(8, RuntimeConfig(block_size=16)))
    kv = KVCacheManager(8, 16, enable_prefix_caching=False)
    seq = Sequence("r", tokens, SamplingParams(temperature=0))
    kv.allocate_slots(seq, len(tokens))
    ids, pos, meta, _ = runner.prepare_inputs([ScheduledRequest(seq, len(tokens))])
    with torch.inference_mode():
        got = draft(ids, pos, meta, runner.kv_caches, features=feats)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3)
    with pytest.raises(ValueError, match="features"):
        draft(ids, pos, meta, runner.kv_caches)


def test_load_refuses_a_target_of_another_shape(tmp_path, tiny_model_dir):
    _, _, folder = _save(tmp_path, tiny_model_dir, list(range(0, 320, 2)))
    with pytest.raises(ValueError, match="embedding of shape"):
        load_eagle_draft(folder, torch.nn.Embedding(100, 64), torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="not an EAGLE draft"):
        load_eagle_draft(tiny_model_dir, torch.nn.Embedding(320, 64), torch.float32, torch.device("cpu"))


def _alone(folder, **kw):
    """The EAGLE draft on its own (no prompt lookup first): these tests are about the draft."""
    return SpeculativeConfig(method="draft", draft_model=str(folder), draft_ngram_first=False, **kw)


def _run(model_dir, prompts, params, spec=None, **kw):
    engine = Engine.from_pretrained(model_dir, speculative=spec, **kw)
    outs = engine.generate(prompts, params)
    return [o.token_ids for o in outs], engine


@pytest.mark.parametrize("k", [1, 3])
def test_eagle_speculation_is_token_identical_greedy(tmp_path, tiny_model_dir, k):
    _, _, folder = _save(tmp_path, tiny_model_dir, list(range(320)))
    params = SamplingParams(max_tokens=24, temperature=0)
    # the third prompt shares a 16-token block with a fourth: a prefix-cache hit whose features are reused
    prompts = PROMPTS + [PROMPTS[2][:16] + [50, 51, 52]]
    ref, _ = _run(tiny_model_dir, prompts, params)
    spec = _alone(folder, adaptive=False, num_speculative_tokens=k,
                      disable_above_batch_size=None, max_step_rows=None)
    out, engine = _run(tiny_model_dir, prompts, params, spec)
    assert out == ref
    stats = engine.stats().spec_decode
    assert stats.num_draft_tokens > 0 and len(stats.num_accepted_tokens_per_pos) == k
    # one at a time (batch 1) as well
    for p, r in zip(prompts, ref):
        assert _run(tiny_model_dir, [p], params, spec)[0] == [r]


def test_an_oracle_draft_is_fully_accepted(tmp_path, tiny_model_dir):
    """A proposer whose features are replaced by the target's true next features proposes the target's token:
    the first draft token of every step is accepted (checks the feature alignment x_{i+1} <-> f_i)."""
    target = _target(tiny_model_dir)
    vocab = list(range(320))
    _, _, folder = _save(tmp_path, tiny_model_dir, vocab)
    spec = _alone(folder, adaptive=False, num_speculative_tokens=1,
                      disable_above_batch_size=None, max_step_rows=None)
    engine = Engine.from_pretrained(tiny_model_dir, speculative=spec)
    proposer = engine.spec.proposer
    assert isinstance(proposer, EagleProposer)
    seen = []

    def oracle(ids, pos, meta, kv, features):
        # the real f_{i+1} of the last position: teacher-force the target on the verified tokens + nothing else
        seen.append(features.shape[0])
        toks = torch.tensor([proposer._oracle_tokens])
        h = target.model(input_ids=toks).last_hidden_state[0]
        out = torch.zeros(ids.shape[0], h.shape[1])
        out[-1] = h[-1]
        return out

    real_propose = proposer.propose

    def propose(reqs):
        proposer._oracle_tokens = reqs[0].token_ids
        return real_propose(reqs)

    proposer.propose = propose
    proposer.model.forward = oracle
    proposer.model.native_decode = None  # the module path, whose forward is the oracle
    proposer.model.lm_head = target.lm_head
    engine.generate([PROMPTS[0]], SamplingParams(max_tokens=12, temperature=0))
    s = engine.stats().spec_decode
    assert s.num_drafts > 3 and s.num_accepted_tokens == s.num_draft_tokens
    assert seen[0] == len(PROMPTS[0]) and all(n <= 2 for n in seen[1:])  # catch-up: accepted + bonus only


def test_eagle_sampling_returns_draft_distributions(tmp_path, tiny_model_dir):
    _, _, folder = _save(tmp_path, tiny_model_dir, list(range(0, 320, 2)))
    engine = Engine.from_pretrained(tiny_model_dir, speculative=_alone(
        folder, adaptive=False, num_speculative_tokens=2))
    proposer = engine.spec.proposer
    engine.generate([PROMPTS[0]], SamplingParams(max_tokens=4, temperature=0))  # fills the feature cache
    seq_tokens = PROMPTS[1]
    rid = engine.add_request(seq_tokens, SamplingParams(max_tokens=2, temperature=0))
    engine.step()
    seq = next(s for s in engine.scheduler.running if s.request_id == rid)
    props = proposer.propose([ProposalRequest(seq.token_ids, 2, rid, seq.num_prompt_tokens,
                                              SamplingParams(temperature=0.8, top_k=20), None, seq.block_tables[0])])
    q = props.probs[0]
    assert q.shape == (len(props.token_ids[0]), 320)
    torch.testing.assert_close(q.sum(-1), torch.ones(q.shape[0]))
    assert float(q[:, 1::2].sum()) == 0.0  # nothing outside the draft vocabulary
    with pytest.raises(ValueError, match="block table"):
        proposer.propose([ProposalRequest(seq.token_ids, 1, "x")])


def test_swap_keeps_the_features_of_preempted_requests(tiny_model_dir):
    engine = Engine.from_pretrained(tiny_model_dir)
    runner = engine.runner
    runner.enable_feature_cache()
    feats = runner.feature_cache.view(runner.config.num_blocks, runner.config.runtime.block_size, -1)
    feats[3] = 7.0
    runner.swap({"a": [[(0, 3)]]}, {})  # group 0, table index 0: block 3
    feats[3] = 0.0
    runner.swap({}, {"a": [[(0, 5)]]})
    assert bool((feats[5] == 7.0).all())


@pytest.mark.parametrize("ce_fraction", [1.0, 0.25])
def test_training_lowers_the_loss_and_measures_agreement(tiny_model_dir, ce_fraction):
    target = _target(tiny_model_dir)
    samples = engine_feature_samples(tiny_model_dir, PROMPTS * 3, 12, [2], time.monotonic() + 600)
    vid = torch.arange(320)
    rows = target.lm_head.weight.detach()
    attach_teacher(samples, rows)
    embed = target.get_input_embeddings().weight.detach()
    m = EagleTrainer(target.config, rows, target.model.norm.weight.detach())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    # decayed to 0: at a constant 1e-2 the last iterate's agreement swung 0.0-0.8 with the seed and the features'
    # last bits; decayed, 0.54-0.85 over 4 seeds and both ce fractions
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1 - i / 200)
    first = None
    for _ in range(200):
        reg, ce = eagle_loss(m, samples, embed, 0.1, ce_fraction=ce_fraction)
        loss = reg + 0.1 * ce
        first = first if first is not None else float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    assert float(loss.detach()) < 0.5 * first
    first_token, second = heldout_agreement(m, samples, embed, vid)
    assert first_token > 0.5 and second > 0.5  # memorised: these replies are the training data


def test_a_saved_draft_loads_back_as_the_same_trainer(tmp_path, tiny_model_dir):
    from accel.draft_training.eagle_train import _pad_batch, load_trainer

    target, m, folder = _save(tmp_path, tiny_model_dir, list(range(0, 320, 2)))
    back, vid = load_trainer(folder, target)
    assert vid.tolist() == list(range(0, 320, 2))
    samples = engine_feature_samples(tiny_model_dir, PROMPTS, 4, [2], time.monotonic() + 600)
    emb, feats, mask = _pad_batch(samples, target.get_input_embeddings().weight.detach())
    with torch.no_grad():
        torch.testing.assert_close(back(emb, feats, mask), m.eval()(emb, feats, mask))
    torch.testing.assert_close(back.head, m.head.detach())


def test_chain_forward_first_step_is_the_plain_forward_and_second_sees_its_guess(tiny_model_dir):
    target = _target(tiny_model_dir)
    samples = engine_feature_samples(tiny_model_dir, PROMPTS, 6, [2], time.monotonic() + 600)
    embed = target.get_input_embeddings().weight.detach()
    m = EagleTrainer(target.config, target.lm_head.weight.detach(), target.model.norm.weight.detach()).eval()
    from accel.draft_training.eagle_train import _pad_batch

    emb, feats, mask = _pad_batch(samples, embed)
    with torch.no_grad():
        out1, out2 = m.chain_forward(emb, feats, mask)
        plain = m(emb, feats, mask)
        assert torch.allclose(out1[mask.bool()], plain[mask.bool()], atol=1e-5)
        # the second step at j of sample 0, run the way the runtime chains it: real features < j, then the guess
        j = 3
        seq_feats = torch.cat([feats[:1, :j], plain[:1, j - 1: j]], 1)
        chained = m(emb[:1, : j + 1], seq_feats, torch.ones(1, j + 1, dtype=torch.long))
        assert torch.allclose(out2[0, j], chained[0, j], atol=1e-5)


def test_train_eagle_writes_a_loadable_folder(tmp_path, tiny_model_dir):
    from accel.draft_training.eagle_train import train_eagle

    cal = tmp_path / "cal"
    cal.mkdir()
    rows = [{"id": f"c{i}", "domain": "chat", "text": f"User: tell me about fox {i}\nAssistant: a fox."}
            for i in range(6)] + [{"id": f"p{i}", "domain": "prose", "text": f"The quick brown fox {i}."}
                                  for i in range(3)]
    (cal / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    res = train_eagle(tiny_model_dir, tmp_path / "draft", time_budget_minutes=0.25, calibration_dir=cal,
                      num_prompts=9, max_new_tokens=8, draft_vocab_size=64, progress=False)
    assert res.num_steps > 0 and 0.0 <= res.heldout_top1 <= 1.0 and 0.0 <= res.heldout_second <= 1.0 and res.draft_vocab_size == 64
    assert is_eagle_draft(tmp_path / "draft") and not (tmp_path / "draft.partial").exists()
    meta = json.loads((tmp_path / "draft" / "accel_draft.json").read_text())
    assert len(meta["vocab_ids"]) == 64 and meta["train"]["num_steps"] == res.num_steps
    assert 0 <= res.num_model_written_prompts <= res.num_prompts
    out, _ = _run(tiny_model_dir, PROMPTS[:2], SamplingParams(max_tokens=8, temperature=0),
                  _alone(tmp_path / "draft", adaptive=False))
    assert out == _run(tiny_model_dir, PROMPTS[:2], SamplingParams(max_tokens=8, temperature=0))[0]


def _fox_calibration(tmp_path):
    cal = tmp_path / "cal"
    cal.mkdir(exist_ok=True)
    rows = [{"id": f"c{i}", "domain": "chat", "text": f"User: tell me about fox {i}\nAssistant: a fox."}
            for i in range(6)] + [{"id": f"p{i}", "domain": "prose", "text": f"The quick brown fox {i}."}
                                  for i in range(3)]
    (cal / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return cal


def test_train_eagle_init_from_goes_on_from_the_saved_draft(tmp_path, tiny_model_dir):
    """A continuation starts from the folder's weights and vocabulary (at learning rate 0 it saves them back
    unchanged, so the run did load them) and keeps the earlier run's training record under history."""
    from safetensors.torch import load_file

    from accel.draft_training.eagle_train import train_eagle

    target, _, first = _save(tmp_path, tiny_model_dir, list(range(0, 320, 3)))
    meta = json.loads((first / "accel_draft.json").read_text())
    meta["train"] = {"num_steps": 7, "seed": 0}
    (first / "accel_draft.json").write_text(json.dumps(meta))
    res = train_eagle(tiny_model_dir, tmp_path / "cont", time_budget_minutes=0.25,
                      calibration_dir=_fox_calibration(tmp_path), num_prompts=9, max_new_tokens=8,
                      draft_vocab_size=64, learning_rate=0.0, model_written_fraction=0.0, seed=1, init_from=first,
                      progress=False)
    assert res.num_steps > 0 and res.draft_vocab_size == len(range(0, 320, 3))  # the folder's, not 64
    cont = json.loads((tmp_path / "cont" / "accel_draft.json").read_text())
    assert cont["vocab_ids"] == list(range(0, 320, 3))
    assert cont["history"] == [{"num_steps": 7, "seed": 0}]
    assert cont["train"]["init_from"] == str(first) and cont["train"]["seed"] == 1
    before, after = load_file(str(first / "model.safetensors")), load_file(str(tmp_path / "cont" / "model.safetensors"))
    assert before.keys() == after.keys()
    for k in before:
        torch.testing.assert_close(after[k], before[k])


def test_train_eagle_init_from_refuses_a_draft_of_another_target(tmp_path, tiny_model_dir):
    from tests.conftest import save_tiny_model

    from accel.draft_training.eagle_train import init_history, train_eagle

    _, _, first = _save(tmp_path, tiny_model_dir, list(range(64)))
    wider = save_tiny_model(tmp_path / "wider", hidden_size=96, num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(ValueError, match="was not trained from this target"):
        train_eagle(wider, tmp_path / "cont", time_budget_minutes=0.25, calibration_dir=_fox_calibration(tmp_path),
                    num_prompts=9, max_new_tokens=8, model_written_fraction=0.0, init_from=first, progress=False)
    assert not (tmp_path / "cont").exists()
    with pytest.raises(ValueError, match="a folder an EAGLE"):
        init_history(tmp_path / "nothing-here")


def test_cost_meter_leaves_out_a_first_draft_that_prefills_the_context(tmp_path, tiny_model_dir):
    _, _, folder = _save(tmp_path, tiny_model_dir, list(range(320)))
    engine = Engine.from_pretrained(tiny_model_dir, speculative=_alone(
        folder, adaptive=False, num_speculative_tokens=1))
    engine.add_request(PROMPTS[2], SamplingParams(max_tokens=10, temperature=0))
    engine.step()  # prefill
    engine.step()  # first draft: the draft catches up on the whole prompt (a one-time cost)
    assert engine.spec.last.max_catchup == len(PROMPTS[2]) and engine.spec.cost.propose_ratio is None
    engine.step()  # steady state: accepted drafts + the bonus token
    assert engine.spec.last.max_catchup <= 2 and engine.spec.cost.propose_ratio is not None


def test_context_window_caps_the_first_catch_up_and_keeps_outputs_exact(tmp_path, tiny_model_dir):
    _, _, folder = _save(tmp_path, tiny_model_dir, list(range(320)))
    params = SamplingParams(max_tokens=16, temperature=0)
    ref, _ = _run(tiny_model_dir, PROMPTS, params)
    spec = _alone(folder, adaptive=False, num_speculative_tokens=2,
                             disable_above_batch_size=None, max_step_rows=None)
    engine = Engine.from_pretrained(tiny_model_dir, speculative=spec)
    engine.spec.proposer.context_window = 5  # DEFAULT_CONTEXT_WINDOW (128) is longer than these prompts
    long_prompt = max(PROMPTS, key=len)
    assert len(long_prompt) > 8
    engine.add_request(long_prompt, params)
    engine.step()  # prefill
    engine.step()  # first draft: catches up on the last 5 positions only
    proposer = engine.spec.proposer
    assert engine.spec.last.max_catchup == 5 and proposer.base[next(iter(proposer.base))] == len(long_prompt) - 5
    while engine.has_unfinished():
        engine.step()
    out, engine = _run(tiny_model_dir, PROMPTS, params, spec)
    assert out == ref and engine.stats().spec_decode.num_draft_tokens > 0


def test_model_written_prompts_are_finished_distinct_user_turns(tiny_model_dir):
    import time

    from transformers import AutoTokenizer

    from accel.draft_training.eagle_train import model_written_prompts

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    turns = model_written_prompts(tiny_model_dir, tok, 48, deadline=time.monotonic() + 60, max_tokens=64)
    # a random 320-token model ends its turn now and then: those turns come back, decoded, once each
    assert turns and len(set(turns)) == len(turns) and all(len(t) >= 8 for t in turns)
    assert turns == model_written_prompts(tiny_model_dir, tok, 48, deadline=time.monotonic() + 60, max_tokens=64)
    assert model_written_prompts(tiny_model_dir, tok, 48, deadline=time.monotonic() - 1) == []


def test_min_path_confidence_drafts_only_likely_paths_and_keeps_outputs_exact(tmp_path, tiny_model_dir):
    _, _, folder = _save(tmp_path, tiny_model_dir, list(range(320)))
    params = SamplingParams(max_tokens=16, temperature=0)
    ref, _ = _run(tiny_model_dir, PROMPTS, params)
    stats = {}
    for gate in (None, 1e-30, 0.999):
        spec = _alone(folder, adaptive=False, num_speculative_tokens=3,
                          disable_above_batch_size=None, max_step_rows=None, draft_min_path_confidence=gate)
        out, engine = _run(tiny_model_dir, PROMPTS, params, spec)
        assert out == ref
        stats[gate] = engine.stats().spec_decode
    assert stats[1e-30].num_draft_tokens == stats[None].num_draft_tokens > 0
    assert stats[0.999].num_drafts == 0  # a random draft is never that sure of even its first token
    # a first-token gate at ~0 under a path gate no chain passes: every drafted chain is one token long
    spec = _alone(folder, adaptive=False, num_speculative_tokens=3,
                      disable_above_batch_size=None, max_step_rows=None, draft_min_path_confidence=0.999,
                      draft_min_first_confidence=1e-30)
    out, engine = _run(tiny_model_dir, PROMPTS, params, spec)
    first = engine.stats().spec_decode
    assert out == ref and first.num_drafts > 0 and first.num_draft_tokens == first.num_drafts


@pytest.mark.parametrize("quant", [None, "int8"])
def test_the_native_draft_step_matches_the_module_path(tmp_path, tiny_model_dir, quant):
    """fc, the layer, norm and head in one native call give the module path's hidden states and head logits."""
    from accel.kernels import cpu

    if not cpu.available():
        pytest.skip("no native CPU kernels here")
    _, _, folder = _save(tmp_path, tiny_model_dir, list(range(0, 320, 2)))
    engine = Engine.from_pretrained(tiny_model_dir, speculative=_alone(
        folder, adaptive=False, num_speculative_tokens=3,
        disable_above_batch_size=None, max_step_rows=None, draft_quantization=quant))
    draft = engine.spec.proposer.model
    native, real = draft.native_decode, draft.forward_logits
    assert native is not None and native.has_head
    seen = []

    def both(ids, pos, meta, kv, rows, features=None):
        if not native.takes(meta, ids.shape[0]):
            return real(ids, pos, meta, kv, rows, features=features)
        draft.native_decode = None  # the module path first: both write the same K/V slots, the native one last
        ref = real(ids, pos, meta, kv, rows, features=features)
        draft.native_decode = native
        out = real(ids, pos, meta, kv, rows, features=features)
        seen.append(([(a - b).abs().max().item() for a, b in zip(out[:2], ref[:2])],
                     torch.equal(out[1].argmax(-1), ref[1].argmax(-1))))
        return out

    draft.forward_logits = both
    engine.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0))  # one row per request and step
    engine.generate(PROMPTS[:1], SamplingParams(max_tokens=12, temperature=0))  # one row a step
    assert len(seen) > 8 and all(d < 1e-4 for diffs, _ in seen for d in diffs) and all(same for _, same in seen)


def test_int8_eagle_draft_keeps_outputs_exact(tmp_path, tiny_model_dir):
    from accel.kernels.linear import Int8WeightOnlyLinear

    _, _, folder = _save(tmp_path, tiny_model_dir, list(range(320)))
    params = SamplingParams(max_tokens=12, temperature=0)
    ref, _ = _run(tiny_model_dir, PROMPTS, params)
    spec = _alone(folder, adaptive=False, num_speculative_tokens=3,
                      disable_above_batch_size=None, max_step_rows=None, draft_quantization="int8")
    out, engine = _run(tiny_model_dir, PROMPTS, params, spec)
    assert out == ref and engine.stats().spec_decode.num_draft_tokens > 0
    proposer = engine.spec.proposer
    assert isinstance(proposer.model.lm_head, Int8WeightOnlyLinear)
    assert any(isinstance(m, Int8WeightOnlyLinear) for m in proposer.model.modules())
    with pytest.raises(ValueError, match="int4"):
        _run(tiny_model_dir, PROMPTS[:1], params, _alone(folder,
                                                              draft_quantization="int4"))


def test_ngram_first_with_an_eagle_draft_keeps_outputs_exact_and_counts_each_source(tmp_path, tiny_model_dir):
    _, _, folder = _save(tmp_path, tiny_model_dir, list(range(320)))
    params = SamplingParams(max_tokens=20, temperature=0)
    # the last prompt repeats itself: prompt lookup has something to copy from the first step on
    prompts = PROMPTS + [[1, 5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7]]
    ref, _ = _run(tiny_model_dir, prompts, params)
    spec = SpeculativeConfig(method="draft", draft_model=str(folder), adaptive=False, num_speculative_tokens=3,
                      disable_above_batch_size=None, max_step_rows=None, draft_ngram_first=True)
    out, engine = _run(tiny_model_dir, prompts, params, spec)
    assert out == ref
    for p, r in zip(prompts, ref):  # batch 1: a request moves between lookup and model drafts as it goes
        assert _run(tiny_model_dir, [p], params, spec)[0] == [r]
    stats = engine.stats()
    by_source = stats.spec_decode_per_source
    assert set(by_source) == {"ngram", "draft"} and all(s.num_draft_tokens > 0 for s in by_source.values())
    assert sum(s.num_draft_tokens for s in by_source.values()) == stats.spec_decode.num_draft_tokens
    assert sum(s.num_accepted_tokens for s in by_source.values()) == stats.spec_decode.num_accepted_tokens
    # sampling: lookup drafts go to the verifier with a one-hot q, the model's with its distribution
    sampled = SamplingParams(max_tokens=12, temperature=0.8, seed=3)
    outs, engine = _run(tiny_model_dir, prompts, sampled, spec)
    assert [len(o) for o in outs] == [12] * len(prompts) and engine.stats().spec_decode.num_drafts > 0


def _tiny_gemma_base_dir(path):
    """A tiny random Gemma 3 base model (no chat template), its norms and biases perturbed off their zeros."""
    import transformers
    from tests.conftest import make_tiny_tokenizer
    from tests.runtime.test_families import family_config

    tok = make_tiny_tokenizer()
    tok.chat_template = None
    config = family_config("gemma3")
    config.update(dict(vocab_size=320, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id))
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_a_gemma_target_trains_a_llama_layer_draft_that_keeps_outputs_exact(tmp_path):
    """Gemma 3 (no Llama layer, a base model without a chat template): the draft is a Llama layer of Gemma's
    widths whose norm starts at Gemma's 1 + w; the target writes paragraphs for prompts; speculation is exact."""
    from accel.draft_training.eagle_train import effective_norm_weight, model_written_prompts, train_eagle

    gemma = _tiny_gemma_base_dir(tmp_path / "gemma")
    target = _target(gemma)
    m = EagleTrainer(target.config, target.lm_head.weight.detach()[:64], effective_norm_weight(
        target.model.norm, target.config))
    assert m.config.model_type == "llama" and m.config.head_dim == 32 and m.config.num_key_value_heads == 1
    assert torch.allclose(m.model.norm.weight, 1.0 + target.model.norm.weight, atol=1e-6)

    from transformers import AutoTokenizer

    turns = model_written_prompts(gemma, AutoTokenizer.from_pretrained(gemma), 24,
                                  deadline=time.monotonic() + 60, max_tokens=32)
    assert len(set(turns)) == len(turns) and all(len(t) >= 8 for t in turns)

    res = train_eagle(gemma, tmp_path / "draft", time_budget_minutes=0.25, calibration_dir=_fox_calibration(tmp_path),
                      num_prompts=9, max_new_tokens=8, draft_vocab_size=64, progress=False)
    assert res.num_steps > 0
    assert json.loads((tmp_path / "draft" / "config.json").read_text())["model_type"] == "llama"
    params = SamplingParams(max_tokens=16, temperature=0)
    ref, _ = _run(gemma, PROMPTS, params)
    spec = _alone(tmp_path / "draft", adaptive=False, num_speculative_tokens=3, disable_above_batch_size=None,
                  max_step_rows=None)
    out, engine = _run(gemma, PROMPTS, params, spec)
    assert out == ref and engine.stats().spec_decode.num_draft_tokens > 0
