"""Atomic file and folder writes, and hashing.

Every result accel writes (a converted model, a run folder stage, an export) is first written beside its final
place and then renamed, so an interrupted run never leaves a half-written result under the final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_dir(final: Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder beside `final`; on success rename it to `final`, on error remove it.

    The temp folder lives in the same parent so the rename is atomic on POSIX filesystems.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    tmp.chmod(0o777 & ~process_umask())  # mkdtemp makes it 0700; the result is an ordinary folder
    try:
        yield tmp
        normalize_modes(tmp)
        if final.exists():
            if not overwrite:
                raise FileExistsError(f"{final} already exists")
            old = final.with_name(f".old-{final.name}-{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def process_umask() -> int:
    """The process's umask (read by setting it and putting it back: POSIX has no read-only call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def normalize_modes(root: Path) -> None:
    """Give every file and folder under `root` the mode the process's umask gives a new one (0644 / 0755 with
    the usual 022). Some writers (transformers' save_pretrained, mkstemp) make files 0600, which a server running
    under another account (vLLM, say) cannot read."""
    mask = process_umask()
    for p in [Path(root), *Path(root).rglob("*")]:
        if p.is_symlink():
            continue
        p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        # mkstemp makes the file 0600; the result is an ordinary file another account (a server) can read
        os.fchmod(fd, 0o666 & ~process_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def remove_stale_temps(parent: Path) -> None:
    """Remove `.tmp-*` leftovers of interrupted writes in `parent` (not of live ones: callers hold no lock, so only
    call this where a concurrent writer is not expected, e.g. before a pull)."""
    if not Path(parent).is_dir():
        return
    for p in Path(parent).glob(".tmp-*"):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file (blank lines skipped); a bad line raises ValueError naming `path:line`."""
    rows = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: each line must be a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows
