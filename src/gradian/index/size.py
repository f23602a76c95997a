"""How large an index will be, and the advice (``--project-dim``, dtype, units) when it is too large.

    bytes = n × Σ_l d_l × width

with n the rows (or sentence units), d_l each LoRA block's stored numbers after the projection and
``width`` the storage dtype's bytes. The run plan (:mod:`gradian.index.plan`) sizes every index of a
run with the same functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from gradian.errors import GradianWarning
from gradian.gradients.projection import ProjectionSpec
from gradian.index.store import STORAGE_DTYPES, GradSpec
from gradian.util import human_bytes


class IndexSizeWarning(GradianWarning):
    """The index about to be built is large (or larger than the free disk space)."""


#: above this an index build warns and suggests --project-dim
LARGE_INDEX_BYTES = 20 * 10**9


def index_numbers(blocks: Sequence, projection: ProjectionSpec) -> int:
    """Numbers stored per row: Σ_l d_l after the projection."""
    from gradian.gradients.projection import projected_numbers

    return sum(projected_numbers(tuple(b.shape), b.kind, projection.dim) for b in blocks)


#: The most bytes one shard file holds (256 MiB). A build, a score pass and a resumed build each hold about
#: one shard at a time, so this bounds their memory; gradients this wide get fewer rows per shard.
SHARD_BYTES_MAX = 256 * 2**20


def effective_shard_size(shard_size: int, batch_size: int, row_bytes: int) -> int:
    """Rows per shard file: ``shard_size`` rounded up to a multiple of ``batch_size``, then cut to hold at
    most :data:`SHARD_BYTES_MAX` (a whole number of batches, at least one).

    Args:
        row_bytes: the bytes one stored gradient takes (Σ_l d_l × the storage dtype's width).

    Example: 256 rows of 860,160 float32 numbers (SmolLM2-135M, r=16 on all linear layers, ``--project-dim
    2048``) would be 880 MB a shard; the cut gives 72 rows (248 MB) at batch size 8.
    """
    s = max(batch_size, (shard_size + batch_size - 1) // batch_size * batch_size)
    cap = max(batch_size, SHARD_BYTES_MAX // max(1, row_bytes) // batch_size * batch_size)
    return min(s, cap)


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
