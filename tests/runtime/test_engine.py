"""Engine behaviour: stop strings / ids, max_tokens, min_tokens, ignore_eos, abort, metrics, stats."""

from __future__ import annotations

import pytest
import torch

from accel.runtime.detokenizer import IncrementalDetokenizer
from accel.runtime.engine import Engine, EngineConfig, QueueFullError, stream_generate
from accel.runtime.models import CausalLM
from accel.runtime.sampling_params import SamplingParams
from tests.runtime.helpers import tiny_config

# Token t decodes to the two letters LETTERS[t % 26] + LETTERS[(t // 26) % 26]: stop strings then span tokens.
LETTERS = "abcdefghijklmnopqrstuvwxyz"


class PairTokenizer:
    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if (t == 2 and skip_special_tokens) else LETTERS[t % 26] + LETTERS[(t // 26) % 26]
                       for t in ids)

    def encode(self, text):
        return [3 + (ord(c) % 200) for c in text]


class ScriptedModel(CausalLM):
    """A tiny CausalLM (random weights, unused) whose sampled token is dictated by a script (see below)."""

    def __init__(self):
        super().__init__(tiny_config())
        self.init_rope(torch.device("cpu"), torch.float32)
        self.next_tokens: list[int] = []

    def compute_logits(self, hidden):  # row i strongly prefers next_tokens[i]
        out = torch.zeros(hidden.shape[0], self.config.vocab_size)
        out[torch.arange(hidden.shape[0]), torch.tensor(self.next_tokens, dtype=torch.long)] = 10.0
        return out


def scripted_engine(script: list[int], **kw) -> Engine:
    """Engine whose model emits script[k] as the k-th output token of every request (5 after the script)."""
    model = ScriptedModel()
    engine = Engine(model, EngineConfig(model="scripted", num_kv_blocks=64, block_size=4, **kw),
                    tokenizer=PairTokenizer())
    runner = engine.runner
    orig_prepare = runner.prepare_inputs

    def prepare(scheduled):
        ids, pos, meta, rows = orig_prepare(scheduled)
        ks = [scheduled[i].seq.num_output_tokens for i, _ in rows]
        model.next_tokens = [script[k] if k < len(script) else 5 for k in ks]
        return ids, pos, meta, rows

    runner.prepare_inputs = prepare
    return engine


GREEDY = dict(temperature=0)


def test_stop_string_across_token_boundaries_truncates_text():
    # tokens 3,4,5 decode "da" "ea" "fa" -> text "daeafa"; stop "aea" spans tokens 3 and 4
    engine = scripted_engine([3, 4, 5, 6, 7])
    (out,) = engine.generate([[9]], SamplingParams(max_tokens=5, stop=["aea"], **GREEDY))
    assert out.finish_reason == "stop" and out.stop_reason == "aea"
    assert out.text == "d" and out.token_ids == [3, 4]


def test_streamed_deltas_hold_back_possible_stop_prefix():
    engine = scripted_engine([3, 4, 5, 6])
    engine.add_request([9], SamplingParams(max_tokens=4, stop=["zzz"], **GREEDY), request_id="r")
    deltas = []
    while engine.has_unfinished():
        deltas += [o.text_delta for o in engine.step()]
    assert "".join(deltas) == "daeafaga"
    assert deltas[0] == ""  # "da" could be the start of a 3-char stop string: held back (2 chars)


def test_stop_token_id_and_eos_and_ignore_eos():
    engine = scripted_engine([3, 7, 4, 2, 5])
    (a,) = engine.generate([[9]], SamplingParams(max_tokens=5, stop_token_ids=[7], **GREEDY))
    assert a.token_ids == [3, 7] and a.finish_reason == "stop" and a.stop_reason == 7
    (b,) = engine.generate([[9]], SamplingParams(max_tokens=5, **GREEDY))
    assert b.token_ids == [3, 7, 4, 2] and b.finish_reason == "stop" and b.stop_reason is None
    (c,) = engine.generate([[9]], SamplingParams(max_tokens=5, ignore_eos=True, **GREEDY))
    assert c.token_ids == [3, 7, 4, 2, 5] and c.finish_reason == "length"


def test_max_tokens_and_min_tokens():
    engine = scripted_engine([2, 2, 2, 2, 2, 2])
    (a,) = engine.generate([[9]], SamplingParams(max_tokens=3, **GREEDY))
    assert a.token_ids == [2] and a.finish_reason == "stop"
    # min_tokens: eos is masked out of the logits, so the runner-up (token 0) is chosen until 2 tokens exist
    (b,) = engine.generate([[9]], SamplingParams(max_tokens=5, min_tokens=2, **GREEDY))
    assert b.token_ids == [0, 0, 2] and b.finish_reason == "stop"
    (c,) = engine.generate([[9]], SamplingParams(max_tokens=3, ignore_eos=True, **GREEDY))
    assert c.token_ids == [2, 2, 2] and c.finish_reason == "length"


def test_per_request_metrics_and_stats():
    engine = scripted_engine([3, 4, 5, 6])
    (o,) = engine.generate([[9, 10, 11]], SamplingParams(max_tokens=4, ignore_eos=True, **GREEDY))
    m = o.metrics
    assert m.queue_time >= 0 and m.ttft >= m.queue_time and m.e2e_latency >= m.ttft
    assert len(m.itl) == 3 and m.tpot == pytest.approx(sum(m.itl) / 3)
    s = engine.stats()
    assert (s.num_running, s.num_waiting, s.kv_cache_usage, s.num_steps) == (0, 0, 0.0, 4)


def test_abort_mid_generation_frees_blocks_and_queue_cap():
    engine = scripted_engine([3] * 20, max_waiting=2)
    a = engine.add_request([9] * 10, SamplingParams(max_tokens=20, **GREEDY))
    engine.add_request([9] * 3, SamplingParams(max_tokens=20, **GREEDY))
    with pytest.raises(QueueFullError, match="max_waiting=2"):
        engine.add_request([9], SamplingParams(**GREEDY))
    engine.step()
    engine.step()
    assert engine.kv.num_held_blocks() > 0
    assert engine.abort(a) and not engine.abort(a)
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert all(o.request_id != a for o in outs)
    assert engine.kv.num_held_blocks() == 0


def test_stream_generate_yields_deltas_and_frees_on_early_exit():
    engine = scripted_engine([3, 4, 5, 6, 7, 8])
    assert "".join(stream_generate(engine, [9], SamplingParams(max_tokens=6, ignore_eos=True, **GREEDY))) \
        == "daeafagahaia"
    gen = stream_generate(engine, [9], SamplingParams(max_tokens=6, ignore_eos=True, **GREEDY))
    next(gen)
    gen.close()
    assert engine.kv.num_held_blocks() == 0 and not engine.has_unfinished()


def test_bad_inputs_name_the_value():
    engine = scripted_engine([3])
    with pytest.raises(ValueError, match=r"prompt token ids \[999\] are invalid"):
        engine.add_request([999])
    with pytest.raises(ValueError, match="empty prompt"):
        engine.add_request([])
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8'"):
        EngineConfig(model="x", kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="device='tpu'"):
        EngineConfig(model="x", device="tpu")
    with pytest.raises(ValueError, match="weight_dtype='bfloat16'.*'auto', 'float16'"):
        EngineConfig(model="x", weight_dtype="bfloat16")


def test_fp16_weights_are_refused_before_loading_where_the_panel_kernels_do_not_run(tiny_model_dir, monkeypatch):
    from accel.kernels import cpu
    import accel.runtime.engine as engine_mod

    monkeypatch.setattr(cpu, "has_avx512", lambda: False)
    monkeypatch.setattr(engine_mod, "load_model", lambda *a, **k: pytest.fail("loaded before refusing"))
    with pytest.raises(ValueError, match="weight_dtype='float16' needs .*AVX-512 kernels off.*allowed here: 'auto'"):
        Engine.from_pretrained(tiny_model_dir, weight_dtype="float16")


def test_detokenizer_waits_for_complete_characters():
    class Bytes:
        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids).decode("utf-8", errors="replace")

    d = IncrementalDetokenizer(Bytes(), [ord("a")], stop=[])
    d.update([0xC3])  # first byte of "é"
    assert d.output_text == ""
    d.update([0xA9])
    assert d.output_text == "é"
    d.update([ord("b"), 0xE2, 0x82])  # "b", then two of the three bytes of "€": the request ends there
    assert d.take_delta(finished=False) == "éb"
    assert d.take_delta(finished=True) == "\ufffd" and d.output_text == "éb\ufffd"  # as decode(output ids) gives it


def test_text_prompts_with_a_real_tokenizer(tmp_path):
    from tests.conftest import save_tiny_model

    path = save_tiny_model(tmp_path / "m")
    engine = Engine.from_pretrained(path, num_kv_blocks=64, block_size=4)
    sp = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    (out,) = engine.generate("The quick brown fox", sp)
    assert out.text == engine.tokenizer.decode(out.token_ids, skip_special_tokens=True)
    streamed = "".join(stream_generate(engine, "The quick brown fox", sp))
    assert streamed == out.text
    assert len(out.text) > 4
    stop = out.text[2:4]  # a stop string from inside the output cuts the text just before its first occurrence
    (cut,) = engine.generate("The quick brown fox", SamplingParams(max_tokens=10, temperature=0,
                                                                  ignore_eos=True, stop=[stop]))
    assert cut.text == out.text[:out.text.index(stop)] and cut.finish_reason == "stop"


def test_detokenizer_stream_matches_the_decode_window():
    # a fast tokenizer's DecodeStream and the two-decode window give the same text, token by token, after any
    # prompt tail (one ending inside a character takes the window)
    import random

    from tests.conftest import make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    rng = random.Random(0)
    ids = tok.encode("héllo wörld — a test 🙂 of streaming")
    streamed = 0
    for _ in range(60):
        prompt = ids[:rng.randrange(1, len(ids))]
        out = ids[len(prompt):] + [rng.randrange(tok.vocab_size) for _ in range(12)]
        fast, slow = IncrementalDetokenizer(tok, prompt), IncrementalDetokenizer(tok, prompt)
        slow._stream = None
        streamed += fast._stream is not None
        for t in out:
            fast.update([t])
            slow.update([t])
            assert fast.output_text == slow.output_text
    assert streamed > 30


@pytest.mark.parametrize("chunk", [4096, 7])  # one prefill, or chunks of 7 tokens
def test_prompt_logprobs_are_transformers_log_softmax_of_every_prompt_token(tiny_llama_dir, chunk):
    """SamplingParams.prompt_logprobs (OpenAI's echo + logprobs): the raw logprob of each prompt token after the
    first, over chunked prefill, beside requests that do not ask, with a prefix-cache hit ready to be (not) used."""
    from accel.runtime.engine import Engine
    from accel.runtime.sampling_params import SamplingParams

    path, hf = tiny_llama_dir
    prompt = [1] + [(7 * i) % 200 + 3 for i in range(40)]
    engine = Engine.from_pretrained(path, num_kv_blocks=256, block_size=4, max_num_batched_tokens=chunk)
    engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0))  # caches the prompt's blocks
    scored = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3)
    outs = engine.generate([prompt, prompt[:20]], [scored, SamplingParams(max_tokens=2, temperature=0)])
    with torch.no_grad():
        logp = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    want = logp[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    got = outs[0].prompt_logprobs
    assert got[0] is None and len(got) == len(prompt)
    torch.testing.assert_close(torch.tensor(got[1:]), want, atol=1e-4, rtol=0)
    top = outs[0].prompt_top_logprobs
    assert top[0] is None and all(len(t) == 3 for t in top[1:])
    torch.testing.assert_close(torch.tensor([[v for _, v in t] for t in top[1:]]), logp[:-1].topk(3).values,
                               atol=1e-4, rtol=0)
    assert outs[1].prompt_logprobs is None
    assert outs[0].num_cached_tokens == 0  # scored from scratch, the cache notwithstanding
