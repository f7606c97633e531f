"""GGUF files scored by llama.cpp's own `llama-perplexity --kl-divergence`, on the scale `accel.eval.chunked` scores
accel's models (non-overlapping chunks of n_ctx tokens, the second half of each scored), so a llama.cpp quantization
and an accel plan sit in one table.

    scores = score_ggufs(llama_perplexity_path(None), base_gguf, {"Q4_K_M": path}, text, n_ctx=128, chunks=150)
    scores["Q4_K_M"].kld_mean

The base GGUF holds the original weights (llama-perplexity's KL reference); its logits are saved once and every
file is scored against them.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from accel.hub.zoo import accel_home

N_CTX = 128  # llama-perplexity -c 128: the context the peers' published quality numbers use
CHUNKS = 150  # ~9,400 scored tokens of the held-out text (round-robin over its domains)
LLAMA_PERPLEXITY = "llama-perplexity"
IMATRIX = "+imatrix"  # a peer type with this suffix is quantized with an importance matrix, as GGUF publishers do
IMATRIX_TYPES = ("Q4_K_M", "IQ4_XS", "Q3_K_M", "IQ3_M", "Q2_K", "IQ3_XXS")  # types an importance matrix serves
PLAIN_TYPES = ("Q8_0", "Q4_1", "Q4_K_M", "IQ4_XS", "Q3_K_M", "Q2_K")  # made without one (IQ3_M / IQ3_XXS need one)
IMATRIX_CTX = 128  # llama-imatrix's context: the scoring's
# ~60k tokens, 4x what accel's calibration draw sees (32 x 512); llama-imatrix computes every position's logits, so its
# time is tokens x vocabulary (Gemma 3: 262k)
IMATRIX_TEXT_CHARS = 200_000
# llama-imatrix's cost is tokens x parameters: at most this many token-parameters, the whole text up to Gemma 3 270M's
# size (134k tokens' worth), 158 chunks of 128 (20k tokens) for Qwen2.5-Coder-1.5B's 1.78B
IMATRIX_TOKEN_PARAMS = 36 * 10**12


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


def quantize_types() -> list[str]:
    """The llama-quantize types a peer may be made at from the original GGUF: `TYPE` or `TYPE+imatrix`."""
    return [*PLAIN_TYPES, *(t + IMATRIX for t in IMATRIX_TYPES)]


def calibration_text(root: Path, max_chars: int = IMATRIX_TEXT_CHARS) -> str:
    """What llama-imatrix learns from: the texts of calibration_data/*.jsonl taken in turn from each domain file (a
    stratified draw, as accel's calibration set is) up to max_chars. Accel's plans calibrate on the same files; the
    eval text stays held out of both."""
    import itertools
    import json

    domains = [[json.loads(line)["text"] for line in f.read_text().splitlines() if line.strip()]
               for f in sorted((root / "calibration_data").glob("*.jsonl"))]
    out, size = [], 0
    for text in (t for row in itertools.zip_longest(*domains) for t in row if t is not None):
        if size + len(text) > max_chars:
            break
        out.append(text)
        size += len(text) + 2
    return "\n\n".join(out)


def imatrix_chunks(base: Path) -> int:
    """How many IMATRIX_CTX chunks llama-imatrix reads at most from an F32 base: IMATRIX_TOKEN_PARAMS over the file's
    parameters (its bytes / 4); a text with fewer is read whole."""
    return max(IMATRIX_TOKEN_PARAMS // max(base.stat().st_size // 4, 1) // IMATRIX_CTX, 1)


def quantized_gguf(bin_dir: Path, base: Path, kind: str, root: Path, threads: int = 2) -> Path:
    """The base GGUF (the original weights) quantized by llama-quantize at `kind` (one of quantize_types()), made
    once into $ACCEL_HOME/peers/gguf. `TYPE+imatrix` first runs llama-imatrix over the project's calibration text
    (never the eval text), once per base file, as GGUF publishers make their files."""
    if kind not in quantize_types():
        raise ValueError(f"llama-quantize type {kind!r} is not allowed; allowed: {quantize_types()}")
    out_dir = accel_home() / "peers" / "gguf"
    out_dir.mkdir(parents=True, exist_ok=True)
    plain, with_imatrix = kind.removesuffix(IMATRIX), kind.endswith(IMATRIX)
    stem = base.name.removesuffix(".gguf").removesuffix(".F32")
    text = calibration_text(root)
    chunks = imatrix_chunks(base)
    tag = f"{hashlib.sha256(text.encode()).hexdigest()[:8]}-c{chunks}"  # a cached matrix: the same text and chunks
    imatrix = out_dir / f"{stem}.F32.imatrix-{tag}.gguf"
    if with_imatrix and not imatrix.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            text_file = Path(tmp) / "calibration.txt"
            text_file.write_text(text)
            partial = out_dir / f"{stem}.F32.imatrix-{tag}.partial.gguf"  # llama-imatrix saves as it goes: only a finished one counts
            subprocess.run([str(bin_dir / "llama-imatrix"), "-m", str(base), "-f", str(text_file), "-o",
                            str(partial), "-c", str(IMATRIX_CTX), "-b", str(IMATRIX_CTX), "-t", str(threads),
                            "--no-ppl", "--chunks", str(chunks)], check=True, capture_output=True)
            partial.rename(imatrix)
    dst = out_dir / f"{stem}.{plain}{f'-imatrix-{tag}' if with_imatrix else ''}.gguf"
    if not dst.is_file():
        tmp_dst = dst.with_suffix(".partial.gguf")
        subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize",
                        *(["--imatrix", str(imatrix)] if with_imatrix else []), str(base), str(tmp_dst), plain],
                       check=True, capture_output=True)
        tmp_dst.rename(dst)
    return dst


def original_gguf(model: str, bin_dir: Path) -> Path:
    """A registry model's shipped GGUF at F32 (llama-quantize), the weights accel's baseline loads: the KL reference
    and the source of its `quantize` peers. Made once into $ACCEL_HOME/peers/gguf (bench_peers.py makes the same)."""
    from accel.hub import get_spec

    src = accel_home() / "downloads" / get_spec(model).gguf_file
    if not src.is_file():
        raise FileNotFoundError(f"{src} is missing: run `accel models pull {model}` first")
    out_dir = accel_home() / "peers" / "gguf"
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / f"{src.name.removesuffix('.gguf')}.F32.gguf"
    if not dst.is_file():
        tmp_dst = dst.with_suffix(".partial.gguf")
        subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(src), str(tmp_dst), "F32"],
                       check=True, capture_output=True)
        tmp_dst.rename(dst)
    return dst


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


@dataclass
class BaseLogits:
    """A `llama-perplexity --kl-divergence-base` file: its chunks' tokens and, for the second half of each chunk,
    llama.cpp's log-probabilities (stored as uint16 steps between a minimum and the maximum, 16 nats apart)."""

    path: Path
    n_ctx: int
    n_vocab: int
    tokens: object  # np.ndarray [C, n_ctx] int32, as tokenized (the first of each chunk is replaced by BOS on use)

    HEADER = b"_logits_"

    @classmethod
    def read(cls, path: Path) -> BaseLogits:
        import numpy as np

        with open(path, "rb") as f:
            if f.read(8) != cls.HEADER:
                raise ValueError(f"{path} is not a llama-perplexity --kl-divergence-base file")
            n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(f.read(12), dtype=np.int32))
            tokens = np.frombuffer(f.read(4 * n_chunk * n_ctx), dtype=np.int32).reshape(n_chunk, n_ctx)
        return cls(Path(path), n_ctx, n_vocab, tokens)

    @property
    def first(self) -> int:
        return self.n_ctx // 2

    def log_probs(self, chunk: int):
        """[n_ctx - 1 - first, n_vocab] float32 torch tensor: llama.cpp's log-probs of the positions first..n_ctx-2
        (each predicting the next token) in `chunk`."""
        import numpy as np
        import torch

        nv = 2 * ((self.n_vocab + 1) // 2) + 4
        rows = self.n_ctx - 1 - self.first
        offset = 20 + 4 * self.tokens.size + chunk * rows * nv * 2
        raw = np.fromfile(self.path, dtype=np.uint16, count=rows * nv, offset=offset).reshape(rows, nv)
        head = raw[:, :4].copy().view(np.float32)  # [rows, 2]: scale, min log-prob
        q = torch.from_numpy(raw[:, 4:4 + self.n_vocab].astype(np.float32))
        return q * torch.from_numpy(head[:, :1].copy()) + torch.from_numpy(head[:, 1:2].copy())


def kld_vs_base(base: BaseLogits, logits_of, bos_token_id: int | None) -> dict[str, float]:
    """Mean KLD(llama.cpp || model) and same top-1 over every scored position of `base`, as llama-perplexity
    computes them (base log-probs under -16 are left out of the sum). logits_of(ids [n_ctx] long) -> logits
    [n_ctx, vocab] of the model under test. `bos_token_id`: each chunk's first token becomes it, as llama-perplexity
    does where the vocabulary adds a BOS (None where it adds none: Qwen2.5)."""
    import torch

    klds, same = [], []
    for c in range(base.tokens.shape[0]):
        ids = torch.from_numpy(base.tokens[c].astype("int64"))
        if bos_token_id is not None:
            ids[0] = bos_token_id
        ours = torch.log_softmax(logits_of(ids)[base.first:base.n_ctx - 1].float(), dim=-1)
        theirs = base.log_probs(c)
        p = theirs.exp() * (theirs > -16)
        klds.append((p * (theirs - ours)).sum(-1))
        same.append(ours.argmax(-1) == theirs.argmax(-1))
    kld, top1 = torch.cat(klds), torch.cat(same)
    return {"kld_mean": kld.mean().item(), "kld_p99": kld.quantile(0.99).item(),
            "same_top1": top1.float().mean().item(), "num_tokens": int(kld.numel())}
