"""A report as plain data (sections of paragraphs, tables, images and code) and its two renderings:
one self-contained HTML file and a Markdown twin.

    doc = Document(title="...", header=["what", "when"], sections=[Section("run-a", "Run a", [...])])
    html = to_html(doc)              # images inlined as data:image/png;base64 URIs, inline <style>
    md, files = to_markdown(doc)     # files: {name.png: bytes}, written beside the .md

The same Document feeds both, so the HTML and the Markdown show the same numbers by construction:
every cell is formatted once, as a string, before rendering. The HTML has no external reference
(no CDN, no script, no link), so it opens offline and can be mailed as one file.
"""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, field


@dataclass
class Paragraph:
    text: str
    note: bool = False  # a caveat the reader must see (rendered highlighted)


@dataclass
class Table:
    id: str
    columns: list[str]
    rows: list[list[str]]  # cells already formatted: rendering never formats a number
    caption: str = ""


@dataclass
class Image:
    name: str  # file name of the Markdown twin's PNG, unique in the document
    png: bytes
    alt: str


@dataclass
class Code:
    text: str
    language: str = ""


@dataclass
class Highlight:
    """Text as a sequence of pieces, each shaded by its value (the FwPKM gate per token): opacity
    value / `scale`, the value itself on hover. Markdown cannot shade: there the pieces at or above
    `mark` are shown in bold."""

    pieces: list[tuple[str, float]]
    caption: str = ""
    mark: float = 0.5
    scale: float = 1.0


Block = Paragraph | Table | Image | Code | Highlight


@dataclass
class Section:
    id: str
    title: str
    blocks: list[Block] = field(default_factory=list)
    level: int = 2  # 2: a top-level section, 3: a subsection


@dataclass
class Document:
    title: str
    header: list[str]  # lines under the title: what was reported and when
    sections: list[Section]


def num(value: float | int | None, digits: int = 4, sign: bool = False) -> str:
    """One number as a report cell: `digits` decimals (4 for losses and metrics throughout), an
    explicit sign for differences, "–" for not measured (None / NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool) or isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def slug(text: str) -> str:
    """An HTML id / file-name part from a label: letters, digits and '-' only."""
    out = "".join(c if c.isalnum() else "-" for c in text.lower())
    return "-".join(part for part in out.split("-") if part) or "x"


STYLE = """
body { font-family: sans-serif; max-width: 70rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.6rem; }
td { text-align: right; font-variant-numeric: tabular-nums; }
td:first-child, th:first-child, td.text { text-align: left; }
caption { text-align: left; font-style: italic; padding-bottom: 0.2rem; }
img { max-width: 100%; }
pre { background: #f5f5f5; padding: 0.6rem; overflow-x: auto; }
.hl { font-family: monospace; white-space: pre-wrap; line-height: 1.6; border: 1px solid #ddd; padding: 0.5rem; }
.note { background: #fff4d6; border-left: 4px solid #e0a800; padding: 0.4rem 0.6rem; }
header p { margin: 0.2rem 0; color: #555; }
"""


def to_html(doc: Document) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{_e(doc.title)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>",
           "<header>", f"<h1>{_e(doc.title)}</h1>", *[f"<p>{_e(line)}</p>" for line in doc.header], "</header>"]
    if doc.sections:
        out.append("<nav><ul>")
        out += [f'<li><a href="#{_e(s.id)}">{_e(s.title)}</a></li>' for s in doc.sections if s.level == 2]
        out.append("</ul></nav>")
    for section in doc.sections:
        out.append(f'<section id="{_e(section.id)}">')
        out.append(f"<h{section.level}>{_e(section.title)}</h{section.level}>")
        out += [_block_html(block) for block in section.blocks]
        out.append("</section>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


def _block_html(block: Block) -> str:
    if isinstance(block, Paragraph):
        return f'<p class="note">{_e(block.text)}</p>' if block.note else f"<p>{_e(block.text)}</p>"
    if isinstance(block, Table):
        head = "".join(f'<th scope="col">{_e(c)}</th>' for c in block.columns)
        body = "\n".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in block.rows)
        caption = f"<caption>{_e(block.caption)}</caption>" if block.caption else ""
        return f'<table id="{_e(block.id)}">{caption}<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>'
    if isinstance(block, Image):
        data = base64.b64encode(block.png).decode("ascii")
        return f'<figure><img alt="{_e(block.alt)}" src="data:image/png;base64,{data}"></figure>'
    if isinstance(block, Code):
        return f"<pre><code>{_e(block.text)}</code></pre>"
    if isinstance(block, Highlight):
        spans = "".join(f'<span style="background: rgba(230, 80, 0, {min(max(v / block.scale, 0.0), 1.0):.2f})" title="{v:.3f}">'
                        f"{_e(text)}</span>" for text, v in block.pieces)
        caption = f"<figcaption>{_e(block.caption)}</figcaption>" if block.caption else ""
        return f'<figure>{caption}<div class="hl">{spans}</div></figure>'
    raise TypeError(f"unknown report block {type(block).__name__}")


NUMERIC = re.compile(r"^[\s0-9.,:%+\-−–eE\[\]()±×]*$")


def _td(cell: str) -> str:
    # Numbers right-aligned (the style sheet's default for cells), text such as examples left.
    return f"<td>{_e(cell)}</td>" if NUMERIC.match(cell) else f'<td class="text">{_e(cell)}</td>'


def to_markdown(doc: Document) -> tuple[str, dict[str, bytes]]:
    """The Markdown text and the PNG files it references by relative name."""
    files: dict[str, bytes] = {}
    out = [f"# {doc.title}", "", *[f"{line}  " for line in doc.header], ""]
    for section in doc.sections:
        out += [f"{'#' * section.level} {section.title}", ""]
        for block in section.blocks:
            if isinstance(block, Image):
                if block.name in files:
                    raise ValueError(f"two report images are named {block.name}")
                files[block.name] = block.png
            out += [_block_markdown(block), ""]
    return "\n".join(out), files


def _block_markdown(block: Block) -> str:
    if isinstance(block, Paragraph):
        return f"> **Note:** {block.text}" if block.note else block.text
    if isinstance(block, Table):
        lines = [f"*{block.caption}*", ""] if block.caption else []
        lines.append("| " + " | ".join(_cell(c) for c in block.columns) + " |")
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(block.columns) - 1)) + "|")
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in block.rows]
        return "\n".join(lines)
    if isinstance(block, Image):
        return f"![{block.alt}]({block.name})"
    if isinstance(block, Code):
        fence = "````" if "```" in block.text else "```"  # a code block that holds a fence of its own
        return f"{fence}{block.language}\n{block.text.rstrip()}\n{fence}"
    if isinstance(block, Highlight):
        text = "".join(f"**{_md_text(t)}**" if v >= block.mark and t.strip() else _md_text(t) for t, v in block.pieces)
        caption = f"*{block.caption}*\n\n" if block.caption else ""
        return f"{caption}> {text}"
    raise TypeError(f"unknown report block {type(block).__name__}")


def _md_text(text: str) -> str:
    """A piece of running text in a Markdown quote: newlines shown as ⏎, markup characters escaped."""
    out = text.replace("\n", "⏎ ")
    for c in "\\`*_[]<>#|":
        out = out.replace(c, "\\" + c)
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)
