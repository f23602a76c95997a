"""Helpers shared by the CLI commands: one-line user errors, consoles."""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Callable, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from gradian.errors import EXIT_USER_ERROR, GradianUserError, GradianWarning

F = TypeVar("F", bound=Callable)

console = Console()
err_console = Console(stderr=True)


def _show_warning(message, category, filename, lineno, file=None, line=None, _orig=warnings.showwarning):
    """Gradian's own warnings (a rebuilt index shard, ...) as one ``warning:`` line; others as usual."""
    if isinstance(category, type) and issubclass(category, GradianWarning):
        err_console.print(f"[bold yellow]warning:[/] {escape(str(message))}", soft_wrap=True, highlight=False)
    else:
        _orig(message, category, filename, lineno, file, line)


def user_errors(fn: F) -> F:
    """Turn a :class:`GradianUserError` into one line on stderr and exit code 2; print Gradian's
    warnings as ``warning:`` lines."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always", GradianWarning)
                warnings.showwarning = _show_warning
                return fn(*args, **kwargs)
        except GradianUserError as e:
            # soft_wrap: the message stays one line whatever the terminal width
            err_console.print(f"[bold red]error:[/] {escape(e.one_line())}", soft_wrap=True, highlight=False)
            raise typer.Exit(EXIT_USER_ERROR) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            sys.exit(130)

    return wrapper  # type: ignore[return-value]


class _Progress:
    """A rich progress bar whose tasks are advanced through plain callbacks."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self._p = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err_console,
            transient=False,
        )

    def __enter__(self) -> "_Progress":
        self._p.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._p.__exit__(*exc)

    def task(self, description: str, total: int):
        tid = self._p.add_task(description, total=total)
        return lambda k: self._p.advance(tid, k)


def progress_bar() -> _Progress:
    return _Progress()


def grad_spec_from_options(max_length: int, loss_on: str, modules: str | None, project_dim: int, storage_dtype: str, seed: int,
                           optimizer: str = "none", unit: str = "row"):
    """CLI options into a :class:`gradian.index.store.GradSpec` (the specs validate every field:
    a bad value is a one-line error naming the flag)."""
    from gradian.data.tokenize import TokenizeSpec
    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.store import GradSpec

    mods = tuple(m.strip() for m in modules.split(",") if m.strip()) if modules else None
    if modules is not None and not mods:
        raise GradianUserError(f"--modules {modules!r} names no layer", where="--modules (GradSpec.modules)",
                               fix="e.g. --modules q_proj,v_proj (or leave it out for every LoRA layer)")
    return GradSpec(
        tokenize=TokenizeSpec(max_length=max_length, loss_on=loss_on),  # type: ignore[arg-type]
        modules=mods,
        projection=ProjectionSpec(dim=project_dim, seed=seed),
        storage_dtype=storage_dtype,
        optimizer=optimizer,
        unit=unit,
    )
