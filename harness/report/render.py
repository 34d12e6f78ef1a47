"""How the report is written: the ranking as a terminal table, and a small Markdown writer that
writes the same document as HTML (no Markdown library: the report is tables, headings, lists
and images, and the HTML must embed its plots to be readable as one MLflow artifact)."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.table import Table

from harness.report.format import _clip_triple, _code, fmt, fmt_interval, fmt_pct, fmt_pct_interval
from harness.report.plots import (
    PlotFile,
)
from harness.report.studydata import CellRow, StudyData


def _notes(r: CellRow) -> str:
    marks = [what for on, what in ((r.is_baseline, "baseline"), (r.inert_clip, "inert clip")) if on]
    counts = (
        (r.n_failed, "failed"),
        (r.n_unfinished, "unfinished"),
        (r.n_missing_metric, "without metric"),
    )
    return ", ".join(marks + [f"{n} {what}" for n, what in counts if n])


RANKING_HEADER = (
    "#",
    "cell",
    "IQM [95 % CI]",
    "mean [95 % CI]",
    "median",
    "P(improve) [95 % CI]",
    "collapse",
    "diverged/seeds",
    "final KL",
    "clip low / high / dual",
    "notes",
)


def _ranking_cells(i: int, r: CellRow) -> list[str]:
    return [
        str(i),
        r.label,
        fmt_interval(r.iqm),
        fmt_interval(r.mean),
        fmt(r.median),
        "baseline" if r.is_baseline else fmt_pct_interval(r.p_improve),
        fmt_pct(r.collapse_rate),
        f"{r.n_diverged}/{r.n_seeds}",
        fmt(r.final_kl),
        _clip_triple(r),
        _notes(r),
    ]


def render_ranking_table(rows: Sequence[CellRow], data: StudyData) -> Table:
    """The ranking as a ``rich`` table for the terminal (``harness ablate`` prints it at the end).

    Same columns as the report's table; the baseline row is bold, diverged counts are red and
    inert-clipping cells yellow, so the failure counts are seen together with the intervals.
    """
    arrow = "↑" if data.direction == "maximize" else "↓"
    table = Table(
        title=f"{data.study}: IQM of {data.metric} {arrow} (95 % bootstrap CI)",
        caption="P(improve) = chance a run of the cell beats a run of the baseline",
        show_header=True,
        header_style="bold",
    )
    for h in RANKING_HEADER:
        table.add_column(h, justify="left" if h in ("cell", "notes") else "right")
    for i, r in enumerate(rows, 1):
        cells = _ranking_cells(i, r)
        if r.n_diverged:
            cells[7] = f"[red]{cells[7]}[/red]"
        if r.inert_clip:
            cells[10] = f"[yellow]{cells[10]}[/yellow]"
        table.add_row(
            *(_rich_escape(c) if j not in (7, 10) else c for j, c in enumerate(cells)),
            style="bold" if r.is_baseline else None,
        )
    return table


def _rich_escape(text: str) -> str:
    """Escape rich markup in data (a cell label such as ``[a,b]`` must print literally)."""
    return text.replace("[", r"\[")


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1250px;
margin:2em auto;padding:0 1em;color:#1d1d1f;line-height:1.45}
h1{font-size:1.6em;border-bottom:2px solid #ddd;padding-bottom:.2em}
h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #eee}
h3{font-size:1.05em}
.tw{overflow-x:auto}
table{border-collapse:collapse;margin:.6em 0;font-size:.86em}
th,td{border:1px solid #d0d0d0;padding:.25em .55em;vertical-align:top}
th{background:#f3f3f3;text-align:left}
tr:nth-child(even) td{background:#fafafa}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
code{background:#f2f2f2;padding:0 .25em;border-radius:3px;font-size:.92em}
td.label code{white-space:nowrap;font-size:1em}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;border-radius:4px}
figure{margin:1em 0}
figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85em;color:#555}
ul.warnings li{background:#fff7e0;border-left:4px solid #e0a800;padding:.3em .6em;
margin:.3em 0;list-style:none}
ul.conclusion li{margin:.25em 0}
"""

_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ITALIC = re.compile(r"(?<![\w*])\*(?=\S)([^*]+?)(?<=\S)\*(?![\w*])")


def _inline_html(text: str) -> str:
    """Escape text for HTML, then render the inline marks the report uses: `code`, **bold**,
    *italic* (code spans first, so a `*` inside code stays literal)."""
    parts = re.split(r"(`[^`]+`)", html.escape(text, quote=True))
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(f"<code>{part[1:-1]}</code>")
        else:
            out.append(_ITALIC.sub(r"<em>\1</em>", _BOLD.sub(r"<strong>\1</strong>", part)))
    return "".join(out)


def _md_cell(text: str) -> str:
    return md_safe(text.replace("|", r"\|").replace("\n", " "))


_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _code_span_end(text: str, start: int) -> int:
    """Where the code span opened by the backtick run at ``start`` ends (just past its closing
    run), or -1 when the run opens none: CommonMark closes a span with the next run of exactly
    as many backticks.  A candidate holding a line break is refused: a line that starts with a
    tag inside it would still begin an HTML block, so its text is escaped like any other."""
    run = start
    while run < len(text) and text[run] == "`":
        run += 1
    width = run - start
    i = run
    while True:
        i = text.find("`" * width, i)
        if i < 0:
            return -1
        j = i
        while j < len(text) and text[j] == "`":
            j += 1
        if j - i == width:
            return -1 if any(c in text[run:i] for c in "\r\n") else j
        i = j


def md_safe(text: str) -> str:
    """Markdown text with every raw-HTML opening outside code spans escaped.

    Labels, descriptions, reasons and config values reach report.md as they were written, and a
    renderer that passes HTML through would run a ``<script>`` among them.  CommonMark starts
    raw HTML (and HTML blocks) only at ``<`` followed by a letter, ``/``, ``!`` or ``?``; each
    such ``<`` outside a code span becomes ``&lt;``, which every renderer shows as ``<``.  A
    ``<`` before anything else ("entropy < 1") and the contents of code spans (where HTML is
    never interpreted) are left alone; backslash escapes are kept whole, so ``\\<`` stays
    escaped and a ``\\``` opens no span.  Where the span structure is in doubt (a break inside
    a candidate span) the text is escaped: at worst a ``&lt;`` shows inside a span."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in _PUNCT:
            out.append(text[i : i + 2])
            i += 2
        elif c == "`":
            end = _code_span_end(text, i)
            if end < 0:  # a literal run of backticks
                j = i
                while j < n and text[j] == "`":
                    j += 1
                end = j
            out.append(text[i:end])
            i = end
        elif (
            c == "<"
            and i + 1 < n
            and (text[i + 1] in "/!?" or text[i + 1].isascii() and text[i + 1].isalpha())
        ):
            out.append("&lt;")
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _fence(text: str) -> str:
    """A code fence longer than any backtick run in ``text``, so the text cannot close it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


_NUMERIC = re.compile(r"^[\s\d.,%\[\]—−+e/\-∞]+$")


@dataclass
class _Doc:
    """Writes the same content as markdown and as HTML, block by block."""

    md: list[str] = field(default_factory=list)
    html: list[str] = field(default_factory=list)

    def heading(self, level: int, text: str) -> None:
        self.md += ["#" * level + " " + md_safe(text), ""]
        self.html.append(f"<h{level}>{_inline_html(text)}</h{level}>")

    def para(self, text: str) -> None:
        self.md += [md_safe(text), ""]
        self.html.append(f"<p>{_inline_html(text)}</p>")

    def bullets(self, items: Sequence[str], css: str = "") -> None:
        self.md += [f"- {md_safe(t)}" for t in items] + [""]
        cls = f' class="{css}"' if css else ""
        self.html.append(
            f"<ul{cls}>" + "".join(f"<li>{_inline_html(t)}</li>" for t in items) + "</ul>"
        )

    def code(self, text: str) -> None:
        fence = _fence(text)
        self.md += [fence, text, fence, ""]
        self.html.append(f"<pre><code>{html.escape(text)}</code></pre>")

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]], code_col: int = -1):
        """A table; column ``code_col`` (cell labels, config keys) is shown as code."""

        def cell_md(j: int, c: str) -> str:
            return _md_cell(_code(c) if j == code_col and c else c)

        self.md.append("| " + " | ".join(_md_cell(h) for h in header) + " |")
        self.md.append("|" + "|".join("---" for _ in header) + "|")
        self.md += ["| " + " | ".join(cell_md(j, c) for j, c in enumerate(r)) + " |" for r in rows]
        self.md.append("")
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = []
        for r in rows:
            tds = []
            for j, c in enumerate(r):
                inner = f"<code>{html.escape(c)}</code>" if j == code_col and c else _inline_html(c)
                cls = ' class="num"' if c and j != code_col and _NUMERIC.match(c) else ""
                cls = ' class="label"' if j == code_col else cls  # a cell label: one line
                tds.append(f"<td{cls}>{inner}</td>")
            body.append("<tr>" + "".join(tds) + "</tr>")
        self.html.append(
            f'<div class="tw"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>"
        )

    def figure(self, plot: PlotFile, rel: str) -> None:
        title = md_safe(plot.title)
        self.md += [f"### {title}", "", f"![{title}]({rel})", "", md_safe(plot.caption), ""]
        b64 = base64.b64encode(plot.path.read_bytes()).decode("ascii")
        self.html.append(
            f"<figure><h3>{html.escape(plot.title)}</h3>"
            f'<img src="data:image/png;base64,{b64}" alt="{html.escape(plot.title)}">'
            f"<figcaption>{_inline_html(plot.caption)}</figcaption></figure>"
        )

    def render_html(self, title: str) -> str:
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(self.html)
            + "\n</body></html>\n"
        )
