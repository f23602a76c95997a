"""``gradian cache``: list the gradient indexes in the cache; ``gradian cache rm``: remove them.

``gradian cache`` lists each index with its size, age, last use and the run that last used it;
``gradian cache rm --all``, ``rm --older-than 7d`` (not used for 7 days) or ``rm ID ...`` removes
index folders (:mod:`gradian.cache`). Nothing here imports torch.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.markup import escape

from gradian.commands import _options as O
from gradian.commands._common import console, user_errors
from gradian.errors import GradianUserError


def register(app: typer.Typer) -> None:
    """Add ``gradian cache`` (list / remove the cached gradient indexes) to ``app``."""

    @app.command("cache")
    @user_errors
    def cache_cmd(
        action: str = typer.Argument("list", help="list (default) | rm"),
        ids: list[str] | None = typer.Argument(None, help="rm: the index ids to remove (4+ leading characters)."),
        all_: bool = typer.Option(False, "--all", help="rm: remove every index."),
        older_than: str | None = typer.Option(
            None, "--older-than", help="rm: remove the indexes not used for this long, e.g. 7d, 12h, 2w."
        ),
        dry_run: bool = typer.Option(False, "--dry-run", help="rm: list what would be removed, remove nothing."),
        index_dir: Path | None = typer.Option(
            None, "--index", help="The index folder, if not the cache's (what index --out wrote, attribute --index)."
        ),
        index_dir_old: Path | None = O.INDEX_DIR_OLD,
    ) -> None:
        """List the cached gradient indexes (size, age, source run), or remove them (rm)."""
        index_dir = O.one_of_alias(index_dir, index_dir_old, "--index", "--index-dir")
        from gradian.cache import human_age, index_root, list_indexes, other_cache_sizes, parse_age, remove_indexes
        from gradian.util import human_bytes

        if action not in ("list", "ls", "rm"):
            raise GradianUserError(
                f"unknown action {action!r}", where="gradian cache", fix="use `gradian cache` or `gradian cache rm`"
            )
        if action != "rm" and (ids or all_ or older_than is not None or dry_run):
            raise GradianUserError(
                "ids, --all, --older-than and --dry-run go with rm",
                where="gradian cache",
                fix="e.g. gradian cache rm --older-than 7d",
            )
        root = index_root(index_dir)
        if action == "rm":
            age = parse_age(older_than) if older_than is not None else None
            gone = remove_indexes(ids or None, all_=all_, older_than=age, root=index_dir, dry_run=dry_run)
            verb = "would remove" if dry_run else "removed"
            for e in gone:
                console.print(f"{verb} {e['id']} ({human_bytes(e['bytes'])})", highlight=False)
            total = sum(e["bytes"] for e in gone)
            console.print(
                f"{verb} {len(gone)} index(es), {human_bytes(total)} from {escape(str(root))}",
                highlight=False,
                soft_wrap=True,
            )
            return
        entries = list_indexes(index_dir)
        from gradian.tables import FitTable

        now = time.time()
        t = FitTable(title=f"gradient indexes in {escape(str(root))}", heading_columns=1)
        for col in ("id", "size", "age", "last used", "rows", "unit", "data", "source run"):
            t.add_column(col, overflow="fold")
        for e in entries:
            t.add_row(
                e["id"] + ("" if e["complete"] else " (unfinished)"),
                human_bytes(e["bytes"]),
                human_age(now - e["created"]),
                human_age(now - e["last_used"]) + " ago",
                str(e["rows"] if e["rows"] is not None else "?"),
                escape(str(e["unit"])),
                escape(str(e["data"] or "?")),
                escape(e["run_dir"] or "unrecorded"),
            )
        console.print(t)
        total = sum(e["bytes"] for e in entries)
        console.print(f"{len(entries)} index(es), {human_bytes(total)}", highlight=False)
        if index_dir is None:
            other = {k: v for k, v in other_cache_sizes().items() if v}
            if other:
                console.print(
                    "[dim]also in the cache (not removed by rm): "
                    + ", ".join(f"{escape(k)} {human_bytes(v)}" for k, v in other.items())
                    + "[/]",
                    highlight=False,
                    soft_wrap=True,
                )
        if entries:
            console.print(
                "[dim]remove: gradian cache rm --older-than 7d | --all | ID ...[/]", highlight=False, soft_wrap=True
            )
