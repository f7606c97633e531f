"""Quantization evidence on the real model (SmolLM2-135M): the issue's target table.

Prints (and writes --out JSON, updated after every stage):
  1. sensitivity: proxy for all 210 Linears, KL for the Linears of every --kl-layer-stride-th decoder layer,
     Spearman rank correlation proxy vs KL, and the time of each;
  2. plans: all-INT8 (RTN), a mixed plan at <= --target-bits average bits (GPTQ, int4 group 64 + int8) and
     uniform INT4 GPTQ at group 32 (4 + 20/32 = 4.6 bits);
  3. the same mixed plan calibrated on a stratified vs a random draw of the same size;
  3b. INT4 with a float zero point per group ("int4f", group 32, RTN: data-free), the GGUF Q4_1 form, at 5.0 bits
      in memory;
  4. held-out eval text (eval/text, never calibration data): PPL increase %, mean KL, top-1 agreement, per domain.
Every number is measured in this run against the fp32 model measured in the same run.

Bits: parameter-weighted mean over the 210 block Linears; int4 = 4 + 20/g (fp16 scale + 4-bit zero per group),
int4f = 4 + 32/g in memory (8 + 32/g in an export), int8 = 8 + 16/in_features, fp16 = 16. lm_head (tied to the embeddings) stays fp32 in every variant here.

  .venv/bin/python scripts/bench_quant.py --out /tmp/bench_quant.json            # quick (busy 2-core box)
  .venv/bin/python scripts/bench_quant.py --full --out runs/bench_quant.json     # the issue's sizes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch
from torch import nn


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--full", action="store_true", help="issue sizes: KL for every layer, 16x256 sensitivity tokens")
    p.add_argument("--sens-rows", type=int, default=2)
    p.add_argument("--sens-len", type=int, default=128)
    p.add_argument("--kl-layer-stride", type=int, default=5, help="KL sensitivity for layers 0, s, 2s, ...")
    p.add_argument("--cal-samples", type=int, default=32, help="calibration units drawn (stratified and random)")
    p.add_argument("--cal-rows", type=int, default=8)
    p.add_argument("--cal-len", type=int, default=128)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--target-bits", type=float, default=5.0)
    p.add_argument("--eval-window", type=int, default=256)
    p.add_argument("--eval-windows", type=int, default=2, help="max windows per domain")
    p.add_argument("--method", choices=["gptq", "rtn"], default="gptq",
                   help="rtn: fake-quant (numerically identical to compressed-tensors RTN, see tests) - no oneshot")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--proxy-from", default=None, help="reuse a sensitivity_proxy.json instead of measuring it")
    p.add_argument("--skip-kl", action="store_true", help="no KL sensitivity (proxy-vs-KL correlation skipped)")
    p.add_argument("--skip-grid", action="store_true", help="skip the Q4_1-origin weight-grid report")
    p.add_argument("--out", default="/tmp/bench_quant.json")
    p.add_argument("--work", default="/tmp/bench_quant_work")
    a = p.parse_args()
    if a.full:
        a.sens_rows, a.sens_len, a.kl_layer_stride = 16, 256, 1
        a.cal_samples, a.cal_rows, a.cal_len = 128, 32, 256
        a.eval_window, a.eval_windows = 512, 8
    return a


RESULTS: dict = {}


def save(path):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(RESULTS, indent=1, default=str))


@contextlib.contextmanager
def timed(name):
    t = time.perf_counter()
    print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
    yield
    RESULTS.setdefault("seconds", {})[name] = round(time.perf_counter() - t, 1)
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {time.perf_counter() - t:.1f}s", flush=True)


@contextlib.contextmanager
def swapped(model: nn.Module, weights: dict[str, torch.Tensor]):
    """Temporarily give the named Linears these weights (new Parameters; originals restored)."""
    mods = dict(model.named_modules())
    saved = {}
    try:
        for n, w in weights.items():
            saved[n] = mods[n].weight
            mods[n].weight = nn.Parameter(w, requires_grad=False)
        yield
    finally:
        for n, p in saved.items():
            mods[n].weight = p


def dequantized_weights(checkpoint) -> dict[str, torch.Tensor]:
    """fp32 weights of every quantized Linear of a compressed-tensors checkpoint, via accel's kernels."""
    from accel.kernels import linear as kernels
    from accel.kernels.loader import load_hf_model

    m = load_hf_model(checkpoint)
    out = {}
    for n, mod in m.named_modules():
        if isinstance(mod, kernels.Int8WeightOnlyLinear):
            out[n] = kernels.dequantize_int8_per_channel(mod.qweight, mod.scales)
        elif isinstance(mod, kernels.Int4WeightOnlyLinear):
            out[n] = kernels.dequantize_int4_groupwise(kernels.unpack_int4(mod.qweight), mod.scales, mod.zeros,
                                                       mod.group_size)
    return out


def gguf_grid_report(model, names) -> dict:
    """How much of each weight already lies on a 4-bit grid per 32-group (the checkpoint came from Q4_1)."""
    from accel.quant.schemes import fake_quant_int4

    mods = dict(model.named_modules())
    on_grid = total = 0
    err32 = err64 = 0.0
    for n in names:
        w = mods[n].weight.detach()
        srt = w.reshape(-1, 32).sort(dim=1).values  # [groups, 32]
        distinct = 1 + (srt[:, 1:] != srt[:, :-1]).sum(dim=1)  # distinct values per group
        on_grid += int((distinct <= 16).sum())
        total += len(distinct)
        err32 += float((fake_quant_int4(w, 32) - w).pow(2).sum() / w.pow(2).sum())
        err64 += float((fake_quant_int4(w, 64) - w).pow(2).sum() / w.pow(2).sum())
    return {"groups32_with_le16_distinct_values_pct": 100.0 * on_grid / total,
            "int4_rtn_rel_mse_g32": err32 / len(names), "int4_rtn_rel_mse_g64": err64 / len(names)}


def main():
    a = parse()
    from accel.bench.ledger import Entry, flat_figures

    with Entry(f"quant-{Path(a.model).name}-{a.method}" + ("-full" if a.full else "")) as entry:
        run(a)
        entry.info = {"model": a.model, "method": a.method, "full": a.full, "threads": RESULTS["threads"],
                      "group_size": a.group_size, "target_bits": a.target_bits, "proxy_from": a.proxy_from}
        entry.figures = flat_figures({k: v for k, v in RESULTS.items() if k not in ("args", "threads")})


def run(a):
    if a.threads:
        torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accel.calibration import load_samples, random_draw, stratified_draw
    from accel.eval.adapters import eos_id_of
    from accel.eval.data import load_texts
    from accel.eval.text_protocol import EvalProtocol
    from accel.eval.runner import build_windows, evaluate_text, summarize_text
    from accel.hub import resolve_model
    from accel.quant.allocate import Budget, Plan, Rules, allocate, average_bits
    from accel.quant.quantize import oneshot_quantize, save_checkpoint
    from accel.quant.plan import token_batches
    from accel.quant.schemes import fake_quant, in_features_of, param_counts, quantizable_linears
    from accel.quant.sensitivity import measure_sensitivity, rank_agreement
    from accel.recipe import CalibrationConfig

    RESULTS["args"] = vars(a)
    RESULTS["threads"] = torch.get_num_threads()
    path = resolve_model(a.model)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    with timed("load"):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(path)
        names = quantizable_linears(model)
        pc, inf = param_counts(model, names), in_features_of(model, names)
    RESULTS["num_linears"] = len(names)
    if not a.skip_grid:
        RESULTS["gguf_q4_1_origin"] = gguf_grid_report(model, names)
        print("Q4_1 origin:", RESULTS["gguf_q4_1_origin"], flush=True)

    with timed("calibration draws"):
        cfg = CalibrationConfig(num_samples=a.cal_samples, max_seq_len=max(a.cal_len, 16))
        samples = load_samples(cfg)
        strat = stratified_draw(samples, tok, cfg)
        rnd = random_draw(samples, tok, cfg)
    RESULTS["draws"] = {"stratified": {"train": len(strat.train), "holdout": len(strat.holdout)},
                        "random": {"train": len(rnd.train), "holdout": len(rnd.holdout)}}

    sens_batches = token_batches(strat.train, a.sens_len, a.sens_rows)
    from accel.quant.heatmap import plot_heatmap
    from accel.quant.sensitivity import SensitivityResult

    if a.proxy_from:
        proxy = SensitivityResult.from_json(a.proxy_from)
    else:
        with timed("sensitivity proxy (all Linears)"):
            proxy = measure_sensitivity(model, sens_batches, ["int4", "int8"], a.group_size, "proxy", progress=True)
        proxy.to_json(work / "sensitivity_proxy.json")
        plot_heatmap(proxy, work / "sensitivity_proxy.png")
    RESULTS["sensitivity"] = {"proxy_seconds": round(proxy.seconds, 1), "tokens": proxy.num_tokens}
    if not a.skip_kl:
        kl_names = [n for n in names if int(n.split(".")[2]) % a.kl_layer_stride == 0]
        with timed(f"sensitivity KL ({len(kl_names)} Linears)"):
            kl = measure_sensitivity(model, sens_batches, ["int4", "int8"], a.group_size, "kl", progress=True,
                                     modules=kl_names)
        kl.to_json(work / "sensitivity_kl.json")
        plot_heatmap(kl, work / "sensitivity_kl.png")
        RESULTS["sensitivity"].update({
            "kl_linears": len(kl_names), "kl_seconds": round(kl.seconds, 1),
            "kl_seconds_per_measurement": round(kl.seconds / (2 * len(kl_names)), 2),
            "spearman_proxy_vs_kl": rank_agreement(kl, proxy),
            "kl_top5_int4": sorted(((v["int4"], n) for n, v in kl.damage.items()), reverse=True)[:5],
        })
    print("sensitivity:", json.dumps(RESULTS["sensitivity"], indent=1), flush=True)
    save(a.out)

    # Allocation uses the proxy table (all 210 Linears): a size budget only needs the ranking of
    # damage per bit, which the proxy gives (see the Spearman above).
    mixed = allocate(proxy, Budget(target_avg_bits=a.target_bits), pc, Rules(lm_head="fp16"), inf)
    int8_plan = {n: "int8" for n in names}
    RESULTS["plans"] = {
        "all_int8": {"avg_bits": average_bits(int8_plan, pc, inf, a.group_size)},
        "mixed": {"avg_bits": mixed.avg_bits, "counts": mixed.counts(), "group_size": a.group_size},
        "uniform_int4_g32": {"avg_bits": average_bits({n: "int4" for n in names}, pc, inf, 32)},
    }
    mixed.to_json(work / "plan_mixed.json")
    print("plans:", RESULTS["plans"])

    cal_strat = token_batches(strat.train, a.cal_len, a.cal_rows)
    cal_rand = token_batches(rnd.train, a.cal_len, a.cal_rows)
    mods = dict(model.named_modules())
    variants: dict[str, dict[str, torch.Tensor]] = {}
    with torch.no_grad():
        variants["int8_rtn"] = {n: fake_quant(mods[n].weight, "int8", 64) for n in names}
    uni = Plan(schemes={n: "int4" for n in names}, group_size=32, avg_bits=4 + 20 / 32, estimated_kl=0.0,
               lm_head="fp16")
    if a.method == "rtn":
        # RTN is data-free: the draws differ only through the sensitivity table that drives the allocation.
        with timed("sensitivity proxy on the random draw"):
            rsens = measure_sensitivity(model, token_batches(rnd.train, a.sens_len, a.sens_rows), ["int4", "int8"],
                                        a.group_size, "proxy", progress=True)
        mixed_r = allocate(rsens, Budget(target_avg_bits=a.target_bits), pc, Rules(lm_head="fp16"), inf)
        RESULTS["plans"]["mixed_random_draw"] = {"avg_bits": mixed_r.avg_bits, "counts": mixed_r.counts(),
                                                 "same_as_stratified": sum(mixed_r.schemes[n] == mixed.schemes[n]
                                                                           for n in names)}
        with torch.no_grad():
            for label, plan in (("mixed_rtn_stratified", mixed), ("mixed_rtn_random", mixed_r),
                                ("int4g32_rtn", uni)):
                variants[label] = {n: fake_quant(mods[n].weight, s, plan.group_size)
                                   for n, s in plan.schemes.items() if s != "fp16"}
        bits = {"mixed_rtn_stratified": mixed.avg_bits, "mixed_rtn_random": mixed_r.avg_bits,
                "int4g32_rtn": uni.avg_bits}
        pair = ("mixed_rtn_stratified", "mixed_rtn_random")
    else:
        from accel.quant.domain_weighting import damage_weighted_batches

        with timed("damage-weighted calibration rows"):
            cal_damage, weighting = damage_weighted_batches(model, mixed.schemes, mixed.group_size, strat.train,
                                                            a.cal_len, sum(b.shape[0] for b in cal_strat))
        RESULTS["calibration_mix_damage"] = weighting.to_dict()
        print("damage-weighted rows:", weighting.to_dict(), flush=True)
        for label, plan, batches in (("mixed_gptq_stratified_damage", mixed, cal_damage),
                                     ("mixed_gptq_stratified", mixed, cal_strat),
                                     ("mixed_gptq_random", mixed, cal_rand),
                                     ("int4g32_gptq_stratified", uni, cal_strat)):
            with timed(f"gptq {label}"):
                fresh = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
                oneshot_quantize(fresh, plan, batches, "gptq", 0.01, tok)
                ck = save_checkpoint(fresh, plan, work / f"ck_{label}", tok)
                del fresh
                variants[label] = dequantized_weights(ck)
            save(a.out)
        bits = {"mixed_gptq_stratified": mixed.avg_bits, "mixed_gptq_random": mixed.avg_bits,
                "mixed_gptq_stratified_damage": mixed.avg_bits, "int4g32_gptq_stratified": uni.avg_bits}
        pair = ("mixed_gptq_stratified_damage", "mixed_gptq_random")
    # All-int4f at group 32, RTN: the weights already lie on a Q4_1 grid that int4f reproduces. 5.0 bits is its size
    # in accel's runtime memory (4 + 32/32); an export stores it in an int8 container (8 + 32/32, schemes.py).
    names = list(pc)
    RESULTS["plans"]["int4f_g32"] = {"avg_bits": 5.0, "counts": {"int4f": len(names)}, "group_size": 32}
    with torch.no_grad():
        variants["int4f_g32_rtn"] = {n: fake_quant(mods[n].weight, "int4f", 32) for n in names}
    bits["int4f_g32_rtn"] = 5.0
    bits["int8_rtn"] = RESULTS["plans"]["all_int8"]["avg_bits"]
    save(a.out)

    with timed("held-out eval"):
        proto = EvalProtocol(window=a.eval_window, stride=a.eval_window, max_windows_per_domain=a.eval_windows,
                             separator_id=eos_id_of(model, tok))
        texts = {d: [t.text for t in docs] for d, docs in load_texts("eval/text").items()}
        windows = build_windows(texts, tok, proto)

        def fn_for(weights):
            @torch.inference_mode()
            def fn(ids):
                with swapped(model, weights):
                    return model(input_ids=ids, use_cache=False).logits
            return fn

        @torch.inference_mode()
        def base(ids):
            return model(input_ids=ids, use_cache=False).logits

        labels = list(variants)
        stats = evaluate_text(windows, [fn_for(variants[k]) for k in labels], base, progress=True)
    table = {}
    for k, st in zip(labels, stats):
        doms, overall = summarize_text(st, windows)
        table[k] = {"overall": overall.__dict__, "domains": {d: m.__dict__ for d, m in doms.items()}}
    RESULTS["eval"] = table
    save(a.out)

    print("\n== held-out eval (eval/text), vs fp32 in the same run ==")
    print(f"{'variant':28s} {'avg bits':>8s} {'PPL +%':>8s} {'mean KL':>9s} {'top-1':>7s}")
    for k in labels:
        o = table[k]["overall"]
        print(f"{k:28s} {bits[k]:8.3f} {o['ppl_increase_pct']:8.2f} {o['kl_mean']:9.4f} {o['top1_agreement']:7.3f}")
    others = [k for k in ("mixed_gptq_stratified",) if k in table]
    print(f"\n== stratified vs random calibration ({pair[0]} vs {pair[1]}): mean KL per domain ==")
    for d in table[pair[0]]["domains"]:
        s = table[pair[0]]["domains"][d]["kl_mean"]
        r = table[pair[1]]["domains"][d]["kl_mean"]
        extra = "".join(f"  {k} {table[k]['domains'][d]['kl_mean']:.4f}" for k in others)
        print(f"{d:14s} stratified {s:.4f}  random {r:.4f}  ratio {s / r:.3f}{extra}")
    print("\nseconds:", RESULTS["seconds"])
    save(a.out)


if __name__ == "__main__":
    main()
