"""A folder's tokenizer, loaded the light way where it can be.

`AutoTokenizer` imports every tokenizer class transformers has (~2,100 modules: 3 s and 0.3 GB of RSS before a
token is read) and rebuilds a BPE from its vocabulary and merges. A folder with a `tokenizer.json` (every model
accel converts or exports, and most on the Hub) is read by `PreTrainedTokenizerFast` from that file alone, with
tokenizer_config.json's special tokens and the chat template: the same ids (tests/test_tokenizer.py), without
the weight. Other folders (a SentencePiece `tokenizer.model` only) go through AutoTokenizer.
"""

from __future__ import annotations

from pathlib import Path


def load_tokenizer(path: str | Path):
    """The tokenizer of a model folder (transformers' PreTrainedTokenizerFast where it has a tokenizer.json)."""
    path = Path(path)
    if (path / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
