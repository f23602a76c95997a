r"""Helpers shared by the CLI commands: one-line user errors, consoles.

Nothing from the data reaches the terminal raw. Training row ids, capability names, prompts,
completions and audit evidence can hold terminal escape sequences (``ESC [2J`` clears the screen,
``ESC ]8;;`` plants a link), C1 controls and bidi overrides. Two layers, both here, so a command
cannot forget them:

* :class:`SafeConsole` (``console`` and ``err_console``): every string it renders goes through
  :func:`gradian.report.safe.visible` before rich parses it as markup (so table layout counts the
  escaped form), and every text segment it writes is passed through it again just before output
  (a :class:`rich.text.Text` built directly, a progress-bar description). Rich's own styling and
  cursor movement are rich's control segments and styles, added after, so colours still work.
* :func:`user_errors` runs each command with ``sys.stdout``/``sys.stderr`` behind
  :class:`CleanStream`, which escapes the same characters in whatever is written with
  ``typer.echo``/``print``/``warnings`` (a lone ``\r`` is kept there, for other libraries'
  progress bars); :class:`SafeConsole` writes past it to the real stream.

Data placed in markup strings is still passed through :func:`rich.markup.escape` by the commands
(``[bold]`` in a row id must not style); escaping controls does not replace that.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from pathlib import Path
from typing import Callable, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from gradian.errors import EXIT_USER_ERROR, GradianUserError, GradianWarning
from gradian.report.safe import visible

F = TypeVar("F", bound=Callable)


class CleanStream:
    """A text stream that writes :func:`~gradian.report.safe.visible` text to ``inner``.

    It has no ``buffer`` (click would write bytes past it); a bytes write is decoded as UTF-8.
    """

    def __init__(self, inner) -> None:
        self.inner = inner

    def write(self, s) -> int:
        r"""Write ``s`` with its control and bidi characters shown as ``\u`` escapes (``\u`` and four hex digits)."""
        if isinstance(s, (bytes, bytearray)):
            s = bytes(s).decode("utf-8", "replace")
        self.inner.write(visible(s, keep_cr=True))
        return len(s)

    def writelines(self, lines) -> None:
        """Write each line with :meth:`write`."""
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Flush the inner stream."""
        self.inner.flush()

    def isatty(self) -> bool:
        """Whether the inner stream is a terminal."""
        return bool(getattr(self.inner, "isatty", lambda: False)())

    def __getattr__(self, name: str):
        if name == "buffer":
            raise AttributeError(name)
        return getattr(self.inner, name)


class SafeConsole(Console):
    """A rich console that never writes a control or bidi character from its text (see the module docstring)."""

    @property
    def file(self):
        """The stream written to: past a :class:`CleanStream` (this console escapes its own text)."""
        f = super().file
        return f.inner if isinstance(f, CleanStream) else f

    @file.setter
    def file(self, new_file) -> None:
        self._file = new_file

    def render_str(self, text: str, **kwargs):
        """Escape controls before rich parses markup, so widths are those of the escaped text."""
        return super().render_str(visible(text), **kwargs)

    def _render_buffer(self, buffer):
        # last line of defence: text segments (never rich's own control segments) are escaped again
        from rich.segment import Segment

        safe = (seg if seg.control else Segment(visible(seg.text), seg.style) for seg in buffer)
        return super()._render_buffer(safe)


console = SafeConsole()
err_console = SafeConsole(stderr=True)


def _rank() -> int:
    """This process's rank: from the process group, or from torchrun's ``RANK`` before it exists."""
    import os

    if "torch" in sys.modules:  # without torch loaded there is no process group (and no need to load torch)
        from gradian import distributed

        d = distributed.current()
        if d.enabled:
            return d.rank
    try:
        return int(os.environ.get("RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0
    except ValueError:
        return 0


def _show_warning(message, category, filename, lineno, file=None, line=None, _orig=warnings.showwarning):
    """Gradian's own warnings (a rebuilt index shard, ...) as one ``warning:`` line; others as usual.
    Under torchrun only rank 0 prints them (every rank would repeat the same line).
    """
    if isinstance(category, type) and issubclass(category, GradianWarning):
        if _rank() == 0:
            err_console.print(f"[bold yellow]warning:[/] {escape(str(message))}", soft_wrap=True, highlight=False)
    else:
        _orig(message, category, filename, lineno, file, line)


def user_errors(fn: F) -> F:
    """Turn a :class:`GradianUserError` into one line on stderr and exit code 2; print Gradian's
    warnings as ``warning:`` lines.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out, err = sys.stdout, sys.stderr
        try:
            if not isinstance(out, CleanStream):
                sys.stdout = CleanStream(out)
            if not isinstance(err, CleanStream):
                sys.stderr = CleanStream(err)
            with warnings.catch_warnings():
                warnings.simplefilter("always", GradianWarning)
                warnings.showwarning = _show_warning
                return fn(*args, **kwargs)
        except GradianUserError as e:
            # soft_wrap: the message stays one line whatever the terminal width. Under torchrun an error
            # every rank raises alike is printed by rank 0 only; another rank's own error names the rank.
            rank = _rank()
            if rank == 0 or not getattr(e, "every_rank", False):
                prefix = f"rank {rank}: " if rank else ""
                err_console.print(
                    f"[bold red]error:[/] {prefix}{escape(e.one_line())}", soft_wrap=True, highlight=False
                )
            raise typer.Exit(EXIT_USER_ERROR) from None
        except OSError as e:
            # a full disk in a writer that is not Gradian's (a library's save): one line, not a traceback
            from gradian.util import is_disk_full

            if not is_disk_full(e):
                raise
            where = str(Path(e.filename).parent) if e.filename else "the output folder"
            err_console.print(
                f"[bold red]error:[/] {escape(where)}: the disk is full ({escape(e.strerror or str(e))}; the bytes "
                "needed are unknown: a library's write) (fix: free space there or write to another disk, then run "
                "the same command again)",
                soft_wrap=True,
                highlight=False,
            )
            raise typer.Exit(EXIT_USER_ERROR) from None
        except KeyboardInterrupt:
            err_console.print("interrupted")
            sys.exit(130)
        finally:
            sys.stdout, sys.stderr = out, err

    return wrapper  # type: ignore[return-value]


def _clock(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class LineProgress:
    """Progress for a log (output not a terminal: CI, ``| tee``): plain lines instead of a redrawn bar.

    Each task prints a line when it starts, then at most one line every ``every`` seconds while it runs
    (``GRADIAN_PROGRESS_EVERY``, default 30), and one when it completes; a running line reads
    ``description: done/total (percent) · rate/s · elapsed m:ss · ETA m:ss`` (rate and ETA from the
    elapsed time since the task started). The same calls as :class:`rich.progress.Progress`
    (``add_task``, ``advance``, ``update``), so callers do not know which one they draw on.
    """

    def __init__(self, console, *, every: float | None = None, disable: bool = False) -> None:
        import os

        self.console, self.disable = console, disable
        if every is None:
            try:
                every = float(os.environ.get("GRADIAN_PROGRESS_EVERY", "30"))
            except ValueError:
                every = 30.0
        self.every = max(0.0, every)
        self._tasks: dict[int, dict] = {}

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **fields) -> int:
        """Start a task; prints its first line."""
        import time

        tid = len(self._tasks)
        now = time.monotonic()
        self._tasks[tid] = {"d": description, "total": total, "done": 0.0, "t0": now, "last": now, "end": False}
        self._tasks[tid].update(fields)
        self._say(tid, start=True)
        return tid

    def advance(self, task_id: int, advance: float = 1) -> None:
        """Add ``advance`` to the task's count."""
        self.update(task_id, advance=advance)

    def update(self, task_id: int, *, advance: float | None = None, completed: float | None = None, **fields) -> None:
        """Move the task on (``advance`` or ``completed``); ``total``, ``description`` and fields as rich's."""
        import time

        t = self._tasks[task_id]
        if "total" in fields:
            t["total"] = fields.pop("total")
        if "description" in fields:
            t["d"] = fields.pop("description")
        t.update(fields)
        if completed is not None:
            t["done"] = float(completed)
        if advance:
            t["done"] += float(advance)
        now = time.monotonic()
        finished = t["total"] is not None and t["done"] >= t["total"]
        if finished and not t["end"]:
            t["end"] = True
            self._say(task_id)
        elif not finished and now - t["last"] >= self.every:
            self._say(task_id)

    def _say(self, tid: int, start: bool = False) -> None:
        import time

        t = self._tasks[tid]
        t["last"] = now = time.monotonic()
        if self.disable:
            return
        total, done, el = t["total"], t["done"], now - t["t0"]
        count = f"{done:g}/{total:g}" if total is not None else f"{done:g}"
        line = f"{t['d']}: {count}"
        if total:
            line += f" ({done / total:.0%})"
        if start:
            line += " started"
        elif t["end"]:
            line += f" · done in {_clock(el)}" + (f" · {done / el:.3g}/s" if el > 0 and done else "")
        else:
            rate = done / el if el > 0 else 0.0
            line += f" · {rate:.3g}/s · elapsed {_clock(el)}"
            if rate > 0 and total:
                line += f" · ETA {_clock((total - done) / rate)}"
        info = t.get("info")
        if info:
            line += f" · {info}"
        self.console.print(line, highlight=False, soft_wrap=True)


def rich_progress(console, *, info: bool = False, disable: bool = False):
    """Gradian's progress bar: description, bar, done/total, elapsed, remaining (one set of columns).

    When the console is not a terminal (a log file, CI, ``| tee``) it is a :class:`LineProgress`
    instead: a line per task start, per ``GRADIAN_PROGRESS_EVERY`` seconds (rate, ETA) and per end.

    Args:
        console: the rich console it draws on.
        info: add a ``{task.fields[info]}`` column after the count (the trainer's loss).
        disable: draw nothing (the ranks other than 0 under torchrun).
    """
    if not console.is_terminal:
        return LineProgress(console, disable=disable)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    if info:
        columns.append(TextColumn("{task.fields[info]}"))
    columns += [TimeElapsedColumn(), TimeRemainingColumn()]
    return Progress(*columns, console=console, transient=False, disable=disable)


class _Progress:
    """A rich progress bar whose tasks are advanced through plain callbacks."""

    def __init__(self) -> None:
        from gradian import distributed

        d = distributed.current()
        #: under torchrun only rank 0 draws, and its bars count its own share of the rows
        self._suffix = f" (rank 0 of {d.world_size})" if d.enabled else ""
        self._p = rich_progress(err_console, disable=not d.is_main)

    def __enter__(self) -> _Progress:
        self._p.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._p.__exit__(*exc)

    def task(self, description: str, total: int):
        tid = self._p.add_task(description + self._suffix, total=total)
        return lambda k: self._p.advance(tid, k)

    def callback(self):
        """``progress(task, advance, total)`` (what :func:`gradian.attribute.run.attribute_run` calls): one bar
        per task name, created at its first call.
        """
        tasks: dict = {}

        def progress(task: str, k: int, total: int) -> None:
            if task not in tasks:
                tasks[task] = self.task(task, total)
            tasks[task](k)

        return progress


def progress_bar() -> _Progress:
    return _Progress()


def print_line(text: str) -> None:
    """Print one line of plain text: markup escaped, nothing highlighted, not wrapped (the library calls' ``say``)."""
    console.print(escape(text), highlight=False, soft_wrap=True)


def run_folder_inputs(
    adapter: Path, config: list[Path] | None, logs: Path | None, *, read: bool, want_logs: bool = True
):
    """``(configs, logs, trainer card or None)``: ``--config`` and ``--logs``, or (``read``: ``--run-folder``) what the
    trainer left beside the adapter (:meth:`gradian.audit.config.runfolder.RunFolder.inputs`), with one line naming
    the files read.
    """
    config = list(config or [])
    if not read or (config and (logs is not None or not want_logs)):
        return config, logs, None
    from gradian.audit.config.runfolder import find_run_folder

    found = find_run_folder(adapter, configs=not config, logs=want_logs and logs is None)
    for line in found.lines():
        print_line(line)
    return found.inputs(config, logs)


def print_step(text: str) -> None:
    """Print one step of a long command (``▸ text``) as :func:`print_line` does: markup escaped, nothing highlighted,
    not wrapped, so a piped log keeps one line per step.
    """
    console.print(f"[cyan]▸[/] {escape(text)}", highlight=False, soft_wrap=True)


def write_report_html(run_dir: Path) -> Path:
    """Render ``run_dir/run.json`` as ``run_dir/report.html`` (atomically) and return the file's path."""
    from gradian.report import render, report_for_run
    from gradian.util import atomic_write_text

    path = run_dir / "report.html"
    atomic_write_text(path, render(report_for_run(run_dir), "html"))
    return path


def grad_spec_from_options(
    max_length: int,
    loss_on: str,
    modules: str | None,
    project_dim: int,
    storage_dtype: str,
    seed: int,
    optimizer: str = "none",
    unit: str = "row",
    max_units_per_row: int = 32,
    unit_grads: str = "positions",
):
    """CLI options into a :class:`gradian.index.store.GradSpec` (the specs validate every field:
    a bad value is a one-line error naming the flag).
    """
    from gradian.data.tokenize import TokenizeSpec
    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.store import GradSpec

    mods = tuple(m.strip() for m in modules.split(",") if m.strip()) if modules else None
    if modules is not None and not mods:
        raise GradianUserError(
            f"--modules {modules!r} names no layer",
            where="--modules (GradSpec.modules)",
            fix="e.g. --modules q_proj,v_proj (or leave it out for every LoRA layer)",
        )
    return GradSpec(
        tokenize=TokenizeSpec(max_length=max_length, loss_on=loss_on),  # type: ignore[arg-type]
        modules=mods,
        projection=ProjectionSpec(dim=project_dim, seed=seed),
        storage_dtype=storage_dtype,
        optimizer=optimizer,
        unit=unit,
        max_units_per_row=max_units_per_row,
        unit_grads=unit_grads,
    )


def start_distributed(device: str, fields: Callable[[], dict]):
    """Join the torchrun job, if launched by one (:func:`gradian.distributed.init_from_env`).

    Ranks other than 0 print nothing but their own errors; the ranks' inputs are compared first
    (``fields()``: what each rank reads, as content identities; only computed under torchrun), and a
    difference is one error line on every rank. Returns the :class:`gradian.distributed.Dist`.
    """
    from gradian import distributed

    d = distributed.init_from_env(device)
    if d.enabled:
        if not d.is_main:
            console.quiet = True
        distributed.check_same_inputs(fields())
    return d


@contextlib.contextmanager
def distributed_job(device: str, base: str, adapter, data, flags: Callable[[], dict]):
    """Run the block as one torchrun job's share (or alone), and leave the job after it, an error included.

    Joins with :func:`start_distributed`, the ranks' inputs compared as :func:`input_identity` of ``base``,
    ``adapter``, ``data`` and ``flags()`` (computed only under torchrun); ``distributed.shutdown()`` runs however
    the block ends. Yields the :class:`gradian.distributed.Dist`.
    """
    from gradian import distributed

    try:
        yield start_distributed(device, lambda: input_identity(base, adapter, data, flags()))
    finally:
        distributed.shutdown()


def input_identity(base: str, adapter, data, extra: dict | None = None) -> dict:
    """What must be the same on every rank: the base, adapter and data contents (sha256) and the flags."""
    from gradian.index.identity import adapter_identity, dataset_identity, model_identity

    out = {
        "the training data": dataset_identity(data).get("sha256") if _exists(data) else f"missing: {data}",
        "the adapter": adapter_identity(adapter).get("sha256") if _exists(adapter) else f"missing: {adapter}",
        "the base model": model_identity(base).get("sha256") or base,
    }
    out.update(extra or {})
    return out


def _exists(p) -> bool:
    """A regular file or a folder (never opens a FIFO or a device to hash it)."""
    from pathlib import Path

    return Path(p).is_file() or Path(p).is_dir()


def base_model_spec(
    base: str,
    dtype: str,
    device: str,
    trust_remote_code: bool,
    base_quant: str,
    trained: tuple[str, str | None, str] | None = None,
):
    """The base's :class:`~gradian.models.spec.ModelSpec`: ``--base-quant`` 'auto' takes the 4-bit base a QLoRA run
    trained on (``trained``: :func:`gradian.data.setup.trained_quant`), 'none' the base as stored, a scheme that
    scheme; printed when the base is quantised.
    """
    from gradian.models.spec import QUANT_NAMES, ModelSpec

    if base_quant not in ("auto", "none", *QUANT_NAMES):
        raise GradianUserError(
            f"unknown --base-quant {base_quant!r}",
            where="--base-quant",
            fix=f"use auto, none or {', '.join(QUANT_NAMES)}",
        )
    quant, frm, src = None, None, ""
    if base_quant == "auto":
        quant, frm, src = trained or (None, None, "")
        if quant:
            said = f"base: quantised {quant} as trained ({escape(src)}), from {frm or 'its stored dtype'}"
            console.print(said, highlight=False)
    elif base_quant != "none":
        quant = base_quant
    return ModelSpec(base, dtype, device, trust_remote_code, quantize=quant, quantize_from=frm)
