"""scripts/gpu_check.py (the CUDA path's bounded check) dry-runs on CPU, so it cannot rot between GPU sessions."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).parents[2] / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check  # its dataclasses look their module up by name
_spec.loader.exec_module(gpu_check)


def test_cpu_dry_run_of_a_few_checks_passes_and_writes_json(tmp_path):
    out = tmp_path / "gpu_check.json"
    threads = torch.get_num_threads()
    try:
        rc = gpu_check.main(["--device", "cpu", "--quick", "--threads", "1", "--json", str(out), "--only",
                             "greedy_fp32/chunked_prefill,spec/self_draft_int8/one_batch,sampled_spec/ngram"])
    finally:
        torch.set_num_threads(threads)
    checks = json.loads(out.read_text())["checks"]
    assert rc == 0
    assert [c["name"] for c in checks] == ["greedy_fp32/chunked_prefill", "spec/self_draft_int8/one_batch",
                                           "sampled_spec/ngram"]
    assert all(c["status"] == "PASS" for c in checks), [(c["name"], c["failures"], c["error"]) for c in checks]
    spec = checks[1]["details"]
    assert 0 < spec["acceptance_rate"] < 1 and spec["exact"] == "12/12"  # accepted and rejected drafts, exact


def test_a_failed_requirement_fails_the_run(tmp_path, monkeypatch):
    oracle = gpu_check.hf_greedy
    monkeypatch.setattr(gpu_check, "hf_greedy", lambda *a: [t + 1 for t in oracle(*a)])  # a wrong oracle
    rc = gpu_check.main(["--device", "cpu", "--quick", "--threads", "1", "--json", str(tmp_path / "r.json"),
                         "--only", "greedy_fp32/one_batch"])
    torch.set_num_threads(1)
    (check,) = json.loads((tmp_path / "r.json").read_text())["checks"]
    assert rc == 1 and check["status"] == "FAIL" and "outputs differ from HF greedy" in check["failures"]


def test_in_a_fresh_interpreter_the_runtime_imports_nothing_the_gpu_machine_lacks(tmp_path):
    """The GPU machine has no pydantic, fastapi, llmcompressor, ... (the env check; here in its own process, since
    this test session has imported them all)."""
    import subprocess

    out = tmp_path / "env.json"
    script = Path(__file__).parents[2] / "scripts" / "gpu_check.py"
    proc = subprocess.run([sys.executable, str(script), "--device", "cpu", "--quick", "--threads", "1", "--only",
                           "env", "--json", str(out)], capture_output=True, text=True, timeout=300)
    (check,) = json.loads(out.read_text())["checks"]
    assert proc.returncode == 0 and check["status"] == "PASS", proc.stdout[-2000:] + proc.stderr[-2000:]
    assert check["details"]["absent_on_gpu_machine_but_imported"] == []
