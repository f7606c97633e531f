"""The CLI commands that drive the runtime, on a tiny random model."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from accel.cli import app

runner = CliRunner()


def test_bench_in_process_writes_result(tmp_path, tiny_model_dir):
    out = tmp_path / "bench.json"
    res = runner.invoke(app, ["bench", "--model", str(tiny_model_dir), "--num-requests", "4", "--concurrency", "2",
                              "--prompt-tokens", "4,8", "--output-tokens", "2,4", "--warmup", "0",
                              "--out", str(out), "--report", str(tmp_path / "report")])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["num_requests"] == 4 if "num_requests" in data else data
    assert (tmp_path / "report" / "report.html").is_file()


def test_bench_rejects_bad_arguments():
    res = runner.invoke(app, ["bench", "--model", "x", "--arrival", "uniform"])
    assert res.exit_code == 2 and "uniform" in res.output and "poisson" in res.output
    res = runner.invoke(app, ["bench"])
    assert res.exit_code == 2 and "--url" in res.output


def test_generate_streams_text(tiny_model_dir):
    res = runner.invoke(app, ["generate", str(tiny_model_dir), "The quick brown", "--max-tokens", "5", "--raw"])
    assert res.exit_code == 0, res.output
    assert "TTFT" in res.output and " tokens" in res.output


def test_generate_rejects_bad_sampling_value(tiny_model_dir):
    res = runner.invoke(app, ["generate", str(tiny_model_dir), "hi", "--top-p", "1.5"])
    assert res.exit_code == 2 and "top_p" in res.output


def test_eval_prints_table_and_writes_json(tmp_path, tiny_model_dir):
    out = tmp_path / "eval.json"
    res = runner.invoke(app, ["eval", str(tiny_model_dir), "--baseline", str(tiny_model_dir), "--domains", "code",
                              "--window", "32", "--max-windows", "1", "--no-tasks", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["overall"]["kl_mean"] == 0.0 or abs(data["overall"]["kl_mean"]) < 1e-6


def test_eval_unknown_domain_is_a_clear_error(tiny_model_dir):
    res = runner.invoke(app, ["eval", str(tiny_model_dir), "--domains", "poetry", "--no-tasks"])
    assert res.exit_code == 2 and "poetry" in res.output


def test_serve_refuses_a_bad_draft_confidence_before_loading(tiny_model_dir):
    res = runner.invoke(app, ["serve", str(tiny_model_dir), "--speculative-config",
                              '{"method": "ngram", "draft_min_path_confidence": 0.5}'])
    assert res.exit_code == 2 and "needs a draft model" in res.output
    res = runner.invoke(app, ["serve", str(tiny_model_dir), "--speculative-config",
                              json.dumps({"draft_model": str(tiny_model_dir), "draft_min_path_confidence": 0})])
    assert res.exit_code == 2 and "draft_min_path_confidence=0 is invalid" in res.output and "(0, 1)" in res.output


def test_serve_hands_num_scheduler_steps_to_the_engine_and_refuses_zero(tiny_model_dir, monkeypatch):
    import accel.server

    got = {}
    monkeypatch.setattr(accel.server, "run_server", lambda model, **kw: got.update(kw))
    res = runner.invoke(app, ["serve", str(tiny_model_dir), "--num-scheduler-steps", "1"])
    assert res.exit_code == 0 and got["num_scheduler_steps"] == 1
    res = runner.invoke(app, ["serve", str(tiny_model_dir), "--num-scheduler-steps", "0"], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "--num-scheduler-steps" in res.output and ">= 1" in res.output
