"""The verdict's rank score (ranking.rank_statistic): per failing item, each row's most harmful sentence, then the
mean over the items."""

import numpy as np

from gradian.attribute.evidence import EngineScores
from gradian.attribute.ranking import rank_statistic
from gradian.attribute.spec import AttributeSpec
from gradian.data.spans import SentenceUnit


def _units(rows):
    return [SentenceUnit(r, 0, 1, 0, 1) for r in rows]


def test_sentence_rank_is_the_mean_over_items_of_each_items_row_minimum():
    # Row 0 (a buried culprit): sentence 0 hurts item 0 hard and nothing else; sentence 1 hurts item 1 a little.
    # Row 1: one sentence that looks mildly harmful to both items.  Row 2: benign.
    U = np.array(
        [
            # r0 s0  r0 s1  r1 s0  r2 s0
            [-0.90, 0.00, -0.50, 0.10],  # item 0
            [0.00, -0.10, -0.45, 0.20],  # item 1
        ]
    )
    S = np.zeros((2, 3))
    es = EngineScores("datainf", S, S, U, U)
    st = rank_statistic(es, AttributeSpec(), _units([0, 0, 1, 2]), 3)
    np.testing.assert_allclose(st.per_item, [[-0.90, -0.50, 0.10], [-0.10, -0.45, 0.20]])
    np.testing.assert_allclose(st.rows, [-0.50, -0.475, 0.15])
    assert np.argmin(st.rows) == 0  # the buried culprit ranks first
    # the rule before 2026-12-02, min over the row's sentences of the items' mean, put row 1 first
    before = [min(U[:, k].mean() for k in ks) for ks in ([0, 1], [2], [3])]
    assert np.argmin(before) == 1


def test_row_rank_is_the_mean_over_items_and_raw_follows_the_statistic():
    raw = np.array([[1.0, -4.0], [3.0, -2.0]])
    cos = np.array([[0.1, -0.4], [0.3, -0.2]])
    es = EngineScores("datainf", raw, cos, None, None)
    st = rank_statistic(es, AttributeSpec(unit="row"), None, 2)
    np.testing.assert_allclose(st.rows, [0.2, -0.3])
    np.testing.assert_allclose(st.per_item, cos)
    st = rank_statistic(es, AttributeSpec(unit="row", statistic="raw"), None, 2)
    np.testing.assert_allclose(st.rows, [2.0, -3.0])
