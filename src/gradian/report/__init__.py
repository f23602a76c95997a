"""The report: one model (schema ``gradian.report/1``) joining Evaluate, Attribute and Audit, and its renderers.

* :func:`build_report` (pure, :mod:`~gradian.report.builders`) turns a ``gradian.run/1`` dict into a
  :class:`Report` (:mod:`~gradian.report.views`; JSON Schema: :mod:`~gradian.report.schema`);
  :func:`report_for_run` reads ``RUN_DIR/run.json`` (and the training log, when it still exists) first.
* :func:`render_html` (self-contained page, inline CSS + SVG, no script), :func:`render_markdown`,
  :func:`render_terminal` / :func:`render_text` (rich), :func:`report_json` (the JSON form).
* :func:`write_reports` writes them atomically.

Docs: ``docs/report.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradian.util import lazy_attributes

FORMATS = ("html", "md", "json", "text")

#: Public name -> the module that defines it, imported on first access (PEP 562): the CLI's helpers import
#: :mod:`gradian.report.safe` for every command, which must not import the renderers (numpy, markdown) with it.
_LAZY = {
    "build_report": "gradian.report.builders",
    "render_html": "gradian.report.html",
    "load_report_json": "gradian.report.io",
    "read_training_log": "gradian.report.io",
    "report_for_run": "gradian.report.io",
    "report_json": "gradian.report.io",
    "render_markdown": "gradian.report.markdown",
    "render_terminal": "gradian.report.terminal",
    "render_text": "gradian.report.terminal",
    "REPORT_SCHEMA": "gradian.report.views",
    "Report": "gradian.report.views",
}

if TYPE_CHECKING:  # pragma: no cover
    from gradian.report.builders import build_report
    from gradian.report.html import render_html
    from gradian.report.io import load_report_json, read_training_log, report_for_run, report_json
    from gradian.report.markdown import render_markdown
    from gradian.report.terminal import render_terminal, render_text
    from gradian.report.views import REPORT_SCHEMA, Report


__getattr__, __dir__ = lazy_attributes("gradian.report", _LAZY, globals())


def render(report: Report, fmt: str) -> str:
    """The report in ``fmt`` (``html``, ``md``, ``json`` or ``text``)."""
    if fmt == "html":
        from gradian.report.html import render_html

        return render_html(report)
    if fmt == "md":
        from gradian.report.markdown import render_markdown

        return render_markdown(report)
    if fmt == "json":
        from gradian.report.io import report_json

        return report_json(report)
    if fmt == "text":
        from gradian.report.terminal import render_text

        return render_text(report)
    raise ValueError(f"unknown report format {fmt!r} (use one of {', '.join(FORMATS)})")


__all__ = [
    "FORMATS",
    "REPORT_SCHEMA",
    "Report",
    "build_report",
    "load_report_json",
    "read_training_log",
    "render",
    "render_html",
    "render_markdown",
    "render_terminal",
    "render_text",
    "report_for_run",
    "report_json",
]
