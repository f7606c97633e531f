"""Speculative decoding in the runtime on the real model: each proposer against no speculation, back to back.

    nice -n 19 .venv/bin/python scripts/bench_spec.py --draft-model runs/draft-smollm2 --prompts 8 --max-new-tokens 96

Two prompt sets from eval/text (held out from calibration): input-grounded (summarize / extract / rewrite a
given passage) and open-ended chat turns. For batch 1 (prompts one after another) and batch 16 (all at once),
each method (off, n-gram, draft) runs through `Engine` with the same model weights; the table prints
tokens/s and the speedup against off (whole requests, prefill included), the same after each request's first token
("decode": 1 / TPOT, what speculation can speed up), the acceptance rate and mean acceptance length (from the raw counters),
the measured draft/target cost ratio, the speedup Leviathan's formula predicts from those, whether greedy
outputs are token-identical to off, and the read bandwidth and fp32 compute probed before the repeat ("memory",
"compute", medians over repeats): a verify step's extra rows cost more of a step where memory is fast and
compute slow (`accel.bench.probes`).

Cost ratio c: seconds per draft forward (time in the proposer / draft forwards, batch 1) over seconds per
target decode step of the run without speculation (same batch size). n-gram lookup: time in the proposer per
step over the target step. Leviathan: (1 - a^(g+1)) / ((1 - a)(g c + 1)) with a the acceptance rate and g the
mean draft length; it assumes verifying g + 1 tokens costs one decode step, which a CPU only approaches.
"engine" is the cost ratio the engine itself measured and fed to the adaptive rule (`adaptive.CostMeter`: draft
time per forward + the fitted extra target time per verified row).

--repeats R runs the methods R times, interleaved (off, ngram, draft, off, ...) on engines kept warm, and reports
the median speedup with its range: on a VM whose speed drifts over minutes a single back-to-back pair cannot
tell a small slowdown from none. Method `off2` is an A/A control: a second engine without speculation, run
in the same rotation, whose "speedup" is the noise floor the other ratios must be read against.
--interleave-steps runs the engines side by side instead, one step of each in turn, each timed on its own steps:
drift then hits every method alike (a paired design), which is what a batch-16 ratio near 1.0 needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch


def encode_prompts(tok, messages: list[list[dict]]) -> list[list[int]]:
    from accel.draft_training.prompts import chat_ids

    return [chat_ids(tok, m) for m in messages]


def run(engine, prompts: list[list[int]], params, batch: int, domain: str
        ) -> tuple[list[list[int]], float, int, float]:
    """Generate all prompts `batch` at a time; returns (outputs, seconds, target steps, first-token seconds: the steps
    until every request of a batch had its first token, i.e. the prefill that speculation cannot speed up)."""
    outs: list[list[int]] = []
    steps0 = engine.stats().num_steps
    t0 = time.perf_counter()
    first_s = 0.0
    for i in range(0, len(prompts), batch):
        ids = [engine.add_request(p, params, domain=domain) for p in prompts[i:i + batch]]
        final, started = {}, set()
        while engine.has_unfinished():
            ts = time.perf_counter()
            step = engine.step()
            if len(started) < len(ids):
                first_s += time.perf_counter() - ts
                started.update(o.request_id for o in step if o.token_ids)
            final.update({o.request_id: o for o in step if o.finished})
        outs += [final[r].token_ids for r in ids]
    return outs, time.perf_counter() - t0, engine.stats().num_steps - steps0, first_s


def run_interleaved(engines: dict, prompts: list[list[int]], params, batch: int, domain: str
                    ) -> dict[str, tuple[list[list[int]], float, int]]:
    """`run` for every engine at once, one step of each in turn: each engine's seconds are the sum of its own steps
    (and admissions), measured next to the other engines' steps, so a VM whose speed drifts over seconds slows all
    of them alike (a paired design; whole runs one after another see different stretches of the drift)."""
    state = {m: {"next": 0, "ids": [], "final": {}, "outs": [], "secs": 0.0, "first_s": 0.0, "started": set(),
                 "steps0": e.stats().num_steps} for m, e in engines.items()}
    live = list(engines)
    while live:
        for method in list(live):
            engine, st = engines[method], state[method]
            t0 = time.perf_counter()
            if not engine.has_unfinished():
                st["outs"] += [st["final"][r].token_ids for r in st["ids"]]
                if st["next"] >= len(prompts):
                    live.remove(method)
                    continue
                st["ids"] = [engine.add_request(p, params, domain=domain)
                             for p in prompts[st["next"]:st["next"] + batch]]
                st["final"], st["started"] = {}, set()
                st["next"] += batch
            step = engine.step()
            st["final"].update({o.request_id: o for o in step if o.finished})
            dt = time.perf_counter() - t0
            st["secs"] += dt
            if len(st["started"]) < len(st["ids"]):
                st["first_s"] += dt
                st["started"].update(o.request_id for o in step if o.token_ids)
    return {m: (st["outs"], st["secs"], engines[m].stats().num_steps - st["steps0"], st["first_s"])
            for m, st in state.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft-model", default=None, help="draft folder (e.g. from `accel draft train`)")
    ap.add_argument("--draft-model-b", default=None,
                    help="a second draft folder for methods named draftb+...: two drafts compared in one paired run")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per set at batch 1 (batch 16 uses 16)")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--sets", default="input-grounded,open-ended")
    ap.add_argument("--methods", default="off,ngram,draft",
                    help="off, off2 (A/A control), ngram, draft, draftb (the --draft-model-b folder); a method may set "
                         "SpeculativeConfig fields of its own: draft:draft_min_path_confidence=0.35+draft_quantization=int8")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--quant", choices=["int8", "int4", "int4f"], default=None,
                    help="the target's Linears and lm_head quantized on load (RTN), as `accel serve --quant`")
    ap.add_argument("--quant-group-size", type=int, default=32, help="INT4 group size for --quant int4 / int4f")
    # speculation settings: SpeculativeConfig's fields under the same names (defaults for every method; a method
    # may override them, see `method_config`)
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--no-adaptive", action="store_true", help="adaptive false: always num_speculative_tokens")
    ap.add_argument("--ngram-min-n", type=int, default=2)
    ap.add_argument("--ngram-max-n", type=int, default=4)
    ap.add_argument("--disable-above-batch-size", default="auto", help="an integer, none or auto (per method)")
    ap.add_argument("--draft-quantization", choices=["int8", "int4"], default=None)
    ap.add_argument("--draft-min-path-confidence", type=float, default=None)
    ap.add_argument("--draft-min-first-confidence", type=float, default=None)
    ap.add_argument("--draft-ngram-first", choices=["auto", "true", "false"], default="auto",
                    help="prompt lookup before the draft model (auto: on with a draft model; false: the draft alone)")
    ap.add_argument("--max-step-rows", default="16", help="an integer or none")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run every method this many times, interleaved; report the median speedup and its range")
    ap.add_argument("--interleave-steps", action="store_true",
                    help="step all methods' engines in turn (paired in time) instead of whole runs one after another")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    from accel.bench.probes import PLACEMENTS, core_to_core_ns, fp32_gflops, placement, read_bandwidth_gbs
    from accel.draft_training.prompts import chat_prompts, input_grounded_prompts, load_samples
    from accel.hub import resolve_model
    from accel.runtime.engine import Engine, EngineConfig
    from accel.runtime.models import fuse_projections, load_model
    from accel.runtime.sampling_params import SamplingParams
    from accel.speculative.stats import leviathan_speedup

    target_path = resolve_model(args.target)
    tok = AutoTokenizer.from_pretrained(str(target_path))
    model = load_model(target_path, torch.float32, torch.device("cpu"))
    if args.quant:
        from accel.schemes import apply_plan
        from accel.quant.schemes import uniform_plan

        apply_plan(model, uniform_plan(model.config.num_hidden_layers, args.quant), group_size=args.quant_group_size)
    fuse_projections(model)
    try:
        from accel.kernels.linear import pack_float_linears

        pack_float_linears(model)
    except ImportError:
        pass
    samples = load_samples("eval/text")
    n_max = max(args.prompts, 16 if "16" in args.batches.split(",") else 0)
    sets = {
        "input-grounded": encode_prompts(tok, input_grounded_prompts(samples, n_max)),
        "open-ended": encode_prompts(tok, [p for s in samples if s["domain"] == "chat"
                                           for p in chat_prompts(s["text"])][:n_max]),
    }
    eos = [2] + ([tok.eos_token_id] if tok.eos_token_id is not None else [])
    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=0, stop_token_ids=eos)
    warm_params = SamplingParams(max_tokens=16, temperature=0, stop_token_ids=eos)
    def draft_of(method: str) -> str | None:
        return args.draft_model_b if method.split(":")[0] == "draftb" else args.draft_model

    methods = [m for m in args.methods.split(",") if not m.startswith("draft") or draft_of(m)]
    defaults = {"num_speculative_tokens": args.num_speculative_tokens, "adaptive": not args.no_adaptive,
                "ngram_min_n": args.ngram_min_n, "ngram_max_n": args.ngram_max_n,
                "disable_above_batch_size": parse_value(args.disable_above_batch_size),
                "max_step_rows": parse_value(args.max_step_rows), "draft_quantization": args.draft_quantization,
                "draft_min_path_confidence": args.draft_min_path_confidence,
                "draft_min_first_confidence": args.draft_min_first_confidence,
                "draft_ngram_first": {"auto": None, "true": True, "false": False}[args.draft_ngram_first]}
    if not methods or methods[0] != "off":
        ap.error(f"--methods {args.methods!r}: must start with off")
    try:
        specs = {m: method_config(m, defaults, draft_of(m)) for m in methods}
    except ValueError as e:
        ap.error(str(e))
    from accel.bench.ledger import Entry

    entry = Entry(f"spec-{target_name(str(args.target))}-{args.sets.replace(',', '+')}-b{args.batches.replace(',', '+')}"
                  + (f"-{args.quant}" if args.quant else "")).__enter__()  # written after the last repeat
    results = []
    for batch in [int(b) for b in args.batches.split(",")]:
        for set_name in args.sets.split(","):
            prompts = sets[set_name][: args.prompts if batch == 1 else batch]
            engines, proposers = {}, {}
            for method in methods:
                spec = specs[method]
                config = EngineConfig(model=str(target_path), kv_cache_memory_gb=0.5, speculative=spec,
                                      max_num_batched_tokens=2048)
                engines[method] = Engine(model, config, tok)  # builds its proposer (an EAGLE draft needs the runner)
                proposer = None
                if spec is not None:
                    proposer = engines[method].spec.proposer = _Timed(engines[method].spec.proposer)
                proposers[method] = proposer
                # warm-up at the measured batch size: a fresh engine's first batch-16 run pays first-touch page
                # faults of its KV pool and buffers (measured: far slower than the same work warm)
                run(engines[method], prompts, warm_params, batch, set_name)
            # Methods alternate within each repeat: this VM's speed drifts over minutes, so a ratio of runs
            # measured seconds apart is steadier than one of runs minutes apart.
            reps: dict[str, list[dict]] = {m: [] for m in methods}
            # The order rotates per repeat (off first, then ngram first, ...): a fixed order measured identical
            # work slower in the second and third slots at batch 16 (engines that never drafted).
            for rep in range(args.repeats):
                base = None
                raw = {}
                # the machine's state this repeat ran in
                read_gbs, gflops = read_bandwidth_gbs(torch.get_num_threads()), fp32_gflops(torch.get_num_threads())
                core_ns = core_to_core_ns()
                order = methods[rep % len(methods):] + methods[:rep % len(methods)]
                for method in order:
                    engine, proposer = engines[method], proposers[method]
                    if proposer is not None:
                        proposer.reset()
                    if engine.spec is not None:
                        _reset_stats(engine)
                    if not args.interleave_steps:
                        raw[method] = run(engine, prompts, params, batch, set_name)
                if args.interleave_steps:
                    raw = run_interleaved({m: engines[m] for m in order}, prompts, params, batch, set_name)
                where = placement(core_ns, core_to_core_ns())
                for method in methods:  # off first: the others' ratios need its numbers
                    engine, proposer = engines[method], proposers[method]
                    outs, secs, steps, first_s = raw[method]
                    row = {"batch": batch, "set": set_name, "method": method, "repeat": rep,
                           "tokens": sum(len(o) for o in outs), "seconds": secs, "steps": steps,
                           "first_token_seconds": first_s, "read_gbs": read_gbs, "gflops": gflops,
                           "core_ns": core_ns, "placement": where}
                    row["tokens_per_s"] = row["tokens"] / secs
                    # after each request's first token: what speculation can speed up (1 / TPOT)
                    row["decode_tokens_per_s"] = (row["tokens"] - len(outs)) / max(secs - first_s, 1e-9)
                    if method == "off":
                        base = {"outs": outs, "tps": row["tokens_per_s"], "step_s": secs / max(1, steps),
                                "decode_tps": row["decode_tokens_per_s"]}
                        row.update(speedup=1.0, decode_speedup=1.0, greedy_identical=True)
                    else:
                        row.update(speedup=row["tokens_per_s"] / base["tps"], greedy_identical=outs == base["outs"],
                                   decode_speedup=row["decode_tokens_per_s"] / base["decode_tps"],
                                   num_identical=sum(a == b for a, b in zip(outs, base["outs"])))
                    if engine.spec is not None:
                        st = engine.stats().spec_decode
                        row.update(st.to_dict())
                        per_source = engine.stats().spec_decode_per_source
                        if per_source:  # draft_ngram_first: lookup and model drafts counted apart
                            row["per_source"] = {k: v.to_dict() for k, v in sorted(per_source.items())}
                        alpha = st.acceptance_rate
                        gamma = st.num_draft_tokens / st.num_drafts if st.num_drafts else 0.0
                        c = proposer.seconds / max(1, proposer.forwards) / base["step_s"]
                        meter = engine.spec.cost
                        row.update(mean_draft_len=gamma, cost_ratio=c,
                                   engine_cost_ratio=engine.spec.adaptive.measured_cost_ratio,
                                   engine_propose_ratio=None if meter is None else meter.propose_ratio,
                                   predicted_speedup=None if alpha is None else leviathan_speedup(alpha, gamma, c))
                    reps[method].append(row)
                    if args.repeats > 1:
                        _print(row, prefix=f"  repeat {rep}: ")
            for method in methods:
                row = dict(median_row(reps[method]))
                row["repeats"] = len(reps[method])
                if method != "off":
                    ratios = sorted(r["speedup"] for r in reps[method])
                    decode = sorted(r["decode_speedup"] for r in reps[method])
                    row.update(speedup=statistics.median(ratios), speedup_min=ratios[0], speedup_max=ratios[-1],
                               speedups=ratios, greedy_identical=all(r["greedy_identical"] for r in reps[method]),
                               decode_speedup=statistics.median(decode), decode_speedup_min=decode[0],
                               decode_speedup_max=decode[-1])
                row["tokens_per_s_all"] = [r["tokens_per_s"] for r in reps[method]]
                for key in ("acceptance_rate", "mean_acceptance_length"):
                    row[key + "_all"] = [r[key] for r in reps[method] if isinstance(r.get(key), float)]
                for key in ("read_gbs", "gflops", "core_ns"):
                    known = [r[key] for r in reps[method] if r[key] is not None]
                    row[key] = statistics.median(known) if known else None
                    row[key + "_all"] = [r[key] for r in reps[method]]
                wheres = [r["placement"] for r in reps[method]]
                row["placement"] = ", ".join(f"{wheres.count(w)} {w}" for w in PLACEMENTS if w in wheres)
                row["placement_all"] = wheres
                results.append(row)
                _print(row)
            engines = proposers = None
    exported = (Path(str(args.target)) / "accel.json").is_file()
    entry.info = {"target": target_name(str(args.target)), "quant": args.quant or ("export" if exported else "fp32"),
                  "methods": methods, "prompts": args.prompts, "repeats": args.repeats, "max_new_tokens": args.max_new_tokens,
                  "draft_model": args.draft_model and Path(args.draft_model).name,
                  "draft_quantization": args.draft_quantization}
    entry.figures = spec_figures(results)
    entry.__exit__(None, None, None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"num_speculative_tokens": args.num_speculative_tokens, "max_new_tokens": args.max_new_tokens, "adaptive": not args.no_adaptive,
                       "results": results}, f, indent=1)


def spec_figures(results: list[dict]) -> dict[str, dict]:
    """Per (batch, prompt set, method): tokens/s, the speedup over no speculation, the acceptance rate and the
    mean accepted length (tokens a verify step emits), keyed 'b<batch>|<set>|<method>.<figure>'."""
    from accel.bench.ledger import figure

    out = {}
    for row in results:
        key = f"b{row['batch']}|{row['set']}|{row['method']}"
        out[f"{key}.tok_s"] = figure(row["tokens_per_s_all"], "tok/s")
        if row.get("speedups"):
            out[f"{key}.speedup"] = figure(row["speedups"], "x", 3)
        if row.get("acceptance_rate_all"):
            out[f"{key}.acceptance"] = figure(row["acceptance_rate_all"], "", 3)
        if row.get("mean_acceptance_length_all"):
            out[f"{key}.accepted_length"] = figure(row["mean_acceptance_length_all"], "tokens", 2)
    return out


def target_name(target: str) -> str:
    """The target as the ledger names it: a registry or folder name, an export by its run (runs/NAME/checkpoint)."""
    p = Path(target)
    return p.parent.name if p.name == "checkpoint" else p.name


def parse_value(text: str):
    """A command-line value: none, true / false, an integer, a number, or the text itself."""
    low = text.lower()
    if low in ("none", "true", "false"):
        return {"none": None, "true": True, "false": False}[low]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def method_config(method: str, defaults: dict, draft: str | None):
    """A --methods entry -> its SpeculativeConfig (None for off / off2). "draft:draft_min_path_confidence=0.35+
    draft_quantization=int8": the draft model with those fields set over the command line's (`defaults`); the
    draft-model fields do not apply to ngram."""
    from accel.speculative.config import SpeculativeConfig

    base, _, rest = method.partition(":")
    if base in ("off", "off2") and not rest:
        return None
    if base not in ("ngram", "draft", "draftb"):
        raise ValueError(f"method {method!r} is invalid; allowed: off, off2, ngram, draft, draftb, each of the last "
                         "three optionally followed by :field=value+field=value")
    fields = {f.name for f in dataclasses.fields(SpeculativeConfig)} - {"method", "draft_model"}
    kw = {k: v for k, v in defaults.items() if base != "ngram" or not k.startswith("draft_")}
    for item in filter(None, rest.split("+")):
        key, eq, value = item.partition("=")
        if key not in fields or not eq:
            raise ValueError(f"method {method!r}: {item!r} is invalid; allowed: field=value with a field of "
                             f"SpeculativeConfig: {', '.join(sorted(fields))}")
        kw[key] = parse_value(value)
    if base == "ngram":
        return SpeculativeConfig(method="ngram", **kw)
    return SpeculativeConfig(method="draft", draft_model=draft, **kw)


class _Timed:
    """Wraps a proposer: wall time spent proposing and the number of draft forwards (batched steps)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.reset()

    def reset(self) -> None:
        self.seconds, self.forwards = 0.0, 0

    def propose(self, requests):
        t0 = time.perf_counter()
        out = self.inner.propose(requests)
        self.seconds += time.perf_counter() - t0
        # a draft model runs up to max(k) batched forwards per call (fewer when every chain ended early);
        # n-gram lookup counts one "forward" per call
        self.forwards += out.num_forwards if hasattr(self.inner, "model") else 1
        return out

    def finish(self, request_id: str) -> None:
        self.inner.finish(request_id)

    def __getattr__(self, name: str):  # the proposer's own attributes (model, ...)
        return getattr(self.inner, name)


def _reset_stats(engine) -> None:
    from accel.speculative.stats import SpecTally

    engine.spec.tally = SpecTally()


def median_row(rows: list[dict]) -> dict:
    """The repeat with the median speedup (off: the median tokens/s), so its counters belong to one run."""
    key = "speedup" if rows[0]["method"] != "off" else "tokens_per_s"
    return sorted(rows, key=lambda r: r[key])[(len(rows) - 1) // 2]


def _print(row: dict, prefix: str = "") -> None:
    def f(key, fmt):
        v = row.get(key)
        return "-" if v is None else format(v, fmt)

    rng = f" [{row['speedup_min']:.2f}-{row['speedup_max']:.2f}]" if "speedup_min" in row else ""
    drng = f" [{row['decode_speedup_min']:.2f}-{row['decode_speedup_max']:.2f}]" if "decode_speedup_min" in row else ""
    print(f"{prefix}batch {row['batch']:2d} {row['set']:15s} {row['method']:6s} {row['tokens_per_s']:7.2f} tok/s "
          f"{row['speedup']:.2f}x{rng}  decode {row['decode_tokens_per_s']:7.2f} tok/s {row['decode_speedup']:.2f}x{drng}"
          f"  acceptance {f('acceptance_rate', '.3f')}  mean len "
          f"{f('mean_acceptance_length', '.2f')}  draft len {f('mean_draft_len', '.2f')}  cost "
          f"{f('cost_ratio', '.3f')} (engine {f('engine_cost_ratio', '.3f')})  Leviathan {f('predicted_speedup', '.2f')}x  "
          f"identical={row['greedy_identical']} ({row.get('num_identical', '-')})  memory {f('read_gbs', '.1f')} GB/s"
          f"  compute {f('gflops', '.0f')} GFLOPS  cores {f('core_ns', '.0f')} ns apart ({row.get('placement', '-')})"
          + "".join(f"  [{src}: {d['num_draft_tokens']} drafted, acceptance {d['acceptance_rate'] or 0:.3f}]"
                    for src, d in (row.get("per_source") or {}).items()), flush=True)


if __name__ == "__main__":
    main()
