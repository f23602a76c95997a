"""Gradient evidence over the training trajectory: per-item score matrices for every engine.

For every checkpoint t of the trajectory (:mod:`gradian.attribute.trajectory`),
with its LoRA weights loaded, its own gradient index (content-addressed), its
own query gradients ``g_q^t`` and each engine fitted on its own index
(``r_q^t = P_t g_q^t``):

    raw[q, j]    = Σ_t w_t · ⟨r_q^t, g_j^t⟩                                 (influence, loss units)
    cosine[q, j] = Σ_t w_t · ⟨r_q^t, g_j^t⟩ / (‖r_q^t‖ · ‖g_j^t‖)            (direction only)

where the run's row order is reproduced, ``w_t`` is row j's own ``W[t, j]`` (:mod:`gradian.attribute.visits`: the
checkpoint's weight for a row some step read, 0 for a row the run never read; a sentence unit takes its row's
weight).

``raw`` is the TracIn-weighted influence: its sign follows :mod:`gradian.sign`
and ``raw / n`` is the first-order change of the query loss if row j were
removed. ``cosine`` (LESS's unit normalisation) drops the gradient norms: a row
the fine-tune has memorised has a small gradient at late checkpoints, and an
item whose query gradient is large no longer outweighs the others in a
capability mean. With ``unit="sentence"`` the same two matrices are also
computed for every sentence unit (:mod:`gradian.data.spans`) against the
same preconditioned queries (the curvature is fitted on whole rows, the
training distribution).

Every index pass reads one shard at a time; all capabilities and engines share
each pass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from gradian.attribute.queries import Query, query_gradients
from gradian.attribute.trajectory import Trajectory, checkpoint_weights
from gradian.data.formats import Example
from gradian.data.spans import SentenceUnit, sentence_units
from gradian.data.tokenize import TokenizedExample
from gradian.engines.base import Blocks, EngineSpec, ModelPass, score_index
from gradian.engines.registry import fit_engine
from gradian.index.store import GradientIndex, GradSpec

Progress = Callable[[str, int, int], None]


@dataclass
class EngineScores:
    """One engine's per-item scores, summed over the trajectory (module docstring).

    Attributes:
        engine: the engine's name.
        raw, cosine: (m, n) per failing item × training row.
        unit_raw, unit_cosine: (m, n_units) per failing item × sentence unit (``unit="sentence"``), else None.
        per_checkpoint: per checkpoint ``{"raw", "cosine"[, "unit_raw", "unit_cosine"]}`` unweighted,
            kept only when asked for (benchmarks).
    """

    engine: str
    raw: np.ndarray
    cosine: np.ndarray
    unit_raw: np.ndarray | None = None
    unit_cosine: np.ndarray | None = None
    per_checkpoint: list[dict[str, np.ndarray]] | None = None


#: The score matrices an :class:`EngineScores` holds, each (m, ·) per failing item.
MATRIX_KINDS = ("raw", "cosine", "unit_raw", "unit_cosine")


@dataclass
class TrajectoryEvidence:
    """What :func:`trajectory_scores` computed.

    Attributes:
        scores: ``{capability: {engine: EngineScores}}``.
        units: the sentence units (``unit="sentence"``), else None.
        indexes: per checkpoint, the index ids used and whether they were reused.
        final_index: the final checkpoint's row index (for clustering).
        preconditioned: per checkpoint, ``{engine: {capability: Blocks (m, d_l)}}``, for the whole-row
            drill-down (kept only with ``keep_preconditioned``; otherwise empty).
        timing: seconds per stage.
        final_states: with ``row_states``, RepSim's state of each row the final adapter's joint build computed
            (row -> (d,) float64; :func:`gradian.index.joint.build_jointly`); empty when nothing was built there.
    """

    scores: dict[str, dict[str, EngineScores]]
    units: list[SentenceUnit] | None
    indexes: list[dict[str, Any]]
    final_index: GradientIndex
    preconditioned: list[dict[str, dict[str, Blocks]]]
    timing: dict[str, float] = field(default_factory=dict)
    final_states: dict[int, torch.Tensor] = field(default_factory=dict)


def row_norms(index: GradientIndex) -> np.ndarray:
    """‖g_j‖ over all blocks for every row of ``index``: (n,) float64. Collective under torchrun
    (each rank its block of shards, gathered in row order).
    """
    from gradian import distributed

    out = [torch.zeros(0, dtype=torch.float64)]
    for _, shard in index.iter_shards(torch.float64, local=True):
        out.append(sum((G * G).sum(1) for G in shard.values()).sqrt())
    return distributed.gather_cat(torch.cat(out)).numpy()


def _norms(R: Blocks) -> np.ndarray:
    return torch.sqrt(sum((v.double() * v.double()).sum(1) for v in R.values())).numpy()


def _safe_div(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    return np.divide(x, d, out=np.zeros_like(x), where=d > 0)


def trajectory_scores(
    ft,
    trajectory: Trajectory,
    data: str | Path,
    examples: Sequence[Example],
    items: Sequence[TokenizedExample],
    grad: GradSpec,
    queries: dict[str, Sequence[Query]],
    engines: Sequence[EngineSpec],
    *,
    unit: str = "row",
    seed: int = 0,
    index_root: str | Path | None = None,
    batch_size: int = 8,
    query_batch_size: int = 2,
    progress: Progress | None = None,
    keep_per_checkpoint: bool = False,
    say: Callable[[str], None] | None = None,
    shard_size: int = 256,
    rows_per_forward: int = 1,
    joint: bool = True,
    keep_preconditioned: bool | None = None,
    row_states: bool = False,
) -> TrajectoryEvidence:
    """Score every capability's queries with every engine at every checkpoint (module docstring).

    Collective under torchrun (:mod:`gradian.distributed`): the indexes are built and scored by all
    ranks, the query gradients are computed by rank 0 and broadcast; every rank returns the same
    evidence.

    Args:
        ft: the loaded fine-tune (:class:`gradian.finetune.FineTune`); its LoRA weights are swapped per
            checkpoint and restored afterwards.
        grad: the row index's gradient spec (``grad.optimizer="adam"`` preconditions training rows).
        queries: per capability, its failing items as queries (non-empty lists).
        engines: the gradient engines to run (each fitted per checkpoint).
        unit: ``"row"`` or ``"sentence"`` (also score sentence units).
        index_root: parent folder of the indexes (default: the cache); each index lives in
            ``<root>/<index id>``.
        say: called with one line per index build (its size estimate), before it starts.
        shard_size: rows per index shard.
        rows_per_forward: rows per forward pass of that one-pass build (``--rows-per-forward``).
        joint: with sentence units, build each checkpoint's row and sentence indexes in one pass per row
            (:mod:`gradian.index.joint`, the default ``--one-pass``; collective under torchrun, byte-identical
            for any number of processes); False (``--separate``): two separate builds. The two paths agree to
            float rounding, not to the bit, and share the index ids.
        keep_preconditioned: keep every checkpoint's preconditioned queries in the result (the whole-row
            drill-down re-scores sentences with them). Default: only with ``unit="row"``; a sentence run reads
            its drill-down off the unit scores. They are m × Σ_l d_l float64 numbers per engine and checkpoint:
            1.7 GB for 11 queries, 2 engines and 2 checkpoints of an exact SmolLM2-135M all-linear r=16 index.
        row_states: RepSim will read the final adapter's row states: its joint build pools them on its way
            (:attr:`TrajectoryEvidence.final_states`).
    """
    from gradian import distributed
    from gradian.finetune import training_index

    if keep_preconditioned is None:
        keep_preconditioned = unit == "row"

    caps = list(queries)
    flat: list[Query] = [q for c in caps for q in queries[c]]
    bounds = np.cumsum([0] + [len(queries[c]) for c in caps])
    n = len(examples)
    units = sentence_units(examples, items, grad.max_units_per_row) if unit == "sentence" else None
    acc: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    per_ck: dict[str, dict[str, list[dict[str, np.ndarray]]]] = {c: {e.name: [] for e in engines} for c in caps}
    indexes: list[dict[str, Any]] = []
    pre: list[dict[str, dict[str, Blocks]]] = []
    timing: dict[str, float] = {}
    final_index: GradientIndex | None = None
    final_states: dict[int, torch.Tensor] = {}

    def _index(spec: GradSpec, ck, label: str) -> GradientIndex:
        pf = (lambda k_: lambda a: progress(label, a, k_)) if progress else None
        idx, _, _, reused = training_index(
            ft,
            data,
            spec,
            seed=seed,
            parent=index_root,
            batch_size=batch_size,
            shard_size=shard_size,
            progress_factory=pf,
            examples=list(examples),
            items=list(items),
            checkpoint=ck,
            announce=(lambda line: say(f"{label}: {line}")) if say else None,
        )
        indexes[-1][spec.unit] = {"id": idx.id, "root": str(idx.root), "reused": reused, "n": idx.n}
        return idx

    def _joint(ck) -> dict[str, float] | None:
        from gradian.index.joint import maybe_build_jointly

        label = f"training and sentence gradients ({ck.label})"
        return maybe_build_jointly(
            ft,
            data,
            list(items),
            units,
            grad,
            seed=seed,
            parent=index_root,
            checkpoint=ck,
            batch_size=batch_size,
            shard_size=shard_size,
            progress_factory=(lambda k_: lambda a: progress(label, a, k_)) if progress else None,
            announce=(lambda line: say(f"{label}: {line}")) if say else None,
            per_forward=rows_per_forward,
            states=final_states if (row_states and ck.final) else None,
        )

    W = trajectory.row_weights()  # (T, n) W[c, j] where the run's visits are counted, else w_c for every row
    unit_rows = np.array([u.row for u in units], dtype=np.int64) if units is not None else None
    for t, ck in enumerate(trajectory.checkpoints):
        indexes.append({"checkpoint": ck.label, "weight": ck.weight})
        with checkpoint_weights(ft.model, ck):
            t0 = time.perf_counter()
            if units is not None and joint:  # the row + sentence pair: one pass per row (gradian.index.joint)
                built = _joint(ck)
                if built is not None:
                    indexes[-1]["joint"] = built
            idx = _index(replace(grad, unit="row"), ck, f"training gradients ({ck.label})")
            timing[f"index[{ck.label}]"] = time.perf_counter() - t0
            if ck.final:
                final_index = idx
            t0 = time.perf_counter()
            # rank 0 computes the query gradients; every rank preconditions the same numbers
            qtick = (lambda a, t, lb=ck.label: progress(f"query gradients ({lb})", a, t)) if progress else None
            Q = (
                query_gradients(ft.model, ft.tokenizer, flat, idx, grad.tokenize, query_batch_size, qtick)
                if distributed.current().is_main
                else None
            )
            Q = distributed.broadcast_tensors(Q)
            R_all: dict[str, Blocks] = {}
            # engines that declare needs="model" (EK-FAC) get a pass over the same rows at these weights
            mp = ModelPass(
                ft.model,
                list(items),
                ft.tokenizer.pad_token_id,
                batch_size,
                (lambda task, a, total, label=ck.label: progress(f"{task} ({label})", a, total)) if progress else None,
            )
            for es in engines:
                eng = fit_engine(es, idx, mp)
                R_all[es.name] = eng.precondition(idx, Q)
                if eng.needs == "model":
                    indexes[-1].setdefault("engines", {})[es.name] = eng.describe()
                del eng  # its fitted curvature (EK-FAC's factors) is not needed once the queries are preconditioned
            timing[f"queries[{ck.label}]"] = time.perf_counter() - t0
            if keep_preconditioned:  # m × Σ_l d_l float64 per engine and checkpoint: only when asked for
                pre.append(
                    {
                        e: {c: {k: v[bounds[i] : bounds[i + 1]] for k, v in R.items()} for i, c in enumerate(caps)}
                        for e, R in R_all.items()
                    }
                )
            del Q  # the raw query gradients: only their preconditioned forms are scored
            t0 = time.perf_counter()
            names = list(R_all)
            sidx = (
                _index(replace(grad, unit="sentence"), ck, f"sentence gradients ({ck.label})")
                if units is not None
                else None
            )
            n_sh = sum(len(ix.local_shards()) for ix in (idx, sidx) if ix is not None)
            stick = (lambda a, lb=ck.label, t=n_sh: progress(f"scoring ({lb})", a, t)) if progress else None
            if stick is not None:
                stick(0)
            raw = [r.numpy() for r in score_index(idx, [R_all[e] for e in names], stick)]
            g = row_norms(idx)
            got: dict[str, dict[str, np.ndarray]] = {}
            for e, r in zip(names, raw):
                qn = _norms(R_all[e])
                got[e] = {"raw": r, "cosine": _safe_div(r, np.outer(qn, g))}
            if sidx is not None:
                uraw = [r.numpy() for r in score_index(sidx, [R_all[e] for e in names], stick)]
                ug = row_norms(sidx)
                for e, r in zip(names, uraw):
                    got[e]["unit_raw"] = r
                    got[e]["unit_cosine"] = _safe_div(r, np.outer(_norms(R_all[e]), ug))
            timing[f"score[{ck.label}]"] = time.perf_counter() - t0
            # this checkpoint's preconditioned queries are scored: free them before the next checkpoint computes its
            # own (m × Σ_l d_l float64 per engine, 860 MB for the quick SmolLM2 world's exact index, would otherwise
            # be alive beside the next query pass; ``pre`` keeps its views when they are asked for)
            del R_all
        for i, c in enumerate(caps):
            sl = slice(bounds[i], bounds[i + 1])
            for e in names:
                part = {k: v[sl] for k, v in got[e].items()}
                if keep_per_checkpoint:
                    per_ck[c][e].append(part)
                tgt = acc.setdefault(c, {}).setdefault(e, {})
                for k, v in part.items():
                    w = ck.weight if W is None else (W[t][unit_rows] if k.startswith("unit_") else W[t])
                    tgt[k] = tgt.get(k, 0.0) + w * v  # (m, n or U) · (n or U,) broadcast per row
    assert final_index is not None, "a trajectory always ends at the final adapter"
    scores = {
        c: {
            e: EngineScores(
                e,
                **{k: acc[c][e].get(k) for k in MATRIX_KINDS},
                per_checkpoint=per_ck[c][e] if keep_per_checkpoint else None,
            )
            for e in acc[c]
        }
        for c in caps
    }
    for c in caps:
        for es in scores[c].values():
            assert es.raw.shape == (len(queries[c]), n)
    return TrajectoryEvidence(scores, units, indexes, final_index, pre, timing, final_states)


@dataclass
class CapabilityEvidence:
    """Everything one capability's verdict is computed from.

    Attributes:
        engines: per gradient engine (primary first), its :class:`EngineScores`.
        references: per reference engine, its (m, n) score matrix.
        units: the sentence units (when the engines scored them).
        drill: per gradient engine, the scores of the drill-only items (``AttributeSpec.drill_weakened_nats``:
            weakened items asked about by the sentence drill-down, not by the ranking), or None.
        trained: (n,) bool, the rows the run read (:mod:`gradian.attribute.visits`); None: every row. The verdict's
            statistics are taken over these rows, and the others score exactly 0.
    """

    engines: dict[str, EngineScores]
    references: dict[str, np.ndarray] = field(default_factory=dict)
    units: list[SentenceUnit] | None = None
    drill: dict[str, EngineScores] | None = None
    trained: np.ndarray | None = None

    def with_drill_items(self) -> CapabilityEvidence:
        """The evidence over the ranked items, then the drill-only ones (m + m_d rows; itself when there are
        none): what the sentence drill-down reads, so its item index runs over ``queries + drill_queries``.
        """
        if not self.drill:
            return self
        return CapabilityEvidence(
            {e: stack_items(es, self.drill[e]) for e, es in self.engines.items()},
            self.references,
            self.units,
            trained=self.trained,
        )


def stack_items(a: EngineScores, b: EngineScores) -> EngineScores:
    """``a``'s items then ``b``'s: each matrix (m_a, ·) over (m_b, ·) → (m_a + m_b, ·) (the same rows or units)."""

    def cat(x: np.ndarray | None, y: np.ndarray | None) -> np.ndarray | None:
        return None if x is None or y is None else np.concatenate([x, y], axis=0)

    return EngineScores(a.engine, **{k: cat(getattr(a, k), getattr(b, k)) for k in MATRIX_KINDS})


def split_items(es: EngineScores, m: int) -> tuple[EngineScores, EngineScores]:
    """``es``'s first m items and the rest (the inverse of :func:`stack_items`; per-checkpoint matrices split too)."""

    def part(sl: slice) -> EngineScores:
        def cut(x: np.ndarray | None) -> np.ndarray | None:
            return None if x is None else x[sl]

        pc = None
        if es.per_checkpoint is not None:
            pc = [{k: v[sl] for k, v in ck.items()} for ck in es.per_checkpoint]
        return EngineScores(es.engine, **{k: cut(getattr(es, k)) for k in MATRIX_KINDS}, per_checkpoint=pc)

    return part(slice(0, m)), part(slice(m, None))


def save_evidence_file(
    path: Path,
    evidence: dict[str, CapabilityEvidence],
    weights: Sequence[float] | None = None,
    row_weights: np.ndarray | None = None,
) -> None:
    """Write the score matrices each capability's verdict was formed from, as safetensors (float64, as the run
    computed them: the fusion gate is a rank correlation, and float32 rounding of tied scores can move it across 0).

    Keys, per capability ``c`` (m failing items, n rows, u sentence units, T checkpoints):

    * ``c/<engine>/raw``, ``c/<engine>/cosine``: (m, n) trajectory-weighted scores per item and row;
    * ``c/<engine>/unit_raw``, ``c/<engine>/unit_cosine``: (m, u) per item and sentence unit (sentence runs);
    * ``c/<engine>/ck<t>/<kind>``: the same four at checkpoint t alone, unweighted (when the engine kept them;
      ``raw = Σ_t weights[t] · ck<t>/raw``), so a benchmark can re-weigh the trajectory without a new run;
    * ``trajectory/weights``: (T,) the checkpoint weights ``w_t`` (when given);
    * ``trajectory/row_weights``: (T, n) ``W[t, j]`` where the run's visits were counted (then
      ``raw = Σ_t row_weights[t] ⊙ ck<t>/raw``, :mod:`gradian.attribute.visits`);
    * ``c/<engine>/drill/<kind>`` (and ``drill/ck<t>/<kind>``): the drill-only items' matrices
      (``--drill-weakened``), in the order of the capability's ``drill_queries``;
    * ``c/<reference>``: (m, n) a reference engine's scores;
    * ``units/row``, ``units/char_start``, ``units/char_end``, ``units/n_supervised``: (u,) int64 (−1: no span).

    Rows are in ``run.json``'s ``attribution.train_ids`` order; items in the capability's ``queries`` order.
    """
    import numpy as np
    from safetensors.numpy import save

    tensors: dict[str, np.ndarray] = {}
    units = None
    for cap, ev in evidence.items():
        for prefix, group in (("", ev.engines), ("drill/", ev.drill or {})):  # the ranked items, the drill-only ones
            for e, es in group.items():
                parts = [("", {k: getattr(es, k) for k in MATRIX_KINDS})]
                parts += [(f"ck{t}/", part) for t, part in enumerate(es.per_checkpoint or [])]
                for sub, mats in parts:
                    for kind, m in mats.items():
                        if m is not None:
                            tensors[f"{cap}/{e}/{prefix}{sub}{kind}"] = np.ascontiguousarray(m, dtype=np.float64)
        for r, m in ev.references.items():
            tensors[f"{cap}/{r}"] = np.ascontiguousarray(m, dtype=np.float64)
        units = units or ev.units
    if weights is not None:
        tensors["trajectory/weights"] = np.asarray(list(weights), dtype=np.float64)
    if row_weights is not None:
        tensors["trajectory/row_weights"] = np.ascontiguousarray(row_weights, dtype=np.float64)
    if units:
        tensors["units/row"] = np.array([u.row for u in units], dtype=np.int64)
        for f in ("char_start", "char_end", "n_supervised"):
            tensors[f"units/{f}"] = np.array(
                [-1 if getattr(u, f) is None else getattr(u, f) for u in units], dtype=np.int64
            )
    from gradian.util import atomic_write_bytes

    atomic_write_bytes(path, save(tensors))
