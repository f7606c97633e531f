"""Files accel writes get the process's normal mode (a server under another account must read an export)."""

from __future__ import annotations

import os
import stat

import pytest

from accel.export.checkpoint import write_export
from accel.fsutil import atomic_dir, atomic_write_text


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(p) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_atomic_writes_follow_the_umask(tmp_path, umask_022):
    atomic_write_text(tmp_path / "a.json", "{}")
    assert _mode(tmp_path / "a.json") == 0o644
    with atomic_dir(tmp_path / "d") as tmp:
        (tmp / "w.bin").write_bytes(b"x")
        (tmp / "w.bin").chmod(0o600)  # as transformers' save_pretrained writes model.safetensors
    assert _mode(tmp_path / "d") == 0o755 and _mode(tmp_path / "d" / "w.bin") == 0o644


def test_an_export_is_readable_by_other_accounts(tmp_path, tiny_model_dir, umask_022):
    out = write_export(tmp_path / "export", tiny_model_dir)
    modes = {p.name: _mode(p) for p in out.iterdir() if p.is_file()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes
