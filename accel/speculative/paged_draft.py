"""A draft model inside the runtime: its own paged KV cache, all requests drafted in one batched forward per step.

The draft is the runtime's own `CausalLM` (any Llama-family HF folder sharing the target's tokenizer, optionally
quantized) with its own `KVCacheManager` + `ModelRunner` KV tensors. Per request it keeps a draft-side
`Sequence` whose tokens are the verified tokens plus the drafts fed so far:

    verified:   x_0 .. x_{t-1}                        (what the target accepted; ProposalRequest.token_ids)
    draft seq:  x_0 .. x_{c-1} | stale drafts ...      K/V valid for the first c tokens (common prefix)
    step 0:     feed x_c .. x_{t-1} (catch up, >= 1 token)   -> d_0
    step j:     feed d_{j-1} (one decode token)              -> d_j,   j = 1 .. k-1

Rollback is the runtime's own: `num_computed_tokens` drops to the longest prefix shared with the verified
tokens, and the stale slots are overwritten by the next feed. Requests with different k share the forward of
every step they still need. A request whose draft blocks do not fit simply gets no drafts this step.

Reduced vocabulary (`accel_draft.json` `vocab_ids`, from distillation): only those rows of the head are
computed; the draft puts zero probability elsewhere, which rejection sampling handles exactly.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from accel.runtime.kv_cache_manager import KVCacheManager
from accel.runtime.models import CausalLM, fuse_projections, load_model
from accel.runtime.config import RuntimeConfig
from accel.runtime.model_runner import ModelRunner, RunnerConfig
from accel.runtime.outputs import ScheduledRequest
from accel.runtime.sampler import Sampler, is_greedy, plain_greedy
from accel.runtime.sampling_params import SamplingParams
from accel.runtime.sequence import Sequence
from accel.speculative.proposer import ProposalRequest, Proposals, Proposer, load_draft_vocab_ids
from accel.speculative.tokenizer_check import check_tokenizers_match

_GREEDY = SamplingParams(temperature=0.0)


def quantize_draft(model: CausalLM, scheme: str, head: bool = False) -> None:
    """Quantize every decoder Linear of the draft with `scheme` ("int8" | "int4"); lm_head too with `head` (a
    token draft keeps it float: its reduced-vocabulary rows are copied out of it)."""
    from accel.schemes import apply_plan

    plan = {name: scheme for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and (head or name != "lm_head")}
    apply_plan(model, plan)


class PagedDraftProposer(Proposer):
    """Batched draft-model proposer over its own paged KV cache; see the module docstring.

    model: the draft CausalLM (RoPE initialised). num_blocks/block_size: its KV pool.
    vocab_ids: target ids the draft may propose (None: all).
    """

    feeds_features = False  # a draft that reads a feature with each token (EagleProposer): see `_first_features`

    def __init__(self, model: CausalLM, num_blocks: int, block_size: int = 16,
                 vocab_ids: list[int] | None = None) -> None:
        self.model = model
        self.runner = ModelRunner(model, RunnerConfig(num_blocks, RuntimeConfig(block_size=block_size)))
        self.kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=False, windows=model.kv_layout.windows)
        self.vocab_size = int(model.config.vocab_size)
        self.max_positions = int(model.config.max_position_embeddings)
        self.sampler = Sampler()
        self.vocab_ids: Tensor | None = None
        self.head: Tensor | None = None
        self._head_linear: nn.Module | None = None  # built on first use from self.head
        if vocab_ids is not None:
            bad = [i for i in vocab_ids if not 0 <= i < self.vocab_size]
            if bad or not vocab_ids:
                raise ValueError(f"draft vocab_ids must be a non-empty list of ids in [0, {self.vocab_size}); "
                                 f"got {len(vocab_ids)} ids, out of range: {bad[:5]}")
            weight = _head_weight(model)
            if weight is not None:  # a quantized head computes all rows, then masks
                self.vocab_ids = torch.tensor(vocab_ids, dtype=torch.long, device=self.runner.device)
                self.head = weight.detach()[self.vocab_ids].contiguous()  # [K, H]
            else:
                self._mask = torch.full((self.vocab_size,), float("-inf"), device=self.runner.device)
                self._mask[torch.tensor(vocab_ids)] = 0.0
        self.seqs: dict[str, Sequence] = {}
        self.min_path_confidence: float | None = None  # SpeculativeConfig.draft_min_path_confidence
        self.min_first_confidence: float | None = None  # SpeculativeConfig.draft_min_first_confidence

    @classmethod
    def from_pretrained(cls, path: str | Path, num_blocks: int, block_size: int = 16,
                        target_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu", quant_scheme: str | None = None) -> PagedDraftProposer:
        """Load an HF draft folder; with target_dir its tokenizer must match (TokenizerMismatchError)."""
        if target_dir is not None and (Path(target_dir) / "tokenizer.json").exists():
            check_tokenizers_match(target_dir, path)
        model = load_model(path, dtype, torch.device(device))
        if quant_scheme is not None:
            quantize_draft(model, quant_scheme)
        fuse_projections(model)
        proposer = cls(model, num_blocks, block_size, load_draft_vocab_ids(path))
        try:  # CPU fp32: the runtime's pre-packed Linears (the reduced head was copied out above)
            from accel.kernels.linear import pack_float_linears
        except ImportError:
            return proposer
        pack_float_linears(model)
        return proposer

    # ---- state -----------------------------------------------------------------------------------------
    def finish(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.kv.free(seq)
            self.kv.forget(seq)

    def _prepare(self, r: ProposalRequest) -> Sequence | None:
        """The request's draft sequence rolled back to its verified prefix, with slots for k - 1 more feeds."""
        tokens = list(r.token_ids)
        if len(tokens) + r.k > self.max_positions:
            return None
        seq = self.seqs.get(r.request_id)
        if seq is None:
            seq = self.seqs[r.request_id] = Sequence(r.request_id, tokens, _GREEDY)
        return self._rewind(seq, tokens, r.k)

    def _rewind(self, seq: Sequence, tokens: list[int], k: int, max_keep: int | None = None) -> Sequence | None:
        """`seq` set to `tokens`, keeping the computed prefix they share (at most `max_keep` positions) and always
        one token to feed for its logits, with KV slots for that feed and k - 1 more; None when the pool is full."""
        limit = min(seq.num_computed_tokens, len(tokens) - 1)
        if max_keep is not None:
            limit = min(limit, max_keep)
        keep = 0
        old = seq.prompt_token_ids
        while keep < limit and old[keep] == tokens[keep]:
            keep += 1
        seq.prompt_token_ids = tokens
        seq.num_computed_tokens = keep
        if self.kv.allocate_slots(seq, len(tokens) - keep + k - 1) is None:
            return None
        return seq

    def _first_features(self, r: ProposalRequest, seq: Sequence) -> Tensor:
        """The features fed with the tokens `seq` catches up on in a proposal's first forward; only drafts that
        `feeds_features` are asked (later forwards feed each chain its own last hidden state)."""
        raise NotImplementedError(f"{type(self).__name__} feeds tokens only")

    # ---- proposing -------------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, requests: list[ProposalRequest]) -> Proposals:
        drafts: list[list[int]] = [[] for _ in requests]
        qs: list[list[Tensor]] = [[] for _ in requests]
        active, feats = [], []
        for i, r in enumerate(requests):
            if r.k < 0:
                raise ValueError(f"k={r.k} is invalid for request {r.request_id!r}; allowed: >= 0")
            seq = self._prepare(r) if r.k > 0 else None
            if seq is not None:
                active.append((i, seq))
                if self.feeds_features:
                    feats.append(self._first_features(r, seq))
        catchup = max((seq.num_tokens - seq.num_computed_tokens for _, seq in active), default=0)
        path = [1.0] * len(requests)
        forwards = 0
        while active:
            forwards += 1
            scheduled = [ScheduledRequest(seq, seq.num_tokens - seq.num_computed_tokens) for _, seq in active]
            ids, pos, meta, rows = self.runner.prepare_inputs(scheduled)
            last, reduced = self._forward(ids, pos, meta, [row for _, row in rows], feats)  # [B, H], [B, K] | None
            tokens, q, top = self._pick(last, [requests[i] for i, _ in active],
                                        [drafts[i] for i, _ in active], reduced=reduced)
            nxt, feats = [], []
            for b, (i, seq) in enumerate(active):
                seq.num_computed_tokens = seq.num_tokens
                if not self._take(tokens, q, top, b, i, path, drafts, qs, requests):
                    continue
                if len(drafts[i]) < requests[i].k and self._goes_on(path[i]):
                    seq.prompt_token_ids.append(tokens[b])  # fed next step
                    nxt.append((i, seq))
                    if self.feeds_features:
                        feats.append(last[b: b + 1])  # ... with the predicted feature
            active = nxt
        probs = [torch.stack(q) if q else None for q in qs]
        return Proposals(drafts, probs if any(p is not None for p in probs) else None, num_forwards=forwards,
                         max_catchup=catchup)

    def _forward(self, ids: Tensor, pos: Tensor, meta, picked: list[int], feats: list[Tensor]
                 ) -> tuple[Tensor, Tensor | None]:
        """One draft forward -> (the hidden states of rows `picked` [B, H], their logits over vocab_ids [B, K] when
        the forward computes them, else None). `feats`: per request fed, the features of its tokens [n, H], for a
        draft that `feeds_features` (empty otherwise)."""
        hidden = self.model(ids, pos, meta, self.runner.kv_caches)  # [T, H]
        return hidden[torch.tensor(picked, device=hidden.device)], None

    def _take(self, tokens: list[int], q: Tensor | None, top: list[float] | None, b: int, i: int,
              path: list[float], drafts: list[list[int]], qs: list[list[Tensor]],
              requests: list[ProposalRequest]) -> bool:
        """Append row b's token to request i's draft unless the path gate ends the chain before it (False).

        The gate (min_path_confidence, EAGLE-2's path score): the product of the draft's top probability at every
        position of the chain so far, this one included, must stay >= the threshold; the chain's first token is
        held to min_first_confidence instead when that is set. It reads the top probability, not the sampled
        token's, so whether a position is proposed depends only on the context before it and rejection sampling
        stays exact for temperature > 0."""
        if top is not None:
            path[i] *= top[b]
            gate = self.min_path_confidence
            if not drafts[i] and self.min_first_confidence is not None:
                gate = self.min_first_confidence
            if gate is not None and path[i] < gate:
                return False
        drafts[i].append(tokens[b])
        if q is not None and not is_greedy(requests[i].params):
            qs[i].append(q[b])
        return True

    def _pick(self, last: Tensor, reqs: list[ProposalRequest], drafts: list[list[int]], reduced: Tensor | None = None
              ) -> tuple[list[int], Tensor | None, list[float] | None]:
        """One draft token per row of `last` [B, H]: (tokens, q of the sampled rows or None, the draft's top
        probability per row when a confidence gate is set else None). Greedy rows read it from the draft's raw
        distribution. All-greedy batches take the argmax over the reduced head and never build a full-vocabulary
        row. `reduced`: the rows' logits over vocab_ids when the forward computed them already."""
        want_top = self.min_path_confidence is not None or self.min_first_confidence is not None
        if all(plain_greedy(r.params) for r in reqs):
            if not want_top:
                return self._greedy(last, reduced), None, None
            if self.vocab_ids is None:
                p, best = self._logits(last).softmax(-1).max(-1)
                tokens = best.tolist()
            else:
                p, best = self._reduced(last, reduced).softmax(-1).max(-1)
                tokens = self.vocab_ids[best].tolist()
            return tokens, None, p.tolist()
        logits = self._logits(last, reduced)
        tokens, q = self._choose(logits, reqs, drafts)
        if not want_top:
            return tokens, q, None
        raw = logits.softmax(-1).max(-1).values.tolist()  # a greedy row's q is one-hot: its confidence is raw
        return tokens, q, [raw[b] if is_greedy(r.params) else float(q[b].max()) for b, r in enumerate(reqs)]

    def _goes_on(self, path: float) -> bool:
        """Whether a chain that just took a token runs another draft forward: its path score still reaches
        min_path_confidence (the next position's can only be lower; below it after a first token let through by
        min_first_confidence, the forward would be wasted)."""
        return self.min_path_confidence is None or path >= self.min_path_confidence

    def _reduced_logits(self, hidden: Tensor) -> Tensor:
        """hidden [B, H] -> logits [B, K] over vocab_ids (self.head set). The K x H head goes through the runtime's
        fp32 kernel (AVX2 GEMV on CPU: faster than torch's matmul for these 1-16 rows; the head is ~40% of a 2-layer
        draft's bytes per forward)."""
        if self._head_linear is None:
            from accel.kernels.linear import PackedLinear

            lin = nn.Linear(self.head.shape[1], self.head.shape[0], bias=False, device=self.head.device)
            lin.weight = nn.Parameter(self.head, requires_grad=False)
            try:
                self._head_linear = PackedLinear(lin)
            except (ValueError, RuntimeError):  # not an fp32 CPU head: plain matmul
                self._head_linear = lin
        return self._head_linear(hidden.float() if hidden.dtype != self.head.dtype else hidden).float()

    def _reduced(self, hidden: Tensor, reduced: Tensor | None) -> Tensor:
        return self._reduced_logits(hidden) if reduced is None else reduced

    def _greedy(self, hidden: Tensor, reduced: Tensor | None = None) -> list[int]:
        if self.vocab_ids is None:
            return self._logits(hidden).argmax(-1).tolist()
        return self.vocab_ids[self._reduced(hidden, reduced).argmax(-1)].tolist()

    def _logits(self, hidden: Tensor, reduced: Tensor | None = None) -> Tensor:
        """hidden [B, H] -> logits [B, V] float32 over the full target vocabulary (-inf outside vocab_ids)."""
        if self.vocab_ids is None:
            logits = self.model.compute_logits(hidden)
            return logits + self._mask if hasattr(self, "_mask") else logits
        out = torch.full((hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device)
        out[:, self.vocab_ids] = self._reduced(hidden, reduced)  # [B, K]
        return out

    def _choose(self, logits: Tensor, reqs: list[ProposalRequest], drafts: list[list[int]]
                ) -> tuple[list[int], Tensor | None]:
        """One draft token per row: a draw from the target's processing of the draft logits (greedy rows: argmax)."""
        params = [r.params or _GREEDY for r in reqs]
        prompts, outputs = [], []
        for r, d in zip(reqs, drafts):
            n = len(r.token_ids) if r.num_prompt_tokens is None else r.num_prompt_tokens
            prompts.append(list(r.token_ids[:n]))
            outputs.append(list(r.token_ids[n:]) + d)
        q = self.sampler.probs(logits, params, prompts, outputs)  # [B, V]; greedy rows one-hot
        tokens = []
        for b, r in enumerate(reqs):
            if is_greedy(r.params):
                tokens.append(int(q[b].argmax()))
            else:
                e = torch.empty_like(q[b]).exponential_(generator=r.generator).clamp_min_(1e-20)
                tokens.append(int((q[b] / e).argmax()))
        return tokens, q


def _head_weight(model: CausalLM) -> Tensor | None:
    """The float [V, H] head matrix (the embedding when tied), or None when the head is quantized."""
    if model.tie_word_embeddings:
        return model.model.embed_tokens.weight
    return model.lm_head.weight if isinstance(model.lm_head, nn.Linear) else None
