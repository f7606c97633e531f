"""`accel draft train`: registered under the main CLI, refuses bad input before loading anything."""

from __future__ import annotations

from typer.testing import CliRunner

from accel.cli import app


def test_draft_train_help_and_bad_inputs(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["draft", "train", "--help"])
    assert res.exit_code == 0 and "--minutes" in res.output
    res = runner.invoke(app, ["draft", "train", str(tmp_path / "missing-model"), "--out", str(tmp_path / "d")])
    assert res.exit_code == 2
    res = runner.invoke(app, ["draft", "train", "x", "--out", str(tmp_path / "d"), "--layer-choice", "last"])
    assert res.exit_code == 2 and "first, spread" in res.output
    res = runner.invoke(app, ["draft", "train", "x", "--out", str(tmp_path / "d"), "--kind", "medusa"])
    assert res.exit_code == 2 and "eagle, layers" in res.output
    assert "--kind" in runner.invoke(app, ["draft", "train", "--help"]).output
