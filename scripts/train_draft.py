"""Train a distilled draft of the target and/or evaluate a draft offline (acceptance, cost, Leviathan).

    .venv/bin/python scripts/train_draft.py --out runs/draft-smollm2 --minutes 30          # train + evaluate
    .venv/bin/python scripts/train_draft.py --out runs/draft-smollm2 --eval-only           # evaluate only

Evaluation: held-out open-ended prompts (user turns of eval/text/chat.jsonl, disjoint from calibration),
the target's greedy replies, greedy speculative decoding replayed offline with k draft tokens per step
(exact: the counters equal what the runtime would count); the n-gram proposer on the same replies for
reference; the draft/target cost ratio timed at batch 1; Leviathan's predicted speedup.
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--out", required=True, help="draft folder to write (or read with --eval-only)")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--num-layers", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=8192, help="draft vocabulary size (reduced head)")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--layer-choice", default="first", choices=["first", "spread"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-only", action="store_true")
    ap.add_argument("--eval-prompts", type=int, default=24)
    ap.add_argument("--eval-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accel.draft_training.distill import train_draft
    from accel.draft_training.acceptance_replay import evaluate_proposer, target_continuations
    from accel.draft_training.prompts import chat_prompts, load_samples
    from accel.hub import resolve_model
    from accel.speculative.proposer import DraftModelProposer, NgramProposer

    target_path = resolve_model(args.target)
    if not args.eval_only:
        res = train_draft(target_path, args.out, num_layers=args.num_layers, time_budget_minutes=args.minutes,
                          num_prompts=args.num_prompts, max_new_tokens=args.max_new_tokens, learning_rate=args.lr,
                          seed=args.seed, draft_vocab_size=args.vocab,
                          layer_choice=args.layer_choice)
        print(json.dumps({k: v for k, v in res.__dict__.items() if k != "losses"}, indent=1))

    tokenizer = AutoTokenizer.from_pretrained(str(target_path))
    target = AutoModelForCausalLM.from_pretrained(str(target_path), dtype=torch.float32).eval()
    prompts = [p for s in load_samples("eval/text") if s["domain"] == "chat" for p in chat_prompts(s["text"])]
    prompts = prompts[: args.eval_prompts]
    conts = target_continuations(target, tokenizer, prompts, args.eval_new_tokens)
    draft = evaluate_proposer(DraftModelProposer(args.out, target_dir=target_path), conts, args.k, target=target)
    ngram = evaluate_proposer(NgramProposer(2, 4), conts, args.k)
    print(json.dumps({"draft": draft.to_dict(), "ngram": ngram.to_dict()}, indent=1))
    print(f"open-ended chat, k={args.k}, {len(conts)} prompts x <= {args.eval_new_tokens} tokens: "
          f"draft acceptance {draft.stats.acceptance_rate:.3f} (mean length {draft.stats.mean_acceptance_length:.2f}), "
          f"cost ratio {draft.cost.cost_ratio:.3f} -> Leviathan predicts {draft.predicted_speedup:.2f}x; "
          f"n-gram acceptance {ngram.stats.acceptance_rate or 0:.3f}")


if __name__ == "__main__":
    main()
