"""No user-facing command prints a Python traceback for bad input: bad files are one line naming the file, and an
unexpected error is one line plus where to get the traceback (`--debug`, accepted anywhere on the line)."""

from __future__ import annotations

import pytest

import accel.recipe
from accel.cli import main


def test_an_unexpected_error_is_one_line_unless_debug(monkeypatch, capsys):
    def boom():
        raise RuntimeError("boom")

    monkeypatch.setattr(accel.recipe, "recipe_json_schema", boom)
    with pytest.raises(SystemExit) as ei:
        main(["recipe", "schema"])
    err = capsys.readouterr().err
    assert ei.value.code == 1 and "error: RuntimeError: boom" in err and "--debug" in err
    assert "Traceback" not in err
    for argv in (["--debug", "recipe", "schema"], ["recipe", "schema", "--debug"]):
        with pytest.raises(RuntimeError, match="boom"):
            main(argv)


@pytest.mark.parametrize("content,expected", [
    (b"\x89PNG\r\n\x1a\n\x00\xff", "not a text file"),
    (b"", "the recipe is empty"),
    (b"description: no name\n", "name: Field required"),
])
def test_bad_recipe_files_exit_2_with_one_problem_line(tmp_path, capsys, content, expected):
    f = tmp_path / "r.yaml"
    f.write_bytes(content)
    for cmd in ("recipe check", "optimize", "quantize"):
        with pytest.raises(SystemExit) as ei:
            main([*cmd.split(), str(f)])
        err = capsys.readouterr().err
        assert ei.value.code == 2 and expected in err and "Traceback" not in err


def test_export_verify_on_a_truncated_manifest(tmp_path, tiny_model_dir, capsys):
    from accel.export.checkpoint import write_export

    out = write_export(tmp_path / "export", tiny_model_dir)
    text = (out / "accel.json").read_text()
    (out / "accel.json").write_text(text[: len(text) // 2])
    with pytest.raises(SystemExit) as ei:
        main(["export", "verify", str(out), "--no-load"])
    err = capsys.readouterr().err
    assert ei.value.code == 1 and "accel.json is not valid JSON" in err and "truncated" in err
    assert "Traceback" not in err
