"""A tiny document model rendered twice: Markdown (plots as PNG files) and one self-contained
HTML page (plots embedded as base64 PNG). Inline text may use `code` and **bold**."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Block:
    kind: str  # h | p | callout | table | code | img | kv
    text: str = ""
    level: int = 2
    tone: str = ""  # callout: good | warn | bad
    headers: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    marked: set[int] = field(default_factory=set)  # table rows to highlight
    name: str = ""
    png: bytes | None = None


def h(text: str, level: int = 2) -> Block:
    return Block("h", text, level=level)


def p(text: str) -> Block:
    return Block("p", text)


def callout(text: str, tone: str) -> Block:
    return Block("callout", text, tone=tone)


def table(headers: list[str], rows: list[list[Any]], marked: set[int] | None = None) -> Block:
    return Block("table", headers=headers, rows=rows, marked=marked or set())


def kv(pairs: list[tuple[str, Any]]) -> Block:
    return Block("kv", rows=[[k, v] for k, v in pairs])


def code(text: str, lang: str = "") -> Block:
    return Block("code", text, name=lang)


def img(name: str, title: str, png: bytes | None, why: str = "") -> Block:
    return Block("img", why, name=name, level=0, headers=[title], png=png)


# ---- Markdown -----------------------------------------------------------------------------
def _md_cell(v: Any) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def to_markdown(title: str, blocks: list[Block], plot_dir: str = "plots") -> str:
    out = [f"# {title}", ""]
    for b in blocks:
        if b.kind == "h":
            out += ["#" * b.level + " " + b.text, ""]
        elif b.kind == "p":
            out += [b.text, ""]
        elif b.kind == "callout":
            icon = {"good": "✅", "warn": "⚠️", "bad": "❌"}.get(b.tone, "")
            out += [f"> {icon} {b.text}", ""]
        elif b.kind in ("table", "kv"):
            headers = b.headers or ["", ""]
            out.append("| " + " | ".join(headers) + " |")
            out.append("|" + "---|" * len(headers))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("")
        elif b.kind == "code":
            out += [f"```{b.name}", b.text.rstrip("\n"), "```", ""]
        elif b.kind == "img":
            if b.png is not None:
                out += [f"![{b.headers[0]}]({plot_dir}/{b.name}.png)", ""]
            else:
                out += [f"*{b.headers[0]}: not drawn — {b.text}*", ""]
    return "\n".join(out).rstrip() + "\n"


# ---- HTML ---------------------------------------------------------------------------------
_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1180px;margin:24px auto;
 padding:0 20px;color:#1b1f23;line-height:1.45}
h1{font-size:26px;margin-bottom:4px}h2{border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:34px}
h3{margin-top:22px}
table{border-collapse:collapse;margin:10px 0;font-size:13px}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}tr.mark td{background:#fff4e5}
table.kv td:first-child{font-weight:600;background:#f6f8fa;white-space:nowrap}
code{background:#f3f4f6;padding:1px 4px;border-radius:4px;font-size:12.5px}
pre{background:#f6f8fa;border:1px solid #d0d7de;padding:10px;overflow-x:auto;font-size:12px}
pre code{background:none;padding:0}
.callout{padding:10px 14px;border-radius:6px;margin:12px 0;border-left:5px solid}
.good{background:#e9f7ef;border-color:#2ca02c}.warn{background:#fff8e1;border-color:#e6a700}
.bad{background:#fdecea;border-color:#d62728}
.headline{display:grid;grid-template-columns:repeat(4,1fr);gap:10px;margin:14px 0}
figure{margin:14px 0}figcaption{font-size:13px;color:#57606a}
img{max-width:100%;border:1px solid #eaeef2}
.noplot{color:#57606a;font-style:italic}
"""


def _inline(text: str) -> str:
    s = html.escape(str(text))
    s = _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", s)
    return _BOLD.sub(lambda m: f"<b>{m.group(1)}</b>", s)


def to_html(title: str, blocks: list[Block]) -> str:
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
           f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{html.escape(title)}</h1>"]
    for b in blocks:
        out.append(_html_block(b))
    out.append("</body></html>")
    return "\n".join(out)


def _html_block(b: Block) -> str:
    if b.kind == "h":
        return f"<h{b.level}>{_inline(b.text)}</h{b.level}>"
    if b.kind == "p":
        return f"<p>{_inline(b.text)}</p>"
    if b.kind == "callout":
        return f"<div class='callout {b.tone}'>{_inline(b.text)}</div>"
    if b.kind in ("table", "kv"):
        cls = " class='kv'" if b.kind == "kv" else ""
        head = "<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in b.headers) + "</tr>" if b.headers else ""
        rows = "".join(
            f"<tr{' class=mark' if i in b.marked else ''}>"
            + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>"
            for i, row in enumerate(b.rows))
        return f"<table{cls}>{head}{rows}</table>"
    if b.kind == "code":
        return f"<pre><code>{html.escape(b.text)}</code></pre>"
    if b.kind == "img":
        if b.png is None:
            return f"<p class='noplot'>{html.escape(b.headers[0])}: not drawn — {_inline(b.text)}</p>"
        data = base64.b64encode(b.png).decode()
        return (f"<figure><img alt='{html.escape(b.headers[0])}' "
                f"src='data:image/png;base64,{data}'><figcaption>{html.escape(b.headers[0])}"
                "</figcaption></figure>")
    raise ValueError(f"unknown block kind {b.kind!r}")
