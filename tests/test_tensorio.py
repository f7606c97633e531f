"""safetensors written and read one tensor at a time (`accel.tensorio`): what safetensors itself reads back, shards
with transformers' index, reads into a caller's buffer, and clear errors for what does not fit."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from accel.tensorio import INDEX, TensorFiles, TensorSpec, write_folder

TENSORS = {"a.weight": torch.randn(3, 5), "b.bias": torch.arange(7, dtype=torch.int32),
           "c": torch.randn(2, 2).half(), "d": torch.randn(4).bfloat16(), "e": torch.tensor([True, False]),
           "empty": torch.zeros(0, 3), "q": torch.randint(-128, 127, (6, 8), dtype=torch.int8)}


def _specs(tensors):
    return [TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]


def test_written_file_is_what_safetensors_reads(tmp_path):
    seen = []
    files = write_folder(tmp_path, _specs(TENSORS), iter(TENSORS.values()), progress=seen.append)
    assert [f.name for f in files] == ["model.safetensors"]
    back = load_file(str(files[0]))
    assert set(back) == set(TENSORS)
    for k, v in TENSORS.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    assert sum(seen) == sum(s.nbytes for s in _specs(TENSORS))


def test_shards_and_index_as_transformers_reads_them(tmp_path):
    big = {f"layer{i}.weight": torch.randn(64, 64) for i in range(5)}  # 16 KiB each
    files = write_folder(tmp_path, _specs(big), iter(big.values()), max_shard_bytes=40 << 10)
    assert [f.name for f in files] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index = json.loads((tmp_path / INDEX).read_text())
    assert index["metadata"]["total_size"] == 5 * 64 * 64 * 4
    assert set(index["weight_map"]) == set(big)
    reader = TensorFiles(tmp_path)
    for k, v in big.items():
        assert torch.equal(reader.read(k), v)


def test_reader_reads_safetensors_files_and_into_a_buffer(tmp_path):
    save_file(TENSORS, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    files = TensorFiles(tmp_path)
    assert set(files.names()) == set(TENSORS) and files.metadata == {"format": "pt"}
    for k, v in TENSORS.items():
        assert torch.equal(files.read(k), v), k
    out = torch.empty(3, 5)
    assert files.read("a.weight", out=out) is out and torch.equal(out, TENSORS["a.weight"])
    with pytest.raises(ValueError, match="cannot read torch.float32 \\[3, 5\\] into torch.float16"):
        files.read("a.weight", out=torch.empty(3, 5, dtype=torch.float16))
    assert files.read_as("c", torch.float32).dtype == torch.float32


def test_a_truncated_file_is_named(tmp_path):
    save_file({"w": torch.randn(100, 100)}, str(tmp_path / "model.safetensors"))
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(OSError, match="'w' ends early"):
        TensorFiles(tmp_path).read("w")


def test_writer_refuses_a_tensor_unlike_its_spec(tmp_path):
    specs = [TensorSpec("w", torch.float32, (2, 2))]
    with pytest.raises(ValueError, match="w: got torch.float32 \\[3, 2\\], declared torch.float32 \\[2, 2\\]"):
        write_folder(tmp_path, specs, iter([torch.zeros(3, 2)]))
    with pytest.raises(ValueError, match="more tensors than the 1 specs"):
        write_folder(tmp_path, specs, iter([torch.zeros(2, 2), torch.zeros(1)]))
