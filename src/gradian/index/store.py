"""The content-addressed gradient index: shards plus a manifest, on disk.

Layout of ``<cache>/index/<index_id>/``::

    manifest.json            identity, spec, blocks, shard list (atomic rewrite per shard)
    shard-00000.safetensors  one (n_shard, d_l) float tensor per LoRA block l

``index_id`` is the first 16 hex digits of sha256 over the manifest's
*identity* (base model content, adapter files, dataset content, gradient spec:
modules, loss masking, max length, projection, storage dtype; the seed; the
library versions). The same inputs give the same id, so a second
``attribute`` with a new eval set reuses the training gradients with no pass
over the training set. Engine knobs such as DataInf's damping are applied at
query time and live in the run manifest, not here: changing them must not
force a new pass.

Writes are atomic (temp file, fsync, rename). Every shard's sha256 is in the
manifest and is checked on load; a corrupt or missing shard is reported and
rebuilt by :func:`build_index`, never silently used. An interrupted build
resumes at the first missing shard and yields identical scores.

Integrity. A shard is written only after every one of its rows was computed
and every stored number is finite; :meth:`GradientIndex.verify` and
:meth:`GradientIndex.load_shard` check the same again on read (file present,
sha256, each block's shape, finiteness), so a damaged index, or one written by
an older Gradian with a bad batch size, is never scored. :func:`build_index`
names each shard it rebuilds and why, as an :class:`IndexRepairWarning` (the
CLI prints it as a ``warning:`` line) and in the manifest's ``repairs`` list.
A manifest that cannot be read (truncated, wrong shape) counts as no index:
:class:`CorruptIndexError` (a ``FileNotFoundError``), and a fresh build.
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

from gradian.data.tokenize import TokenizedExample, TokenizeSpec, collate
from gradian.errors import GradianUserError, GradianWarning
from gradian.gradients.lora import lora_blocks
from gradian.gradients.per_example import per_example_grads
from gradian.gradients.projection import KroneckerProjector, ProjectionSpec
from gradian.paths import cache_dir
from gradian.util import atomic_write_bytes, atomic_write_json, sha256_bytes, sha256_json

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "float64": torch.float64}


@dataclass(frozen=True)
class GradSpec:
    """What a stored training gradient is. Every field changes the numbers, so all are identity.

    Attributes:
        tokenize: how rows become tokens and loss masks.
        modules: layer-name substrings to restrict the LoRA blocks (None: all).
        projection: the Kronecker JL projection (dim 0: exact).
        storage_dtype: ``float32`` (default), ``float16`` or ``float64``.
        optimizer: ``"none"`` (plain gradients) or ``"adam"``: each per-example gradient is
            replaced by Adam's update direction from the checkpoint's ``optimizer.pt``
            (:mod:`gradian.gradients.adam`), before projection. The file's hash is identity.
        unit: ``"row"`` (one gradient per training row) or ``"sentence"`` (one per sentence of
            each row's completion, the loss mask restricted to that sentence;
            :func:`gradian.attribute.spans.sentence_units`).
    """

    tokenize: TokenizeSpec = field(default_factory=TokenizeSpec)
    modules: tuple[str, ...] | None = None
    projection: ProjectionSpec = field(default_factory=ProjectionSpec)
    storage_dtype: str = "float32"
    optimizer: str = "none"
    unit: str = "row"

    def __post_init__(self) -> None:
        from gradian.validate import check_choice, check_type, where

        check_type(self.tokenize, TokenizeSpec, "GradSpec", "tokenize")
        check_type(self.projection, ProjectionSpec, "GradSpec", "projection")
        if self.modules is not None:
            mods = self.modules
            if isinstance(mods, str) or not isinstance(mods, (tuple, list)) \
                    or not all(isinstance(m, str) and m.strip() for m in mods):
                raise GradianUserError(
                    "modules must be a list of non-empty layer-name substrings", where=where("--modules", "GradSpec", "modules"),
                    fix="e.g. --modules q_proj,v_proj (or leave it unset for every LoRA layer)",
                )
        check_choice(self.storage_dtype, tuple(STORAGE_DTYPES), "GradSpec", "storage_dtype", flag="--storage-dtype")
        check_choice(self.optimizer, ("none", "adam"), "GradSpec", "optimizer", flag="--optimizer")
        check_choice(self.unit, ("row", "sentence"), "GradSpec", "unit", flag="--unit")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["modules"] = list(self.modules) if self.modules else None
        return d


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
            isinstance(b, dict) and isinstance(b.get("name"), str) and isinstance(b.get("dim"), int)
            and not isinstance(b.get("dim"), bool) and b["dim"] > 0 for b in blocks):
        return "blocks is not a list of {name, dim}"
    shards = m.get("shards")
    if not isinstance(shards, list):
        return "shards is not a list"
    for k, sh in enumerate(shards):
        if not isinstance(sh, dict) or not isinstance(sh.get("file"), str) or not _SHARD_NAME.match(sh["file"]):
            return f"shards[{k}] has no valid file name"
        if not isinstance(sh.get("sha256"), str) or not isinstance(sh.get("n"), int) or isinstance(sh.get("n"), bool) \
                or sh["n"] < 0:
            return f"shards[{k}] has no sha256 or row count"
        ex = sh.get("examples")
        if not isinstance(ex, dict) or not all(isinstance(v, list) and len(v) == sh["n"] for v in ex.values()) \
                or "id" not in ex:
            return f"shards[{k}] has no per-row metadata"
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
            return (f"block {b['name']} holds {int(bad.sum())} non-finite value(s) (NaN/inf, or beyond "
                    f"{GRAD_ABS_MAX:g}) in {len(rows)} row(s)")
    return None


#: No per-example LoRA gradient that can be scored is this large; uninitialised memory often is.
GRAD_ABS_MAX = 1e30


def _implausible(t: torch.Tensor) -> torch.Tensor:
    """Entries that are NaN, infinite, or beyond :data:`GRAD_ABS_MAX` in magnitude."""
    return ~torch.isfinite(t) | (t.abs() > GRAD_ABS_MAX)


def index_id(identity: dict[str, Any]) -> str:
    return sha256_json(identity)[:16]


def default_index_root(identity: dict[str, Any]) -> Path:
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

    def verify(self) -> list[int]:
        """Indices of shards that fail :meth:`shard_problem` (their reasons go to :attr:`problems`)."""
        self.problems = {}
        for k in range(len(self.manifest["shards"])):
            why = self.shard_problem(k)
            if why:
                self.problems[k] = why
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
                f"index shard {s['file']} is corrupt: {why}", where=str(self.root),
                fix="run `gradian index` (or `gradian attribute`) again: it rebuilds the shards that fail the check",
            )
        return {b["name"]: tensors[b["name"]].to(dtype) for b in self.blocks}

    def iter_shards(self, dtype: torch.dtype = torch.float64) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
        """Yields ``(start_row, {block: (n_k, d_l)})`` shard by shard: memory is one shard."""
        start = 0
        for k, s in enumerate(self.manifest["shards"]):
            yield start, self.load_shard(k, dtype)
            start += s["n"]


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
    rows uncomputed)."""
    from gradian.validate import check_int

    check_int(batch_size, "build_index", "batch_size", flag="--batch-size", lo=1, hi=1_000_000,
              fix="use e.g. --batch-size 8")
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
                fix=f"use substrings of the adapter's layer names ({', '.join(names[:8]) or 'none'}), or drop --modules",
            )
        raise GradianUserError("the model has no LoRA layers", where="model",
                               fix="attach a LoRA adapter (gradian.models.load_adapter) first")
    return blocks


def _repair(root: Path, manifest: dict[str, Any], what: str) -> None:
    warnings.warn(f"index {manifest.get('index_id', root.name)}: {what}", IndexRepairWarning, stacklevel=3)
    manifest.setdefault("repairs", []).append(
        {"what": what, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


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
    stop_after_shards: int | None = None,
    transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> GradientIndex:
    """Compute per-example training gradients and store them shard by shard.

    Peak memory holds one shard of gradients, whatever the dataset size.

    Args:
        model: PEFT LoRA model prepared for gradients.
        items: tokenised training examples (index order = this order).
        identity: the identity dict (hashed into the index id); must already
            include ``spec.to_dict()`` under ``"grad_spec"``.
        pad_token_id: used for padding (never supervised).
        root: the index folder (default ``<cache>/index/<id>``).
        batch_size: examples per backward pass (does not change the numbers
            beyond float rounding; not part of the identity).
        shard_size: examples per shard file (rounded up to a multiple of batch_size).
        progress: called with the number of examples just processed (or skipped).
        stop_after_shards: stop after computing this many new shards (tests
            use it to simulate an interrupted build).
        transform: optional ``(block name, g (b, o, i)) -> (b, o, i)`` applied to each
            per-example gradient before projection (Adam preconditioning); it must be
            reflected in ``identity``.
    Returns:
        the opened :class:`GradientIndex`.
    """
    from safetensors.torch import save

    check_build_args(batch_size, shard_size)
    iid = index_id(identity)
    root = Path(root) if root is not None else default_index_root(identity)
    blocks = select_blocks(model, spec)
    root.mkdir(parents=True, exist_ok=True)
    projector = KroneckerProjector([b.shape for b in blocks], [b.kind for b in blocks], spec.projection)
    storage = STORAGE_DTYPES[spec.storage_dtype]
    shard_size = max(batch_size, (shard_size + batch_size - 1) // batch_size * batch_size)
    n_shards = (len(items) + shard_size - 1) // shard_size
    block_meta = [
        {"name": b.name, "kind": b.kind, "layer": b.layer, "shape": list(b.shape), "dim": projector.out_dim(i, b.shape)}
        for i, b in enumerate(blocks)
    ]

    manifest: dict[str, Any] = {}
    repairs: list[dict[str, Any]] = []
    try:
        manifest = read_manifest(root)
    except CorruptIndexError as e:
        _repair(root, manifest, f"{MANIFEST} cannot be read ({getattr(e, 'reason', e)}); rebuilding every shard")
        repairs = manifest.pop("repairs", [])
        manifest = {}
    except FileNotFoundError:
        manifest = {}
    if manifest and (manifest.get("index_id") != iid or manifest.get("shard_size") != shard_size
                     or [(b["name"], b["dim"]) for b in manifest["blocks"]] != [(b["name"], b["dim"]) for b in block_meta]):
        # a different layout (another batch or shard size): started afresh, but shards that fail their check
        # are still named, since they may be what an earlier build left under this id
        for entry in manifest["shards"]:
            why = shard_problem(root, entry, manifest["blocks"])[0]
            if why and why != "the file is missing":
                _repair(root, manifest, f"{entry['file']} is corrupt ({why}); rebuilding it")
        repairs = manifest.get("repairs", []) if manifest.get("index_id") == iid else []
        manifest = {}
    if not manifest:
        manifest = {
            "format_version": FORMAT_VERSION,
            "index_id": iid,
            "identity": identity,
            "grad_spec": spec.to_dict(),
            "blocks": block_meta,
            "n_examples": len(items),
            "shard_size": shard_size,
            "shards": [],
            "complete": False,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if repairs:
            manifest["repairs"] = repairs
    shards: list[dict[str, Any] | None] = list(manifest["shards"])[:n_shards]
    shards += [None] * (n_shards - len(shards))
    computed = 0
    for k in range(n_shards):
        lo, hi = k * shard_size, min(len(items), (k + 1) * shard_size)
        entry = shards[k]
        if entry is not None:
            why = None if entry.get("start") == lo and entry["n"] == hi - lo else "its row range does not match"
            why = why or shard_problem(root, entry, block_meta)[0]
            if why is None:
                if progress:
                    progress(hi - lo)
                continue
            _repair(root, manifest, f"{entry['file']} is corrupt ({why}); rebuilding it")
            shards[k] = None
            manifest["shards"] = [s for s in shards if s is not None]
            manifest["complete"] = False
            _write_manifest(root, manifest)
        if stop_after_shards is not None and computed >= stop_after_shards:
            break
        # Batches are formed from length-sorted rows (less padding, same exact per-row
        # gradients); results are written back in index order.
        order = sorted(range(lo, hi), key=lambda r: (len(items[r].input_ids), r))
        # NaN until computed: a row no batch wrote can never pass the finiteness check below
        per_block = {b.name: torch.full((hi - lo, projector.out_dim(i, b.shape)), math.nan, dtype=storage)
                     for i, b in enumerate(blocks)}
        filled = torch.zeros(hi - lo, dtype=torch.bool)
        losses_all = [0.0] * (hi - lo)
        for s in range(0, len(order), batch_size):
            rows = order[s : s + batch_size]
            batch = collate([items[r] for r in rows], pad_token_id)
            grads, losses = per_example_grads(model, batch, "hooks", list(spec.modules) if spec.modules else None, return_losses=True)
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
            ids = [items[lo + r].id for r in sorted(bad_rows)]
            shown = ", ".join(map(str, ids[:8])) + (f" (+{len(ids) - 8})" if len(ids) > 8 else "")
            raise GradianUserError(
                f"the per-example gradients of {len(ids)} row(s) are not finite (NaN/inf, or beyond {GRAD_ABS_MAX:g}), "
                f"e.g. in {bad_blocks[0]}; "
                f"rows {shown}; the shard is not written",
                where=str(root),
                fix="check the base and adapter weights for NaN/inf and train in float32 (float16 overflows); "
                    "--storage-dtype float16 cannot hold gradients above 65504",
            )
        chunk = items[lo:hi]
        meta: dict[str, list[Any]] = {
            "id": [it.id for it in chunk],
            "loss": losses_all,
            "n_supervised": [it.n_supervised for it in chunk],
            "truncated": [bool(it.truncated) for it in chunk],
            "full_length": [int(it.full_length) for it in chunk],
        }
        data = save({name: v.contiguous() for name, v in per_block.items()})
        fname = f"shard-{k:05d}.safetensors"
        atomic_write_bytes(root / fname, data)
        shards[k] = {"file": fname, "sha256": sha256_bytes(data), "start": lo, "n": hi - lo, "examples": meta}
        manifest["shards"] = [s for s in shards if s is not None]
        _write_manifest(root, manifest)
        computed += 1
    manifest["shards"] = [s for s in shards if s is not None]
    manifest["complete"] = len(manifest["shards"]) == n_shards and all(s is not None for s in shards)
    _write_manifest(root, manifest)
    return GradientIndex(root)
