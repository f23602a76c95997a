"""The ``gradian`` command line: thin, typer + rich.

Each command lives in its own module under :mod:`gradian.commands` and exposes
``register(app)``; modules are discovered here, so the CLI lists exactly the
commands that exist. User mistakes (:class:`gradian.errors.GradianUserError`)
print one line and exit with code 2.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

import gradian.commands as _commands

app = typer.Typer(
    name="gradian",
    help="Which of my training examples, or which config setting, broke my LoRA fine-tune?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    for info in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"gradian.commands.{info.name}")
        mod.register(app)


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True),
    max_input_mb: int = typer.Option(
        None, "--max-input-mb", min=1,
        help="Largest input file Gradian reads, in MiB (default 4096; env GRADIAN_MAX_INPUT_MB). Gradian reads only "
             "regular files, never streams."),
) -> None:
    if version:
        from gradian import __version__

        typer.echo(__version__)
        raise typer.Exit()
    if max_input_mb is not None:
        import os

        from gradian.safeio import ENV_MAX_INPUT

        before = os.environ.get(ENV_MAX_INPUT)
        os.environ[ENV_MAX_INPUT] = str(max_input_mb)

        def restore() -> None:  # for this command only (an in-process caller keeps its own setting)
            if before is None:
                os.environ.pop(ENV_MAX_INPUT, None)
            else:
                os.environ[ENV_MAX_INPUT] = before

        ctx.call_on_close(restore)


_register_all()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
