"""The draw record in the run folder, and token batches for consumers."""
import json

import pytest
import torch

from accel.calibration import DrawnSample, read_draw, stratified_draw, to_batches, to_padded_batches, write_draw
from accel.recipe import CalibrationConfig


def _cfg(**kw):
    return CalibrationConfig(**(dict(num_samples=6, length_buckets=[20, 40], min_tokens=5, holdout_fraction=0.5) | kw))


def test_write_read_round_trip(tmp_path, base_samples, tok):
    d = stratified_draw(base_samples, tok, _cfg(seed=3))
    draw_path, summary_path = write_draw(d, tmp_path / "run")
    lines = [json.loads(x) for x in draw_path.read_text().splitlines()]
    assert len(lines) == len(d.train) + len(d.holdout)
    assert set(lines[0]) == {"id", "split", "domain", "bucket", "num_tokens", "packed_ids", "full_tokens"}
    assert [x["split"] for x in lines] == ["train"] * len(d.train) + ["holdout"] * len(d.holdout)
    summary = json.loads(summary_path.read_text())
    assert (summary["method"], summary["seed"], summary["num_train"]) == ("stratified", 3, 6)
    back = read_draw(tmp_path / "run")
    assert [(u.id, u.domain, u.bucket, u.num_tokens, u.packed_ids) for u in back.train] == \
        [(u.id, u.domain, u.bucket, u.num_tokens, u.packed_ids) for u in d.train]
    assert [u.id for u in back.holdout] == [u.id for u in d.holdout]
    assert back.strata == d.strata and back.notes == d.notes
    assert back.source_tokens == d.source_tokens == summary["source_tokens"] and sum(d.source_tokens.values()) > 0


def test_read_draw_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="calibration draw not found: .*calibration.jsonl"):
        read_draw(tmp_path)


def _unit(uid, tokens):
    return DrawnSample(id=uid, domain="d", bucket="<=64", text="", token_ids=tuple(tokens), num_tokens=len(tokens),
                       packed_ids=(uid,), full_tokens=len(tokens))


def test_to_batches_packs_equal_length_rows_and_keeps_the_tail():
    units = [_unit("a", range(1, 6)), _unit("b", range(6, 10)), _unit("c", range(10, 12))]  # 11 tokens
    out = list(to_batches(units, max_seq_len=3, batch_size=2))
    assert [tuple(t.shape) for t in out] == [(2, 3), (1, 3), (1, 2)]
    assert out[0].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert out[1].tolist() == [[7, 8, 9]] and out[2].tolist() == [[10, 11]]
    assert all(t.dtype == torch.long for t in out)


def test_to_padded_batches():
    units = [_unit("a", [5, 6, 7]), _unit("b", [8]), _unit("c", [9, 9])]
    (ids, mask), (ids2, mask2) = list(to_padded_batches(units, batch_size=2, pad_id=0))
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert ids2.tolist() == [[9, 9]] and mask2.tolist() == [[1, 1]]


@pytest.mark.parametrize("kw, message", [(dict(max_seq_len=0, batch_size=1), "max_seq_len must be >= 1, got 0"),
                                         (dict(max_seq_len=4, batch_size=0), "batch_size must be >= 1, got 0")])
def test_batch_argument_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        list(to_batches([_unit("a", [1])], **kw))


def test_a_drawn_set_is_recorded_and_read_back(tmp_path, tok):
    from accel.calibration import load_samples, random_draw, stratified_draw, write_draw

    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps({"id": f"s{i}", "text": " ".join(["w"] * (10 + i)), "domain": "x"}) + "\n"
                           for i in range(12)), encoding="utf-8")
    cfg = CalibrationConfig(source=str(src), num_samples=4, min_tokens=5, holdout_fraction=0.25)
    draw = stratified_draw(load_samples(cfg), tok, cfg)
    write_draw(draw, tmp_path / "run")
    assert (len(draw.train), len(draw.holdout)) == (4, 1)
    assert read_draw(tmp_path / "run").method == "stratified"
    assert random_draw(load_samples(cfg), tok, cfg).method == "random"
