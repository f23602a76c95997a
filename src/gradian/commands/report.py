"""``gradian report RUN_DIR``: re-render a finished run (no model is loaded, nothing is recomputed).

Without ``--format``: write ``RUN_DIR/report.html`` and print the terminal summary.
With ``--format html|md|json|text``: write that format to ``--out`` (html defaults to
``RUN_DIR/report.html`` and md to ``RUN_DIR/report.md``; json and text default to standard output;
``--out -`` is standard output for every format).
Exit codes: 0 on success, 2 on a user error (no run.json in RUN_DIR, a malformed
run.json, an unknown format, an --out folder that does not exist).
"""

from __future__ import annotations

from pathlib import Path

import typer

from gradian.commands import _options as O
from gradian.commands._common import console, user_errors
from gradian.errors import GradianUserError


def register(app: typer.Typer) -> None:
    """Add ``gradian report`` (render a run folder as html, md, json or text) to ``app``."""

    @app.command("report")
    @user_errors
    def report_cmd(
        run_dir: Path = O.RUN_DIR,
        fmt: str | None = typer.Option(
            None, "--format", help="html | md | json | text (default: write RUN_DIR/report.html and print the summary)."
        ),
        out: Path | None = typer.Option(
            None,
            "--out",
            help="Write the report here instead ('-': standard output). Default: RUN_DIR/report.html for html, "
            "RUN_DIR/report.md for md, standard output for json and text.",
        ),
        details: bool = typer.Option(False, "--details", help="Terminal summary: also print the details."),
        no_logs: bool = typer.Option(
            False, "--no-logs", help="Do not read the training log file named in the manifest."
        ),
    ) -> None:
        """Re-render a finished run as HTML, Markdown, JSON or text; nothing is recomputed."""
        from gradian.report import FORMATS, render, render_terminal, report_for_run
        from gradian.util import atomic_write_text

        if fmt is not None and fmt not in FORMATS:
            raise GradianUserError(f"unknown format {fmt!r}", where="--format", fix=f"use one of {', '.join(FORMATS)}")
        if not run_dir.exists():
            raise GradianUserError(
                "run folder not found", where=str(run_dir), fix="pass the folder `gradian attribute --out` wrote"
            )
        to_stdout = out is not None and str(out) == "-"
        if out is not None and not to_stdout and not out.parent.exists():
            raise GradianUserError(
                "the folder of --out does not exist", where=str(out), fix=f"create {out.parent} first"
            )
        report = report_for_run(run_dir, read_logs=not no_logs)
        base = run_dir if run_dir.is_dir() else run_dir.parent
        if to_stdout:
            typer.echo(render(report, fmt or "html"), nl=False)
            return
        if fmt is None or fmt == "html" or (fmt == "md" and out is None):
            target = out or base / ("report.md" if fmt == "md" else "report.html")
            atomic_write_text(target, render(report, fmt or "html"))
            if fmt is None:
                render_terminal(report, console, details=details)
            console.print(_dim(f"report → {target}"))
            return
        text = render(report, fmt)
        if out is not None:
            atomic_write_text(out, text)
            console.print(_dim(f"report → {out}"))
        elif fmt == "text":
            render_terminal(report, console, details=True)
        else:
            typer.echo(text, nl=False)


def _dim(s: str):
    from rich.text import Text

    from gradian.report.safe import clean

    return Text(clean(s), style="dim")
