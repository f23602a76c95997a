"""gradian.sign's ordering and harmful mass: ties, all-positive and empty scores, NaN, the tail's bounds."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from gradian.sign import (
    harm_ranks,
    harmful_mass,
    harmful_rows,
    harmful_share,
    harmful_tail,
    most_harmful_first,
    sort_most_harmful_first,
)


def _tail_by_definition(scores: list[float], share: float, max_rows: int, min_rows: int = 2) -> list[int]:
    """The harmful tail in plain Python, straight from its definition (gradian.sign.harmful_tail)."""
    neg = [j for j in sorted(range(len(scores)), key=lambda j: (scores[j], j)) if scores[j] < 0]
    if not neg:
        return []
    total = sum(-scores[j] for j in neg)
    k, held = len(neg), 0.0
    for i, j in enumerate(neg):
        held += -scores[j]
        if held / total >= share:
            k = i + 1
            break
    return neg[: max(min(min_rows, len(neg)), min(k, max_rows, len(neg)))]


def test_most_harmful_first_breaks_ties_by_index_and_puts_nan_last():
    """Ascending score; equal scores in index order; NaN after everything."""
    s = np.array([0.5, -1.0, float("nan"), -1.0, 0.0, -3.0, 0.5])
    assert most_harmful_first(s).tolist() == [5, 1, 3, 4, 0, 6, 2]
    assert most_harmful_first([]).tolist() == []


def test_harm_ranks_invert_the_order():
    """The 1-based ranks are the inverse permutation of most_harmful_first, ties included."""
    s = np.array([2.0, -1.0, -1.0, 0.0, -5.0])
    assert harm_ranks(s).tolist() == [5, 2, 3, 4, 1]  # the tie at -1.0: row 1 before row 2
    rng = np.random.default_rng(0)
    t = rng.integers(-3, 3, size=50).astype(float)  # many ties
    r = harm_ranks(t)
    assert sorted(r.tolist()) == list(range(1, 51))
    assert (most_harmful_first(t)[r - 1] == np.arange(50)).all()


def test_harmful_rows_only_negative_scores_in_order():
    """Only s < 0 is harmful (not 0, -0.0 or NaN); none when all are positive or there are none."""
    s = np.array([0.0, -0.0, -2.0, 1.0, float("nan"), -2.0, -0.5])
    assert harmful_rows(s).tolist() == [2, 5, 6]  # zero, -0.0 and NaN are not harmful; the tie keeps index order
    assert harmful_rows(np.array([0.0, 1.0, 2.0])).tolist() == []
    assert harmful_rows(np.array([])).tolist() == []


def test_harmful_mass_is_the_magnitude_of_the_negative_part():
    """H = sum of -s over s < 0; exactly +0.0 for empty and all-positive scores."""
    assert harmful_mass(np.array([1.0, -2.0, 3.0, -0.5])) == 2.5
    assert harmful_mass([-1.0, float("nan"), -1.0]) == 2.0
    for none_harmful in (np.array([]), np.array([0.0, 2.0, -0.0])):
        m = harmful_mass(none_harmful)
        assert m == 0.0 and math.copysign(1.0, m) == 1.0 and isinstance(m, float)  # never -0.0


def test_harmful_share_counts_only_harm():
    """A row's positive score does not cancel another's harm; no harm at all gives 0."""
    s = np.array([-3.0, -1.0, 2.0, 0.0])
    assert harmful_share(s, [0]) == 0.75
    assert harmful_share(s, [1, 2]) == 0.25  # the positive row cancels nothing
    assert harmful_share(s, [0, 1]) == 1.0
    assert harmful_share(s, []) == 0.0
    assert harmful_share(np.array([1.0, 0.0]), [0, 1]) == 0.0  # no harmful mass at all


def test_harmful_tail_edges():
    """Empty, all-positive, one harmful row, the two-row minimum, the share reached exactly, max_rows, ties."""
    assert harmful_tail(np.array([]), 0.8, 100).tolist() == []
    assert harmful_tail(np.array([0.0, 1.0, 3.0]), 0.8, 100).tolist() == []  # all positive
    assert harmful_tail(np.array([1.0, -2.0, 3.0]), 0.8, 100).tolist() == [1]  # one harmful row
    # one row holds 90% of the harm: the share is reached at once, but at least two rows are kept
    assert harmful_tail(np.array([-9.0, -0.5, -0.5, 4.0]), 0.8, 100).tolist() == [0, 1]
    assert harmful_tail(np.array([-9.0, -0.5, -0.5, 4.0]), 0.8, 100, min_rows=1).tolist() == [0]
    # the share is reached exactly at the second row (0.5 + 0.25 = 0.75, exact in binary): it is included
    s = np.array([-1.0, -4.0, 3.0, -2.0, -1.0])
    assert harmful_tail(s, 0.75, 100).tolist() == [1, 3]
    assert harmful_tail(s, 0.76, 100).tolist() == [1, 3, 0]  # the tie at -1.0: row 0 before row 4
    assert harmful_tail(s, 1.0, 100).tolist() == [1, 3, 0, 4]
    assert harmful_tail(s, 1.0, 3).tolist() == [1, 3, 0]  # max_rows
    assert harmful_tail(-np.ones(200), 1.0, 50).tolist() == list(range(50))  # ties: index order


@pytest.mark.parametrize("seed", range(20))
def test_harmful_tail_matches_its_definition(seed):
    """Random scores with many ties and zeros: the tail, mass and share match a plain-Python definition."""
    rng = random.Random(seed)
    n = rng.randint(0, 60)
    # rounded scores: many ties; some rows exactly 0
    scores = [round(rng.gauss(0, 1), 1) for _ in range(n)]
    share, max_rows = rng.choice([0.5, 0.8, 0.95, 1.0]), rng.choice([1, 3, 10, 100])
    got = harmful_tail(np.array(scores, dtype=float), share, max_rows).tolist()
    assert got == _tail_by_definition(scores, share, max_rows)
    total = sum(-s for s in scores if s < 0)
    assert math.isclose(harmful_mass(np.array(scores)), total, rel_tol=1e-12, abs_tol=1e-12)
    assert math.isclose(
        harmful_share(np.array(scores), got),
        (sum(-scores[j] for j in got) / total) if total else 0.0,
        rel_tol=1e-12,
        abs_tol=1e-12,
    )


def test_sort_most_harmful_first_is_stable():
    """Items with equal scores keep their order."""
    items = [("a", 0.5), ("b", -1.0), ("c", -1.0), ("d", -2.0), ("e", 0.5)]
    assert [k for k, _ in sort_most_harmful_first(items, lambda kv: kv[1])] == ["d", "b", "c", "a", "e"]
    assert sort_most_harmful_first([], lambda kv: kv[1]) == []
