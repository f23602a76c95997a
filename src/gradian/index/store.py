"""The content-addressed gradient index: shards plus a manifest, on disk.

Layout of ``<cache>/index/<index_id>/``::

    manifest.json            identity, spec, blocks, shard list (written once the build ends)
    shard-00000.safetensors  one (n_shard, d_l) float tensor per LoRA block l
    shard-00000.json         that shard's own record: its manifest entry (sha256, rows, per-row
                             metadata) and the layout it belongs to, written right after the shard

``index_id`` is the first 16 hex digits of sha256 over the manifest's
*identity* (base model content, adapter files, dataset content, gradient spec:
modules, loss masking, max length, projection, storage dtype; the seed; the
library versions). The same inputs give the same id, so a second
``attribute`` with a new eval set reuses the training gradients with no pass
over the training set. Engine knobs such as DataInf's damping are applied at
query time and live in the run manifest, not here: changing them must not
force a new pass.

Shard k always holds rows ``[k·S, (k+1)·S)`` (``S`` = the shard size), whoever computes it, so
the index id and every shard's bytes are the same for one process and for a torchrun job of any
size (:mod:`gradian.distributed`): each rank computes whole shards and writes each with its own
record; rank 0 writes the manifest after a barrier. Writes are atomic (temp file, fsync, rename).
Every shard's sha256 is in its record and in the manifest and is checked on load; a corrupt or
missing shard is reported and rebuilt by :func:`build_index`, never silently used. An interrupted
build (a killed process, a dead rank) resumes from the shard records, with any number of
processes, and yields identical scores. Peak memory holds one shard.

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
"""

from __future__ import annotations

import math
import re
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from gradian.data.tokenize import TokenizedExample, TokenizeSpec, collate, row_values
from gradian.errors import GradianUserError, GradianWarning
from gradian.gradients.lora import lora_blocks
from gradian.gradients.per_example import per_example_grads
from gradian.gradients.projection import KroneckerProjector, ProjectionSpec
from gradian.paths import cache_dir
from gradian.util import (  # noqa: F401  (human_bytes: also this module's name for it)
    DiskFullError,
    atomic_write_bytes,
    atomic_write_json,
    free_bytes,
    human_bytes,
    release_free_memory,
    sha256_bytes,
    sha256_json,
)

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
STORAGE_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


@dataclass(frozen=True)
class GradSpec:
    """What a stored training gradient is. Every field changes the numbers, so all are identity.

    Attributes:
        tokenize: how rows become tokens and loss masks.
        modules: layer-name substrings to restrict the LoRA blocks (None: all).
        projection: the Kronecker JL projection (dim 0: exact).
        storage_dtype: ``float32`` (default), ``bfloat16``, ``float16`` or ``float64``. The 2-byte types
            halve the index; their ranking cost is measured in docs/benchmarks.md (float16 also
            cannot hold a gradient entry above 65504, and flushes entries below ~6e-8 to zero).
        optimizer: ``"none"`` (plain gradients) or ``"adam"``: each per-example gradient is
            replaced by Adam's update direction from the checkpoint's ``optimizer.pt``
            (:mod:`gradian.gradients.adam`), before projection. The file's hash is identity.
        unit: ``"row"`` (one gradient per training row) or ``"sentence"`` (one per sentence of
            each row's completion, the loss mask restricted to that sentence;
            :func:`gradian.data.spans.sentence_units`).
        max_units_per_row: a sentence index's budget of units per row (``--max-units-per-row``): a row
            with more supervised sentences has this many units of consecutive sentences
            (:mod:`gradian.data.spans`). Identity of sentence indexes only (:meth:`identity`).
    """

    tokenize: TokenizeSpec = field(default_factory=TokenizeSpec)
    modules: tuple[str, ...] | None = None
    projection: ProjectionSpec = field(default_factory=ProjectionSpec)
    storage_dtype: str = "float32"
    optimizer: str = "none"
    unit: str = "row"
    max_units_per_row: int = 32  # gradian.data.spans.MAX_UNITS_PER_ROW (tests hold them equal)

    def __post_init__(self) -> None:
        from gradian.validate import check_choice, check_int, check_type, where

        check_type(self.tokenize, TokenizeSpec, "GradSpec", "tokenize")
        check_type(self.projection, ProjectionSpec, "GradSpec", "projection")
        if self.modules is not None:
            mods = self.modules
            if (
                isinstance(mods, str)
                or not isinstance(mods, (tuple, list))
                or not all(isinstance(m, str) and m.strip() for m in mods)
            ):
                raise GradianUserError(
                    "modules must be a list of non-empty layer-name substrings",
                    where=where("--modules", "GradSpec", "modules"),
                    fix="e.g. --modules q_proj,v_proj (or leave it unset for every LoRA layer)",
                )
        check_choice(self.storage_dtype, tuple(STORAGE_DTYPES), "GradSpec", "storage_dtype", flag="--storage-dtype")
        check_choice(self.optimizer, ("none", "adam"), "GradSpec", "optimizer", flag="--optimizer")
        check_choice(self.unit, ("row", "sentence"), "GradSpec", "unit", flag="--unit")
        check_int(
            self.max_units_per_row,
            "GradSpec",
            "max_units_per_row",
            flag="--max-units-per-row",
            lo=1,
            hi=1_000_000,
            fix="use e.g. --max-units-per-row 32",
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tokenize"] = self.tokenize.to_dict()  # its chat_template only when set (index ids without one unchanged)
        d["modules"] = list(self.modules) if self.modules else None
        return d

    def identity(self) -> dict[str, Any]:
        """What of the spec decides an index's numbers (hashed into its id).

        :meth:`to_dict`, less the unit budget for a row index (it has no sentence units, so a row index's
        id does not depend on it: row indexes built before the budget existed keep their ids).
        """
        d = self.to_dict()
        if self.unit == "row":
            del d["max_units_per_row"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GradSpec:
        """The inverse of :meth:`to_dict` (an index manifest's or a run manifest's ``grad`` spec)."""
        from dataclasses import fields

        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        if isinstance(kw.get("tokenize"), dict):
            kw["tokenize"] = TokenizeSpec(**kw["tokenize"])
        if isinstance(kw.get("projection"), dict):
            kw["projection"] = ProjectionSpec(**kw["projection"])
        if isinstance(kw.get("modules"), list):
            kw["modules"] = tuple(kw["modules"])
        return cls(**kw)


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


def _finite_problem(tensors: dict[str, torch.Tensor], blocks: list[dict[str, Any]], n: int) -> str | None:
    """Why a shard's block tensors are unusable (missing block, wrong shape, non-finite), or None."""
    for b in blocks:
        t = tensors.get(b["name"])
        if t is None:
            return f"block {b['name']} is missing"
        if tuple(t.shape) != (n, int(b["dim"])):
            return f"block {b['name']} has shape {tuple(t.shape)}, not ({n}, {b['dim']})"
        if not t.is_floating_point():
            return f"block {b['name']} is {t.dtype}, not floating point"
        bad = _implausible(t)
        if bool(bad.any()):
            rows = sorted({int(r) for r in bad.nonzero()[:, 0].tolist()})
            return (
                f"block {b['name']} holds {int(bad.sum())} non-finite value(s) (NaN/inf, or beyond "
                f"{GRAD_ABS_MAX:g}) in {len(rows)} row(s)"
            )
    return None


#: No per-example LoRA gradient that can be scored is this large; uninitialised memory often is.
GRAD_ABS_MAX = 1e30


def _implausible(t: torch.Tensor) -> torch.Tensor:
    """Entries that are NaN, infinite, or beyond :data:`GRAD_ABS_MAX` in magnitude."""
    return ~torch.isfinite(t) | (t.abs() > GRAD_ABS_MAX)


def index_id(identity: dict[str, Any]) -> str:
    """The index's id: the first 16 hex digits of sha256 over the canonical JSON of its ``identity``."""
    return sha256_json(identity)[:16]


def default_index_root(identity: dict[str, Any]) -> Path:
    """Where the index with this identity lives by default: ``<cache>/index/<index_id>``."""
    return cache_dir() / "index" / index_id(identity)


class GradientIndex:
    """A built (or partially built) index opened read-only.

    Attributes:
        root: its folder.
        manifest: the parsed manifest.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.manifest = read_manifest(self.root)
        #: shard index -> why it failed :meth:`verify` (filled by :meth:`verify`)
        self.problems: dict[int, str] = {}

    @property
    def id(self) -> str:
        return self.manifest["index_id"]

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    @property
    def grad_spec(self) -> dict[str, Any]:
        """The :class:`GradSpec` the gradients were computed with, as a dict."""
        return self.manifest["grad_spec"]

    @property
    def modules(self) -> list[str] | None:
        return self.grad_spec.get("modules")

    @property
    def blocks(self) -> list[dict[str, Any]]:
        return self.manifest["blocks"]

    @property
    def n(self) -> int:
        return sum(s["n"] for s in self.manifest["shards"])

    def examples(self) -> list[dict[str, Any]]:
        """Per training example: id, loss, n_supervised, truncated, full_length, in index order."""
        out = []
        for s in self.manifest["shards"]:
            for j in range(s["n"]):
                out.append({k: s["examples"][k][j] for k in s["examples"]})
        return out

    @property
    def ids(self) -> list[str]:
        return [e["id"] for e in self.examples()]

    def shard_problem(self, k: int) -> str | None:
        """Why shard k cannot be used (missing, sha256 mismatch, unreadable, wrong shape, non-finite), or None."""
        return shard_problem(self.root, self.manifest["shards"][k], self.blocks)[0]

    def verify(self, *, collective: bool = False) -> list[int]:
        """Indices of shards that fail :meth:`shard_problem` (their reasons go to :attr:`problems`).

        Args:
            collective: under torchrun, each rank reads every world_size-th shard and the answers
                are gathered (collective): the same list on every rank, each shard read once.
        """
        from gradian import distributed

        d = distributed.current() if collective else distributed.Dist()
        mine = {}
        for k in range(d.rank, len(self.manifest["shards"]), d.world_size):
            why = self.shard_problem(k)
            if why:
                mine[k] = why
        self.problems = {}
        for part in distributed.all_gather_objects(mine) if d.enabled else [mine]:
            self.problems.update(part)
        return sorted(self.problems)

    def load_shard(self, k: int, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
        """Shard k's block tensors ``{block_name: (n_k, d_l)}``, checked (sha256, shapes, finite) before use.

        Raises:
            CorruptShardError: the shard fails the check; rebuild it with :func:`build_index`.
        """
        s = self.manifest["shards"][k]
        why, tensors = shard_problem(self.root, s, self.blocks)
        if why:
            raise CorruptShardError(
                f"index shard {s['file']} is corrupt: {why}",
                where=str(self.root),
                fix="run `gradian index` (or `gradian attribute`) again: it rebuilds the shards that fail the check",
            )
        return {b["name"]: tensors[b["name"]].to(dtype) for b in self.blocks}

    def local_shards(self) -> range:
        """The shards this rank fits and scores: a contiguous block, balanced by rows
        (:func:`gradian.distributed.contiguous_blocks`); every shard in a single process.
        """
        from gradian import distributed

        d = distributed.current()
        sizes = [s["n"] for s in self.manifest["shards"]]
        return distributed.contiguous_blocks(sizes, d.world_size)[d.rank]

    def local_rows(self) -> range:
        """The rows of :meth:`local_shards` (index order)."""
        ks = self.local_shards()
        starts = self._starts()
        if not len(ks):
            return range(0, 0)
        last = ks[-1]
        return range(starts[ks[0]], starts[last] + self.manifest["shards"][last]["n"])

    def _starts(self) -> list[int]:
        out, start = [], 0
        for s in self.manifest["shards"]:
            out.append(int(s.get("start", start)))
            start = out[-1] + s["n"]
        return out

    def iter_shards(
        self, dtype: torch.dtype = torch.float64, *, local: bool = False
    ) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
        """Yields ``(start_row, {block: (n_k, d_l)})`` shard by shard: memory is one shard (two while the
        next one loads, as the caller still holds the last).

        Args:
            local: only this rank's block of shards (:meth:`local_shards`); a collective caller
                then reduces or gathers what it computed (every shard in a single process).
        """
        starts = self._starts()
        ks = self.local_shards() if local else range(len(self.manifest["shards"]))
        for k in ks:
            release_free_memory()  # the shard before last is gone: its pages go back (util docstring)
            yield starts[k], self.load_shard(k, dtype)


def shard_problem(root: Path, entry: dict[str, Any], blocks: list[dict[str, Any]]) -> tuple[str | None, dict]:
    """``(why the shard is unusable or None, its tensors)`` for one manifest shard entry."""
    from safetensors.torch import load

    from gradian.safeio import check_regular_file

    p = Path(root) / entry["file"]
    if not p.exists():
        return "the file is missing", {}
    try:
        check_regular_file(p, "index shard")
        data = p.read_bytes()
    except (GradianUserError, OSError) as e:
        return f"unreadable ({e})", {}
    if sha256_bytes(data) != entry["sha256"]:
        return f"sha256 mismatch (expected {entry['sha256'][:12]}…)", {}
    try:
        tensors = load(data)
    except Exception as e:  # safetensors raises its own error types for bad bytes
        return f"not a readable safetensors file ({type(e).__name__})", {}
    return _finite_problem(tensors, blocks, int(entry["n"])), tensors


def _write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    atomic_write_json(root / MANIFEST, manifest)


def check_build_args(batch_size: Any, shard_size: Any = 256) -> None:
    """``batch_size`` and ``shard_size`` must be whole numbers >= 1 (a batch size below 1 would leave
    rows uncomputed).
    """
    from gradian.validate import check_int

    check_int(
        batch_size, "build_index", "batch_size", flag="--batch-size", lo=1, hi=1_000_000, fix="use e.g. --batch-size 8"
    )
    check_int(shard_size, "build_index", "shard_size", lo=1, hi=100_000_000, fix="use e.g. 256")


def select_blocks(model: torch.nn.Module, spec: GradSpec) -> list:
    """The LoRA blocks ``spec.modules`` selects; a user error when it selects none."""
    blocks = lora_blocks(model, list(spec.modules) if spec.modules else None)
    if not blocks:
        if spec.modules:
            names = sorted({b.layer.rsplit(".", 1)[-1] for b in lora_blocks(model)})
            raise GradianUserError(
                f"--modules {','.join(spec.modules)} matches none of the adapter's LoRA layers",
                where="--modules (GradSpec.modules)",
                fix=f"use substrings of the adapter's layer names ({', '.join(names[:8]) or 'none'}), "
                "or drop --modules",
            )
        raise GradianUserError(
            "the model has no LoRA layers",
            where="model",
            fix="attach a LoRA adapter (gradian.models.load_adapter) first",
        )
    return blocks


def _repair(root: Path, manifest: dict[str, Any], what: str, emit: bool = True) -> None:
    if emit:
        warnings.warn(f"index {manifest.get('index_id', root.name)}: {what}", IndexRepairWarning, stacklevel=3)
    manifest.setdefault("repairs", []).append({"what": what, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


# --------------------------------------------------------------------------- size


class IndexSizeWarning(GradianWarning):
    """The index about to be built is large (or larger than the free disk space)."""


#: above this an index build warns and suggests --project-dim
LARGE_INDEX_BYTES = 20 * 10**9


def index_numbers(blocks: Sequence, projection: ProjectionSpec) -> int:
    """Numbers stored per row: Σ_l d_l after the projection."""
    from gradian.gradients.projection import projected_numbers

    return sum(projected_numbers(tuple(b.shape), b.kind, projection.dim) for b in blocks)


def size_estimate(n_rows: int, numbers: int, storage_dtype: str, what: str = "rows") -> tuple[int, str]:
    """``(bytes, "403 rows × 215,040 numbers × 2 bytes = 173 MB")`` for an index's shards.

    Args:
        n_rows: the gradients stored: rows, or sentence units for a sentence index.
        what: what they are called in the line (``"rows"`` or ``"units"``, :func:`index_unit_name`).
    """
    width = torch.empty(0, dtype=STORAGE_DTYPES[storage_dtype]).element_size()
    total = n_rows * numbers * width
    return total, f"{n_rows:,} {what} × {numbers:,} numbers × {width} bytes = {human_bytes(total)}"


def index_unit_name(spec: GradSpec) -> str:
    """What one stored gradient is, in the size line: ``"units"`` (sentence units) or ``"rows"``."""
    return "units" if spec.unit == "sentence" else "rows"


def size_advice(n_rows: int, blocks: Sequence, spec: GradSpec, root: Path) -> str | None:
    """Why the index is too large, with the ``--project-dim`` that fits, or None.

    Args:
        n_rows: the gradients stored (sentence units for a sentence index, whose budget is also named).
    """
    import shutil

    what = index_unit_name(spec)
    total, _ = size_estimate(n_rows, index_numbers(blocks, spec.projection), spec.storage_dtype)
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None
    if total < LARGE_INDEX_BYTES and (free is None or total < 0.9 * free):
        return None
    where = f" but {human_bytes(free)} is free at {root}" if free is not None and total >= 0.9 * free else ""
    advice = []
    budget = min(LARGE_INDEX_BYTES, 0.5 * free) if free is not None else LARGE_INDEX_BYTES
    from dataclasses import replace

    last = None
    for dim in (8192, 4096, 2048, 1024, 512, 256, 128):
        if spec.projection.dim and dim >= spec.projection.dim:
            continue
        b, _ = size_estimate(n_rows, index_numbers(blocks, replace(spec.projection, dim=dim)), spec.storage_dtype)
        last = (dim, b)
        if b <= budget:
            advice.append(f"--project-dim {dim} would make it {human_bytes(b)}")
            break
    else:
        if last is not None:
            advice.append(
                f"even --project-dim {last[0]} needs {human_bytes(last[1])}: also attribute fewer layers "
                "(--modules) or rows"
            )
    if spec.storage_dtype in ("float32", "float64"):
        advice.append("--storage-dtype bfloat16 halves it")
    if spec.unit == "sentence":
        advice.append(f"a lower --max-units-per-row (now {spec.max_units_per_row}) or --unit row stores fewer units")
    return f"the gradient index will take est. {human_bytes(total)} for {n_rows:,} {what}{where}; " + "; ".join(
        advice or ["use --project-dim or --modules to store fewer numbers per row"]
    )


# --------------------------------------------------------------------------- shard records


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


def _shard_costs(lengths: Sequence[int], n_shards: int, shard_size: int, batch_size: int) -> list[int]:
    """Per shard, the padded tokens its length-sorted batches hold (what a backward pass costs)."""
    out = []
    for k in range(n_shards):
        lens = sorted(lengths[r] for r in range(k * shard_size, min(len(lengths), (k + 1) * shard_size)))
        out.append(
            sum(
                lens[min(s + batch_size, len(lens)) - 1] * len(lens[s : s + batch_size])
                for s in range(0, len(lens), batch_size)
            )
        )
    return out


def _clean_stale_temp(root: Path, older_than_s: float = 3600.0) -> None:
    """Temp files an interrupted writer left (a killed rank); recent ones may be another job's."""
    now = time.time()
    for p in root.glob(".*.tmp"):
        try:
            if now - p.stat().st_mtime > older_than_s:
                p.unlink()
        except OSError:
            pass


def _check_shared_folder(root: Path) -> None:
    """Under torchrun, every rank must see the files rank 0 writes (collective)."""
    import secrets

    from gradian import distributed

    token = distributed.broadcast_object(secrets.token_hex(8))
    probe = root / f".rank0-{token}"
    if distributed.current().is_main:
        probe.write_text(token)
    distributed.barrier()
    seen = distributed.all_gather_objects(probe.is_file())
    distributed.barrier()
    if distributed.current().is_main:
        probe.unlink(missing_ok=True)
    if not all(seen):
        r = seen.index(False)
        raise GradianUserError(
            f"rank {r} does not see the index folder rank 0 writes to: it is not on a shared filesystem",
            where=str(root),
            fix="put --index-dir (or --out, or GRADIAN_CACHE) on a filesystem every node mounts",
        )


def build_index(
    model: torch.nn.Module,
    items: Sequence[TokenizedExample],
    identity: dict[str, Any],
    spec: GradSpec,
    *,
    pad_token_id: int,
    root: str | Path | None = None,
    batch_size: int = 8,
    shard_size: int = 256,
    progress: Callable[[int], None] | None = None,
    progress_factory: Callable[[int], Callable[[int], None]] | None = None,
    announce: Callable[[str], None] | None = None,
    stop_after_shards: int | None = None,
    transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> GradientIndex:
    """Compute per-example training gradients and store them shard by shard.

    Peak memory holds one shard of gradients, whatever the dataset size. Collective under
    torchrun (:mod:`gradian.distributed`): every rank calls it with the same arguments; the
    shards still to compute are divided between the ranks, length-balanced, and every rank
    returns the same finished index.

    Args:
        model: PEFT LoRA model prepared for gradients.
        items: tokenised training examples (index order = this order).
        identity: the identity dict (hashed into the index id); must already
            include ``spec.to_dict()`` under ``"grad_spec"``.
        pad_token_id: used for padding (never supervised).
        root: the index folder (default ``<cache>/index/<id>``); under torchrun on a filesystem
            every rank sees.
        batch_size: examples per backward pass (does not change the numbers
            beyond float rounding; not part of the identity).
        shard_size: examples per shard file (rounded up to a multiple of batch_size).
        progress: called with the number of examples just processed (or skipped).
        progress_factory: called once with the number of rows this process will report (all of
            them in a single process; under torchrun, rank 0's own and the already finished ones),
            returns the ``progress`` callback.
        announce: called (on rank 0) with one line, the size estimate, before any gradient is computed.
        stop_after_shards: stop after computing this many new shards (tests
            use it to simulate an interrupted build).
        transform: optional ``(block name, g (b, o, i)) -> (b, o, i)`` applied to each
            per-example gradient before projection (Adam preconditioning); it must be
            reflected in ``identity``.

    Returns:
        the opened :class:`GradientIndex`.
    """
    from safetensors.torch import save

    from gradian import distributed

    dist = distributed.current()
    check_build_args(batch_size, shard_size)
    iid = index_id(identity)
    root = Path(root) if root is not None else default_index_root(identity)
    blocks = select_blocks(model, spec)
    if dist.enabled:  # ranks that disagree here would write different indexes: refuse, on every rank
        # (not the folder's path: a shared filesystem may be mounted at different paths; the probe below
        # checks that the ranks see one folder)
        distributed.check_same_inputs(
            {
                "the index id (base, adapter, data, gradient flags)": iid,
                "the number of rows": len(items),
                "the batch size": batch_size,
                "the shard size": shard_size,
            }
        )
    root.mkdir(parents=True, exist_ok=True)
    if dist.enabled:
        _check_shared_folder(root)
    projector = KroneckerProjector([b.shape for b in blocks], [b.kind for b in blocks], spec.projection)
    storage = STORAGE_DTYPES[spec.storage_dtype]
    shard_size = max(batch_size, (shard_size + batch_size - 1) // batch_size * batch_size)
    n_shards = (len(items) + shard_size - 1) // shard_size
    block_meta = [
        {"name": b.name, "kind": b.kind, "layer": b.layer, "shape": list(b.shape), "dim": projector.out_dim(i, b.shape)}
        for i, b in enumerate(blocks)
    ]
    layout = _layout(iid, shard_size, block_meta)

    # -- the plan: which shards are already done (from the manifest and the shards' own records)
    emit = dist.is_main  # repair warnings are printed once, by rank 0
    manifest: dict[str, Any] = {}
    repairs: list[dict[str, Any]] = []
    state: tuple[str, Any] = ("missing", None)
    if dist.is_main:  # rank 0 reads the manifest, so every rank plans from the same one
        try:
            state = ("ok", read_manifest(root))
        except CorruptIndexError as e:
            state = ("corrupt", getattr(e, "reason", str(e)))
        except FileNotFoundError:
            pass
    state = distributed.broadcast_object(state)
    if state[0] == "ok":
        manifest = state[1]
    elif state[0] == "corrupt":
        scratch: dict[str, Any] = {"index_id": iid}
        _repair(
            root,
            scratch,
            f"{MANIFEST} cannot be read ({state[1]}); rebuilding it (shards whose own record checks out are kept)",
            emit,
        )
        repairs = scratch["repairs"]
    from_manifest: dict[int, dict[str, Any]] = {}
    if manifest and (
        manifest.get("index_id") != iid
        or manifest.get("shard_size") != shard_size
        or [(b["name"], b["dim"]) for b in manifest["blocks"]] != [(b["name"], b["dim"]) for b in block_meta]
    ):
        # a different layout (another batch or shard size): started afresh, but shards that fail their check
        # are still named, since they may be what an earlier build left under this id
        named = {}
        for j in range(dist.rank, len(manifest["shards"]), dist.world_size):
            entry = manifest["shards"][j]
            why = shard_problem(root, entry, manifest["blocks"])[0]
            if why and why != "the file is missing":
                named[j] = f"{entry['file']} is corrupt ({why}); rebuilding it"
        for part in distributed.all_gather_objects(named) if dist.enabled else [named]:
            for j in sorted(part):
                _repair(root, manifest, part[j], emit)
        repairs = manifest.get("repairs", []) if manifest.get("index_id") == iid else []
        manifest = {}
    elif manifest:
        repairs = list(manifest.get("repairs", []))
        for entry in manifest["shards"]:
            start = entry.get("start")
            if isinstance(start, int) and start % shard_size == 0:
                from_manifest[start // shard_size] = entry
            # an entry without a start row (or off the grid) is not at a known place: recomputed
    # each rank checks every world_size-th shard; the answers are gathered, so all ranks agree
    mine: dict[int, tuple[dict[str, Any] | None, str | None]] = {}
    for k in range(dist.rank, n_shards, dist.world_size):
        lo, hi = k * shard_size, min(len(items), (k + 1) * shard_size)
        candidates = [e for e in (from_manifest.get(k), _read_record(root, k, layout)) if e is not None]
        first_why = None
        chosen = None
        for c, entry in enumerate(candidates):
            if c and entry == candidates[0]:
                continue
            why = None if entry.get("start") == lo and entry["n"] == hi - lo else "its row range does not match"
            why = why or shard_problem(root, entry, block_meta)[0]
            if why is None:
                chosen = entry
                break
            first_why = first_why or f"{entry['file']} is corrupt ({why}); rebuilding it"
        mine[k] = (chosen, None if chosen else first_why)
    plan: dict[int, tuple[dict[str, Any] | None, str | None]] = {}
    for part in distributed.all_gather_objects(mine):
        plan.update(part)
    shards: list[dict[str, Any] | None] = [plan[k][0] for k in range(n_shards)]
    new_repairs = [plan[k][1] for k in range(n_shards) if plan[k][1]]
    scratch = {"index_id": iid, "repairs": repairs}
    for what in new_repairs:
        _repair(root, scratch, what, emit)
    repairs = scratch["repairs"]
    pending = [k for k in range(n_shards) if shards[k] is None]
    if dist.is_main:
        _clean_stale_temp(root)
        if pending and manifest.get("complete"):
            manifest["complete"] = False  # shards are being rewritten: no reader may take it as finished
            _write_manifest(root, manifest)
    lengths = row_values(items, "length")  # a TokenizedRows is not tokenised again to plan
    costs = _shard_costs(lengths, n_shards, shard_size, batch_size)
    assigned = distributed.partition([costs[k] for k in pending], dist.world_size)[dist.rank]
    todo = [pending[j] for j in assigned]
    if stop_after_shards is not None:
        todo = todo[:stop_after_shards]
    distributed.barrier()  # every rank has its plan before any shard is (re)written

    if pending and announce is not None and dist.is_main:
        _, line = size_estimate(
            len(items), sum(int(b["dim"]) for b in block_meta), spec.storage_dtype, index_unit_name(spec)
        )
        done = n_shards - len(pending)
        extra = f"; {done} of {n_shards} shards already built" if done else ""
        split = f"; {len(pending)} shards over {dist.world_size} processes" if dist.enabled else ""
        announce(f"index {iid}: {line}{extra}{split}")
    numbers = sum(int(b["dim"]) for b in block_meta)
    row_bytes = size_estimate(1, numbers, spec.storage_dtype)[0]

    def rows_of(ks) -> int:
        return sum(min(len(items), (k + 1) * shard_size) - k * shard_size for k in ks)

    if pending:
        # the shards still to write must fit in the free space (rank 0 decides, every rank raises alike)
        need = rows_of(pending) * row_bytes
        free = free_bytes(root) if dist.is_main else None
        free = distributed.all_gather_objects(free)[0]
        if free is not None and need > free:
            err = DiskFullError(
                root,
                need,
                f"the gradient index's {len(pending)} remaining shard(s) (estimated before the build)",
                tail="no shard was written",
                fix=(size_advice(len(items), blocks, spec, root) or "; store fewer numbers per row").partition("; ")[2]
                + "; or free space there, or build the index on another disk (--out)",
                free=free,
            )
            err.every_rank = True
            raise err
    if pending and dist.is_main:
        advice = size_advice(len(items), blocks, spec, root)
        if advice:
            warnings.warn(advice, IndexSizeWarning, stacklevel=2)
    if progress_factory is not None:
        mine_rows = sum(min(len(items), (k + 1) * shard_size) - k * shard_size for k in todo)
        done_rows = sum(s["n"] for s in shards if s is not None) if dist.is_main else 0
        progress = progress_factory(mine_rows + done_rows)
    if progress and dist.is_main:
        done_rows = sum(s["n"] for s in shards if s is not None)
        if done_rows:
            progress(done_rows)

    # -- this rank's shards
    written: dict[int, dict[str, Any]] = {}
    for k in todo:
        lo, hi = k * shard_size, min(len(items), (k + 1) * shard_size)
        # Batches are formed from length-sorted rows (less padding, same exact per-row
        # gradients); results are written back in index order.
        order = sorted(range(lo, hi), key=lambda r: (lengths[r], r))
        # NaN until computed: a row no batch wrote can never pass the finiteness check below
        per_block = {
            b.name: torch.full((hi - lo, projector.out_dim(i, b.shape)), math.nan, dtype=storage)
            for i, b in enumerate(blocks)
        }
        filled = torch.zeros(hi - lo, dtype=torch.bool)
        losses_all = [0.0] * (hi - lo)
        row_meta: list[dict[str, Any]] = [{}] * (hi - lo)  # each row is read once (a TokenizedRows tokenises it)
        for s in range(0, len(order), batch_size):
            rows = order[s : s + batch_size]
            chunk = [items[r] for r in rows]
            for r, it in zip(rows, chunk):
                row_meta[r - lo] = {
                    "id": it.id,
                    "n_supervised": it.n_supervised,
                    "truncated": bool(it.truncated),
                    "full_length": int(it.full_length),
                }
            batch = collate(chunk, pad_token_id)
            grads, losses = per_example_grads(
                model, batch, "hooks", list(spec.modules) if spec.modules else None, return_losses=True
            )
            dest = torch.tensor([r - lo for r in rows])
            for i, b in enumerate(blocks):
                g = grads[b.name].detach().to(torch.float64)
                if transform is not None:
                    g = transform(b.name, g)
                per_block[b.name][dest] = projector(i, g).to(storage).cpu()
            for r, loss in zip(rows, losses.tolist()):
                losses_all[r - lo] = float(loss)
            filled[dest] = True
            if progress:
                progress(len(rows))
        if not bool(filled.all()):  # cannot happen with batch_size >= 1; never write such a shard
            raise RuntimeError(f"shard {k}: {int((~filled).sum())} rows were not computed")
        bad_rows: set[int] = set()
        bad_blocks = []
        for name, v in per_block.items():
            nf = _implausible(v)
            if bool(nf.any()):
                bad_blocks.append(name)
                bad_rows.update(int(r) for r in nf.nonzero()[:, 0].tolist())
        if bad_rows:
            ids = [row_meta[r]["id"] for r in sorted(bad_rows)]
            shown = ", ".join(map(str, ids[:8])) + (f" (+{len(ids) - 8})" if len(ids) > 8 else "")
            raise GradianUserError(
                f"the per-example gradients of {len(ids)} row(s) are not finite (NaN/inf, or beyond {GRAD_ABS_MAX:g}), "
                f"e.g. in {bad_blocks[0]}; "
                f"rows {shown}; the shard is not written",
                where=str(root),
                fix="check the base and adapter weights for NaN/inf and train in float32 (float16 overflows); "
                "--storage-dtype float16 cannot hold gradients above 65504 (use bfloat16)",
            )
        meta: dict[str, list[Any]] = {
            "id": [m["id"] for m in row_meta],
            "loss": losses_all,
            "n_supervised": [m["n_supervised"] for m in row_meta],
            "truncated": [m["truncated"] for m in row_meta],
            "full_length": [m["full_length"] for m in row_meta],
        }
        data = save({name: v.contiguous() for name, v in per_block.items()})
        del per_block
        fname = _shard_file(k)
        entry = {"file": fname, "sha256": sha256_bytes(data), "start": lo, "n": hi - lo, "examples": meta}
        try:
            atomic_write_bytes(root / fname, data)
            # the shard's own record, right after the shard: a build that dies later keeps this shard
            atomic_write_json(root / _record_file(k), {"layout": layout, "entry": entry})
        except DiskFullError as e:
            # the shards written so far stay valid (each has its record) and are reused by the next build;
            # the error names what the rest of this build still needs
            rest = todo[todo.index(k) :]
            raise DiskFullError(
                root,
                len(data) + rows_of(rest[1:]) * row_bytes,
                f"{fname} and the {len(rest) - 1} shard(s) after it",
                e.os_error,
                tail=f"{len(written)} shard(s) this build wrote are kept (valid, reused next time), no temp file left",
            ) from e
        del data
        written[k] = entry
        release_free_memory()
        distributed.fault_point("shard", len(written))

    # -- rank 0 publishes the manifest once every rank is done
    for part in distributed.all_gather_objects(written):
        for k, entry in part.items():
            shards[k] = entry
    if dist.is_main:
        manifest = {
            "format_version": FORMAT_VERSION,
            "index_id": iid,
            "identity": identity,
            "grad_spec": spec.to_dict(),
            "blocks": block_meta,
            "n_examples": len(items),
            "shard_size": shard_size,
            "shards": [s for s in shards if s is not None],
            "complete": all(s is not None for s in shards),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if repairs:
            manifest["repairs"] = repairs
        _write_manifest(root, manifest)
    distributed.barrier()
    return GradientIndex(root)
