"""scripts/bench_spec.py's method names: draft variants with their own confidence gates, side by side."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_spec", Path(__file__).parents[2] / "scripts" / "bench_spec.py")
bench_spec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_spec)


def test_draft_method_names_carry_their_gates():
    # plain: the command line's
    assert bench_spec.draft_variant("draft", 0.5, None, "int8") == (0.5, None, "int8", False)
    assert bench_spec.draft_variant("draft+path0.3", 0.5, None, "int8") == (None, 0.3, None, False)
    assert bench_spec.draft_variant("draft+conf0.4+path0.2+int8", None, None, None) == (0.4, 0.2, "int8", False)
    assert bench_spec.draft_variant("draft+ngram+path0.3+int8", None, None, None) == (None, 0.3, "int8", True)
    for bad in ("draft+speed2", "draft+pathx", "drafty"):
        with pytest.raises(ValueError, match="is invalid"):
            bench_spec.draft_variant(bad, None, None, None)
