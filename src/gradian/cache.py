"""The gradient indexes in the cache: list them (size, age, source run) and remove them.

An index lives in ``<cache>/index/<index_id>/`` (:mod:`gradian.index.store`): a ``manifest.json`` and its
shards. The index does not know which run built or read it, so every run records that itself, in
``<cache>/index-runs.json`` (:func:`record_index_use`, called when ``run.json`` is written)::

    {"schema": "gradian.index-runs/1",
     "indexes": {"<index folder, resolved>": {"run_id", "run_dir", "used": ISO time, "uses": int}}}

Nothing here imports torch. A removal takes whole index folders only (a folder under the index root that
holds a ``manifest.json`` or shard files); the other cache folders (models, worlds, RepSim vectors) are
listed by size but never removed here.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gradian.errors import GradianUserError

USAGE_FILE = "index-runs.json"
USAGE_SCHEMA = "gradian.index-runs/1"

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str, where: str = "--older-than") -> float:
    """``"7d"`` → seconds (units s, m, h, d, w; a bare number is days)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if m is None:
        raise GradianUserError(f"{text!r} is not an age", where=where, fix="e.g. 7d, 12h, 30m or 2w")
    return float(m.group(1)) * _UNITS[m.group(2) or "d"]


def human_age(seconds: float) -> str:
    """``93784`` → ``"1d 2h"``: the two largest units."""
    s = max(0, int(seconds))
    parts = []
    for name, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size or (name == "s" and not parts):
            parts.append(f"{s // size}{name}")
            s %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def index_root(root: str | Path | None = None) -> Path:
    """The folder the indexes are in: ``root`` (an ``--index-dir``) or ``<cache>/index``."""
    from gradian.paths import cache_dir

    return Path(root) if root is not None else cache_dir() / "index"


def _usage_path() -> Path:
    from gradian.paths import cache_dir

    return cache_dir() / USAGE_FILE


def read_usage() -> dict[str, dict[str, Any]]:
    """``{index folder: last use}`` from ``<cache>/index-runs.json``; a missing or unreadable file is empty."""
    p = _usage_path()
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    idx = d.get("indexes") if isinstance(d, dict) and d.get("schema") == USAGE_SCHEMA else None
    return {k: v for k, v in idx.items() if isinstance(v, dict)} if isinstance(idx, dict) else {}


def _write_usage(usage: dict[str, dict[str, Any]]) -> None:
    from gradian.util import atomic_write_json

    atomic_write_json(_usage_path(), {"schema": USAGE_SCHEMA, "indexes": usage})


def run_index_roots(run: dict[str, Any]) -> list[str]:
    """Every index folder a run read: the final adapter's and each trajectory checkpoint's (row and sentence)."""
    att = run.get("attribution") or {}
    roots: list[str] = []

    def add(ix: Any) -> None:
        if isinstance(ix, dict) and isinstance(ix.get("root"), str) and ix["root"] not in roots:
            roots.append(ix["root"])

    add(att.get("index"))
    for c in (att.get("trajectory") or {}).get("checkpoints") or []:
        for ix in (c.get("index") or {}).values() if isinstance(c.get("index"), dict) else ():
            add(ix)
    return roots


def record_index_use(run: dict[str, Any], run_dir: str | Path) -> None:
    """Note in ``<cache>/index-runs.json`` that the run in ``run_dir`` used its indexes (module docstring).

    A bookkeeping file only: when it cannot be written (a read-only cache) the run is not failed, the
    indexes just list no source run. Two runs finishing at the same instant may keep only one's entry.
    """
    roots = run_index_roots(run)
    if not roots:
        return
    try:
        usage = read_usage()
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        for r in roots:
            key = str(Path(r).resolve())
            prev = usage.get(key) or {}
            usage[key] = {
                "run_id": (run.get("manifest") or {}).get("run_id"),
                "run_dir": str(Path(run_dir).resolve()),
                "used": now,
                "uses": int(prev.get("uses") or 0) + 1,
            }
        _write_usage(usage)
    except OSError:
        pass


def _folder_size(p: Path) -> int:
    total = 0
    for f in p.rglob("*"):
        try:
            if f.is_file() and not f.is_symlink():
                total += f.stat().st_size
        except OSError:
            pass
    return total


def _is_index_folder(p: Path) -> bool:
    """A folder that holds an index (finished or not): a manifest or shard files, nothing else counts."""
    if not p.is_dir() or p.is_symlink():
        return False
    return (p / "manifest.json").is_file() or any(p.glob("shard-*.safetensors")) or any(p.glob("shard-*.json"))


def _parse_time(s: Any) -> float | None:
    if not isinstance(s, str):
        return None
    try:
        return datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def list_indexes(root: str | Path | None = None) -> list[dict[str, Any]]:
    """The indexes under ``root`` (default ``<cache>/index``), newest use first.

    Returns:
        one dict per index folder: ``id``, ``path``, ``bytes``, ``created`` and ``last_used`` (epoch seconds;
        ``last_used`` is the last recorded run's time, else the folder's latest modification), ``complete``,
        ``rows``, ``unit``, ``data`` (the training file's name), ``run_dir`` and ``run_id`` (the last run that
        used it, None when unrecorded).
    """
    folder = index_root(root)
    if not folder.is_dir():
        return []
    usage = read_usage()
    out = []
    for p in sorted(folder.iterdir()):
        if not _is_index_folder(p):
            continue
        try:
            m = json.loads((p / "manifest.json").read_text(encoding="utf-8"))
            m = m if isinstance(m, dict) else {}
        except (OSError, ValueError):
            m = {}
        try:
            mtime = max([p.stat().st_mtime] + [f.stat().st_mtime for f in p.iterdir()])
        except OSError:
            mtime = time.time()
        created = _parse_time(m.get("created")) or mtime
        use = usage.get(str(p.resolve())) or {}
        spec = m.get("grad_spec") if isinstance(m.get("grad_spec"), dict) else {}
        ident = m.get("identity") if isinstance(m.get("identity"), dict) else {}
        data = ident.get("dataset") if isinstance(ident.get("dataset"), dict) else {}
        out.append(
            {
                "id": p.name,
                "path": str(p),
                "bytes": _folder_size(p),
                "created": created,
                "last_used": _parse_time(use.get("used")) or mtime,
                "complete": bool(m.get("complete")),
                "rows": m.get("n_examples"),
                "unit": spec.get("unit", "row"),
                "data": data.get("name"),
                "run_dir": use.get("run_dir"),
                "run_id": use.get("run_id"),
            }
        )
    out.sort(key=lambda e: -e["last_used"])
    return out


def other_cache_sizes() -> dict[str, int]:
    """Bytes held by the cache's other folders (models, worlds, demo, repsim, ...), by folder name."""
    from gradian.paths import cache_dir

    c = cache_dir()
    return {p.name: _folder_size(p) for p in sorted(c.iterdir()) if p.is_dir() and p.name != "index"}


def remove_indexes(
    ids: list[str] | None = None,
    *,
    all_: bool = False,
    older_than: float | None = None,
    root: str | Path | None = None,
    dry_run: bool = False,
) -> list[dict[str, Any]]:
    """Remove index folders: those named in ``ids``, every one (``all_``), or those not used for ``older_than`` s.

    Returns:
        the removed indexes' :func:`list_indexes` entries (with ``dry_run``, those that would be removed).

    Raises:
        GradianUserError: no selection, more than one kind of selection, or an id that is not an index here.
    """
    given = sum([bool(ids), bool(all_), older_than is not None])
    if given != 1:
        raise GradianUserError(
            "say which indexes to remove" if given == 0 else "give only one of: index ids, --all, --older-than",
            where="gradian cache rm",
            fix="e.g. gradian cache rm --older-than 7d, gradian cache rm --all, or gradian cache rm ID",
        )
    entries = list_indexes(root)
    if ids:
        by_id = {e["id"]: e for e in entries}
        chosen = []
        for i in ids:
            hits = [e for k, e in by_id.items() if k.startswith(i)] if len(i) >= 4 else []
            if len(hits) != 1:
                raise GradianUserError(
                    f"no index {i!r} here" if not hits else f"{i!r} names {len(hits)} indexes",
                    where=str(index_root(root)),
                    fix="use an id `gradian cache` lists (its first 4+ characters are enough)",
                )
            if hits[0] not in chosen:
                chosen.append(hits[0])
    elif all_:
        chosen = entries
    else:
        now = time.time()
        chosen = [e for e in entries if now - e["last_used"] > float(older_than or 0)]
    if dry_run:
        return chosen
    usage = read_usage()
    for e in chosen:
        shutil.rmtree(e["path"], ignore_errors=True)
        usage.pop(str(Path(e["path"]).resolve()), None)
    if chosen:
        try:
            _write_usage(usage)
        except OSError:
            pass
    return chosen
