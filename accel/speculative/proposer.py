"""Proposers behind one interface: given each request's verified tokens, propose up to k draft tokens.

    proposer.propose([ProposalRequest(token_ids, k, request_id, ...)]) -> Proposals(token_ids, probs)

`probs` is the distribution each draft token was drawn from (q for the rejection sampler) when the proposer
has one (a draft model), None otherwise (n-gram lookup: q is the one-hot of the token). Stateful proposers
keep per-request state keyed by request_id; call `finish(request_id)` when a request ends.

DraftModelProposer runs an HF folder with its own KV cache per request (HF DynamicCache, cropped back to the
verified prefix after rejections) at batch 1 per request. It is meant for small batches, where speculation
pays; the runtime disables speculation for large batches anyway. A draft folder may carry `accel_draft.json`
with `vocab_ids`: the target ids its head may propose (a reduced vocabulary makes the head, the dominant
cost of a small draft, proportionally cheaper; the folder itself stays a standard LlamaForCausalLM).
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from accel.runtime.sampler import is_greedy, plain_greedy
from accel.speculative.ngram import NgramIndex
from accel.speculative.tokenizer_check import check_tokenizers_match

log = logging.getLogger("accel.engine")

DRAFT_META_FILE = "accel_draft.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "vocab.json", "merges.txt")


@dataclass
class ProposalRequest:
    """One request's input to a proposer.

    token_ids          prompt + verified output tokens (never unverified drafts).
    k                  how many draft tokens to propose at most (0: none).
    request_id         key of per-request state in stateful proposers.
    num_prompt_tokens  where the prompt ends in token_ids (penalties treat prompt and output differently).
    params             the request's SamplingParams (None: greedy); a draft model samples with the same
                       processing as the target (accel.runtime.sampler.Sampler.probs).
    generator          the request's generator for seeded sampling (None: the global RNG).
    block_table        the target's KV block ids for the request, of its KV group 0 (an EAGLE draft reads the
                       target's features of verified positions by slot; other proposers ignore it).
    guess              where nothing better matches, a one-token guess is welcome (the engine asks where the
                       extra verify row costs nothing: see `Proposer.free`); n-gram lookup guesses, others ignore it.
    """

    token_ids: list[int]
    k: int
    request_id: str = ""
    num_prompt_tokens: int | None = None
    params: object | None = None
    generator: torch.Generator | None = None
    block_table: list[int] | None = None
    guess: bool = False


@dataclass
class Proposals:
    """token_ids[i]: the drafts for request i (0..k_i tokens). probs[i]: [len(token_ids[i]), V] q, or None.

    num_forwards  sequential draft-model forwards this call ran (chains may end early; 0: no model ran).
    max_catchup   the longest span a request fed its first forward: a request's first draft (or one after a
                  pause) prefills its context, a one-time cost the engine keeps out of the per-forward cost.
    sources       per request, which proposer drafted it ("ngram", "draft", None: nothing), where several do.
    guesses       per request, True where the draft is a one-token guess (`ProposalRequest.guess`): verified like
                  any draft, but no evidence of how well the proposer does on the request (None: no guesses).
    """

    token_ids: list[list[int]]
    probs: list[Tensor] | None = None
    num_forwards: int = 0
    max_catchup: int = 0
    sources: list[str | None] | None = None
    guesses: list[bool] | None = None


class Proposer(ABC):
    # True for a proposer whose proposals cost nothing next to a target step (n-gram lookup): the engine then asks
    # it for a draft, or a guess, wherever the extra verify row is free, whatever the adaptive length says
    free: bool = False

    @abstractmethod
    def propose(self, requests: list[ProposalRequest]) -> Proposals:
        """Draft tokens for each request (same order)."""

    def finish(self, request_id: str) -> None:
        """Forget a finished request's state (no-op for stateless proposers)."""


class NgramProposer(Proposer):
    """Prompt lookup (see accel.speculative.ngram); model-free. Keeps an `NgramIndex` per request id (a request
    without an id is looked up from scratch)."""

    free = True

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram min_n={min_n}, max_n={max_n} are invalid; allowed: 1 <= min_n <= max_n")
        self.min_n, self.max_n = min_n, max_n
        self._index: dict[str, NgramIndex] = {}

    def propose(self, requests: list[ProposalRequest]) -> Proposals:
        found = [self._lookup(r) for r in requests]
        guesses = [g for _, g in found]
        return Proposals([t for t, _ in found], probs=None, guesses=guesses if any(guesses) else None)

    def _lookup(self, r: ProposalRequest) -> tuple[list[int], bool]:
        """(drafts, whether they are a guess). Without a match of min_n tokens, a request that welcomes a guess
        gets `NgramIndex.guess`: one token, as its acceptance is low (measured on input-grounded prompts: 25% where
        only the last token matched, against 53% for a 2-token match's continuation)."""
        if not r.request_id:
            index = NgramIndex(self.min_n, self.max_n)  # no per-request state: index from scratch
        else:
            index = self._index.get(r.request_id)
            if index is None:
                index = self._index[r.request_id] = NgramIndex(self.min_n, self.max_n)
        tokens = index.propose(r.token_ids, r.k)
        if tokens or not r.guess or r.k == 0:
            return tokens, False
        g = index.guess(r.token_ids)
        return ([], False) if g is None else ([g], True)

    def finish(self, request_id: str) -> None:
        self._index.pop(request_id, None)


class NgramFirstProposer(Proposer):
    """Prompt lookup first, a draft model for the rest: each step, a request whose suffix n-gram occurs earlier in
    its context takes the lookup's continuation (free to propose, long when the reply copies from the prompt);
    only the others run the draft model (suffix decoding's fallback to a model draft, as in Snowflake's Arctic
    Inference). Both kinds ride in one verification: lookup drafts with a one-hot q, the model's with its own.

    Exact for sampling too: which proposer serves a request depends only on its verified tokens, never on a random
    draw, so each draft is still a proposal conditioned on the context that rejection sampling corrects. A request
    the draft model skipped catches up on the tokens it missed at its next model draft (stateful drafts roll back
    to their common prefix with the verified tokens, like after a rejection).
    """

    def __init__(self, ngram: NgramProposer, draft: Proposer) -> None:
        self.ngram, self.draft = ngram, draft

    @property
    def model(self):
        """The draft model (benchmarks read it to tell a model proposer from a model-free one)."""
        return self.draft.model

    def propose(self, requests: list[ProposalRequest]) -> Proposals:
        looked = self.ngram.propose(requests).token_ids
        rest = [i for i, r in enumerate(requests) if r.k > 0 and not looked[i]]
        tokens: list[list[int]] = list(looked)
        probs: list[Tensor | None] = [None] * len(requests)
        sources: list[str | None] = ["ngram" if t else None for t in looked]
        sub = Proposals([])
        if rest:
            sub = self.draft.propose([requests[i] for i in rest])
            for j, i in enumerate(rest):
                tokens[i] = sub.token_ids[j]
                probs[i] = None if sub.probs is None else sub.probs[j]
                sources[i] = "draft" if tokens[i] else None
        return Proposals(tokens, probs if any(p is not None for p in probs) else None, num_forwards=sub.num_forwards,
                         max_catchup=sub.max_catchup, sources=sources)

    def finish(self, request_id: str) -> None:
        self.ngram.finish(request_id)
        self.draft.finish(request_id)


@dataclass
class _DraftState:
    cache: object  # transformers DynamicCache
    token_ids: list[int]  # tokens whose K/V the cache holds


def load_draft_vocab_ids(draft_dir: str | Path) -> list[int] | None:
    """The reduced vocabulary of a draft folder (accel_draft.json `vocab_ids`), or None when it has none."""
    meta = Path(draft_dir) / DRAFT_META_FILE
    if not meta.exists():
        return None
    ids = json.loads(meta.read_text()).get("vocab_ids")
    return None if ids is None else [int(i) for i in ids]


class DraftModelProposer(Proposer):
    """A small causal LM sharing the target's tokenizer proposes k tokens autoregressively.

    draft: an HF folder (loaded with transformers) or an already loaded model (tests).
    target_dir: when given, the draft folder's tokenizer must match it (TokenizerMismatchError otherwise).
    vocab_ids: target ids the draft may propose (default: the folder's accel_draft.json, else all).
    """

    def __init__(self, draft: str | Path | torch.nn.Module, target_dir: str | Path | None = None,
                 vocab_ids: list[int] | None = None, dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoModelForCausalLM

        if isinstance(draft, (str, Path)):
            if target_dir is not None:
                check_tokenizers_match(target_dir, draft)
            if vocab_ids is None:
                vocab_ids = load_draft_vocab_ids(draft)
            draft = AutoModelForCausalLM.from_pretrained(str(draft), dtype=dtype)
        self.model = draft.eval()
        self.vocab_size = int(self.model.config.vocab_size)
        head = self.model.get_output_embeddings().weight.detach()  # [V, H]
        if vocab_ids is not None:
            bad = [i for i in vocab_ids if not 0 <= i < self.vocab_size]
            if bad or not vocab_ids:
                raise ValueError(f"draft vocab_ids must be a non-empty list of ids in [0, {self.vocab_size}); "
                                 f"got {len(vocab_ids)} ids, out of range: {bad[:5]}")
            self.vocab_ids = torch.tensor(vocab_ids, dtype=torch.long)  # [K]
            self.head = head[self.vocab_ids].contiguous()  # [K, H]: only these rows are ever computed
        else:
            self.vocab_ids, self.head = None, head
        self.states: dict[str, _DraftState] = {}

    def finish(self, request_id: str) -> None:
        self.states.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, requests: list[ProposalRequest]) -> Proposals:
        tokens, probs = [], []
        for r in requests:
            ids, q = self._propose_one(r)
            tokens.append(ids)
            probs.append(q)
        return Proposals(tokens, probs)

    def full_logits(self, reduced: Tensor) -> Tensor:
        """Head logits [.., K] -> [.., V] with -inf outside the draft vocabulary (identity without one)."""
        if self.vocab_ids is None:
            return reduced
        out = torch.full((*reduced.shape[:-1], self.vocab_size), float("-inf"), dtype=reduced.dtype)
        out[..., self.vocab_ids] = reduced
        return out

    def _forward(self, state: _DraftState, new_ids: list[int]) -> Tensor:
        """Feed new tokens through the draft, extending its cache; logits of the last one: [V] (full ids)."""
        inp = torch.tensor([new_ids], dtype=torch.long)  # [1, S]
        hidden = self.model.model(input_ids=inp, past_key_values=state.cache, use_cache=True).last_hidden_state
        state.token_ids = state.token_ids + new_ids
        return self.full_logits(hidden[0, -1] @ self.head.T)  # [V]

    def _state_for(self, r: ProposalRequest) -> tuple[_DraftState, list[int]]:
        """The request's cache cropped to its longest verified prefix, and the tokens still to feed (>= 1)."""
        from transformers import DynamicCache

        state = self.states.get(r.request_id)
        if state is None:
            state = self.states[r.request_id] = _DraftState(DynamicCache(), [])
        keep = 0
        limit = min(len(state.token_ids), len(r.token_ids) - 1)  # always re-feed the last token for its logits
        while keep < limit and state.token_ids[keep] == r.token_ids[keep]:
            keep += 1
        if keep < len(state.token_ids):  # rejected drafts (or a different request): roll the cache back
            state.cache.crop(keep - len(state.token_ids))  # negative: number of positions to drop
            state.token_ids = state.token_ids[:keep]
        return state, list(r.token_ids[keep:])

    def _propose_one(self, r: ProposalRequest) -> tuple[list[int], Tensor]:
        if r.k < 0:
            raise ValueError(f"k={r.k} is invalid for request {r.request_id!r}; allowed: >= 0")
        if not r.token_ids:
            raise ValueError(f"request {r.request_id!r} has no tokens; a draft needs at least one")
        if r.k == 0:
            return [], torch.empty(0, self.vocab_size)
        state, feed = self._state_for(r)
        drafts: list[int] = []
        qs: list[Tensor] = []
        logits = self._forward(state, feed)
        for step in range(r.k):
            q = self._dist(logits, r, drafts)  # [V]
            tok = int(q.argmax()) if is_greedy(r.params) else _draw(q, r.generator)
            drafts.append(tok)
            qs.append(q)
            if step + 1 < r.k:
                logits = self._forward(state, [tok])
        return drafts, torch.stack(qs)

    def _dist(self, logits: Tensor, r: ProposalRequest, drafts: list[int]) -> Tensor:
        """q for one position: the target's sampling processing applied to the draft's logits."""
        if plain_greedy(r.params):
            return torch.zeros_like(logits).scatter_(0, logits.argmax().view(1), 1.0)
        from accel.runtime.sampler import Sampler

        n_prompt = len(r.token_ids) if r.num_prompt_tokens is None else r.num_prompt_tokens
        prompt, output = r.token_ids[:n_prompt], r.token_ids[n_prompt:] + drafts
        return Sampler().probs(logits[None].float(), [r.params], [prompt], [output])[0]




def _draw(q: Tensor, generator: torch.Generator | None) -> int:
    """One index from q [V] by the exponential race (as the runtime sampler does)."""
    e = torch.empty_like(q).exponential_(generator=generator).clamp_min_(1e-20)
    return int((q / e).argmax())


def propose_contained(proposer: Proposer, reqs: list[ProposalRequest]) -> tuple[Proposals, list[str]]:
    """The proposer's drafts, and the requests it cannot draft for. When it raises, each request is proposed for
    alone; those that still fail get no draft (and are returned, to decode without drafts from then on: drafts only
    ever save time, the output is the same)."""
    try:
        return proposer.propose(reqs), []
    except Exception:  # noqa: BLE001
        log.exception("the proposer failed; proposing for each request alone")
    token_ids: list[list[int]] = []
    probs: list = []
    sources: list[str | None] = []
    guesses: list[bool] = []
    failed: list[str] = []
    for r in reqs:
        try:
            one = proposer.propose([r])
            token_ids.append(list(one.token_ids[0]))
            probs.append(None if one.probs is None else one.probs[0])
            sources.append((one.sources or [None])[0])
            guesses.append((one.guesses or [False])[0])
        except Exception:  # noqa: BLE001
            log.exception("the proposer failed for request %s; it decodes without drafts", r.request_id)
            failed.append(r.request_id)
            proposer.finish(r.request_id)
            token_ids.append([])
            probs.append(None)
            sources.append(None)
            guesses.append(False)
    return Proposals(token_ids, probs if any(q is not None for q in probs) else None, sources=sources,
                     guesses=guesses if any(guesses) else None), failed
