"""The report's content: a RunReport -> a Document of sections (tables for every number, plots where useful)."""

from __future__ import annotations

import re

from accel.bench.latency import DEFINITIONS, BenchResult, Dist
from accel.bench.probes import contended_runs
from accel.report import plots
from accel.report.doc import Code, Document, Figure, Section, Table, Text, fmt
from accel.report.schema import RunReport, scheme_bits

# *_llama: scored as `llama-perplexity -c 128 --kl-divergence` scores, the scale GGUF peers are measured on
BASE_QUALITY_KEYS = ("ppl", "ppl_increase_pct", "kl_mean", "kl_p99", "top1", "task_accuracy")
LLAMA_QUALITY_KEYS = ("kld_llama", "top1_llama", "ppl_ratio_llama")
QUALITY_KEYS = BASE_QUALITY_KEYS + LLAMA_QUALITY_KEYS
QUALITY_LABELS = {"ppl": "PPL", "ppl_increase_pct": "PPL +%", "kl_mean": "KL mean", "kl_p99": "KL P99",
                  "top1": "top-1 agree", "task_accuracy": "task acc", "kld_llama": "KLD (llama.cpp scale)",
                  "top1_llama": "same top-1 (llama.cpp scale)", "ppl_ratio_llama": "PPL ratio (llama.cpp scale)"}
# lower is better, in order of preference; the llama.cpp scale first, as it is the one GGUF peers have too
PARETO_Y_KEYS = ("kld_llama", "kl_mean", "ppl_increase_pct", "ppl")


def _workloads(report: RunReport) -> list[str]:
    """Workload names in first-seen order over variants."""
    seen: dict[str, None] = {}
    for v in report.variants:
        for w in v.speed:
            seen.setdefault(w, None)
    return list(seen)


def _p(d: Dist | None, key: str) -> float | None:
    return getattr(d, key) if d is not None else None


def _tok_s(r: BenchResult | None) -> str:
    """Output tok/s of the median run, with the min-max over the repeats where there were several."""
    if r is None:
        return fmt(None)
    if r.repeats and len(r.repeats) > 1:
        return f"{fmt(r.output_throughput)} ({fmt(min(r.repeats))}-{fmt(max(r.repeats))})"
    return fmt(r.output_throughput)


def summary_section(report: RunReport) -> Section:
    wls = _workloads(report)
    wl = wls[0] if wls else None
    ref = report.variants[0].speed.get(wl) if wl else None
    # only the columns some variant has, so a speed-only report is not a wall of n/a
    qkeys = [k for k in QUALITY_KEYS if any(v.quality.get(k) is not None for v in report.variants)]
    size_cols = [(label, attr) for label, attr in (("size MB", "size_mb"), ("avg bits", "avg_bits"))
                 if any(getattr(v, attr) is not None for v in report.variants)]
    headers = ["variant"] + [label for label, _ in size_cols] + [QUALITY_LABELS[k] for k in qkeys]
    if wl:
        headers += [f"out tok/s ({wl})", "speedup", "TTFT P50 ms", "TPOT P50 ms"]
    rows = []
    for v in report.variants:
        row = [v.name] + [fmt(getattr(v, a)) for _, a in size_cols] + [fmt(v.quality.get(k)) for k in qkeys]
        if wl:
            r = v.speed.get(wl)
            speedup = (r.output_throughput / ref.output_throughput
                       if r is not None and ref is not None and ref.output_throughput > 0 else None)
            row += [_tok_s(r), f"{speedup:.2f}x" if speedup else "n/a",
                    fmt(_p(r.ttft_ms if r else None, "p50")), fmt(_p(r.tpot_ms if r else None, "p50"))]
        rows.append(row)
    blocks = [Table(headers, rows, "Variants (speedup = output tokens/s over the first variant; tok/s: the median "
                                   "run, min-max over the repeats in brackets)")]
    return Section("Summary", blocks)


def pareto_section(report: RunReport) -> Section | None:
    ykey = next((k for k in PARETO_Y_KEYS
                 if sum(v.quality.get(k) is not None for v in report.variants) >= 2), None)
    wls = _workloads(report)
    if ykey is None or not wls:
        return None
    wl = wls[0]
    pts = []
    for v in report.variants:
        r = v.speed.get(wl)
        y = v.quality.get(ykey)
        x = _p(r.tpot_ms, "p50") if r is not None else None
        if x is None and r is not None:
            x = _p(r.e2e_ms, "p50")
        if x is not None and y is not None:
            pts.append((v.name, float(x), float(y)))
    if len(pts) < 2:
        return None
    return _front_section("Quality vs latency", "pareto", pts, f"TPOT P50 (ms), workload {wl}",
                          QUALITY_LABELS[ykey], "Each point is a variant; a variant is on the Pareto front when no "
                          "other variant is both faster and closer to the baseline.")


def _front_section(title: str, stem: str, pts: list[tuple[str, float, float]], xlabel: str, ylabel: str,
                   text: str) -> Section:
    """A scatter of (name, x, y) with its Pareto front (both axes minimised), and the same as a table."""
    front = set(plots.pareto_front([(x, y) for _, x, y in pts]))
    png = plots.pareto_scatter([n for n, _, _ in pts], [x for _, x, _ in pts], [y for _, _, y in pts],
                               xlabel, ylabel, title)
    rows = [[n, fmt(x), fmt(y), "yes" if i in front else "no"] for i, (n, x, y) in enumerate(pts)]
    return Section(title, [Text(text), Figure(stem, png, f"{ylabel} vs {xlabel}, with the Pareto front"),
                           Table(["variant", xlabel, ylabel, "on Pareto front"], rows)])


def size_section(report: RunReport) -> Section | None:
    """File size against quality, the peers' GGUF files beside accel's export: where each sits on bytes vs KLD."""
    variants = [v for v in report.variants if not v.name.endswith("+spec") and v.size_mb]
    ykey = next((k for k in PARETO_Y_KEYS if sum(v.quality.get(k) is not None for v in variants) >= 2), None)
    if ykey is None:
        return None
    pts = [(v.name, float(v.size_mb), float(v.quality[ykey])) for v in variants if v.quality.get(ykey) is not None]
    return _front_section("Quality vs size", "size", pts, "file size (MB)", QUALITY_LABELS[ykey],
                          "Each point is a model file; one is on the Pareto front when no other is both smaller and "
                          "closer to the baseline.")


def quality_section(report: RunReport) -> Section | None:
    if not any(v.quality for v in report.variants):
        return None
    extra = sorted({k for v in report.variants for k, x in v.quality.items()
                    if k not in QUALITY_KEYS and k != "per_domain" and not isinstance(x, (dict, list))})
    keys = list(BASE_QUALITY_KEYS) + [k for k in LLAMA_QUALITY_KEYS
                                      if any(v.quality.get(k) is not None for v in report.variants)] + extra
    rows = [[v.name] + [fmt(v.quality.get(k)) for k in keys] for v in report.variants]
    blocks = [Table(["variant"] + [QUALITY_LABELS.get(k, k) for k in keys], rows, "Quality vs the baseline")]
    dom_rows = []
    for v in report.variants:
        for dom, m in sorted((v.quality.get("per_domain") or {}).items()):
            dom_rows.append([v.name, dom] + [fmt(m.get(k)) for k in BASE_QUALITY_KEYS])
    if dom_rows:
        blocks.append(Table(["variant", "domain"] + [QUALITY_LABELS[k] for k in BASE_QUALITY_KEYS], dom_rows,
                            "Quality per domain"))
    return Section("Quality", blocks)


def _bench_row(name: str, r: BenchResult) -> list[str]:
    errors = ", ".join(f"{k}: {n}" for k, n in r.errors_by_kind.items()) or "0"
    return [name, fmt(r.config.get("concurrency")), fmt(r.config.get("request_rate")),
            f"{r.num_completed}/{r.num_requests}", fmt(r.request_throughput), fmt(r.output_throughput),
            fmt(r.goodput),
            *(fmt(_p(r.ttft_ms, k)) for k in ("p50", "p95", "p99")),
            *(fmt(_p(r.tpot_ms, k)) for k in ("p50", "p95", "p99")),
            *(fmt(_p(r.itl_ms, k)) for k in ("p50", "p99")),
            *(fmt(_p(r.e2e_ms, k)) for k in ("p50", "p99")),
            *(fmt(_p(r.queue_time_ms, k)) for k in ("p50", "p99")), errors]


BENCH_HEADERS = ["variant", "concurrency", "rate req/s", "ok/total", "req/s", "out tok/s", "goodput req/s",
                 "TTFT P50", "TTFT P95", "TTFT P99", "TPOT P50", "TPOT P95", "TPOT P99", "ITL P50", "ITL P99",
                 "E2E P50", "E2E P99", "queue P50", "queue P99", "errors"]


def speed_section(report: RunReport) -> Section | None:
    wls = _workloads(report)
    if not wls:
        return None
    blocks = [Text("Latencies in milliseconds. Queue time is n/a where the server does not report it.")]
    shared = contended_runs((f"{v.name}/{wl}", r.load) for v in report.variants for wl, r in v.speed.items())
    if shared:
        blocks.append(Text("**Contended**: the machine was shared during " + ", ".join(shared) +
                           "; those tok/s understate the engine."))
    for wl in wls:
        rows = [_bench_row(v.name, v.speed[wl]) for v in report.variants if wl in v.speed]
        first = next(v.speed[wl] for v in report.variants if wl in v.speed)
        wcfg = first.config.get("workload") or {}
        slo = first.slo
        desc = (f"workload `{wl}`: {first.num_requests} requests, prompt tokens {wcfg.get('prompt_tokens')}, "
                f"output tokens {wcfg.get('output_tokens')}, warm-up {first.config.get('num_warmup', 'n/a')}, "
                f"backend {first.config.get('backend', 'n/a')}")
        if slo is not None:
            desc += f"; goodput SLOs: TTFT <= {fmt(slo.ttft_ms)} ms, TPOT <= {fmt(slo.tpot_ms)} ms"
        blocks += [Text(desc), Table(BENCH_HEADERS, rows, f"Workload {wl}")]
        series = {}
        for v in report.variants:
            if wl in v.speed:
                lats = v.speed[wl].latencies()
                series[v.name] = {"TTFT": [x.ttft * 1e3 for x in lats if x.ttft is not None],
                                  "TPOT": [x.tpot * 1e3 for x in lats if x.tpot is not None]}
        if any(s["TTFT"] for s in series.values()):
            blocks.append(Figure(f"cdf-{_slug(wl)}", plots.latency_cdfs(series), f"Latency CDFs, workload {wl}"))
    return Section("Speed", blocks)


def throughput_section(report: RunReport) -> Section | None:
    series: dict[str, list[tuple[float, float]]] = {}
    knees: dict[str, int | None] = {}
    rows = []
    for v in report.variants:
        points = v.sweep.points if v.sweep else [r for r in v.speed.values()]
        pts = [(float(r.config["concurrency"]), r.output_throughput, r.ttft_ms) for r in points
               if r.config.get("concurrency") and r.config.get("request_rate") is None]
        if len(pts) < 2:
            continue
        pts.sort(key=lambda p: p[0])
        series[v.name] = [(c, t) for c, t, _ in pts]
        knees[v.name] = v.sweep.knee_index if v.sweep else None
        for i, (c, t, ttft) in enumerate(pts):
            rows.append([v.name, fmt(int(c)), fmt(t), fmt(_p(ttft, "p99")), "knee" if knees[v.name] == i else ""])
    if not series:
        return None
    blocks = [Figure("throughput", plots.throughput_vs_concurrency(series, knees), "Output tokens/s vs concurrency"),
              Table(["variant", "concurrency", "out tok/s", "TTFT P99 ms", ""], rows)]
    rule = next((v.sweep.knee_rule for v in report.variants if v.sweep), None)
    if rule:
        blocks.insert(0, Text(f"Knee: {rule}."))
    return Section("Throughput vs concurrency", blocks)


def spec_section(report: RunReport) -> Section | None:
    specs = [(v.name, v.spec) for v in report.variants if v.spec is not None]
    domains = {v.name: v.spec_per_domain for v in report.variants if v.spec is not None and v.spec_per_domain}
    if not specs:
        return None
    rows = [[n, fmt(s.num_drafts), fmt(s.num_draft_tokens), fmt(s.num_accepted_tokens), fmt(s.acceptance_rate),
             fmt(s.mean_acceptance_length)] for n, s in specs]
    blocks = [Table(["variant", "num_drafts", "num_draft_tokens", "num_accepted_tokens", "acceptance rate",
                     "mean acceptance length"], rows, "Speculative decoding counters")]
    per_pos = {n: s.acceptance_rate_per_pos for n, s in specs if s.num_accepted_tokens_per_pos}
    if per_pos:
        blocks.append(Figure("acceptance-position", plots.acceptance_per_position(per_pos),
                             "Acceptance per draft position"))
        width = max(len(r) for r in per_pos.values())
        blocks.append(Table(["variant"] + [f"pos {i + 1}" for i in range(width)],
                            [[n] + [fmt(x) for x in r] + [""] * (width - len(r)) for n, r in per_pos.items()],
                            "Accepted / drafts per position"))
    per_dom = {n: {d: c.acceptance_rate or 0.0 for d, c in by_dom.items()} for n, by_dom in domains.items()}
    if per_dom:
        blocks.append(Figure("acceptance-domain", plots.acceptance_per_domain(per_dom), "Acceptance rate per domain"))
        blocks.append(Table(["variant", "domain", "num_drafts", "num_draft_tokens", "num_accepted_tokens",
                             "acceptance rate", "mean acceptance length"],
                            [[n, d, fmt(c.num_drafts), fmt(c.num_draft_tokens), fmt(c.num_accepted_tokens),
                              fmt(c.acceptance_rate), fmt(c.mean_acceptance_length)]
                             for n, by_dom in domains.items() for d, c in sorted(by_dom.items())], "Acceptance per domain"))
    return Section("Speculative decoding", blocks)


def quantization_section(report: RunReport) -> Section | None:
    blocks = []
    if report.sensitivity:
        schemes = sorted({s for v in report.sensitivity.values() for s in v})
        blocks.append(Figure("sensitivity", plots.sensitivity_heatmap(report.sensitivity),
                             "KL divergence of quantizing each module alone"))
        blocks.append(Table(["module"] + [f"KL {s}" for s in schemes],
                            [[m] + [fmt(v.get(s)) for s in schemes] for m, v in report.sensitivity.items()],
                            "Sensitivity (KL vs the unquantized model)"))
    if report.plan:
        modules = list(report.plan)
        bits = [scheme_bits(report.plan[m]) for m in modules]
        blocks.append(Figure("bits", plots.bits_per_layer(modules, bits), "Weight bits per module in the plan"))
        blocks.append(Table(["module", "scheme", "bits"], [[m, report.plan[m], str(b)] for m, b in zip(modules, bits)],
                            f"Bit plan ({len(modules)} modules, average {sum(bits) / len(bits):.2f} bits)"))
    return Section("Quantization", blocks) if blocks else None


def definitions_section() -> Section:
    return Section("Definitions", [Text("Metric names and definitions follow vLLM (`vllm bench serve` and its "
                                        "spec-decode metrics)."),
                                   Table(["metric", "definition"], [[k, v] for k, v in DEFINITIONS.items()])])


def reproduce_section(report: RunReport) -> Section:
    m = report.machine or {}
    gpus = "; ".join(f"{g.get('name')} ({fmt(g.get('memory_gb'))} GiB)" for g in m.get("gpus") or []) or "none"
    rows = [["CPU", str(m.get("cpu_model", "n/a"))], ["cores (logical / usable)",
                                                      f"{m.get('cpu_count', 'n/a')} / {m.get('cpu_usable', 'n/a')}"],
            ["RAM GiB", fmt(m.get("ram_gb"))], ["GPU", gpus], ["CUDA", str(m.get("cuda") or "n/a")],
            ["torch threads", fmt(m.get("torch_threads"))], ["OS", str(m.get("os", "n/a"))],
            ["Python", str(m.get("python", "n/a"))]]
    blocks = [Table(["machine", ""], rows, "Machine")]
    versions = m.get("versions") or {}
    if versions:
        blocks.append(Table(["package", "version"], [[k, v or "not installed"] for k, v in versions.items()],
                            "Package versions"))
    blocks.append(Text("Command:"))
    blocks.append(Code(report.command or "n/a (not recorded)", "bash"))
    if report.recipe:
        blocks += [Text("Resolved recipe:"), Code(report.recipe, "yaml")]
    return Section("Reproduce", blocks)


def build_document(report: RunReport) -> Document:
    sections = [summary_section(report), pareto_section(report), size_section(report), quality_section(report),
                speed_section(report), throughput_section(report), spec_section(report),
                quantization_section(report), definitions_section(), reproduce_section(report)]
    sub = f"Run `{report.name}`" + (f", {report.created}" if report.created else "") + \
        f": {len(report.variants)} variant(s): {', '.join(v.name for v in report.variants)}."
    return Document(title=f"accel report: {report.name}", subtitle=sub, sections=[s for s in sections if s])


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", s).strip("-") or "x"


__all__ = ["build_document"]
