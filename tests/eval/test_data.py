import pytest

from accel.eval.data import load_tasks, load_texts

from .conftest import write_jsonl


def test_loaders_read_rows_in_file_order(eval_dirs):
    text, tasks = eval_dirs
    texts = load_texts(text)
    assert list(texts) == ["code", "prose"]  # sorted file names
    assert [d.id for d in texts["prose"]] == ["p1", "p2"]
    t = load_tasks(tasks, ["multiple_choice"])
    assert t["multiple_choice"][0].choices == ("x", "y") and t["multiple_choice"][0].answer == "B"


def test_bad_rows_are_rejected_with_their_location(tmp_path):
    write_jsonl(tmp_path / "t.jsonl", [{"id": "1", "prompt": "p", "answer": "a", "match": "fuzzy"}])
    with pytest.raises(ValueError, match=r"t.jsonl row 1: match must be one of .* got 'fuzzy'"):
        load_tasks(tmp_path)
    write_jsonl(tmp_path / "u.jsonl", [{"id": "1", "prompt": "p"}])
    with pytest.raises(ValueError, match=r"u.jsonl row 1: missing field\(s\) \['answer', 'match'\]"):
        load_tasks(tmp_path, ["u"])
    (tmp_path / "v.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match=r"v.jsonl:1: not valid JSON"):
        load_texts(tmp_path, ["v"])


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_texts(tmp_path / "nowhere")
