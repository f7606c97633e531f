"""scripts/bench_spec.py's methods: SpeculativeConfig fields under their own names, variants side by side."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_spec", Path(__file__).parents[2] / "scripts" / "bench_spec.py")
bench_spec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_spec)


DEFAULTS = {"num_speculative_tokens": 4, "adaptive": True, "ngram_min_n": 2, "ngram_max_n": 4,
            "disable_above_batch_size": "auto", "max_step_rows": 16, "draft_quantization": "int8",
            "draft_min_path_confidence": 0.3, "draft_min_first_confidence": None, "draft_ngram_first": False}


def test_methods_take_speculative_config_fields_by_their_own_names():
    assert bench_spec.method_config("off", DEFAULTS, None) is None
    plain = bench_spec.method_config("draft", DEFAULTS, "d")
    assert (plain.method, plain.draft_model, plain.draft_quantization, plain.draft_min_path_confidence) == (
        "draft", "d", "int8", 0.3)
    cfg = bench_spec.method_config("draftb:draft_min_path_confidence=0.35+draft_min_first_confidence=0.2"
                                   "+draft_quantization=none+draft_ngram_first=true+num_speculative_tokens=6",
                                   DEFAULTS, "b")
    assert (cfg.draft_model, cfg.draft_min_path_confidence, cfg.draft_min_first_confidence, cfg.draft_quantization,
            cfg.draft_ngram_first, cfg.num_speculative_tokens) == ("b", 0.35, 0.2, None, True, 6)
    ngram = bench_spec.method_config("ngram:ngram_max_n=6+max_step_rows=none", DEFAULTS, None)
    assert (ngram.method, ngram.ngram_max_n, ngram.max_step_rows, ngram.draft_min_path_confidence) == (
        "ngram", 6, None, None)  # the draft-model defaults do not apply to n-gram
    for bad in ("drafty", "off:x=1", "draft:speed=2", "draft:draft_min_path_confidence", "draftc"):
        with pytest.raises(ValueError, match="is invalid"):
            bench_spec.method_config(bad, DEFAULTS, "d")
    with pytest.raises(ValueError, match="draft_min_path_confidence=2"):  # SpeculativeConfig's own check
        bench_spec.method_config("draft:draft_min_path_confidence=2", DEFAULTS, "d")


class _FakeEngine:
    """Emits each request's first token at its first step and finishes it after len(prompt) steps with the prompt
    reversed as its output."""

    def __init__(self):
        self.live, self.n, self.steps = {}, 0, 0

    def add_request(self, prompt, params, domain=None):
        self.n += 1
        rid = f"r{self.n}"
        self.live[rid] = [list(prompt), len(prompt)]
        return rid

    def has_unfinished(self):
        return bool(self.live)

    def step(self):
        from types import SimpleNamespace

        self.steps += 1
        done = []
        for rid, st in list(self.live.items()):
            st[1] -= 1
            if st[1] == 0:
                done.append(SimpleNamespace(request_id=rid, finished=True, token_ids=st[0][::-1]))
                del self.live[rid]
            elif st[1] == len(st[0]) - 1:
                done.append(SimpleNamespace(request_id=rid, finished=False, token_ids=st[0][::-1][:1]))
        return done

    def stats(self):
        from types import SimpleNamespace

        return SimpleNamespace(num_steps=self.steps)


def test_interleaved_runs_give_each_engine_its_own_outputs_steps_and_time():
    prompts = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [11]]
    engines = {"off": _FakeEngine(), "ngram": _FakeEngine()}
    res = bench_spec.run_interleaved(engines, prompts, None, 2, "chat")
    for method, (outs, secs, steps, first_s) in res.items():
        assert outs == [p[::-1] for p in prompts]  # prompt order, batches of 2
        assert steps == 3 + 4 + 1 and secs > 0  # each batch lasts as long as its longest request
        assert 0 < first_s < secs  # the first step of each batch: its requests' first tokens
    outs, secs, steps, first_s = bench_spec.run(_FakeEngine(), prompts, None, 2, "chat")
    assert outs == res["off"][0] and steps == 8 and 0 < first_s < secs


def test_the_ledger_names_an_export_by_its_run():
    assert bench_spec.target_name("runs/qwen-w4a8/checkpoint") == "qwen-w4a8"
    assert bench_spec.target_name("smollm2-135m") == "smollm2-135m"
