"""The ``gradian`` command line: thin, typer + rich.

Each command lives in its own module under :mod:`gradian.commands`, named as the command, and exposes
``register(app)``; modules are discovered here, so the CLI lists exactly the commands that exist. A command's
module is imported only when that command runs (or a listing needs it), so ``gradian diagnose`` never imports
the model stack (torch, transformers, peft) that ``gradian attribute`` needs. User mistakes
(:class:`gradian.errors.GradianUserError`) print one line and exit with code 2.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import Any

import typer
from typer.core import TyperGroup

import gradian.commands as _commands


@cache
def _command_names() -> tuple[str, ...]:
    """Every command: one per module of :mod:`gradian.commands` (not ``_``-prefixed), found without importing."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules(_commands.__path__) if not m.name.startswith("_")))


def _load_command(name: str) -> Any:
    """Import ``gradian.commands.<name>`` and build its (click) command, what its ``register`` declares."""
    sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    importlib.import_module(f"gradian.commands.{name}").register(sub)
    names = [c.name for c in sub.registered_commands]
    if names != [name]:
        raise RuntimeError(f"gradian.commands.{name} must register exactly the command {name!r}, not {names}")
    return typer.main.get_command(sub)


class _LazyCommands(TyperGroup):
    """The root group: lists every command module, imports one only when its command is looked up."""

    def list_commands(self, ctx: Any) -> list[str]:
        """Command names, from the module names (nothing imported)."""
        return sorted(set(super().list_commands(ctx)) | set(_command_names()))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command ``cmd_name``, its module imported on first use."""
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and cmd_name in _command_names():
            cmd = _load_command(cmd_name)
            self.add_command(cmd, cmd_name)
        return cmd


app = typer.Typer(
    name="gradian",
    cls=_LazyCommands,
    help="Which of my training examples, or which config setting, broke my LoRA fine-tune?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from gradian.version import __version__

        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", is_eager=True, callback=_print_version
    ),
    max_input_mb: int = typer.Option(
        None,
        "--max-input-mb",
        min=1,
        help="Largest input file Gradian reads, in MiB (default 4096; env GRADIAN_MAX_INPUT_MB). Gradian reads only "
        "regular files, never streams.",
    ),
) -> None:
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


def main() -> None:
    """Run the ``gradian`` command line."""
    app()


if __name__ == "__main__":
    main()
