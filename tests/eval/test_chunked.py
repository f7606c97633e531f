"""accel.eval.chunked: llama-perplexity's chunking and scoring, on a tiny random model."""

from __future__ import annotations

import json

import pytest
import torch

from accel.eval.chunked import held_out_text, make_chunks, score_chunks
from tests.conftest import make_tiny_llama


def test_chunks_are_non_overlapping_with_bos_first_and_the_tail_dropped():
    c = make_chunks(list(range(10, 31)), 4, bos_token_id=1)
    assert c.tolist() == [[1, 11, 12, 13], [1, 15, 16, 17], [1, 19, 20, 21], [1, 23, 24, 25], [1, 27, 28, 29]]
    assert make_chunks(list(range(10, 31)), 4, max_chunks=2).tolist() == [[10, 11, 12, 13], [14, 15, 16, 17]]
    with pytest.raises(ValueError, match="n_ctx=5 is invalid"):
        make_chunks(list(range(20)), 5)
    with pytest.raises(ValueError, match="the text has 3 tokens"):
        make_chunks([1, 2, 3], 4)


def test_a_model_against_itself_scores_zero_and_a_changed_one_does_not():
    torch.manual_seed(0)
    base = make_tiny_llama().eval()
    other = make_tiny_llama().eval()
    with torch.no_grad():
        other.load_state_dict(base.state_dict())
        other.lm_head.weight.add_(0.05 * torch.randn_like(other.lm_head.weight))
    chunks = torch.randint(3, base.config.vocab_size, (10, 16))
    scores = score_chunks(base, {"same": base, "other": other}, chunks)
    same, changed = scores["same"], scores["other"]
    assert same.kld_mean == pytest.approx(0.0, abs=1e-6) and same.same_top1 == 1.0 and same.ppl_ratio == pytest.approx(1.0)
    assert same.num_tokens == 10 * 7  # positions 8..14 of each 16-token chunk predict tokens 9..15
    assert changed.kld_mean > 1e-4 and changed.ppl_base == same.ppl_base


def test_held_out_text_takes_the_domains_round_robin(tmp_path):
    for domain, n in (("a", 3), ("b", 1)):
        rows = [{"id": f"{domain}{i}", "domain": domain, "text": f"{domain}{i}"} for i in range(n)]
        (tmp_path / f"{domain}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert held_out_text(tmp_path) == "a0\n\nb0\n\na1\n\na2"
