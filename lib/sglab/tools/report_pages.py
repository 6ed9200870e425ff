"""One executed notebook → one HTML page of the report.

The page is nbconvert's ``lab`` rendering through the ``sglab`` template next to this file, which drops every
script the lab template loads from a CDN (require.js, MathJax, mermaid, widgets: the workbook uses none of them,
and a report opened offline or from CI artifacts showed console errors for each), titles the page with the
notebook's own title instead of "Notebook", links back to the index and lets wide tables and figures scroll
instead of being cut or shrunk.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

TEMPLATES = Path(__file__).with_name("templates")
_H1 = re.compile(r"^#\s+(.+?)\s*#*\s*$", re.M)


def notebook_title(nb, fallback: str) -> str:
    """The first ``# heading`` of the first markdown cell that has one (markdown markup stripped), else
    ``fallback`` (the file stem)."""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        m = _H1.search(cell.source)
        if m:
            return re.sub(r"[`*]", "", m.group(1)).strip()
    return fallback


def exporter():
    """An HTMLExporter on the ``sglab`` template (built once per report: building it reads the templates)."""
    from nbconvert import HTMLExporter

    return HTMLExporter(extra_template_basedirs=[str(TEMPLATES)], template_name="sglab")


def render(nb, *, title: str, status: str = "", html_exporter=None) -> str:
    """The page of an executed notebook; ``status`` (e.g. "ok · recorded · 7.8 s") goes into the top bar."""
    exp = html_exporter or exporter()
    body, _ = exp.from_notebook_node(nb, resources={"metadata": {"name": title}, "sglab_title": title,
                                                     "sglab_status": status})
    return body


def write_page(nb, path: Path, *, title: str, status: str = "", html_exporter=None) -> Path:
    """Write the page; a notebook nbconvert cannot render still gets a page that says why (and links back)."""
    try:
        body = render(nb, title=title, status=status, html_exporter=html_exporter)
    except Exception as e:  # noqa: BLE001 - one broken page must not lose the rest of the report
        body = (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
                f"<p><a href='index.html'>← sglab report index</a></p><h1>{html.escape(title)}</h1>"
                f"<p>HTML export failed: {html.escape(f'{type(e).__name__}: {e}')}</p>")
    path.write_text(body, encoding="utf-8")
    return path


def first_figure(nb) -> bytes | None:
    """The PNG bytes of the notebook's first figure (first ``image/png`` output), or None."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "image/png" in data:
                png = data["image/png"]
                return base64.b64decode("".join(png) if isinstance(png, list) else png)
    return None


def thumbnail(png: bytes, width: int = 360) -> bytes:
    """``png`` scaled down to ``width`` pixels (the index embeds it; full figures would make it megabytes).
    Pillow comes with matplotlib; without it the figure is embedded as it is."""
    try:
        import io

        from PIL import Image
    except ImportError:
        return png
    img = Image.open(io.BytesIO(png))
    if img.width > width:
        img = img.resize((width, max(1, round(img.height * width / img.width))), Image.LANCZOS)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()
