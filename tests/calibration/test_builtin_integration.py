"""The builtin calibration set with the real SmolLM2 tokenizer; the data builder reproduces the committed files."""
import subprocess
import sys
from pathlib import Path

import pytest

from accel.calibration import load_samples, stratified_draw, to_batches, write_draw
from accel.recipe import CalibrationConfig

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_default_recipe_draw_covers_every_stratum(real_model_path, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(real_model_path)
    cfg = CalibrationConfig(num_samples=128)  # 128 samples, buckets [64, 256, 1024], proportional, pack below 32 tokens
    draw = stratified_draw(load_samples(cfg), tok, cfg)
    assert len(draw.train) == 128
    assert len(draw.strata) == 24 and all(r.drawn >= 1 for r in draw.strata.values())
    assert all(u.num_tokens <= 512 for u in draw.train)
    assert all(u.num_tokens >= 32 for u in draw.train)  # short samples were packed
    write_draw(draw, tmp_path)
    assert (tmp_path / "calibration.jsonl").read_text().count("\n") == len(draw.train) + len(draw.holdout)
    rows = list(to_batches(draw.train, 512, 16))
    assert sum(t.numel() for t in rows) == sum(u.num_tokens for u in draw.train)


@pytest.mark.slow
def test_builder_reproduces_committed_data():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_data.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
