"""Turns a SchedulerOutput into flat tensors, runs the model over the paged KV cache, chooses the tokens.

Owns the KV tensors, the feature cache and one torch.Generator per seeded request. Its jobs live beside it:
`token_choice` (sampling, draft verification), `native_steps` (bursts of steps in one native call),
`host_swap` (preempted requests' K/V in host memory).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import Tensor

from accel.runtime.config import RuntimeConfig
from accel.runtime.attention import AttentionMetadata, DecodeGroup, PagedKVCache, PrefillSpan
from accel.runtime.models import CausalLM, longs
from accel.runtime.outputs import ModelRunnerOutput, ScheduledRequest, SchedulerOutput, SpecBurst
from accel.runtime.host_swap import HostSwap
from accel.runtime.native_steps import decode_steps, native_inputs, spec_steps
from accel.runtime.row_processors import PROCESSORS, Step, StepContext, StepRows
from accel.runtime.sampler import Sampler, plain_greedy
from accel.runtime.sequence import Sequence

log = logging.getLogger("accel.engine")


_NO_MASK = torch.empty(0, dtype=torch.bool)  # the paged decode kernel takes context lengths, not a mask

# Longest span (tokens of one request in a step) sent through the paged decode kernel as per-token decode rows;
# each row re-reads its context, so longer prefill chunks stay on the SDPA path (one pass over the context).
SPAN_AS_DECODE_MAX_TOKENS = 16


def kv_bytes_per_block(model: CausalLM, block_size: int, kv_cache_dtype: str, dtype: torch.dtype) -> int:
    """Bytes of K + V for one block of one KV group (`KVLayout`: all layers unless windows differ between them;
    int8 adds one fp32 scale per token and head)."""
    per_token_head = model.head_dim * (1 if kv_cache_dtype == "int8" else dtype.itemsize)
    if kv_cache_dtype == "int8":
        per_token_head += 4
    return 2 * model.kv_layout.num_tensors * block_size * model.num_kv_heads * per_token_head


@dataclass
class RunnerConfig:
    """What the model runner reads: the runtime's settings (block size, KV dtype: `RuntimeConfig`, held, never
    copied) and the pool's size in blocks."""

    num_blocks: int
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    decode_group_ratio: float = 1.5
    """A request joins the current decode group while its context is at most this factor of the group's shortest
    (bounds the padding of batched decode attention)."""


class ModelRunner:
    def __init__(self, model: CausalLM, config: RunnerConfig, sampler: Sampler | None = None) -> None:
        self.model = model
        self.config = config
        self.sampler = sampler or Sampler()
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        kv_dtype = torch.int8 if config.runtime.kv_cache_dtype == "int8" else self.dtype
        layout = model.kv_layout
        self.num_kv_groups = layout.num_groups
        tensors = PagedKVCache.allocate(layout.num_tensors, config.num_blocks, config.runtime.block_size,
                                        model.num_kv_heads, model.head_dim, kv_dtype, self.device, self.dtype)
        # one cache per layer: its group's view of the tensor it shares with the same place in other groups
        self.kv_caches = [tensors[t] if layout.num_groups == 1 else tensors[t].for_group(g)
                          for g, t in zip(layout.layer_group, layout.layer_tensor)]
        self._generators: dict[str, torch.Generator] = {}
        self._matchers: dict = {}  # request id -> its grammar (`structured.Matcher`)
        from accel.kernels import cpu

        self._paged_decode_kernel = (self.device.type == "cpu" and kv_dtype == torch.float32
                                     and cpu.available())
        self.host = HostSwap()  # preempted requests' K/V (and features) in host memory
        # the final hidden state of every computed position, one row per KV slot (an EAGLE draft reads the
        # verified ones by block table); None until a proposer asks for it (enable_feature_cache)
        self.feature_cache: Tensor | None = None
        # called with (scheduled requests, hidden [T, H]) after every forward (teacher data for draft training)
        self.hidden_hook = None

    # ---- per-request state -----------------------------------------------------------------------------
    def add_request(self, seq: Sequence, matcher=None) -> None:
        """Set up a new request's state (its seeded generator, its grammar's `structured.Matcher`), so a failure
        is the caller's, before any step."""
        self._generator(seq)
        if matcher is not None:
            self._matchers[seq.request_id] = matcher

    def structured_done(self, request_id: str) -> bool:
        """Whether the request's grammar has ended (nothing may follow its stop token)."""
        m = self._matchers.get(request_id)
        return m is not None and m.done

    def _generator(self, seq: Sequence) -> torch.Generator | None:
        if seq.params.seed is None:
            return None
        g = self._generators.get(seq.request_id)
        if g is None:
            g = torch.Generator(device=self.device)
            g.manual_seed(seq.params.seed)
            self._generators[seq.request_id] = g
        return g

    @property
    def _context(self) -> StepContext:
        """What this step's row processors read (built per step: a test or a proposer may swap any of it)."""
        return StepContext(self.sampler, self._generators, self._generator, self._matchers, self.feature_cache,
                           self.hidden_hook)

    def enable_feature_cache(self) -> None:
        """Keep the final hidden state of every computed position next to its K/V (hidden_size values per slot:
        ~5% of the K/V bytes of a 30-layer model; allocated on top of the KV budget)."""
        if self.feature_cache is None:
            n = self.config.num_blocks * self.config.runtime.block_size
            self.feature_cache = torch.zeros(n, self.model.config.hidden_size, dtype=self.dtype, device=self.device)

    def release(self, request_id: str) -> None:
        """Forget a finished request's generator and any K/V it had swapped out."""
        self._generators.pop(request_id, None)
        self._matchers.pop(request_id, None)
        self.host.release(request_id)

    def swap(self, swap_out: dict[str, list[int]], swap_in: dict[str, list[int]]) -> None:
        """Copy preempted requests' blocks to host memory, and resumed ones back (`HostSwap`)."""
        self.host.swap(swap_out, swap_in, self.kv_caches, self.feature_cache, self.config.num_blocks,
                       self.config.runtime.block_size, self.device)

    # ---- one step --------------------------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, draft_probs: dict[str, Tensor | None] | None = None,
                burst: SpecBurst | None = None) -> ModelRunnerOutput:
        """Run one step: plan the logit rows, forward, then the row processors (`row_processors.PROCESSORS`).
        draft_probs[request id] is the distribution q [num drafts, V] each draft token was drawn from (None/missing:
        one-hot, n-gram). With `burst` and lookahead slots (`sched.num_steps` > 1), the burst's verify steps run in
        one native call instead."""
        if sched.swap_out or sched.swap_in:
            self.swap(sched.swap_out, sched.swap_in)
        if sched.num_steps > 1:  # lookahead slots: only where `max_decode_steps` allowed a burst
            native = self._native_decode(features=True)
            if burst is not None:
                return spec_steps(native, sched, burst, self.kv_caches, self.feature_cache)
            return decode_steps(native, sched, self.kv_caches, self.config.runtime.block_size, self.feature_cache)
        native = self._native_step(sched.scheduled)
        slot_mapping = None
        if native is not None:
            step_inputs, sample_rows = native_inputs(sched.scheduled, self.config.runtime.block_size)
            rows = StepRows.plan(sched.scheduled, sample_rows)
            hidden, logits, argmax = native.step(self.kv_caches, *step_inputs, rows.logit_rows)
        else:
            input_ids, positions, meta, sample_rows = self.prepare_inputs(sched.scheduled)
            rows = StepRows.plan(sched.scheduled, sample_rows)
            hidden, logits, argmax = self.model.forward_logits(input_ids, positions, meta, self.kv_caches,
                                                               rows.logit_rows)
            slot_mapping = meta.slot_mapping
        step = Step(sched.scheduled, rows, hidden, logits, argmax, slot_mapping, self._context, draft_probs or {})
        for process in PROCESSORS:
            process(step)
        return step.output()

    def max_decode_steps(self, running: list[Sequence], num_steps: int, max_model_len: int) -> int:
        """How many decode steps in a row (`SchedulerOutput.num_steps`) the running batch may take: 1 unless the
        native step runs it and every request is a plain greedy decode row past min_tokens, without logprobs; then
        num_steps capped by each request's max_tokens and the model length (a burst never overshoots a length)."""
        native = self._native_decode(features=True)
        if num_steps <= 1 or not running or native is None or len(running) > native.MAX_ROWS:
            return 1
        for seq in running:
            p = seq.params
            if (seq.num_tokens - seq.num_computed_tokens != 1 or not plain_greedy(p) or p.logprobs is not None
                    or seq.num_output_tokens < p.min_tokens or seq.spec_token_ids):
                return 1
            num_steps = min(num_steps, p.max_tokens - seq.num_output_tokens, max_model_len - seq.num_tokens)
        return max(1, num_steps)

    def generator_for(self, seq: Sequence) -> torch.Generator | None:
        """The request's generator (seeded requests), shared with the proposer so draws stay per request."""
        return self._generator(seq)

    def _native_decode(self, features: bool = False):
        """The model's native decode where it can take steps from lists (head and tables set, fp32 paged cache)
        and nothing reads the step's tensors afterwards (a hidden hook; the feature cache too, unless `features`:
        bursts of decode steps fill it themselves); else None."""
        native = getattr(self.model, "native_decode", None)
        if (native is None or not native.has_head or not native.has_tables or not self._paged_decode_kernel
                or self.hidden_hook is not None or (self.feature_cache is not None and not features)):
            return None
        if self.feature_cache is not None and self.feature_cache.dtype != torch.float32:
            return None
        return native

    def _native_step(self, scheduled: list[ScheduledRequest]):
        """`_native_decode` where it takes this step (`native_inputs`): every request's rows on the paged decode
        kernel (decode rows, short spans), at most its MAX_ROWS rows; else None."""
        native = self._native_decode()
        if native is None:
            return None
        rows = 0
        for r in scheduled:
            if r.num_tokens > SPAN_AS_DECODE_MAX_TOKENS:
                return None
            rows += r.num_tokens
        return native if rows <= native.MAX_ROWS else None

    def prepare_inputs(self, scheduled: list[ScheduledRequest]
                       ) -> tuple[Tensor, Tensor, AttentionMetadata, list[tuple[int, int]]]:
        """Flat input_ids/positions [T], attention metadata, and (scheduled index, flat row) of sampling rows.

        The per-token arrays are built as Python lists and become tensors in one call each: every small torch op
        costs dispatch and hands the GIL away (which the server's event loop then holds for up to a switch
        interval), and at batch 1 these microseconds of arithmetic are a visible share of a step."""
        bs = self.config.runtime.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[list[int]] = [[] for _ in range(self.num_kv_groups)]  # per KV group
        prefills: list[list[PrefillSpan]] = [[] for _ in range(self.num_kv_groups)]
        # (flat row, context_len, block tables), a request's rows adjacent
        decodes: list[tuple[int, int, list[list[int]]]] = []
        sample_rows: list[tuple[int, int]] = []
        for i, r in enumerate(scheduled):
            seq, n = r.seq, r.num_tokens
            start = seq.num_computed_tokens
            q_start, ctx = len(ids), start + n
            ids.extend(seq.token_slice(start, ctx))
            tables = seq.block_tables
            positions.extend(range(start, ctx))
            for g, bt in enumerate(tables):
                slots[g].extend(bt[p // bs] * bs + p % bs for p in range(start, ctx))
            if n == 1:
                decodes.append((q_start, ctx, tables))
            elif self._paged_decode_kernel and n <= SPAN_AS_DECODE_MAX_TOKENS:
                # a short span (speculative verify of k+1 tokens, a small prefill chunk): each of its tokens is a
                # decode row over its own causal context, so it rides the decode kernel with everything else
                # instead of a gather + masked SDPA call of its own. Its K/V are in the cache before attention.
                decodes.extend((q_start + j, start + j + 1, tables) for j in range(n))
            else:
                num_blocks = -(-ctx // bs)
                mask = None
                if start > 0:  # earlier context in the cache: bottom-right aligned causal mask
                    q_pos = torch.arange(start, ctx).unsqueeze(1)  # [q, 1]
                    mask = (torch.arange(ctx).unsqueeze(0) <= q_pos).to(self.device)  # [q, ctx]
                for g, bt in enumerate(tables):
                    blocks = torch.tensor(bt[:num_blocks], dtype=torch.long, device=self.device)
                    prefills[g].append(PrefillSpan(q_start, n, ctx, blocks, mask))
            if r.samples:
                sample_rows.append((i, q_start + n - 1))
        dev = self.device
        metas = [AttentionMetadata(slot_mapping=longs(slots[g], dev), prefills=prefills[g],
                                   decode_groups=self._decode_groups(decodes, g)) for g in range(self.num_kv_groups)]
        metas[0].groups = metas[1:]
        return longs(ids, dev), longs(positions, dev), metas[0], sample_rows

    def _decode_groups(self, decodes: list[tuple[int, int, list[list[int]]]], kv_group: int = 0) -> list[DecodeGroup]:
        """Batch decode rows of similar context length (sorted, split when padding would exceed the ratio), over
        KV group `kv_group`'s block tables.

        With accel's paged decode kernel: one group in request order, each request's rows one span (the
        kernel reads a request's blocks once for all its rows and balances spans over threads itself)."""
        if not decodes:
            return []
        bs = self.config.runtime.block_size
        if self._paged_decode_kernel:
            nb = -(-max(d[1] for d in decodes) // bs)
            rows, offsets = [], [0]
            for j, (_, ctx, tables) in enumerate(decodes):
                bt = tables[kv_group]
                rows.append(bt[:nb] + [0] * (nb - min(len(bt), nb)))
                if j and tables is not decodes[j - 1][2]:  # a new request (rows of one request share its tables)
                    offsets.append(j)
            offsets.append(len(decodes))
            return [DecodeGroup(token_idx=longs([d[0] for d in decodes]),
                                block_table=longs([b for r in rows for b in r]).view(len(rows), nb), mask=_NO_MASK,
                                context_lens=longs([d[1] for d in decodes]), spans=longs(offsets))]
        decodes = sorted(decodes, key=lambda d: d[1])
        ratio = self.config.decode_group_ratio
        groups: list[list[tuple[int, int, list[int]]]] = [[decodes[0]]]
        for d in decodes[1:]:
            if d[1] > groups[-1][0][1] * ratio + bs:
                groups.append([d])
            else:
                groups[-1].append(d)
        out = []
        for g in groups:
            nb = -(-g[-1][1] // bs)
            table = torch.zeros(len(g), nb, dtype=torch.long)
            for j, (_, _, tables) in enumerate(g):
                bt = tables[kv_group]
                m = min(len(bt), nb)
                table[j, :m] = torch.tensor(bt[:m], dtype=torch.long)
            ctx = torch.tensor([d[1] for d in g])  # [G]
            mask = torch.arange(nb * bs).unsqueeze(0) < ctx.unsqueeze(1)  # [G, L]
            out.append(DecodeGroup(token_idx=torch.tensor([d[0] for d in g], device=self.device),
                                   block_table=table.to(self.device), mask=mask[:, None, None, :].to(self.device)))
        return out

