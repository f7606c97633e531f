"""A tiny document model (sections of text, tables, figures, code) and its two renderers: Markdown and HTML.

The report is built once as blocks, so the Markdown and the HTML always hold the same tables and numbers.
The HTML is self-contained: inline CSS, figures as base64 PNG data URIs, no scripts, no network.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Text:
    text: str  # plain text; `code` spans in backticks render as code


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass
class Figure:
    name: str  # file stem, e.g. "pareto"
    png: bytes
    caption: str


@dataclass
class Code:
    text: str
    lang: str = ""


Block = Text | Table | Figure | Code


@dataclass
class Section:
    title: str
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Document:
    title: str
    subtitle: str
    sections: list[Section]


def fmt(x, digits: int = 3) -> str:
    """Numbers for tables: None -> 'n/a', ints as is, floats with `digits` significant decimals."""
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if x != x:
            return "n/a"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 100:
            return f"{x:.1f}"
        return f"{x:.{digits}g}" if abs(x) < 1 else f"{x:.2f}"
    return str(x)


# ---- Markdown ---------------------------------------------------------------------------------------------
def _md_cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def render_markdown(doc: Document, figure_dir: Path, figure_prefix: str = "plots") -> str:
    """Markdown with the same tables; figures are written as PNGs under `figure_dir` and linked."""
    figure_dir.mkdir(parents=True, exist_ok=True)
    out = [f"# {doc.title}", "", doc.subtitle, ""]
    toc = [f"- [{s.title}](#{_anchor(s.title)})" for s in doc.sections]
    out += toc + [""]
    for s in doc.sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Text):
                out += [b.text, ""]
            elif isinstance(b, Table):
                if b.caption:
                    out += [f"**{b.caption}**", ""]
                out.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
                out.append("|" + "|".join("---" for _ in b.headers) + "|")
                out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
                out.append("")
            elif isinstance(b, Figure):
                (figure_dir / f"{b.name}.png").write_bytes(b.png)
                out += [f"![{b.caption}]({figure_prefix}/{b.name}.png)", "", f"*{b.caption}*", ""]
            elif isinstance(b, Code):
                out += [f"```{b.lang}", b.text.rstrip("\n"), "```", ""]
    return "\n".join(out)


def _anchor(title: str) -> str:
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c == "-")


# ---- HTML -------------------------------------------------------------------------------------------------
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1180px;padding:24px;
color:#1f2328;line-height:1.45}
h1{margin-bottom:4px}h2{border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:36px}
.subtitle{color:#57606a;margin-top:0}
nav ul{columns:3;list-style:none;padding:0}nav a{color:#0969da;text-decoration:none}
table{border-collapse:collapse;margin:8px 0 18px;font-size:13px;display:block;overflow-x:auto}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;white-space:nowrap}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
caption{caption-side:top;text-align:left;font-weight:600;padding:4px 0}
figure{margin:12px 0 24px}figure img{max-width:100%;border:1px solid #d0d7de}
figcaption{color:#57606a;font-size:13px}
pre{background:#f6f8fa;padding:12px;overflow-x:auto;font-size:12px}
code{background:#f6f8fa;padding:1px 4px}
"""


def _inline(text: str) -> str:
    """Escape, then render `code` spans."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


NUM_RE = re.compile(r"^[-+]?[\d,]*\.?\d+(e[-+]?\d+)?[x%]?$")


def _td(cell) -> str:
    """A table cell; numbers are right-aligned so digits line up."""
    text = str(cell)
    cls = ' class="num"' if NUM_RE.match(text) or text == "n/a" else ""
    return f"<td{cls}>{html.escape(text)}</td>"


def render_html(doc: Document) -> str:
    """A self-contained HTML page (no scripts, no external resources)."""
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           '<link rel="icon" href="data:,">',  # no favicon request
           f"<title>{e(doc.title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{e(doc.title)}</h1>", f'<p class="subtitle">{_inline(doc.subtitle)}</p>', "<nav><ul>"]
    out += [f'<li><a href="#{_anchor(s.title)}">{e(s.title)}</a></li>' for s in doc.sections]
    out.append("</ul></nav>")
    for s in doc.sections:
        out.append(f'<section id="{_anchor(s.title)}"><h2>{e(s.title)}</h2>')
        for b in s.blocks:
            if isinstance(b, Text):
                out.append(f"<p>{_inline(b.text)}</p>")
            elif isinstance(b, Table):
                cap = f"<caption>{e(b.caption)}</caption>" if b.caption else ""
                head = "".join(f"<th>{e(str(h))}</th>" for h in b.headers)
                body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in b.rows)
                out.append(f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            elif isinstance(b, Figure):
                data = base64.b64encode(b.png).decode("ascii")
                out.append(f'<figure id="fig-{e(b.name)}"><img alt="{e(b.caption)}" '
                           f'src="data:image/png;base64,{data}"><figcaption>{e(b.caption)}</figcaption></figure>')
            elif isinstance(b, Code):
                out.append(f"<pre><code>{e(b.text)}</code></pre>")
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out)
