"""scripts/bench_peers.py's parsing and table, with a fake peer (the real run builds llama.cpp: not in CI)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_peers", Path(__file__).parents[1] / "scripts" / "bench_peers.py")
bench_peers = importlib.util.module_from_spec(_spec)
sys.modules["bench_peers"] = bench_peers  # its dataclasses look their module up there
_spec.loader.exec_module(bench_peers)

# what `llama-bench -o json -p 0 -n 128` prints (fields trimmed to the ones read, plus a few neighbours)
LLAMA_BENCH = json.dumps([{"build_commit": "abc", "model_type": "llama ?B Q8_0", "n_threads": 2, "n_prompt": 0,
                           "n_gen": 128, "avg_ns": 927000000, "avg_ts": 138.12, "stddev_ts": 1.5}])


def test_llama_bench_json_gives_the_generation_rate():
    assert bench_peers.parse_llama_bench(LLAMA_BENCH) == pytest.approx(138.12)
    pp_only = json.dumps([{"n_prompt": 512, "n_gen": 0, "avg_ts": 900.0}])
    with pytest.raises(ValueError, match="no generation test"):
        bench_peers.parse_llama_bench(pp_only)
    assert bench_peers.parse_llama_bench(pp_only, "pp") == pytest.approx(900.0)
    with pytest.raises(ValueError, match="no prompt test"):
        bench_peers.parse_llama_bench(LLAMA_BENCH, "pp")


def test_the_table_shows_each_side_and_the_ratio_of_the_same_repeat():
    row = bench_peers.Row("batch-1 decode, in-process", "int8", "tok/s", accel=[150.0, 140.0, 160.0],
                          peer=[100.0, 140.0, 80.0])
    assert row.ratios() == pytest.approx([1.5, 1.0, 2.0])
    table = bench_peers.render_table([row], {"read bandwidth": "30.0 GB/s"})
    line = table.splitlines()[2]
    assert "int8 / Q8_0" in line and "150.0 (140.0-160.0)" in line and "100.0 (80.0-140.0)" in line
    assert "1.50x (1.00-2.00)" in line and "read bandwidth: 30.0 GB/s" in table
    assert bench_peers.spread([]) == "-" and bench_peers.ratio_spread([]) == "-"


def test_streamed_bytes_count_an_int8_weight_once_in_whichever_layout_the_kernel_reads():
    import torch
    from torch import nn

    from accel.kernels.linear import Int8WeightOnlyLinear

    model = nn.Module()
    model.embed_tokens = nn.Embedding(10, 32)
    model.proj = Int8WeightOnlyLinear.from_linear(nn.Linear(32, 16, bias=False))
    expected = 16 * 32 + 16 * 4  # int8 weight + fp32 scales; the embedding table is not streamed
    assert bench_peers.streamed_bytes(model) == expected
    model.proj._vnni = torch.zeros(16, 32, dtype=torch.int8)  # the kernel layout, as on a VNNI CPU
    assert bench_peers.streamed_bytes(model) == expected


def test_exports_are_pairs_named_after_their_run_next_to_a_gguf_type(tmp_path):
    ck = tmp_path / "runs" / "compact" / "checkpoint"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    exports = bench_peers.parse_exports(f"{ck}:Q4_K_M")
    assert exports == {"compact": (ck, "Q4_K_M")}
    bench_peers.EXPORTS.update(exports)
    try:
        assert bench_peers.gguf_type("compact") == "Q4_K_M" and bench_peers.gguf_type("int8") == "Q8_0"
        row = bench_peers.Row("batch-1 decode, in-process", "compact", "tok/s", accel=[120.0], peer=[100.0])
        assert "| compact / Q4_K_M | 120.0" in bench_peers.render_table([row])
    finally:
        bench_peers.EXPORTS.clear()
    for bad in (f"{ck}:Q5_0", f"{tmp_path}:Q8_0", "Q8_0"):
        with pytest.raises(SystemExit, match="expected EXPORT_DIR:TYPE"):
            bench_peers.parse_exports(bad)


@pytest.mark.parametrize("crashes", [False, True])
def test_a_peer_whose_repacked_prompt_path_crashes_runs_without_repacking_everywhere(tmp_path, monkeypatch, crashes):
    # a fake llama-bench that segfaults on a prompt unless told `--repack 0`, as the native build does on some Xeons
    bench = tmp_path / "llama-bench"
    bench.write_text("#!/bin/sh\ncase \"$*\" in *'--repack 0'*) exit 0;; esac\n"
                     + ("kill -SEGV $$\n" if crashes else "exit 0\n"))
    bench.chmod(0o755)
    assert bench_peers.llama_repack_works(tmp_path, tmp_path / "m.gguf", 2) is not crashes
    launched = []
    monkeypatch.setattr(bench_peers.subprocess, "Popen", lambda cmd, **kw: launched.append(cmd))
    monkeypatch.setattr(bench_peers, "LLAMA_REPACK", not crashes)
    bench_peers.start_llama(tmp_path, tmp_path / "m.gguf", 2, 8080, 1)
    assert ("--no-repack" in launched[0]) is crashes


def test_busy_processes_hold_a_core_for_the_block_and_are_gone_after():
    import os

    with bench_peers.busy_processes(1):
        busy = [p for p in os.listdir("/proc") if p.isdigit() and _comm(p) == "yes" and _parent(p) == os.getpid()]
        assert len(busy) == 1
    assert not any(p.isdigit() and _comm(p) == "yes" and _parent(p) == os.getpid() for p in os.listdir("/proc"))
    assert bench_peers.kept([50.0, 45.0, 55.0], [100.0, 98.0, 102.0]) == "50% (45-55%)"


def _comm(pid: str) -> str:
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return ""


def _parent(pid: str) -> int:
    try:
        return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def test_the_vllm_cpu_peer_serves_the_export_folder_itself_and_is_named_in_the_table(tmp_path, monkeypatch):
    ck = tmp_path / "runs" / "vllm-cpu-w8a8" / "checkpoint"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    exports = bench_peers.parse_exports(str(ck), "vllm-cpu")
    assert exports == {"vllm-cpu-w8a8": (ck, None)}
    with pytest.raises(SystemExit, match="expected EXPORT_DIR:TYPE"):
        bench_peers.parse_exports(str(ck))  # llama.cpp needs a GGUF type beside it
    monkeypatch.setattr(bench_peers, "PEER", "vllm-cpu")
    bench_peers.EXPORTS.update(exports)
    try:
        rows = [bench_peers.Row("64 requests, HTTP", "vllm-cpu-w8a8", "tok/s", accel=[260.0], peer=[130.0]),
                bench_peers.Row("64 requests, HTTP", "fp32", "tok/s", accel=[200.0], peer=[100.0])]
        table = bench_peers.render_table(rows)
        assert "| section | accel / vLLM-CPU |" in table
        assert "| vllm-cpu-w8a8 / vLLM-CPU, same export | 260.0" in table and "2.00x" in table
        assert "| fp32 / vLLM-CPU fp32 |" in table
    finally:
        bench_peers.EXPORTS.clear()
    monkeypatch.setattr(sys, "argv", ["bench_peers.py", "--peer", "vllm-cpu", "--pairs", "int8"])
    with pytest.raises(SystemExit, match="allowed: fp32 and --exports folders"):
        bench_peers.main()


def test_streamed_bytes_count_a_packed_linears_panels_at_their_dtype():
    import pytest
    import torch
    from torch import nn

    from accel.kernels import cpu
    from accel.kernels.linear import PackedLinear

    if not cpu.has_avx512():
        pytest.skip("weight panels need AVX-512")
    model = nn.Module()
    model.embed_tokens = nn.Embedding(10, 32)
    model.proj = PackedLinear(nn.Linear(32, 96, bias=False), torch.float16)
    assert bench_peers.streamed_bytes(model) == 96 * 32 * 2  # two whole panels of 48 outputs, 2 bytes a weight
