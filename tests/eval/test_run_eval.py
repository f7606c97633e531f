"""End to end on a tiny random Llama with fixture files (seconds)."""

import io
import math

import pytest
import torch
from rich.console import Console

from accel.eval import EvalModel, EvalResult, from_hf, hf_logits_fn, render_table, run_eval
from accel.eval.adapters import hf_generate_fn

from .conftest import EOS_ID, make_tiny_llama


def test_same_model_as_baseline_gives_zero_kl_and_exact_token_counts(tiny_llama, byte_tokenizer, eval_dirs):
    text, tasks = eval_dirs
    r = run_eval(tiny_llama, tiny_llama, tokenizer=byte_tokenizer, text_dir=text, tasks_dir=tasks,
                 window=16, tasks=False, progress=False)
    # prose: 23 + 1 (eos) + 10 = 34 tokens -> windows of 16, 16, 2 -> 15 + 15 + 1 scored
    # code: 27 tokens -> windows of 16, 11 -> 15 + 10 scored
    assert r.domains["prose"].num_tokens_scored == 31 and r.domains["prose"].num_windows == 3
    assert r.domains["code"].num_tokens_scored == 25 and r.domains["code"].num_windows == 2
    assert r.overall.num_tokens_scored == 56 and r.overall.num_windows == 5
    assert r.protocol.separator_id == EOS_ID and r.protocol.window == 16 and r.protocol.stride == 16
    for m in [*r.domains.values(), r.overall]:
        assert (m.kl_mean, m.kl_max, m.top1_agreement) == (0.0, 0.0, 1.0)
        assert m.ppl == m.ppl_baseline
    assert r.tasks == {} and r.tasks_overall is None


def test_perplexity_matches_transformers_loss_on_the_same_windows(tiny_llama, byte_tokenizer, eval_dirs):
    text, tasks = eval_dirs
    r = run_eval(tiny_llama, tokenizer=byte_tokenizer, text_dir=text, domains=["prose"], window=16,
                 tasks=False, progress=False)
    ids = byte_tokenizer.encode("The cat sat on the mat.", add_special_tokens=False) + [EOS_ID]
    ids += byte_tokenizer.encode("A dog ran.", add_special_tokens=False)
    total_nll = 0.0
    with torch.no_grad():
        for lo in range(0, len(ids), 16):
            w = torch.tensor([ids[lo : lo + 16]])
            total_nll += tiny_llama(input_ids=w, labels=w).loss.item() * (w.shape[1] - 1)  # mean over T-1 targets
    assert list(r.domains) == ["prose"] and r.baseline is None and r.domains["prose"].kl_mean is None
    assert r.domains["prose"].ppl == pytest.approx(math.exp(total_nll / 31), rel=1e-5)


def test_a_different_model_has_positive_kl(tiny_llama, byte_tokenizer, eval_dirs):
    text, _ = eval_dirs
    other = make_tiny_llama(seed=1)
    r = run_eval(other, tiny_llama, tokenizer=byte_tokenizer, text_dir=text, window=16, tasks=False, progress=False)
    o = r.overall
    assert 0 < o.kl_mean <= o.kl_p99 <= o.kl_max
    assert o.ppl != o.ppl_baseline
    assert o.ppl_increase_pct == pytest.approx(100 * (o.ppl / o.ppl_baseline - 1))


def test_strided_windows_score_every_token_once(tiny_llama, byte_tokenizer, eval_dirs):
    text, _ = eval_dirs
    r = run_eval(tiny_llama, tokenizer=byte_tokenizer, text_dir=text, window=16, stride=8, batch_size=4,
                 tasks=False, progress=False)
    assert r.domains["prose"].num_tokens_scored == 33 and r.domains["code"].num_tokens_scored == 26


def test_max_windows_per_domain_limits_the_scored_tokens(tiny_llama, byte_tokenizer, eval_dirs):
    text, _ = eval_dirs
    r = run_eval(tiny_llama, tokenizer=byte_tokenizer, text_dir=text, window=16, max_windows_per_domain=1,
                 tasks=False, progress=False)
    assert r.overall.num_tokens_scored == 30 and r.protocol.max_windows_per_domain == 1


def test_task_accuracy_with_a_scripted_generate_fn(tiny_llama, byte_tokenizer, eval_dirs):
    text, tasks = eval_dirs
    canned = {"2+2?": "The answer is 4.", "3+4?": "8", "Pick one": "b) y"}
    model = EvalModel("scripted", hf_logits_fn(tiny_llama), byte_tokenizer, EOS_ID,
                      generate_fn=lambda prompts, n: [canned[p] for p in prompts])
    base = EvalModel("base", hf_logits_fn(tiny_llama), byte_tokenizer, EOS_ID,
                     generate_fn=lambda prompts, n: ["7"] * len(prompts))
    r = run_eval(model, base, text_dir=text, tasks_dir=tasks, window=16, progress=False)
    a, mc, overall = r.tasks["arithmetic"], r.tasks["multiple_choice"], r.tasks_overall
    assert (a.model.num_correct, a.model.n, a.model.accuracy) == (1, 2, 0.5)
    assert a.model.stderr == pytest.approx(math.sqrt(0.25 / 2))
    assert [rec.correct for rec in a.records] == [True, False]
    assert [rec.baseline_correct for rec in a.records] == [False, True]
    assert (mc.model.num_correct, mc.baseline.num_correct) == (1, 0)
    assert (overall.model.num_correct, overall.model.n, overall.baseline.num_correct) == (2, 3, 1)
    assert overall.model.stderr == pytest.approx(math.sqrt((2 / 3) * (1 / 3) / 3))


def test_hf_generate_fn_left_padding_matches_one_at_a_time(tiny_llama, byte_tokenizer):
    prompts = ["hi", "a much longer prompt here", "mid size"]
    batched = hf_generate_fn(tiny_llama, byte_tokenizer, batch_size=8)(prompts, 6)
    single = [hf_generate_fn(tiny_llama, byte_tokenizer, batch_size=1)([p], 6)[0] for p in prompts]
    assert batched == single
    assert all(isinstance(s, str) for s in batched)


def test_default_generate_path_runs_tasks_for_model_and_baseline(tiny_llama, byte_tokenizer, eval_dirs):
    text, tasks = eval_dirs
    r = run_eval(from_hf(tiny_llama, byte_tokenizer, name="tiny"), from_hf(tiny_llama, byte_tokenizer, name="b"),
                 text_dir=text, tasks_dir=tasks, window=16, max_new_tokens=4, progress=False)
    assert set(r.tasks) == {"arithmetic", "multiple_choice", "multiple_choice:loglik"}
    assert r.tasks_overall.model.n == 3  # generation tasks only: the log-likelihood score is not pooled
    loglik = r.tasks["multiple_choice:loglik"]  # same weights: the same letters picked
    assert [x.reply for x in loglik.records] == [x.baseline_reply for x in loglik.records]
    assert all(x.reply in "ABCD" for x in loglik.records)
    # same weights, greedy: identical replies
    assert [x.reply for x in r.tasks["arithmetic"].records] == [x.baseline_reply for x in r.tasks["arithmetic"].records]
    assert r.max_new_tokens == 4


def test_json_round_trip_and_table(tiny_llama, byte_tokenizer, eval_dirs):
    text, tasks = eval_dirs
    canned = lambda prompts, n: ["4"] * len(prompts)  # noqa: E731
    model = EvalModel("m", hf_logits_fn(make_tiny_llama(seed=2)), byte_tokenizer, EOS_ID, canned)
    base = EvalModel("b", hf_logits_fn(tiny_llama), byte_tokenizer, EOS_ID, canned)
    r = run_eval(model, base, text_dir=text, tasks_dir=tasks, window=16, progress=False)
    back = EvalResult.from_json(r.to_json())
    assert back == r
    s = r.summary()
    assert (s["kl_mean"], s["top1"], s["ppl"]) == (r.overall.kl_mean, r.overall.top1_agreement, r.overall.ppl)
    assert s["task_accuracy"] == r.tasks_overall.model.accuracy and set(s["per_domain"]) == {"code", "prose"}
    assert back.to_json() == r.to_json()
    out = io.StringIO()
    Console(file=out, width=200).print(render_table(r))
    rendered = out.getvalue()
    for needle in ("prose", "code", "overall", "arithmetic", "multiple_choice", f"{r.overall.ppl:.3f}"):
        assert needle in rendered


def test_unknown_domain_and_bad_model_type_are_rejected(tiny_llama, byte_tokenizer, eval_dirs):
    text, _ = eval_dirs
    with pytest.raises(ValueError, match=r"unknown domain \['poetry'\].*\['code', 'prose'\]"):
        run_eval(tiny_llama, tokenizer=byte_tokenizer, text_dir=text, domains=["poetry"], tasks=False, progress=False)
    with pytest.raises(TypeError, match="got int"):
        run_eval(3, text_dir=text, tasks=False, progress=False)
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        run_eval("/no-such-model", text_dir=text, tasks=False, progress=False)


def test_task_token_budget_is_twice_the_longest_answer_plus_eight_capped(byte_tokenizer):
    from accel.eval.data import TaskExample
    from accel.eval.runner import task_token_budget

    ex = [TaskExample("1", "t", "p", "abc", "exact"), TaskExample("2", "t", "p", 12345, "number")]
    assert task_token_budget(ex, byte_tokenizer, cap=64) == 2 * 5 + 8  # byte tokenizer: "12345" = 5 tokens
    assert task_token_budget(ex, byte_tokenizer, cap=10) == 10


def test_generation_budget_reaches_generate_fn_and_the_result(tiny_llama, byte_tokenizer, eval_dirs):
    text, tasks = eval_dirs
    seen = {}

    def gen(prompts, n):
        seen[prompts[0]] = n
        return ["x"] * len(prompts)

    model = EvalModel("m", hf_logits_fn(tiny_llama), byte_tokenizer, EOS_ID, gen)
    r = run_eval(model, text_dir=text, tasks_dir=tasks, window=16, max_new_tokens=9, progress=False)
    assert seen == {"2+2?": 9, "Pick one": 9}  # 2 * 1 + 8 = 10 capped at 9
    assert r.tasks["arithmetic"].max_new_tokens == 9
    assert r.tasks["arithmetic"].baseline is None and r.tasks_overall.model.num_correct == 0
