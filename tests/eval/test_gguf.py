"""accel.eval.gguf: llama-perplexity's output parsed, and the scoring's two-step protocol driven against a fake
binary (the real one is built by scripts/peers/build_llama_cpp.sh, not in CI)."""

from __future__ import annotations

import hashlib
import json
import stat
import sys
from pathlib import Path

import pytest

from accel.eval.gguf import (IMATRIX_TEXT_CHARS, calibration_text, imatrix_chunks, llama_perplexity_path, parse_kld,
                             quantized_gguf, score_ggufs)

ROOT = Path(__file__).resolve().parents[2]

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


def fake_quantize_tools(bin_dir: Path) -> Path:
    """A llama-imatrix and a llama-quantize in bin_dir that record their argv (in the returned calls.jsonl) and write
    their output file; llama-imatrix also keeps the text it was given (bin_dir / seen.txt)."""
    log = bin_dir / "calls.jsonl"
    for tool in ("llama-imatrix", "llama-quantize"):
        script = bin_dir / tool
        out_arg = "-o" if tool == "llama-imatrix" else None
        script.write_text(
            f"#!{sys.executable}\nimport json, sys\n"
            f"open({str(log)!r}, 'a').write(json.dumps(sys.argv) + '\\n')\n"
            + (f"open(sys.argv[sys.argv.index({out_arg!r}) + 1], 'w').write('m')\n" if out_arg else
               "open(sys.argv[-2], 'w').write('q')\n")
            + ("import pathlib; t = pathlib.Path(sys.argv[sys.argv.index('-f') + 1]).read_text()\n"
               f"open({str(bin_dir / 'seen.txt')!r}, 'w').write(t)\n" if out_arg else ""))
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return log


def test_importance_matrix_reads_chunks_in_proportion_to_the_model(tmp_path):
    """llama-imatrix's cost is tokens x parameters: a 1.78B F32 file (Qwen2.5-Coder-1.5B) reads 158 chunks of 128
    tokens, a 135M one (SmolLM2) more than the 200k-character text holds (read whole)."""
    f = tmp_path / "model.F32.gguf"
    with f.open("wb") as out:
        out.truncate(4 * 1_777_088_000)
    assert imatrix_chunks(f) == 158
    with f.open("r+b") as out:
        out.truncate(4 * 134_515_008)
    assert imatrix_chunks(f) * 128 > 2 * IMATRIX_TEXT_CHARS // 3


def test_peers_with_an_importance_matrix_learn_it_from_the_calibration_text_only(tmp_path, monkeypatch):
    """`TYPE+imatrix` peers: llama-imatrix runs once over calibration_data/ (never the eval text), and
    llama-quantize takes it for those peers only; plain k- / i-quant peers are quantized without it."""
    log = fake_quantize_tools(tmp_path)
    monkeypatch.setenv("ACCEL_HOME", str(tmp_path / "home"))
    f32 = tmp_path / "model.F32.gguf"
    f32.write_text("f")
    files = {k: quantized_gguf(tmp_path, f32, k, ROOT, 2) for k in ["Q4_K_M+imatrix", "IQ4_XS+imatrix", "Q3_K_M"]}
    tag = f"{hashlib.sha256(calibration_text(ROOT).encode()).hexdigest()[:8]}-c{imatrix_chunks(f32)}"
    assert {k: v.name for k, v in files.items()} == {"Q4_K_M+imatrix": f"model.Q4_K_M-imatrix-{tag}.gguf",
                                                     "IQ4_XS+imatrix": f"model.IQ4_XS-imatrix-{tag}.gguf",
                                                     "Q3_K_M": "model.Q3_K_M.gguf"}
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [Path(c[0]).name for c in calls] == ["llama-imatrix", "llama-quantize", "llama-quantize", "llama-quantize"]
    assert calls[0][1:] == ["-m", str(f32), "-f", calls[0][4], "-o", calls[0][6], "-c", "128", "-b", "128", "-t", "2",
                            "--no-ppl", "--chunks", str(imatrix_chunks(f32))]
    assert (tmp_path / "home" / "peers" / "gguf" / f"model.F32.imatrix-{tag}.gguf").is_file()  # renamed once done
    assert [("--imatrix" in c) for c in calls[1:]] == [True, True, False]
    seen = (tmp_path / "seen.txt").read_text()
    assert seen == calibration_text(ROOT) and "Happy birthday, Grandma" in seen
    held_out = [json.loads(line)["text"] for f in (ROOT / "eval" / "text").glob("*.jsonl")
                for line in f.read_text().splitlines() if line.strip()]
    assert held_out and not any(t[:200] in seen for t in held_out)
    # a stratified draw of calibration_data/: every domain file, in turn, up to IMATRIX_TEXT_CHARS
    assert IMATRIX_TEXT_CHARS - 20_000 < len(seen) <= IMATRIX_TEXT_CHARS
    for f in (ROOT / "calibration_data").glob("*.jsonl"):
        assert json.loads(f.read_text().splitlines()[0])["text"] in seen
    quantized_gguf(tmp_path, f32, "Q3_K_M", ROOT, 2)  # made once
    assert len(log.read_text().splitlines()) == 4
    with pytest.raises(ValueError, match="'IQ3_XXS' is not allowed"):
        quantized_gguf(tmp_path, f32, "IQ3_XXS", ROOT)


def test_a_registry_models_base_is_its_shipped_gguf_at_f32_made_once(tmp_path, monkeypatch):
    from accel.eval.gguf import original_gguf
    from accel.hub import get_spec

    monkeypatch.setenv("ACCEL_HOME", str(tmp_path / "home"))
    log = fake_quantize_tools(tmp_path)
    with pytest.raises(FileNotFoundError, match="accel models pull smollm2-135m"):
        original_gguf("smollm2-135m", tmp_path)
    shipped = tmp_path / "home" / "downloads" / get_spec("smollm2-135m").gguf_file
    shipped.parent.mkdir(parents=True)
    shipped.write_bytes(b"GGUF")
    got = original_gguf("smollm2-135m", tmp_path)
    assert got.name == "SmolLM2-135M-Instruct.Q4_1.F32.gguf" and got.is_file()
    assert original_gguf("smollm2-135m", tmp_path) == got
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 1 and calls[0][1:3] == ["--allow-requantize", str(shipped)] and calls[0][-1] == "F32"
