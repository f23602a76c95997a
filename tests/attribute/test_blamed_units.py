"""The drill-down's sentence rule: item-scaled raw influence (drilldown.item_scaled, drilldown.blamed_units)."""

import numpy as np
import pytest

from gradian.attribute.drilldown import blamed_units, item_scaled


def test_item_scaled_divides_each_item_by_its_median_absolute_deviation():
    U = np.array([[1.0, 2.0, 3.0, 4.0, 100.0], [-10.0, 0.0, 10.0, 20.0, 30.0]])
    # item 0: median 3, |U - 3| = 2,1,0,1,97 -> MAD 1; item 1: median 10, |U - 10| = 20,10,0,10,20 -> MAD 10
    np.testing.assert_allclose(item_scaled(U), U / np.array([[1.0], [10.0]]))


def test_item_scaled_keeps_a_constant_item_unscaled():
    U = np.array([[2.0, 2.0, 2.0], [0.0, 1.0, -3.0]])
    Z = item_scaled(U)
    np.testing.assert_allclose(Z[0], U[0])
    assert np.all(np.sign(Z) == np.sign(U))  # no centring: a harmful (negative) unit stays negative


def test_a_loud_item_does_not_choose_the_sentence():
    # Row 0 has two sentences (units 0, 1) and a residual unit (2, no span). Item 0's query gradient is 100x
    # larger than item 1's, so its scores are on a 100x larger scale. Unit 1 is 8 spreads (MAD 0.75) below
    # item 1's bulk; unit 0 is under 2 spreads (MAD 85) below item 0's, but larger in raw terms.
    bulk0 = 100.0 * np.array([1.0, -1.0, 0.5, -0.5, 0.0, 1.0, -1.0])
    bulk1 = np.array([1.0, -1.0, 0.5, -0.5, 0.0, 1.0, -1.0])
    U = np.zeros((2, 3 + bulk0.size))
    U[0, :3] = [-150.0, -20.0, -500.0]
    U[1, :3] = [0.0, -6.0, -50.0]
    U[0, 3:], U[1, 3:] = bulk0, bulk1
    rows = [0, 0, 0] + list(range(1, 1 + bulk0.size))
    has_span = [True, True, False] + [True] * bulk0.size
    got = blamed_units(U, rows, has_span)
    assert got[0] == (1, 1)  # sentence 1, blamed for item 1
    unscaled = min((0, 1), key=lambda k: U[:, k].min())
    assert unscaled == 0  # the rule it replaces picks the loud item's sentence
    assert 0 in got and all(k >= 3 for r, (k, _) in got.items() if r != 0)


def test_rows_without_a_sentence_are_absent():
    U = np.array([[-1.0, -2.0, 0.5]])
    got = blamed_units(U, [0, 1, 1], [False, True, True])
    assert set(got) == {1} and got[1] == (1, 0)


@pytest.mark.parametrize("seed", [0, 1])
def test_blamed_unit_is_the_rows_argmin_of_the_item_scaled_minimum(seed):
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((4, 30)) * rng.uniform(0.1, 100, size=(4, 1))
    rows = rng.integers(0, 8, size=30)
    got = blamed_units(U, rows, [True] * 30)
    Z = item_scaled(U)
    for r in set(rows.tolist()):
        ks = np.flatnonzero(rows == r)
        k = int(ks[np.argmin(Z[:, ks].min(axis=0))])
        assert got[r] == (k, int(np.argmin(Z[:, k])))
