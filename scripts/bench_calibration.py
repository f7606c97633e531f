"""Stratified vs random calibration of the same size, over several seeds: per-domain KL with a noise band.

One GPTQ run per arm cannot separate the two draws (their per-domain differences are of the order of the noise
between two draws of the same kind), so this runs each arm with several seeds and compares the means against the
seed-to-seed spread. Everything except the calibration rows is fixed: the same mixed plan (allocated once from the
proxy sensitivity of a stratified draw), the same GPTQ settings, the same held-out eval windows (eval/text, never
calibration data), the same fp32 reference measured in this run.

Sources (--sources):
  builtin  the project's calibration_data/ (balanced by construction: 134 samples per domain). A random draw of 128
           already puts 15-18% of its tokens in every domain, so stratification can only remove the draw-to-draw
           variance of the mix here, not shift it.
  skewed   the same texts subsampled to the mix of a typical chat-log-like source (chat and prose dominate, 5%
           multilingual; --skew sets the counts). This is where a stratified draw (allocation --allocation, default
           equal) and a random draw of the same size really differ: random follows the source's skew.

Arms: X = a stratified draw with allocation X, GPTQ on its rows; X+damage = the same draw, GPTQ rows mixed by
quantization.calibration_mix 'damage' (the default: every domain keeps --keep of its source token share, the rest
goes to the most damaged domain); random = a random draw of the same number of units. Measured (3 seeds):
equal+damage met the target on the skewed source and tied random on the builtin folder (docs/DESIGN.md,
Calibration).

Verdict per domain: "better"/"worse" when the stratified - random difference of the seed means exceeds
--noise-sigmas x its standard error (sqrt(s_strat^2/n + s_rand^2/n), seed-to-seed std), else "within noise".
The issue's target: no domain "worse", and the worst domain (highest random-arm KL) "better".

  .venv/bin/python scripts/bench_calibration.py --threads 2 --seeds 0,1,2 --out runs/bench_calibration
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quant import dequantized_weights, swapped  # noqa: E402  (scripts/ is not a package)

DEFAULT_SKEW = "chat=134,prose=134,code=60,structured=30,math=30,multilingual=20"


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--sources", default="builtin,skewed", help="comma list of: builtin, skewed")
    p.add_argument("--skew", default=DEFAULT_SKEW, help="samples per domain in the skewed source")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--allocations", default="equal+damage",
                   help="comma list of stratified allocations to compare with random: equal, proportional, balanced; "
                        "X+damage: that draw, GPTQ rows mixed by per-domain damage (calibration_mix: damage)")
    p.add_argument("--reuse", default=None,
                   help="a previous results.json: runs with the same source, seed, arm and settings are taken from it "
                        "(GPTQ on CPU is deterministic) instead of being recomputed")
    p.add_argument("--keep", type=float, default=0.8,
                   help="X+damage arms: fraction of its source token share every domain keeps "
                        "(quantization.calibration_mix_keep)")
    p.add_argument("--cal-samples", type=int, default=128)
    p.add_argument("--cal-rows", type=int, default=32)
    p.add_argument("--cal-len", type=int, default=256)
    p.add_argument("--group-size", type=int, default=64)
    p.add_argument("--target-bits", type=float, default=5.0)
    p.add_argument("--sens-rows", type=int, default=16)
    p.add_argument("--sens-len", type=int, default=256)
    p.add_argument("--eval-window", type=int, default=512)
    p.add_argument("--eval-windows", type=int, default=6, help="max windows per domain")
    p.add_argument("--noise-sigmas", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="runs/bench_calibration", help="folder: results.json, report.md, kl_by_domain.png")
    a = p.parse_args()
    a.seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    a.sources = [s.strip() for s in a.sources.split(",") if s.strip()]
    bad = [s for s in a.sources if s not in ("builtin", "skewed")]
    if bad:
        p.error(f"--sources: unknown {bad}; allowed: builtin, skewed")
    if len(a.seeds) < 2:
        p.error(f"--seeds needs at least 2 seeds for a noise band, got {a.seeds}")
    a.skew = parse_skew(a.skew, p)
    a.allocations = [x.strip() for x in a.allocations.split(",") if x.strip()]
    bad = [x for x in a.allocations if x.removesuffix("+damage") not in ("equal", "proportional", "balanced")]
    if bad or not a.allocations:
        p.error(f"--allocations: {bad or 'empty'}; allowed: equal, proportional, balanced, each optionally "
                f"with +damage (GPTQ rows mixed by the plan's per-domain damage, quantization.calibration_mix)")
    return a


def parse_skew(text: str, p) -> dict[str, int]:
    out = {}
    for part in text.split(","):
        name, _, n = part.partition("=")
        if not n.strip().isdigit() or int(n) < 1:
            p.error(f"--skew: {part!r} is not domain=<positive count>")
        out[name.strip()] = int(n)
    return out


def write_skewed_source(skew: dict[str, int], path: Path, seed: int = 1234) -> dict[str, int]:
    """A JSONL of the builtin samples subsampled to `skew` samples per domain (fixed seed: one source for all)."""
    from accel.calibration.sources import BUILTIN_DIR

    rng = random.Random(seed)
    rows, counts = [], {}
    for domain, n in skew.items():
        f = BUILTIN_DIR / f"{domain}.jsonl"
        if not f.exists():
            raise SystemExit(f"--skew names domain {domain!r}; calibration_data/ has "
                             f"{sorted(p.stem for p in BUILTIN_DIR.glob('*.jsonl'))}")
        lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        if n > len(lines):
            raise SystemExit(f"--skew {domain}={n}: only {len(lines)} samples exist")
        picked = rng.sample(lines, n)
        rows += picked
        counts[domain] = n
    rng.shuffle(rows)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return counts


def mean_std(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0


def verdicts(runs: list[dict], arm: str, sigmas: float) -> dict:
    """`arm` (a stratified allocation) vs random, per domain: mean/std of KL over seeds, difference, standard error,
    verdict; plus the worst domain (highest random-arm KL) and whether the issue's target holds."""
    domains = sorted(runs[0]["kl"])
    out = {}
    for d in domains:
        s = [r["kl"][d] for r in runs if r["arm"] == arm]
        r_ = [r["kl"][d] for r in runs if r["arm"] == "random"]
        (ms, ss), (mr, sr) = mean_std(s), mean_std(r_)
        se = math.sqrt(ss ** 2 / len(s) + sr ** 2 / len(r_))
        diff = ms - mr
        verdict = "within noise"
        if diff > sigmas * se:
            verdict = "worse"
        elif diff < -sigmas * se:
            verdict = "better"
        out[d] = {"stratified_mean": ms, "stratified_std": ss, "random_mean": mr, "random_std": sr,
                  "diff": diff, "rel_diff_pct": 100.0 * diff / mr, "se": se, "verdict": verdict,
                  "stratified": s, "random": r_}
    worst = max(domains, key=lambda d: out[d]["random_mean"])
    met = all(v["verdict"] != "worse" for v in out.values()) and out[worst]["verdict"] == "better"
    return {"domains": out, "worst_domain": worst, "target_met": met}


ARM_COLORS = {"random": "#e08a2c", "stratified-equal": "#2b7bba", "stratified-balanced": "#3a9e5c",
              "stratified-proportional": "#8e6bbf", "stratified-equal+damage": "#1b4f7a",
              "stratified-balanced+damage": "#1f6b3a", "stratified-proportional+damage": "#5a3f85"}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sources = list(results["summary"])
    fig, axes = plt.subplots(1, len(sources), figsize=(7 * len(sources), 4.4), squeeze=False)
    for ax, src in zip(axes[0], sources):
        runs = [r for r in results["runs"] if r["source"] == src]
        arms = [a for a in ARM_COLORS if any(r["arm"] == a for r in runs)]
        names = sorted(runs[0]["kl"])
        w = 0.8 / len(arms)
        for j, arm in enumerate(arms):
            xs = [i - 0.4 + w * (j + 0.5) for i in range(len(names))]
            vals = [[r["kl"][d] for r in runs if r["arm"] == arm] for d in names]
            means = [sum(v) / len(v) for v in vals]
            stds = [mean_std(v)[1] for v in vals]
            ax.bar(xs, means, w, yerr=stds, capsize=2, color=ARM_COLORS[arm], label=arm)
            for x, v in zip(xs, vals):  # every seed as a dot: the spread is the point of this plot
                ax.scatter([x] * len(v), v, s=7, color="black", zorder=3)
        ax.set_xticks(range(len(names)), names, rotation=20)
        ax.set_ylabel("mean KL vs fp32 (held-out eval text)")
        verdict = ", ".join(f"{arm.split('-', 1)[1]}: {'met' if v['target_met'] else 'missed'}"
                            for arm, v in results["summary"][src].items())
        ax.set_title(f"calibration source {src} - target {verdict}", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: dict) -> str:
    a = results["args"]
    lines = ["# Stratified vs random calibration (GPTQ, same plan, same size)", "",
             f"seeds {a['seeds']}, {a['cal_samples']} units per draw -> {a['cal_rows']} rows x {a['cal_len']} tokens "
             f"for GPTQ; plan {results['plan']['counts']} at {results['plan']['avg_bits']:.2f} bits; held-out "
             f"eval/text, {a['eval_windows']} windows x {a['eval_window']} tokens per domain; verdict at "
             f"{a['noise_sigmas']} standard errors of the seed-mean difference (seed-to-seed std).", ""]
    for src, per_arm in results["summary"].items():
        comp = results["composition"][src]
        lines += [f"## source: {src}", "", "calibration units per domain (mean over seeds): "
                  + "; ".join(f"{arm} {comp[arm]}" for arm in comp), ""]
        for arm, s in per_arm.items():
            lines += [f"### {arm} vs random (worst domain: {s['worst_domain']}; target "
                      f"{'met' if s['target_met'] else 'missed'})", "",
                      f"| domain | {arm} KL (mean ± std) | random KL (mean ± std) | diff | verdict |",
                      "|---|---|---|---|---|"]
            for d, v in s["domains"].items():
                lines.append(f"| {d} | {v['stratified_mean']:.4f} ± {v['stratified_std']:.4f} | "
                             f"{v['random_mean']:.4f} ± {v['random_std']:.4f} | {v['rel_diff_pct']:+.1f}% | "
                             f"{v['verdict']} |")
            lines.append("")
    return "\n".join(lines)


SETTINGS = ("cal_samples", "cal_rows", "cal_len", "group_size", "target_bits", "sens_rows", "sens_len", "eval_window",
            "eval_windows", "skew", "model")


def reusable_runs(path: str | None, args) -> list[dict]:
    """Runs of a previous results.json measured with the same settings (empty when none or different)."""
    if not path:
        return []
    prev = json.loads(Path(path).read_text())
    diff = [k for k in SETTINGS if prev["args"].get(k) != getattr(args, k)]
    if diff:
        print(f"--reuse {path}: settings differ ({diff}); recomputing everything", flush=True)
        return []
    for r in prev["runs"]:  # files written before arms were named by allocation: "stratified" was "equal"
        if r["arm"] == "stratified":
            r["arm"] = f"stratified-{r.get('allocation') or prev['args'].get('allocation', 'equal')}"
        r["plan_counts"] = prev["plan"]["counts"]
    # damage-mixed runs depend on the mixing rule too: reuse only those made with this --keep by the current rule
    return [r for r in prev["runs"] if not r["arm"].endswith("+damage")
            or (r.get("damage_mix") or {}).get("keep") == args.keep]


def main():
    a = parse()
    from accel.bench.ledger import Entry

    with Entry(f"calibration-{Path(a.model).name}") as entry:
        results = measure(a)
        entry.info = {"model": a.model, "sources": a.sources, "seeds": a.seeds, "allocations": a.allocations,
                      "threads": torch.get_num_threads(), "plan": results["plan"],
                      "reused_runs": sum("reused_from" in r for r in results["runs"]),
                      "target_met": {src: {arm: v["target_met"] for arm, v in per_arm.items()}
                                     for src, per_arm in results["summary"].items()}}
        entry.figures = calibration_figures(results)


def calibration_figures(results: dict) -> dict[str, dict]:
    """Per source, arm and domain: held-out KL over the seeds, and each stratified arm's KL over random's paired by
    seed, keyed '<source>|<arm>|<domain>.<figure>'."""
    from accel.bench.ledger import figure, ratio

    out = {}
    for src, per_arm in results["summary"].items():
        for arm, s in per_arm.items():
            for d, v in s["domains"].items():
                out[f"{src}|{arm}|{d}.kl"] = figure(v["stratified"], "nats", 6)
                out[f"{src}|random|{d}.kl"] = figure(v["random"], "nats", 6)
                if all(x > 0 for x in v["random"]):
                    out[f"{src}|{arm}|{d}.vs_random"] = ratio(v["stratified"], v["random"])
    out["total.seconds"] = figure([results["seconds"]["total"]], "s", 1)
    return out


def measure(a) -> dict:
    if a.threads:
        torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accel.calibration import load_samples, random_draw, stratified_draw
    from accel.eval.adapters import eos_id_of
    from accel.eval.data import load_texts
    from accel.eval.text_protocol import EvalProtocol
    from accel.eval.runner import build_windows, evaluate_text, summarize_text
    from accel.fsutil import atomic_write_text
    from accel.hub import resolve_model
    from accel.quant.allocate import Budget, Rules, allocate
    from accel.quant.domain_weighting import damage_weighted_batches
    from accel.quant.quantize import oneshot_quantize, save_checkpoint
    from accel.quant.plan import token_batches
    from accel.quant.schemes import in_features_of, param_counts, quantizable_linears
    from accel.quant.sensitivity import measure_sensitivity
    from accel.recipe import CalibrationConfig

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    previous = reusable_runs(a.reuse, a)
    results: dict = {"args": dict(vars(a)), "runs": [], "seconds": {}}

    def save():
        atomic_write_text(out / "results.json", json.dumps(results, indent=1, default=str))

    t0 = time.perf_counter()
    path = resolve_model(a.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    names = quantizable_linears(model)
    pc, inf = param_counts(model, names), in_features_of(model, names)

    def cfg_for(source: str, seed: int, allocation: str = "proportional") -> CalibrationConfig:
        return CalibrationConfig(source=source, num_samples=a.cal_samples, max_seq_len=max(a.cal_len, 16),
                                 allocation=allocation, seed=seed)

    sources = {}
    for src in a.sources:
        if src == "builtin":
            sources[src] = "builtin"
        else:
            f = out / "skewed_source.jsonl"
            results["skewed_source_counts"] = write_skewed_source(a.skew, f)
            sources[src] = str(f)

    # One plan for every arm: the only thing that differs between runs is the GPTQ calibration rows.
    base_draw = stratified_draw(load_samples(cfg_for("builtin", 0)), tok, cfg_for("builtin", 0, "equal"))
    sens = measure_sensitivity(model, token_batches(base_draw.train, a.sens_len, a.sens_rows), ["int4", "int8"],
                               a.group_size, "proxy", progress=True)
    plan = allocate(sens, Budget(target_avg_bits=a.target_bits), pc, Rules(lm_head="fp16"), inf)
    results["plan"] = {"avg_bits": plan.avg_bits, "counts": plan.counts(), "group_size": plan.group_size}
    print("plan:", results["plan"], flush=True)

    proto = EvalProtocol(window=a.eval_window, stride=a.eval_window, max_windows_per_domain=a.eval_windows,
                         separator_id=eos_id_of(model, tok))
    windows = build_windows({d: [t.text for t in docs] for d, docs in load_texts("eval/text").items()}, tok, proto)

    # fp32 reference logits once per window, reused by every variant
    cache: dict[tuple, torch.Tensor] = {}

    @torch.inference_mode()
    def base(ids):
        key = tuple(ids.flatten().tolist())
        if key not in cache:
            cache[key] = model(input_ids=ids, use_cache=False).logits
        return cache[key]

    arms = [(f"stratified-{x}", x) for x in a.allocations] + [("random", None)]
    results["seconds"]["setup"] = round(time.perf_counter() - t0, 1)
    for src, source in sources.items():
        samples = load_samples(cfg_for(source, 0))
        for seed in a.seeds:
            for arm, allocation in arms:
                old = [r for r in previous if (r["source"], r["seed"], r["arm"]) == (src, seed, arm)
                       and r["plan_counts"] == results["plan"]["counts"]]
                if old:
                    run = dict(old[0], reused_from=a.reuse)
                    results["runs"].append(run)
                    print(f"{src} seed {seed} {arm}: reused from {a.reuse}", flush=True)
                    continue
                t = time.perf_counter()
                damage = bool(allocation) and allocation.endswith("+damage")
                cfg = cfg_for(source, seed, allocation.removesuffix("+damage") if allocation else "proportional")
                draw = stratified_draw(samples, tok, cfg) if allocation else random_draw(samples, tok, cfg)
                units: dict[str, int] = {}
                tokens: dict[str, int] = {}
                for u in draw.train:
                    units[u.domain] = units.get(u.domain, 0) + 1
                    tokens[u.domain] = tokens.get(u.domain, 0) + u.num_tokens
                batches = token_batches(draw.train, a.cal_len, a.cal_rows)
                mix = None
                if damage:  # same number of rows: each domain keeps --keep of its source share, the rest by damage
                    batches, mix = damage_weighted_batches(model, plan.schemes, plan.group_size, draw.train, a.cal_len,
                                                           sum(b.shape[0] for b in batches), base=draw.source_tokens,
                                                           keep=a.keep)
                fresh = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
                oneshot_quantize(fresh, plan, batches, "gptq", 0.01, tok)
                with tempfile.TemporaryDirectory() as td:
                    ck = save_checkpoint(fresh, plan, Path(td) / "ck", tok)
                    weights = dequantized_weights(ck)
                del fresh

                @torch.inference_mode()
                def fn(ids, weights=weights):
                    with swapped(model, weights):
                        return model(input_ids=ids, use_cache=False).logits

                (stats,) = evaluate_text(windows, [fn], base, progress=False)
                doms, overall = summarize_text(stats, windows)
                run = {"source": src, "seed": seed, "arm": arm, "allocation": allocation, "units": units,
                       "tokens": tokens, "rows": sum(b.shape[0] for b in batches),
                       "damage_mix": None if mix is None else mix.to_dict(),
                       "plan_counts": results["plan"]["counts"],
                       "kl": {d: m.kl_mean for d, m in doms.items()},
                       "ppl_increase_pct": {d: m.ppl_increase_pct for d, m in doms.items()},
                       "overall": overall.__dict__, "seconds": round(time.perf_counter() - t, 1)}
                results["runs"].append(run)
                save()
                print(f"[{time.strftime('%H:%M:%S')}] {src} seed {seed} {arm:22s} ({run['seconds']:.0f}s) units "
                      f"{units} KL " + " ".join(f"{d} {v:.4f}" for d, v in run["kl"].items()), flush=True)

    results["composition"] = {}
    results["summary"] = {}
    for src in sources:
        src_runs = [r for r in results["runs"] if r["source"] == src]
        doms = sorted(src_runs[0]["kl"])
        results["composition"][src] = {
            arm: {d: round(sum(r["units"].get(d, 0) for r in src_runs if r["arm"] == arm) / len(a.seeds), 1)
                  for d in doms} for arm, _ in arms}
        results["summary"][src] = {arm: verdicts(src_runs, arm, a.noise_sigmas) for arm, _ in arms[:-1]}
    results["seconds"]["total"] = round(time.perf_counter() - t0, 1)
    save()
    plot(results, out / "kl_by_domain.png")
    md = markdown(results)
    atomic_write_text(out / "report.md", md)
    print("\n" + md)
    return results


if __name__ == "__main__":
    main()
