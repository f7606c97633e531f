"""Train an EAGLE-style feature draft (accel/speculative/eagle.py) from the target on CPU within a time budget.

1. The runtime engine generates the target's greedy replies to calibration prompts and to user turns the target
   wrote itself (`model_written_prompts`, Magpie-style: more and more varied questions than the calibration
   pool's); a hook on its ModelRunner
   keeps the final hidden state f_i of every position it computes (prompt and reply), so the teacher data costs
   no second forward (prefix caching off so every position is computed).
2. Draft vocabulary: the K tokens the target emits most (+ special tokens). Teacher distribution at position j:
   softmax of f_j against those K rows of the target's head (the draft can only propose them), kept as top-m.
3. One Llama decoder layer (transformers' own, trained with autograd) over fc([embed(x_{i+1}) ; f_i]) learns
   f_{i+1}: smooth-L1 to the feature (EAGLE's regression) + `ce_weight` x soft cross-entropy of its K-row head to
   the teacher's distribution. The embedding stays the target's (frozen); fc, the layer, the norm and the head
   rows train. A held-out slice of the replies measures first-draft-token agreement with the target's greedy
   token (teacher-forced features), the number that bounds acceptance.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from accel.draft_training.distill import (added_token_ids, outputs_until, pack_batches, select_draft_vocab,
                                          stop_token_ids, train_step)
from accel.draft_training.prompts import build_prompts, chat_ids, load_samples
from accel.speculative.eagle import draft_layer_config

TEACHER_TOP_M = 20


@dataclass
class FeatureSample:
    """token_ids [T] (prompt + reply); features [T - 1, H]: the target's f_0 .. f_{T-2}; num_prompt tokens."""

    token_ids: list[int]
    features: Tensor
    num_prompt: int
    top_ids: Tensor | None = None  # [T - 2, m] draft-vocabulary indices of the teacher's top-m at f_1 .. f_{T-2}
    top_logprobs: Tensor | None = None  # [T - 2, m]


@dataclass
class EagleTrainResult:
    out_dir: str
    draft_vocab_size: int
    vocab_coverage: float
    num_prompts: int
    num_generated_tokens: int
    num_model_written_prompts: int  # user turns the target wrote (model_written_prompts) among num_prompts
    num_train_positions: int
    num_steps: int
    heldout_top1: float  # first draft token == the target's greedy token, teacher-forced features, held-out replies
    heldout_second: float  # second chain token == the target's given the first was (heldout_agreement)
    seconds_generating: float
    seconds_training: float
    losses: list[float] = field(default_factory=list)


def engine_feature_samples(target_path: str | Path, prompts: list[list[int]], max_new_tokens: int,
                           stop_ids: list[int], deadline: float, max_num_seqs: int = 48) -> list[FeatureSample]:
    """Greedy replies to token-id prompts with the target's features at every computed position (see module doc).
    At `deadline` the running requests are aborted; only finished replies are kept."""
    from accel.runtime.engine import Engine
    from accel.runtime.sampling_params import SamplingParams

    engine = Engine.from_pretrained(target_path, kv_cache_memory_gb=0.5, max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=2048, enable_prefix_caching=False,
                                    max_waiting=max(1024, len(prompts)))
    # One arena for every request's features, sized up front (prompt + max_new_tokens rows each): a clone per
    # request and step (~130K small tensors between the forward's large temporaries) fragmented the heap until
    # 1,400 prompts held ~20 GB RSS for ~1 GB of features.
    hidden_size = engine.runner.model.config.hidden_size
    offsets, total = [], 0
    for p in prompts:
        offsets.append(total)
        total += len(p) + max_new_tokens
    with torch.inference_mode(False):
        arena = torch.zeros(total, hidden_size)
        seen = torch.zeros(total, dtype=torch.bool)
    where: dict[str, tuple[int, int]] = {}  # request id -> (arena offset, rows it may hold)

    def keep_hidden(scheduled, hidden: Tensor) -> None:
        row = 0
        for r in scheduled:
            off, cap = where[r.seq.request_id]
            start = r.seq.num_computed_tokens
            end = min(start + r.num_tokens, cap)
            if end > start:  # later chunks win (a preempted request recomputes)
                arena[off + start: off + end] = hidden[row: row + end - start]
                seen[off + start: off + end] = True
            row += r.num_tokens

    engine.runner.hidden_hook = keep_hidden
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0, stop_token_ids=sorted(stop_ids))
    prompt_of = {}
    for p, off in zip(prompts, offsets):
        rid = engine.add_request(p, params)
        prompt_of[rid] = p
        where[rid] = (off, len(p) + max_new_tokens)
    done: list[tuple[list[int], list[int], int]] = []
    for out in outputs_until(engine, deadline, prompt_of):
        if out.finished and out.finish_reason != "abort" and out.token_ids:
            done.append((prompt_of.pop(out.request_id), list(out.token_ids), where[out.request_id][0]))
    samples = []
    for prompt, reply, off in done:
        tokens = prompt + reply
        n = len(tokens) - 1  # the last reply token is never fed
        if n >= 3 and bool(seen[off: off + n].all()):
            samples.append(FeatureSample(tokens, arena[off: off + n], len(prompt)))
    return samples


def model_written_prompts(target_path: str | Path, tokenizer, num_prompts: int, deadline: float, seed: int = 0,
                          max_tokens: int = 64, temperature: float = 1.0, top_p: float = 0.95,
                          max_num_seqs: int = 48) -> list[str]:
    """User turns the target writes itself (Magpie, Xu et al. 2024): the chat template up to an open user turn,
    sampled until the turn ends (a base model without a template: a paragraph after BOS). Why: the calibration chat pool holds ~200 distinct questions among the first 500
    prompts (many recombined from the same handwritten exchanges), and a draft trained on replies to them reads
    0.52 first-token agreement on held-out calibration prompts but 0.35-0.40 on held-out eval prompts; the
    target's own questions are as many as there is time for and in its own distribution. Unfinished, empty and
    duplicate turns are dropped. Stops at `deadline`."""
    from accel.runtime.engine import Engine
    from accel.runtime.sampling_params import SamplingParams

    if getattr(tokenizer, "chat_template", None):
        marker = "\x00USER\x00"
        text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
        prefix = tokenizer(text[: text.index(marker)], add_special_tokens=False)["input_ids"]
        end_ids = tokenizer(text[text.index(marker) + len(marker):], add_special_tokens=False)["input_ids"][:1]
    else:  # a base model (Gemma 3 270M): a paragraph from BOS, ended where `chat_ids` ends a turn
        prefix = tokenizer("")["input_ids"] or [tokenizer.bos_token_id]
        end_ids = tokenizer("\n\n", add_special_tokens=False)["input_ids"][:1]
    stop = sorted(set(end_ids) | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()))
    engine = Engine.from_pretrained(target_path, kv_cache_memory_gb=0.25, max_num_seqs=max_num_seqs,
                                    max_waiting=max(1024, num_prompts))
    ids = [engine.add_request(prefix, SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                                     seed=seed * 1_000_003 + i, stop_token_ids=stop))
           for i in range(num_prompts)]
    out: dict[str, str] = {}
    for o in outputs_until(engine, deadline, ids):
        if o.finished and o.finish_reason == "stop":
            out[o.request_id] = tokenizer.decode(o.token_ids, skip_special_tokens=True).strip()
    seen, turns = set(), []
    for rid in ids:
        t = out.get(rid, "")
        if len(t) >= 8 and t not in seen:
            seen.add(t)
            turns.append(t)
    return turns


@torch.no_grad()
def attach_teacher(samples: list[FeatureSample], head_rows: Tensor, top_m: int = TEACHER_TOP_M,
                   chunk: int = 4096) -> None:
    """Teacher targets per sample: top-m of softmax(f_j @ head_rows^T) for j = 1 .. T-2 (head_rows [K, H])."""
    for s in samples:
        f = s.features[1:]
        ids, lps = [], []
        for a in range(0, f.shape[0], chunk):
            lp = (f[a: a + chunk] @ head_rows.T).log_softmax(-1)
            v, i = lp.topk(min(top_m, head_rows.shape[0]), dim=-1)
            ids.append(i)
            lps.append(v)
        s.top_ids, s.top_logprobs = torch.cat(ids), torch.cat(lps)


@torch.no_grad()
def effective_norm_weight(norm: torch.nn.Module, config) -> Tensor:
    """The per-channel scale a target's final RMSNorm applies (w for Llama, 1 + w for Gemma), read off the module:
    an all-ones row has RMS 1, so norm(1) = scale / sqrt(1 + eps). The draft's norm starts from it."""
    ones = torch.ones(1, config.hidden_size)
    return (norm(ones)[0] * (1.0 + config.rms_norm_eps) ** 0.5).float()


class EagleTrainer(torch.nn.Module):
    """The trainable draft: fc + one transformers Llama decoder layer + norm + K head rows (embedding outside)."""

    def __init__(self, target_config, head_rows: Tensor, norm_weight: Tensor) -> None:
        super().__init__()
        from transformers import AutoModel

        config = draft_layer_config(target_config)
        self.config = config
        h = config.hidden_size
        self.model = AutoModel.from_config(config)  # LlamaModel; its embedding is unused (dropped below)
        self.model.embed_tokens = None
        with torch.no_grad():
            self.model.norm.weight.copy_(norm_weight)
        self.fc = torch.nn.Linear(2 * h, h, bias=True)
        with torch.no_grad():  # start as "the token's embedding plus a little of the feature"
            self.fc.weight.zero_()
            self.fc.bias.zero_()
            self.fc.weight[:, :h] = torch.eye(h)
            self.fc.weight[:, h:] = 0.1 * torch.eye(h)
        self.head = torch.nn.Parameter(head_rows.clone())

    def forward(self, emb: Tensor, feats: Tensor, mask: Tensor, position_ids: Tensor | None = None) -> Tensor:
        """emb, feats [B, T, H], mask [B, T] (or a prepared boolean [B, 1, T, T], True = attend) -> predicted next
        features [B, T, H] (normed)."""
        x = self.fc(torch.cat([emb, feats], dim=-1))
        return self.model(inputs_embeds=x, attention_mask=mask, position_ids=position_ids).last_hidden_state

    def chain_forward(self, emb: Tensor, feats: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """The draft's first and second chain steps at every position, as it runs them at inference (EAGLE-3's
        training-time test, one extra step): -> (out1, out2), each [B, T, H].

        out1[:, i] predicts f_{i+1} from (x_{i+1}, f_i) over the real features f_0..f_i (teacher-forced).
        out2[:, j] predicts f_{j+1} from (x_{j+1}, out1[:, j-1]): the draft's own guess of f_j in place of the
        real one, attending to real-feature positions < j and itself, which is what the second token of a chain
        sees. Why: trained on real features only, the draft never sees its own errors as input; its second
        token is then both worse and over-confident. One forward over 2T rows with a block mask; the first
        step's guesses come from a no-grad forward (EAGLE-1 style, no gradient through the fed-back feature).
        out2[:, 0] is padding (no previous guess)."""
        b, t, _ = emb.shape
        with torch.no_grad():
            first = self(emb, feats, mask)
        guess = torch.zeros_like(feats)
        guess[:, 1:] = first[:, :-1]
        valid = mask.bool()
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        full = torch.zeros(b, 1, 2 * t, 2 * t, dtype=torch.bool)
        full[:, 0, :t, :t] = causal & valid[:, None, :]
        full[:, 0, t:, :t] = causal.tril(-1) & valid[:, None, :]  # second step at j: real positions < j
        full[:, 0, t:, t:] = torch.eye(t, dtype=torch.bool)  # ... and itself
        full[:, 0, :t, :t] |= torch.eye(t, dtype=torch.bool)  # padding rows attend to themselves (no NaN rows)
        pos = torch.arange(t).repeat(2)[None].expand(b, -1)
        out = self(torch.cat([emb, emb], 1), torch.cat([feats, guess], 1), full, position_ids=pos)
        return out[:, :t], out[:, t:]

    def runtime_state(self) -> dict[str, Tensor]:
        """Weights under the runtime's names (EagleDraft): fc.*, model.layers.0.*, model.norm.weight, lm_head."""
        state = {f"model.{k}": v for k, v in self.model.state_dict().items() if "rotary_emb" not in k}
        state["fc.weight"], state["fc.bias"] = self.fc.weight, self.fc.bias
        state["lm_head.weight"] = self.head
        return {k: v.detach().float().contiguous() for k, v in state.items()}


def load_trainer(path: str | Path, target) -> tuple[EagleTrainer, Tensor]:
    """A saved EAGLE draft folder back as an EagleTrainer (for offline evaluation: `chain_forward`), with its
    vocabulary ids; `target` is the HF target it was trained from."""
    from safetensors.torch import load_file

    from accel.speculative.eagle import DRAFT_META_FILE

    path = Path(path)
    vocab_ids = torch.tensor(json.loads((path / DRAFT_META_FILE).read_text())["vocab_ids"])
    state = load_file(str(path / "model.safetensors"))
    renamed = {("head" if k == "lm_head.weight" else k.removeprefix("model.") if k.startswith("model.") else k): v
               for k, v in state.items()}
    fc = {k.removeprefix("fc."): v for k, v in renamed.items() if k.startswith("fc.")}
    try:
        model = EagleTrainer(target.config, state["lm_head.weight"], state["model.norm.weight"])
        model.fc.load_state_dict(fc)
        missing, unexpected = model.model.load_state_dict(
            {k: v for k, v in renamed.items() if not k.startswith("fc.") and k != "head"}, strict=False)
    except RuntimeError as e:  # shape mismatch: a draft of another target
        raise ValueError(f"EAGLE draft {path} was not trained from this target "
                         f"(hidden {target.config.hidden_size}): {str(e).splitlines()[-1].strip()}") from None
    if int(vocab_ids.max()) >= target.config.vocab_size:
        raise ValueError(f"EAGLE draft {path} proposes token id {int(vocab_ids.max())}; allowed: ids of this "
                         f"target's vocabulary (< {target.config.vocab_size})")
    if [m for m in missing if "rotary_emb" not in m] or unexpected:
        raise ValueError(f"EAGLE draft {path} does not match the trainer: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    with torch.no_grad():
        model.head.copy_(state["lm_head.weight"])
    return model.eval(), vocab_ids


def init_history(path: str | Path) -> list[dict]:
    """The training records of the EAGLE draft at `path` (oldest first), checked before any work starts."""
    from accel.speculative.eagle import DRAFT_META_FILE

    meta_file = Path(path) / DRAFT_META_FILE
    if not (meta_file.exists() and (Path(path) / "model.safetensors").exists()):
        raise ValueError(f"init_from={str(path)!r} is invalid; allowed: a folder an EAGLE `accel draft train` wrote "
                         f"({DRAFT_META_FILE} and model.safetensors)")
    meta = json.loads(meta_file.read_text())
    if meta.get("method") != "eagle":
        raise ValueError(f"init_from={str(path)!r} holds a {meta.get('method')!r} draft; allowed: an eagle draft")
    return list(meta.get("history", [])) + ([meta["train"]] if "train" in meta else [])


def _pad_batch(batch: list[FeatureSample], embed: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Inputs of draft positions i = 0 .. T-3 (token x_{i+1}, feature f_i), right padded -> emb, feats, mask."""
    width = max(len(s.token_ids) - 2 for s in batch)
    h = embed.shape[1]
    emb = torch.zeros(len(batch), width, h)
    feats = torch.zeros(len(batch), width, h)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    for b, s in enumerate(batch):
        n = len(s.token_ids) - 2
        emb[b, :n] = embed[torch.tensor(s.token_ids[1: n + 1])]
        feats[b, :n] = s.features[:n]
        mask[b, :n] = 1
    return emb, feats, mask


def eagle_loss(model: EagleTrainer, batch: list[FeatureSample], embed: Tensor, ce_weight: float,
               ce_fraction: float = 1.0) -> tuple[Tensor, Tensor]:
    """(feature regression, soft cross-entropy) of the first chain step (EAGLE-1), averaged over the batch's
    positions. Training the second chain step too (EAGLE-3's training-time test, weight 0.8) halved the steps
    in 30 CPU-minutes and lowered held-out first-token agreement. ce_fraction < 1 computes the cross-entropy on
    a random share of the positions only: its K-row head product is about half of a training step's arithmetic
    (K = 8192 rows against one 576-wide layer), while the regression, which carries most of the signal at
    ce_weight 0.1, keeps every position."""
    emb, feats, mask = _pad_batch(batch, embed)
    target = torch.cat([s.features[1: len(s.token_ids) - 1] for s in batch])  # f_{i+1}
    ids = torch.cat([s.top_ids for s in batch])
    p = torch.cat([s.top_logprobs for s in batch]).exp()
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)

    def losses(pred: Tensor) -> tuple[Tensor, Tensor]:
        rows = torch.arange(pred.shape[0])
        reg = F.smooth_l1_loss(pred[rows], target[rows])
        if ce_fraction < 1.0:
            rows = rows[torch.randperm(rows.numel())[: max(1, round(ce_fraction * rows.numel()))]]
        logq = (pred[rows] @ model.head.T).log_softmax(-1)  # [n, K]
        ce = -(p[rows] * logq.gather(1, ids[rows])).sum(-1).mean()
        return reg, ce

    return losses(model(emb, feats, mask)[mask.bool()])


@torch.no_grad()
def heldout_agreement(model: EagleTrainer, samples: list[FeatureSample], embed: Tensor, vocab_ids: Tensor
                      ) -> tuple[float, float]:
    """Over the reply positions of `samples`: (first draft token == the target's greedy token, teacher-forced
    features; second draft token == the target's, given the first was right: what a chain's second token sees,
    its first-step guess fed back as the feature)."""
    model.eval()
    ok = total = ok2 = total2 = 0
    for a in range(0, len(samples), 8):
        batch = samples[a: a + 8]
        emb, feats, mask = _pad_batch(batch, embed)
        out1, out2 = model.chain_forward(emb, feats, mask)
        for b, s in enumerate(batch):
            n = len(s.token_ids) - 2
            pred = vocab_ids[(out1[b, :n] @ model.head.T).argmax(-1)]  # row i: guess of x_{i+2}
            pred2 = vocab_ids[(out2[b, :n] @ model.head.T).argmax(-1)]  # row j: second-step guess of x_{j+2}
            truth = torch.tensor(s.token_ids[2: n + 2])
            first = max(0, s.num_prompt - 1)  # drafting starts after the first reply token: guesses of x_{p+1}..
            right = pred == truth
            ok += int(right[first:].sum())
            total += n - first
            # a chain drafted at row j - 1 (first token x_{j+1}, right) goes on at row j with the guess fed back
            cond = right[first: n - 1]
            ok2 += int((pred2[first + 1: n] == truth[first + 1: n])[cond].sum())
            total2 += int(cond.sum())
    model.train()
    return ok / max(1, total), ok2 / max(1, total2)


def _batches(samples: list[FeatureSample], batch_tokens: int, rng: random.Random) -> list[list[FeatureSample]]:
    order = sorted(range(len(samples)), key=lambda i: (len(samples[i].token_ids), rng.random()))
    out = pack_batches(samples, order, batch_tokens)
    rng.shuffle(out)
    return out


def train_eagle(target_path: str | Path, out_dir: str | Path, *, time_budget_minutes: float = 30.0,
                calibration_dir: str | Path = "calibration_data", num_prompts: int = 800,
                max_new_tokens: int = 128, learning_rate: float = 1e-3, ce_weight: float = 0.1,
                draft_vocab_size: int = 8192, gen_fraction: float = 0.4, heldout_fraction: float = 0.08,
                model_written_fraction: float = 0.5, ce_fraction: float = 0.25,
                batch_tokens: int = 2048, seed: int = 0, init_from: str | Path | None = None,
                progress: bool = True) -> EagleTrainResult:
    """Generate teacher data, train and save an EAGLE draft within `time_budget_minutes` (load to save).

    model_written_fraction: share of the prompts that are user turns the target writes itself
    (`model_written_prompts`, at most a fifth of the generation time), interleaved with the calibration prompts.
    ce_fraction: share of positions the cross-entropy is computed on (`eagle_loss`).
    init_from: an EAGLE draft folder of the same target to go on training (its weights and vocabulary;
    draft_vocab_size is then ignored) on this run's fresh replies. Why: a budget is one sitting, and the draft
    keeps improving with data (an 80-minute run's held-out agreement beat a 30-minute run's), so a second
    sitting adds to the first instead of starting over. The calibration pool holds ~1330 prompts and an
    80-minute run replies to all of them, so a continuation should use a different `seed` and a high
    model_written_fraction (fresh target-written turns); the folder's earlier training records are kept under
    "history"."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from accel.speculative.eagle import save_eagle_draft

    if time_budget_minutes <= 0:
        raise ValueError(f"time_budget_minutes={time_budget_minutes} is invalid; allowed: > 0")
    if not 0 < gen_fraction < 1:
        raise ValueError(f"gen_fraction={gen_fraction} is invalid; allowed: in (0, 1), the rest is training time")
    if not 0 <= model_written_fraction <= 1:
        raise ValueError(f"model_written_fraction={model_written_fraction} is invalid; allowed: in [0, 1]")
    if not 0 < ce_fraction <= 1:
        raise ValueError(f"ce_fraction={ce_fraction} is invalid; allowed: in (0, 1]")
    history = init_history(init_from) if init_from is not None else []
    start = time.monotonic()
    budget = time_budget_minutes * 60.0
    log = (lambda msg: print(f"[eagle {time.monotonic() - start:6.0f}s] {msg}", flush=True)) if progress \
        else (lambda msg: None)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(target_path))
    target = AutoModelForCausalLM.from_pretrained(str(target_path), dtype=torch.float32).eval()
    if init_from is not None:  # a draft of another target fails here, before any generation
        model, init_vid = load_trainer(init_from, target)
    messages = build_prompts(load_samples(calibration_dir), num_prompts, seed=seed)
    n_written = round(num_prompts * model_written_fraction)
    written: list[str] = []
    if n_written:
        log(f"the target writes up to {n_written} user turns")
        written = model_written_prompts(target_path, tokenizer, n_written, seed=seed,
                                        deadline=start + 0.4 * model_written_fraction * gen_fraction * budget)
        log(f"{len(written)} distinct user turns written")
    calib = messages[: num_prompts - len(written)] if model_written_fraction < 1 else []
    messages = []
    for i in range(max(len(calib), len(written))):  # interleaved: the generation deadline keeps a mix
        messages += [calib[i]] if i < len(calib) else []
        messages += [[{"role": "user", "content": written[i]}]] if i < len(written) else []
    prompts = [chat_ids(tokenizer, m)[-384:] for m in messages]
    is_written = set(written)
    written_set = {tuple(p) for p, m in zip(prompts, messages) if len(m) == 1 and m[0]["content"] in is_written}
    log(f"generating target replies + features for {len(prompts)} prompts (max_new_tokens={max_new_tokens})")
    samples = engine_feature_samples(target_path, prompts, max_new_tokens, sorted(stop_token_ids(target, tokenizer)),
                                     deadline=start + gen_fraction * budget)
    gen_s = time.monotonic() - start
    if len(samples) < 2:
        raise ValueError(f"time_budget_minutes={time_budget_minutes} produced {len(samples)} finished replies; "
                         "allowed: a budget long enough for at least 2 (raise it or lower max_new_tokens)")
    num_generated = sum(len(s.token_ids) - s.num_prompt for s in samples)
    log(f"{len(samples)} replies, {num_generated} generated tokens, "
        f"{sum(len(s.token_ids) for s in samples)} positions in {gen_s:.0f}s")

    if init_from is not None:
        vocab_ids = init_vid.tolist()
        log(f"going on from {init_from} (vocabulary {len(vocab_ids)})")
    else:
        counts = Counter()
        for s in samples:
            counts.update(s.token_ids[1:])
        vocab_ids = select_draft_vocab(counts, draft_vocab_size, added_token_ids(target_path),
                                       target.config.vocab_size)
    replies = Counter()
    for s in samples:
        replies.update(s.token_ids[s.num_prompt:])
    inside = set(vocab_ids)
    coverage = sum(c for t, c in replies.items() if t in inside) / max(1, sum(replies.values()))
    vid = torch.tensor(vocab_ids)
    embed = target.get_input_embeddings().weight.detach().float()
    head_rows = target.get_output_embeddings().weight.detach().float()[vid].clone()
    attach_teacher(samples, head_rows)

    rng.shuffle(samples)
    n_held = max(1, int(len(samples) * heldout_fraction))
    held, train = samples[:n_held], samples[n_held:]
    if init_from is None:
        model = EagleTrainer(target.config, head_rows, effective_norm_weight(target.model.norm, target.config))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.0)
    model.train()
    losses: list[float] = []
    train_start = time.monotonic()
    deadline = start + budget - min(60.0, 0.08 * budget)  # held-out eval + save
    step = 0
    while time.monotonic() < deadline:
        for batch in _batches(train, batch_tokens, rng):
            if time.monotonic() >= deadline:
                break
            # warmup over 20 steps, then linear decay by the clock to 10% at the deadline (the budget is time)
            left = (deadline - time.monotonic()) / max(1e-9, deadline - train_start)
            lr = learning_rate * min(1.0, (step + 1) / 20) * max(0.1, left)
            reg, ce = eagle_loss(model, batch, embed, ce_weight, ce_fraction)
            losses.append(train_step(opt, params, reg + ce_weight * ce, lr))
            step += 1
            if progress and step % 100 == 0:
                log(f"step {step}: regression {float(reg.detach()):.4f}, cross-entropy {float(ce.detach()):.3f}")
    train_s = time.monotonic() - train_start
    if not losses:
        raise ValueError(f"time_budget_minutes={time_budget_minutes} left no time to train after generating "
                         f"({gen_s:.0f} s); allowed: a budget long enough for at least one step")
    top1, second = heldout_agreement(model, held, embed, vid)
    log(f"trained {step} steps in {train_s:.0f}s; held-out agreement: first token {top1:.3f}, "
        f"second given the first {second:.3f}")
    result = EagleTrainResult(
        out_dir=str(out_dir), draft_vocab_size=len(vocab_ids), vocab_coverage=coverage, num_prompts=len(samples),
        num_generated_tokens=num_generated,
        num_model_written_prompts=sum(tuple(s.token_ids[: s.num_prompt]) in written_set for s in samples),
        num_train_positions=sum(len(s.token_ids) - 2 for s in train),
        num_steps=step, heldout_top1=top1, heldout_second=second, seconds_generating=gen_s, seconds_training=train_s, losses=losses)
    meta = {"target": str(target_path), "train": {k: v for k, v in asdict(result).items() if k != "losses"}
            | {"seed": seed, "init_from": None if init_from is None else str(init_from)}}
    if history:
        meta["history"] = history
    save_eagle_draft(out_dir, model.config, model.runtime_state(), vocab_ids, meta, tokenizer_dir=target_path)
    log(f"saved to {out_dir}")
    return result
