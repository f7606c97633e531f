"""`accel serve` refuses a tampered export and a damaged model folder with one line naming the file (exit 2), before
anything is loaded; `--skip-verify` serves a tampered export anyway."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from accel.cli import app
from accel.export.checkpoint import write_export
from accel.export.load import ModelLoadError, check_model_files, load_engine
from accel.server.serve import verify_before_serving

runner = CliRunner()


@pytest.fixture
def export(tmp_path, tiny_model_dir):
    return write_export(tmp_path / "export", tiny_model_dir)


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_tampered_export_is_refused(export):
    verify_before_serving(export)  # intact: passes
    _flip_a_byte(export / "model.safetensors")
    with pytest.raises(ModelLoadError, match="refusing to serve .*sha256 mismatch for model.safetensors"):
        verify_before_serving(export)
    res = runner.invoke(app, ["serve", str(export), "--port", "1"])
    assert res.exit_code == 2 and "refusing to serve" in res.output and "--skip-verify" in res.output
    assert "Traceback" not in res.output


def test_skip_verify_loads_the_tampered_export(export):
    _flip_a_byte(export / "model.safetensors")  # the last byte of a weight: still loadable
    engine = load_engine(export, num_kv_blocks=8, block_size=8)
    assert engine.generate([5, 6, 7])[0].finished


def test_a_truncated_manifest_is_refused_by_serve(export):
    (export / "accel.json").write_text('{"files": {"config.json": "ab')
    with pytest.raises(ModelLoadError, match="accel.json is not valid JSON .* it may be truncated"):
        verify_before_serving(export)


@pytest.mark.parametrize("damage,expected", [
    (lambda f: f.write_bytes(f.read_bytes()[:4]), "shorter than the 8-byte header length"),
    (lambda f: f.write_bytes((10**9).to_bytes(8, "little") + f.read_bytes()[8:]), "the header claims 1000000000 bytes"),
    (lambda f: f.write_bytes(f.read_bytes()[:8] + b"\xff" * 16 + f.read_bytes()[24:]), "the header is not valid JSON"),
    (lambda f: f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2]), "outside the file's"),
])
def test_a_damaged_safetensors_file_is_one_line_naming_it(tiny_model_dir, damage, expected):
    f = tiny_model_dir / "model.safetensors"
    damage(f)
    with pytest.raises(ModelLoadError, match=expected) as ei:
        check_model_files(tiny_model_dir)
    assert str(f) in str(ei.value)
    res = runner.invoke(app, ["serve", str(tiny_model_dir), "--port", "1"])
    assert res.exit_code == 2 and "model.safetensors is not a valid safetensors file" in res.output
    assert "Traceback" not in res.output


def test_a_damaged_config_is_one_line_naming_it(tiny_model_dir):
    (tiny_model_dir / "config.json").write_text('{"hidden_size": ')
    with pytest.raises(ModelLoadError, match="config.json is not a readable JSON file"):
        check_model_files(tiny_model_dir)


def test_an_export_with_a_symlink_is_refused(export, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    (export / "model.safetensors").rename(outside)
    (export / "model.safetensors").symlink_to(outside)
    with pytest.raises(ModelLoadError, match=r"not symlinks \(model.safetensors\)"):
        verify_before_serving(export)


def test_an_export_without_its_manifest_is_served_with_a_warning(export, caplog):
    import logging

    (export / "accel.json").unlink()
    (export / "accel_plan.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="accel.server.serve"):
        verify_before_serving(export)
    assert any("serving it unverified" in r.getMessage() for r in caplog.records)
