from __future__ import annotations

import json

import pytest

from accel.recipe import parse_recipe
from accel.pipeline.stages import MANIFEST, Stage, run_stages

MODEL = {"path": "smollm2-135m"}


def _stages(calls, crash_in=None):
    def calibrate(ctx):
        calls.append("calibrate")
        (ctx.out_dir / "calibration.jsonl").write_text(f"seed={ctx.recipe.calibration.seed}\n")
        return {"n": 1}

    def plan(ctx):
        calls.append("plan")
        (ctx.out_dir / "plan.json").write_text("{partial")
        if crash_in == "plan":
            raise KeyboardInterrupt
        (ctx.out_dir / "plan.json").write_text(json.dumps({"budget": ctx.recipe.quantization.budget.max_mean_kl,
                                                           "upstream": ctx.summaries["calibrate"]["n"]}))
        return {}

    def export(ctx):
        calls.append("export")
        (ctx.out_dir / "checkpoint").mkdir()
        (ctx.out_dir / "checkpoint" / "w.bin").write_bytes(b"w")
        return {}

    return [
        Stage("calibrate", calibrate, sections=("model", "calibration"), outputs=("calibration.jsonl",)),
        Stage("plan", plan, sections=("quantization",), after=("calibrate",), outputs=("plan.json",)),
        Stage("export", export, sections=("export",), after=("plan",), outputs=("checkpoint",)),
    ]


def test_rerun_reuses_every_stage(tmp_path):
    recipe = parse_recipe({"name": "t", "model": MODEL})
    calls = []
    recs = run_stages(_stages(calls), recipe, tmp_path)
    assert calls == ["calibrate", "plan", "export"] and all(r.status == "ran" for r in recs.values())
    calls.clear()
    recs = run_stages(_stages(calls), recipe, tmp_path)
    assert calls == [] and all(r.status == "reused" for r in recs.values())
    assert recs["calibrate"].summary == {"n": 1}


def test_changed_section_reruns_that_stage_and_downstream_only(tmp_path):
    calls = []
    run_stages(_stages(calls), parse_recipe({"name": "t", "model": MODEL}), tmp_path)
    calls.clear()
    run_stages(_stages(calls), parse_recipe({"name": "t", "model": MODEL,
                                             "quantization": {"budget": {"max_mean_kl": 0.5}}}),
               tmp_path)
    assert calls == ["plan", "export"]  # plan.json changed, so export (downstream) runs again
    assert json.loads((tmp_path / "plan.json").read_text())["budget"] == 0.5
    calls.clear()
    run_stages(_stages(calls), parse_recipe({"name": "t", "model": MODEL, "calibration": {"seed": 3},
                                             "quantization": {"budget": {"max_mean_kl": 0.5}}}), tmp_path)
    # plan runs again on the new calibration but writes the same plan.json, so export is reused (content-addressed)
    assert calls == ["calibrate", "plan"]


def test_interrupt_keeps_finished_stages_and_leaves_no_partial_file(tmp_path):
    recipe = parse_recipe({"name": "t", "model": MODEL})
    calls = []
    with pytest.raises(KeyboardInterrupt):
        run_stages(_stages(calls, crash_in="plan"), recipe, tmp_path)
    assert (tmp_path / "calibration.jsonl").is_file()
    assert not (tmp_path / "plan.json").exists()
    assert not list(tmp_path.glob(".stage-*"))
    manifest = json.loads((tmp_path / MANIFEST).read_text())["stages"]
    assert list(manifest) == ["calibrate"]
    calls.clear()
    run_stages(_stages(calls), recipe, tmp_path)
    assert calls == ["plan", "export"]


def test_tampered_output_is_rebuilt(tmp_path):
    recipe = parse_recipe({"name": "t", "model": MODEL})
    calls = []
    run_stages(_stages(calls), recipe, tmp_path)
    (tmp_path / "checkpoint" / "w.bin").write_bytes(b"tampered")
    calls.clear()
    run_stages(_stages(calls), recipe, tmp_path)
    assert calls == ["export"]


def test_stage_must_write_declared_outputs(tmp_path):
    st = [Stage("lazy", lambda ctx: {}, outputs=("x.json",))]
    with pytest.raises(RuntimeError, match="did not write"):
        run_stages(st, parse_recipe({"name": "t", "model": MODEL}), tmp_path)


def test_dotted_sections_key_only_on_that_field(tmp_path):
    calls = []

    def sens(ctx):
        calls.append("sens")
        (ctx.out_dir / "s.json").write_text(str(ctx.recipe.quantization.int4_group_size))
        return {}

    st = [Stage("sens", sens, sections=("quantization.int4_group_size",), outputs=("s.json",))]
    run_stages(st, parse_recipe({"name": "t", "model": MODEL, "quantization": {"method": "gptq"}}), tmp_path)
    run_stages(st, parse_recipe({"name": "t", "model": MODEL, "quantization": {"method": "rtn"}}), tmp_path)  # another field: reused
    assert calls == ["sens"]
    run_stages(st, parse_recipe({"name": "t", "model": MODEL,
                                 "quantization": {"method": "rtn", "int4_group_size": 32}}), tmp_path)
    assert calls == ["sens", "sens"]


def test_sigterm_during_a_stage_leaves_no_temp_folder(tmp_path):
    """`accel optimize` turns SIGTERM into Ctrl-C (terminate_as_interrupt), so the stage's temp folder goes."""
    import signal
    import subprocess
    import sys
    import time

    script = f"""
import sys, time
from pathlib import Path
from accel.cli import terminate_as_interrupt
from accel.recipe import parse_recipe
from accel.pipeline.stages import Stage, run_stages

def slow(ctx):
    (ctx.out_dir / "started").write_text("x")
    time.sleep(60)

with terminate_as_interrupt():
    try:
        run_stages([Stage("slow", slow, sections=("model",), outputs=("out.txt",))],
                   parse_recipe({{"name": "t", "model": {MODEL!r}}}), Path(sys.argv[1]))
    except KeyboardInterrupt:
        sys.exit(130)
"""
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)])
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".stage-*/started")):
        assert time.monotonic() < deadline and proc.poll() is None, "the stage never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 130
    assert not list(tmp_path.glob(".stage-*"))
