"""accel.eval.gguf: llama-perplexity's output parsed, and the scoring's two-step protocol driven against a fake
binary (the real one is built by scripts/peers/build_llama_cpp.sh, not in CI)."""

from __future__ import annotations

import stat
import sys

import pytest

from accel.eval.gguf import llama_perplexity_path, parse_kld, score_ggufs

# the tail of `llama-perplexity --kl-divergence-base base.kld --kl-divergence` (lines not read trimmed)
KLD_OUTPUT = """
====== Perplexity statistics ======
Mean PPL(Q)                   :   9.803251 ±   0.232071
Mean PPL(base)                :   9.753967 ±   0.230675
Cor(ln(PPL(Q)), ln(PPL(base))):  99.87%
Mean ln(PPL(Q)/PPL(base))     :   0.005040 ±   0.001211
Mean PPL(Q)/PPL(base)         :   1.005053 ±   0.001217
Mean PPL(Q)-PPL(base)         :   0.049284 ±   0.011887

====== KL divergence statistics ======
Mean    KLD:   0.004512 ±   0.000109
Maximum KLD:   0.361245

====== Token probability statistics ======
Mean    Δp: -0.036 ± 0.015 %
Same top p: 96.571 ± 0.187 %
"""


def test_llama_perplexity_kld_output_is_parsed():
    out = parse_kld(KLD_OUTPUT)
    assert out == pytest.approx({"kld_mean": 0.004512, "same_top1": 0.96571, "ppl_ratio": 1.005053,
                                 "ppl": 9.803251, "ppl_base": 9.753967})
    with pytest.raises(ValueError, match="no 'kld_mean' line"):
        parse_kld(KLD_OUTPUT.replace("Mean    KLD", "Mean KL"))


def _fake_binary(tmp_path, log):
    """A llama-perplexity that records its arguments, writes the base logits file when asked, and prints KLD_OUTPUT
    when scoring (a model file named bad.gguf fails; amx.gguf segfaults unless weights are not repacked, as llama.cpp's
    AMX path for Q8_0 does on some Xeon VMs)."""
    script = tmp_path / "llama-perplexity"
    script.write_text(f"""#!{sys.executable}
import sys
args = sys.argv[1:]
open({str(log)!r}, "a").write(" ".join(args) + "\\n")
model = args[args.index("-m") + 1]
if model.endswith("bad.gguf"):
    sys.exit("failed to load model")
if model.endswith("amx.gguf") and "--no-repack" not in args:
    import os, signal
    os.kill(os.getpid(), signal.SIGSEGV)
if "--kl-divergence" in args:
    print({KLD_OUTPUT!r})
else:
    open(args[args.index("--kl-divergence-base") + 1], "w").write("logits")
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_score_ggufs_saves_the_base_logits_once_and_scores_each_file_against_them(tmp_path):
    log = tmp_path / "calls.txt"
    binary = _fake_binary(tmp_path, log)
    got = score_ggufs(binary, tmp_path / "f32.gguf", {"Q8_0": tmp_path / "q8.gguf", "Q4_K_M": tmp_path / "q4.gguf"},
                      "held-out text", n_ctx=128, chunks=10, threads=2)
    assert list(got) == ["Q8_0", "Q4_K_M"]
    assert got["Q8_0"].kld_mean == pytest.approx(0.004512) and got["Q8_0"].num_tokens == 10 * 63
    calls = log.read_text().splitlines()
    assert len(calls) == 3
    base = calls[0].split()
    assert base[:2] == ["-t", "2"] and base[base.index("-m") + 1].endswith("f32.gguf")
    assert base[base.index("-c") + 1] == "128" and base[base.index("--chunks") + 1] == "10"
    logits = base[base.index("--kl-divergence-base") + 1]
    assert all(f"--kl-divergence-base {logits} --kl-divergence" in c for c in calls[1:])
    with pytest.raises(RuntimeError, match="bad.gguf .* failed"):
        score_ggufs(binary, tmp_path / "f32.gguf", {"x": tmp_path / "bad.gguf"}, "text")


def test_the_binary_defaults_to_the_one_the_peer_build_makes(monkeypatch, tmp_path):
    monkeypatch.setenv("ACCEL_HOME", str(tmp_path))
    assert llama_perplexity_path(None) == tmp_path / "peers" / "llama.cpp" / "bin" / "llama-perplexity"
    assert llama_perplexity_path("/opt/llama/llama-perplexity").name == "llama-perplexity"


def test_a_peer_that_crashes_repacked_is_scored_without_repacking(tmp_path):
    log = tmp_path / "calls.txt"
    got = score_ggufs(_fake_binary(tmp_path, log), tmp_path / "f32.gguf", {"Q8_0": tmp_path / "amx.gguf"}, "text")
    assert got["Q8_0"].kld_mean == pytest.approx(0.004512)
    calls = log.read_text().splitlines()
    assert len(calls) == 3 and "--no-repack" not in calls[1] and calls[2].endswith("--no-repack")
