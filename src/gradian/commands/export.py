"""``gradian export RUN --drop blamed|cluster N|top K --out clean.jsonl``: the training set without the blamed rows.

The rows dropped are :func:`gradian.attribute.selection.select`'s, the same ones ``gradian verify``
removes. A JSONL training file is copied byte for byte, line by line, leaving out the dropped rows'
lines (blank lines and line endings are kept as they are); a .json, .parquet or save_to_disk source is
written as JSONL, one record a line (``json.dumps``, so not byte for byte: the source is not JSONL).
Beside the output, ``<stem>.removed.json`` lists the dropped ids (most harmful first) with the run id,
the selection and the source's sha256.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import typer
from rich.markup import escape

from gradian.commands import _options as O
from gradian.commands._common import console, user_errors
from gradian.errors import GradianUserError

EXPORT_SCHEMA = "gradian.export/1"


def removed_path(out: Path) -> Path:
    """Where the dropped ids go: ``clean.jsonl`` → ``clean.removed.json`` (same folder)."""
    return out.with_name(out.stem + ".removed.json")


def jsonl_lines(data: bytes) -> list[bytes]:
    r"""A JSONL file's lines as :func:`gradian.safeio.iter_lines` reads them: split at ``\n`` only, each kept
    with its ending (a last line without one stays without).
    """
    pieces = data.split(b"\n")
    lines = [p + b"\n" for p in pieces[:-1]]
    if pieces[-1]:
        lines.append(pieces[-1])
    return lines


def _is_blank(line: bytes, first: bool) -> bool:
    """A line the JSONL reader skips (whitespace only; a BOM on the first line does not count)."""
    return not line.decode("utf-8-sig" if first else "utf-8", "replace").strip()


def clean_bytes(data_path: Path, drop_ids: set[str]) -> tuple[bytes, int, int, bool]:
    """The training set at ``data_path`` without the rows whose id is in ``drop_ids``.

    Returns:
        ``(bytes to write, rows kept, rows dropped, byte_for_byte)``: ``byte_for_byte`` is True for a JSONL source
        (every kept line exactly as in the file, in the same order), False for another format (written as JSONL).

    Raises:
        GradianUserError: the file's rows do not hold every id to drop (it is not the run's training set).
    """
    from gradian.data.formats import examples_from_records, read_records
    from gradian.safeio import read_bytes

    records = read_records(data_path)
    examples = examples_from_records(records, data_path)
    missing = drop_ids - {ex.id for ex in examples}
    if missing:
        raise GradianUserError(
            f"{len(missing)} row(s) to drop are not in the training data (e.g. id {sorted(missing)[0]!r})",
            where=str(data_path),
            fix="export from the run's own training file (re-run gradian attribute if it changed)",
        )
    dropped = sum(ex.id in drop_ids for ex in examples)
    if dropped >= len(examples):
        raise GradianUserError(
            f"the selection drops all {len(examples)} rows", where="--drop", fix="drop fewer rows (e.g. 'top 10')"
        )
    if data_path.is_file() and data_path.suffix.lower() == ".jsonl":
        lines = jsonl_lines(read_bytes(data_path, "data file"))
        kept: list[bytes] = []
        row = 0
        for i, line in enumerate(lines):
            if _is_blank(line, i == 0):
                kept.append(line)
                continue
            if row >= len(examples):  # cannot happen when the reader and this split agree; never write a guess
                raise RuntimeError(f"{data_path}: more JSON lines than rows read")
            if examples[row].id not in drop_ids:
                kept.append(line)
            row += 1
        if row != len(examples):
            raise RuntimeError(f"{data_path}: {row} JSON lines for {len(examples)} rows read")
        return b"".join(kept), len(examples) - dropped, dropped, True
    text = "".join(
        json.dumps(rec, ensure_ascii=False, default=str) + "\n"
        for rec, ex in zip(records, examples)
        if ex.id not in drop_ids
    )
    return text.encode("utf-8"), len(examples) - dropped, dropped, False


def export_run(
    run_dir: Path, drop: str = "blamed", out: Path | None = None, *, allow_changed_inputs: bool = False
) -> dict:
    """Write the run's training set without the rows ``drop`` selects, and the list of their ids beside it.

    Args:
        run_dir: a run folder (holds run.json).
        drop: ``"blamed"``, ``"cluster N"`` or ``"top K"`` (:func:`gradian.attribute.selection.select`).
        out: the JSONL to write (default ``RUN_DIR/clean.jsonl``); ``<stem>.removed.json`` goes beside it.
        allow_changed_inputs: export even if the training file's sha256 is not the run's.

    Returns:
        the ``gradian.export/1`` record written to ``<stem>.removed.json``.
    """
    from gradian.attribute.selection import select
    from gradian.index.identity import dataset_identity
    from gradian.runfile import load_run
    from gradian.util import atomic_write_bytes, atomic_write_json, sha256_bytes

    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / "clean.jsonl"
    if out.suffix.lower() != ".jsonl":
        raise GradianUserError(
            f"the export is JSONL, not {out.suffix or 'a file without extension'}",
            where="--out",
            fix=f"name it {out.stem or 'clean'}.jsonl",
        )
    if not out.parent.is_dir():
        raise GradianUserError("the folder of --out does not exist", where=str(out), fix=f"create {out.parent} first")
    run = load_run(run_dir, inputs=True)
    data = Path(run["manifest"]["paths"]["data"])
    if not data.exists():
        raise GradianUserError("the run's training data is gone", where=str(data), fix="restore it first")
    if out.resolve() == data.resolve() or removed_path(out).resolve() == data.resolve():
        raise GradianUserError(
            "--out would overwrite the training data", where=str(out), fix="write the export to another file"
        )
    want = ((run["manifest"].get("identity") or {}).get("dataset") or {}).get("sha256")
    now = dataset_identity(data).get("sha256")
    if want and now != want and not allow_changed_inputs:
        raise GradianUserError(
            "the run's training data changed since the run (its sha256 differs from run.json's)",
            where=str(data),
            fix="restore the file the run used, re-run gradian attribute, or pass --allow-changed-inputs",
        )
    ids = select(run, drop)
    body, kept, dropped, exact = clean_bytes(data, set(ids))
    record = {
        "schema": EXPORT_SCHEMA,
        "run_id": run["manifest"].get("run_id"),
        "drop": drop,
        "source": str(data),
        "source_sha256": now,
        "byte_for_byte": exact,
        "out": str(out),
        "out_sha256": sha256_bytes(body),
        "kept": kept,
        "removed": ids,
    }
    atomic_write_bytes(out, body)
    atomic_write_json(removed_path(out), record)
    return record


def register(app: typer.Typer) -> None:
    """Add ``gradian export`` (the training set without the blamed rows) to ``app``."""

    @app.command("export")
    @user_errors
    def export_cmd(
        run_dir: Path = O.RUN_DIR,
        drop: str = typer.Option(
            "blamed",
            "--drop",
            help="Rows to leave out: 'blamed' (what gradian verify removes), 'cluster N' (cluster N of each "
            "capability) or 'top K' (the K most harmful rows of each).",
        ),
        out: Path | None = typer.Option(
            None, "--out", help="The JSONL to write (default RUN_DIR/clean.jsonl); the dropped ids go beside it."
        ),
        allow_changed_inputs: bool = typer.Option(
            False, "--allow-changed-inputs", help="Export even if the training data changed since the run."
        ),
    ) -> None:
        """Write the training set without the rows the verdict blames, and the list of their ids."""
        rec = export_run(run_dir, drop, out, allow_changed_inputs=allow_changed_inputs)
        how = "byte for byte" if rec["byte_for_byte"] else "as JSONL (the source is not JSONL)"
        console.print(
            f"{rec['kept']} rows kept {how}, {len(rec['removed'])} dropped ({escape(drop)}) → "
            f"{escape(rec['out'])}; dropped ids → {escape(str(removed_path(Path(rec['out']))))}",
            highlight=False,
            soft_wrap=True,
        )
        console.print(
            f"[dim]retrain on it with your trainer, or check the fix first: gradian verify "
            f"{escape(shlex.quote(str(run_dir)))}[/]",
            highlight=False,
            soft_wrap=True,
        )
