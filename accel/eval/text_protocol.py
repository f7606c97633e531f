"""The text-scoring protocol: how held-out text becomes scored token positions.

Protocol (also written into every result as `EvalProtocol`):

1. Each document of a domain is tokenized with the evaluated model's tokenizer, without special tokens.
2. The documents of one domain are concatenated in file order with one separator token between them
   (the model's EOS id; for SmolLM2 that is 2 = <|im_end|>). Domains are never mixed.
3. The token stream is cut into windows of `window` tokens. With `stride == window` (the default) the windows
   do not overlap. With `stride < window` each window starts `stride` tokens after the previous one and its
   first `window - stride` tokens are an unscored context prefix. The last window may be shorter than
   `window` (it holds the remainder of the stream, so no text is dropped).
4. In every window, every target token after the first is scored, except targets already scored by an earlier
   window (that is the context prefix when `stride < window`). The logits at window position j-1 predict the
   token at position j.

   ::

       stream   t0 t1 t2 t3 t4 t5 t6 t7 t8 t9          window=4, stride=4
       windows  [t0 t1 t2 t3][t4 t5 t6 t7][t8 t9]
       scored      ^  ^  ^      ^  ^  ^      ^         7 targets = sum(len - 1)

       windows  [t0 t1 t2 t3]                          window=4, stride=2
                      [t2 t3 t4 t5]
                            [t4 t5 t6 t7]
                                  [t6 t7 t8 t9]
       scored      ^  ^  ^     ^  ^  ^  ^  ^  ^        9 targets = every token after t0

5. `max_windows_per_domain = k` keeps k of the n windows of a domain, evenly spread: windows i * n // k for
   i = 0..k-1 (deterministic, no sampling; a kept window keeps its own context prefix).
6. Perplexity = exp(mean NLL over the scored tokens), per domain and overall (overall pools all scored tokens
   of all domains, so it is token-weighted). KL(P_base || P_model) is computed per scored position from both
   models' full logits (log-sum-exp finished in float64, see `accel.eval.metrics`) and reported as mean,
   P99 (linear interpolation) and max, pooled like perplexity; top-1 agreement is the
   fraction of scored positions where the two argmaxes agree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol, Sequence

DEFAULT_WINDOW = 512


class TextTokenizer(Protocol):
    """The part of a tokenizer the protocol uses (an HF tokenizer satisfies it)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass(frozen=True)
class EvalProtocol:
    """The parameters that define what was scored; written into every result."""

    window: int = DEFAULT_WINDOW
    stride: int = DEFAULT_WINDOW
    max_windows_per_domain: int | None = None
    separator_id: int | None = None  # token placed between documents; None = plain concatenation
    separator: str = "eos"
    tokenization: str = "per document, no special tokens, concatenated per domain in file order"
    scoring: str = "every target after the first token of each window, minus targets an earlier window scored"
    window_selection: str = "all windows; with max_windows_per_domain=k, windows i*n//k for i<k (evenly spread)"
    perplexity: str = "exp(mean NLL over scored tokens); overall pools tokens of all domains"
    kl: str = "KL(P_base || P_model) in nats per scored position, log-sum-exp and sums in float64; mean, P99, max"
    top1: str = "fraction of scored positions where argmax(base) == argmax(model)"

    def __post_init__(self) -> None:
        validate_window_params(self.window, self.stride, self.max_windows_per_domain)

    def to_dict(self) -> dict:
        return asdict(self)


def validate_window_params(window: int, stride: int, max_windows: int | None) -> None:
    """Raise ValueError naming the bad value when the window parameters make no sense."""
    if not isinstance(window, int) or window < 2:
        raise ValueError(f"window must be an int >= 2 (one context token + one scored token), got {window!r}")
    if not isinstance(stride, int) or not 1 <= stride <= window:
        raise ValueError(f"stride must be an int in [1, window={window}], got {stride!r}")
    if max_windows is not None and (not isinstance(max_windows, int) or max_windows < 1):
        raise ValueError(f"max_windows_per_domain must be None or an int >= 1, got {max_windows!r}")


@dataclass(frozen=True)
class Window:
    """One model input: `token_ids[score_from:]` are the scored targets (predicted from the position before)."""

    domain: str
    token_ids: tuple[int, ...]
    score_from: int  # index of the first scored target in token_ids; >= 1

    @property
    def num_scored(self) -> int:
        return len(self.token_ids) - self.score_from


def concat_documents(token_lists: Sequence[Sequence[int]], separator_id: int | None) -> list[int]:
    """Concatenate tokenized documents, with `separator_id` between consecutive documents."""
    stream: list[int] = []
    for i, ids in enumerate(token_lists):
        if i > 0 and separator_id is not None:
            stream.append(separator_id)
        stream.extend(ids)
    return stream


def make_windows(
    stream: Sequence[int], domain: str, window: int, stride: int | None = None, max_windows: int | None = None
) -> list[Window]:
    """Cut a token stream into windows as the module docstring's protocol says (pure function).

    Each window scores only targets no earlier window scored. With `stride < window` and no `max_windows`,
    every token after the first of the stream is scored exactly once; with `stride == window` the first token
    of each window is context only (a 1-token tail is therefore dropped).
    """
    stride = window if stride is None else stride
    validate_window_params(window, stride, max_windows)
    windows: list[Window] = []
    scored_until = 1  # stream index of the first target not yet scored (token 0 has no context)
    start = 0
    while start < len(stream) and scored_until < len(stream):
        end = min(start + window, len(stream))
        first_target = max(scored_until, start + 1)
        if end > first_target:
            windows.append(Window(domain, tuple(stream[start:end]), first_target - start))
            scored_until = end
        start += stride
    if max_windows is not None and len(windows) > max_windows:
        # Evenly spread, starting with the first: window i * n // k for i < k, so the sample spans the whole
        # domain (many documents) rather than its first few documents; deterministic, no RNG.
        windows = [windows[i * len(windows) // max_windows] for i in range(max_windows)]
    return windows


def tokenize_domain(
    texts: Sequence[str], tokenizer: TextTokenizer, separator_id: int | None
) -> list[int]:
    """Tokenize each document without special tokens and concatenate them with separators."""
    return concat_documents([tokenizer.encode(t, add_special_tokens=False) for t in texts], separator_id)
