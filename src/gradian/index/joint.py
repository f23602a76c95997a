"""The row index and the sentence index of one checkpoint from ONE pass per row.

Why a sentence index cost about twice a row index per gradient (measured in docs/benchmarks.md): every
sentence unit was its own forward and backward pass over its prefix of the row, batched with units of
other rows (so the row's shared context was recomputed once per sentence), and its row was tokenised again
for each unit read (:class:`gradian.data.spans.SentenceItems` keeps one row; the build reads the units
length-sorted, so consecutive reads rarely share a row). On top of that the row index made one more pass
per row for a gradient that is a fixed weighted sum of the unit gradients.

Here each row is run once: one forward pass, then one backward vector per unit's loss over that one graph
(plus the residual tokens' loss when there are any; a row with one unit is the whole row and needs one),
:func:`gradian.gradients.units.row_unit_grads`; the row gradient is derived from the units (exact, see that
module). Both indexes' shards and shard records are written
exactly as :func:`gradian.index.build.build_index` writes them (same layout, same ids), so the
``build_index`` calls that follow find every shard done and only publish the manifests.

This is the default whenever a checkpoint's row and sentence indexes are both built (``--one-pass``; the
separate builds are ``--separate``), in one process, under torchrun and when resuming: only the missing
shards are computed, split between the ranks (:func:`build_jointly`). A row is computed alone (by default), or
in a batch with the same other rows every time (:func:`row_groups`), so the bytes do not depend on the number
of processes. The index ids are those of the separate builds: the numbers agree with theirs to float
rounding (about 1e-7 relative in float32), not to the bit, and each shard entry says which path wrote it
(``"pass"``, :data:`JOINT_PASS`, with the rows per forward when more than one); docs/how-it-works.md says
why one identity is kept.

With ``--unit-grads positions`` (``GradSpec.unit_grads``) each row takes one backward: its row gradient is direct,
and its units' gradients are that gradient split by position (:mod:`gradian.gradients.units`; an approximation, a
sentence index id of its own, shard entries :data:`SPLIT_PASS`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from gradian.data.tokenize import IGNORE_INDEX, TokenizedExample, collate, row_values

#: the ``pass`` field of every shard entry this module writes (kept in the manifest: which path computed it)
JOINT_PASS = "one pass per row (sentence units; row derived)"
#: the same with ``--unit-grads positions``: one backward per row, its gradient split by position into the units
SPLIT_PASS = "one pass per row (row gradient; sentence units split by position)"
NOUNS = {"row": "row", "sentence": "sentence unit"}  # what one row of each index is, for messages


def row_unit_batch(
    it: TokenizedExample, units: Sequence, pad_token_id: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One row as a batch of one, and its units' labels (K, T) on the row's tokens (-100 outside the unit).

    Args:
        it: the tokenised row; units: its :class:`~gradian.data.spans.SentenceUnit` s, in order.
    """
    batch, (ul,) = rows_unit_batch([it], [units], pad_token_id)
    return batch, ul


def rows_unit_batch(
    items: Sequence[TokenizedExample], units: Sequence[Sequence], pad_token_id: int
) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """The rows as one right-padded batch (b, T), and per row its units' labels (K_b, T) on the batch's T tokens
    (-100 outside the unit and on padding): the input of :func:`gradian.gradients.units.rows_unit_grads`.

    Args:
        items: the tokenised rows; units: per row its :class:`~gradian.data.spans.SentenceUnit` s, in order (an
            empty list: the whole row is its one unit).
    """
    from gradian.data.spans import unit_item

    batch = collate(list(items), pad_token_id)
    T = batch["input_ids"].shape[1]
    uls = []
    for b, (it, us) in enumerate(zip(items, units)):
        ul = torch.full((max(1, len(us)), T), IGNORE_INDEX, dtype=torch.long)
        if not us:  # no unit given: the whole row is its one unit
            ul[0] = batch["labels"][b]
        for k, u in enumerate(us):
            labs = unit_item(it, u).labels
            ul[k, : len(labs)] = torch.tensor(list(labs), dtype=torch.long)
        uls.append(ul)
    return batch, uls


def _complete(root: Path, iid: str) -> bool:
    """A published, complete manifest of index ``iid`` at ``root`` (the publish step then reuses it)."""
    from gradian.index.shards import read_manifest

    try:
        m = read_manifest(root)
    except Exception:  # missing or corrupt: build_index repairs it; here it only means "not complete"
        return False
    return bool(m.get("complete")) and m.get("index_id") == iid


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


def shard_rows(n_rows: int, unit_rows: Sequence[int], shard_size: int) -> dict[str, list[tuple[int, int]]]:
    """Per index, each shard's rows ``[lo, hi)`` of the training set (which rows a shard needs computed).

    Args:
        unit_rows: the row of each sentence unit, in unit order (non-decreasing).
        shard_size: rows (or units) per shard, already rounded as :func:`gradian.index.build.build_index` does.
    """
    rows = [(lo, min(n_rows, lo + shard_size)) for lo in range(0, n_rows, shard_size)]
    sent = []
    for lo in range(0, len(unit_rows), shard_size):
        hi = min(len(unit_rows), lo + shard_size)
        sent.append((int(unit_rows[lo]), int(unit_rows[hi - 1]) + 1))
    return {"row": rows, "sentence": sent}


def row_groups(need: Sequence[int], lengths: Sequence[int], shard_size: int, per_forward: int) -> list[list[int]]:
    """The batches of rows the one-pass build runs, covering every row of ``need``.

    One row per forward: each row of ``need`` alone, in order. More: the rows of each row-shard block
    ``[k·S, (k+1)·S)`` (S = ``shard_size``) sorted by length, cut into groups of ``per_forward``, and every group
    holding a needed row. The groups depend only on the lengths, S and ``per_forward``, never on which shards are
    missing or on the number of processes, so a resumed build and any number of ranks batch a row with the same
    rows and write the same bytes (a group's extra rows are computed and dropped: at most ``per_forward − 1`` a
    block edge).
    """
    if per_forward <= 1:
        return [[j] for j in need]
    wanted = set(need)
    n = len(lengths)
    out = []
    for lo in range(0, n, shard_size):
        block = sorted(range(lo, min(n, lo + shard_size)), key=lambda j: (int(lengths[j]), j))
        for s in range(0, len(block), per_forward):
            g = block[s : s + per_forward]
            if wanted.intersection(g):
                out.append(g)
    return out


def assign_jobs(jobs: Sequence[tuple[str, int, int, int]], lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Split the pending shards ``(kind, k, row lo, row hi)`` between ranks: consecutive in row order,
    balanced by the tokens of the rows they need (:func:`gradian.distributed.contiguous_blocks`).

    A shard is computed whole by one rank. Rows that shards of two ranks both need (at most one shard's
    rows per rank boundary) are computed by both; a row's numbers do not depend on who computes it.
    """
    from gradian import distributed

    order = sorted(range(len(jobs)), key=lambda j: (jobs[j][2], jobs[j][0], jobs[j][1]))
    costs = [max(1, sum(lengths[jobs[j][2] : jobs[j][3]])) for j in order]
    return [[order[j] for j in blk] for blk in distributed.contiguous_blocks(costs, world_size)]


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
    progress_factory: Callable[[int], Callable[[int], None]] | None = None,
    announce: Callable[[str], None] | None = None,
    per_forward: int = 1,
    states: dict[int, torch.Tensor] | None = None,
) -> dict[str, float]:
    """Write every missing shard (and record) of the row index and the sentence index in one pass per row.

    The caller then calls :func:`gradian.index.build.build_index` for each (same identity, spec, batch and
    shard size), which finds the shards done and writes the manifest. Collective under torchrun: rank 0
    reads which shards are done (their records), the missing ones are split between the ranks
    (:func:`assign_jobs`), each rank computes the rows its shards need and writes those shards. A shard's
    bytes depend only on its rows' numbers, and a row is computed alone (a batch of one) or with the rows
    :func:`row_groups` gives it whichever shards are missing, so one process, any number of ranks
    and a resumed build write the same bytes.

    Args:
        units: :func:`gradian.data.spans.sentence_units` of ``items`` (row order).
        grad: the run's :class:`~gradian.index.store.GradSpec` (its unit is ignored).
        transform: Adam preconditioning, applied to the row gradient (derived from the raw unit gradients)
            and to each unit gradient, before projection.
        progress_factory: called once with the number of rows this rank computes; returns the callback
            called with the rows just done.
        per_forward: rows per forward pass (:func:`row_groups`; ``--rows-per-forward``). One by default: on a
            CPU batching rows is no faster (``benchmarks/bench_joint_batch.py``, 2 cores, grouped as here: 0.92–1.25×
            the one-row time at 4 rows, 1.19–1.41× at 8; the backward passes are compute-bound and padding adds
            work), and each backward holds the b rows' ``G`` of every block at once. On an accelerator, whose
            passes at these sizes are launch-bound, b rows should cost about one (the backward passes drop from
            ``Σ_b K'_b`` to ``max_b K'_b`` a batch); not yet measured there.
        states: when given (the final adapter's build), filled with RepSim's state of every row computed here (row
            -> (d,) float64, :attr:`gradian.gradients.units.RowUnitGrads.state`), pooled from the row's own forward,
            so that :func:`gradian.engines.repsim.cached_train_states` need not forward it again. Only where that is
            the bits RepSim's own one-row forward gives (tested on a CPU): one process, one row a forward, a CPU
            model; elsewhere it stays empty.

    Returns:
        ``{"rows", "units", "passes", "tokens", "seconds"}`` of this rank: rows and units computed, backward
        vectors and forward tokens used.
    """
    from dataclasses import replace

    from gradian import distributed
    from gradian.gradients.units import rows_unit_grads
    from gradian.index.build import _check_shared_folder, _clean_stale_temp, block_projection, check_build_args
    from gradian.index.shards import ShardStream, _layout, _read_record, shard_problem
    from gradian.index.size import effective_shard_size, size_estimate
    from gradian.index.store import index_id, select_blocks
    from gradian.util import DiskFullError, free_bytes, release_free_memory

    check_build_args(batch_size, shard_size, per_forward)
    dist = distributed.current()
    t0 = time.perf_counter()
    blocks = select_blocks(model, replace(grad, unit="row"))
    projector, storage, block_meta = block_projection(blocks, grad)
    dims = [int(m["dim"]) for m in block_meta]
    shard_size = effective_shard_size(shard_size, batch_size, sum(dims) * storage.itemsize)  # as build_index
    ids = {"row": index_id(row_identity), "sentence": index_id(sentence_identity)}
    roots = {"row": Path(row_root), "sentence": Path(sentence_root)}
    layouts = {kind: _layout(ids[kind], shard_size, block_meta) for kind in ids}
    totals = {"row": len(items), "sentence": len(units)}
    if dist.enabled:  # ranks that disagree would write different indexes (as build_index refuses)
        distributed.check_same_inputs(
            {
                "the index ids (base, adapter, data, gradient flags)": (ids["row"], ids["sentence"]),
                "the number of rows and sentence units": (len(items), len(units)),
                "the batch size": batch_size,
                "the shard size": shard_size,
                "the rows per forward": per_forward,
            }
        )
    for root in roots.values():
        root.mkdir(parents=True, exist_ok=True)
        if dist.is_main:
            _clean_stale_temp(root)
        if dist.enabled:
            _check_shared_folder(root)
    ranges = shard_rows(len(items), [u.row for u in units], shard_size)

    def _unit_ranges(ks: Sequence[int], total: int) -> list[tuple[int, int]]:
        return [(k * shard_size, min(total, (k + 1) * shard_size)) for k in ks]

    # -- the plan (rank 0 reads the shard records; every rank plans from its answer)
    pending: dict[str, list[int]] | None = None
    if dist.is_main:
        pending = {}
        for kind in ("row", "sentence"):
            todo = []
            for k in range(len(ranges[kind])):
                lo = k * shard_size
                hi = min(totals[kind], lo + shard_size)
                rec = _read_record(roots[kind], k, layouts[kind])
                ok = rec is not None and rec.get("start") == lo and rec.get("n") == hi - lo
                if not (ok and shard_problem(roots[kind], rec, block_meta) is None):
                    todo.append(k)
            pending[kind] = todo
    pending = distributed.broadcast_object(pending)
    assert pending is not None
    jobs = [(kind, k, *ranges[kind][k]) for kind in ("row", "sentence") for k in pending[kind]]
    n_all = sum(len(r) for r in ranges.values())
    if not jobs:
        return {"rows": 0, "units": 0, "passes": 0, "tokens": 0, "seconds": time.perf_counter() - t0}
    # the shards still to write must fit in the free space (rank 0 decides, every rank raises alike)
    row_bytes = size_estimate(1, sum(dims), grad.storage_dtype)[0]
    need_bytes = sum(hi - lo for kind in pending for lo, hi in _unit_ranges(pending[kind], totals[kind])) * row_bytes
    free = free_bytes(roots["sentence"]) if dist.is_main else None
    free = distributed.all_gather_objects(free)[0] if dist.enabled else free
    if free is not None and need_bytes > free:
        err = DiskFullError(
            roots["sentence"],
            need_bytes,
            f"the {len(jobs)} remaining shard(s) of the row and sentence indexes (estimated before the build)",
            tail="no shard was written",
            fix="store fewer numbers per row (--project-dim, --storage-dtype bfloat16), free space there, or build "
            "the indexes on another disk (--index-dir / --out)",
            free=free,
        )
        err.every_rank = True
        raise err
    lengths = row_values(items, "length")
    mine = [jobs[j] for j in assign_jobs(jobs, lengths, dist.world_size)[dist.rank]]
    need = sorted({r for _, _, lo, hi in mine for r in range(lo, hi)})
    if announce is not None and dist.is_main:
        done = n_all - len(jobs)
        extra = f"; {done} of {n_all} shards already built" if done else ""
        split = f"; {len(jobs)} shards over {dist.world_size} processes" if dist.enabled else ""
        how = (
            "the row gradient is derived from its units"
            if grad.unit_grads == "exact"
            else "one backward a row; the units' gradients are the row's split by position"
        )
        announce(
            f"indexes {ids['row']} (rows) + {ids['sentence']} (sentence units): "
            f"{len(items):,} rows and {len(units):,} units in one pass per row ({how}){extra}{split}"
        )
    progress = progress_factory(len(need)) if progress_factory is not None else None
    written_by = JOINT_PASS if grad.unit_grads == "exact" else SPLIT_PASS
    if per_forward > 1:
        written_by = f"{written_by}, {per_forward} rows a forward"

    class Buffer:
        """One shard being filled, streamed to its file row by row (:class:`ShardStream`: the build holds no shard
        in memory); committed with its record when its last row arrives.
        """

        def __init__(self, kind: str, k: int):
            self.kind, self.k = kind, k
            self.lo = k * shard_size
            self.hi = min(totals[kind], self.lo + shard_size)
            self.stream = ShardStream(roots[kind], k, [b.name for b in blocks], dims, self.hi - self.lo, storage)
            self.meta: list[dict[str, Any] | None] = [None] * (self.hi - self.lo)

        def put(self, r: int, vecs: list[torch.Tensor], meta: dict[str, Any]) -> bool:
            self.meta[r - self.lo] = meta
            return self.stream.put(r - self.lo, vecs)

        def flush(self) -> None:
            rows: list[dict[str, Any]] = self.meta  # type: ignore[assignment]  # full: its last row arrived
            self.stream.finish(self.lo, rows, layouts[self.kind], NOUNS[self.kind], written_by=written_by)

    mine_keys = {(kind, k) for kind, k, _, _ in mine}
    open_: dict[tuple[str, int], Buffer] = {}
    unit_lo: list[int] = [0] * (len(items) + 1)  # units of row j: [unit_lo[j], unit_lo[j + 1])
    for u in units:
        unit_lo[u.row + 1] += 1
    for j in range(len(items)):
        unit_lo[j + 1] += unit_lo[j]
    passes = tokens = written = 0

    def put(kind: str, r: int, vecs: list[torch.Tensor], meta: dict[str, Any]) -> None:
        nonlocal written
        key = (kind, r // shard_size)
        if key not in mine_keys:
            return
        if key not in open_:
            open_[key] = Buffer(kind, key[1])
        if open_[key].put(r, vecs, meta):
            open_.pop(key).flush()
            release_free_memory()
            written += 1
            distributed.fault_point("shard", written)

    def store(j: int, ks: list[int], us: list, ul: torch.Tensor, res) -> None:
        it = items[j]
        row_vecs, unit_vecs = [], []
        for i, b in enumerate(blocks):
            # popped: each block's raw gradients are freed once their stored forms exist
            g_row = res.row.pop(b.name).unsqueeze(0)  # (1, o, i) float64
            # (K, o, i) in the model's accumulation dtype: float64 only for the optimizer's transform; a float32
            # unit cast or projected as it is gives the bytes its float64 copy gave, without the copy
            g_units = res.units.pop(b.name).detach()
            if transform is not None:
                g_row, g_units = transform(b.name, g_row), transform(b.name, g_units.to(torch.float64))
            # cast to the storage dtype at once (the bytes Buffer.put stores): a float64 copy of every unit's
            # gradient would otherwise be alive until the row is put (K × Σ d_l × 8 bytes: 0.5 GB for an exact row
            # of 12 units of SmolLM2-135M, all linear, r=16)
            row_vecs.append(projector.stored(i, g_row, grad.storage_dtype)[0].cpu())
            unit_vecs.append(projector.stored(i, g_units, grad.storage_dtype).cpu())
        common = {"truncated": bool(it.truncated), "full_length": int(it.full_length)}
        row_meta = {"id": it.id, "loss": float(res.row_loss), "n_supervised": it.n_supervised, **common}
        put("row", j, row_vecs, row_meta)
        for q, (k, u) in enumerate(zip(ks, us)):
            meta = {
                "id": it.id + u.suffix(),
                "loss": float(res.unit_losses[q]),
                "n_supervised": int((ul[q] != IGNORE_INDEX).sum()),
                **common,
            }
            put("sentence", k, [v[q] for v in unit_vecs], meta)

    needed = set(need)
    pool = states is not None and per_forward == 1 and not dist.enabled and blocks[0].module.weight.device.type == "cpu"
    try:
        for group in row_groups(need, lengths, shard_size, per_forward):
            per_row = []
            for j in group:
                ks = list(range(unit_lo[j], unit_lo[j + 1]))
                if not ks:
                    raise ValueError(f"row {j} has no sentence unit (sentence_units gives every row one)")
                per_row.append((ks, [units[k] for k in ks]))
            batch, uls = rows_unit_batch([items[j] for j in group], [us for _, us in per_row], pad_token_id)
            results = rows_unit_grads(model, batch, uls, blocks, grad.unit_grads, states=pool)
            for j, (ks, us), ul, res in zip(group, per_row, uls, results):
                passes += res.passes
                tokens += len(items[j].input_ids)
                if pool:
                    states[j] = res.state  # type: ignore[index]
                store(j, ks, us, ul, res)
            del results
            if progress:
                progress(sum(1 for j in group if j in needed))
    except BaseException:  # no half-streamed shard is left behind (its temp file is removed)
        for buf in open_.values():
            buf.stream.abort()
        raise
    if open_:  # cannot happen: every row a shard of this rank needs was computed
        raise RuntimeError(f"shards left unfilled: {sorted(open_)}")
    distributed.barrier()  # every rank's shards are on disk before build_index checks them
    return {
        "rows": len(need),
        "units": sum(unit_lo[j + 1] - unit_lo[j] for j in need),
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
    per_forward: int = 1,
    states: dict[int, torch.Tensor] | None = None,
) -> dict[str, float] | None:
    """Build a checkpoint's missing row and sentence shards in one pass per row (None: both already complete).

    Collective under torchrun (every rank calls it alike). ``ft``'s model holds ``checkpoint``'s weights. The two
    :func:`gradian.finetune.training_index` calls that follow publish the manifests (their shards are done).
    ``states``: :func:`build_jointly`'s (RepSim's row states, pooled on the way).
    """
    from gradian import distributed

    row_ident, sent_ident, row_root, sent_root = joint_roots(ft, data, grad, seed, parent, checkpoint)
    from gradian.index.store import index_id

    done = _complete(row_root, index_id(row_ident)) and _complete(sent_root, index_id(sent_ident))
    if distributed.broadcast_object(done):
        return None
    transform = None
    if grad.optimizer == "adam":
        from gradian.finetune import adam_transform

        transform = adam_transform(ft, checkpoint)
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
        progress_factory=progress_factory,
        announce=announce,
        per_forward=per_forward,
        states=states,
    )
