"""accel.report: a run result (JSON) -> report.md + a self-contained report.html with plots.

    from accel.report import build_report, machine_info
    md_path, html_path = build_report(json.load(open("runs/demo/eval.json")), "runs/demo")

The input shape is documented in `accel.report.schema`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accel.report.doc import render_html, render_markdown
from accel.report.environment import machine_info, package_versions
from accel.report.schema import ReportInputError, RunReport, Variant, report_from_bench
from accel.report.sections import build_document


def build_report(result_json: dict[str, Any] | RunReport, out_dir: str | Path) -> tuple[Path, Path]:
    """Write `report.md` (+ `plots/*.png`) and `report.html` into out_dir; returns their paths.

    When the result has no `machine`, the machine rendering the report is recorded (and said so).
    """
    report = result_json if isinstance(result_json, RunReport) else RunReport.from_dict(result_json)
    if not report.machine:
        report.machine = {**machine_info(), "note": "recorded when the report was rendered"}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = build_document(report)
    md_path, html_path = out / "report.md", out / "report.html"
    md_path.write_text(render_markdown(doc, out / "plots"), encoding="utf-8")
    html_path.write_text(render_html(doc), encoding="utf-8")
    return md_path, html_path


__all__ = ["build_report", "machine_info", "package_versions", "RunReport", "Variant",
           "ReportInputError", "report_from_bench"]
