"""What `accel optimize RECIPE` costs on this machine: seconds and peak RSS per stage, and for the whole run, into the
benchmark ledger (`benchmarks/ledger/optimize-<recipe name>.json`).

    .venv/bin/python scripts/bench_optimize.py recipes/qwen2.5-coder-1.5b.yaml [--keep] [--model qwen2.5-coder-0.5b]
                                               [--set quantization.table=int8g]

The recipe runs in this process from a clean run folder (`--keep`: reuse finished stages, which then cost nothing),
so the ledger's load figures watch the run itself. Run it alone: the stage seconds are what a user waits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accel.bench.ledger import Entry, figure  # noqa: E402


def stage_figures(records: dict) -> dict[str, dict]:
    """Per stage that ran: '<stage>.seconds' and '<stage>.peak_gb'; 'total.seconds', 'total.peak_gb' over them."""
    out, seconds, peaks = {}, 0.0, []
    for name, rec in records.items():
        if rec.get("status") != "ran":
            continue
        out[f"{name}.seconds"] = figure([rec["duration_s"]], "s", 1)
        seconds += rec["duration_s"]
        if rec.get("peak_rss_gb") is not None:
            out[f"{name}.peak_gb"] = figure([rec["peak_rss_gb"]], "GB", 2)
            peaks.append(rec["peak_rss_gb"])
    if not out:
        raise SystemExit("no stage ran (every stage reused?): run without --keep")
    out["total.seconds"] = figure([seconds], "s", 1)
    if peaks:
        out["total.peak_gb"] = figure([max(peaks)], "GB", 2)
    return out


def with_overrides(path: Path, model: str | None, sets: list[str]):
    """The recipe at `path`, on `model` (its name then ends '-on-<model>') and with each KEY=VALUE set, validated
    as the recipe file would be."""
    import yaml

    from accel.recipe import parse_recipe

    data = yaml.safe_load(path.read_text())
    if model:
        data["name"] = f"{data['name']}-on-{Path(model).name}"
        data.setdefault("model", {})["path"] = model
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE, e.g. quantization.table=int8g")
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return parse_recipe(data, str(path))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", type=Path)
    ap.add_argument("--keep", action="store_true",
                    help="resume the run folder: finished stages are reused and count with the costs they recorded")
    ap.add_argument("--model", help="run the recipe on another model (a registry name or folder): the same stages "
                    "side by side at another size; its run folder and ledger key are the recipe's name + '-on-' + it")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override one recipe field (dotted path, a YAML value), e.g. quantization.table=int8g where "
                         "--model ties its table the recipe quantizes alone; repeatable")
    ap.add_argument("--recorded", action="store_true",
                    help="run nothing: enter the costs the run folder's manifest recorded (no load watched)")
    a = ap.parse_args(argv)
    from accel.cli.pipeline import run_pipeline
    from accel.pipeline.optimize import clean
    from accel.pipeline.stages import read_manifest

    recipe = with_overrides(a.recipe, a.model, a.set)
    entry = Entry(f"optimize-{recipe.name}", info={"recipe": str(a.recipe), "model": recipe.model.path})
    if a.recorded:
        entry.info["recorded_from"] = str(recipe.run_dir())
        entry.figures = stage_figures(read_manifest(recipe.run_dir()))
        entry.write()
        return
    if not a.keep:
        clean(recipe)
    before = read_manifest(recipe.run_dir())
    with entry:
        try:
            run_pipeline(recipe, [])
        except SystemExit as e:  # a failed gate exits 1 after every stage ran; the costs still count
            if e.code not in (0, 1, None):
                raise
        records = read_manifest(recipe.run_dir())
        # --keep resumes an interrupted run: a stage it reused counts with the costs it recorded when it ran
        earlier = {n: before[n] for n, r in records.items()
                   if r.get("status") == "reused" and before.get(n, {}).get("status") == "ran"}
        if earlier:
            entry.info["earlier_stages"] = sorted(earlier)
        entry.figures = stage_figures({**records, **earlier})


if __name__ == "__main__":
    main()
