"""The run plan: every gradient index a run will build, its size, the sum, a budget, and a time estimate.

Before the first index is computed, :func:`plan_indexes` lists the indexes of the run (checkpoints ×
units: a row index, and a sentence index when sentences are ranked), each one's size

    bytes = n × numbers × width  +  n × RECORD_BYTES,

with n the rows (or sentence units), ``numbers`` the stored numbers per gradient (Σ over the LoRA blocks,
exact or projected: :func:`gradian.index.size.index_numbers`), ``width`` the storage dtype's bytes and
:data:`RECORD_BYTES` the per-gradient metadata (shard records and manifest). An index already complete on
disk costs nothing new.

**The budget** (``--max-index-gb``; default ``min(20 GB, half the free disk where the indexes live)``).
When the new bytes of exact storage (projection dim 0) exceed it and the projection was left at its default,
the plan chooses one itself: the largest power-of-two ``--project-dim`` whose indexes fit
(:func:`choose_projection`), printed and recorded in the run manifest (``manifest.plan``). A projection given
explicitly (``--project-dim``, 0 included) that cannot fit is refused at once, as is any plan that would not
fit the free disk: nothing is computed, nothing written.

**The time** comes from a short measured warm-up (:func:`warmup`): a few rows' gradients are timed on the
path the build will take, and the seconds per work token are scaled to every index still to build.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from gradian.errors import GradianUserError
from gradian.util import human_bytes

#: the default budget's cap (bytes); the budget is the smaller of this and half the free disk
DEFAULT_BUDGET_BYTES = 20 * 10**9
#: estimated metadata per stored gradient: its id, loss and lengths, in its shard record and the manifest
RECORD_BYTES = 256
#: the smallest projection the plan chooses itself (numbers kept per LoRA block)
MIN_AUTO_DIM = 16


@dataclass(frozen=True)
class IndexBudget:
    """How much new index storage a run may write.

    Attributes:
        max_bytes: the budget in bytes (``--max-index-gb``); None: ``min(20 GB, half the free disk)``.
        projection_explicit: the projection was given (``--project-dim``): it is kept or refused, never
            replaced. A nonzero ``GradSpec.projection.dim`` always counts as given.
    """

    max_bytes: int | None = None
    projection_explicit: bool = False

    def __post_init__(self) -> None:
        if self.max_bytes is not None and (
            isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes <= 0
        ):
            raise GradianUserError(
                f"the index budget must be a positive number of bytes, got {self.max_bytes!r}",
                where="--max-index-gb (IndexBudget.max_bytes)",
                fix="e.g. --max-index-gb 20",
            )


def budget_from_gb(gb: float | None, projection_explicit: bool) -> IndexBudget:
    """``--max-index-gb`` (decimal GB; None: the default) as an :class:`IndexBudget`."""
    if gb is None:
        return IndexBudget(None, projection_explicit)
    if not isinstance(gb, (int, float)) or isinstance(gb, bool) or not math.isfinite(gb) or gb <= 0:
        raise GradianUserError(
            f"--max-index-gb {gb!r} is not a positive number", where="--max-index-gb", fix="e.g. --max-index-gb 20"
        )
    return IndexBudget(max(1, int(gb * 10**9)), projection_explicit)


@dataclass
class PlannedIndex:
    """One index of the plan.

    Attributes:
        checkpoint: the checkpoint's label; unit: ``row`` or ``sentence``; n: rows or sentence units.
        numbers: stored numbers per gradient; width: bytes per number; bytes: the index's size.
        reused: it is already complete on disk (no new bytes, no pass).
    """

    checkpoint: str
    unit: str
    n: int
    numbers: int
    width: int
    bytes: int
    reused: bool = False

    def line(self) -> str:
        """``checkpoint-1 row: 403 rows × 4,884,480 numbers × 4 bytes = 7.9 GB + 103 kB records``."""
        what = "units" if self.unit == "sentence" else "rows"
        if self.reused:
            return (
                f"{self.checkpoint} {self.unit}: {self.n:,} {what}, already built ({human_bytes(self.bytes)}, reused)"
            )
        shards = self.n * self.numbers * self.width
        return (
            f"{self.checkpoint} {self.unit}: {self.n:,} {what} × {self.numbers:,} numbers × {self.width} bytes "
            f"= {human_bytes(shards)} + {human_bytes(self.bytes - shards)} records"
        )


@dataclass
class RunPlan:
    """The plan (module docstring); ``to_dict`` is ``run.json`` ``manifest.plan``.

    Attributes:
        indexes: every index, checkpoints in trajectory order, row before sentence.
        projection: ``{"dim", "chosen_by": "flag" | "default" | "plan", "why"}``: what the run stores.
        exact_bytes: the new bytes exact storage would take; total_bytes, new_bytes: the chosen plan's.
        budget_bytes, budget_source: the budget and where it came from; free_bytes: free disk (None: unknown).
        warmup: ``{"examples", "work_tokens", "seconds"}`` of the timed warm-up (None: not measured).
        estimate_s: the estimated seconds of the index builds still to do (None: no warm-up).
        root: where the indexes live.
        work_tokens, joint, unit_grads: the estimate's work (tokens × backward passes), whether rows and sentence
            units are built in one pass, and how the units' gradients are formed (``GradSpec.unit_grads``).
    """

    indexes: list[PlannedIndex]
    projection: dict[str, Any]
    exact_bytes: int
    total_bytes: int
    new_bytes: int
    budget_bytes: int
    budget_source: str
    free_bytes: int | None
    root: str
    warmup: dict[str, Any] | None = None
    estimate_s: float | None = None
    work_tokens: int = 0
    joint: bool = False
    unit_grads: str = "exact"

    def lines(self) -> list[str]:
        """A few lines for the terminal: each index, the sum against the budget, the choice, the estimate."""
        out = [f"plan: {len(self.indexes)} gradient index(es) under {self.root}"]
        out += [f"  {p.line()}" for p in self.indexes]
        out.append(
            f"  total {human_bytes(self.total_bytes)} ({human_bytes(self.new_bytes)} new) within the budget "
            f"{human_bytes(self.budget_bytes)} ({self.budget_source})"
        )
        out.append(f"  projection: {self.projection['why']}")
        if self.estimate_s is not None and self.warmup is not None:
            how = "sentence units and rows in one pass per row" if self.joint else "one pass per row or unit"
            if self.joint and self.unit_grads != "exact":
                how = "one backward a row, its gradient split into the sentence units"
            out.append(
                f"  time: est. {_duration(self.estimate_s)} for {self.work_tokens:,} work tokens ({how}; warm-up: "
                f"{self.warmup['examples']} rows in {self.warmup['seconds']:.2f} s)"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["indexes"] = [asdict(p) for p in self.indexes]
        return d


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else (f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h")


def default_budget(root: Path) -> tuple[int, str, int | None]:
    """``(bytes, source, free)``: ``min(20 GB, half the free disk at root)`` (the nearest existing parent)."""
    import shutil

    p = Path(root)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        return DEFAULT_BUDGET_BYTES, "default 20 GB (free disk unknown)", None
    if free // 2 < DEFAULT_BUDGET_BYTES:
        return free // 2, f"default: half the {human_bytes(free)} free at {p}", free
    return DEFAULT_BUDGET_BYTES, f"default: min(20 GB, half the {human_bytes(free)} free at {p})", free


def _sizes(
    blocks: Sequence,
    spec,
    dim: int,
    counts: Sequence[tuple[str, str, int]],
    reused: Callable[[int, str, int], bool] | None,
) -> list[PlannedIndex]:
    """Every (checkpoint, unit, n) of ``counts`` sized at projection ``dim``."""
    from gradian.gradients.projection import ProjectionSpec
    from gradian.index.size import index_numbers, size_estimate

    numbers = index_numbers(blocks, ProjectionSpec(dim=dim, seed=spec.projection.seed))
    width = size_estimate(1, 1, spec.storage_dtype)[0]
    out = []
    for i, (label, unit, n) in enumerate(counts):
        done = bool(reused(i, unit, dim)) if reused is not None else False
        out.append(PlannedIndex(label, unit, n, numbers, width, n * (numbers * width + RECORD_BYTES), done))
    return out


def choose_projection(
    blocks: Sequence,
    spec,
    counts: Sequence[tuple[str, str, int]],
    budget_bytes: int,
    reused: Callable[[int, str, int], bool] | None = None,
) -> int | None:
    """The largest power-of-two projection dim whose new index bytes fit ``budget_bytes`` (None: none does).

    Tried from the smallest power of two at which some block is still projected (a larger dim stores every
    block whole) down to :data:`MIN_AUTO_DIM`.
    """
    from gradian.gradients.projection import projected_numbers

    full = max((projected_numbers(tuple(b.shape), b.kind, 0) for b in blocks), default=1)
    dim = 1 << max(4, math.ceil(math.log2(max(full, 2))) - 1)
    while dim >= MIN_AUTO_DIM:
        plan = _sizes(blocks, spec, dim, counts, reused)
        if sum(p.bytes for p in plan if not p.reused) <= budget_bytes:
            return dim
        dim //= 2
    return None


def plan_indexes(
    blocks: Sequence,
    spec,
    counts: Sequence[tuple[str, str, int]],
    root: str | Path,
    budget: IndexBudget,
    reused: Callable[[int, str, int], bool] | None = None,
) -> tuple[RunPlan, int]:
    """The run's plan and the projection dim it stores (module docstring).

    Args:
        blocks: the LoRA blocks the index stores (:func:`gradian.index.store.select_blocks`).
        spec: the run's :class:`~gradian.index.store.GradSpec` (storage dtype, projection as given).
        counts: ``(checkpoint label, unit, n)`` per index, in build order.
        root: where the indexes are written (its free disk decides the default budget).
        reused: ``(position in counts, unit, dim) -> bool``: that index is already complete on disk.

    Raises:
        GradianUserError: an explicit projection that does not fit the budget; no projection fits; or the
            new bytes exceed the free disk. One line each, before anything is computed.
    """
    root = Path(root)
    auto_bytes, source, free = default_budget(root)
    budget_bytes = budget.max_bytes if budget.max_bytes is not None else auto_bytes
    if budget.max_bytes is not None:
        source = "--max-index-gb"
    given = spec.projection.dim
    explicit = budget.projection_explicit or given != 0
    exact = _sizes(blocks, spec, 0, counts, reused)
    exact_new = sum(p.bytes for p in exact if not p.reused)
    if explicit:
        plan = exact if given == 0 else _sizes(blocks, spec, given, counts, reused)
        new = sum(p.bytes for p in plan if not p.reused)
        if new > budget_bytes:
            fits = choose_projection(blocks, spec, counts, budget_bytes, reused)
            hint = f"--project-dim {fits} fits" if fits else "no projection fits: attribute fewer layers (--modules)"
            raise GradianUserError(
                f"--project-dim {given} needs {human_bytes(new)} of new gradient indexes "
                f"({len([p for p in plan if not p.reused])} index(es)) but the budget is {human_bytes(budget_bytes)} "
                f"({source}); nothing was computed",
                where=f"--project-dim {given}",
                fix=f"{hint}; or leave --project-dim out (the plan then chooses), raise --max-index-gb, "
                "use --storage-dtype bfloat16, or --unit row",
            )
        dim = given
        why = (
            f"exact (--project-dim 0, given): {human_bytes(new)} fits the budget"
            if given == 0
            else f"--project-dim {given} (given)"
        )
        chosen_by = "flag"
    elif exact_new <= budget_bytes:
        plan, dim, chosen_by = exact, 0, "default"
        why = f"exact: {human_bytes(exact_new)} of new indexes fits the budget"
    else:
        got = choose_projection(blocks, spec, counts, budget_bytes, reused)
        if got is None:
            raise GradianUserError(
                f"the run's gradient indexes need {human_bytes(exact_new)} exact, and even --project-dim "
                f"{MIN_AUTO_DIM} exceeds the budget {human_bytes(budget_bytes)} ({source}); nothing was computed",
                where="--max-index-gb",
                fix="attribute fewer layers (--modules) or rows, --unit row, --storage-dtype bfloat16, "
                "or raise --max-index-gb (or free disk space)",
            )
        dim, chosen_by = got, "plan"
        plan = _sizes(blocks, spec, dim, counts, reused)
        why = (
            f"--project-dim {dim} chosen by the plan: exact storage ({exact[0].numbers:,} numbers per gradient) "
            f"would need {human_bytes(exact_new)}, over the "
            f"budget {human_bytes(budget_bytes)}; {dim} is the largest power of two that fits "
            "(give --project-dim to choose, --max-index-gb to change the budget)"
        )
    new = sum(p.bytes for p in plan if not p.reused)
    if free is not None and new > free:
        raise GradianUserError(
            f"the run's new gradient indexes need {human_bytes(new)} but {human_bytes(free)} is free; nothing was "
            "computed",
            where=str(root),
            fix="lower --max-index-gb or --project-dim, free space, or put the indexes on another disk (--index-dir)",
        )
    out = RunPlan(
        indexes=plan,
        projection={"dim": dim, "chosen_by": chosen_by, "why": why},
        exact_bytes=exact_new,
        total_bytes=sum(p.bytes for p in plan),
        new_bytes=new,
        budget_bytes=int(budget_bytes),
        budget_source=source,
        free_bytes=free,
        root=str(root),
    )
    return out, dim


def warmup(
    model,
    items: Sequence,
    spec,
    pad_token_id: int,
    units: Sequence | None = None,
    rows: int = 4,
    per_forward: int = 1,
) -> dict[str, Any]:
    """Time a few rows' gradients on the path the build takes; returns ``{"examples", "work_tokens", "seconds"}``.

    Rows path (``units`` None): one :func:`~gradian.gradients.per_example.per_example_grads` batch of ``rows``
    rows, projected; work tokens = padded tokens. Sentence path: :func:`~gradian.gradients.units.rows_unit_grads`
    on ``per_forward`` rows at a time (``--rows-per-forward``; at least that many rows are timed), projected; work
    tokens = Σ row tokens × its backward vectors (units, plus the residual), so a batched pass shows as a higher
    rate. One row is run first, untimed (first-call overheads).
    """
    from gradian.data.tokenize import collate
    from gradian.index.build import block_projection
    from gradian.index.store import select_blocks

    blocks = select_blocks(model, spec)
    proj, _, _ = block_projection(blocks, spec)  # as the build projects and stores
    n = min(max(rows, per_forward if units is not None else 0), len(items))
    picks = list(range(n))
    if units is None:
        from gradian.gradients.per_example import per_example_grads

        mods = list(spec.modules) if spec.modules else None

        def run(ix: list[int]) -> int:
            batch = collate([items[i] for i in ix], pad_token_id)
            g = per_example_grads(model, batch, "hooks", mods)
            for i, b in enumerate(blocks):
                proj.stored(i, g[b.name].detach(), spec.storage_dtype)
            return int(batch["input_ids"].numel())

    else:
        from gradian.gradients.units import rows_unit_grads
        from gradian.index.joint import rows_unit_batch

        by_row: dict[int, list] = {}
        for u in units:
            if u.row < n:
                by_row.setdefault(u.row, []).append(u)

        def run(ix: list[int]) -> int:
            tok = 0
            for s in range(0, len(ix), max(1, per_forward)):
                group = ix[s : s + max(1, per_forward)]
                batch, uls = rows_unit_batch(
                    [items[j] for j in group], [by_row.get(j, []) for j in group], pad_token_id
                )
                for j, r in zip(group, rows_unit_grads(model, batch, uls, blocks, spec.unit_grads)):
                    for i, b in enumerate(blocks):
                        proj.stored(i, r.units[b.name].detach(), spec.storage_dtype)
                        proj.stored(i, r.row[b.name].unsqueeze(0), spec.storage_dtype)
                    tok += len(items[j].input_ids) * r.passes
            return tok

    if n == 0:
        return {"examples": 0, "work_tokens": 0, "seconds": 0.0}
    run(picks[:1])
    t = time.perf_counter()
    tokens = run(picks)
    return {"examples": n, "work_tokens": tokens, "seconds": time.perf_counter() - t}


def add_estimate(
    plan: RunPlan, warm: dict[str, Any], work_tokens: int, joint: bool, unit_grads: str = "exact"
) -> RunPlan:
    """``plan`` with the time estimate: ``seconds / warm-up work tokens × work_tokens`` (still to build)."""
    plan.warmup = warm
    plan.work_tokens = int(work_tokens)
    plan.joint = joint
    plan.unit_grads = unit_grads
    rate = warm["seconds"] / warm["work_tokens"] if warm.get("work_tokens") else 0.0
    plan.estimate_s = rate * work_tokens
    return plan


def with_dim(spec, dim: int):
    """``spec`` with projection ``dim`` (its seed kept)."""
    return replace(spec, projection=replace(spec.projection, dim=dim))


def run_plan(
    ft,
    data,
    examples: Sequence,
    items: Sequence,
    grad,
    checkpoints: Sequence,
    units: Sequence[str],
    *,
    seed: int = 0,
    parent=None,
    budget: IndexBudget = IndexBudget(),
    joint: bool = False,
    warm_rows: int = 2,
    per_forward: int = 1,
) -> tuple[RunPlan, Any]:
    """The plan of a run's index builds, with its warm-up estimate; returns ``(plan, grad with the chosen dim)``.

    Args:
        ft: the loaded fine-tune (its model's current weights are used for the warm-up).
        grad: the run's :class:`~gradian.index.store.GradSpec`, projection as given.
        checkpoints: the trajectory's :class:`~gradian.attribute.trajectory.Checkpoint` s, in build order.
        units: the index units built per checkpoint (``("row",)``, ``("row", "sentence")``, ``("sentence",)``).
        parent: the indexes' parent folder (``--index-dir`` / ``--out``; None: the cache).
        joint: the row and sentence indexes of a checkpoint are built in one pass (:mod:`gradian.index.joint`).
        per_forward: that pass's rows per forward (``--rows-per-forward``), which the warm-up times as the build runs.
    """
    from gradian.data.tokenize import row_values
    from gradian.finetune import index_identity
    from gradian.index.store import GradientIndex, default_index_root, index_id, select_blocks
    from gradian.paths import cache_dir

    blocks = select_blocks(ft.model, grad)
    sent = None
    if "sentence" in units:
        from gradian.data.spans import sentence_units

        sent = sentence_units(examples, items, grad.max_units_per_row)
    counts = []
    for ck in checkpoints:
        for u in units:
            counts.append((ck.label, u, len(items) if u == "row" else len(sent or [])))
    base_ident: dict[tuple[int, str], dict] = {}

    def reused(i: int, unit: str, dim: int) -> bool:
        ck = checkpoints[i // len(units)]
        key = (i // len(units), unit)
        spec = replace(with_dim(grad, dim), unit=unit)
        if key not in base_ident:
            base_ident[key] = index_identity(ft, data, spec, seed, ck)
        ident = dict(base_ident[key], grad_spec=spec.identity())
        root = Path(parent) / index_id(ident) if parent is not None else default_index_root(ident)
        try:
            return GradientIndex(root).complete
        except (FileNotFoundError, OSError, ValueError, KeyError, TypeError):
            return False

    root = Path(parent) if parent is not None else cache_dir() / "index"
    plan, dim = plan_indexes(blocks, grad, counts, root, budget, reused)
    chosen = with_dim(grad, dim)
    # the work still to do, in tokens of forward+backward: rows, sentence prefixes, or rows × backward vectors
    lengths = row_values(items, "length")
    todo = {(p.checkpoint, p.unit) for p in plan.indexes if not p.reused}
    row_sup = row_values(items, "n_supervised")
    work = 0
    per_row_units: list[int] = [0] * len(items)
    unit_sup: list[int] = [0] * len(items)
    for u in sent or []:
        per_row_units[u.row] += 1
        unit_sup[u.row] += u.n_supervised
    for ck in checkpoints:
        both = (ck.label, "row") in todo and (ck.label, "sentence") in todo
        if joint and both and grad.unit_grads != "exact":  # one backward a row, split by position
            work += sum(lengths)
            continue
        if joint and both:
            work += sum(
                t * (k + (1 if s > us else 0)) for t, k, s, us in zip(lengths, per_row_units, row_sup, unit_sup)
            )
            continue
        if (ck.label, "row") in todo:
            work += sum(lengths)
        if (ck.label, "sentence") in todo:
            work += sum(u.length for u in sent or [])
    if work:
        warm = warmup(
            ft.model, items, chosen, ft.tokenizer.pad_token_id, sent if joint else None, warm_rows, per_forward
        )
        add_estimate(plan, warm, work, joint, grad.unit_grads)
    return plan, chosen
