"""README's tables, rendered from the benchmark ledger (`accel.bench.ledger`).

A README block

    <!-- ledger: RENDERER KEY [KEY ...] -->
    ...
    <!-- /ledger -->

is what RENDERER makes of those entries: the machine and commit line, the table, the command that measured it.
`scripts/render_readme.py` rewrites every block of the RENDERED files; `tests/bench/test_ledger.py` fails when one
differs from its rendering, so a figure in them is always the ledger's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from accel.bench.ledger import LEDGER_DIR, read

RENDERED = ("README.md", "benchmarks/README.md")
"""The files with ledger blocks (repository-relative): README's headline tables, the benchmarks folder's others."""
BLOCK = re.compile(r"(<!-- ledger: (\S+)((?: \S+)+) -->\n)(.*?)(<!-- /ledger -->)", re.S)


def machine_line(entries: list[dict]) -> str:
    """'CPU, N cores (flags), commit C': one machine per table, or the table refuses to render."""
    machines = {(e["machine"]["cpu"], e["machine"]["cores"]) for e in entries}
    if len(machines) != 1:
        raise ValueError(f"entries {[e['key'] for e in entries]} were measured on different machines: "
                         f"{sorted(machines)}; re-measure them on one")
    m = entries[0]["machine"]
    flags = ", ".join(f for f in m["flags"] if f.startswith(("avx512f", "avx512_vnni", "amx"))) or "AVX2"
    commits = sorted({e["commit"][:7] + ("+dirty" if e["commit"].endswith("+dirty") else "") for e in entries})
    return f"{m['cpu']}, {m['cores']} cores ({flags}), {m['memory_gb']:.0f} GB; commit {', '.join(commits)}"


def _cell(entry: dict, key: str, scale: float = 1.0, digits: int = 1) -> str:
    f = entry["figures"].get(key)
    if f is None:
        return "-"
    med = f["median"] * scale
    if f["n"] > 1:
        return f"{med:.{digits}f} ± {(f['max'] - f['min']) * scale / 2:.{digits}f}"
    return f"{med:.{digits}f}"


def commands(entries: list[dict]) -> list[str]:
    """The entries' commands as a reader reruns them: the venv's python and where the JSON copy went left out."""
    return sorted({re.sub(r" --json \S+", "", e["command"].replace(".venv/bin/python ", "")) for e in entries})


def optimize_costs(entries: list[dict]) -> str:
    """`scripts/bench_optimize.py` entries: minutes of the long stages and of the whole run, and its peak RSS."""
    head = "| recipe | sensitivity, min | quantize, min | evaluate, min | whole run, min | peak RSS, GB |"
    rows = [head, "|---|---|---|---|---|---|"]
    for e in entries:
        name = e["key"].removeprefix("optimize-")
        cells = [_cell(e, f"{s}.seconds", 1 / 60) for s in ("sensitivity", "quantize", "evaluate")]
        rows.append(f"| `{name}` | " + " | ".join(cells) + f" | {_cell(e, 'total.seconds', 1 / 60)} | "
                    f"{_cell(e, 'total.peak_gb', 1, 2)} |")
    return "\n".join([machine_line(entries) + ":", "", *rows, "", "```bash", *commands(entries), "```"])


def _ratio_cell(entry: dict, key: str) -> str:
    f = entry["figures"].get(key)
    if f is None:
        return "-"
    return f"{f['median']:.2f}x" + (f" ({f['min']:.2f}-{f['max']:.2f})" if f["n"] > 1 else "")


def peer_speed(entries: list[dict]) -> str:
    """`scripts/bench_peers.py` entries: per section and pair, accel's and the peer's median ± half their spread
    and the median of the paired ratios (its range), llama-bench style; rows against other references (the
    server's own cost, the roofline) are left to the entry."""
    peer = entries[0]["info"]["peer"]
    rows = [f"| section | accel / {peer} | accel | {peer} | ratio |", "|---|---|---|---|---|"]
    last = None  # a section is named on its first row only
    for e in entries:
        labels = e["info"].get("labels", {})
        for key in e["figures"]:
            base, _, side = key.rpartition(".")
            parts = base.split("|")
            if side != "ratio" or len(parts) != 2:
                continue
            section, pair = parts
            unit = e["figures"][f"{base}.accel"]["unit"]
            name, last = (f"{section} ({unit})" if section != last else ""), section
            rows.append(f"| {name} | {labels.get(pair, pair)} | {_cell(e, base + '.accel')} | "
                        f"{_cell(e, base + '.peer')} | {_ratio_cell(e, key)} |")
    return "\n".join([machine_line(entries) + ":", "", *rows, "", "```bash", *commands(entries), "```"])


def quality(entries: list[dict]) -> str:
    """`scripts/bench_quality.py` entries: per model file its size, mean KLD against the unquantized model and the
    share of positions whose top-1 token is the same, on the chunks the entry names."""
    rows = ["| model file | MiB | mean KLD | same top-1 |", "|---|---|---|---|"]
    for e in entries:
        for name in e["info"]["rows"]:
            top1 = e["figures"].get(f"{name}.same_top1")
            label = re.sub(r"^accel (?:\S*/)?runs/([^/\s]+)/checkpoint$", r"accel `\1`", name)  # an export: its run
            rows.append(f"| {label} | {_cell(e, f'{name}.size_mib', 1, 0)} | {_cell(e, f'{name}.kld_mean', 1, 4)} | "
                        + (f"{top1['median'] * 100:.1f}% |" if top1 else "- |"))
    scored = sorted({f"{e['info']['chunks']} chunks of {e['info']['n_ctx']} tokens" for e in entries})
    return "\n".join([f"{machine_line(entries)}; {', '.join(scored)}:", "", *rows, "", "```bash", *commands(entries),
                      "```"])


def _method_label(method: str, info: dict) -> str:
    """'ngram:num_speculative_tokens=15' -> 'n-gram lookup, k=15'; a draft model named with its quantization."""
    name, _, opts = method.partition(":")
    label = {"off2": "none, again (the noise floor)", "ngram": "n-gram lookup"}.get(name, name)
    if name.startswith("draft") and info.get("draft_model"):
        label = f"draft `{info['draft_model']}`" + (f" {info['draft_quantization']}" if info.get("draft_quantization")
                                                    else "")
    opts = opts.replace("num_speculative_tokens=", "k=").replace("+", ", ")
    return label + (f", {opts}" if opts else "")


def speculation(entries: list[dict]) -> str:
    """`scripts/bench_spec.py` entries: per target, prompt set, batch and method, tokens/s without and with
    speculation (same engine, same weights), the median paired speedup (its range), the acceptance rate and the
    mean accepted length (tokens per verify step)."""
    rows = ["| target | prompts | batch | method | tok/s, none | tok/s | speedup | acceptance | accepted length |",
            "|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        info = e["info"]
        target = f"{Path(info['target']).name} {info.get('quant', '')}".strip()
        for key in e["figures"]:
            base, _, side = key.rpartition(".")
            if side != "speedup":
                continue
            batch, prompts, method = base.split("|")
            rows.append(f"| {target} | {prompts} | {batch[1:]} | {_method_label(method, info)} | "
                        f"{_cell(e, f'{batch}|{prompts}|off.tok_s')} | {_cell(e, base + '.tok_s')} | "
                        f"{_ratio_cell(e, key)} | {_cell(e, base + '.acceptance', 1, 2)} | "
                        f"{_cell(e, base + '.accepted_length', 1, 2)} |")
    return "\n".join([machine_line(entries) + ":", "", *rows, "", "```bash", *commands(entries), "```"])


RENDERERS: dict[str, Callable[[list[dict]], str]] = {"optimize_costs": optimize_costs, "peer_speed": peer_speed,
                                                     "quality": quality, "speculation": speculation}


def render(text: str, directory: Path = LEDGER_DIR) -> str:
    """`text` with every ledger block re-rendered from the ledger."""
    def one(m: re.Match) -> str:
        name, keys = m.group(2), m.group(3).split()
        if name not in RENDERERS:
            raise ValueError(f"README block renderer {name!r}: allowed {sorted(RENDERERS)}")
        return m.group(1) + RENDERERS[name]([read(k, directory) for k in keys]) + "\n" + m.group(5)

    return BLOCK.sub(one, text)
