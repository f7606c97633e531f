"""Speculative decoding at batch 1 on the real model: each proposer against no speculation, same run.

    .venv/bin/python scripts/bench_spec.py --draft runs/draft-smollm2 --prompts 8 --max-new-tokens 128

Until speculation is wired into the runtime's continuous batch this drives the reference loop
(accel.spec.reference: HF target + KV cache cropped on rejection) at batch 1; batch 16 needs the runtime.
Two prompt sets from eval/ (held out from calibration): input-grounded (summarize / extract / rewrite a given
passage) and open-ended chat turns. Prints tokens/s, speedup vs no speculation, acceptance rate, mean
acceptance length, the measured draft/target cost ratio and Leviathan's predicted speedup, and checks that
greedy outputs are token-identical to no speculation.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default=None, help="draft folder (e.g. from scripts/train_draft.py)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accel.models import resolve_model
    from accel.spec.distill import stop_token_ids
    from accel.spec.offline import measure_cost_ratio
    from accel.spec.prompts import chat_prompts, input_grounded_prompts, load_samples
    from accel.spec.proposer import DraftModelProposer, NgramProposer
    from accel.spec.reference import speculative_generate
    from accel.spec.stats import SpecDecodeStats, leviathan_speedup

    target_path = resolve_model(args.target)
    tok = AutoTokenizer.from_pretrained(str(target_path))
    target = AutoModelForCausalLM.from_pretrained(str(target_path), dtype=torch.float32).eval()
    samples = load_samples("eval/text")
    sets = {
        "input-grounded": input_grounded_prompts(samples, args.prompts),
        "open-ended": [p for s in samples if s["domain"] == "chat" for p in chat_prompts(s["text"])][: args.prompts],
    }
    proposers = {"none": None, "ngram": NgramProposer(2, 4)}
    if args.draft:
        proposers["draft"] = DraftModelProposer(args.draft, target_dir=target_path)
    cost_ratio = {"none": 0.0, "ngram": 0.0}
    if args.draft:
        ids = tok.apply_chat_template(sets["open-ended"][0], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        cost = measure_cost_ratio(target, proposers["draft"], list(ids))
        cost_ratio["draft"] = cost.cost_ratio
        print(f"cost: target step {cost.target_step_s * 1e3:.1f} ms, draft step {cost.draft_step_s * 1e3:.1f} ms, "
              f"ratio {cost.cost_ratio:.3f}")

    results = []
    for set_name, prompts in sets.items():
        encoded = []
        for m in prompts:
            ids = tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True)
            encoded.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
        baseline: dict[int, list[int]] = {}
        base_tps = None
        for name, prop in proposers.items():
            stats, n_tok, secs, identical = SpecDecodeStats(), 0, 0.0, True
            for i, ids in enumerate(encoded):
                t0 = time.perf_counter()
                res = speculative_generate(target, prop, ids, args.max_new_tokens, args.k,
                                           eos_token_id=stop_token_ids(target, tok), request_id=f"{set_name}-{i}")
                secs += time.perf_counter() - t0
                n_tok += len(res.token_ids)
                stats = stats + res.stats
                if name == "none":
                    baseline[i] = res.token_ids
                else:
                    identical &= res.token_ids == baseline[i]
            tps = n_tok / secs
            base_tps = tps if name == "none" else base_tps
            alpha = stats.acceptance_rate
            row = {"set": set_name, "method": name, "tokens": n_tok, "seconds": secs, "tokens_per_s": tps,
                   "speedup": tps / base_tps, "greedy_identical": identical, **stats.to_dict(),
                   "cost_ratio": cost_ratio[name],
                   "predicted_speedup": None if alpha is None else leviathan_speedup(alpha, args.k, cost_ratio[name])}
            results.append(row)
            pred = "-" if row["predicted_speedup"] is None else f"{row['predicted_speedup']:.2f}x"
            acc = "-" if alpha is None else f"{alpha:.3f}"
            mal = "-" if stats.mean_acceptance_length is None else f"{stats.mean_acceptance_length:.2f}"
            print(f"{set_name:15s} {name:6s} {tps:7.2f} tok/s  {row['speedup']:.2f}x  acceptance {acc}  "
                  f"mean len {mal}  cost {cost_ratio[name]:.3f}  Leviathan {pred}  identical={identical}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"k": args.k, "max_new_tokens": args.max_new_tokens, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
