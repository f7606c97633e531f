"""Quality and file size of accel exports next to llama.cpp's quantizations of the same weights, scored the same
way: `llama-perplexity -c 128 --kl-divergence` (non-overlapping 128-token chunks of the held-out eval text, the
second half of each scored; accel.eval.chunked does the same for the exports).

    .venv/bin/python scripts/bench_quality.py runs/default/checkpoint runs/int8/checkpoint \
        [--model smollm2-135m] [--peers Q8_0,Q4_K_M,Q4_1,Q4_K_M+imatrix,IQ4_XS+imatrix,shipped] [--n-ctx 128] \
        [--chunks 150]

A peer `TYPE+imatrix` is quantized from the F32 with an importance matrix, as GGUF publishers make them:
`llama-imatrix` over the project's calibration text (calibration_data/, never the eval text), then
`llama-quantize --imatrix` (types: Q4_K_M, IQ4_XS, Q3_K_M, IQ3_M, Q2_K, IQ3_XXS; plain IQ4_XS / Q3_K_M / Q2_K too).

Base: the original fp32 model (accel's model zoo) for accel rows, its F32 GGUF for llama.cpp rows (the same
weights; both PPLs are printed as a check that the two tokenizers and chunkings agree). Exports run as accel serves
them (accel.kernels.loader.load_hf_model: the stored integers, W8A8's activations rounded as vLLM rounds them, as
the pipeline's evaluate stage scores them), as each llama.cpp file runs in llama.cpp. llama.cpp comes from
scripts/peers (built once per machine, see bench_peers.py). Not in CI (it builds llama.cpp); tests/test_bench_quality.py
covers the parsing and the table with a fake peer.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]
PEER_PAIRS = {"Q8_0": "int8", "Q4_K_M": "int4km", "Q4_1": "int4", "F32": "fp32"}  # GGUF type -> bench_peers pair


SHIPPED = "shipped"  # the registry model's own GGUF: its F32 is the base, so it scores llama.cpp's compute error only


def allowed_peers() -> list[str]:
    from accel.eval.gguf import quantize_types

    return list(dict.fromkeys([*PEER_PAIRS, *quantize_types(), SHIPPED]))


def render(rows: list[dict]) -> str:
    """One Markdown table: model file, size, mean KLD, same top-1, PPL ratio, scored tokens."""
    lines = ["| model file | size | mean KLD vs original | same top-1 | PPL ratio | scored tokens |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['size_mib']:.0f} MiB | {r['kld_mean']:.4f} | {100 * r['same_top1']:.1f}% | "
                     f"{r['ppl_ratio']:.3f} | {r['num_tokens']} |")
    return "\n".join(lines)


def model_file_mib(path: Path) -> float:
    """The weights' bytes: a GGUF file, or the safetensors files of a checkpoint folder."""
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) / 2**20


def peer_rows(model: str, peers: list[str], text: str, n_ctx: int, chunks: int, threads: int) -> list[dict]:
    from bench_peers import PAIRS, llama_bin, make_ggufs

    from accel.eval.gguf import LLAMA_PERPLEXITY, quantized_gguf, score_ggufs

    bin_dir = llama_bin()
    pairs = [p for p in peers if p in PEER_PAIRS]
    files = make_ggufs(bin_dir, ["fp32"] + [PEER_PAIRS[p] for p in pairs], model, own_file=False)
    assert all(PAIRS[PEER_PAIRS[kind]][2] == kind for kind in pairs)
    if SHIPPED in peers:
        from bench_peers import accel_home, shipped_type

        from accel.hub import get_spec

        files[SHIPPED] = accel_home() / "downloads" / get_spec(model).gguf_file
        shipped = f"{SHIPPED} {shipped_type(files[SHIPPED])}"
    files.update({p: quantized_gguf(bin_dir, files["F32"], p, ROOT, threads) for p in peers
                  if p not in PEER_PAIRS and p != SHIPPED})
    scores = score_ggufs(bin_dir / LLAMA_PERPLEXITY, files["F32"], {kind: files[kind] for kind in peers}, text,
                         n_ctx, chunks, threads)
    return [{"name": f"llama.cpp {shipped if kind == SHIPPED else kind}", "size_mib": model_file_mib(files[kind]),
             **asdict(s)} for kind, s in scores.items()]


def accel_rows(model: str, exports: list[Path], text: str, n_ctx: int, chunks: int) -> tuple[list[dict], float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accel.eval.chunked import score_chunks, text_chunks
    from accel.kernels.loader import load_hf_model
    from accel.hub import resolve_model

    base_dir = resolve_model(model)
    tok = AutoTokenizer.from_pretrained(base_dir)
    batch = text_chunks(tok, text, n_ctx, chunks)
    models = {str(p): load_hf_model(p) for p in exports}
    t0 = time.perf_counter()
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    scores = score_chunks(base, models, batch,
                          on_batch=lambda n: print(f"\r  scored {n}/{batch.shape[0]} chunks", end="", file=sys.stderr))
    print(f"\r  scored {batch.shape[0]} chunks in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    rows = [{"name": f"accel {p}", "size_mib": model_file_mib(p), "kld_mean": s.kld_mean, "same_top1": s.same_top1,
             "ppl_ratio": s.ppl_ratio, "num_tokens": s.num_tokens} for p, s in zip(exports, scores.values())]
    return rows, next(iter(scores.values())).ppl_base if scores else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("exports", nargs="*", type=Path, help="accel export folders (e.g. runs/default/checkpoint)")
    ap.add_argument("--model", default="smollm2-135m", help="registry name: the base (fp32) and the peers' source")
    ap.add_argument("--peers", default="Q8_0,Q4_K_M,Q4_1",
                    help=f"GGUF types, of {', '.join(allowed_peers())}; '' for none")
    ap.add_argument("--n-ctx", type=int, default=128)
    ap.add_argument("--chunks", type=int, default=150, help="chunks scored (round-robin over the eval domains)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    peers = [p for p in args.peers.split(",") if p]
    bad = [p for p in peers if p not in allowed_peers()]
    if bad:
        ap.error(f"--peers {bad} are invalid; allowed: {', '.join(allowed_peers())}")
    missing = [str(p) for p in args.exports if not (p / "config.json").is_file()]
    if missing:
        ap.error(f"{missing} are not checkpoint folders (no config.json)")
    import torch

    torch.set_num_threads(args.threads)
    from accel.eval.chunked import held_out_text

    from accel.bench.ledger import Entry, figure

    text = held_out_text(ROOT / "eval" / "text")
    with Entry(f"quality-{args.model}") as entry:
        rows, ppl_base = (accel_rows(args.model, args.exports, text, args.n_ctx, args.chunks) if args.exports
                          else ([], None))
        if peers:
            rows += peer_rows(args.model, peers, text, args.n_ctx, args.chunks, args.threads)
        entry.info = {"model": args.model, "n_ctx": args.n_ctx, "chunks": args.chunks,
                      "rows": [r["name"] for r in rows]}
        entry.figures = {f"{r['name']}.{k}": figure([r[k]], unit) for r in rows
                         for k, unit in (("size_mib", "MiB"), ("kld_mean", "nats"), ("same_top1", ""))
                         if isinstance(r.get(k), (int, float))}
    print(render(rows))
    peer_base = next((r["ppl_base"] for r in rows if "ppl_base" in r), None)
    print(f"\nbase PPL: accel fp32 {ppl_base if ppl_base is not None else '-'}, llama.cpp F32 "
          f"{peer_base if peer_base is not None else '-'} (n_ctx {args.n_ctx}, {args.chunks} chunks)")


if __name__ == "__main__":
    main()
