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
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from gradian.data.tokenize import TokenizedExample, TokenizeSpec, collate
from gradian.gradients.lora import lora_blocks
from gradian.gradients.per_example import per_example_grads
from gradian.gradients.projection import KroneckerProjector, ProjectionSpec
from gradian.paths import cache_dir
from gradian.util import atomic_write_bytes, atomic_write_json, sha256_bytes, sha256_file, sha256_json

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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["modules"] = list(self.modules) if self.modules else None
        return d


class CorruptShardError(RuntimeError):
    """A shard's bytes do not match the sha256 recorded in the manifest."""


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
        mpath = self.root / MANIFEST
        if not mpath.exists():
            raise FileNotFoundError(f"no index at {self.root}")
        self.manifest = json.loads(mpath.read_text())

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

    def verify(self) -> list[int]:
        """Indices of shards whose file is missing or whose sha256 does not match."""
        bad = []
        for k, s in enumerate(self.manifest["shards"]):
            p = self.root / s["file"]
            if not p.exists() or sha256_file(p) != s["sha256"]:
                bad.append(k)
        return bad

    def load_shard(self, k: int, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
        """Shard k's block tensors ``{block_name: (n_k, d_l)}``, checked against its sha256."""
        from safetensors.torch import load

        s = self.manifest["shards"][k]
        data = (self.root / s["file"]).read_bytes()
        if sha256_bytes(data) != s["sha256"]:
            raise CorruptShardError(f"{self.root / s['file']}: sha256 mismatch (expected {s['sha256'][:12]}…)")
        tensors = load(data)
        return {b["name"]: tensors[b["name"]].to(dtype) for b in self.blocks}

    def iter_shards(self, dtype: torch.dtype = torch.float64) -> Iterator[tuple[int, dict[str, torch.Tensor]]]:
        """Yields ``(start_row, {block: (n_k, d_l)})`` shard by shard: memory is one shard."""
        start = 0
        for k, s in enumerate(self.manifest["shards"]):
            yield start, self.load_shard(k, dtype)
            start += s["n"]


def _write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    atomic_write_json(root / MANIFEST, manifest)


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

    iid = index_id(identity)
    root = Path(root) if root is not None else default_index_root(identity)
    root.mkdir(parents=True, exist_ok=True)
    blocks = lora_blocks(model, list(spec.modules) if spec.modules else None)
    projector = KroneckerProjector([b.shape for b in blocks], [b.kind for b in blocks], spec.projection)
    storage = STORAGE_DTYPES[spec.storage_dtype]
    shard_size = max(batch_size, (shard_size + batch_size - 1) // batch_size * batch_size)
    n_shards = (len(items) + shard_size - 1) // shard_size

    manifest: dict[str, Any]
    mpath = root / MANIFEST
    if mpath.exists():
        manifest = json.loads(mpath.read_text())
        if manifest.get("index_id") != iid or manifest.get("shard_size") != shard_size:
            manifest = {}
    else:
        manifest = {}
    if not manifest:
        manifest = {
            "format_version": FORMAT_VERSION,
            "index_id": iid,
            "identity": identity,
            "grad_spec": spec.to_dict(),
            "blocks": [
                {"name": b.name, "kind": b.kind, "layer": b.layer, "shape": list(b.shape), "dim": projector.out_dim(i, b.shape)}
                for i, b in enumerate(blocks)
            ],
            "n_examples": len(items),
            "shard_size": shard_size,
            "shards": [],
            "complete": False,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    shards: list[dict[str, Any] | None] = list(manifest["shards"]) + [None] * (n_shards - len(manifest["shards"]))
    computed = 0
    for k in range(n_shards):
        lo, hi = k * shard_size, min(len(items), (k + 1) * shard_size)
        entry = shards[k]
        if entry is not None:
            p = root / entry["file"]
            if p.exists() and sha256_file(p) == entry["sha256"]:
                if progress:
                    progress(hi - lo)
                continue
        if stop_after_shards is not None and computed >= stop_after_shards:
            break
        # Batches are formed from length-sorted rows (less padding, same exact per-row
        # gradients); results are written back in index order.
        order = sorted(range(lo, hi), key=lambda r: (len(items[r].input_ids), r))
        per_block = {b.name: torch.empty((hi - lo, projector.out_dim(i, b.shape)), dtype=storage) for i, b in enumerate(blocks)}
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
            if progress:
                progress(len(rows))
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
