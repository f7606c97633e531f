"""The memory budget (`accel.memory`): ACCEL_MEMORY_LIMIT, a cgroup's limit and MemAvailable, the one-line refusal with
the numbers before any weight is read, and commands that fit a limit staying under it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel import memory
from accel.memory import ENV, MemoryLimitError, Need, budget, check_fits, parse_bytes

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("text,value", [("123", 123), ("12G", 12 << 30), ("1.5g", int(1.5 * (1 << 30))),
                                        ("800M", 800 << 20), ("800MiB", 800 << 20), ("2GB", 2 << 30),
                                        (" 64K ", 64 << 10)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "twelve", "12X", "-1G", "1e9"])
def test_parse_bytes_refuses_naming_the_value(text):
    with pytest.raises(ValueError, match=f"{ENV}={text!r} is invalid; allowed"):
        parse_bytes(text)


def test_the_env_limit_caps_the_budget_and_a_need_over_it_is_one_line(monkeypatch):
    monkeypatch.setenv(ENV, "1G")
    b = budget()
    assert b.bytes == 1 << 30 and b.source == f"{ENV}=1G"
    need = Need("model X at int4", {"weights": 2_000_000_000, "KV cache": 500_000_000}, base=300_000_000)
    with pytest.raises(MemoryLimitError) as e:
        check_fits(need, "lower kv_cache_memory_gb")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == ("model X at int4 needs 2.80 GB (weights 2.00 + KV cache 0.50 + this process 0.30) but "
                   "ACCEL_MEMORY_LIMIT=1G allows 1.07 GB; lower kv_cache_memory_gb")
    check_fits(Need("small", {"weights": 1000}, base=0))


def test_cgroup_limits_v1_and_v2_count_what_is_used(tmp_path):
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("4:memory:/job\n0::/\n")
    (cg / "memory" / "job").mkdir(parents=True)
    (cg / "memory" / "job" / "memory.limit_in_bytes").write_text("8000\n")
    (cg / "memory" / "job" / "memory.usage_in_bytes").write_text("3000\n")
    assert memory._cgroup_room(proc, cg) == 5000
    (cg / "memory" / "job" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    (proc / "self" / "cgroup").write_text("4:memory:/job\n0::/svc\n")
    (cg / "svc").mkdir()
    (cg / "svc" / "memory.max").write_text("max\n")
    assert memory._cgroup_room(proc, cg) is None
    (cg / "svc" / "memory.max").write_text("10000\n")
    (cg / "svc" / "memory.current").write_text("2500\n")
    assert memory._cgroup_room(proc, cg) == 7500


def _generate(model_dir: Path, limit: str | None, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ACCEL_DISABLE_CPU_KERNELS": os.environ.get("ACCEL_DISABLE_CPU_KERNELS", "")}
    env.pop(ENV, None)
    if limit:
        env[ENV] = limit
    return subprocess.run([sys.executable, "-m", "accel", "generate", str(model_dir), "hello", "--raw",
                           "--max-tokens", "4", *extra], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)


@pytest.mark.slow
def test_generate_refuses_a_limit_it_cannot_fit_and_keeps_under_one_it_can(tiny_model_dir):
    small = _generate(tiny_model_dir, "50M")
    assert small.returncode == 2, small.stderr
    err = " ".join(small.stderr.split())
    assert f"needs" in err and f"{ENV}=50M allows 0.05 GB" in err and "Traceback" not in small.stderr
    fits = _generate(tiny_model_dir, "3G", "--quant", "int8")
    assert fits.returncode == 0, fits.stderr
    line = " ".join(fits.stderr.split())
    peak = float(line.split("peak RSS ")[1].split(" GB")[0])
    assert peak <= 3 * (1 << 30) / 1e9
    assert "weights" in line and "KV cache" in line


def test_peak_is_this_process_not_the_parent_it_was_started_from():
    """A child started by a process holding 300 MB reports its own peak (ru_maxrss would carry the parent's)."""
    import torch

    ballast = torch.ones(300 << 20, dtype=torch.uint8)  # noqa: F841 - held while the child starts
    out = subprocess.run([sys.executable, "-c", "from accel.memory import peak_rss; print(peak_rss())"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    assert int(out.stdout) < 250 << 20


def test_reset_peak_starts_a_new_high_water_mark():
    """A stage's peak is its own: after reset_peak the mark is what the process holds now, not an earlier high."""
    import torch

    from accel.memory import current_rss, peak_rss, reset_peak

    ballast = torch.ones(200 << 20, dtype=torch.uint8)
    high = peak_rss()
    del ballast
    if not reset_peak():
        pytest.skip("this kernel does not let a process reset its high-water mark (/proc/self/clear_refs)")
    assert peak_rss() < high - (150 << 20)
    assert peak_rss() >= current_rss() - (8 << 20)


def test_large_blocks_stay_mapped_until_the_outermost_block_ends(monkeypatch):
    """A stage's batch work (sensitivity, GPTQ, evaluation) and the model loads inside it map their large blocks; an
    inner block's end must not hand the outer one back to glibc's heaps."""
    from accel import memory

    calls = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append(value)

        def malloc_trim(self, pad):
            calls.append("trim")

    monkeypatch.setattr(memory, "_libc", lambda: FakeLibc())
    mapped, steady = memory._LOAD_MMAP_THRESHOLD, memory.STEADY_MMAP_THRESHOLD
    with memory.large_blocks_mapped():
        with memory.large_blocks_mapped():
            pass
        assert calls == [mapped, mapped, mapped, "trim"]  # the inner end keeps blocks mapped
    assert calls[-2:] == [steady, "trim"] and memory._mapped_depth[0] == 0
    try:
        with memory.large_blocks_mapped():
            raise KeyError("a failing stage")
    except KeyError:
        pass
    assert calls[-2:] == [steady, "trim"] and memory._mapped_depth[0] == 0
