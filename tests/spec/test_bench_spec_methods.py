"""scripts/bench_spec.py's method names: draft variants with their own confidence gates, side by side."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_spec", Path(__file__).parents[2] / "scripts" / "bench_spec.py")
bench_spec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_spec)


def _gates(conf=None, path=None, first=None, scheme=None, ngram=False) -> dict:
    return {"draft_min_confidence": conf, "draft_min_path_confidence": path, "draft_min_first_confidence": first,
            "draft_quant_scheme": scheme, "draft_ngram_first": ngram}


def test_draft_method_names_carry_their_gates():
    # plain: the command line's
    assert bench_spec.draft_variant("draft", 0.5, None, "int8") == _gates(conf=0.5, scheme="int8")
    assert bench_spec.draft_variant("draft+path0.3", 0.5, None, "int8") == _gates(path=0.3)
    assert bench_spec.draft_variant("draft+conf0.4+path0.2+int8", None, None, None) == _gates(0.4, 0.2, scheme="int8")
    assert bench_spec.draft_variant("draft+ngram+path0.3+int8", None, None, None) == _gates(path=0.3, scheme="int8",
                                                                                           ngram=True)
    assert bench_spec.draft_variant("draft+path0.35+first0.2", None, None, None) == _gates(path=0.35, first=0.2)
    # draftb: the same variants of the second draft folder (--draft-b)
    assert bench_spec.draft_variant("draftb+path0.35+first0.2", None, None, None) == _gates(path=0.35, first=0.2)
    for bad in ("draft+speed2", "draft+pathx", "drafty", "draft+firstly", "draftc+path0.3"):
        with pytest.raises(ValueError, match="is invalid"):
            bench_spec.draft_variant(bad, None, None, None)
    # every name maps onto SpecConfig fields
    from accel.spec.config import SpecConfig

    cfg = SpecConfig(method="draft", draft_model="d", **bench_spec.draft_variant("draft+path0.35+first0.2+int8",
                                                                                None, None, None))
    assert (cfg.draft_min_path_confidence, cfg.draft_min_first_confidence, cfg.draft_quant_scheme) == (0.35, 0.2,
                                                                                                       "int8")


class _FakeEngine:
    """Finishes each request after len(prompt) steps with the prompt reversed as its output."""

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
        return done

    def stats(self):
        from types import SimpleNamespace

        return SimpleNamespace(num_steps=self.steps)


def test_interleaved_runs_give_each_engine_its_own_outputs_steps_and_time():
    prompts = [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10], [11]]
    engines = {"off": _FakeEngine(), "ngram": _FakeEngine()}
    res = bench_spec.run_interleaved(engines, prompts, None, 2, "chat")
    for method, (outs, secs, steps) in res.items():
        assert outs == [p[::-1] for p in prompts]  # prompt order, batches of 2
        assert steps == 3 + 4 + 1 and secs > 0  # each batch lasts as long as its longest request
    assert res["off"][0] == bench_spec.run(_FakeEngine(), prompts, None, 2, "chat")[0]
