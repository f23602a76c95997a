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
    """Validate CLI options into a :class:`gradian.index.store.GradSpec`."""
    from gradian.data.tokenize import TokenizeSpec
    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.store import STORAGE_DTYPES, GradSpec

    if loss_on not in ("completion", "all"):
        raise GradianUserError(f"unknown --loss-on {loss_on!r}", where="--loss-on", fix="use 'completion' or 'all'")
    if max_length < 2:
        raise GradianUserError("--max-length must be at least 2", where="--max-length", fix="e.g. --max-length 1024")
    if storage_dtype not in STORAGE_DTYPES:
        raise GradianUserError(
            f"unknown storage dtype {storage_dtype!r}", where="--storage-dtype", fix=f"use one of {', '.join(STORAGE_DTYPES)}"
        )
    if project_dim < 0:
        raise GradianUserError("--project-dim must be >= 0", where="--project-dim", fix="0 disables projection")
    if optimizer not in ("none", "adam"):
        raise GradianUserError(f"unknown --optimizer {optimizer!r}", where="--optimizer", fix="use none or adam")
    if unit not in ("row", "sentence"):
        raise GradianUserError(f"unknown --unit {unit!r}", where="--unit", fix="use row or sentence")
    mods = tuple(m.strip() for m in modules.split(",") if m.strip()) if modules else None
    return GradSpec(
        tokenize=TokenizeSpec(max_length=max_length, loss_on=loss_on),  # type: ignore[arg-type]
        modules=mods,
        projection=ProjectionSpec(dim=project_dim, seed=seed),
        storage_dtype=storage_dtype,
        optimizer=optimizer,
        unit=unit,
    )
