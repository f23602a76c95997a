"""Opt-in corrections of the sentence-unit row statistic for a row's number of units (issue 23; not a default).

They correct the span-aware row statistic ``rows_j = min_{s ∈ j} u_s``, with ``u`` the failing items'
mean unit score: the default until 2026-12-02, when the default became the per-item minimum averaged over
the items (:func:`gradian.attribute.ranking.rank_statistic`). If unit scores were exchangeable noise, a row with
``k`` units would get a lower (more harmful-looking) minimum the larger ``k`` is: the expected minimum of
``k`` draws falls with ``k``. Two corrections, both computed from the same unit scores ``u`` (n_units,):

* ``"expected-min"``: standardise the units robustly, ``z_s = (u_s − median u) / (1.4826 · MAD u)``, and add
  back the expected maximum of ``k_j`` standard normal draws, ``e(k) = Φ⁻¹((k − 0.375) / (k + 0.25))``
  (Blom's approximation; ``e(1) = 0``): ``rows_j = min_{s ∈ j} z_s + e(k_j)``, the row's minimum measured
  against what ``k_j`` null units would give.
* ``"bottom-m"``: the mean of the row's ``m`` lowest unit scores (all of them when it has fewer than ``m``);
  a single low sentence counts for less in a long row.

Neither is wired into ``gradian attribute``; ``benchmarks/bench_family.py --units`` scores them against
the default on the tiny family (docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np

METHODS = ("expected-min", "bottom-m")


def expected_max_normal(k: np.ndarray) -> np.ndarray:
    """Blom's approximation of E[max of k iid N(0, 1)], ``Φ⁻¹((k − 0.375) / (k + 0.25))``; 0 at k = 1."""
    from scipy.stats import norm

    k = np.asarray(k, dtype=float)
    out = norm.ppf((k - 0.375) / (k + 0.25))
    return np.where(k <= 1, 0.0, out)


def units_per_row(unit_rows: np.ndarray, n: int) -> np.ndarray:
    """(n,) how many units each row has (``unit_rows[s]`` = the row of unit s)."""
    return np.bincount(np.asarray(unit_rows, dtype=int), minlength=n)


def corrected_rows(
    u: np.ndarray, unit_rows: np.ndarray, n: int, method: str = "expected-min", m: int = 2
) -> np.ndarray:
    """The rows' rank statistic from unit scores ``u`` (n_units,) under ``method`` (module docstring).

    Args:
        u: (n_units,) unit scores (lower = more harmful), e.g. ``U.mean(axis=0)``.
        unit_rows: (n_units,) the row of each unit.
        n: number of rows; every row must have at least one unit.
        method: ``"expected-min"`` or ``"bottom-m"``.
        m: the ``m`` of ``"bottom-m"``.

    Returns:
        (n,) row scores, lower = more harmful.
    """
    if method not in METHODS:
        raise ValueError(f"unknown unit correction {method!r}; use one of {', '.join(METHODS)}")
    u = np.asarray(u, dtype=float)
    rows = np.asarray(unit_rows, dtype=int)
    k = units_per_row(rows, n)
    if (k == 0).any():
        raise ValueError("every row needs at least one unit")
    if method == "expected-min":
        from gradian.attribute.ranking import zscore

        z = zscore(u)
        mins = np.full(n, np.inf)
        np.minimum.at(mins, rows, z)
        return mins + expected_max_normal(k)
    out = np.empty(n)
    order = np.lexsort((u, rows))  # by row, then score
    start = 0
    for j in range(n):
        vals = u[order[start : start + k[j]]]
        out[j] = vals[:m].mean()
        start += k[j]
    return out
