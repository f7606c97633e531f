"""Distil a small, cheap draft from the target on CPU within a time budget (`accel draft train`).

Why this shape (SmolLM2-135M: 30 layers of ~3.5M parameters, tied 49152 x 576 embedding/head = 28M):
a 2-layer draft with the full vocabulary head still costs a large share of the target per token, and
Leviathan's formula then predicts next to no speed-up even at acceptance 0.5. So the draft here is
  * a few target layers (default: the first 2; see `pick_layers`), the final norm and the tied embedding,
    copied from the target (a random draft accepts nothing; the copy is a much better starting point),
  * a reduced-vocabulary head: the K most frequent tokens the target predicts on the training data
    (K = 8192 by default covers nearly all of its greedy outputs). The folder stays a standard
    LlamaForCausalLM with a full head (transformers loads it as is); `accel_draft.json` lists the
    K ids, and DraftModelProposer computes only those rows of the head. The draft's probability outside
    the K ids is zero, which rejection sampling handles exactly.
  * trained on what it will be asked to predict: the target's own greedy replies to calibration prompts
    (the logits come free with generation) plus teacher-forced calibration text, with a soft cross-entropy
    to the target's top-m next-token distribution restricted to the K ids. The input embedding stays frozen
    (shared with the target); the layers, the final norm and (default) the K head rows learn, so the saved draft
    has its own lm_head (untied): a frozen head forces 2 layers to produce final-layer-like states.

Budget: generation gets `gen_fraction` of the time, teacher-forced text a little more, training the rest.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from accel.draft_training.prompts import build_prompts, chat_ids, load_samples
from accel.speculative.proposer import DRAFT_META_FILE, TOKENIZER_FILES

TEACHER_TOP_M = 20  # target log-probs kept per position: the runtime's logprobs limit, so every source matches


@dataclass
class TeacherSample:
    """One training sequence: token_ids [T]; for input positions loss_start .. loss_start + n - 1 the target's
    top-m next-token ids and log-probs (top_ids, top_logprobs: [n, m])."""

    token_ids: list[int]
    loss_start: int
    top_ids: Tensor
    top_logprobs: Tensor


@dataclass
class DraftTrainResult:
    out_dir: str
    num_layers: int
    layer_ids: list[int]
    draft_vocab_size: int
    vocab_coverage: float  # fraction of the target's training-data greedy tokens inside the draft vocabulary
    num_prompts: int
    num_generated_tokens: int
    num_train_positions: int
    num_steps: int
    seconds_generating: float
    seconds_training: float
    losses: list[float] = field(default_factory=list)


def pick_layers(num_target_layers: int, num_layers: int, choice: str = "first") -> list[int]:
    """Which target layers initialise the draft.

    "first": layers 0 .. n-1 (default). A truncated network is a coherent start: each copied layer sees the
    residual stream it was trained on, only the jump to the final norm/head is new. Measured on SmolLM2-135M
    before training (6 chat texts, soft CE to the target's top-32 / top-1 agreement): [0, 1] 16.7 / 3.5%,
    [0, 29] 62.1 / 0%, [28, 29] 19.2 / 0.7%, [0, 15, 29] 19.4 / 0%.
    "spread": evenly spaced, always the first and (n >= 2) the last: 30, 2 -> [0, 29].
    """
    if not 1 <= num_layers <= num_target_layers:
        raise ValueError(f"num_layers={num_layers} is invalid; allowed: 1..{num_target_layers} (target layers)")
    if choice == "first":
        return list(range(num_layers))
    if choice != "spread":
        raise ValueError(f"layer choice {choice!r} is invalid; allowed: 'first', 'spread'")
    if num_layers == 1:
        return [0]
    step = (num_target_layers - 1) / (num_layers - 1)
    return [round(i * step) for i in range(num_layers)]


def build_draft(target: torch.nn.Module, layer_ids: list[int]) -> torch.nn.Module:
    """A LlamaForCausalLM with the target's embedding, final norm and the given decoder layers (copies)."""
    from transformers import AutoModelForCausalLM

    cfg = target.config.to_dict()
    cfg["num_hidden_layers"] = len(layer_ids)
    cfg.pop("layer_types", None)  # derived from num_hidden_layers when present
    config = type(target.config).from_dict(cfg)
    draft = AutoModelForCausalLM.from_config(config).to(target.dtype)
    draft.model.embed_tokens.load_state_dict(target.model.embed_tokens.state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    for i, src in enumerate(layer_ids):
        draft.model.layers[i].load_state_dict(target.model.layers[src].state_dict())
    if not config.tie_word_embeddings:
        draft.lm_head.load_state_dict(target.lm_head.state_dict())
    return draft.eval()


def select_draft_vocab(counts: Counter, size: int, always: list[int], vocab_size: int) -> list[int]:
    """The `size` most frequent ids of `counts` plus `always` (special tokens), sorted; ties by lower id.

    Ids never seen fill the remainder in id order, so the result has exactly min(size, vocab_size) ids."""
    if size < 1:
        raise ValueError(f"draft vocabulary size={size} is invalid; allowed: >= 1")
    chosen = dict.fromkeys(i for i in always if 0 <= i < vocab_size)
    for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(chosen) >= size:
            break
        chosen.setdefault(tok)
    filler = iter(range(vocab_size))
    while len(chosen) < min(size, vocab_size):
        chosen.setdefault(next(filler))
    return sorted(chosen)


def added_token_ids(model_dir: str | Path) -> list[int]:
    """The ids of the tokenizer's added (special) tokens: tokenizer.json's `added_tokens`, none without the file."""
    tok_json = Path(model_dir) / "tokenizer.json"
    added = json.loads(tok_json.read_text()).get("added_tokens", []) if tok_json.exists() else []
    return [t["id"] for t in added]


def stop_token_ids(model, tokenizer) -> set[int]:
    """Token ids that end a reply: the generation config's eos ids (SmolLM2-Instruct: 2 = <|im_end|>; its
    tokenizer's eos_token is a different token) plus the tokenizer's eos."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return set(ids)


@torch.inference_mode()
def generate_teacher_samples(target, tokenizer, prompts: list[list[dict]], max_new_tokens: int, deadline: float,
                             batch_size: int = 8, top_m: int = TEACHER_TOP_M, max_prompt_tokens: int = 384) -> list[TeacherSample]:
    """The target's greedy replies to chat prompts with its top-m next-token distribution at each reply token.

    Batches of similar-length prompts (left padded); stops starting new batches at `deadline`."""
    encoded = [chat_ids(tokenizer, m)[-max_prompt_tokens:] for m in prompts]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    eos = stop_token_ids(target, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    samples: list[TeacherSample] = []
    for b in range(0, len(order), batch_size):
        if time.monotonic() >= deadline:
            break
        batch = [encoded[i] for i in order[b: b + batch_size]]
        width = max(len(x) for x in batch)
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in batch])  # [B, P] left padded
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in batch])
        # max_time stops mid-batch at the deadline (a batch can take minutes on a busy CPU)
        out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                              output_logits=True, return_dict_in_generate=True, pad_token_id=pad,
                              max_time=max(1.0, deadline - time.monotonic()))
        gen = out.sequences[:, width:]  # [B, G]
        logprobs = torch.stack(out.logits, dim=1).float().log_softmax(-1)  # [B, G, V]
        top_lp, top_ids = logprobs.topk(top_m, dim=-1)  # [B, G, m]
        for row, prompt in enumerate(batch):
            reply = gen[row].tolist()
            n = next((j + 1 for j, t in enumerate(reply) if t in eos), len(reply))  # rows that stopped are padded
            samples.append(TeacherSample(prompt + reply[:n], len(prompt) - 1, top_ids[row, :n].clone(),
                                         top_lp[row, :n].clone()))
    return samples


@torch.inference_mode()
def engine_teacher_samples(target, target_path: str | Path, tokenizer, prompts: list[list[dict]],
                           max_new_tokens: int, deadline: float, batch_size: int = 32, top_m: int = TEACHER_TOP_M,
                           max_prompt_tokens: int = 384) -> list[TeacherSample]:
    """As `generate_teacher_samples`, several times faster: the runtime engine generates the greedy replies with
    continuous batching over a paged KV cache and returns the target's top-m log-probs at every reply token
    (`SamplingParams.logprobs`: the same distributions teacher forcing would give, with no second forward).
    All prompts are queued at once (no batch tail); at `deadline` the requests still running are aborted and
    only finished replies are kept. top_m is capped at the engine's logprobs limit (20)."""
    from accel.runtime.engine import Engine
    from accel.runtime.sampling_params import MAX_LOGPROBS, SamplingParams

    top_m = min(top_m, MAX_LOGPROBS)
    encoded = [chat_ids(tokenizer, m)[-max_prompt_tokens:] for m in prompts]
    eos = stop_token_ids(target, tokenizer)
    engine = Engine.from_pretrained(target_path, kv_cache_memory_gb=0.5, max_num_seqs=batch_size,
                                    max_num_batched_tokens=2048)
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0, stop_token_ids=sorted(eos), logprobs=top_m)
    prompt_of = {engine.add_request(p, params): p for p in encoded}
    samples: list[TeacherSample] = []
    for out in outputs_until(engine, deadline, prompt_of):
        if not out.finished or out.finish_reason == "abort" or not out.token_ids:
            continue
        p = prompt_of.pop(out.request_id)
        top = out.top_logprobs  # [n] lists of (token_id, logprob), best first
        ids = torch.tensor([[t for t, _ in row[:top_m]] for row in top])
        lps = torch.tensor([[lp for _, lp in row[:top_m]] for row in top])
        samples.append(TeacherSample(p + list(out.token_ids), len(p) - 1, ids, lps))
    return samples


def outputs_until(engine, deadline: float, request_ids: Iterable[str]) -> Iterator:
    """Every output of `engine.step()` until the engine has nothing left or `deadline` passes; at the deadline
    the requests in `request_ids` (read then: a dict of the ones still wanted works) are aborted."""
    while engine.has_unfinished():
        if time.monotonic() >= deadline:
            for rid in list(request_ids):
                engine.abort(rid)
            break
        yield from engine.step()


@torch.inference_mode()
def teacher_forced_samples(target, tokenizer, texts: list[str], deadline: float, max_len: int = 256,
                           batch_size: int = 8, top_m: int = TEACHER_TOP_M) -> list[TeacherSample]:
    """The target's top-m next-token distribution at every position of calibration texts (one forward each)."""
    samples: list[TeacherSample] = []
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"][:max_len] for t in texts]
    encoded = [e for e in encoded if len(e) >= 2]
    for b in range(0, len(encoded), batch_size):
        if time.monotonic() >= deadline:
            break
        batch = encoded[b: b + batch_size]
        width = max(len(x) for x in batch)
        ids = torch.tensor([x + [0] * (width - len(x)) for x in batch])  # [B, T] right padded
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in batch])
        logprobs = target(input_ids=ids, attention_mask=mask).logits.float().log_softmax(-1)  # [B, T, V]
        top_lp, top_ids = logprobs.topk(top_m, dim=-1)
        for row, x in enumerate(batch):
            n = len(x) - 1  # the last position predicts a token we do not have
            samples.append(TeacherSample(x, 0, top_ids[row, :n].clone(), top_lp[row, :n].clone()))
    return samples


def distill_loss(draft, head: Tensor, lookup: Tensor, batch: list[TeacherSample]) -> Tensor:
    """Soft cross-entropy of the draft's reduced-vocabulary distribution to the target's top-m distribution.

    head [K, H]: the draft vocabulary's rows of the tied head; lookup [V]: full id -> index in K (-1 outside).
    The target's top-m mass outside K is dropped and the rest renormalised (the draft cannot propose it)."""
    width = max(len(s.token_ids) for s in batch)
    ids = torch.tensor([s.token_ids + [0] * (width - len(s.token_ids)) for s in batch])  # [B, T]
    mask = torch.tensor([[1] * len(s.token_ids) + [0] * (width - len(s.token_ids)) for s in batch])
    hidden = draft.model(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, T, H]
    rows = torch.cat([torch.full((len(s.top_ids),), b) for b, s in enumerate(batch)])  # [N]
    cols = torch.cat([torch.arange(s.loss_start, s.loss_start + len(s.top_ids)) for s in batch])  # [N]
    logq = (hidden[rows, cols] @ head.T).log_softmax(-1)  # [N, K]
    m = min(s.top_ids.shape[1] for s in batch)  # sources may keep different top-m: use the common best m
    top_ids = torch.cat([s.top_ids[:, :m] for s in batch])  # [N, m]
    p = torch.cat([s.top_logprobs[:, :m] for s in batch]).exp()  # [N, m]
    reduced = lookup[top_ids]  # [N, m]
    p = torch.where(reduced >= 0, p, torch.zeros_like(p))
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    return -(p * logq.gather(1, reduced.clamp_min(0))).sum(-1).mean()


def train_on_samples(draft, samples: list[TeacherSample], vocab_ids: list[int], deadline: float,
                     learning_rate: float, seed: int, batch_tokens: int = 2048,
                     max_steps: int | None = None, train_head: bool = False) -> list[float]:
    """AdamW on the draft's layers and final norm until `deadline` (or max_steps); returns the step losses.

    train_head: also train the head's `vocab_ids` rows. The head then stops being the (frozen, shared) input
    embedding: the draft is untied (`lm_head` = the embedding with those rows replaced), so its folder holds a
    second [V, H] matrix, and the input embedding stays the target's."""
    if not samples:
        raise ValueError("no training samples: the time budget ended before the target produced any data; "
                         "raise time_budget_minutes or lower num_prompts / max_new_tokens")
    vocab = draft.config.vocab_size
    lookup = torch.full((vocab,), -1, dtype=torch.long)
    ids = torch.tensor(vocab_ids)
    lookup[ids] = torch.arange(len(vocab_ids))
    head = draft.get_output_embeddings().weight.detach()[ids].clone()  # [K, H]
    for p in draft.parameters():
        p.requires_grad_(False)
    params = [p for p in list(draft.model.layers.parameters()) + list(draft.model.norm.parameters())]
    if train_head:
        head.requires_grad_(True)
        params.append(head)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    draft.train()
    losses: list[float] = []
    step = 0
    while time.monotonic() < deadline and (max_steps is None or step < max_steps):
        for batch in _batches(samples, batch_tokens, gen):
            if time.monotonic() >= deadline or (max_steps is not None and step >= max_steps):
                break
            warmup = min(1.0, (step + 1) / 20)  # short linear warmup: the copied layers start close
            loss = distill_loss(draft, head, lookup, batch)
            losses.append(train_step(opt, params, loss, learning_rate * warmup))
            step += 1
    draft.eval()
    for p in draft.parameters():
        p.requires_grad_(False)
    if train_head:
        untie_head(draft, ids, head.detach())
    return losses


def train_step(opt: torch.optim.Optimizer, params: list[Tensor], loss: Tensor, lr: float) -> float:
    """One optimizer step on `loss` at learning rate `lr`, gradients clipped to norm 1; returns the loss."""
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return float(loss.detach())


def untie_head(draft, ids: Tensor, rows: Tensor) -> None:
    """Give the draft its own lm_head: the input embedding's matrix with rows `ids` replaced by `rows`."""
    emb = draft.get_input_embeddings().weight.detach()
    full = emb.clone()
    full[ids] = rows.to(full.dtype)
    draft.config.tie_word_embeddings = False
    head = torch.nn.Linear(full.shape[1], full.shape[0], bias=False, dtype=full.dtype)
    head.weight = torch.nn.Parameter(full, requires_grad=False)
    draft.set_output_embeddings(head)


def _batches(samples: list[TeacherSample], batch_tokens: int, gen: torch.Generator):
    """Shuffled batches of roughly `batch_tokens` tokens (padded size), similar lengths together."""
    perm = torch.randperm(len(samples), generator=gen).tolist()
    batches = pack_batches(samples, sorted(perm, key=lambda i: len(samples[i].token_ids)), batch_tokens)
    order = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[i] for i in order]


def pack_batches(samples: list, order: list[int], batch_tokens: int) -> list[list]:
    """`samples` taken in `order` and cut into batches of at most `batch_tokens` tokens once each is padded to its
    longest sample (a longer sample makes a batch alone)."""
    batches, cur, width = [], [], 0
    for i in order:
        width_new = max(width, len(samples[i].token_ids))
        if cur and width_new * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, width_new = [], len(samples[i].token_ids)
        cur.append(samples[i])
        width = width_new
    if cur:
        batches.append(cur)
    return batches


def save_draft(draft, out_dir: str | Path, target_dir: str | Path, meta: dict) -> Path:
    """Write the draft as an HF folder + the target's tokenizer files + accel_draft.json (meta, vocab_ids)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    draft.save_pretrained(out)
    for name in TOKENIZER_FILES:
        src = Path(target_dir) / name
        if src.exists():
            shutil.copy2(src, out / name)
    (out / DRAFT_META_FILE).write_text(json.dumps(meta))
    return out


def train_draft(target_path: str | Path, out_dir: str | Path, *, num_layers: int = 2,
                time_budget_minutes: float = 30.0, prompts: list[list[dict]] | None = None,
                calibration_dir: str | Path = "calibration_data", num_prompts: int = 256,
                max_new_tokens: int = 128, learning_rate: float = 5e-4, seed: int = 0,
                draft_vocab_size: int = 8192, layer_choice: str = "first", gen_fraction: float = 0.45,
                teacher_forced_fraction: float = 0.1, progress: bool = True,
                generator: str = "engine", train_head: bool = True) -> DraftTrainResult:
    """Train a `num_layers`-layer draft of the target within the time budget and save it to out_dir.

    prompts: chat message lists to generate replies for (default: built from calibration_dir).
    generator: "engine" (the runtime generates the replies and returns their top-20 log-probs) or "hf".
    train_head: train the draft vocabulary's head rows too (the draft gets its own, untied lm_head).
    The budget covers loading, generation, training and saving; see the module docstring for the method."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if generator not in ("engine", "hf"):
        raise ValueError(f"generator={generator!r} is invalid; allowed: 'engine', 'hf'")

    if time_budget_minutes <= 0:
        raise ValueError(f"time_budget_minutes={time_budget_minutes} is invalid; allowed: > 0")
    if not 0 < gen_fraction + teacher_forced_fraction < 1:
        raise ValueError(f"gen_fraction + teacher_forced_fraction = {gen_fraction + teacher_forced_fraction}; "
                         "allowed: in (0, 1), the rest is training time")
    start = time.monotonic()
    budget = time_budget_minutes * 60.0
    log = (lambda msg: print(f"[draft {time.monotonic() - start:6.0f}s] {msg}", flush=True)) if progress \
        else (lambda msg: None)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(target_path))
    target = AutoModelForCausalLM.from_pretrained(str(target_path), dtype=torch.float32).eval()
    samples_data = load_samples(calibration_dir) if (prompts is None or teacher_forced_fraction > 0) else []
    if prompts is None:
        prompts = build_prompts(samples_data, num_prompts, seed=seed)
    log(f"generating target replies to {len(prompts)} prompts (max_new_tokens={max_new_tokens})")
    if generator == "engine":
        gen_samples = engine_teacher_samples(target, target_path, tokenizer, prompts, max_new_tokens,
                                             deadline=start + gen_fraction * budget)
    else:
        gen_samples = generate_teacher_samples(target, tokenizer, prompts, max_new_tokens,
                                               deadline=start + gen_fraction * budget)
    gen_done = time.monotonic()
    texts = [s["text"] for s in samples_data]
    random.Random(seed).shuffle(texts)  # every domain gets a share when the budget cuts the list short
    tf_samples = teacher_forced_samples(target, tokenizer, texts, deadline=gen_done + teacher_forced_fraction * budget)
    samples = gen_samples + tf_samples
    num_generated = sum(len(s.top_ids) for s in gen_samples)
    log(f"{len(gen_samples)} replies ({num_generated} tokens) + {len(tf_samples)} teacher-forced texts")

    counts = Counter()
    for s in samples:
        counts.update(s.top_ids[:, 0].tolist())
    special = added_token_ids(target_path)  # always proposable: <|im_end|> ends most replies
    vocab_ids = select_draft_vocab(counts, draft_vocab_size, special, target.config.vocab_size)
    inside = set(vocab_ids)
    coverage = sum(c for t, c in counts.items() if t in inside) / max(1, sum(counts.values()))

    layer_ids = pick_layers(target.config.num_hidden_layers, num_layers, layer_choice)
    draft = build_draft(target, layer_ids)
    del target
    train_start = time.monotonic()
    save_margin = min(30.0, 0.05 * budget)
    losses = train_on_samples(draft, samples, vocab_ids, deadline=start + budget - save_margin,
                              learning_rate=learning_rate, seed=seed, train_head=train_head)
    train_s = time.monotonic() - train_start
    if not losses:
        raise ValueError(f"time_budget_minutes={budget / 60:.2f} left no time to train after collecting the "
                         f"teacher's replies ({train_start - start:.0f} s); allowed: a budget long enough for "
                         "at least one training step (raise it, or lower num_prompts / max_new_tokens)")
    tail = losses[-10:]
    log(f"trained {len(losses)} steps in {train_s:.0f}s; loss {losses[0]:.3f} -> {sum(tail) / len(tail):.3f}")
    result = DraftTrainResult(
        out_dir=str(out_dir), num_layers=num_layers, layer_ids=layer_ids, draft_vocab_size=len(vocab_ids),
        vocab_coverage=coverage, num_prompts=len(gen_samples), num_generated_tokens=num_generated,
        num_train_positions=sum(len(s.top_ids) for s in samples), num_steps=len(losses),
        seconds_generating=gen_done - start, seconds_training=train_s, losses=losses)
    meta = {"vocab_ids": vocab_ids, "target": str(target_path), "method": "distilled",
            "train": {k: v for k, v in asdict(result).items() if k != "losses"}}
    save_draft(draft, out_dir, target_path, meta)
    log(f"saved to {out_dir}")
    return result
