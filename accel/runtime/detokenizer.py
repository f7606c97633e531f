"""Incremental detokenization with stop strings (vLLM semantics).

Text is decoded with a sliding window (prefix_offset, read_offset) over prompt-tail + output tokens, so the
spacing a token gets from its left context is right and a multi-byte character split across tokens is only
emitted once complete; bytes still incomplete when the request finishes are emitted then, as U+FFFD (the text is
`decode(output ids)`, as transformers and the OpenAI API give it). Stop strings are searched across token boundaries in the new text
plus the `len(stop) - 1` characters before it; the output is truncated before the stop string. While not
finished, the last `max(len(stop)) - 1` characters are held back from the streamed delta, because they might
turn out to be the start of a stop string.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_PROMPT_CONTEXT = 5  # prompt tokens decoded as left context of the first output token


@dataclass
class IncrementalDetokenizer:
    tokenizer: object | None  # a transformers tokenizer, or None (token ids only, text stays "")
    prompt_token_ids: list[int]
    stop: list[str] = field(default_factory=list)
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt_token_ids[-_PROMPT_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)
        self.output_text = ""
        self.num_emitted_chars = 0
        self._out: list[int] = []  # the output tokens fed so far
        self._decoded = 0  # how many of them output_text holds
        self.stopped_by: str | None = None
        self._holdback = max((len(s) for s in self.stop), default=1) - 1
        # A fast tokenizer's own incremental decoder (tokenizers' DecodeStream, as vLLM uses): one Rust call per
        # token where the window decodes twice through transformers (several times cheaper a token, and a batch-1
        # decode step runs its Python with caches cold after the weight stream). Not where transformers post-
        # processes the decoded text (clean_up_tokenization_spaces), nor after a prompt that ends inside a character
        # (the stream would emit that context's text again).
        self._stream = self._backend = None
        backend = getattr(self.tokenizer, "_tokenizer", None)
        if (backend is not None and not getattr(self.tokenizer, "clean_up_tokenization_spaces", True)
                and not backend.decode(self.tokens, skip_special_tokens=self.skip_special_tokens).endswith("\ufffd")):
            from tokenizers.decoders import DecodeStream

            self._backend = backend
            self._stream = DecodeStream(ids=self.tokens, skip_special_tokens=self.skip_special_tokens)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def update(self, new_token_ids: list[int]) -> bool:
        """Add tokens; returns True when a stop string was found (output_text is then truncated before it)."""
        if self.tokenizer is None or self.stopped_by is not None:
            return self.stopped_by is not None
        if self._stream is not None:
            for token_id in new_token_ids:
                self._out.append(token_id)
                delta = self._stream.step(self._backend, token_id)
                if delta:
                    self._decoded = len(self._out)
                    if self._append_and_check_stop(delta):
                        return True
            return False
        for token_id in new_token_ids:
            self._out.append(token_id)
            self.tokens.append(token_id)
            prefix = self._decode(self.tokens[self.prefix_offset:self.read_offset])
            full = self._decode(self.tokens[self.prefix_offset:])
            if len(full) <= len(prefix) or full.endswith("\ufffd"):
                continue  # incomplete character: wait for the next token
            delta = full[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
            self._decoded = len(self._out)
            if self._append_and_check_stop(delta):
                return True
        return False

    def _append_and_check_stop(self, delta: str) -> bool:
        old_len = len(self.output_text)
        self.output_text += delta
        best: tuple[int, str] | None = None
        for s in self.stop:
            idx = self.output_text.find(s, max(0, old_len - len(s) + 1))
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is None:
            return False
        self.output_text = self.output_text[:best[0]]
        self.stopped_by = best[1]
        return True

    def _flush(self) -> None:
        """At the end: the tokens still waiting for a complete character, decoded as they are."""
        pending = self._out[self._decoded:]
        if self.tokenizer is None or self.stopped_by is not None or not pending:
            return
        left = (self.prompt_token_ids[-_PROMPT_CONTEXT:] + self._out[:self._decoded])[-_PROMPT_CONTEXT:]
        prefix = self._decode(left)
        self._decoded = len(self._out)
        self._append_and_check_stop(self._decode(left + pending)[len(prefix):])

    def take_delta(self, finished: bool) -> str:
        """Text not yet returned; holds back a possible stop-string prefix unless the request finished."""
        if finished:
            self._flush()
        end = len(self.output_text) if finished else max(len(self.output_text) - self._holdback, 0)
        end = max(end, self.num_emitted_chars)
        delta = self.output_text[self.num_emitted_chars:end]
        self.num_emitted_chars = end
        return delta
