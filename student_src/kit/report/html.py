"""The report as one self-contained HTML page: ``report/index.html``.

A TA grades the report from the submission zip. One file that opens offline in any browser is
what they need: the tables of ``report.md`` become HTML tables and every plot is embedded in
the page (a base64 ``data:`` URL), so nothing has to sit beside it and nothing is fetched.

Only the Markdown that ``report.md`` uses is understood (headings, pipe tables, images on their
own line, paragraphs, ```code``` spans and ``_emphasis_``): this is not a Markdown library, and
the kit needs none.
"""

from __future__ import annotations

import base64
import html
import mimetypes
import re
from pathlib import Path

HTML_NAME = "index.html"

IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)\s]+)\)$")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
SEPARATOR_CELL = re.compile(r"^:?-{3,}:?$")
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 60rem; margin: 2rem auto;
       padding: 0 1rem; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.6rem; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; display: block; margin: 0.5rem 0 1.5rem; }
code { background: #f3f3f3; padding: 0 0.2rem; }
.missing { color: #a00; }
"""


def inline(text: str) -> str:
    """Escape ``text`` for HTML and turn its ```code``` spans and ``_emphasis_`` into tags."""
    parts = text.split("`")
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # inside backticks (an unmatched last one stays a plain backtick)
            out.append(f"<code>{html.escape(part)}</code>" if i < len(parts) - 1 else "`" + html.escape(part))
        else:
            out.append(re.sub(r"(?<!\w)_(\S(?:.*?\S)?)_(?!\w)", r"<em>\1</em>", html.escape(part)))
    return "".join(out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def table_html(lines: list[str]) -> str:
    """A pipe table (header row, separator row, body rows) as an HTML table; numbers right-aligned."""
    head = _cells(lines[0])
    body = [_cells(l) for l in lines[1:] if not all(SEPARATOR_CELL.match(c) for c in _cells(l))]
    rows = ["<tr>" + "".join(f"<th>{inline(c)}</th>" for c in head) + "</tr>"]
    for cells in body:
        rows.append("<tr>" + "".join(f"<td class=\"num\">{inline(c)}</td>" if _is_number(c) else f"<td>{inline(c)}</td>"
                                     for c in cells) + "</tr>")
    return "<table>\n" + "\n".join(rows) + "\n</table>"


def image_html(alt: str, src: str, folder: Path) -> str:
    """The PNG ``src`` (a file in ``folder``) embedded in the page, or a visible note if it is missing."""
    path = (folder / src).resolve()
    inside = path.parent == folder.resolve() or folder.resolve() in path.parents
    if not inside or not path.is_file():
        return f"<p class=\"missing\">(plot {html.escape(src)} is missing)</p>"
    kind = mimetypes.guess_type(path.name)[0] or "image/png"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f"<img alt=\"{html.escape(alt)}\" src=\"data:{kind};base64,{data}\">"


def markdown_to_html(text: str, folder: Path) -> str:
    """The body of the page: each block of ``report.md`` (``folder`` holds the images it names)."""
    blocks, paragraph = [], []
    lines = text.splitlines()

    def flush():
        if paragraph:
            blocks.append("<p>" + inline(" ".join(paragraph)) + "</p>")
            paragraph.clear()

    i = 0
    while i < len(lines):
        line = lines[i].strip()
        heading, image = HEADING.match(line), IMAGE.match(line)
        if not line:
            flush()
        elif heading:
            flush()
            level = len(heading.group(1))
            blocks.append(f"<h{level}>{inline(heading.group(2))}</h{level}>")
        elif image:
            flush()
            blocks.append(image_html(image.group(1), image.group(2), folder))
        elif line.startswith("|"):
            flush()
            table = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                table.append(lines[i])
                i += 1
            blocks.append(table_html(table))
            continue
        else:
            paragraph.append(line)
        i += 1
    flush()
    return "\n".join(blocks)


def write_html(folder, md_name: str = "report.md", html_name: str = HTML_NAME) -> Path:
    """Write ``folder/index.html`` from ``folder/report.md`` and the plots beside it; return its path."""
    folder = Path(folder)
    text = (folder / md_name).read_text(encoding="utf-8")
    first = next((HEADING.match(l.strip()) for l in text.splitlines() if HEADING.match(l.strip())), None)
    title = html.escape(re.sub(r"[`_]", "", first.group(2))) if first else "Report"
    page = (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n"
            f"<style>{STYLE}</style>\n</head>\n<body>\n{markdown_to_html(text, folder)}\n</body>\n</html>\n")
    out = folder / html_name
    out.write_text(page, encoding="utf-8")
    return out
