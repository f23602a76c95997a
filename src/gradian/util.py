"""Small shared utilities: atomic writes, hashing, JSON."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` as UTF-8 with :func:`atomic_write_bytes` (temp file, fsync, rename)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` atomically as indented JSON with sorted keys and a final newline.

    Values JSON cannot hold (paths, numpy scalars) are written as their ``str``.
    """
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def sha256_bytes(data: bytes) -> str:
    """The sha256 of ``data``, as 64 lowercase hex digits."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """The sha256 of a file's contents (64 hex digits), read in ``chunk``-byte pieces so memory stays flat."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def canonical_json(obj: Any) -> str:
    """Deterministic JSON (sorted keys, no whitespace) for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def sha256_json(obj: Any) -> str:
    """The sha256 of ``obj``'s :func:`canonical_json`: equal for equal content, whatever the key order."""
    return sha256_bytes(canonical_json(obj).encode("utf-8"))


def publish_folder(tmp: str | Path, target: str | Path, keep_if: str | None = None) -> Path:
    """Publish a fully written temporary folder as ``target`` with one rename.

    Args:
        tmp: the finished folder (created beside ``target``, so the rename is atomic).
        keep_if: a file name; when ``target`` already holds it (another process
            finished first), ``tmp`` is discarded and ``target`` kept.

    Returns:
        ``target``. A half-written ``target`` from an interrupted run is replaced.
    """
    import shutil

    tmp, target = Path(tmp), Path(target)
    if keep_if and (target / keep_if).exists():
        shutil.rmtree(tmp, ignore_errors=True)
        return target
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    return target


_LIBC: object = None


def release_free_memory() -> None:
    """Give freed heap memory back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    A loop that frees one large shard and allocates the next, while small long-lived results
    accumulate between them, fragments glibc's heap: freed shards stay in the process's RSS, which
    then grows with the number of shards (measured: 1.1 GB instead of 0.4 GB over a 16k-row index).
    Trimming after each shard keeps the peak flat at the cost of one call per shard; it changes no
    allocation policy, so the gradient pass keeps glibc's fast defaults.
    """
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes
            import ctypes.util

            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC = lib if hasattr(lib, "malloc_trim") else False
        except OSError:
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)  # type: ignore[attr-defined]
