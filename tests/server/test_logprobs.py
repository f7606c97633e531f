"""Logprobs through the OpenAI API over the real engine (a tiny random Llama and tokenizer built here): the raw
log-softmax of the model's logits at each sampled token, as transformers computes it, streamed or not, with
speculative decoding on."""

from __future__ import annotations

import openai
import pytest
import torch

from accel.runtime.engine import Engine
from accel.speculative.config import SpeculativeConfig
from tests.conftest import save_tiny_model
from tests.server.conftest import serve_in_thread

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = save_tiny_model(tmp_path_factory.mktemp("tiny-logprobs"))
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=3, adaptive=False, disable_above_batch_size=None)
    engine = Engine.from_pretrained(d, num_kv_blocks=64, block_size=16, max_model_len=256, speculative=spec)
    hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with serve_in_thread(engine, model_name="tiny") as running:
        running.hf, running.tok = hf, AutoTokenizer.from_pretrained(d)
        yield running


def _client(running) -> openai.OpenAI:
    return openai.OpenAI(base_url=running.base_url + "/v1", api_key="x", max_retries=0, timeout=60)


@torch.no_grad()
def _reference(running, prompt_ids: list[int], n: int, k: int):
    """transformers' greedy continuation and its log-softmax at each output position: (ids, the sampled token's
    logprob, the top-k logprobs)."""
    ids = list(prompt_ids)
    for _ in range(n):
        ids.append(int(running.hf(torch.tensor([ids])).logits[0, -1].argmax()))
    logp = running.hf(torch.tensor([ids])).logits[0, len(prompt_ids) - 1:-1].float().log_softmax(-1)  # [n, V]
    out = ids[len(prompt_ids):]
    return out, logp.gather(1, torch.tensor(out)[:, None])[:, 0].tolist(), logp.topk(k, -1).values.tolist()


def _close_to_some(values, refs) -> bool:
    return all(min(abs(v - r) for r in refs) <= 1e-3 for v in values)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_are_transformers_log_softmax(served, stream):
    c = _client(served)
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=10, temperature=0.0, logprobs=3,
              extra_body={"ignore_eos": True})
    if stream:
        parts = [ch.choices[0] for ch in c.completions.create(stream=True, **kw) if ch.choices]
        tokens = [t for p in parts if p.logprobs for t in p.logprobs.tokens]
        lps = [x for p in parts if p.logprobs for x in p.logprobs.token_logprobs]
        tops = [x for p in parts if p.logprobs for x in p.logprobs.top_logprobs]
        offsets = [x for p in parts if p.logprobs for x in p.logprobs.text_offset]
    else:
        r = c.completions.create(**kw).choices[0]
        tokens, lps, tops, offsets = (r.logprobs.tokens, r.logprobs.token_logprobs, r.logprobs.top_logprobs,
                                      r.logprobs.text_offset)
    out, chosen, top = _reference(served, served.tok.encode(PROMPT), 10, 3)
    assert tokens == [served.tok.decode([t]) for t in out]
    assert offsets == [sum(len(t) for t in tokens[:j]) for j in range(10)]
    assert max(abs(a - b) for a, b in zip(lps, chosen)) <= 1e-3
    for j in range(10):  # the alternatives (texts may coincide: a dict keeps one) and the sampled token
        assert tops[j][tokens[j]] == lps[j] and _close_to_some(tops[j].values(), top[j])


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_and_top_logprobs_are_transformers_log_softmax(served, stream):
    c = _client(served)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    kw = dict(model="tiny", messages=msgs, max_tokens=8, temperature=0.0, logprobs=True, top_logprobs=2,
              extra_body={"ignore_eos": True})
    if stream:
        content = [x for ch in c.chat.completions.create(stream=True, **kw) if ch.choices and ch.choices[0].logprobs
                   for x in ch.choices[0].logprobs.content]
    else:
        content = c.chat.completions.create(**kw).choices[0].logprobs.content
    text = served.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    out, chosen, top = _reference(served, served.tok.encode(text, add_special_tokens=False), 8, 2)
    assert [x.token for x in content] == [served.tok.decode([t]) for t in out]
    for j, x in enumerate(content):
        assert abs(x.logprob - chosen[j]) <= 1e-3 and bytes(x.bytes).decode() == x.token
        assert max(abs(t.logprob - r) for t, r in zip(x.top_logprobs, top[j])) <= 1e-3 and len(x.top_logprobs) == 2


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_reads_it(served, stream):
    """lm-evaluation-harness's loglikelihood request (`local-completions`): echo, logprobs 1, max_tokens 1; it
    reads token_logprobs and top_logprobs over the prompt's tokens."""
    c = _client(served)
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=1, temperature=0.0, logprobs=1, echo=True)
    if stream:
        parts = [ch.choices[0] for ch in c.completions.create(stream=True, **kw) if ch.choices]
        lp = {k: [x for p in parts if p.logprobs for x in getattr(p.logprobs, k)]
              for k in ("tokens", "token_logprobs", "top_logprobs")}
        text = "".join(p.text for p in parts)
    else:
        r = c.completions.create(**kw).choices[0]
        lp, text = {k: getattr(r.logprobs, k) for k in ("tokens", "token_logprobs", "top_logprobs")}, r.text
    ids = served.tok.encode(PROMPT)
    with torch.no_grad():
        logp = served.hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    want = logp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
    n = len(ids)
    assert text.startswith(served.tok.decode(ids)) and len(lp["token_logprobs"]) == n + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert max(abs(a - b) for a, b in zip(lp["token_logprobs"][1:n], want)) <= 1e-3
    for j in range(1, n):  # the most likely token's logprob, beside the prompt's own
        assert abs(max(lp["top_logprobs"][j].values()) - float(logp[j - 1].max())) <= 1e-3
