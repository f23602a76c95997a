"""The sign convention, fixed here once and imported everywhere else.

An influence *score* for training example j on a query q is

    score_j = ⟨ g_q , P g_j ⟩

where ``g_q`` is the gradient of the query *objective to be lowered* (a loss:
cross-entropy on the correct answer, or the contrastive
``ℓ(correct) − ℓ(what the model said)``), ``g_j`` is the gradient of example
j's training loss, and ``P`` is a positive semi-definite preconditioner (the
identity for gradient-dot, a damped inverse curvature for DataInf).

A gradient step on example j moves the adapter by ``−η g_j``; to first order
this changes the query loss by ``−η ⟨g_q, g_j⟩``. So a positive inner product
means training on j *lowered* the query loss: j **reinforced** the queried
behaviour. A negative one means j raised it: j **degraded** the behaviour.

Gradian's reported score is therefore

    score_j = + ⟨ g_q , P g_j ⟩      (positive = reinforced, negative = degraded)

and removing example j from a training set of n examples is predicted to
change the query loss by

    predicted_loss_delta_if_removed_j = score_j / n

(positive: removing a reinforcing example raises the query loss).

Note on DataInf's reference code: it reports ``IF = −⟨hvp, g_j⟩`` where a large
positive IF is *harmful*. Gradian's score is the negation of that quantity.
"""

from __future__ import annotations

from typing import Callable, Iterable, TypeVar

import numpy as np

T = TypeVar("T")

SIGN_CONVENTION = (
    "positive score = the example reinforced the queried behaviour; "
    "negative = it degraded it; predicted_loss_delta_if_removed = score / n"
)


def influence_from_inner_product(inner: np.ndarray) -> np.ndarray:
    """Map ⟨g_q, P g_j⟩ to Gradian's score. Identity by construction (see module docstring)."""
    return inner


def predicted_loss_delta_if_removed(score: np.ndarray, n: int) -> np.ndarray:
    """First-order change of the query loss if the example were removed: ``score / n``."""
    return np.asarray(score) / float(n)


# ----------------------------------------------------------------------------- ordering and harmful mass
#
# "Most harmful" is "most negative score" (module docstring). Every ordering is a *stable* ascending sort:
# rows with equal scores keep their index order, so the same scores give the same ranking everywhere.


def most_harmful_first(scores: np.ndarray) -> np.ndarray:
    """Indices ordering examples from most degrading (most negative) to most reinforcing.

    Args:
        scores: (n,) scores.

    Returns:
        (n,) int indices ``j`` sorted by ``(s_j, j)``: ascending score, ties in index order
        (``numpy.argsort(kind="stable")``; NaN scores last).
    """
    return np.argsort(np.asarray(scores), kind="stable")


def sort_most_harmful_first(items: Iterable[T], score: Callable[[T], float]) -> list[T]:
    """``items`` (sentences, clusters, ...) sorted most harmful first by ``score(item)``.

    Ascending ``score(item)``; stable: items with equal scores keep their order.
    """
    return sorted(items, key=score)


def harm_ranks(scores: np.ndarray) -> np.ndarray:
    """Each example's 1-based rank in :func:`most_harmful_first` order (1 = most harmful).

    Args:
        scores: (n,) scores.

    Returns:
        (n,) ints ``rank_j = 1 + |{i : (s_i, i) < (s_j, j)}|``, a permutation of ``1..n``.
    """
    return np.argsort(most_harmful_first(scores), kind="stable") + 1


def harmful_rows(scores: np.ndarray) -> np.ndarray:
    """Indices of the examples that degraded the behaviour (``s_j < 0``), most harmful first.

    Args:
        scores: (n,) scores.

    Returns:
        (k,) int indices ``{j : s_j < 0}`` in :func:`most_harmful_first` order (``k`` may be 0;
        NaN and zero scores are never harmful).
    """
    s = np.asarray(scores)
    order = most_harmful_first(s)
    return order[s[order] < 0]


def harmful_mass(scores: np.ndarray) -> float:
    """The harmful mass: the total magnitude of the negative scores.

    ``H = Σ_{j : s_j < 0} −s_j`` (≥ 0; exactly ``0.0`` when no score is negative; NaN scores are
    left out). Summed with ``numpy.sum``, in the scores' dtype and the order they are given.

    Args:
        scores: (n,) scores.
    """
    s = np.asarray(scores)
    neg = s[s < 0]
    return float(-neg.sum()) if neg.size else 0.0


def harmful_share(scores: np.ndarray, rows: Iterable[int]) -> float:
    """The share of the harmful mass that ``rows`` hold.

    ``Σ_{j ∈ rows, s_j < 0} −s_j / H`` with ``H`` = :func:`harmful_mass` of all scores; ``0.0`` when
    ``H = 0``. Positive scores among ``rows`` count for nothing (they do not cancel harm).

    Args:
        scores: (n,) scores.
        rows: indices into ``scores`` (summed in the order given).
    """
    s = np.asarray(scores)
    total = harmful_mass(s)
    if total <= 0:
        return 0.0
    return harmful_mass(s[np.asarray(list(rows), dtype=np.intp)]) / total


def harmful_tail(scores: np.ndarray, share: float, max_rows: int, min_rows: int = 2) -> np.ndarray:
    """The harmful tail: the most harmful rows, taken in order until they hold ``share`` of the harmful mass.

    With ``h = harmful_rows(scores)`` and the cumulative share ``c_i = Σ_{t ≤ i} −s_{h_t} / H``
    (``H`` summed over ``h``), the tail is ``h[:k]`` with ``k`` the first ``i + 1`` where
    ``c_i ≥ share``, then clipped to ``max_rows`` and raised to ``min(min_rows, len(h))``.

    Args:
        scores: (n,) scores.
        share: the share of the harmful mass the tail holds (0..1).
        max_rows: at most this many rows.
        min_rows: at least this many rows (when that many are harmful).

    Returns:
        (k,) int row indices, most harmful first; empty when no score is negative.
    """
    s = np.asarray(scores)
    neg = harmful_rows(s)
    if len(neg) == 0:
        return neg
    cum = np.cumsum(-s[neg]) / harmful_mass(s[neg])
    k = int(np.searchsorted(cum, share) + 1)
    return neg[: max(min(min_rows, len(neg)), min(k, max_rows, len(neg)))]


# ----------------------------------------------------------------------------- the verdict score (one scale)

#: What a verdict score is, as every renderer and ``run.json`` label it.
VERDICT_SCORE_UNIT = "% of the harmful total"

VERDICT_SCORE_DOC = (
    "verdict score: the row's rank score as a signed share of the harmful total, in percent "
    "(negative = harmful; the harmful rows' scores add up to -100%; a cluster's share is the sum of its rows')"
)


def verdict_scores(rank_scores: np.ndarray) -> np.ndarray:
    """The one number that orders the verdict, on a scale a person can read: a signed share of the harmful total.

        v_j = 100 · r_j / H,      H = Σ_{i : r_i < 0} −r_i      (:func:`harmful_mass` of the rank scores)

    in percent, with ``r`` the verdict's rank scores (whatever formed them: cosine, raw influence, or the
    fused standard scores). Why this scale and not a z-score: it is a positive multiple of ``r``, so it
    orders rows exactly as ``r`` does **and keeps its sign** (negative = harmful, the sign convention),
    while a z-score is centred on the median row and would call half of all rows "harmful"; and it is
    the scale the clusters are already reported on — the harmful rows' scores add up to −100 %, and a
    cluster's share of the harmful score is minus the sum of its rows' verdict scores. A row with
    ``v_j = −12`` holds 12 % of all the harm the ranking sees.

    When no rank score is negative (``H = 0``) nothing is harmful: ``v_j = 100 · r_j / Σ_i |r_i|``
    (all ≥ 0), or 0 when every score is 0. NaN stays NaN.

    Args:
        rank_scores: (n,) the verdict's rank scores.

    Returns:
        (n,) float64 verdict scores in percent.
    """
    r = np.asarray(rank_scores, dtype=np.float64)
    total = harmful_mass(r)
    if not total > 0:
        total = float(np.nansum(np.abs(r)))
    if not total > 0:
        return np.zeros_like(r)
    return 100.0 * r / total


def scale_verdict(x: float | np.ndarray, rank_scores: np.ndarray) -> float | np.ndarray:
    """A number in the rank score's units (e.g. one sentence's) on the verdict scale: ``100 · x / H``.

    The same positive factor :func:`verdict_scores` applies to the rows, so a sentence scored with the
    rows' statistic reads on the same scale as the rows.
    """
    r = np.asarray(rank_scores, dtype=np.float64)
    total = harmful_mass(r)
    if not total > 0:
        total = float(np.nansum(np.abs(r)))
    if not total > 0:
        return np.zeros_like(np.asarray(x, dtype=np.float64)) if np.ndim(x) else 0.0
    out = 100.0 * np.asarray(x, dtype=np.float64) / total
    return out if np.ndim(x) else float(out)


#: Characters of a listed row shown on each side of its harmful sentence (every renderer).
SENTENCE_CONTEXT_SHOWN = 80


def auc_lower_is_positive(scores: np.ndarray, positive: np.ndarray) -> float:
    """AUC of ``-scores`` for detecting ``positive`` rows (NaN if a class is empty).

    P(score_i < score_j | i positive, j not), ties counted half (Mann-Whitney): lower = more harmful.
    """
    from scipy.stats import rankdata

    pos = positive.astype(bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r = rankdata(-scores)  # rank 1 = least harmful
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
