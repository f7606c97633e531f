"""Fixtures for the calibration sampler: a word-level fake tokenizer and small synthetic sample sets."""
from __future__ import annotations

import pytest

from accel.calibration import TextSample


class WordTokenizer:
    """One token per whitespace-separated word; id = 1 + len(word). Same call shape as a HF tokenizer."""

    eos_token_id = 0

    def __call__(self, texts, add_special_tokens=False):
        assert add_special_tokens is False
        return {"input_ids": [[1 + len(w) for w in t.split()] for t in texts]}


def words(tag: str, n: int) -> str:
    return " ".join([tag] + [f"w{j}" for j in range(n - 1)])


def make_samples(spec: dict[str, list[tuple[int, int]]]) -> list[TextSample]:
    """spec: domain -> [(count, words per sample)]; ids '<domain>-<k>' in order."""
    out = []
    for domain, groups in spec.items():
        k = 0
        for count, n in groups:
            for _ in range(count):
                out.append(TextSample(id=f"{domain}-{k}", domain=domain, text=words(f"{domain}{k}", n), source="test"))
                k += 1
    return out


# Strata with buckets [20, 40]: (a,<=20)=6, (a,21-40)=3, (a,>40)=1, (b,<=20)=10, (b,21-40)=10.
BASE_SPEC = {"a": [(6, 10), (3, 30), (1, 50)], "b": [(10, 10), (10, 30)]}


@pytest.fixture
def tok():
    return WordTokenizer()


@pytest.fixture
def base_samples():
    return make_samples(BASE_SPEC)
