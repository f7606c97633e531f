"""Teacher-forced draft agreement with the target's greedy replies on held-out eval/text prompts.

    .venv/bin/python scripts/draft_agreement.py --eagle runs/draft-eagle [--layers runs/draft-d4]

The numbers that bound a draft's acceptance, measured without the engine's adaptive policy: the target replies
greedily (accel's engine) to held-out chat prompts and to chat + instruction prompts; at every reply position the
layers draft (HF, reduced head) sees the tokens, the EAGLE draft the tokens and the target's real hidden states,
and each guesses the next token once the first reply token is known.

For the EAGLE draft it also prints the second chain token's agreement given the first was right (its first-step
guess fed back as the feature, `EagleTrainer.chain_forward`) and what the path gate
(`draft_min_path_confidence`) would do at each threshold on these positions, chains of at most two tokens:
how often a first token is proposed, the acceptance rate of what is proposed, and the accepted tokens per target
step (1 + accepted; the speedup at zero draft cost); `--first-gates` adds a separate gate for the first token
(`draft_min_first_confidence`) under each path gate.
"""
import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from accel.draft_training.eagle_train import load_trainer
from accel.draft_training.prompts import build_prompts, chat_prompts, load_samples
from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--target", default="smollm2-135m")
ap.add_argument("--layers", default=None, help="a layers draft folder (accel draft train --kind layers)")
ap.add_argument("--eagle", required=True, help="an EAGLE draft folder (accel draft train --kind eagle)")
ap.add_argument("--prompts", type=int, default=24)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--gates", default="0,0.1,0.2,0.3,0.4,0.5", help="path-gate thresholds to simulate")
ap.add_argument("--first-gates", default="",
                help="first-token gates (draft_min_first_confidence) to simulate under each path gate, e.g. 0.1,0.2")
args = ap.parse_args()
torch.set_num_threads(args.threads)
from accel.hub import resolve_model  # noqa: E402

M = str(resolve_model(args.target))
tok = AutoTokenizer.from_pretrained(M)
samples = load_samples("eval/text")
sets = {"eval chat": [p for s in samples if s["domain"] == "chat" for p in chat_prompts(s["text"])][:args.prompts],
        "eval chat+instr": build_prompts(samples, args.prompts, seed=0)}
tgt = AutoModelForCausalLM.from_pretrained(M, dtype=torch.float32).eval()
embed = tgt.get_input_embeddings().weight.detach()
if args.layers:
    d4 = AutoModelForCausalLM.from_pretrained(args.layers, dtype=torch.float32).eval()
    vid4 = torch.tensor(json.load(open(Path(args.layers) / "accel_draft.json"))["vocab_ids"])
eg, vide = load_trainer(args.eagle, tgt)
gates = [float(g) for g in args.gates.split(",")]
first_gates = [None] + [float(g) for g in args.first_gates.split(",") if g]
eng = Engine.from_pretrained(M, kv_cache_memory_gb=0.5)
for name, msgs in sets.items():
    ids = [tok(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False), add_special_tokens=False)
           ["input_ids"] for m in msgs]
    outs = eng.generate(ids, SamplingParams(max_tokens=96, temperature=0, stop_token_ids=[2]))
    ok4 = tot = 0
    right1, right2, top1, top2 = [], [], [], []
    with torch.inference_mode():
        for p, o in zip(ids, outs):
            full = p + list(o.token_ids)
            T, P = len(full), len(p)
            x = torch.tensor([full])
            h = tgt.model(input_ids=x).last_hidden_state[0]
            ta = tgt.lm_head(h).argmax(-1)  # ta[i]: target's token after position i
            # draft row i: (x_{i+1}, f_i) -> guess of the token after position i + 1
            e = embed[torch.tensor(full[1:T - 1])][None]
            out1, out2 = eg.chain_forward(e, h[None, :T - 2], torch.ones(1, T - 2, dtype=torch.long))
            q1 = (out1[0] @ eg.head.T).softmax(-1)
            q2 = (out2[0] @ eg.head.T).softmax(-1)
            c1, g1 = q1.max(-1)
            c2, g2 = q2.max(-1)
            g1, g2 = vide[g1], vide[g2]
            truth = ta[1:T - 1]  # the token after position i + 1
            # chain at row i (first token: guess of x_{i+2}); its second token is row i + 1's second-step guess
            for i in range(P - 1, T - 3):
                right1.append(bool(g1[i] == truth[i]))
                top1.append(float(c1[i]))
                right2.append(bool(g2[i + 1] == truth[i + 1]))
                top2.append(float(c2[i + 1]))
            if args.layers:
                da = vid4[d4(input_ids=x).logits[0][:, vid4].argmax(-1)]
                ok4 += int((da[P:T - 1] == ta[P:T - 1]).sum())
                tot += T - 1 - P
    r1, r2, c1, c2 = (torch.tensor(v) for v in (right1, right2, top1, top2))
    n = len(r1)
    line = f"{name}: {len(ids)} prompts, {n} positions: eagle first token {r1.float().mean():.3f}, " \
           f"second given the first {r2[r1].float().mean():.3f}"
    print(line + (f"; layers draft {ok4 / max(1, tot):.3f}" if args.layers else ""), flush=True)
    for lo, hi in ((0, .2), (.2, .4), (.4, .6), (.6, .8), (.8, 1.01)):
        sel = (c1 >= lo) & (c1 < hi)
        if sel.any():
            print(f"  first-token confidence [{lo:.1f}, {min(hi, 1):.1f}): {int(sel.sum()):5d} positions, "
                  f"agreement {r1[sel].float().mean():.3f}")
    for g in gates:
        for f in first_gates:
            p1 = c1 >= (g if f is None else f)
            p2 = p1 & (c1 >= g) & (c1 * c2 >= g)  # the chain goes on only while its path score passes g
            drafted = int(p1.sum()) + int(p2.sum())
            accepted = int((p1 & r1).sum()) + int((p2 & r1 & r2).sum())
            label = f"path gate {g:.2f}" + ("" if f is None else f", first-token gate {f:.2f}")
            print(f"  {label}: first token proposed at {p1.float().mean():.2f} of positions, acceptance "
                  f"{accepted / max(1, drafted):.3f}, tokens per step {1 + accepted / n:.3f}", flush=True)
