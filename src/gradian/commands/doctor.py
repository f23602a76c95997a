"""``gradian doctor``: check Python, the libraries against the supported window, the device, the cache and
the optional pieces; print a fix for each problem. Exit 0 when every required piece is fine, else 1.
"""

from __future__ import annotations

import json

import typer
from rich.table import Table
from rich.text import Text

from gradian.commands._common import console, user_errors

_STATUS = {
    "ok": ("ok", "green"),
    "problem": ("PROBLEM", "bold red"),
    "missing": ("missing", "yellow"),
    "info": ("·", "cyan"),
}
_GROUPS = {
    "python": "Python and libraries",
    "required": None,
    "device": "Device",
    "cache": "Cache",
    "optional": "Optional pieces",
}


def print_doctor(report, con=console) -> None:
    """One line per check, grouped (same column widths in every group; long notes wrap under
    themselves); then one fix per problem and the verdict.
    """
    w_name = max(len(c.name) for c in report.checks)
    w_found = min(24, max(len(c.found or "—") for c in report.checks))
    con.print(Text("gradian doctor", style="bold"))
    grid = None
    last = None
    for c in report.checks:
        if c.group != last and _GROUPS.get(c.group) is not None:
            if grid is not None:
                con.print(grid)
            con.print(Text(_GROUPS[c.group], style="bold"))
            grid = Table.grid(padding=(0, 2))
            grid.add_column(no_wrap=True, width=9)
            grid.add_column(no_wrap=True, width=w_name)
            grid.add_column(width=w_found, overflow="fold")
            grid.add_column(ratio=1, overflow="fold")
        last = c.group
        label, style = _STATUS.get(c.status, (c.status, ""))
        note = " · ".join(x for x in (f"supported {c.wanted}" if c.wanted else "", c.detail or "") if x)
        grid.add_row(Text("  " + label, style=style), Text(c.name), Text(c.found or "—"), Text(note, style="dim"))
    if grid is not None:
        con.print(grid)
    probs = report.problems
    if probs:
        con.print(Text("Fixes", style="bold"))
        for c in probs:
            tag = "required" if c.required else "optional"
            con.print(Text.assemble(("  " + c.name, "bold"), f" ({tag}): ", (c.fix or "", "green")))
    n_req = sum(1 for c in probs if c.required)
    verdict = "all required pieces are fine" if report.ok else f"{n_req} required piece(s) need fixing"
    con.print(Text(verdict, style="bold green" if report.ok else "bold red"))


def register(app: typer.Typer) -> None:
    """Add ``gradian doctor`` (what this install can run, and what is missing) to ``app``."""

    @app.command("doctor")
    @user_errors
    def doctor_cmd(
        as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON (schema gradian.doctor/1)."),
    ) -> None:
        """Check the environment: versions against the supported window, device and bf16, cache, optional pieces."""
        from gradian.doctor import run_doctor

        report = run_doctor()
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2))
        else:
            print_doctor(report)
        raise typer.Exit(0 if report.ok else 1)
