"""Helpers shared by the CLI commands: one-line user errors, consoles."""

from __future__ import annotations

import functools
import sys
from typing import Callable, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from gradian.errors import EXIT_USER_ERROR, GradianUserError

F = TypeVar("F", bound=Callable)

console = Console()
err_console = Console(stderr=True)


def user_errors(fn: F) -> F:
    """Turn a :class:`GradianUserError` into one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GradianUserError as e:
            # soft_wrap: the message stays one line whatever the terminal width
            err_console.print(f"[bold red]error:[/] {escape(e.one_line())}", soft_wrap=True, highlight=False)
            raise typer.Exit(EXIT_USER_ERROR) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            sys.exit(130)

    return wrapper  # type: ignore[return-value]
