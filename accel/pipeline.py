"""`accel optimize`: the whole pipeline as resumable stages over one run folder.

STATUS: draft, not wired into the CLI and not yet run end to end (issue 8). The stage functions follow the APIs of
accel.calibration / accel.quant / accel.spec / accel.eval / accel.report as they landed; the evaluate stage still
lacks the speed workloads and the variant list, and the export stage needs eval's "summary".

    load -> calibrate -> sensitivity -> plan -> quantize -> draft -> evaluate -> report -> export

Each stage writes its files into `runs/<name>/` (see `accel.stages` for reuse and atomicity). Heavy in-memory
objects (the model, the tokenizer, the calibration draw) live in `state` and are rebuilt lazily, so a stage that
runs after reused stages finds what it needs.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accel.fsutil import atomic_write_text
from accel.recipe import Recipe, dump_recipe
from accel.stages import Stage, StageContext, StageRecord, run_stages

PROJECT_ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------- lazy shared objects


def model_path(ctx: StageContext) -> Path:
    if "model_path" not in ctx.state:
        from accel.models import resolve_model

        ctx.state["model_path"] = resolve_model(ctx.recipe.model.path, pull_if_missing=True)
    return ctx.state["model_path"]


def _model_fingerprint(recipe: Recipe) -> str:
    """Identity of the target model for stage keys: its config and weight file sizes/mtimes (cheap, no hashing)."""
    from accel.models import resolve_model

    try:
        p = resolve_model(recipe.model.path)
    except FileNotFoundError:
        return recipe.model.path
    return json.dumps({f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(p.iterdir()) if f.is_file()})


def tokenizer(ctx: StageContext):
    if "tokenizer" not in ctx.state:
        from transformers import AutoTokenizer

        ctx.state["tokenizer"] = AutoTokenizer.from_pretrained(model_path(ctx))
    return ctx.state["tokenizer"]


def fresh_model(ctx: StageContext):
    """A new fp32 copy of the target (quantization modifies models in place, so stages never share one)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path(ctx), dtype=torch.float32).eval()


def calibration_draw(ctx: StageContext):
    """The stratified draw; deterministic (seeded), so it is recomputed rather than stored with token ids."""
    if "draw" not in ctx.state:
        from accel.calibration import load_samples, stratified_draw

        cfg = ctx.recipe.calibration
        root = PROJECT_ROOT / "calibration_data" if cfg.source == "builtin" else None
        ctx.state["draw"] = stratified_draw(load_samples(cfg, root=root), tokenizer(ctx), cfg)
    return ctx.state["draw"]


def _batches(units, max_seq_len: int, limit_rows: int | None = None, batch_size: int = 4):
    from accel.calibration import to_batches

    out, rows = [], 0
    for b in to_batches(units, max_seq_len, batch_size):
        if b.shape[1] < 16:  # a short tail row adds nothing but noise
            continue
        if limit_rows is not None and rows + b.shape[0] > limit_rows:
            b = b[: limit_rows - rows]
        if b.shape[0]:
            out.append(b)
            rows += b.shape[0]
        if limit_rows is not None and rows >= limit_rows:
            break
    return out


# ------------------------------------------------------------------------------------------------------ stages


def stage_calibrate(ctx: StageContext) -> dict:
    from accel.calibration import write_draw

    draw = calibration_draw(ctx)
    write_draw(draw, ctx.out_dir)
    return {"num_train": len(draw.train), "num_holdout": len(draw.holdout),
            "train_tokens": sum(u.num_tokens for u in draw.train), "notes": list(draw.notes)[:20]}


def stage_sensitivity(ctx: StageContext) -> dict:
    from accel.quant.sensitivity import measure_sensitivity

    q = ctx.recipe.quantization
    cands = [c for c in q.candidates if c != "fp16"]
    batches = _batches(calibration_draw(ctx).train, q.sensitivity.max_seq_len, q.sensitivity.num_samples)
    sens = measure_sensitivity(fresh_model(ctx), batches, cands or ["int8"], q.int4_group_size,
                               metric=q.sensitivity.metric, progress=True)
    sens.to_json(ctx.out_dir / "sensitivity.json")
    try:
        from accel.quant.heatmap import plot_sensitivity

        plot_sensitivity(sens, ctx.out_dir / "sensitivity.png")
    except ImportError:
        pass
    if not (ctx.out_dir / "sensitivity.png").exists():
        (ctx.out_dir / "sensitivity.png").write_bytes(b"")
    return {"seconds": round(sens.seconds, 1), "num_modules": len(sens.damage), "num_tokens": sens.num_tokens}


def stage_plan(ctx: StageContext) -> dict:
    from accel.quant.allocate import Budget, Rules, allocate, check_and_fallback
    from accel.quant.schemes import in_features_of, param_counts
    from accel.quant.sensitivity import SensitivityResult

    q = ctx.recipe.quantization
    sens = SensitivityResult.from_json(ctx.upstream_path("sensitivity.json"))
    model = fresh_model(ctx)
    names = sens.modules()
    counts, inf = param_counts(model, names), in_features_of(model, names)
    budget = Budget.from_config(q.budget)
    plan = allocate(sens, budget, counts, Rules.from_config(q), inf)
    holdout = _batches(calibration_draw(ctx).holdout, q.sensitivity.max_seq_len, q.sensitivity.num_samples)
    if holdout and budget.kl_limit() is not None:
        plan = check_and_fallback(model, plan, holdout, budget, sens, counts, inf, progress=True)
    plan.to_json(ctx.out_dir / "plan.json")
    return {"avg_bits": round(plan.avg_bits, 3), "counts": plan.counts(), "estimated_kl": plan.estimated_kl,
            "measured_kl": plan.measured_kl, "promoted": len(plan.promoted)}


def stage_quantize(ctx: StageContext) -> dict:
    from accel.quant.allocate import Plan
    from accel.quant.quantize import oneshot_quantize, save_checkpoint

    q = ctx.recipe.quantization
    plan = Plan.from_json(ctx.upstream_path("plan.json"))
    batches = _batches(calibration_draw(ctx).train, ctx.recipe.calibration.max_seq_len)
    res = oneshot_quantize(fresh_model(ctx), plan, batches, method=q.method, dampening=q.gptq_dampening,
                           processor=tokenizer(ctx))
    save_checkpoint(res.model, plan, ctx.out_dir / "checkpoint_quantized", processor=tokenizer(ctx))
    return {"method": q.method, "seconds": round(res.seconds, 1)}


def stage_draft(ctx: StageContext) -> dict:
    s = ctx.recipe.speculation
    info: dict[str, Any] = {"method": s.method, "num_speculative_tokens": s.num_speculative_tokens}
    if s.method == "draft_model":
        from accel.models import resolve_model

        info["draft_model"] = str(resolve_model(s.draft_model, pull_if_missing=True))
    elif s.method == "distilled":
        from accel.spec.distill import train_draft

        d = s.distill
        res = train_draft(model_path(ctx), ctx.out_dir / "draft", num_layers=d.num_layers,
                          time_budget_minutes=d.time_budget_minutes, seed=d.seed, progress=True)
        info["draft_model"] = "draft"
        info["train"] = getattr(res, "to_dict", lambda: {})()
    if s.method == "ngram":
        info["ngram"] = s.ngram.model_dump()
    if not (ctx.out_dir / "draft").exists():
        (ctx.out_dir / "draft").mkdir()
    atomic_write_text(ctx.out_dir / "draft.json", json.dumps(info, indent=2) + "\n")
    return info


def stage_evaluate(ctx: StageContext) -> dict:
    from accel.eval.runner import run_eval
    from accel.quant.quantize import load_quantized_for_runtime

    e = ctx.recipe.eval
    result: dict[str, Any] = {"variants": {}}
    if e.quality and ctx.recipe.quantization.enabled:
        quant = load_quantized_for_runtime(ctx.upstream_path("checkpoint_quantized"))
        r = run_eval(quant, baseline=str(model_path(ctx)), text_dir=PROJECT_ROOT / "eval" / "text",
                     tasks_dir=PROJECT_ROOT / "eval" / "tasks", domains=e.domains, window=e.window,
                     max_windows_per_domain=e.max_windows_per_domain, tasks=e.tasks, tokenizer=tokenizer(ctx))
        result["variants"]["quantized"] = {"quality": json.loads(r.to_json())}
    atomic_write_text(ctx.out_dir / "eval.json", json.dumps(result, indent=2) + "\n")
    return {"variants": list(result["variants"])}


def stage_report(ctx: StageContext) -> dict:
    from accel.report import build_report

    data = {
        "recipe": ctx.recipe.model_dump(mode="json"),
        "eval": json.loads(ctx.upstream_path("eval.json").read_text()),
        "plan": json.loads(ctx.upstream_path("plan.json").read_text()) if ctx.upstream_path("plan.json").exists()
        else None,
        "sensitivity": json.loads(ctx.upstream_path("sensitivity.json").read_text())
        if ctx.upstream_path("sensitivity.json").exists() else None,
    }
    build_report(data, ctx.out_dir)
    return {}


def stage_export(ctx: StageContext) -> dict:
    from accel.export import write_export

    gates = evaluate_gates(ctx.recipe, json.loads(ctx.upstream_path("eval.json").read_text()))
    if gates.failed and not ctx.recipe.gates.override:
        raise GateFailed(gates)
    draft_dir = ctx.upstream_path("draft")
    write_export(ctx.out_dir / "checkpoint", ctx.upstream_path("checkpoint_quantized"),
                 recipe=ctx.recipe.model_dump(mode="json"),
                 plan=json.loads(ctx.upstream_path("plan.json").read_text()),
                 draft_dir=draft_dir if any(draft_dir.iterdir()) else None,
                 draft_pairing=json.loads(ctx.upstream_path("draft.json").read_text()),
                 eval_summary=json.loads(ctx.upstream_path("eval.json").read_text()).get("summary", {}))
    return {"gates": gates.__dict__}


# ------------------------------------------------------------------------------------------------------- gates


@dataclass
class GateReport:
    checked: dict[str, dict] = field(default_factory=dict)  # gate -> {limit, value, ok}
    failed: list[str] = field(default_factory=list)


class GateFailed(RuntimeError):
    def __init__(self, report: GateReport):
        self.report = report
        lines = [f"{g}: value {report.checked[g]['value']} vs limit {report.checked[g]['limit']}" for g in report.failed]
        super().__init__("quality/speed gates failed (set gates.override: true to export anyway):\n  "
                         + "\n  ".join(lines))


def evaluate_gates(recipe: Recipe, eval_json: dict) -> GateReport:
    """Compare the recipe's gates with the evaluation summary (`eval_json["summary"]`)."""
    g, s = recipe.gates, eval_json.get("summary", {})
    rep = GateReport()
    checks = [
        ("max_mean_kl", g.max_mean_kl, s.get("kl_mean"), lambda v, lim: v <= lim),
        ("max_ppl_increase_pct", g.max_ppl_increase_pct, s.get("ppl_increase_pct"), lambda v, lim: v <= lim),
        ("min_top1_agreement", g.min_top1_agreement, s.get("top1"), lambda v, lim: v >= lim),
        ("min_task_accuracy_ratio", g.min_task_accuracy_ratio, s.get("task_accuracy_ratio"), lambda v, lim: v >= lim),
        ("min_speedup", g.min_speedup, s.get("speedup_batch1"), lambda v, lim: v >= lim),
    ]
    for name, limit, value, ok in checks:
        if limit is None:
            continue
        passed = value is not None and ok(value, limit)
        rep.checked[name] = {"limit": limit, "value": value, "ok": passed}
        if not passed:
            rep.failed.append(name)
    return rep


# ---------------------------------------------------------------------------------------------------- pipeline


def build_stages(recipe: Recipe) -> list[Stage]:
    fp = _model_fingerprint
    q_on = recipe.quantization.enabled
    stages = [Stage("calibrate", stage_calibrate, ("model", "calibration"), (),
                    ("calibration.jsonl", "calibration_summary.json"), extra_key=fp)]
    if q_on:
        stages += [
            Stage("sensitivity", stage_sensitivity, ("quantization",), ("calibrate",),
                  ("sensitivity.json", "sensitivity.png"), extra_key=fp),
            Stage("plan", stage_plan, ("quantization",), ("sensitivity",), ("plan.json",), extra_key=fp),
            Stage("quantize", stage_quantize, ("quantization", "calibration"), ("plan",), ("checkpoint_quantized",),
                  extra_key=fp),
        ]
    stages += [
        Stage("draft", stage_draft, ("speculation",), ("calibrate",), ("draft.json", "draft"), extra_key=fp),
        Stage("evaluate", stage_evaluate, ("eval", "runtime", "speculation"), ("quantize", "draft"), ("eval.json",),
              extra_key=fp),
        Stage("report", stage_report, (), ("evaluate", "plan", "sensitivity"), ("report.html", "report.md")),
    ]
    if recipe.export.enabled:
        stages.append(Stage("export", stage_export, ("export", "gates"), ("evaluate", "quantize", "draft"),
                            ("checkpoint",)))
    return stages


def optimize(recipe: Recipe, *, on_event=None, force: tuple[str, ...] = ()) -> dict[str, StageRecord]:
    """Run the recipe's pipeline in `recipe.run_dir()`; returns the stage records."""
    run_dir = recipe.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "recipe.yaml", dump_recipe(recipe))
    return run_stages(build_stages(recipe), recipe, run_dir, on_event=on_event, force=force)


def clean(recipe: Recipe) -> None:
    shutil.rmtree(recipe.run_dir(), ignore_errors=True)
