"""N-gram prompt lookup: propose the tokens that followed the last occurrence of the sequence's own suffix.

Input-grounded requests (summarise, extract, rewrite a given passage) copy spans of their prompt, so the
tokens after an earlier occurrence of the last n tokens are a free and often correct guess (prompt lookup
decoding; vLLM's NgramProposer). No model, no distribution: the rejection sampler treats q as one-hot.

    tokens:  a b c d e f . . . b c d [?]      suffix "b c d" (n = 3) last occurred at position 1,
                ^^^^^ ^^^                     so propose "e f ." (k = 3), the tokens that followed it
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(token_ids: list[int] | np.ndarray, k: int, min_n: int = 2, max_n: int = 4) -> list[int]:
    """Up to k draft tokens for the sequence `token_ids` (prompt + verified output), or [] when none match.

    Tries n = max_n down to min_n: the first n whose last-n-token suffix occurs earlier in the sequence wins,
    and the most recent earlier occurrence is used (recent text predicts the continuation best). The proposal
    is the tokens that followed that occurrence, at most k of them and never past the sequence's end.
    Cost: O(len * n) vectorised numpy per n tried.
    """
    if k < 0:
        raise ValueError(f"k={k} is invalid; allowed: an integer >= 0")
    if not 1 <= min_n <= max_n:
        raise ValueError(f"min_n={min_n}, max_n={max_n} are invalid; allowed: 1 <= min_n <= max_n")
    tokens = np.asarray(token_ids, dtype=np.int64)
    length = tokens.shape[0]
    if k == 0:
        return []
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]  # [n]
        # candidate starts 0 .. length - n - 1: every window except the suffix itself
        windows = sliding_window_view(tokens[: length - 1], n)  # [length - n, n]
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # first token after the most recent match
            return tokens[start: start + k].tolist()
    return []
