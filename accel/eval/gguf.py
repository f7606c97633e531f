"""GGUF files scored by llama.cpp's own `llama-perplexity --kl-divergence`, on the scale `accel.eval.chunked` scores
accel's models (non-overlapping chunks of n_ctx tokens, the second half of each scored), so a llama.cpp quantization
and an accel plan sit in one table.

    scores = score_ggufs(llama_perplexity_path(None), base_gguf, {"Q4_K_M": path}, text, n_ctx=128, chunks=150)
    scores["Q4_K_M"].kld_mean

The base GGUF holds the original weights (llama-perplexity's KL reference); its logits are saved once and every
file is scored against them.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from accel.models.zoo import accel_home

N_CTX = 128  # llama-perplexity -c 128: the context the peers' published quality numbers use
CHUNKS = 150  # ~9,400 scored tokens of the held-out text (round-robin over its domains)
LLAMA_PERPLEXITY = "llama-perplexity"


@dataclass
class GgufScores:
    kld_mean: float
    same_top1: float  # fraction
    ppl_ratio: float
    ppl: float
    ppl_base: float
    num_tokens: int


def parse_kld(output: str) -> dict[str, float]:
    """`llama-perplexity --kl-divergence` output -> mean KLD, same top-1 (fraction), PPL ratio and both PPLs."""
    patterns = {"kld_mean": r"Mean\s+KLD:\s+([-0-9.]+)", "same_top1": r"Same top p:\s+([0-9.]+)",
                "ppl_ratio": r"Mean PPL\(Q\)/PPL\(base\)\s*:\s*([0-9.]+)", "ppl": r"Mean PPL\(Q\)\s*:\s*([0-9.]+)",
                "ppl_base": r"Mean PPL\(base\)\s*:\s*([0-9.]+)"}
    out = {}
    for key, pattern in patterns.items():
        m = re.search(pattern, output)
        if m is None:
            raise ValueError(f"llama-perplexity printed no {key!r} line ({pattern}); its output ends with "
                             f"{output[-300:]!r}")
        out[key] = float(m.group(1))
    out["same_top1"] /= 100.0
    return out


def llama_perplexity_path(explicit: str | Path | None) -> Path:
    """The llama-perplexity binary: the given path, else the one scripts/peers/build_llama_cpp.sh builds into
    $ACCEL_HOME/peers/llama.cpp/bin."""
    return Path(explicit).expanduser() if explicit else accel_home() / "peers" / "llama.cpp" / "bin" / LLAMA_PERPLEXITY


def run_llama_perplexity(binary: Path, args: list[str], threads: int) -> str:
    """Run it; where it crashes on a signal, run it again without weight repacking: llama.cpp's AMX path for
    repacked Q8_0 segfaults on some Xeon VMs (scripts/bench_peers.py does the same for llama-server)."""
    res = subprocess.run([str(binary), "-t", str(threads), *args], capture_output=True, text=True)
    if res.returncode < 0:
        res = subprocess.run([str(binary), "-t", str(threads), *args, "--no-repack"], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{binary.name} {' '.join(args)} failed (exit {res.returncode}): {res.stderr[-500:]}")
    return res.stdout + res.stderr


def score_ggufs(binary: Path, base: Path, files: dict[str, Path], text: str, n_ctx: int = N_CTX,
                chunks: int = CHUNKS, threads: int = 2) -> dict[str, GgufScores]:
    """{name: scores} of each GGUF file against the base GGUF on `text`."""
    with tempfile.TemporaryDirectory() as tmp:
        text_file, logits = Path(tmp) / "text.txt", Path(tmp) / "base.kld"
        text_file.write_text(text)
        run_llama_perplexity(binary, ["-m", str(base), "-f", str(text_file), "-c", str(n_ctx), "-b", str(n_ctx),
                                      "--chunks", str(chunks), "--kl-divergence-base", str(logits)], threads)
        out = {}
        for name, path in files.items():
            got = parse_kld(run_llama_perplexity(binary, ["-m", str(path), "--kl-divergence-base", str(logits),
                                                          "--kl-divergence"], threads))
            out[name] = GgufScores(num_tokens=chunks * (n_ctx // 2 - 1), **got)
    return out
