"""Teacher-forced first-draft-token agreement with the target's greedy replies on held-out eval/text prompts.

    .venv/bin/python scripts/draft_agreement.py --layers runs/draft-d4 --eagle runs/draft-eagle

The number that bounds a draft's acceptance, measured without the engine's adaptive policy: the target replies
greedily (accel's engine) to held-out chat prompts and to chat + instruction prompts; at every reply position the
layers draft (HF, reduced head) sees the tokens, the EAGLE draft (accel's runtime) the tokens and the target's
real hidden states, and each guesses the next token once the first reply token is known.
"""
import argparse
import json
import torch
from pathlib import Path
from transformers import AutoTokenizer, AutoModelForCausalLM
from accel.runtime.engine import Engine
from accel.runtime.sampling_params import SamplingParams
from accel.spec.prompts import chat_prompts, build_prompts, load_samples
from accel.spec.eagle import load_eagle_draft
from accel.runtime.kv_cache_manager import KVCacheManager
from accel.runtime.model_runner import ModelRunner, RunnerConfig
from accel.runtime.outputs import ScheduledRequest
from accel.runtime.sequence import Sequence
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--target", default="smollm2-135m")
ap.add_argument("--layers", required=True, help="a layers draft folder (accel draft train --kind layers)")
ap.add_argument("--eagle", required=True, help="an EAGLE draft folder (accel draft train --kind eagle)")
ap.add_argument("--prompts", type=int, default=24)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
torch.set_num_threads(args.threads)
from accel.models import resolve_model
M = str(resolve_model(args.target))
tok = AutoTokenizer.from_pretrained(M)
samples = load_samples("eval/text")
sets = {"eval chat": [p for s in samples if s["domain"] == "chat" for p in chat_prompts(s["text"])][:args.prompts],
        "eval chat+instr": build_prompts(samples, args.prompts, seed=0)}
tgt = AutoModelForCausalLM.from_pretrained(M, dtype=torch.float32).eval()
d4 = AutoModelForCausalLM.from_pretrained(args.layers, dtype=torch.float32).eval()
vid4 = torch.tensor(json.load(open(Path(args.layers) / "accel_draft.json"))["vocab_ids"])
eg, vide = load_eagle_draft(args.eagle, tgt.model.embed_tokens.weight.detach(), torch.float32, torch.device("cpu"))
vide = torch.tensor(vide)
eng = Engine.from_pretrained(M, kv_cache_memory_bytes=512 << 20)
for name, msgs in sets.items():
    ids = [tok(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"] for m in msgs]
    outs = eng.generate(ids, SamplingParams(max_tokens=96, temperature=0, stop_token_ids=[2]))
    ok4 = oke = tot = 0
    with torch.inference_mode():
        for p, o in zip(ids, outs):
            full = p + list(o.token_ids); T = len(full); P = len(p)
            x = torch.tensor([full])
            h = tgt.model(input_ids=x).last_hidden_state[0]
            ta = tgt.lm_head(h).argmax(-1)  # ta[i]: target's token after position i
            da = vid4[d4(input_ids=x).logits[0][:, vid4].argmax(-1)]
            runner = ModelRunner(eg, RunnerConfig(16, 512)); kv = KVCacheManager(512, 16, enable_prefix_caching=False)
            seq = Sequence("r", full[1:], SamplingParams(temperature=0)); kv.allocate_slots(seq, T - 1)
            i_, pos, meta, _ = runner.prepare_inputs([ScheduledRequest(seq, T - 1)])
            out = eg(i_, pos, meta, runner.kv_caches, features=h[:T - 1])  # position i: (x_{i+1}, f_i) -> f_{i+1}
            ea = vide[eg.lm_head(out).argmax(-1)]  # guess of the token after position i+1
            # guesses of tokens after positions P .. T-2 (drafting starts once the first reply token is known)
            sl = slice(P, T - 1)
            ok4 += int((da[sl] == ta[sl]).sum())
            oke += int((ea[P - 1:T - 2] == ta[sl]).sum())
            tot += T - 1 - P
    print(f"{name}: {len(ids)} prompts, {tot} positions: layers draft {ok4/tot:.3f}, eagle draft {oke/tot:.3f}", flush=True)
