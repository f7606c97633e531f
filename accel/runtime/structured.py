"""Structured outputs: a request's tokens constrained to a JSON schema (or any JSON) by a grammar engine.

xgrammar (chosen by measurement: llguidance 1.9 misread the byte-level tokenizer our GGUF conversion writes, "Ġ"
taken for its UTF-8 bytes; xgrammar reads both registry tokenizers, and fills a next-token mask in microseconds
on SmolLM2's 49k and Gemma 3's 262k vocabularies) compiles the grammar once per schema (cached)
and keeps one matcher per request. Before a constrained request's token is chosen, its matcher's mask sets the
disallowed logits to -inf (so greedy, sampling and logprobs all see the constrained distribution); the chosen
token then advances the matcher. Once the grammar is complete only a stop token is allowed, and a matcher that
has ended finishes its request.

Drafts of a constrained request are verified against the grammar (`mask_span`: each verify row masked by the
drafts before it), so a draft the grammar refuses is never emitted. Constrained requests take no multi-step bursts
(`sampler.plain_greedy` is False for them).
"""

from __future__ import annotations

import json

from torch import Tensor

from accel.runtime.sampling_params import StructuredOutput


_OBJECT_SCHEMA = json.dumps({"type": "object"})  # OpenAI's JSON mode: the reply is one JSON object


class GrammarCompiler:
    """Compiles `StructuredOutput`s for one tokenizer and vocabulary width (the model's logits), with a cache: the
    server compiles on its tokenizer thread before admission, so the engine's own compile is a cache hit."""

    def __init__(self, tokenizer, vocab_size: int) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)

    def compile(self, spec: StructuredOutput):
        """The compiled grammar of `spec`; ValueError naming the schema's problem where it cannot compile."""
        try:
            return self.compiler.compile_json_schema(spec.json_schema or _OBJECT_SCHEMA, any_whitespace=False)
        except Exception as e:  # noqa: BLE001 - the grammar engine's own message for the client's schema
            raise ValueError(f"structured output json_schema cannot be compiled: {e}") from None

    def matcher(self, spec: StructuredOutput) -> Matcher:
        return Matcher(self._xgr.GrammarMatcher(self.compile(spec)), self.vocab_size)


class Matcher:
    """One request's grammar state: the mask of its next token, and the tokens it accepts."""

    def __init__(self, matcher, vocab_size: int) -> None:
        import xgrammar as xgr

        self._m = matcher
        self._mask = xgr.allocate_token_bitmask(1, vocab_size)
        self._apply = xgr.apply_token_bitmask_inplace

    def mask_(self, logits: Tensor, row: int) -> None:
        """Set the disallowed logits of `logits[row]` to -inf, in place."""
        self._m.fill_next_token_bitmask(self._mask, 0)
        self._apply(logits[row:row + 1], self._mask.to(logits.device))  # a view: the row itself changes

    def mask_span(self, logits: Tensor, start: int, drafts: list[int]) -> None:
        """Mask a verify span's rows start..start+len(drafts): row j by the grammar after drafts[:j]. Drafts are
        taken in to mask the next row and rolled back after; from a draft the grammar refuses on, the rows are
        left as they are (verification stops at that draft: its row gives it no probability)."""
        taken = 0
        for j in range(len(drafts) + 1):
            self.mask_(logits, start + j)
            if j == len(drafts) or not self._m.accept_token(drafts[j]):
                break
            taken += 1
        if taken:
            self._m.rollback(taken)

    def accept(self, tokens: list[int]) -> None:
        for t in tokens:
            if not self._m.accept_token(t):
                raise RuntimeError(f"token {t} breaks the structured output's grammar")

    @property
    def done(self) -> bool:
        """The grammar is complete and its stop token taken: nothing more may follow."""
        return bool(self._m.is_terminated())


def mask_rows(logits: Tensor, matchers: list[Matcher | None]) -> dict[int, str]:
    """Mask each row of logits [N, V] by its request's matcher (None: unconstrained); {row: error} for rows whose
    matcher failed (their requests fail alone)."""
    failed = {}
    for row, m in enumerate(matchers):
        if m is not None:
            try:
                m.mask_(logits, row)
            except Exception as e:  # noqa: BLE001 - one request's grammar must not end the batch
                failed[row] = f"{type(e).__name__}: {e}"
    return failed


__all__ = ["StructuredOutput", "GrammarCompiler", "Matcher", "mask_rows"]
