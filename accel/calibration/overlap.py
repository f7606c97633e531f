"""Contamination checks between two text collections (e.g. calibration data vs held-out eval data).

Two texts overlap when they share
- a substring of `min_chars` characters (exact, case-sensitive), or
- a run of `ngram` consecutive words (case-folded, split on whitespace).

The index side stores every window of the smaller collection; the other side is scanned, so memory
stays proportional to the smaller collection (a few MB of text here).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Overlap:
    """One shared piece: `kind` is "chars" or "words", `a_index`/`b_index` point into the inputs."""

    kind: str
    a_index: int
    b_index: int
    shared: str


def char_windows(text: str, width: int) -> Iterable[str]:
    """All substrings of `width` characters (none when the text is shorter)."""
    return (text[i:i + width] for i in range(len(text) - width + 1))


def word_ngrams(text: str, n: int) -> Iterable[tuple[str, ...]]:
    """All runs of n consecutive case-folded words."""
    words = text.casefold().split()
    return (tuple(words[i:i + n]) for i in range(len(words) - n + 1))


class OverlapIndex:
    """Index of one collection's character windows and word n-grams, to test other texts against."""

    def __init__(self, texts: Sequence[str], min_chars: int = 50, ngram: int = 13):
        if min_chars < 1 or ngram < 1:
            raise ValueError(f"min_chars and ngram must be >= 1, got {min_chars} and {ngram}")
        self.min_chars, self.ngram = min_chars, ngram
        self._chars: dict[str, int] = {}
        self._words: dict[tuple[str, ...], int] = {}
        for i, text in enumerate(texts):
            self.add(text, i)

    def add(self, text: str, index: int) -> None:
        for w in char_windows(text, self.min_chars):
            self._chars.setdefault(w, index)
        for g in word_ngrams(text, self.ngram):
            self._words.setdefault(g, index)

    def first_overlap(self, text: str, text_index: int = -1) -> Overlap | None:
        """The first shared window between `text` and the indexed collection, or None."""
        for w in char_windows(text, self.min_chars):
            hit = self._chars.get(w)
            if hit is not None:
                return Overlap("chars", hit, text_index, w)
        for g in word_ngrams(text, self.ngram):
            hit = self._words.get(g)
            if hit is not None:
                return Overlap("words", hit, text_index, " ".join(g))
        return None


def find_overlaps(a: Sequence[str], b: Sequence[str], min_chars: int = 50, ngram: int = 13) -> list[Overlap]:
    """Every text of `b` that shares a long substring or word n-gram with some text of `a` (first hit each)."""
    index = OverlapIndex(a, min_chars=min_chars, ngram=ngram)
    hits = []
    for j, text in enumerate(b):
        hit = index.first_overlap(text, j)
        if hit is not None:
            hits.append(hit)
    return hits
