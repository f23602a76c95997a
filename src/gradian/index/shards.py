"""The index's files on disk: the manifest, the shards and their records, their checks and the repair warnings.

A manifest lists the shards (``shard-00000.safetensors``, one ``(n_shard, d_l)`` tensor per LoRA block l);
each shard has its own record (``shard-00000.json``: its manifest entry and the layout it belongs to), so
a build that dies keeps the shards it finished (:func:`gradian.index.build.build_index`).

Integrity. A shard is written only after every one of its rows was computed
and every stored number is finite; :meth:`GradientIndex.verify` and
:meth:`GradientIndex.load_shard` check the same again on read (file present,
sha256, each block's shape, finiteness), so a damaged index, or one written by
an older Gradian with a bad batch size, is never scored. :func:`build_index`
names each shard it rebuilds and why, as an :class:`IndexRepairWarning` (the
CLI prints it as a ``warning:`` line) and in the manifest's ``repairs`` list.
A manifest that cannot be read (truncated, wrong shape) counts as no index:
:class:`CorruptIndexError` (a ``FileNotFoundError``); the next build keeps the shards whose own
records check out and computes the rest.

**One hash per shard per run.** A verdict reads each shard several times (publishing the index, each
engine's fit, scoring, the clusters): on the tiny worked world every row shard was hashed 5–6 times and
every sentence shard 3 times in one run, which on the quick SmolLM2 world's 6 GB of exact shards a
checkpoint comes to an estimated 80 s of sha256 (at ~520 MB/s) in a 640 s run. Inside :func:`hashed_once` (what
``gradian attribute`` and ``gradian index`` run in) a shard's sha256 is computed once (for a shard this process
wrote, as it finishes it) and remembered by the file's (path, size, mtime, inode); a file replaced
or rewritten in between is hashed again. So is a whole-file check of its numbers (:func:`shard_problem`,
which publishing an index runs): a shard this process wrote after checking them, or scanned once, is not
scanned again. Outside it every open hashes the file and every check reads the numbers, as before. A
block read to be used (:class:`ShardBlocks`) is always checked.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Sequence

import torch

from gradian.errors import GradianUserError, GradianWarning
from gradian.util import atomic_write_json

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


#: Inside :func:`hashed_once`: ``{(path, size, mtime_ns, inode): sha256}`` of the shards this process hashed or
#: wrote; None outside it (every open hashes the file).
_HASHED: dict[tuple[str, int, int, int], str] | None = None
#: Inside :func:`hashed_once`: the shard files whose every number this process has checked (when it wrote them,
#: or by a full scan); a re-check of the whole file (:func:`shard_problem`) skips their numbers.
_CHECKED: set[tuple[str, int, int, int]] = set()


@contextmanager
def hashed_once() -> Iterator[None]:
    """Within this block, hash each shard file once (module docstring); nested blocks share the outer one's."""
    global _HASHED
    if _HASHED is not None:
        yield
        return
    _HASHED = {}
    try:
        yield
    finally:
        _HASHED = None
        _CHECKED.clear()


def _file_key(p: Path) -> tuple[str, int, int, int]:
    st = p.stat()
    return (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


def shard_sha256(p: Path) -> str:
    """The sha256 of shard file ``p``: remembered within :func:`hashed_once`, else hashed."""
    from gradian.util import sha256_file

    if _HASHED is None:
        return sha256_file(p, chunk=16 << 20)
    key = _file_key(p)
    if key not in _HASHED:
        _HASHED[key] = sha256_file(p, chunk=16 << 20)
    return _HASHED[key]


class CorruptShardError(GradianUserError, RuntimeError):
    """A shard that is missing, does not match its sha256, or holds wrong-shaped or non-finite numbers."""


class CorruptIndexError(FileNotFoundError):
    """An index folder whose manifest cannot be read: it counts as no index (and is rebuilt)."""


class IndexRepairWarning(GradianWarning):
    """A shard (or the manifest) of an existing index failed its check and is being rebuilt."""


# a plain file name inside the index folder (no path: a manifest must not point outside it)
_SHARD_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*\.safetensors$")


def manifest_problem(m: Any) -> str | None:
    """Why a parsed manifest cannot be used, or None (the fields every reader relies on)."""
    if not isinstance(m, dict):
        return "the manifest is not a JSON object"
    if not isinstance(m.get("index_id"), str):
        return "no index_id"
    if not isinstance(m.get("grad_spec"), dict):
        return "no grad_spec"
    blocks = m.get("blocks")
    if not isinstance(blocks, list) or not all(
        isinstance(b, dict)
        and isinstance(b.get("name"), str)
        and isinstance(b.get("dim"), int)
        and not isinstance(b.get("dim"), bool)
        and b["dim"] > 0
        for b in blocks
    ):
        return "blocks is not a list of {name, dim}"
    shards = m.get("shards")
    if not isinstance(shards, list):
        return "shards is not a list"
    for k, sh in enumerate(shards):
        why = entry_problem(sh)
        if why:
            return f"shards[{k}] {why}"
    return None


def entry_problem(sh: Any) -> str | None:
    """Why one shard entry (of a manifest or a shard record) cannot be used, or None."""
    if not isinstance(sh, dict) or not isinstance(sh.get("file"), str) or not _SHARD_NAME.match(sh["file"]):
        return "has no valid file name"
    if (
        not isinstance(sh.get("sha256"), str)
        or not isinstance(sh.get("n"), int)
        or isinstance(sh.get("n"), bool)
        or sh["n"] < 0
    ):
        return "has no sha256 or row count"
    if "start" in sh and (not isinstance(sh["start"], int) or isinstance(sh["start"], bool) or sh["start"] < 0):
        return "has a bad start row"
    ex = sh.get("examples")
    if (
        not isinstance(ex, dict)
        or not all(isinstance(v, list) and len(v) == sh["n"] for v in ex.values())
        or "id" not in ex
    ):
        return "has no per-row metadata"
    return None


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The parsed ``manifest.json`` of an index folder.

    Raises:
        FileNotFoundError: no manifest; :class:`CorruptIndexError` (a subclass): it cannot be read
        (truncated JSON, wrong shape), with the reason.
    """
    from gradian.safeio import load_json_file

    mpath = Path(root) / MANIFEST
    if not mpath.exists():
        raise FileNotFoundError(f"no index at {root}")
    try:
        m = load_json_file(mpath, "index manifest")
    except GradianUserError as e:
        err = CorruptIndexError(f"{mpath}: {e.what}")
        err.reason = e.what  # type: ignore[attr-defined]
        raise err from None
    problem = manifest_problem(m)
    if problem:
        err = CorruptIndexError(f"{mpath}: {problem}")
        err.reason = problem  # type: ignore[attr-defined]
        raise err
    return m


#: No per-example LoRA gradient that can be scored is this large; uninitialised memory often is.
GRAD_ABS_MAX = 1e30


def _implausible_rows(t: torch.Tensor) -> tuple[list[int], int]:
    """``(sorted rows, number of entries)`` of a ``(n, d)`` tensor that are NaN, infinite, or beyond
    :data:`GRAD_ABS_MAX` in magnitude; ``([], 0)`` when every entry is plausible.
    """
    if t.numel() == 0:
        return [], 0
    # the common case in one read and no temporaries: NaN propagates into both ends, ±inf shows as an end
    lo, hi = torch.aminmax(t)
    if (
        bool(torch.isfinite(lo))
        and bool(torch.isfinite(hi))
        and -GRAD_ABS_MAX <= float(lo) <= float(hi) <= GRAD_ABS_MAX
    ):
        return [], 0
    bad = ~torch.isfinite(t) | (t.abs() > GRAD_ABS_MAX)
    if not bool(bad.any()):
        return [], 0
    return sorted({int(r) for r in bad.nonzero()[:, 0].tolist()}), int(bad.sum())


def check_shard_finite(per_block: Mapping[str, torch.Tensor], ids: Sequence[Any], noun: str, root: Path) -> None:
    """Refuse to write a shard any of whose stored numbers is NaN, infinite or beyond :data:`GRAD_ABS_MAX`.

    Args:
        per_block: block name -> the shard's ``(n_shard, d_l)`` tensor for that block.
        ids: the ``n_shard`` row ids, in the tensors' row order.
        noun: what one row of the shard is, for the message (``"row"``, ``"sentence unit"``).

    Raises:
        GradianUserError: how many rows are bad, the first block they are bad in, and up to eight of their ids.
    """
    bad_rows: set[int] = set()
    bad_blocks = []
    for name, v in per_block.items():
        rows, _ = _implausible_rows(v)
        if rows:
            bad_blocks.append(name)
            bad_rows.update(rows)
    if bad_rows:
        _refuse_implausible(bad_rows, bad_blocks[0], ids, noun, root)


def _refuse_implausible(bad_rows: set[int], first_block: str, ids: Sequence[Any], noun: str, root: Path) -> None:
    """The error of :func:`check_shard_finite`: how many rows are bad, the first block, up to eight ids."""
    bad = [ids[r] for r in sorted(bad_rows)]
    shown = ", ".join(map(str, bad[:8])) + (f" (+{len(bad) - 8})" if len(bad) > 8 else "")
    raise GradianUserError(
        f"the per-example gradients of {len(bad)} {noun}(s) are not finite (NaN/inf, or beyond {GRAD_ABS_MAX:g}), "
        f"e.g. in {first_block}; "
        f"{noun}s {shown}; the shard is not written",
        where=str(root),
        fix="check the base and adapter weights for NaN/inf and train in float32 (float16 overflows); "
        "--storage-dtype float16 cannot hold gradients above 65504 (use bfloat16)",
    )


#: The per-row metadata of a shard entry's ``examples``: one list per key, in row order.
EXAMPLE_KEYS = ("id", "loss", "n_supervised", "truncated", "full_length")


def _record_shard(
    root: Path,
    k: int,
    sha256: str,
    start: int,
    rows: Sequence[Mapping[str, Any]],
    layout: dict[str, Any],
    written_by: str | None,
) -> dict[str, Any]:
    """Shard ``k`` is on disk with this ``sha256`` (its numbers checked): remember both within :func:`hashed_once`,
    write its record and return its manifest entry.

    The record comes right after the shard, so a build that dies later keeps this shard (:func:`_read_record`).
    ``rows`` holds each row's :data:`EXAMPLE_KEYS`; ``written_by``, when given, is the entry's ``"pass"``.
    """
    fname = _shard_file(k)
    entry: dict[str, Any] = {
        "file": fname,
        "sha256": sha256,
        "start": start,
        "n": len(rows),
        "examples": {key: [r[key] for r in rows] for key in EXAMPLE_KEYS},
    }
    if written_by is not None:
        entry["pass"] = written_by
    if _HASHED is not None:  # the bytes just written: no need to read them back to hash (or check) them
        key = _file_key(root / fname)
        _HASHED[key] = sha256
        _CHECKED.add(key)
    atomic_write_json(root / _record_file(k), {"layout": layout, "entry": entry})
    return entry


#: safetensors' name for each storage dtype.
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16"}


def safetensors_layout(
    names: Sequence[str], shapes: Sequence[tuple[int, ...]], dtype: torch.dtype
) -> tuple[bytes, list[int]]:
    """The header ``safetensors.torch.save`` writes for tensors of one dtype, and where each one's bytes start.

    The format: 8 bytes little-endian header length, then the JSON header (tensors in name order, each with
    ``dtype``, ``shape`` and ``data_offsets`` into the data that follows, no spaces), padded with spaces to a
    multiple of 8; then the tensors' bytes in the same order. ``tests/index/test_shard_stream.py`` holds the
    bytes equal to safetensors' own.

    Returns:
        ``(header bytes, start offset of each tensor in the file)`` (in the order of ``names``).
    """
    import json
    import struct

    width = torch.empty(0, dtype=dtype).element_size()
    order = sorted(range(len(names)), key=lambda i: names[i])
    meta, pos = {}, 0
    begin = [0] * len(names)
    for i in order:
        nbytes = width * math.prod(shapes[i])
        meta[names[i]] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(shapes[i]),
            "data_offsets": [pos, pos + nbytes],
        }
        begin[i] = pos
        pos += nbytes
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = struct.pack("<Q", len(text)) + text
    return head, [len(head) + b for b in begin]


class ShardStream:
    """Shard ``k`` written to disk row by row, so a build holds one row's vectors rather than the shard.

    The file is laid out as ``safetensors.torch.save`` of the whole ``(n, d_l)`` blocks would write it (header
    first, then each block's rows; :func:`safetensors_layout`), byte for byte: the same sha256, so an index built
    either way is the same index. Each row's numbers are checked as they arrive; :meth:`finish` refuses the shard
    (the error of :func:`check_shard_finite`, over all its rows) before it is renamed into place, and a shard
    with a row never put is never finished.

    Args:
        root: the index folder; ``k``: the shard's number.
        names: the block names; ``dims``: each block's numbers per row; ``n``: the shard's rows.
        dtype: the storage dtype.
    """

    def __init__(self, root: Path, k: int, names: Sequence[str], dims: Sequence[int], n: int, dtype: torch.dtype):
        from gradian.util import AtomicFile

        self.root, self.k, self.dtype, self.names = Path(root), k, dtype, list(names)
        self.width = torch.empty(0, dtype=dtype).element_size()
        self.dims = [int(d) for d in dims]
        head, self.begin = safetensors_layout(self.names, [(n, d) for d in self.dims], dtype)
        size = len(head) + n * sum(self.dims) * self.width
        self.file = AtomicFile(self.root / _shard_file(k), size)
        self.file.write_at(head, 0)
        self.left = set(range(n))
        self.bad_rows: set[int] = set()
        self.bad_blocks: set[int] = set()

    def put(self, r: int, vecs: Sequence[torch.Tensor]) -> bool:
        """Write row ``r`` (0-based in the shard): one ``(d_l,)`` vector per block, cast to the storage dtype.

        Returns True when this was the shard's last row still missing.
        """
        for i, (v, d) in enumerate(zip(vecs, self.dims)):
            v = v.detach().reshape(1, d).to(device="cpu", dtype=self.dtype).contiguous()
            if _implausible_rows(v)[0]:
                self.bad_rows.add(r)
                self.bad_blocks.add(i)
            # the tensor's own bytes, not a copy (a row's vector is written once per block on the build's hot path)
            self.file.write_at(memoryview(v.view(torch.uint8).reshape(-1).numpy()), self.begin[i] + r * d * self.width)
        self.left.discard(r)
        return not self.left

    def finish(
        self,
        start: int,
        rows: Sequence[Mapping[str, Any]],
        layout: dict[str, Any],
        noun: str,
        written_by: str | None = None,
    ) -> dict[str, Any]:
        """Check, commit and record the shard (every row put); returns its manifest entry (:func:`_record_shard`).

        Raises:
            GradianUserError: a row's numbers are not finite (the temp file is removed; nothing is written).
        """
        from gradian.util import sha256_file

        if self.left:  # cannot happen: the builders finish a shard when its last row arrives
            self.file.abort()
            raise RuntimeError(f"shard {self.k}: {len(self.left)} rows were not computed")
        if self.bad_rows:
            self.file.abort()
            _refuse_implausible(
                self.bad_rows, self.names[min(self.bad_blocks)], [m["id"] for m in rows], noun, self.root
            )
        self.file.commit()
        return _record_shard(
            self.root, self.k, sha256_file(self.root / _shard_file(self.k)), start, rows, layout, written_by
        )

    def abort(self) -> None:
        """Remove the unfinished shard's temp file."""
        self.file.abort()


def _block_problem(b: dict[str, Any], t: torch.Tensor | None, n: int) -> str | None:
    """Why one block's tensor of a shard is unusable (missing, wrong shape, not float, non-finite), or None."""
    if t is None:
        return f"block {b['name']} is missing"
    if tuple(t.shape) != (n, int(b["dim"])):
        return f"block {b['name']} has shape {tuple(t.shape)}, not ({n}, {b['dim']})"
    if not t.is_floating_point():
        return f"block {b['name']} is {t.dtype}, not floating point"
    rows, count = _implausible_rows(t)
    if rows:
        return (
            f"block {b['name']} holds {count} non-finite value(s) (NaN/inf, or beyond "
            f"{GRAD_ABS_MAX:g}) in {len(rows)} row(s)"
        )
    return None


class ShardBlocks(Mapping):
    """One shard's blocks, read from its file one block at a time: ``shard[name]`` is that block's
    ``(n_shard, d_l)`` tensor in ``dtype``, read, checked (shape, finite) and converted when asked for.

    So a pass over a shard holds one block, not the shard (a sentence shard of an all-linear r=16 SmolLM2
    adapter is 880 MB in float32 and was held whole, then again in float64). After :meth:`release` (the
    index's shard iterator calls it before it reads the next shard) the mapping is empty.

    Raises (on access):
        CorruptShardError: the block fails the check.
    """

    def __init__(self, path: Path, blocks: list[dict[str, Any]], n: int, dtype: torch.dtype, handle: Any):
        self.path, self.n, self.dtype = Path(path), int(n), dtype
        self._blocks = {b["name"]: b for b in blocks}
        self._f = handle

    def __getitem__(self, name: str) -> torch.Tensor:
        if self._f is None or name not in self._blocks:
            raise KeyError(name)
        t = self._f.get_tensor(name)
        why = _block_problem(self._blocks[name], t, self.n)
        if why:
            raise CorruptShardError(
                f"index shard {self.path.name} is corrupt: {why}",
                where=str(self.path.parent),
                fix="run `gradian index` (or `gradian attribute`) again: it rebuilds the shards that fail the check",
            )
        return t.to(self.dtype)

    def __iter__(self):
        return iter(self._blocks if self._f is not None else ())

    def __len__(self) -> int:
        return len(self._blocks) if self._f is not None else 0

    def release(self) -> None:
        """Close the file; the mapping is empty from now on."""
        self._f = None


def open_shard(root: Path, entry: dict[str, Any], blocks: list[dict[str, Any]]) -> tuple[str | None, Any]:
    """``(why the shard is unusable or None, an open safetensors handle)``: the file is present, regular,
    has the manifest's sha256 (hashed in pieces) and names every block with the right shape and a float
    dtype. Its numbers are not read here (:func:`shard_problem` and :class:`ShardBlocks` check them).
    """
    from safetensors import safe_open

    from gradian.safeio import check_regular_file

    p = Path(root) / entry["file"]
    if not p.exists():
        return "the file is missing", None
    try:
        check_regular_file(p, "index shard")
        digest = shard_sha256(p)
    except (GradianUserError, OSError) as e:
        return f"unreadable ({e})", None
    if digest != entry["sha256"]:
        return f"sha256 mismatch (expected {entry['sha256'][:12]}…)", None
    try:
        f = safe_open(str(p), framework="pt")
        names = set(f.keys())
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in names}
    except Exception as e:  # safetensors raises its own error types for bad bytes
        return f"not a readable safetensors file ({type(e).__name__})", None
    n = int(entry["n"])
    for b in blocks:
        if b["name"] not in names:
            return f"block {b['name']} is missing", None
        if shapes[b["name"]] != (n, int(b["dim"])):
            return f"block {b['name']} has shape {shapes[b['name']]}, not ({n}, {b['dim']})", None
    return None, f


def shard_problem(root: Path, entry: dict[str, Any], blocks: list[dict[str, Any]]) -> str | None:
    """Why one manifest shard entry is unusable, or None: :func:`open_shard`'s checks, then every block's
    numbers, read one block at a time (memory: one block, not the shard).
    """
    why, f = open_shard(root, entry, blocks)
    if why:
        return why
    key = _file_key(Path(root) / entry["file"]) if _HASHED is not None else None
    if key in _CHECKED:  # within hashed_once: this process checked these numbers (written or scanned here)
        return None
    n = int(entry["n"])
    for b in blocks:
        why = _block_problem(b, f.get_tensor(b["name"]), n)
        if why:
            return why
    if key is not None:
        _CHECKED.add(key)
    return None


def _write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    atomic_write_json(root / MANIFEST, manifest)


def _repair(root: Path, manifest: dict[str, Any], what: str, emit: bool = True) -> None:
    if emit:
        warnings.warn(f"index {manifest.get('index_id', root.name)}: {what}", IndexRepairWarning, stacklevel=3)
    manifest.setdefault("repairs", []).append({"what": what, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def _shard_file(k: int) -> str:
    return f"shard-{k:05d}.safetensors"


def _record_file(k: int) -> str:
    return f"shard-{k:05d}.json"


def _layout(iid: str, shard_size: int, block_meta: list[dict[str, Any]]) -> dict[str, Any]:
    """What a shard record must match to be used: the index id, the shard size and the blocks."""
    return {"index_id": iid, "shard_size": shard_size, "blocks": [[b["name"], int(b["dim"])] for b in block_meta]}


def _read_record(root: Path, k: int, layout: dict[str, Any]) -> dict[str, Any] | None:
    """Shard k's own record, when it exists, is readable and belongs to this layout."""
    from gradian.safeio import load_json_file

    p = root / _record_file(k)
    if not p.is_file():
        return None
    try:
        rec = load_json_file(p, "index shard record")
    except GradianUserError:
        return None  # an unreadable record is no record: the shard is computed again
    if not isinstance(rec, dict) or rec.get("layout") != layout or entry_problem(rec.get("entry")):
        return None
    return rec["entry"]
