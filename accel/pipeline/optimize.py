"""`accel optimize`: the whole pipeline as resumable stages over one run folder.

    load -> calibrate -> sensitivity -> plan -> quantize -> draft -> evaluate -> gates -> report -> export

Each stage writes its files into `runs/<name>/` (see `accel.pipeline.stages` for keys, reuse and atomicity). Heavy in-memory
objects (the tokenizer, the calibration draw) live in `ctx.state` and are rebuilt lazily, so a stage that runs after
reused stages finds what it needs. The evaluation (quality, speed, speculation acceptance) is in
`accel.pipeline.evaluate`; this module wires stages, gates and the run folder.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accel import memory, schemes
from accel.fsutil import atomic_write_text
from accel.preflight import preflight
from accel.recipe import Recipe, RecipeError, dump_recipe
from accel.runlog import LOG_NAME, third_party_to
from accel.pipeline.stages import Stage, StageContext, StageRecord, run_stages

PROJECT_ROOT = Path(__file__).resolve().parents[2]
STAGE_NAMES = ("load", "calibrate", "sensitivity", "plan", "quantize", "draft", "evaluate", "gates", "report",
               "export")


# ------------------------------------------------------------------------------------------- lazy shared objects


def model_path(ctx: StageContext) -> Path:
    if "model_path" not in ctx.state:
        from accel.hub import resolve_model

        ctx.state["model_path"] = Path(resolve_model(ctx.recipe.model.path, pull_if_missing=True))
    return ctx.state["model_path"]


def model_fingerprint(recipe: Recipe) -> str:
    """Identity of the target model for the load stage's key: its files' sizes and mtimes (cheap, no hashing)."""
    from accel.hub import ModelNotFoundError, resolve_model

    try:
        p = Path(resolve_model(recipe.model.path))
    except (FileNotFoundError, ModelNotFoundError):
        return f"not pulled yet: {recipe.model.path}"
    return json.dumps({f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(p.iterdir()) if f.is_file()})


def tokenizer(ctx: StageContext):
    if "tokenizer" not in ctx.state:
        from accel.tokenizer import load_tokenizer

        ctx.state["tokenizer"] = load_tokenizer(model_path(ctx))
    return ctx.state["tokenizer"]


def fresh_model(ctx: StageContext):
    """A new fp32 copy of the target (quantization modifies models in place, so stages never share one), read a
    module at a time into the process's own memory (`load_hf_model`). transformers maps the safetensors file
    instead, and pages read stay in RSS while any of its tensors lives: GPTQ replaces each layer's weights with new
    tensors, so the 1.5B's quantize stage held both, 14.7 GB at its end."""
    from accel.kernels.loader import load_hf_model

    return load_hf_model(model_path(ctx))


def calibration_draw(ctx: StageContext):
    """The stratified draw; deterministic (seeded), so it is recomputed rather than stored with its texts."""
    if "draw" not in ctx.state:
        from accel.calibration import load_samples, stratified_draw

        cfg = ctx.recipe.calibration
        root = PROJECT_ROOT / "calibration_data" if cfg.source == "builtin" else None
        ctx.state["draw"] = stratified_draw(load_samples(cfg, root=root), tokenizer(ctx), cfg)
    return ctx.state["draw"]


def _progress(ctx: StageContext) -> bool:
    return bool(ctx.state.get("progress", False))


def _set_threads(recipe: Recipe) -> None:
    if recipe.runtime.num_threads:
        import torch

        torch.set_num_threads(recipe.runtime.num_threads)


# ------------------------------------------------------------------------------------------------------ stages


def stage_load(ctx: StageContext) -> dict:
    """Resolve (pull if needed) the target and record what it is; downstream keys hash this file."""
    from transformers import AutoConfig

    path = model_path(ctx)
    cfg = AutoConfig.from_pretrained(path)
    info = {"path": str(path), "model_type": cfg.model_type, "num_layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
            "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
            "files": json.loads(model_fingerprint(ctx.recipe)) if path.is_dir() else {}}
    atomic_write_text(ctx.out_dir / "model.json", json.dumps(info, indent=2) + "\n")
    return {k: info[k] for k in ("path", "model_type", "num_layers")}


def stage_calibrate(ctx: StageContext) -> dict:
    from accel.calibration import write_draw

    draw = calibration_draw(ctx)
    q = ctx.recipe.quantization
    if q.enabled:
        from accel.quant.plan import holdout_problem

        problem = holdout_problem(draw.holdout, q)
        if problem:  # found seconds in, not after the sensitivity stage's minutes
            raise ValueError(problem)
    write_draw(draw, ctx.out_dir)
    return {"num_train": len(draw.train), "num_holdout": len(draw.holdout),
            "train_tokens": sum(u.num_tokens for u in draw.train)}


def stage_sensitivity(ctx: StageContext) -> dict:
    from accel.quant.heatmap import plot_heatmap
    from accel.quant.plan import joining_candidates, token_batches
    from accel.quant.schemes import quantizable_linears
    from accel.quant.sensitivity import measure_sensitivity, with_group_sizes

    from accel.quant.plan import allocates
    from accel.quant.sensitivity import unmeasured

    q = ctx.recipe.quantization
    _set_threads(ctx.recipe)
    model = fresh_model(ctx)
    if not allocates(q):  # one candidate at one group size: every unit gets it, nothing to measure
        sens = unmeasured(model, q.candidates[0], q.int4_group_sizes[0], q.sensitivity.metric)
        sens.to_json(ctx.out_dir / "sensitivity.json")
        plot_heatmap(sens, ctx.out_dir / "sensitivity.png")
        return {"metric": sens.metric, "num_units": len(sens.damage), "num_tokens": 0, "skipped": True}
    batches = token_batches(calibration_draw(ctx).train, q.sensitivity.max_seq_len, q.sensitivity.num_samples)
    target = ctx.recipe.export.target if ctx.recipe.export.enabled else None
    results, summary = [], {}
    for g in q.int4_group_sizes:  # one measurement per group size the allocator may choose
        candidates, join_ratios = joining_candidates(model, q.candidates, g, target)
        given = None
        if uses_gptq_int4(ctx, candidates):  # GPTQ consumes a fresh copy: never two fp32 models at once
            names = quantizable_linears(model)
            del model
            given = gptq_int4_weights(ctx, names, g, batches)
            model = fresh_model(ctx)
        # mapped: the measurement's temporaries go back when freed (GPTQ's passes trim per layer instead: mapping
        # them cost half as much time again in page faults)
        with memory.large_blocks_mapped():
            results.append(measure_sensitivity(model, batches, candidates, g, q.sensitivity.metric, _progress(ctx),
                                               given=given))
        summary[g] = {"candidates": candidates, "join_error_ratios": join_ratios, "int4_quantizer":
                      "gptq (layer-wise)" if given else "rtn"}
    sens = with_group_sizes(results)
    sens.to_json(ctx.out_dir / "sensitivity.json")
    plot_heatmap(sens, ctx.out_dir / "sensitivity.png")
    first = summary[q.int4_group_sizes[0]]
    return {"metric": sens.metric, "num_units": len(sens.damage), "num_tokens": sens.num_tokens,
            **(first if len(summary) == 1 else {"group_sizes": summary})}


def uses_gptq_int4(ctx: StageContext, candidates) -> bool:
    from accel.quant.quantize import SEARCHED_METHODS

    return "int4" in candidates and ctx.recipe.quantization.method in SEARCHED_METHODS


def gptq_int4_weights(ctx: StageContext, names, group_size: int, batches) -> dict:
    """What GPTQ makes of each Linear at INT4, for the sensitivity to measure, where the recipe quantizes INT4 with
    GPTQ (RTN is measured otherwise). On int4-mixed, allocating on these instead of RTN's damage lowers the
    held-out KL after the same GPTQ at 5.0 bits (docs/DESIGN.md, Quantization)."""
    from accel.quant.quantize import layerwise_gptq

    q = ctx.recipe.quantization
    return {"int4": layerwise_gptq(lambda: fresh_model(ctx), names, group_size, batches, q.gptq_dampening,
                                   tokenizer(ctx), progress=_progress(ctx))}


def stage_plan(ctx: StageContext) -> dict:
    """Budgeted allocation over units from the sensitivity, then the held-out check that promotes units."""
    from accel.quant.plan import build_plan
    from accel.quant.sensitivity import SensitivityResult

    _set_threads(ctx.recipe)
    sens = SensitivityResult.from_json(ctx.upstream_path("sensitivity.json"))
    target = ctx.recipe.export.target if ctx.recipe.export.enabled else None
    plan = build_plan(fresh_model(ctx), sens, ctx.recipe.quantization, calibration_draw(ctx).holdout, _progress(ctx),
                      target)
    plan.to_json(ctx.out_dir / "plan.json")
    return {"avg_bits": round(plan.avg_bits, 3), "group_sizes": plan.size_counts(), "counts": plan.counts(),
            "lm_head": plan.lm_head, "table": plan.table, "measured_kl": plan.measured_kl,
            "promoted": len(plan.promoted)}


def stage_quantize(ctx: StageContext) -> dict:
    from accel.quant.allocate import Plan
    from accel.quant.quantize import finish_checkpoint, oneshot_quantize, write_compressed
    from accel.quant.plan import calibration_batches

    q = ctx.recipe.quantization
    _set_threads(ctx.recipe)
    plan = Plan.from_json(ctx.upstream_path("plan.json"))
    draw = calibration_draw(ctx)
    batches, weighting = calibration_batches(lambda: fresh_model(ctx), plan, draw.train, ctx.recipe, draw.source_tokens,
                                             _progress(ctx))
    memory.collect()  # that model, freed now rather than at the collector's leisure during GPTQ
    res = oneshot_quantize(fresh_model(ctx), plan, batches, q.method, q.gptq_dampening, tokenizer(ctx),
                           progress=_progress(ctx))
    tuning = None
    if q.scale_tuning_steps:
        from accel.quant.tune import BATCH_ROWS, tuning_rows, tune_scales

        rows = tuning_rows(draw.train + draw.unused, q.scale_tuning_steps * BATCH_ROWS,
                           weighting.shares if weighting else None)
        tuning = tune_scales(res.model, fresh_model(ctx), rows, q.scale_tuning_steps, batch_size=BATCH_ROWS,
                             progress=_progress(ctx))
        tuning["rows"] = int(rows.unique(dim=0).shape[0])
    out = write_compressed(res.model, ctx.out_dir / "checkpoint_quantized")
    del res  # the fp32 model goes before the checkpoint's rewrites read it back
    memory.collect()
    finish_checkpoint(out, plan, processor=tokenizer(ctx))
    from accel.pipeline.evaluate import file_bits, num_params

    # the plan's avg_bits is the decoder Linears' (what the budget counts); this is every byte of the file
    return {"method": q.method, "rows": sum(b.shape[0] for b in batches), "scale_tuning": tuning,
            "calibration_mix": weighting.to_dict() if weighting else None,
            "file_bits": file_bits(ctx.out_dir / "checkpoint_quantized", num_params(model_path(ctx)))}


def stage_draft(ctx: StageContext) -> dict:
    """Pair a draft: n-gram lookup (nothing to train), an existing draft model, or one distilled from the target.
    draft.json records the pairing; draft/ holds a distilled draft (empty otherwise)."""
    s = ctx.recipe.speculation
    info: dict[str, Any] = {"method": s.method, "num_speculative_tokens": s.num_speculative_tokens}
    (ctx.out_dir / "draft").mkdir()
    if s.method == "ngram":
        info["ngram"] = {"min_n": s.ngram_min_n, "max_n": s.ngram_max_n}
    elif s.method == "draft":
        from accel.hub import resolve_model
        from accel.speculative.tokenizer_check import check_tokenizers_match

        path = Path(resolve_model(s.draft_model, pull_if_missing=True))
        check_tokenizers_match(model_path(ctx), path)
        info["draft_model"] = str(path)
    elif s.method == "distilled":
        d = s.distill
        _set_threads(ctx.recipe)
        from accel.draft_training import distill_draft

        res = distill_draft(model_path(ctx), ctx.out_dir / "draft", d, PROJECT_ROOT / "calibration_data",
                            progress=_progress(ctx))
        info["kind"] = d.kind
        info["draft_model"] = "draft"
        info["train"] = {k: v for k, v in asdict(res).items() if k not in ("losses", "out_dir")}
    atomic_write_text(ctx.out_dir / "draft.json", json.dumps(info, indent=2) + "\n")
    return {"method": s.method}


def draft_dir(ctx: StageContext) -> Path | None:
    """The draft model folder of this run (distilled into draft/, or the recipe's draft_model), if any."""
    info = json.loads(ctx.upstream_path("draft.json").read_text())
    if "draft_model" not in info:
        return None
    p = Path(info["draft_model"])
    return p if p.is_absolute() else ctx.run_dir / p


def stage_evaluate(ctx: StageContext) -> dict:
    from accel.pipeline.evaluate import evaluate

    _set_threads(ctx.recipe)
    quant_dir = ctx.upstream_path("checkpoint_quantized") if ctx.recipe.quantization.enabled else None
    result = evaluate(ctx.recipe, model_path(ctx), quant_dir, draft_dir(ctx), tokenizer(ctx), PROJECT_ROOT,
                      progress=_progress(ctx))
    atomic_write_text(ctx.out_dir / "eval.json", json.dumps(result, indent=1, default=str) + "\n")
    return {k: v for k, v in result["summary"].items() if isinstance(v, (int, float, str)) or v is None}


def stage_gates(ctx: StageContext) -> dict:
    """Compare the recipe's gates with the evaluation summary, and the export's target loader with what the
    quantized checkpoint holds; never fails (the export stage enforces them)."""
    rep = evaluate_gates(ctx.recipe, json.loads(ctx.upstream_path("eval.json").read_text()))
    target = ctx.recipe.export.target
    if ctx.recipe.quantization.enabled:
        from accel.export.compatibility import loader_support

        config = json.loads((ctx.upstream_path("checkpoint_quantized") / "config.json").read_text())
        refused = loader_support(config)[target].refused
        first = next(iter(refused.items()), None)
        rep.checked["loader"] = {"metric": f"layers {target} cannot load", "limit": 0, "value": len(refused),
                                 "ok": not refused, "refused": refused,
                                 "detail": first and f"{target} cannot load {len(refused)} layers, e.g. {first[0]}: "
                                                     f"{first[1]}"}
        if refused:
            rep.failed.append("loader")
    atomic_write_text(ctx.out_dir / "gates.json", json.dumps(asdict(rep), indent=2) + "\n")
    return {"failed": rep.failed, "override": ctx.recipe.gates.override}


def stage_report(ctx: StageContext) -> dict:
    import time

    from accel.report import build_report

    ev = json.loads(ctx.upstream_path("eval.json").read_text())
    plan = sens = None
    if ctx.recipe.quantization.enabled:
        from accel.quant.allocate import Plan
        from accel.quant.sensitivity import SensitivityResult

        p = Plan.from_json(ctx.upstream_path("plan.json"))
        plan = {**p.unit_schemes(), "lm_head": p.lm_head}  # one row per unit: what vLLM and the runtime load
        measured = SensitivityResult.from_json(ctx.upstream_path("sensitivity.json")).by_group_size()
        sens = measured.get(p.group_size, next(iter(measured.values()))).damage  # at the plan's group size
    data = {"name": ctx.recipe.name, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": f"accel optimize ({ctx.recipe.name})", "recipe": dump_recipe(ctx.recipe),
            "machine": ev.get("machine"), "variants": ev["variants"], "sensitivity": sens, "plan": plan}
    build_report(data, ctx.out_dir)
    (ctx.out_dir / "plots").mkdir(exist_ok=True)  # a report without plots still has the folder (a stage output)
    gates = json.loads(ctx.upstream_path("gates.json").read_text())
    md = ctx.out_dir / "report.md"
    md.write_text(md.read_text() + "\n" + render_gates_markdown(gates) + "\n" + render_summary_markdown(ev["summary"]))
    return {}


def stage_export(ctx: StageContext) -> dict:
    from accel.export import write_export

    gates = GateReport(**json.loads(ctx.upstream_path("gates.json").read_text()))
    if gates.failed and not ctx.recipe.gates.override:
        raise GateFailed(gates)
    ev = json.loads(ctx.upstream_path("eval.json").read_text())
    if ctx.recipe.quantization.enabled:
        src, plan = ctx.upstream_path("checkpoint_quantized"), json.loads(ctx.upstream_path("plan.json").read_text())
    else:
        src, plan = model_path(ctx), None
    pairing = json.loads(ctx.upstream_path("draft.json").read_text())
    pairing["measured"] = ev.get("spec")
    ddir = draft_dir(ctx) if ctx.recipe.export.include_draft else None
    write_export(ctx.out_dir / "checkpoint", src, recipe=ctx.recipe.model_dump(mode="json"), plan=plan,
                 draft_dir=ddir, draft_pairing=pairing, eval_summary={**ev["summary"], "gates": asdict(gates)})
    return {"gates_failed": gates.failed, "overridden": bool(gates.failed), "draft": ddir is not None}


# ------------------------------------------------------------------------------------------------------- gates


@dataclass
class GateReport:
    checked: dict[str, dict] = field(default_factory=dict)  # gate -> {limit, value, ok}
    failed: list[str] = field(default_factory=list)


class GateFailed(RuntimeError):
    def __init__(self, report: GateReport):
        self.report = report
        lines = [f"{g}: " + (report.checked[g].get("detail") or f"measured {_fmt(report.checked[g]['value'])}, "
                                                                 f"limit {report.checked[g]['limit']}")
                 for g in report.failed]
        super().__init__("gates failed, export blocked (set gates.override: true in the recipe, or pass "
                         "--override-gates, to export anyway):\n  " + "\n  ".join(lines))


def _fmt(v: Any) -> str:
    return "not measured" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


GATES = (  # recipe gate -> (summary key, passes(value, limit))
    ("max_mean_kl", "kl_mean", lambda v, lim: v <= lim),
    ("max_ppl_increase_pct", "ppl_increase_pct", lambda v, lim: v <= lim),
    ("min_top1_agreement", "top1", lambda v, lim: v >= lim),
    ("min_task_accuracy_ratio", "task_accuracy_ratio", lambda v, lim: v >= lim),
    ("min_speedup", "speedup_batch1", lambda v, lim: v >= lim),
)


def evaluate_gates(recipe: Recipe, eval_json: dict) -> GateReport:
    """Compare the recipe's gates with the evaluation summary; a gate whose metric was not measured fails."""
    g, s = recipe.gates, eval_json.get("summary", {})
    rep = GateReport()
    for name, key, ok in GATES:
        limit = getattr(g, name)
        if limit is None:
            continue
        value = s.get(key)
        passed = value is not None and ok(value, limit)
        rep.checked[name] = {"metric": key, "limit": limit, "value": value, "ok": passed}
        if not passed:
            rep.failed.append(name)
    return rep


def render_gates_markdown(gates: dict) -> str:
    if not gates["checked"]:
        return "## Gates\n\nThe recipe sets no gates.\n"
    rows = ["## Gates", "", "| gate | metric | measured | limit | result |", "|---|---|---|---|---|"]
    for name, c in gates["checked"].items():
        rows.append(f"| {name} | {c['metric']} | {_fmt(c['value'])} | {c['limit']} | {'pass' if c['ok'] else 'FAIL'} |")
    if gates["failed"]:
        rows += ["", f"**Failed: {', '.join(gates['failed'])}** - the export is blocked unless `gates.override: true`."]
    return "\n".join(rows) + "\n"


def render_summary_markdown(summary: dict) -> str:
    rows = ["## Headline numbers", "", "| metric | value |", "|---|---|"]
    rows += [f"| {k} | {_fmt(v)} |" for k, v in summary.items() if not isinstance(v, (dict, list))]
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------------------------------------------- pipeline


# The quantization fields each stage reads (finer than the section: changing the budget only reruns plan onward).
SENSITIVITY_FIELDS = ("quantization.candidates", "quantization.int4_group_size", "quantization.sensitivity",
                      "quantization.method", "quantization.gptq_dampening",  # GPTQ's INT4 is what is measured
                      "export.enabled", "export.target")  # the export's loaders decide int4 vs int4f
PLAN_FIELDS = SENSITIVITY_FIELDS + ("quantization.budget", "quantization.overrides", "quantization.lm_head")
QUANTIZE_FIELDS = ("quantization.method", "quantization.gptq_dampening", "quantization.calibration_mix",
                   "quantization.calibration_mix_keep", "quantization.scale_tuning_steps",
                   "calibration.num_samples", "calibration.max_seq_len")


def build_stages(recipe: Recipe, until: str | None = None) -> list[Stage]:
    """The recipe's stages in order (quantization and export stages only when enabled), up to `until`."""
    q_on = recipe.quantization.enabled
    stages = [
        Stage("load", stage_load, ("model",), (), ("model.json",), extra_key=model_fingerprint),
        Stage("calibrate", stage_calibrate, ("calibration",), ("load",),
              ("calibration.jsonl", "calibration_summary.json"), version="2"),  # bumped with the draw's rules
    ]
    if q_on:
        stages += [
            Stage("sensitivity", stage_sensitivity, SENSITIVITY_FIELDS, ("load", "calibrate"),
                  ("sensitivity.json", "sensitivity.png"), version="4"),  # 4: the proxy's output changes in bf16
            Stage("plan", stage_plan, PLAN_FIELDS, ("load", "calibrate", "sensitivity"), ("plan.json",),
                  version="5"),  # 5: the table's scheme
            Stage("quantize", stage_quantize, QUANTIZE_FIELDS, ("load", "calibrate", "plan"),
                  ("checkpoint_quantized",), version="6"),  # bumped with the checkpoint's layout (the INT8 table)
        ]
    stages += [
        Stage("draft", stage_draft, ("speculation",), ("load",), ("draft.json", "draft")),
        Stage("evaluate", stage_evaluate, ("eval", "runtime", "speculation", "model"), ("load", "quantize", "draft"),
              ("eval.json",), version="4"),  # bumped with eval.json's content (whole-file bits)
        Stage("gates", stage_gates, ("gates", "export.target"), ("evaluate",), ("gates.json",)),
        Stage("report", stage_report, ("name",), ("evaluate", "plan", "sensitivity", "gates"),
              ("report.html", "report.md", "plots")),
    ]
    if recipe.export.enabled:
        stages.append(Stage("export", stage_export, ("export", "gates"), ("evaluate", "plan", "quantize", "draft",
                                                                          "gates"), ("checkpoint",)))
    if until is not None:
        names = [s.name for s in stages]
        if until not in names:
            raise ValueError(f"unknown stage {until!r}; this recipe's stages: {', '.join(names)}")
        stages = stages[: names.index(until) + 1]
    return stages


def memory_need(recipe: Recipe):
    """What the run will hold at its peak, from the model's config and safetensors headers alone (an `accel.memory
    .Need`): the fp32 model the stages work on (one copy at a time, never two) plus the largest working set a stage
    adds to it: a proxy sensitivity's forward and backward over ROWS_PER_FORWARD rows (logits, log-probs, probs and
    their gradients over the vocabulary; each layer's saved activations and output changes), a calibration forward
    (reference and quantized logits), or the evaluation's quantized model beside the fp32 baseline (its widest
    candidate short of 16 bits, the table at 16 bits). Qwen2.5-Coder-1.5B's sensitivity: 3.2 GB estimated, 3.3 GB
    measured over its 7.1 GB model."""
    import torch

    from accel.kernels.loader import planned_bytes
    from accel.memory import Need
    from accel.hub import resolve_model
    from accel.quant.plan import ROWS_PER_FORWARD
    from accel.runtime.models.hf_config import load_config

    path = Path(resolve_model(recipe.model.path))
    cfg = load_config(path)
    fp32, _ = planned_bytes(path, torch.float32, bool(getattr(cfg, "tie_word_embeddings", False)))
    vocab, layers, hidden = cfg.vocab_size, cfg.num_hidden_layers, cfg.hidden_size
    inter = getattr(cfg, "intermediate_size", None) or 4 * hidden
    q, work = recipe.quantization, [0]
    if q.enabled:
        if len(q.candidates) > 1 or len(q.int4_group_sizes) > 1:  # a sensitivity is measured
            backward = layers * (3 * inter + 8 * hidden) * 8 if q.sensitivity.metric == "proxy" else 0
            work.append(ROWS_PER_FORWARD * q.sensitivity.max_seq_len * (vocab * 4 * 6 + backward))
        work.append(ROWS_PER_FORWARD * recipe.calibration.max_seq_len * vocab * 4 * 4)
        if recipe.eval.quality or recipe.eval.speed:
            bits = max([schemes.get(c).code_bits for c in q.candidates if schemes.get(c).quantized] or [16])
            work.append(fp32 * bits // 32 + vocab * hidden * 2)
    return Need(f"accel optimize of {path.name}", {"fp32 model": fp32, "working set": max(work)})


def optimize(recipe: Recipe, *, on_event: Callable | None = None, force: tuple[str, ...] = (),
             until: str | None = None, progress: bool = False, run_log: bool = False) -> dict[str, StageRecord]:
    """Run the recipe's pipeline in `recipe.run_dir()`; returns the stage records.

    force: stage names to rerun even when reusable (their dependants rerun only if their outputs change).
    until: stop after this stage (`accel quantize` stops after quantize). Raises GateFailed from the export stage
    when a gate failed and the recipe does not override it; every stage before it stays finished. Raises
    RecipeError before any work when the recipe does not fit the disk or the machine (accel.preflight).
    run_log: other libraries' output (log lines, warnings, progress bars) goes to `runs/<name>/log.txt` while the
    stages run, not to the terminal (`accel.runlog`).
    """
    stages = build_stages(recipe, until)
    bad = sorted(set(force) - {s.name for s in stages})
    if bad:
        raise ValueError(f"--force {', '.join(bad)}: no such stage; stages: {', '.join(s.name for s in stages)}")
    problems = preflight(recipe, PROJECT_ROOT)
    if problems:
        raise RecipeError(str(recipe.run_dir() / "recipe.yaml"), problems)
    from accel.memory import check_fits
    from accel.hub import ModelNotFoundError, resolve_model

    with contextlib.suppress(FileNotFoundError, ModelNotFoundError):  # a model still to be pulled: checked by pull
        resolve_model(recipe.model.path)
        check_fits(memory_need(recipe), "lower calibration.max_seq_len or quantization.sensitivity.max_seq_len, "
                                        "or raise the limit")
    run_dir = recipe.run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "recipe.yaml", dump_recipe(recipe))
    with third_party_to(run_dir / LOG_NAME) if run_log else contextlib.nullcontext():
        return run_stages(stages, recipe, run_dir, state={"progress": progress}, on_event=on_event, force=force)


def clean(recipe: Recipe) -> None:
    shutil.rmtree(recipe.run_dir(), ignore_errors=True)


def recipe_of_run(run_dir: str | Path) -> Recipe:
    """The resolved recipe a run folder was made with, pointed at that folder (for `accel export run`)."""
    from accel.recipe import load_recipe

    run_dir = Path(run_dir)
    recipe = load_recipe(run_dir / "recipe.yaml")
    return recipe.model_copy(update={"output_dir": str(run_dir.parent), "name": run_dir.name})
