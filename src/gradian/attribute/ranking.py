"""How a verdict orders rows: the rank statistic, the robust standard score, and the fusion of reference
evidence into the gradient's ranking, with the agreement measures between two rankings.

Sign convention throughout (:mod:`gradian.sign`): lower = more harmful.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from gradian.attribute.spec import FUSE_GATES, AttributeSpec
from gradian.data.spans import SentenceUnit, row_min
from gradian.sign import auc_lower_is_positive, most_harmful_first

if TYPE_CHECKING:
    from gradian.attribute.evidence import EngineScores


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two (n,) score vectors; NaN below 3 rows."""
    from scipy.stats import spearmanr

    if len(a) < 3:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def topk_overlap(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """|top-k most harmful by a ∩ by b| / k."""
    k = max(1, min(k, len(a)))
    return len(set(most_harmful_first(a)[:k].tolist()) & set(most_harmful_first(b)[:k].tolist())) / k


def confidence_label(rho: float, overlap: float) -> str:
    """``high`` (ρ ≥ 0.8 and overlap ≥ 0.6), ``medium`` (ρ ≥ 0.5 and overlap ≥ 0.3), else ``low``."""
    if np.isnan(rho):
        return "unknown"
    if rho >= 0.8 and overlap >= 0.6:
        return "high"
    if rho >= 0.5 and overlap >= 0.3:
        return "medium"
    return "low"


@dataclass
class RankStatistic:
    """A gradient engine's rank score for one capability.

    Attributes:
        rows: (n,) the rank score per row (negative = harmful direction).
        per_item: (m, n) per failing item (its worst sentence per row with ``unit="sentence"``).
    """

    rows: np.ndarray
    per_item: np.ndarray


def rank_statistic(
    es: EngineScores,
    spec: AttributeSpec,
    units: Sequence[SentenceUnit] | None,
    n: int,
    trained: np.ndarray | None = None,
) -> RankStatistic:
    """The rank score of one engine (module docstring, step 4).

    ``unit="row"``:      P[q, j] = S[q, j];                    rows_j = mean_q P[q, j]
    ``unit="sentence"``: P[q, j] = min_{s ∈ j} U[q, s];        u_j = mean_q P[q, j],   w_j = mean_q S[q, j]
                         rows_j = u_j / σ(u) + λ · w_j / σ(w)      (λ = ``spec.row_weight``; rows = u when λ = 0)

    with S (m, n), U (m, n_units) the engine's ``cosine`` or ``raw`` matrices (``spec.statistic``) over the
    m failing items, and σ the robust scale (:func:`robust_scale`). With sentences, each item takes the row's
    sentence that is most harmful *to that item*, and u is the mean over items of those minima: a long row whose
    sentences each look a little harmful to different items no longer gets the minimum of their mean, and a buried
    sentence that hurts one item strongly is not averaged away before the minimum. Until 2026-12-02 the order was
    the other way round (``min_{s ∈ j} mean_q U[q, s]``; docs/benchmarks.md "Rank rule: per item, then mean").
    A minimum over a row's sentences favours rows with many sentences; the whole row's score w has no such bias
    but dilutes a buried sentence, so the two are added on one scale (docs/benchmarks.md "The whole row beside its
    worst sentence"). Dividing by σ without centring keeps the sign (negative = the harmful direction); the
    fusion (:func:`fuse_scores`) standardises the result again, so a shift would not change the verdict.

    ``trained`` ((n,) bool, the rows the run read; None: all): σ is taken over those rows, and the others score 0.
    """
    if spec.unit == "sentence":
        U = es.unit_cosine if spec.statistic == "cosine" else es.unit_raw
        if U is None or units is None:
            raise ValueError("sentence ranking needs sentence-unit scores (run the evidence with unit='sentence')")
        per_item, _ = row_min(U, units, n)
        rows = per_item.mean(axis=0)
        if spec.row_weight > 0:
            whole = (es.cosine if spec.statistic == "cosine" else es.raw).mean(axis=0)
            rows = with_whole_row(rows, whole, spec.row_weight, trained)
    else:
        per_item = es.cosine if spec.statistic == "cosine" else es.raw
        rows = per_item.mean(axis=0)
    if trained is not None:
        rows, per_item = np.where(trained, rows, 0.0), np.where(trained[None, :], per_item, 0.0)
    return RankStatistic(rows, per_item)


def with_whole_row(u: np.ndarray, w: np.ndarray, row_weight: float, trained: np.ndarray | None = None) -> np.ndarray:
    """``u / σ(u) + λ · w / σ(w)``: a sentence statistic u (n,) beside the whole rows' score w (n,), each on its
    robust scale σ (:func:`robust_scale`, not centred: the sign is kept, over the ``trained`` rows when given),
    λ = ``row_weight``.
    """
    pop = slice(None) if trained is None else trained
    return u / robust_scale(u[pop]) + row_weight * w / robust_scale(w[pop])


def robust_scale(x: np.ndarray) -> float:
    """1.4826 · MAD(x) (the standard deviation of normal data), else the standard deviation, else 1."""
    mad = 1.4826 * float(np.median(np.abs(x - np.median(x))))
    if mad > 0:
        return mad
    sd = float(np.std(x))
    return sd if sd > 0 else 1.0


def zscore(x: np.ndarray) -> np.ndarray:
    """(x − median) / (1.4826 · MAD): a robust standard score (sign kept: negative = below typical)."""
    med = np.median(x)
    mad = 1.4826 * np.median(np.abs(x - med))
    if not mad > 0:
        sd = x.std()
        return (x - med) / sd if sd > 0 else np.zeros_like(x)
    return (x - med) / mad


def tail_size(n: int) -> int:
    """How many of a reference's most harmful rows :func:`tail_agreement` looks at: ``max(5, ⌈0.05·n⌉)``, < n."""
    return int(min(max(5, int(np.ceil(0.05 * n))), max(1, n - 1)))


def tail_agreement(gradient: np.ndarray, reference: np.ndarray, k: int | None = None) -> float:
    """How far the gradient ranks the reference's k most harmful rows above the rest, in [−1, 1].

        T = the k rows with the lowest reference score (k = :func:`tail_size`)
        a = 2 · AUC_gradient(T vs the other rows) − 1
          = 2 · P(gradient_i < gradient_j | i ∈ T, j ∉ T) − 1      (ties half)

    +1: the gradient puts every row the reference blames first above every other row; 0: it ranks
    them like any row; −1: last. Unlike a correlation over all rows, it does not depend on how the two
    order the benign bulk, where both are noise: a reference that is right about a part of the data
    (one-sentence rows stating the wrong answer the model gives) keeps its weight when the gradient
    confirms that part, and a reference whose top rows the gradient does not confirm (a regression in
    *how* the model answers, whose words point at benign rows) gets none.

    Args:
        gradient, reference: (n,) scores, lower = more harmful.
    """
    n = len(gradient)
    if n < 3:
        return float("nan")
    k = tail_size(n) if k is None else int(min(max(1, k), n - 1))
    top = np.zeros(n, dtype=bool)
    top[np.argsort(reference, kind="stable")[:k]] = True
    return float(2.0 * auc_lower_is_positive(np.asarray(gradient, dtype=np.float64), top) - 1.0)


def fuse_scores(
    gradient: np.ndarray, references: dict[str, np.ndarray], gate: str = "global", trained: np.ndarray | None = None
) -> tuple[np.ndarray, dict[str, float]]:
    """Agreement-gated fusion of reference evidence into the gradient's rank score.

        fused_j = z(gradient)_j + Σ_r w_r · z(reference_r)_j,     w_r = max(0, a_r)

    with z a robust standard score (:func:`zscore`) and a_r the reference's agreement with the gradient:
    ``gate="global"`` (default) ρ_s(gradient, reference_r), the Spearman correlation over all rows;
    ``gate="tail"`` :func:`tail_agreement`, the gradient's verdict on the rows the reference blames most.
    A reference whose blamed rows the gradient confirms (a wrong fact the model repeats: its words are
    in the culprits) sharpens the ranking in proportion; one the gradient does not confirm (a regression
    in *how* the model answers, where the words point at benign rows) gets weight 0 and leaves the
    gradient's ranking alone. The global gate also zeroes a reference that is right on a part of the
    data but orders the rest unlike the gradient (issue 23: weight 0.016 on a world where BM25 ranked
    the direct culprits best); measured in docs/benchmarks.md.

    ``trained`` ((n,) bool; None: all rows): z and a_r are taken over the rows the run read, and the others
    score exactly 0 (neither harmful nor helpful: the run never trained them).

    Returns:
        ``(fused (n,), {reference: w_r})``.
    """
    if gate not in FUSE_GATES:
        raise ValueError(f"unknown fusion gate {gate!r}; use one of {FUSE_GATES}")
    if trained is not None:
        sub, w_ = fuse_scores(gradient[trained], {r: v[trained] for r, v in references.items()}, gate)
        out_all = np.zeros_like(gradient, dtype=np.float64)
        out_all[trained] = sub
        return out_all, w_
    out = zscore(gradient)
    weights: dict[str, float] = {}
    for name, v in references.items():
        a = tail_agreement(gradient, v) if gate == "tail" else spearman(gradient, v)
        w = max(0.0, a) if np.isfinite(a) else 0.0
        weights[name] = w
        out = out + w * zscore(v)
    return out, weights
