"""eval.peers: another OpenAI-compatible server measured with the same workloads as the accel variants."""

from __future__ import annotations

from pathlib import Path

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


@pytest.mark.parametrize("eval_section,match", [
    ({"peers": [{"name": "a"}]}, "peer 'a' has nothing to measure; allowed: a url"),
    ({"peers": [{"name": "a", "gguf": "q8.gguf"}]}, "need eval.gguf_base"),
    ({"peers": [{"name": "a", "quantize": "Q5_K"}]}, r"quantize 'Q5_K' is not allowed; allowed: \['Q8_0'"),
    ({"peers": [{"name": "a", "quantize": "Q8_0", "gguf": "q8.gguf"}]}, "both a gguf and a quantize type"),
])
def test_gguf_peers_need_something_to_measure_and_a_base(eval_section, match):
    with pytest.raises(RecipeError, match=match):
        parse_recipe({"name": "p", "model": {"path": "smollm2-135m"}, "eval": eval_section})


def test_preflight_names_missing_gguf_files_and_binary(tmp_path):
    from accel.preflight import _check_gguf_peers

    (tmp_path / "q8.gguf").write_bytes(b"GGUF")
    recipe = parse_recipe({"name": "p", "model": {"path": "smollm2-135m"}, "eval": {
        "gguf_base": str(tmp_path / "f32.gguf"), "llama_perplexity": str(tmp_path / "nope"),
        "peers": [{"name": "q8", "gguf": str(tmp_path / "q8.gguf")}, {"name": "q4", "gguf": str(tmp_path / "q4.gguf")}]}})
    problems = _check_gguf_peers(recipe)
    assert [p.split(":")[0] for p in problems] == ["eval.peers[1].gguf", "eval.gguf_base", "eval.llama_perplexity"]
    assert "build_llama_cpp.sh" in problems[-1]
    (tmp_path / "f32.gguf").write_bytes(b"GGUF")
    recipe = parse_recipe({"name": "p", "model": {"path": "smollm2-135m"}, "eval": {
        "gguf_base": str(tmp_path / "f32.gguf"), "llama_perplexity": str(tmp_path / "bin" / "llama-perplexity"),
        "peers": [{"name": "q4", "quantize": "Q4_K_M+imatrix"}]}})
    problems = _check_gguf_peers(recipe)  # the tools a quantize peer runs, beside llama-perplexity
    assert [p.split("is not an executable ")[1].split(";")[0] for p in problems] == [
        "llama-perplexity", "llama-quantize", "llama-imatrix"]
    # without a gguf_base, a registry model's shipped GGUF is the base; any other model needs one
    for path, named in (("smollm2-135m", False), (str(tmp_path), True)):
        recipe = parse_recipe({"name": "p", "model": {"path": path}, "eval": {
            "llama_perplexity": str(tmp_path / "bin" / "llama-perplexity"),
            "peers": [{"name": "q4", "quantize": "Q3_K_M"}]}})
        problems = _check_gguf_peers(recipe)
        assert any(p.startswith("eval.gguf_base: unset") for p in problems) == named
        assert any("executable llama-quantize" in p for p in problems)


class _Tok:
    """Whitespace-free stand-in for a tokenizer: one token per character (ids < 256), no BOS."""

    bos_token_id = None

    def __call__(self, text, add_special_tokens=True):
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=[3 + ord(c) % 250 for c in text])


def test_llama_scale_scores_the_quantized_variant_and_each_gguf_peer_on_one_text(tmp_path, monkeypatch):
    from accel.eval import chunked
    from accel.pipeline.evaluate import evaluate, llama_scale
    from accel.quant.quantize import oneshot_quantize, save_checkpoint
    from tests.eval.test_gguf import _fake_binary, fake_quantize_tools
    from tests.quant.test_quantize import CAL, _mixed_plan, _saved_tiny, _tokenizer

    model = _saved_tiny(tmp_path)
    base_dir = tmp_path / "tiny"
    ck = save_checkpoint(oneshot_quantize(model, _mixed_plan(model), CAL, "rtn", processor=_tokenizer()).model,
                         _mixed_plan(model), tmp_path / "ck")
    monkeypatch.setattr(chunked, "held_out_text", lambda text_dir, domains=None: "held-out text " * 200)
    (tmp_path / "q8.gguf").write_bytes(b"GGUF" * 12_500)  # 0.05 MB
    (tmp_path / "f32.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("ACCEL_HOME", str(tmp_path / "home"))
    fake_quantize_tools(tmp_path)
    recipe = parse_recipe({"name": "p", "model": {"path": str(base_dir)}, "speculation": {"method": "none"}, "eval": {
        "speed": False, "gguf_base": str(tmp_path / "f32.gguf"),
        "llama_perplexity": str(_fake_binary(tmp_path, tmp_path / "calls.txt")),
        "peers": [{"name": "llama.cpp-Q4_K_M-imatrix", "quantize": "Q4_K_M+imatrix"},
                  {"name": "llama.cpp-Q8_0", "gguf": str(tmp_path / "q8.gguf")}]}})
    got = llama_scale(recipe, base_dir, ck, _Tok(), Path(__file__).resolve().parents[2])
    made = next((tmp_path / "home" / "peers" / "gguf").glob("f32.Q4_K_M-imatrix-*.gguf"))
    assert made.is_file() and f"-m {made} " in (tmp_path / "calls.txt").read_text()
    assert got["llama.cpp-Q4_K_M-imatrix"]["kld_llama"] == pytest.approx(0.004512)
    assert got["baseline"] == {"kld_llama": 0.0, "top1_llama": 1.0, "ppl_ratio_llama": 1.0}
    assert 0 < got["quantized"]["kld_llama"] < 1 and 0 < got["quantized"]["top1_llama"] <= 1
    assert got["llama.cpp-Q8_0"] == pytest.approx({"kld_llama": 0.004512, "top1_llama": 0.96571,
                                                   "ppl_ratio_llama": 1.005053})
    # in eval.json the peer is a variant with its quality and its file's size, next to the accel variants
    import accel.pipeline.evaluate as ev

    monkeypatch.setattr(ev, "quality", lambda *a: {"baseline": {"kl_mean": 0.0}, "quantized": {"kl_mean": 0.1}})
    out = evaluate(recipe, base_dir, ck, None, _Tok(), tmp_path)
    made_peer, peer = out["variants"][-2:]
    assert made_peer["name"] == "llama.cpp-Q4_K_M-imatrix" and made_peer["size_mb"] == 0.0  # the fake's 1 byte
    assert peer["name"] == "llama.cpp-Q8_0" and peer["size_mb"] == 0.05 and peer["speed"] == {}
    # every variant's bits per parameter count the whole file: the fp32 baseline is 32 bits plus its header
    assert 32.0 <= out["variants"][0]["avg_bits"] < 32.5 and out["variants"][1]["avg_bits"] < 32
    assert peer["avg_bits"] == pytest.approx(8 * 50_000 / ev.num_params(base_dir), abs=0.01)
    assert peer["quality"]["kld_llama"] == pytest.approx(0.004512)
    assert out["variants"][1]["quality"]["kl_mean"] == 0.1 and "kld_llama" in out["variants"][1]["quality"]
