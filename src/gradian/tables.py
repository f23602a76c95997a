"""Terminal tables that stay readable at any width.

A rich :class:`~rich.table.Table` squeezed below its natural width crops every cell to an
ellipsis ("capi…"), which is what a CI log or ``gradian evaluate | tee run.log`` got: piped
output is 80 columns wide. :class:`FitTable` is a drop-in that renders as the table when it
fits, and otherwise as one compact block per row (its first column as the heading, the other
columns as ``header value`` pairs that wrap at word boundaries):

* not on a terminal (piped, redirected, a CI log): the table is used only when its natural
  width fits, so no cell is ever cut;
* on a terminal: the table is used as long as every column can keep its longest word
  (rich wraps the rest), so an interactive user keeps the grid unless it would be cropped.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text


def _text(cell: Any) -> Text:
    if isinstance(cell, Text):
        return cell.copy()
    if isinstance(cell, str):
        return Text.from_markup(cell)
    return Text(str(cell))


class FitTable:
    """A rich table with a compact fallback layout (see the module docstring).

    Use it like :class:`rich.table.Table`: ``add_column`` / ``add_row``, then ``console.print(t)``.

    Args:
        title: the table's title (also the heading of the compact layout).
        heading_columns: how many leading columns form each row's heading in the compact layout.
        **table_kwargs: passed to :class:`rich.table.Table`.
    """

    def __init__(self, title: Any = None, *, heading_columns: int = 1, **table_kwargs: Any):
        self.table = Table(title=title, **table_kwargs)
        self.title = title
        self.heading_columns = heading_columns
        self.headers: list[str] = []
        self.rows: list[tuple[Any, ...]] = []

    def add_column(self, header: str, **kwargs: Any) -> None:
        self.table.add_column(header, **kwargs)
        self.headers.append(header)

    def add_row(self, *cells: Any) -> None:
        self.table.add_row(*cells)
        self.rows.append(cells)

    def fits(self, console: Console, options: ConsoleOptions | None = None) -> bool:
        """Whether the grid renders without cutting a cell at this width (see the module docstring)."""
        options = options or console.options
        # measured without the width limit (rich clamps a table's measurement to the width it is given)
        m = Measurement.get(console, options.update_width(1_000_000), self.table)
        return (m.minimum if console.is_terminal else m.maximum) <= options.max_width

    def compact(self) -> Group:
        """One block per row: the heading columns, then ``header value`` pairs (wrapping, indented)."""
        parts: list[Any] = []
        if self.title:
            parts.append(_text(self.title).copy())
            parts[-1].stylize("italic")
        k = self.heading_columns
        for row in self.rows:
            head = Text(" ").join(_text(c) for c in row[:k])
            head.stylize("bold")
            body = Text()
            for h, c in zip(self.headers[k:], row[k:]):
                cell = _text(c)
                if not cell.plain.strip():
                    continue
                if body:
                    body.append("  ·  ", style="dim")
                body.append(f"{h} ", style="dim")
                body.append_text(cell)
            parts.append(head)
            if body:
                parts.append(Padding(body, (0, 0, 0, 2), expand=False))
        return Group(*parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table if self.fits(console, options) else self.compact()

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table).clamp(max_width=options.max_width)
