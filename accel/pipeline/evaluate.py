"""The evaluate stage of `accel optimize`: quality, speed and speculation acceptance of the baseline and every
variant the recipe lists, as one JSON document (the report's input shape plus a flat `summary`).

- quality: `accel.eval.run_eval` of the quantized checkpoint (accel's INT8/INT4 kernels) against the fp baseline:
  perplexity, KL, top-1 agreement per domain, task accuracy of both.
- speed: the recipe's workloads (`eval.workloads`) on accel's runtime, in-process, for every variant: the
  baseline, the quantized checkpoint (loaded from the compressed-tensors files, as `accel serve` would) and the
  "+spec" variants through an engine that speculates with the recipe's proposer.
- speculation: greedy acceptance of the recipe's proposer (n-gram or draft model) replayed offline on the
  serving target's greedy continuations of held-out prompts (exactly the counters greedy verification would
  produce; see `accel.draft_training.acceptance_replay`), with Leviathan's predicted speedup.

Variants: "baseline" (always, first: the reference for ratios), "quantized", "quantized+spec", "baseline+spec".
A "+spec" variant carries its target's quality (greedy speculation is lossless) and the measured acceptance.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from accel import memory

SPEC_EVAL_PROMPTS = 6
"""Held-out prompts whose greedy continuations the proposer is replayed on."""
SPEC_EVAL_NEW_TOKENS = 48
BENCH_TEXTS_PER_DOMAIN = 3
"""Held-out documents per domain the speed workloads cut their prompts from."""
TASK_EXAMPLES = 8
"""Examples per task file (5 files): keeps the default recipe's evaluation within a few minutes on 2 CPU cores."""


def engine_kwargs(recipe) -> dict[str, Any]:
    """The recipe's `runtime:` section (RuntimeConfig, every field) and the model's dtype as EngineConfig fields."""
    return {**recipe.runtime.runtime_fields(), "dtype": recipe.model.dtype}


def eval_device(recipe) -> str:
    """Where quality evaluation runs: the recipe's model.device, auto = CUDA when torch sees one."""
    import torch

    if recipe.model.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return recipe.model.device


def quality(recipe, base_path: Path, quant_dir: Path | None, tokenizer, root: Path, progress: bool) -> dict:
    """{"baseline": quality dict, "quantized": quality dict | absent} in the report's `quality` shape."""
    from accel.eval.runner import run_eval
    from accel.kernels.loader import load_hf_model
    from accel.memory import large_blocks_mapped

    e = recipe.eval
    kw = dict(text_dir=root / "eval" / "text", tasks_dir=root / "eval" / "tasks", domains=e.domains, window=e.window,
              max_windows_per_domain=e.max_windows_per_domain, tasks=e.tasks, max_examples_per_task=TASK_EXAMPLES,
              tokenizer=tokenizer, progress=progress, device=eval_device(recipe))
    with large_blocks_mapped():  # batch work: its temporaries go back to the system when freed
        if quant_dir is None:
            return {"baseline": run_eval(str(base_path), **kw).summary()}
        r = run_eval(load_hf_model(quant_dir), baseline=str(base_path), **kw).summary()
    base = {"ppl": r.get("ppl_baseline"), "ppl_increase_pct": 0.0, "kl_mean": 0.0, "top1": 1.0,
            "per_domain": {d: {"ppl": m.get("ppl_baseline"), "kl_mean": 0.0, "top1": 1.0}
                           for d, m in r.get("per_domain", {}).items()}}
    if "task_accuracy_baseline" in r:
        base["task_accuracy"] = r["task_accuracy_baseline"]
    return {"baseline": base, "quantized": r}


LLAMA_SCALE_KEYS = {"kld_mean": "kld_llama", "same_top1": "top1_llama", "ppl_ratio": "ppl_ratio_llama"}


def base_gguf(recipe) -> Path:
    """The KL reference of the GGUF peers: eval.gguf_base, else the registry model's shipped GGUF at F32."""
    from accel.eval.gguf import llama_perplexity_path, original_gguf

    if recipe.eval.gguf_base:
        return Path(recipe.eval.gguf_base).expanduser()
    return original_gguf(recipe.model.path, llama_perplexity_path(recipe.eval.llama_perplexity).parent)


def peer_gguf(recipe, peer, root: Path, threads: int = 2) -> Path:
    """A peer's GGUF file: its `gguf`, or the base GGUF quantized at its `quantize` type (made once, cached)."""
    from accel.eval.gguf import llama_perplexity_path, quantized_gguf

    if peer.gguf:
        return Path(peer.gguf).expanduser()
    return quantized_gguf(llama_perplexity_path(recipe.eval.llama_perplexity).parent, base_gguf(recipe),
                          peer.quantize, root, threads)


def llama_scale(recipe, base_path: Path, quant_dir: Path | None, tokenizer, root: Path) -> dict[str, dict]:
    """Quality scored as `llama-perplexity -c 128 --kl-divergence` scores (accel.eval.chunked, accel.eval.gguf): the
    quantized variant against the baseline, each GGUF peer against `eval.gguf_base`, on the same held-out text.
    {variant or peer name: {kld_llama, top1_llama, ppl_ratio_llama}}; the baseline is the reference."""
    import torch
    from transformers import AutoModelForCausalLM

    from accel.eval.chunked import held_out_text, score_chunks, text_chunks
    from accel.eval.gguf import CHUNKS, N_CTX, llama_perplexity_path, score_ggufs
    from accel.kernels.loader import load_hf_model

    e = recipe.eval
    text = held_out_text(root / "eval" / "text", e.domains)
    out = {"baseline": {"kld_llama": 0.0, "top1_llama": 1.0, "ppl_ratio_llama": 1.0}}
    scores = {}
    if quant_dir is not None:
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32).eval()
        scores.update(score_chunks(base, {"quantized": load_hf_model(quant_dir)},
                                   text_chunks(tokenizer, text, N_CTX, CHUNKS)))
    threads = recipe.runtime.num_threads or torch.get_num_threads()
    ggufs = {p.name: peer_gguf(recipe, p, root, threads) for p in e.peers if p.gguf or p.quantize}
    scores.update(score_ggufs(llama_perplexity_path(e.llama_perplexity), base_gguf(recipe), ggufs, text,
                              N_CTX, CHUNKS, threads))
    for name, s in scores.items():
        out[name] = {key: getattr(s, attr) for attr, key in LLAMA_SCALE_KEYS.items()}
    return out


def bench_requests(recipe, tokenizer, root: Path) -> dict[str, list]:
    """Each workload's requests, built once (cut from a few held-out texts per domain) and sent to every model."""
    from accel.draft_training.prompts import load_samples
    from accel.bench.workload import Workload, build_requests

    per_domain: dict[str, int] = {}
    texts = []
    for s in load_samples(root / "eval" / "text"):
        if per_domain.get(s["domain"], 0) < BENCH_TEXTS_PER_DOMAIN:
            per_domain[s["domain"]] = per_domain.get(s["domain"], 0) + 1
            texts.append((s["domain"], s["text"]))
    return {wc.name: build_requests(Workload.from_config(wc), tokenizer, texts=texts) for wc in recipe.eval.workloads}


def speed(recipe, model_dir: Path, requests: dict[str, list], progress: bool, speculative=None) -> dict:
    """{workload name: BenchResult dict} for a model folder (plain or compressed-tensors) on accel's runtime;
    with `speculative` (a SpeculativeConfig) the engine speculates: a "+spec" variant's speed is measured, not
    predicted."""
    from accel.bench.backends import InProcessBackend
    from accel.bench.loadgen import bench_config_from_recipe, run_bench
    from accel.export.load import load_engine
    from accel.runtime.sampling_params import SamplingParams

    engine = load_engine(model_dir, **engine_kwargs(recipe), speculative=speculative)
    first = next(r for reqs in requests.values() for r in reqs)
    # one warm-up request here (the bench's own warm-up would tokenize its whole default corpus again)
    engine.generate([list(first.prompt_token_ids)], SamplingParams(max_tokens=4, temperature=0.0))
    backend = InProcessBackend(engine)
    out = {wc.name: _repeated(recipe, lambda: run_bench(backend, bench_config_from_recipe(wc, warmup=0),
                                                        requests[wc.name], progress=progress))
           for wc in recipe.eval.workloads}
    del engine, backend
    memory.collect()  # before the next model loads: a dropped model waits in reference cycles otherwise
    return out


def _repeated(recipe, run, server: str | None = None) -> dict:
    """`eval.repeats` runs of one workload -> the median run's BenchResult dict, with every run's tok/s in
    `repeats` and what else used the machine during it in `load` (a local `server` measured counts as the engine;
    per-request records stay out of eval.json; the distributions are kept)."""
    from accel.bench.probes import CpuLoad

    runs = []
    for _ in range(recipe.eval.repeats):
        with CpuLoad(server=server) as load:
            res = run()
        runs.append((res, load.to_dict()))
    runs.sort(key=lambda r: r[0].output_throughput)
    d = runs[len(runs) // 2][0].to_dict()
    d["records"] = []
    d["repeats"] = [r.output_throughput for r, _ in runs]
    d["load"] = [load for _, load in runs]
    return d


def peer_speed(recipe, peer, requests: dict[str, list], progress: bool) -> dict:
    """{workload name: BenchResult dict} of an OpenAI-compatible server (`eval.peers`), the same requests and
    client as the accel variants' in-process runs (text prompts: the peer may tokenize differently)."""
    from accel.bench.backends import OpenAIBackend
    from accel.bench.loadgen import bench_config_from_recipe, run_bench

    backend = OpenAIBackend(peer.url, peer.model, endpoint=peer.endpoint)
    return {wc.name: _repeated(recipe, lambda: run_bench(backend, bench_config_from_recipe(wc, warmup=1),
                                                         requests[wc.name], progress=progress), server=peer.url)
            for wc in recipe.eval.workloads}


def vllm_peer_speed(recipe, peer, folder: Path | None, requests: dict[str, list], progress: bool) -> tuple[dict, str]:
    """`peer_speed` of a vLLM-CPU server started on `folder` for the measurement (accel.export.vllm_serve), and the
    server's vLLM version."""
    from accel.export.vllm_serve import SERVED_NAME, VllmCpuServer
    from accel.hub import accel_home

    if folder is None:
        raise ValueError(f"eval.peers {peer.name!r}: vllm: quantized, but the run has no quantized checkpoint")
    with VllmCpuServer(Path(folder), accel_home() / "logs" / "vllm-cpu" / f"{peer.name}.txt",
                       threads=recipe.runtime.num_threads) as server:
        return peer_speed(recipe, peer.model_copy(update={"url": server.url, "model": SERVED_NAME}), requests,
                          progress), server.version()


def spec_acceptance(recipe, target, tokenizer, target_dir: Path, draft_dir: Path | None, root: Path) -> dict | None:
    """Offline greedy acceptance of the recipe's proposer against `target` (an HF model), or None."""
    from accel.draft_training.acceptance_replay import evaluate_proposer, target_continuations
    from accel.draft_training.prompts import build_prompts, input_grounded_prompts, load_samples
    from accel.speculative.proposer import DraftModelProposer, NgramProposer

    s = recipe.speculation
    samples = load_samples(root / "eval" / "text")
    if s.method == "ngram":
        proposer = NgramProposer(s.ngram_min_n, s.ngram_max_n)
        prompts = input_grounded_prompts(samples, SPEC_EVAL_PROMPTS)
    elif s.method in ("draft", "distilled") and draft_dir is not None:
        from accel.speculative.eagle import is_eagle_draft

        prompts = build_prompts(samples, SPEC_EVAL_PROMPTS, seed=0)
        if is_eagle_draft(draft_dir):  # reads the target's hidden states: measured inside the runtime
            return {"method": s.method, "prompts": "chat + instructions", "max_new_tokens": SPEC_EVAL_NEW_TOKENS,
                    **engine_acceptance(recipe, target_dir, draft_dir, prompts, tokenizer)}
        proposer = DraftModelProposer(draft_dir, target_dir=target_dir)
    else:
        return None
    conts = target_continuations(target, tokenizer, prompts, SPEC_EVAL_NEW_TOKENS, batch_size=4)
    ev = evaluate_proposer(proposer, conts, s.num_speculative_tokens,
                           target=target if isinstance(proposer, DraftModelProposer) else None)
    return {"method": s.method, "prompts": "input-grounded" if s.method == "ngram" else "chat + instructions",
            "max_new_tokens": SPEC_EVAL_NEW_TOKENS, **ev.to_dict()}


def engine_acceptance(recipe, target_dir: Path, draft_dir: Path, prompts: list[list[dict]], tokenizer) -> dict:
    """Greedy acceptance of a draft measured by accel's runtime on chat prompts (fixed k, all prompts drafted, by
    the draft alone), with the cost ratio the engine measured and Leviathan's predicted speedup at batch 1."""
    from accel.export.load import load_engine
    from accel.runtime.sampling_params import SamplingParams
    from accel.speculative.config import SpeculativeConfig
    from accel.speculative.stats import leviathan_speedup

    k = recipe.speculation.num_speculative_tokens
    spec = SpeculativeConfig(method="draft", draft_model=str(draft_dir), num_speculative_tokens=k, adaptive=False,
                             disable_above_batch_size=None, max_step_rows=None, draft_ngram_first=False)
    engine = load_engine(target_dir, **engine_kwargs(recipe), speculative=spec)
    # prompts cut like the offline path's (the last 384 tokens) and to what the model's length leaves for the reply
    keep = min(384, engine.scheduler.config.max_model_len - SPEC_EVAL_NEW_TOKENS - 1)
    from accel.draft_training.prompts import chat_ids

    ids = [chat_ids(tokenizer, m)[-keep:] for m in prompts]
    engine.generate(ids, SamplingParams(max_tokens=SPEC_EVAL_NEW_TOKENS, temperature=0.0))
    stats = engine.stats().spec_decode
    c = engine.spec.adaptive.measured_cost_ratio
    alpha = stats.acceptance_rate
    return {"k": k, "num_prompts": len(ids), **stats.to_dict(), "target_step_s": None, "draft_step_s": None,
            "cost_ratio": c, "predicted_speedup": None if alpha is None or c is None else leviathan_speedup(alpha, k, c)}


def _size_mb(folder: Path) -> float:
    return round(sum(f.stat().st_size for f in Path(folder).glob("*.safetensors")) / 1e6, 2)


def num_params(folder: Path) -> int:
    """The model's parameter count, from the safetensors headers of an unquantized folder (no tensor is read)."""
    import math

    from safetensors import safe_open

    total = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), "pt") as src:
            total += sum(math.prod(src.get_slice(k).get_shape()) for k in src.keys())
    return total


def file_bits(folder: Path, params: int) -> float | None:
    """Bits per model parameter of the whole file (weights, scales, zero points, the table and the norms)."""
    return round(8 * sum(f.stat().st_size for f in Path(folder).glob("*.safetensors")) / params, 2) if params else None


def _tok_s(speed_results: dict, workload: str | None) -> float | None:
    r = speed_results.get(workload) if workload else None
    return None if r is None else r["output_throughput"]


def summarize(recipe, q: dict, sp: dict, spec: dict | None) -> dict:
    """The flat headline numbers gates and the CLI read."""
    qq, qb = q.get("quantized", {}), q.get("baseline", {})
    b1 = next((w.name for w in recipe.eval.workloads if w.concurrency == 1),
              recipe.eval.workloads[0].name if recipe.eval.workloads else None)
    base_s, quant_s = sp.get("baseline", {}), sp.get("quantized", {})
    tb, tq = _tok_s(base_s, b1), _tok_s(quant_s, b1)
    acc_b, acc_q = qb.get("task_accuracy"), qq.get("task_accuracy")
    out = {
        "kl_mean": qq.get("kl_mean"), "kl_p99": qq.get("kl_p99"), "top1": qq.get("top1"),
        "ppl_base": qb.get("ppl"), "ppl_quant": qq.get("ppl"), "ppl_increase_pct": qq.get("ppl_increase_pct"),
        "task_accuracy_base": acc_b, "task_accuracy_quant": acc_q,
        "task_accuracy_ratio": (acc_q / acc_b) if acc_b and acc_q is not None else None,
        "batch1_workload": b1, "tok_s_batch1_base": tb, "tok_s_batch1_quant": tq,
        "speedup_batch1": (tq / tb) if tb and tq else None,
        "acceptance_rate": spec.get("acceptance_rate") if spec else None,
        "mean_acceptance_length": spec.get("mean_acceptance_length") if spec else None,
        "predicted_spec_speedup": spec.get("predicted_speedup") if spec else None,
    }
    for w in recipe.eval.workloads:
        b, qv = _tok_s(base_s, w.name), _tok_s(quant_s, w.name)
        out[f"speedup_{w.name}"] = (qv / b) if b and qv else None
    out["contended"] = contended(sp) if sp else None
    return out


def contended(sp: dict) -> str:
    """Every speed measurement another process or the hypervisor shared the machine with (its tok/s understate the
    engine), or "none"."""
    from accel.bench.probes import contended_runs

    return ", ".join(contended_runs((f"{name}/{wl}", res.get("load")) for name, per_wl in sp.items()
                                    for wl, res in per_wl.items())) or "none"


def evaluate(recipe, base_path: Path, quant_dir: Path | None, draft_dir: Path | None, tokenizer, root: Path,
             progress: bool = False) -> dict:
    """Everything the evaluate stage writes to eval.json."""
    import torch
    from transformers import AutoModelForCausalLM

    from accel.kernels.loader import load_hf_model
    from accel.report import machine_info
    from accel.speculative.config import SpeculativeConfig

    e = recipe.eval
    seconds: dict[str, float] = {}
    names = ["baseline"] + [v for v in e.variants if v != "baseline"]
    if quant_dir is None:
        names = [v for v in names if not v.startswith("quantized")]
    if recipe.speculation.method == "none":
        names = [v for v in names if not v.endswith("+spec")]

    t = time.perf_counter()
    q = quality(recipe, base_path, quant_dir, tokenizer, root, progress) if e.quality else {}
    memory.collect()  # the fp32 baseline of the quality pass goes before the speed runs load theirs (14.4 GB)
    if e.quality and any(p.gguf or p.quantize for p in e.peers):  # GGUF peers: every variant also on llama.cpp's scale, next to theirs
        for name, scores in llama_scale(recipe, base_path, quant_dir, tokenizer, root).items():
            q.setdefault(name, {}).update(scores)
    seconds["quality"] = time.perf_counter() - t

    t = time.perf_counter()
    sp: dict[str, dict] = {}
    servers: dict[str, str] = {}  # a started peer server's version, for the report's package table
    if e.speed and e.workloads:
        requests = bench_requests(recipe, tokenizer, root)
        sp["baseline"] = speed(recipe, base_path, requests, progress)
        if quant_dir is not None:
            sp["quantized"] = speed(recipe, quant_dir, requests, progress)
        spec_cfg = SpeculativeConfig.from_recipe(recipe.speculation, str(draft_dir) if draft_dir else None)
        for name in names:  # a "+spec" variant is measured through the speculating engine, not predicted
            target = quant_dir if name.startswith("quantized") else base_path
            if name.endswith("+spec") and spec_cfg is not None:
                sp[name] = speed(recipe, target, requests, progress, speculative=spec_cfg)
        for peer in e.peers:
            if peer.url:
                sp[peer.name] = peer_speed(recipe, peer, requests, progress)
            elif peer.vllm:
                sp[peer.name], servers[f"vLLM-CPU (peer {peer.name})"] = vllm_peer_speed(
                    recipe, peer, base_path if peer.vllm == "base" else quant_dir, requests, progress)
    seconds["speed"] = time.perf_counter() - t

    t = time.perf_counter()
    spec_by_target: dict[str, dict | None] = {}
    for target_name in {v.split("+")[0] for v in names if v.endswith("+spec")}:
        if target_name == "quantized":
            target, tdir = load_hf_model(quant_dir), quant_dir
        else:
            target, tdir = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32).eval(), base_path
        spec_by_target[target_name] = spec_acceptance(recipe, target, tokenizer, tdir, draft_dir, root)
        del target
        memory.collect()
    seconds["speculation"] = time.perf_counter() - t

    variants = []
    params = num_params(base_path)
    for name in names:
        target = name.split("+")[0]
        folder = quant_dir if target == "quantized" else base_path
        v: dict[str, Any] = {"name": name, "quality": q.get(target, {}), "speed": sp.get(name, {}),
                             "size_mb": _size_mb(folder), "avg_bits": file_bits(folder, params)}
        if name.endswith("+spec") and spec_by_target.get(target):
            s = spec_by_target[target]
            v["spec"] = {k: s[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                                           "num_accepted_tokens_per_pos")}
        variants.append(v)
    # peers: speed from their server, quality on llama.cpp's scale from their GGUF file
    for p in e.peers:
        if p.name in sp or p.name in q:
            size = peer_gguf(recipe, p, root).stat().st_size if p.gguf or p.quantize else None
            if p.vllm:  # the folder it served
                size = _size_mb(quant_dir if p.vllm == "quantized" else base_path) * 1e6
            variants.append({"name": p.name, "quality": q.get(p.name, {}), "speed": sp.get(p.name, {}),
                             "size_mb": round(size / 1e6, 2) if size else None,
                             "avg_bits": round(8 * size / params, 2) if size and params else None})
    spec = spec_by_target.get("quantized") or spec_by_target.get("baseline")
    machine = machine_info()
    machine["versions"] = {**machine.get("versions", {}), **servers}  # the peer servers' own, beside accel's venv
    return {"name": recipe.name, "variants": variants, "spec": spec, "summary": summarize(recipe, q, sp, spec),
            "seconds": {k: round(v, 2) for k, v in seconds.items()}, "machine": machine}
