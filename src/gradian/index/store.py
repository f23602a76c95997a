"""The content-addressed gradient index: its id, and the opened index (its spec :class:`GradSpec` is torch-free,
in :mod:`gradian.index.spec`).

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

The index's parts live next to this module: the manifest, shard and record formats and their checks in
:mod:`gradian.index.shards`, the size estimate and advice in :mod:`gradian.index.size`, and the build
(:func:`gradian.index.build.build_index`) in :mod:`gradian.index.build`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import torch

from gradian.errors import GradianUserError
from gradian.gradients.lora import lora_blocks
from gradian.index.shards import CorruptShardError, ShardBlocks, open_shard, read_manifest, shard_problem
from gradian.index.spec import STORAGE_DTYPE_NAMES, GradSpec
from gradian.paths import cache_dir
from gradian.util import release_free_memory, sha256_json

STORAGE_DTYPES = {name: getattr(torch, name) for name in STORAGE_DTYPE_NAMES}


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
        return shard_problem(self.root, self.manifest["shards"][k], self.blocks)

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

    def load_shard(self, k: int, dtype: torch.dtype = torch.float64) -> ShardBlocks:
        """Shard k's blocks ``{block_name: (n_k, d_l)}``, checked before use (file, sha256, shapes); each
        block is read, checked finite and converted to ``dtype`` when it is asked for
        (:class:`~gradian.index.shards.ShardBlocks`: memory is one block, not the shard).

        Raises:
            CorruptShardError: the shard fails the check (a block's numbers: when that block is read).
        """
        s = self.manifest["shards"][k]
        why, handle = open_shard(self.root, s, self.blocks)
        if why:
            raise CorruptShardError(
                f"index shard {s['file']} is corrupt: {why}",
                where=str(self.root),
                fix="run `gradian index` (or `gradian attribute`) again: it rebuilds the shards that fail the check",
            )
        return ShardBlocks(self.root / s["file"], self.blocks, int(s["n"]), dtype, handle)

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
    ) -> Iterator[tuple[int, ShardBlocks]]:
        """Yields ``(start_row, {block: (n_k, d_l)})`` shard by shard, each a
        :class:`~gradian.index.shards.ShardBlocks` that reads a block when it is asked for; a yielded shard
        is released (empty) once the next one is asked for, so memory is the blocks the caller keeps.

        Args:
            local: only this rank's block of shards (:meth:`local_shards`); a collective caller
                then reduces or gathers what it computed (every shard in a single process).
        """
        starts = self._starts()
        ks = self.local_shards() if local else range(len(self.manifest["shards"]))
        for k in ks:
            shard = self.load_shard(k, dtype)
            try:
                yield starts[k], shard
            finally:
                shard.release()
                release_free_memory()  # the blocks read from it are gone: their pages go back (util docstring)


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
