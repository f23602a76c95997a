"""The row index and the sentence index of one checkpoint from ONE pass per row.

Why a sentence index cost about twice a row index per gradient (measured in docs/benchmarks.md): every
sentence unit was its own forward and backward pass over its prefix of the row, batched with units of
other rows (so the row's shared context was recomputed once per sentence), and its row was tokenised again
for each unit read (:class:`gradian.data.spans.SentenceItems` keeps one row; the build reads the units
length-sorted, so consecutive reads rarely share a row). On top of that the row index made one more pass
per row for a gradient that is a fixed weighted sum of the unit gradients.

Here each row is run once: one forward pass, one batched backward over its units' losses (plus the
residual tokens' loss when there are any), :func:`gradian.gradients.units.row_unit_grads`; the row gradient
is derived from the units (exact, see that module). Both indexes' shards and shard records are written
exactly as :func:`gradian.index.build.build_index` writes them (same layout, same ids), so the
``build_index`` calls that follow find every shard done and only publish the manifests. Only a fresh pair
is built this way (no shard of either index on disk) in a single process; anything else (a resumed build,
torchrun) takes the two separate builds, which give the same numbers to float rounding.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from gradian.data.tokenize import IGNORE_INDEX, TokenizedExample, collate
from gradian.errors import GradianUserError


def row_unit_batch(
    it: TokenizedExample, units: Sequence, pad_token_id: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One row as a batch of one, and its units' labels (K, T) on the row's tokens (-100 outside the unit).

    Args:
        it: the tokenised row; units: its :class:`~gradian.data.spans.SentenceUnit` s, in order.
    """
    from gradian.data.spans import unit_item

    batch = collate([it], pad_token_id)
    T = batch["input_ids"].shape[1]
    ul = torch.full((max(1, len(units)), T), IGNORE_INDEX, dtype=torch.long)
    if not units:  # no unit given: the whole row is its one unit
        ul[0] = batch["labels"][0]
    for k, u in enumerate(units):
        labs = unit_item(it, u).labels
        ul[k, : len(labs)] = torch.tensor(list(labs), dtype=torch.long)
    return batch, ul


def _untouched(root: Path) -> bool:
    """No manifest and no shard (or record) of an index at ``root``."""
    if not root.exists():
        return True
    return not any(root.glob("manifest.json")) and not any(root.glob("shard-*"))


def joint_roots(ft, data, grad, seed: int, parent, checkpoint) -> tuple[dict, dict, Path, Path]:
    """The row and sentence indexes' identities and roots, as :func:`gradian.finetune.training_index` has them.

    Returns:
        ``(row identity, sentence identity, row root, sentence root)``.
    """
    from dataclasses import replace

    from gradian.finetune import index_identity
    from gradian.index.store import default_index_root, index_id

    out = []
    for unit in ("row", "sentence"):
        ident = index_identity(ft, data, replace(grad, unit=unit), seed, checkpoint)
        root = Path(parent) / index_id(ident) if parent is not None else default_index_root(ident)
        out.append((ident, root))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def can_build_jointly(row_root: Path, sentence_root: Path) -> bool:
    """A fresh pair in one process: the only case the joint pass takes (module docstring)."""
    from gradian import distributed

    return not distributed.current().enabled and _untouched(row_root) and _untouched(sentence_root)


def build_jointly(
    model: torch.nn.Module,
    items: Sequence[TokenizedExample],
    units: Sequence,
    row_identity: dict[str, Any],
    sentence_identity: dict[str, Any],
    grad,
    *,
    pad_token_id: int,
    row_root: Path,
    sentence_root: Path,
    batch_size: int = 8,
    shard_size: int = 256,
    transform: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
    progress: Callable[[int], None] | None = None,
    announce: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Write every shard (and record) of the row index and the sentence index in one pass per row.

    The caller then calls :func:`gradian.index.build.build_index` for each (same identity, spec, batch and
    shard size), which finds the shards done and writes the manifest.

    Args:
        units: :func:`gradian.data.spans.sentence_units` of ``items`` (row order).
        grad: the run's :class:`~gradian.index.store.GradSpec` (its unit is ignored).
        transform: Adam preconditioning, applied to the row gradient (derived from the raw unit gradients)
            and to each unit gradient, before projection.
        progress: called with the rows just done.

    Returns:
        ``{"rows", "units", "passes", "tokens", "seconds"}``: backward vectors and forward tokens used.
    """
    from dataclasses import replace

    from safetensors.torch import save

    from gradian.gradients.projection import KroneckerProjector
    from gradian.gradients.units import row_unit_grads
    from gradian.index.shards import GRAD_ABS_MAX, _implausible, _layout, _record_file, _shard_file
    from gradian.index.store import STORAGE_DTYPES, index_id, select_blocks
    from gradian.util import atomic_write_bytes, atomic_write_json, release_free_memory, sha256_bytes

    t0 = time.perf_counter()
    blocks = select_blocks(model, replace(grad, unit="row"))
    projector = KroneckerProjector([b.shape for b in blocks], [b.kind for b in blocks], grad.projection)
    storage = STORAGE_DTYPES[grad.storage_dtype]
    shard_size = max(batch_size, (shard_size + batch_size - 1) // batch_size * batch_size)  # as build_index
    block_meta = [
        {"name": b.name, "kind": b.kind, "layer": b.layer, "shape": list(b.shape), "dim": projector.out_dim(i, b.shape)}
        for i, b in enumerate(blocks)
    ]
    dims = [int(m["dim"]) for m in block_meta]
    targets = {
        "row": (row_root, _layout(index_id(row_identity), shard_size, block_meta), len(items)),
        "sentence": (sentence_root, _layout(index_id(sentence_identity), shard_size, block_meta), len(units)),
    }
    for root, _, _ in targets.values():
        root.mkdir(parents=True, exist_ok=True)
    if announce is not None:
        announce(
            f"indexes {targets['row'][1]['index_id']} (rows) + {targets['sentence'][1]['index_id']} (sentence units): "
            f"{len(items):,} rows and {len(units):,} units in one pass per row (the row gradient is derived from "
            "its units)"
        )

    class Buffer:
        def __init__(self, kind: str):
            self.kind, self.k = kind, 0
            self.root, self.layout, self.total = targets[kind]
            self._new()

        def _new(self) -> None:
            self.lo = self.k * shard_size
            self.hi = min(self.total, self.lo + shard_size)
            self.blocks = [torch.full((self.hi - self.lo, d), math.nan, dtype=storage) for d in dims]
            self.meta: list[dict[str, Any]] = []

        def put(self, vecs: list[torch.Tensor], meta: dict[str, Any]) -> None:
            r = self.lo + len(self.meta)
            for b, v in zip(self.blocks, vecs):
                b[r - self.lo] = v.to(storage)
            self.meta.append(meta)
            if self.lo + len(self.meta) == self.hi:
                self.flush()

        def flush(self) -> None:
            bad = set()
            for v in self.blocks:
                nf = _implausible(v)
                if bool(nf.any()):
                    bad.update(int(r) for r in nf.nonzero()[:, 0].tolist())
            if bad:
                ids = [self.meta[r]["id"] for r in sorted(bad)]
                raise GradianUserError(
                    f"the per-example gradients of {len(ids)} {self.kind} gradient(s) are not finite (NaN/inf, or "
                    f"beyond {GRAD_ABS_MAX:g}), e.g. {', '.join(map(str, ids[:8]))}; the shard is not written",
                    where=str(self.root),
                    fix="check the base and adapter weights for NaN/inf and train in float32 (float16 overflows); "
                    "--storage-dtype float16 cannot hold gradients above 65504 (use bfloat16)",
                )
            meta = {
                key: [m[key] for m in self.meta] for key in ("id", "loss", "n_supervised", "truncated", "full_length")
            }
            data = save({b.name: v.contiguous() for b, v in zip(blocks, self.blocks)})
            fname = _shard_file(self.k)
            entry = {
                "file": fname,
                "sha256": sha256_bytes(data),
                "start": self.lo,
                "n": self.hi - self.lo,
                "examples": meta,
            }
            atomic_write_bytes(self.root / fname, data)
            atomic_write_json(self.root / _record_file(self.k), {"layout": self.layout, "entry": entry})
            del data
            release_free_memory()
            self.k += 1
            if self.lo + shard_size < self.total:
                self._new()

    rows_buf, units_buf = Buffer("row"), Buffer("sentence")
    by_row: list[list[int]] = [[] for _ in range(len(items))]
    for k, u in enumerate(units):
        by_row[u.row].append(k)
    passes = tokens = 0
    for j in range(len(items)):
        it = items[j]
        us = [units[k] for k in by_row[j]]
        if not us:
            raise ValueError(f"row {j} has no sentence unit (sentence_units gives every row one)")
        batch, ul = row_unit_batch(it, us, pad_token_id)
        res = row_unit_grads(model, batch, ul, blocks)
        passes += res.passes
        tokens += int(batch["input_ids"].shape[1])
        row_vecs, unit_vecs = [], []
        for i, b in enumerate(blocks):
            g_row = res.row[b.name].unsqueeze(0)  # (1, o, i) float64
            g_units = res.units[b.name].detach().to(torch.float64)  # (K, o, i)
            if transform is not None:
                g_row, g_units = transform(b.name, g_row), transform(b.name, g_units)
            row_vecs.append(projector(i, g_row)[0].cpu())
            unit_vecs.append(projector(i, g_units).cpu())
        rows_buf.put(
            row_vecs,
            {
                "id": it.id,
                "loss": float(res.row_loss),
                "n_supervised": it.n_supervised,
                "truncated": bool(it.truncated),
                "full_length": int(it.full_length),
            },
        )
        for k, u in enumerate(us):
            units_buf.put(
                [v[k] for v in unit_vecs],
                {
                    "id": it.id + u.suffix(),
                    "loss": float(res.unit_losses[k]),
                    "n_supervised": int((ul[k] != IGNORE_INDEX).sum()),
                    "truncated": bool(it.truncated),
                    "full_length": int(it.full_length),
                },
            )
        if progress:
            progress(1)
    return {
        "rows": len(items),
        "units": len(units),
        "passes": passes,
        "tokens": tokens,
        "seconds": time.perf_counter() - t0,
    }


def maybe_build_jointly(
    ft,
    data,
    items: Sequence[TokenizedExample],
    units: Sequence,
    grad,
    *,
    seed: int = 0,
    parent=None,
    checkpoint=None,
    batch_size: int = 8,
    shard_size: int = 256,
    progress_factory: Callable[[int], Callable[[int], None]] | None = None,
    announce: Callable[[str], None] | None = None,
) -> dict[str, float] | None:
    """Build a checkpoint's row and sentence shards in one pass when both indexes are fresh (else None).

    ``ft``'s model holds ``checkpoint``'s weights. The two :func:`gradian.finetune.training_index` calls that follow
    publish the manifests (and would build anything missing, the usual way).
    """
    row_ident, sent_ident, row_root, sent_root = joint_roots(ft, data, grad, seed, parent, checkpoint)
    if not can_build_jointly(row_root, sent_root):
        return None
    transform = None
    if grad.optimizer == "adam":
        from gradian.finetune import _optimizer_file
        from gradian.gradients.adam import read_adam_state

        states = read_adam_state(_optimizer_file(ft, checkpoint), ft.model)
        transform = lambda name, g: states[name].update(g)  # noqa: E731
    progress = progress_factory(len(items)) if progress_factory is not None else None
    return build_jointly(
        ft.model,
        items,
        units,
        row_ident,
        sent_ident,
        grad,
        pad_token_id=ft.tokenizer.pad_token_id,
        row_root=row_root,
        sentence_root=sent_root,
        batch_size=batch_size,
        shard_size=shard_size,
        transform=transform,
        progress=progress,
        announce=announce,
    )
