"""eval.peers: another OpenAI-compatible server measured with the same workloads as the accel variants."""

from __future__ import annotations

import pytest

from accel.bench.workload import BenchRequest
from accel.recipe import RecipeError, parse_recipe
from tests.server.conftest import serve_in_thread
from tests.server.fake_engine import FakeEngine

WORKLOAD = {"name": "batch1", "num_requests": 2, "prompt_tokens": [4, 8], "output_tokens": [4, 4], "concurrency": 1}


def _recipe(peers, repeats=1):
    return parse_recipe({"name": "p", "model": {"path": "smollm2-135m"},
                         "eval": {"workloads": [WORKLOAD], "peers": peers, "repeats": repeats}})


def test_a_peer_is_measured_with_the_recipe_workloads():
    from accel.pipeline.evaluate import peer_speed

    requests = {"batch1": [BenchRequest(f"r{i}", "hello there", None, 2, 4) for i in range(2)]}
    with serve_in_thread(FakeEngine(reply="one two three four"), model_name="fake") as running:
        recipe = _recipe([{"name": "llama-server", "url": running.base_url, "model": "fake"}], repeats=3)
        out = peer_speed(recipe, recipe.eval.peers[0], requests, progress=False)
    res = out["batch1"]
    assert res["num_completed"] == 2 and res["output_throughput"] > 0 and res["records"] == []
    # every run's tok/s is kept, and the result is the median run
    assert len(res["repeats"]) == 3 and res["repeats"] == sorted(res["repeats"])
    assert res["output_throughput"] == res["repeats"][1]


@pytest.mark.parametrize("peers,match", [
    ([{"name": "quantized", "url": "http://x"}], r"eval.peers names \['quantized'\] are taken"),
    ([{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}], r"names \['a'\] are taken"),
    ([{"name": "a", "url": "localhost:8080"}], "eval.peers.0.url"),
])
def test_bad_peers_are_refused_naming_the_field(peers, match):
    with pytest.raises(RecipeError, match=match):
        _recipe(peers)
