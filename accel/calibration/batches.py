"""Turn drawn calibration units into token tensors for sensitivity analysis and GPTQ.

Two layouts:
- `to_batches`: equal-length packing. Units are concatenated in draw order into one token stream and cut
  into rows of exactly `max_seq_len` tokens, so every batch is a plain [B, S] tensor with no padding and no
  mask. Rows may cross unit boundaries (the usual GPTQ practice). The tail that does not fill a whole row
  comes last as its own [1, r] tensor (never dropped).
- `to_padded_batches`: one unit per row, right-padded to the longest row of the batch, with an attention
  mask ([B, S] ids and [B, S] mask, 1 = real token). Use it when statistics must stay per sample.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from accel.calibration.sampler import DrawnSample


def _check(max_seq_len: int | None, batch_size: int) -> None:
    if max_seq_len is not None and max_seq_len < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


def to_batches(samples: Sequence[DrawnSample], max_seq_len: int, batch_size: int) -> Iterator[torch.Tensor]:
    """Equal-length packed batches: [B, max_seq_len] int64 token ids (last batch may have fewer rows,
    and a final [1, r] tensor holds the tail shorter than a row)."""
    _check(max_seq_len, batch_size)
    stream = [t for u in samples for t in u.token_ids]  # [N] all tokens in draw order
    n_rows = len(stream) // max_seq_len
    if n_rows:
        rows = torch.tensor(stream[:n_rows * max_seq_len], dtype=torch.long).view(n_rows, max_seq_len)  # [R, S]
        for start in range(0, n_rows, batch_size):
            yield rows[start:start + batch_size]  # [B, S]
    tail = stream[n_rows * max_seq_len:]
    if tail:
        yield torch.tensor(tail, dtype=torch.long).unsqueeze(0)  # [1, r]


def to_padded_batches(samples: Sequence[DrawnSample], batch_size: int, pad_id: int = 0,
                      max_seq_len: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One unit per row, right-padded: yields (input_ids [B, S], attention_mask [B, S]) with S the longest
    row in the batch (rows cut to max_seq_len when given). Units with no tokens are skipped."""
    _check(max_seq_len, batch_size)
    rows = [list(u.token_ids[:max_seq_len] if max_seq_len else u.token_ids) for u in samples]
    rows = [r for r in rows if r]
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        width = max(len(r) for r in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)  # [B, S]
        mask = torch.zeros((len(chunk), width), dtype=torch.long)  # [B, S]
        for i, r in enumerate(chunk):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = 1
        yield ids, mask
