"""Refuse a draft whose tokenizer differs from the target's: its token ids would mean different text.

Compares what decides the id of every token: the config's vocab_size, and in tokenizer.json the model type,
vocabulary, merges and added/special tokens. The error names both models and the first difference.
"""

from __future__ import annotations

import json
from pathlib import Path


class TokenizerMismatchError(ValueError):
    """The draft and the target do not share a tokenizer."""


def _load(folder: Path) -> tuple[int | None, dict]:
    config = folder / "config.json"
    vocab_size = json.loads(config.read_text()).get("vocab_size") if config.exists() else None
    tok = folder / "tokenizer.json"
    if not tok.exists():
        raise TokenizerMismatchError(f"{folder} has no tokenizer.json; the draft/target tokenizer check needs one "
                                     "(save the tokenizer with a fast tokenizer: tokenizer.save_pretrained)")
    return vocab_size, json.loads(tok.read_text())


def _first_dict_difference(a: dict, b: dict) -> str | None:
    for key in a:
        if key not in b:
            return f"token {key!r} (id {a[key]}) is missing from the draft"
        if a[key] != b[key]:
            return f"token {key!r} has id {a[key]} in the target and {b[key]} in the draft"
    extra = next((key for key in b if key not in a), None)
    return None if extra is None else f"token {extra!r} (id {b[extra]}) is only in the draft"


def _first_list_difference(name: str, a: list, b: list) -> str | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"{name}[{i}] is {x!r} in the target and {y!r} in the draft"
    if len(a) != len(b):
        return f"{name} has {len(a)} entries in the target and {len(b)} in the draft"
    return None


def tokenizer_difference(target_dir: str | Path, draft_dir: str | Path) -> str | None:
    """The first difference between the two folders' tokenizers, or None when they are identical."""
    t_size, t_tok = _load(Path(target_dir))
    d_size, d_tok = _load(Path(draft_dir))
    if t_size is not None and d_size is not None and t_size != d_size:
        return f"vocab_size is {t_size} in the target and {d_size} in the draft"
    t_model, d_model = t_tok.get("model", {}), d_tok.get("model", {})
    if t_model.get("type") != d_model.get("type"):
        return f"tokenizer model type is {t_model.get('type')!r} in the target and {d_model.get('type')!r} in the draft"
    t_vocab, d_vocab = t_model.get("vocab", {}), d_model.get("vocab", {})
    if isinstance(t_vocab, dict) and isinstance(d_vocab, dict):
        diff = _first_dict_difference(t_vocab, d_vocab)
    else:  # Unigram tokenizers store the vocabulary as a list of [piece, score]
        diff = _first_list_difference("vocab", list(t_vocab), list(d_vocab))
    if diff:
        return diff
    diff = _first_list_difference("merges", t_model.get("merges", []), d_model.get("merges", []))
    if diff:
        return diff
    added = [(t["id"], t["content"], t.get("special")) for t in t_tok.get("added_tokens", [])]
    d_added = [(t["id"], t["content"], t.get("special")) for t in d_tok.get("added_tokens", [])]
    return _first_list_difference("added_tokens", added, d_added)


def check_tokenizers_match(target_dir: str | Path, draft_dir: str | Path) -> None:
    """Raise TokenizerMismatchError naming both models and the first difference unless the tokenizers match."""
    diff = tokenizer_difference(target_dir, draft_dir)
    if diff is not None:
        raise TokenizerMismatchError(f"draft {str(draft_dir)!r} does not share the tokenizer of target "
                                     f"{str(target_dir)!r}: {diff}. A draft model must use the target's tokenizer.")
