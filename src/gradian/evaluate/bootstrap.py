"""Paired bootstrap of a capability delta, and an exact sign test beside it.

For one capability with n items, reference scores ``r`` (n,) and tuned scores
``t`` (n,), the paired differences are ``d_i = t_i − r_i`` and the delta is

    Δ = mean(t) − mean(r) = mean(d).

The paired (percentile) bootstrap resamples *items* with replacement, keeping
each item's two scores together (so item difficulty, shared by both models,
cancels): for b = 1..B draw indices I_b ~ Uniform{0..n−1}^n and compute
Δ*_b = mean(d[I_b]). The (1−α) confidence interval is the pair of empirical
quantiles (α/2, 1−α/2) of Δ*_1..Δ*_B (numpy's default linear interpolation).
Draws come from ``numpy.random.default_rng(seed)``, so a seed fixes the CI.
Vectorised: the (B, n) index matrix is drawn in chunks of at most
``chunk_elems`` entries, so memory stays bounded for large sets.

The percentile bootstrap is slightly anti-conservative for small n; the exact
two-sided sign test on the non-zero differences (McNemar's exact test for 0/1
scores) is reported next to it as a cross-check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BootstrapCI:
    """Result of :func:`paired_bootstrap`.

    Attributes:
        delta: mean(tuned) − mean(reference).
        low, high: the confidence interval's bounds.
        confidence: e.g. 0.95.
        resamples: B.
        seed: the generator seed.
    """

    delta: float
    low: float
    high: float
    confidence: float
    resamples: int
    seed: int

    @property
    def includes_zero(self) -> bool:
        return self.low <= 0.0 <= self.high


def bootstrap_means(d: np.ndarray, resamples: int, seed: int, chunk_elems: int = 4_000_000) -> np.ndarray:
    """Bootstrap replicates of ``mean(d)``.

    Args:
        d: (n,) paired differences.

    Returns:
        (resamples,) float64: ``mean(d[I_b])`` for each resample b.
    """
    d = np.asarray(d, dtype=np.float64)
    n = d.shape[0]
    if n == 0:
        raise ValueError("no items to resample")
    rng = np.random.default_rng(seed)
    out = np.empty(resamples, dtype=np.float64)
    rows = max(1, chunk_elems // n)
    for start in range(0, resamples, rows):
        b = min(rows, resamples - start)
        idx = rng.integers(0, n, size=(b, n))  # (b, n)
        out[start : start + b] = d[idx].mean(axis=1)
    return out


def paired_bootstrap(
    reference: np.ndarray,
    tuned: np.ndarray,
    *,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> BootstrapCI:
    """Percentile paired-bootstrap CI of ``mean(tuned) − mean(reference)`` over items.

    Args:
        reference, tuned: (n,) per-item scores, paired by position.
    """
    r = np.asarray(reference, dtype=np.float64)
    t = np.asarray(tuned, dtype=np.float64)
    if r.shape != t.shape or r.ndim != 1:
        raise ValueError(f"paired scores must be two equal 1-D arrays, got {r.shape} and {t.shape}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    d = t - r
    reps = bootstrap_means(d, resamples, seed)
    alpha = 1.0 - confidence
    lo, hi = np.quantile(reps, [alpha / 2.0, 1.0 - alpha / 2.0])
    return BootstrapCI(float(d.mean()), float(lo), float(hi), confidence, int(resamples), int(seed))


def sign_test_p(reference: np.ndarray, tuned: np.ndarray) -> float:
    """Exact two-sided sign test p-value on the non-zero paired differences (1.0 if there are none)."""
    d = np.asarray(tuned, dtype=np.float64) - np.asarray(reference, dtype=np.float64)
    pos = int((d > 0).sum())
    neg = int((d < 0).sum())
    if pos + neg == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(pos, pos + neg, 0.5, alternative="two-sided").pvalue)
