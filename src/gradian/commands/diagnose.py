"""``gradian diagnose``: deterministic checks over data, config, tokenizer and logs (no GPU, no weights).

Exit codes: 0 = no finding at or above ``--fail-on`` (default ``error``);
1 = at least one finding at or above it; 2 = a user error (bad path, malformed
file, unknown config format, bad flag value). ``--fail-on never`` always exits 0
unless the inputs are unusable.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from gradian.commands import _options as O
from gradian.commands._common import console, err_console, user_errors
from gradian.errors import GradianUserError

FORMATS = ("text", "json", "md")
FAIL_ON = ("error", "warning", "info", "never")


def register(app: typer.Typer) -> None:
    """Add ``gradian diagnose`` (the Audit lane: deterministic checks, no model) to ``app``."""

    @app.command("diagnose")
    @user_errors
    def diagnose_cmd(
        data: Path | None = typer.Option(None, help="Training data: .jsonl/.json/.parquet or save_to_disk folder."),
        eval: Path | None = typer.Option(
            None,
            "--eval",
            help="Eval set, for contamination checks: the file `gradian attribute --eval` takes "
            "(prompt/messages + answer), or training-format rows.",
        ),
        config: list[Path] | None = O.configs("what the config checks read", panel=None),
        logs: Path | None = typer.Option(
            None,
            help="The training output folder (its last checkpoint's trainer_state.json is read), "
            "a checkpoint folder, trainer_state.json, or a JSONL of logged dicts.",
        ),
        tokenizer: Path | None = typer.Option(
            None,
            help="Local tokenizer folder, for token checks: the training output folder (the tokenizer "
            "and chat template the run saved) or the base model's folder.",
        ),
        versions: list[str] | None = typer.Option(
            None, "--versions", help="Library versions, e.g. trl=0.19.0 (repeatable or comma-separated)."
        ),
        list_checks: bool = typer.Option(False, "--list", help="List the checks and exit."),
        fmt: str = typer.Option("text", "--format", help="text | json | md."),
        out: Path | None = typer.Option(None, "--out", help="Write the report (in --format) to this file."),
        fail_on: str = typer.Option(
            "error",
            "--fail-on",
            help="Exit 1 when a finding at or above this severity exists: error | warning | info | never.",
        ),
        check: list[str] | None = typer.Option(None, "--check", help="Run only these check ids (repeatable)."),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="List every skipped check with its reason."),
    ) -> None:
        """Find mechanical causes of a broken fine-tune: truncation, masks, EOS, contamination, lr, epochs, logs.

        Exit codes: 0 clean (nothing at or above --fail-on), 1 findings at or above --fail-on, 2 user error.
        """
        from gradian.audit import render

        if fmt not in FORMATS:
            raise GradianUserError(f"unknown format {fmt!r}", where="--format", fix=f"use one of {', '.join(FORMATS)}")
        if fail_on not in FAIL_ON:
            raise GradianUserError(
                f"unknown level {fail_on!r}", where="--fail-on", fix=f"use one of {', '.join(FAIL_ON)}"
            )

        if list_checks:
            if fmt == "text" and out is None:
                render.checks_table(console)
                return
            text = render.checks_markdown() if fmt == "md" else render.checks_json() if fmt == "json" else None
            if text is None:  # text to a file: the markdown is the readable plain form
                text = render.checks_markdown()
            _emit(text, out)
            return

        if not any([data, eval, config, logs, tokenizer]):
            raise GradianUserError(
                "nothing to diagnose",
                where="gradian diagnose",
                fix="pass at least one of --data, --eval, --config, --logs, --tokenizer (or --list)",
            )
        if eval is not None and data is None:
            err_console.print("[yellow]note:[/] --eval without --data: contamination checks need both")

        from gradian.audit import diagnose

        configs = with_run_configs(list(config or []))  # before the spinner: it may print a note
        with console.status("running checks ...") if fmt == "text" and out is None else _Null():
            result = diagnose(
                data=data,
                eval=eval,
                configs=configs,
                logs=logs,
                tokenizer=tokenizer,
                versions=list(versions or []),
                select=check,
            )

        if fmt == "text" and out is None:
            render.render_text(result, console, verbose=verbose)
        else:
            text = {"json": render.render_json, "md": render.render_markdown}.get(fmt, render.render_markdown)(result)
            _emit(text, out)
            if out is not None:
                c = result.counts
                err_console.print(
                    f"{c['error']} errors, {c['warning']} warnings, {c['info']} info -> {escape(str(out))}"
                )
        if fail_on != "never" and result.at_or_above(fail_on):
            raise typer.Exit(1)

    def _emit(text: str, out: Path | None) -> None:
        if out is None:
            typer.echo(text, nl=False)
        else:
            from gradian.util import atomic_write_text

            atomic_write_text(out, text)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def with_run_configs(configs: list[Path]) -> list[Path]:
    """``--config`` with, for each adapter folder among them, the trainer's config found in it
    (:func:`gradian.audit.config.runfolder.find_run_folder`), named in one note on stderr (stdout may be JSON).
    """
    from gradian.audit.config.runfolder import find_run_folder

    out = list(configs)
    for c in configs:
        if Path(c).is_dir():
            found = find_run_folder(c, logs=False)
            for note in found.notes:  # (a trainer card's defaults are for the gradients, not Audit)
                err_console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
            more = [p for p in found.configs if p not in out]
            if more:
                err_console.print(
                    f"[yellow]note:[/] {escape(str(c))} is a run folder: also read "
                    + ", ".join(escape(str(p)) for p in more),
                    highlight=False,
                    soft_wrap=True,
                )
            out += more
    return out
