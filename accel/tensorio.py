"""safetensors files read and written one tensor at a time, so memory holds one tensor, not the model.

Why by hand (the format is an 8-byte header length, a JSON header, then the raw bytes): safetensors' own
`save_file` needs every tensor in memory at once, and its reader maps the file, whose touched pages count in the
process's RSS until it is unmapped (reading a 6 GB fp32 model through it holds 6 GB beside the model it fills).
Here a writer takes the header up front and the tensors as they are made; a reader `pread`s each tensor into a
buffer of the caller's choosing (the parameter it fills), leaving the rest in the page cache, which the kernel
reclaims.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
CODES = {v: k for k, v in DTYPES.items()}
INDEX = "model.safetensors.index.json"
_IO_CHUNK = 1 << 30  # bytes per pread/write call (Linux moves at most ~2 GiB per call)


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # of the first byte in the file
    nbytes: int


def _header(path: Path) -> tuple[dict, int]:
    """(the JSON header, the offset of the data) of a safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)), 8 + n


def weight_files(folder: Path) -> list[Path]:
    """A folder's weight files: those its index names, else every *.safetensors."""
    index = folder / INDEX
    if index.is_file():
        return [folder / n for n in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    return files


class TensorFiles:
    """The tensors of a folder's (or a list of) safetensors files, by name; each read on demand with `pread`."""

    def __init__(self, source: str | os.PathLike | list[Path]) -> None:
        files = weight_files(Path(source)) if not isinstance(source, list) else source
        self.infos: dict[str, TensorInfo] = {}
        self.metadata: dict[str, str] = {}
        for f in files:
            header, base = _header(f)
            self.metadata.update(header.pop("__metadata__", None) or {})
            for name, h in header.items():
                if h["dtype"] not in DTYPES:
                    raise ValueError(f"{f}: tensor {name!r} has dtype {h['dtype']}; readable: {', '.join(DTYPES)}")
                start, end = h["data_offsets"]
                self.infos[name] = TensorInfo(f, DTYPES[h["dtype"]], tuple(h["shape"]), base + start, end - start)

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    def __iter__(self) -> Iterator[str]:
        return iter(self.infos)

    def names(self) -> list[str]:
        return list(self.infos)

    def nbytes(self, names: Iterable[str] | None = None) -> int:
        return sum(self.infos[n].nbytes for n in (self.infos if names is None else names))

    def read(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """Tensor `name` as stored, into `out` when given (a contiguous CPU tensor of its dtype and element count,
        e.g. the parameter it fills), else into a new tensor."""
        return self._read(self.infos[name], name, out)

    @staticmethod
    def _read(info: TensorInfo, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            out = torch.empty(info.shape, dtype=info.dtype)
        elif out.dtype != info.dtype or out.numel() * out.element_size() != info.nbytes or not out.is_contiguous():
            raise ValueError(f"{name}: cannot read {info.dtype} {list(info.shape)} into {out.dtype} "
                             f"{list(out.shape)}")
        if info.nbytes:
            view = memoryview(out.reshape(-1).view(torch.uint8).numpy())
            with open(info.file, "rb", buffering=0) as f:
                fd, done = f.fileno(), 0
                while done < info.nbytes:
                    n = os.preadv(fd, [view[done:done + _IO_CHUNK]], info.offset + done)
                    if n <= 0:
                        raise OSError(f"{info.file}: tensor {name!r} ends early (file truncated?)")
                    done += n
        return out

    def read_rows(self, name: str, start: int, end: int) -> torch.Tensor:
        """Rows [start, end) of tensor `name` (along its first dimension), read alone."""
        info = self.infos[name]
        row = info.nbytes // info.shape[0]
        part = TensorInfo(info.file, info.dtype, (end - start, *info.shape[1:]), info.offset + start * row,
                          (end - start) * row)
        return TensorFiles._read(part, name)

    def read_as(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        t = self.read(name)
        return t if t.dtype == dtype else t.to(dtype)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = torch.empty(0, dtype=self.dtype).element_size()
        for d in self.shape:
            n *= d
        return n


def write_folder(folder: Path, specs: list[TensorSpec], tensors: Iterable[torch.Tensor], *,
                 max_shard_bytes: int = 4 << 30, metadata: dict[str, str] | None = None,
                 progress=None) -> list[Path]:
    """Write `tensors` (yielded in the order of `specs`, each matching its spec) into `folder` as
    model.safetensors, or as model-0000i-of-0000n.safetensors shards of at most `max_shard_bytes` with the
    index transformers reads. Only the tensor being written is held. `progress(nbytes)` after each tensor."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        if shards[-1] and size + s.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    it = iter(tensors)
    for name, shard in zip(names, shards):
        _write_file(folder / name, shard, it, metadata or {"format": "pt"}, progress)
    if next(it, None) is not None:
        raise ValueError(f"more tensors than the {len(specs)} specs")
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(s.nbytes for s in specs)},
                 "weight_map": {s.name: n for n, shard in zip(names, shards) for s in shard}}
        (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return [folder / n for n in names]


def _write_file(path: Path, specs: list[TensorSpec], tensors: Iterator[torch.Tensor], metadata: dict,
                progress) -> None:
    header: dict = {"__metadata__": metadata}
    offset = 0
    for s in specs:
        header[s.name] = {"dtype": CODES[s.dtype], "shape": list(s.shape), "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for s in specs:
            t = next(tensors, None)
            if t is None:
                raise ValueError(f"{path.name}: no tensor for {s.name!r}")
            if t.dtype != s.dtype or tuple(t.shape) != s.shape:
                raise ValueError(f"{s.name}: got {t.dtype} {list(t.shape)}, declared {s.dtype} {list(s.shape)}")
            data = memoryview(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
            for start in range(0, len(data), _IO_CHUNK):
                f.write(data[start:start + _IO_CHUNK])
            if progress is not None:
                progress(s.nbytes)
