"""Sources: builtin folder, JSONL / JSON / Parquet files, local `datasets` datasets; their error messages."""
import json

import pytest

from accel.calibration import BUILTIN_DIR, load_samples
from accel.recipe import CalibrationConfig

ROWS = [{"id": "r1", "text": "hello world", "domain": "chat"},
        {"id": "r2", "text": "def f(): pass", "domain": "code"},
        {"id": "r3", "text": "bonjour", "domain": "multilingual"}]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _key(samples):
    return [(s.id, s.domain, s.text) for s in samples]


EXPECTED = [("r1", "chat", "hello world"), ("r2", "code", "def f(): pass"), ("r3", "multilingual", "bonjour")]


def test_jsonl_json_parquet(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    jl = _jsonl(tmp_path / "d.jsonl", ROWS)
    js = tmp_path / "d.json"
    js.write_text(json.dumps(ROWS), encoding="utf-8")
    pq = tmp_path / "d.parquet"
    pd.DataFrame(ROWS).to_parquet(pq)
    for path in (jl, js, pq):
        assert _key(load_samples(CalibrationConfig(source=str(path)))) == EXPECTED, path


def test_builtin_with_root_and_domains_filter(tmp_path):
    _jsonl(tmp_path / "chat.jsonl", ROWS[:1])
    _jsonl(tmp_path / "code.jsonl", ROWS[1:2])
    assert _key(load_samples(CalibrationConfig(), root=tmp_path)) == EXPECTED[:2]
    got = load_samples(CalibrationConfig(domains=["code"]), root=tmp_path)
    assert _key(got) == EXPECTED[1:2]


def test_project_builtin_folder_loads_all_domains():
    samples = load_samples(CalibrationConfig())
    assert BUILTIN_DIR.name == "calibration_data"
    assert sorted({s.domain for s in samples}) == ["chat", "code", "math", "multilingual", "prose", "structured"]
    assert len(samples) >= 600


def test_missing_domain_field_means_default_and_custom_fields(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"body": "one two"}, {"body": "three"}])
    got = load_samples(CalibrationConfig(source=str(path), text_field="body"))
    assert [(s.id, s.domain, s.text) for s in got] == [("d-000000", "default", "one two"), ("d-000001", "default", "three")]


def test_hf_local_saved_dataset_and_data_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(saved))
    assert _key(load_samples(CalibrationConfig(source=f"hf:{saved}"))) == EXPECTED
    folder = tmp_path / "files"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", ROWS)
    assert _key(load_samples(CalibrationConfig(source=f"hf:{folder}"))) == EXPECTED
    with pytest.raises(ValueError, match=r"calibration.split 'validation' not in dataset .*available splits: \['train'\]"):
        load_samples(CalibrationConfig(source=f"hf:{folder}", split="validation"))


@pytest.mark.parametrize("source, exc, message", [
    ("missing.jsonl", FileNotFoundError, "calibration.source file not found: missing.jsonl"),
    ("data.csv", ValueError, r"unsupported file type '.csv'; use one of \['.jsonl', '.json', '.parquet'\]"),
    ("hf:HuggingFaceFW/fineweb", FileNotFoundError, "is not a local folder or file, and the Hugging Face Hub is not reachable"),
])
def test_source_errors(source, exc, message):
    with pytest.raises(exc, match=message):
        load_samples(CalibrationConfig(source=source))


def test_field_and_domain_errors(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(KeyError, match=r"text_field 'content' not found .* available fields: \['domain', 'id', 'text'\]"):
        load_samples(CalibrationConfig(source=str(path), text_field="content"))
    with pytest.raises(ValueError, match=r"domains names domain\(s\) \['math'\] .*available domains: \['chat', 'code', 'multilingual'\]"):
        load_samples(CalibrationConfig(source=str(path), domains=["math"]))
    with pytest.raises(ValueError, match=r"weights names domain\(s\) \['prose'\]"):
        load_samples(CalibrationConfig(source=str(path), allocation="weights", weights={"chat": 1, "prose": 2}))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        load_samples(CalibrationConfig(source=str(bad)))
    dup = _jsonl(tmp_path / "dup.jsonl", [ROWS[0], ROWS[0]])
    with pytest.raises(ValueError, match=r"duplicate ids, e.g. \['r1'\]"):
        load_samples(CalibrationConfig(source=str(dup)))


def test_empty_texts_are_skipped_with_a_warning(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", ROWS + [{"id": "r4", "text": "  ", "domain": "chat"}])
    with pytest.warns(UserWarning, match="skipped 1 sample"):
        assert len(load_samples(CalibrationConfig(source=str(path)))) == 3
