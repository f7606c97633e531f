"""Speculative decoding: proposers (draft model, n-gram lookup, distilled draft), verification (greedy and
Leviathan/Chen rejection sampling), acceptance statistics and adaptive speculation length."""

from accel.spec.adaptive import AdaptiveConfig, AdaptiveSpeculation, best_speculation_length, speculation_enabled
from accel.spec.ngram import propose_ngram
from accel.spec.proposer import DraftModelProposer, NgramProposer, ProposalRequest, Proposals, Proposer
from accel.spec.rejection import VerifyResult, greedy_verify, rejection_sample
from accel.spec.stats import SpecDecodeAggregator, SpecDecodeStats, expected_tokens_per_step, leviathan_speedup
from accel.spec.tokenizer_check import TokenizerMismatchError, check_tokenizers_match

__all__ = [
    "AdaptiveConfig", "AdaptiveSpeculation", "best_speculation_length", "speculation_enabled", "propose_ngram",
    "DraftModelProposer", "NgramProposer", "ProposalRequest", "Proposals", "Proposer", "VerifyResult",
    "greedy_verify", "rejection_sample", "SpecDecodeAggregator", "SpecDecodeStats", "expected_tokens_per_step",
    "leviathan_speedup", "TokenizerMismatchError", "check_tokenizers_match",
]
