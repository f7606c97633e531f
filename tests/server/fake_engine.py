"""A small deterministic stand-in for accel.runtime.engine.Engine (same interface, no model).

Tokens are characters (id = code point). Each step, every running request gets the next character of
`reply` (cycling); a request holds ceil((prompt + max_tokens) / block_size) KV blocks from admission to finish,
so tests can count blocks. Knobs: `step_delay` (seconds per step), `max_num_seqs`, `max_waiting`,
`num_blocks`; a prompt containing "BOOM" makes step() raise while it runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from accel.runtime.engine import EngineStats, RequestOutput
from accel.runtime.scheduler import QueueFullError
from accel.runtime.sequence import RequestMetrics
from accel.speculative.stats import SpecDecodeStats

EOS = 0


class CharTokenizer:
    """encode = code points; the chat template writes `<role>content` per message then `<assistant>`."""

    eos_token_id = EOS
    chat_template = "<role>content ... <assistant>"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i != EOS)

    def get_vocab(self) -> dict[str, int]:
        return {chr(i): i for i in range(1, 256)}

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=True) -> str:
        if any("REJECT" in m["content"] for m in messages):
            raise ValueError("this template rejects the word REJECT")
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


@dataclass
class FakeKV:
    num_blocks: int
    held: dict[str, int] = field(default_factory=dict)
    num_queried_tokens: int = 0
    num_hit_tokens: int = 0

    def num_held_blocks(self) -> int:
        return sum(self.held.values())

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - self.num_held_blocks()


@dataclass
class _Req:
    request_id: str
    prompt: list[int]
    params: object
    priority: int
    metrics: RequestMetrics
    out: list[int] = field(default_factory=list)
    reported_chars: int = 0


def _spec(num_output_tokens: int) -> SpecDecodeStats:
    """Made-up counters: one 2-token draft per output token, first position always accepted, second never."""
    n = num_output_tokens
    return SpecDecodeStats(num_drafts=n, num_draft_tokens=2 * n, num_accepted_tokens=n, num_accepted_tokens_per_pos=[n, 0])


class FakeEngine:
    def __init__(self, reply: str = "Hello world", step_delay: float = 0.0, max_num_seqs: int = 8,
                 max_waiting: int = 1000, num_blocks: int = 1000, block_size: int = 4, max_model_len: int = 128,
                 vocab_size: int = 0x3000, speculate: bool = False) -> None:
        self.tokenizer = CharTokenizer()
        self.reply = [ord(c) for c in reply]
        self.step_delay = step_delay
        self.max_num_seqs = max_num_seqs
        self.max_waiting = max_waiting
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.speculate = speculate  # attach made-up spec-decode counters to outputs (see _spec)
        self.kv = FakeKV(num_blocks)
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.added: list[tuple[str, int]] = []  # (request id, priority) in order of add_request
        self.aborted: list[str] = []
        self.num_steps = 0

    def add_request(self, prompt, params, request_id=None, priority=0) -> str:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are invalid; allowed: integers in [0, {self.vocab_size})")
        params.check_vocab(self.vocab_size)
        if len(self.waiting) >= self.max_waiting:
            raise QueueFullError(f"request {request_id!r} rejected: the waiting queue is full")
        self.waiting.append(_Req(request_id, ids, params, priority, RequestMetrics(time.monotonic())))
        self.added.append((request_id, priority))
        return request_id

    def _blocks_for(self, r: _Req) -> int:
        return -(-(len(r.prompt) + r.params.max_tokens) // self.block_size)

    def abort(self, request_id: str) -> bool:
        for q in (self.waiting, self.running):
            for r in q:
                if r.request_id == request_id:
                    q.remove(r)
                    self.kv.held.pop(request_id, None)
                    self.aborted.append(request_id)
                    return True
        return False

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> list[RequestOutput]:
        self.num_steps += 1
        if self.step_delay:
            time.sleep(self.step_delay)
        now = time.monotonic()
        for r in sorted(self.waiting, key=lambda r: r.priority):
            need = self._blocks_for(r)
            if len(self.running) < self.max_num_seqs and need <= self.kv.num_free_blocks:
                self.waiting.remove(r)
                self.running.append(r)
                self.kv.held[r.request_id] = need
                self.kv.num_queried_tokens += len(r.prompt)
                r.metrics.first_scheduled_time = now
        if any(ord("B") in r.prompt and "BOOM" in self.tokenizer.decode(r.prompt) for r in self.running):
            raise RuntimeError("BOOM in a prompt")
        outputs = []
        for r in list(self.running):
            token = self.reply[len(r.out) % len(self.reply)]
            r.out.append(token)
            r.metrics.token_times.append(now)
            if r.metrics.first_token_time is None:
                r.metrics.first_token_time = now
            outputs.append(self._output(r, token))
        return outputs

    def _output(self, r: _Req, token: int) -> RequestOutput:
        text = self.tokenizer.decode(r.out)
        reason, stop_reason = None, None
        for s in r.params.stop:
            if s in text:
                text, reason, stop_reason = text[:text.index(s)], "stop", s
                break
        if reason is None and token == EOS and not r.params.ignore_eos:
            reason = "stop"
        if reason is None and len(r.out) >= r.params.max_tokens:
            reason = "length"
        if reason is not None:
            self.running.remove(r)
            self.kv.held.pop(r.request_id, None)
            r.metrics.finished_time = time.monotonic()
        # like the real detokenizer, hold back what could be the start of a stop string until it is decided
        holdback = 0 if reason else max((len(s) for s in r.params.stop), default=1) - 1
        end = max(len(text) - holdback, r.reported_chars)
        delta = text[r.reported_chars:end]
        r.reported_chars = end
        out = RequestOutput(request_id=r.request_id, prompt_token_ids=r.prompt, new_token_ids=[token],
                            text_delta=delta, token_ids=list(r.out), text=text, finished=reason is not None,
                            finish_reason=reason, stop_reason=stop_reason, metrics=r.metrics)
        k = r.params.logprobs
        if k is not None:  # a made-up distribution: the token itself at -1, then its neighbours
            out.logprobs = [-1.0] * len(r.out)
            out.top_logprobs = [[(t + j, -1.0 - j) for j in range(k)] for t in r.out] if k else None
        if r.params.prompt_logprobs is not None:
            out.prompt_logprobs = [None] + [-2.0] * (len(r.prompt) - 1)
            out.prompt_top_logprobs = [None] + [[(t, -2.0)] for t in r.prompt[1:]] if r.params.prompt_logprobs \
                else None
        if self.speculate:
            out.spec_decode = _spec(len(r.out))
        return out

    def stats(self) -> EngineStats:
        return EngineStats(num_running=len(self.running), num_waiting=len(self.waiting),
                           kv_cache_usage=self.kv.num_held_blocks() / self.kv.num_blocks,
                           num_kv_blocks=self.kv.num_blocks, prefix_cache_hit_rate=0.0, num_preemptions=0,
                           num_steps=self.num_steps)
