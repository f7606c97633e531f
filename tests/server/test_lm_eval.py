"""lm-evaluation-harness against a real `accel serve` (a tiny random Llama and tokenizer built here, and the real
SmolLM2): its
local-completions backend scores a log-likelihood task and its local-chat-completions backend a generation task,
both defined over eval/tasks (eval/lm_eval, no hub), and each item scores as `accel eval` scores it: the same
option log-likelihoods (within 1e-3) and the same greedy replies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accel.eval.data import load_tasks
from accel.eval.runner import LOGLIK_SUFFIX, choice_logliks, run_eval
from accel.runtime.engine import Engine
from tests.conftest import save_tiny_model
from tests.server.conftest import serve_in_thread



ROOT = Path(__file__).resolve().parents[2]
N = 8  # items per task


@pytest.fixture(scope="module", params=["tiny", pytest.param("smollm2-135m", marks=pytest.mark.integration)])
def served(request, tmp_path_factory):
    if request.param == "tiny":
        d = save_tiny_model(tmp_path_factory.mktemp("tiny-lm-eval"))
    else:
        d = Path(request.getfixturevalue("real_model_path"))
    engine = Engine.from_pretrained(d, num_kv_blocks=64, block_size=16, max_model_len=512)
    with serve_in_thread(engine, model_name="tiny") as running:
        running.dir = d
        yield running


def _lm_eval(model: str, model_args: dict, task: str, **kw) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(model=model, model_args=model_args, tasks=[task], limit=N, log_samples=True,
                           task_manager=TaskManager(include_path=str(ROOT / "eval" / "lm_eval")), **kw)


def _accel_eval(model_dir: Path, task: str):
    return run_eval(model_dir, tasks=[task], max_examples_per_task=N, max_new_tokens=8, window=64,
                    max_windows_per_domain=1, progress=False)


def test_a_loglikelihood_task_through_local_completions_scores_as_accel_eval(served):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = _lm_eval("local-completions", {"base_url": served.base_url + "/v1/completions", "model": "tiny",
                                         "tokenizer": str(served.dir), "max_retries": 1}, "accel_multiple_choice")
    samples = sorted(out["samples"]["accel_multiple_choice"], key=lambda s: s["doc_id"])
    assert len(samples) == N
    examples = load_tasks(ROOT / "eval" / "tasks", ["multiple_choice"])["multiple_choice"][:N]
    hf = AutoModelForCausalLM.from_pretrained(served.dir, dtype=torch.float32).eval()
    mine = choice_logliks(examples, AutoTokenizer.from_pretrained(served.dir), lambda ids: hf(ids).logits)
    for s, ref in zip(samples, mine):
        assert [r[0][0] for r in s["resps"]] == pytest.approx(ref, abs=1e-3)
    acc = out["results"]["accel_multiple_choice"]["acc,none"]
    assert acc == _accel_eval(served.dir, "multiple_choice").tasks["multiple_choice" + LOGLIK_SUFFIX].model.accuracy


def test_a_generation_task_through_local_chat_completions_scores_as_accel_eval(served):
    out = _lm_eval("local-chat-completions", {"base_url": served.base_url + "/v1/chat/completions", "model": "tiny",
                                              "max_retries": 1}, "accel_arithmetic", apply_chat_template=True)
    samples = sorted(out["samples"]["accel_arithmetic"], key=lambda s: s["doc_id"])
    ours = _accel_eval(served.dir, "arithmetic").tasks["arithmetic"]
    assert ours.max_new_tokens == 8
    assert [s["resps"][0][0] for s in samples] == [r.reply for r in ours.records]
    assert any(r.reply for r in ours.records)  # the replies compared are not all empty
    assert out["results"]["accel_arithmetic"]["acc,none"] == ours.model.accuracy
