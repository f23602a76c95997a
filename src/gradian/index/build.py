"""Building the gradient index: per-example training gradients, computed and written shard by shard.

Shard k always holds rows ``[k·S, (k+1)·S)`` (``S`` = the shard size), whoever computes it, so
the index id and every shard's bytes are the same for one process and for a torchrun job of any
size (:mod:`gradian.distributed`): each rank computes whole shards and writes each with its own
record; rank 0 writes the manifest after a barrier. Writes are atomic (temp file, fsync, rename).
Every shard's sha256 is in its record and in the manifest and is checked on load; a corrupt or
missing shard is reported and rebuilt by :func:`build_index`, never silently used. An interrupted
build (a killed process, a dead rank) resumes from the shard records, with any number of
processes, and yields identical scores. A shard is streamed to its file row by row
(:class:`gradian.index.shards.ShardStream`), so peak memory holds one batch's gradients, not a shard.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from gradian.data.tokenize import TokenizedExample, collate, row_values
from gradian.errors import GradianUserError
from gradian.gradients.per_example import per_example_grads
from gradian.gradients.projection import KroneckerProjector, projection_dtype
from gradian.index.shards import (
    FORMAT_VERSION,
    MANIFEST,
    CorruptIndexError,
    ShardStream,
    _layout,
    _read_record,
    _repair,
    _shard_file,
    _write_manifest,
    read_manifest,
    shard_problem,
)
from gradian.index.size import IndexSizeWarning, effective_shard_size, index_unit_name, size_advice, size_estimate
from gradian.index.store import STORAGE_DTYPES, GradientIndex, GradSpec, default_index_root, index_id, select_blocks
from gradian.util import DiskFullError, free_bytes, release_free_memory


def check_build_args(batch_size: Any, shard_size: Any = 256, rows_per_forward: Any = 1) -> None:
    """``batch_size``, ``shard_size`` and ``rows_per_forward`` must be whole numbers >= 1 (a batch size below 1
    would leave rows uncomputed).
    """
    from gradian.validate import check_int

    check_int(
        batch_size, "build_index", "batch_size", flag="--batch-size", lo=1, hi=1_000_000, fix="use e.g. --batch-size 8"
    )
    check_int(shard_size, "build_index", "shard_size", lo=1, hi=100_000_000, fix="use e.g. 256")
    check_int(
        rows_per_forward,
        "build_index",
        "rows_per_forward",
        flag="--rows-per-forward",
        lo=1,
        hi=1_000_000,
        fix="use 1 on a CPU, e.g. 8 on a GPU",
    )


def check_unit_grads(spec: Any, one_pass: bool) -> None:
    """A sentence index of unit gradients split by position (``--unit-grads positions``) is made by the one-pass
    row + sentence build only (:mod:`gradian.index.joint`): one error line before anything is loaded.
    """
    if spec.unit_grads != "exact" and not one_pass:
        raise GradianUserError(
            f"--unit-grads {spec.unit_grads} splits each row's gradient in the one-pass build; --separate builds each "
            "unit's exact gradient on its own",
            where="--unit-grads / --separate",
            fix="drop --separate, or use --unit-grads exact",
        )


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


def block_projection(blocks: Sequence, spec: GradSpec) -> tuple[KroneckerProjector, torch.dtype, list[dict[str, Any]]]:
    """What a build of ``spec`` stores its blocks with: the projector (its matrices kept in the precision it projects
    in, :func:`gradian.gradients.projection.projection_dtype`), the storage dtype, and each block's manifest entry
    (``name``, ``kind``, ``layer``, ``shape``, and ``dim``, the numbers it stores).
    """
    shapes, kinds = [b.shape for b in blocks], [b.kind for b in blocks]
    projector = KroneckerProjector(shapes, kinds, spec.projection, keep=projection_dtype(spec.storage_dtype))
    block_meta = [
        {"name": b.name, "kind": b.kind, "layer": b.layer, "shape": list(b.shape), "dim": projector.out_dim(i, b.shape)}
        for i, b in enumerate(blocks)
    ]
    return projector, STORAGE_DTYPES[spec.storage_dtype], block_meta


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

    Peak memory holds one batch's gradients (shards are streamed to disk), whatever the dataset size. Collective under
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
    projector, storage, block_meta = block_projection(blocks, spec)
    row_bytes = sum(int(m["dim"]) for m in block_meta) * storage.itemsize
    shard_size = effective_shard_size(shard_size, batch_size, row_bytes)
    n_shards = (len(items) + shard_size - 1) // shard_size
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
            why = shard_problem(root, entry, manifest["blocks"])
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
            why = why or shard_problem(root, entry, block_meta)
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
    if pending and spec.unit == "sentence":  # computed here, a unit's gradient is its own: exact only
        check_unit_grads(spec, one_pass=False)
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
        # streamed to the shard's file row by row (no shard held in memory); a row never put leaves it unfinished
        try:
            stream = ShardStream(
                root,
                k,
                [b.name for b in blocks],
                [projector.out_dim(i, b.shape) for i, b in enumerate(blocks)],
                hi - lo,
                storage,
            )
            row_meta: list[dict[str, Any]] = [{}] * (hi - lo)  # each row is read once (a TokenizedRows tokenises it)
            try:
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
                    projected = []
                    for i, b in enumerate(blocks):
                        g = grads[b.name].detach()  # float64 only for the optimizer's transform, as the joint build
                        if transform is not None:
                            g = transform(b.name, g.to(torch.float64))
                        projected.append(projector.stored(i, g, spec.storage_dtype).cpu())
                    del grads
                    for t, r in enumerate(rows):
                        stream.put(r - lo, [v[t] for v in projected])
                    for r, loss in zip(rows, losses.tolist()):
                        row_meta[r - lo]["loss"] = float(loss)
                    if progress:
                        progress(len(rows))
            except BaseException:
                stream.abort()
                raise
            entry = stream.finish(lo, row_meta, layout, "row")
        except DiskFullError as e:
            # the shards written so far stay valid (each has its record) and are reused by the next build;
            # the error names what the rest of this build still needs
            rest = todo[todo.index(k) :]
            raise DiskFullError(
                root,
                rows_of(rest) * row_bytes,
                f"{_shard_file(k)} and the {len(rest) - 1} shard(s) after it",
                e.os_error,
                tail=f"{len(written)} shard(s) this build wrote are kept (valid, reused next time), no temp file left",
            ) from e
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
