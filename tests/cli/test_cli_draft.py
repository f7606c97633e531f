"""`accel draft train`: registered under the main CLI, refuses bad input before loading anything."""

from __future__ import annotations

from typer.testing import CliRunner

from accel.cli import app


def test_draft_train_help_and_bad_inputs(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["draft", "train", "--help"])
    assert res.exit_code == 0 and "--time-budget-minutes" in res.output
    res = runner.invoke(app, ["draft", "train", str(tmp_path / "missing-model"), "--out", str(tmp_path / "d")])
    assert res.exit_code == 2
    res = runner.invoke(app, ["draft", "train", "x", "--out", str(tmp_path / "d"), "--layer-choice", "last"])
    assert res.exit_code == 2 and "'first' or 'spread'" in res.output
    res = runner.invoke(app, ["draft", "train", "x", "--out", str(tmp_path / "d"), "--kind", "medusa"])
    assert res.exit_code == 2 and "'eagle' or 'layers'" in res.output
    assert "--kind" in runner.invoke(app, ["draft", "train", "--help"]).output


def test_draft_train_init_from_is_checked_before_loading(tmp_path):
    runner = CliRunner()
    out = ["draft", "train", "x", "--out", str(tmp_path / "d")]

    def said(res) -> str:  # the error panel, unwrapped: rich folds long lines at the terminal width
        return "".join(res.output.replace("│", "").replace("╭", "").replace("╰", "").split())

    res = runner.invoke(app, out + ["--init-from", str(tmp_path / "no-draft")])
    assert res.exit_code == 2 and "no-draft" in said(res) and "accel_draft.json" in said(res)
    res = runner.invoke(app, out + ["--kind", "layers", "--init-from", str(tmp_path)])
    assert res.exit_code == 2 and "eagleonly" in said(res)
    res = runner.invoke(app, out + ["--gen-fraction", "0.99"])
    assert res.exit_code == 2 and "--gen-fraction" in said(res)
