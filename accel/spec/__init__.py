"""Speculative decoding: proposers (draft model, n-gram lookup, distilled draft), verification (greedy and
Leviathan/Chen rejection sampling), acceptance statistics and adaptive speculation length.

Names are imported lazily so that `accel.spec.cli` (and with it `accel --help`) does not import torch.
"""

from importlib import import_module

_EXPORTS = {
    "AdaptiveConfig": "adaptive", "AdaptiveSpeculation": "adaptive", "best_speculation_length": "adaptive",
    "speculation_enabled": "adaptive", "propose_ngram": "ngram", "DraftModelProposer": "proposer",
    "NgramProposer": "proposer", "ProposalRequest": "proposer", "Proposals": "proposer", "Proposer": "proposer",
    "PagedDraftProposer": "paged_draft", "SpeculativeConfig": "config", "VerifyResult": "rejection",
    "greedy_verify": "rejection", "rejection_sample": "rejection",
    "SpecDecodeStats": "stats", "expected_tokens_per_step": "stats", "leviathan_speedup": "stats",
    "TokenizerMismatchError": "tokenizer_check", "check_tokenizers_match": "tokenizer_check",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'accel.spec' has no attribute {name!r}")
    return getattr(import_module(f"accel.spec.{_EXPORTS[name]}"), name)
