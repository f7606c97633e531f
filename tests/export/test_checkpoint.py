from __future__ import annotations

import json

import pytest

from accel.export.checkpoint import MANIFEST_NAME, verify_export, write_export
from accel.export.compatibility import LOADERS
from tests.conftest import save_tiny_model


def test_export_round_trip_and_verify(tmp_path, tiny_model_dir):
    draft = save_tiny_model(tmp_path / "draft", seed=1, num_hidden_layers=1)
    out = write_export(tmp_path / "export", tiny_model_dir, recipe={"name": "t"}, plan={"lm_head": "fp16"},
                       draft_dir=draft, draft_pairing={"acceptance_rate": 0.5}, eval_summary={"kl_mean": 0.01})
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["plan"] == {"lm_head": "fp16"} and manifest["draft"]["acceptance_rate"] == 0.5
    assert "model.safetensors" in manifest["files"] and "draft/model.safetensors" in manifest["files"]
    assert manifest["versions"]["torch"]
    assert manifest["loaders"] == {n: {"loads": True, "refused": {}} for n in LOADERS}
    res = verify_export(out, prompts=["The quick brown"])
    assert res.ok, res.problems
    assert res.loaded and res.checked_files == len(manifest["files"])
    assert len(res.details["greedy"][0]) == 16 or res.details["greedy"][0][-1] == 2


def test_verify_catches_tampering_missing_and_extra_files(tmp_path, tiny_model_dir):
    out = write_export(tmp_path / "export", tiny_model_dir)
    (out / "generation_config.json").write_text("{}")
    (out / "stray.txt").write_text("x")
    (out / "tokenizer.json").unlink()
    res = verify_export(out, load=False)
    assert not res.ok
    assert set(res.problems) == {"sha256 mismatch for generation_config.json (changed since the export was written)",
                                 "missing file tokenizer.json",
                                 "unexpected file stray.txt (not in accel.json)"}


def test_export_is_atomic(tmp_path, tiny_model_dir, monkeypatch):
    import accel.export.checkpoint as ck

    def boom(root):
        raise KeyboardInterrupt

    monkeypatch.setattr(ck, "_hash_files", boom)
    with pytest.raises(KeyboardInterrupt):
        write_export(tmp_path / "export", tiny_model_dir)
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-model"]


def test_verify_rejects_non_export(tmp_path, tiny_model_dir):
    res = verify_export(tiny_model_dir)
    assert not res.ok and "not an accel export" in res.problems[0]


def test_cli_export_verify(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from accel.cli import app

    out = write_export(tmp_path / "export", tiny_model_dir)
    res = CliRunner().invoke(app, ["export", "verify", str(out), "--no-load"])
    assert res.exit_code == 0 and "files match" in res.output
    (out / "config.json").write_text("{}")
    res = CliRunner().invoke(app, ["export", "verify", str(out), "--no-load"])
    assert res.exit_code == 1 and "sha256 mismatch for config.json" in res.output


def test_cli_export_verify_sends_third_party_output_to_a_log(tmp_path, tiny_model_dir, monkeypatch):
    import sys

    from typer.testing import CliRunner

    import accel.export
    from accel.cli import app

    out = write_export(tmp_path / "export", tiny_model_dir)
    real = accel.export.verify_export

    def noisy(*args, **kwargs):
        sys.stderr.write("Decompressing model: 100%|##########| 211/211\n")  # what compressed-tensors' tqdm prints
        return real(*args, **kwargs)

    monkeypatch.setenv("ACCEL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(accel.export, "verify_export", noisy)
    res = CliRunner().invoke(app, ["export", "verify", str(out), "--no-load"])
    assert res.exit_code == 0 and "files match" in res.output and "Decompressing" not in res.output
    assert "Decompressing model" in (tmp_path / "home" / "logs" / "export-verify.txt").read_text()
