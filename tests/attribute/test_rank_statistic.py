"""The verdict's rank score (ranking.rank_statistic): per failing item, each row's most harmful sentence, then the
mean over the items; plus the whole row's score on the same scale."""

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
    st = rank_statistic(es, AttributeSpec(row_weight=0.0), _units([0, 0, 1, 2]), 3)
    np.testing.assert_allclose(st.per_item, [[-0.90, -0.50, 0.10], [-0.10, -0.45, 0.20]])
    np.testing.assert_allclose(st.rows, [-0.50, -0.475, 0.15])
    assert np.argmin(st.rows) == 0  # the buried culprit ranks first
    # the rule before 2026-12-02, min over the row's sentences of the items' mean, put row 1 first
    before = [min(U[:, k].mean() for k in ks) for ks in ([0, 1], [2], [3])]
    assert np.argmin(before) == 1


def test_the_whole_row_is_added_on_the_same_robust_scale_keeping_the_sign():
    """rows = u / σ(u) + λ · w / σ(w), σ = 1.4826 · MAD: a row with many mildly harmful-looking sentences (row 1)
    that is benign as a whole drops below a row that is harmful as a whole (row 0)."""
    from gradian.attribute.ranking import robust_scale

    U = np.array([[-0.30, 0.10, -0.45, -0.40, 0.05, 0.00, 0.02]])  # row 0: 2 sentences; row 1: 2; rows 2-4: 1 each
    S = np.array([[-0.40, 0.20, 0.03, 0.01, -0.02]])
    units = _units([0, 0, 1, 1, 2, 3, 4])
    es = EngineScores("datainf", S, S, U, U)
    alone = rank_statistic(es, AttributeSpec(row_weight=0.0), units, 5)
    np.testing.assert_allclose(alone.rows, [-0.30, -0.45, 0.05, 0.00, 0.02])
    assert np.argmin(alone.rows) == 1  # the sentence statistic alone blames the row of many harmful-looking sentences
    st = rank_statistic(es, AttributeSpec(), units, 5)  # row_weight 0.5, the default
    u, w = alone.rows, S[0]
    sd_u, sd_w = 1.4826 * np.median(np.abs(u - np.median(u))), 1.4826 * np.median(np.abs(w - np.median(w)))
    np.testing.assert_allclose(st.rows, u / sd_u + 0.5 * w / sd_w)
    assert robust_scale(u) == sd_u and np.argmin(st.rows) == 0
    assert np.all(np.sign(st.rows[[0, 1]]) == -1)  # not centred: harmful in both stays negative
    np.testing.assert_array_equal(st.per_item, alone.per_item)  # the per-item minima (clusters, drill-down) unchanged
    assert robust_scale(np.zeros(4)) == 1.0 and robust_scale(np.array([0.0, 0.0, 0.0, 2.0])) == np.std([0, 0, 0, 2])


def test_a_manifest_from_before_row_weight_reads_as_the_sentence_statistic_alone():
    d = AttributeSpec().to_dict()
    assert d["row_weight"] == 0.5 and AttributeSpec.from_dict(d).row_weight == 0.5
    del d["row_weight"]
    assert AttributeSpec.from_dict(d).row_weight == 0.0


def test_row_rank_is_the_mean_over_items_and_raw_follows_the_statistic():
    raw = np.array([[1.0, -4.0], [3.0, -2.0]])
    cos = np.array([[0.1, -0.4], [0.3, -0.2]])
    es = EngineScores("datainf", raw, cos, None, None)
    st = rank_statistic(es, AttributeSpec(unit="row"), None, 2)
    np.testing.assert_allclose(st.rows, [0.2, -0.3])
    np.testing.assert_allclose(st.per_item, cos)
    st = rank_statistic(es, AttributeSpec(unit="row", statistic="raw"), None, 2)
    np.testing.assert_allclose(st.rows, [2.0, -3.0])


def test_rows_the_run_never_read_score_0_and_leave_the_statistics_to_the_rows_it_trained():
    """``trained`` (gradian.attribute.visits): the robust scales and the fusion are those of the trained rows alone,
    and an untrained row scores exactly 0 whatever its evidence (a reference engine's included)."""
    from gradian.attribute.ranking import fuse_scores, robust_scale, zscore

    rng = np.random.default_rng(0)
    n = 12
    U = rng.normal(size=(2, n))
    S = rng.normal(size=(2, n))
    trained = np.ones(n, dtype=bool)
    trained[[3, 7, 8]] = False
    units = _units(range(n))
    es = EngineScores("datainf", S, S, U, U)
    st = rank_statistic(es, AttributeSpec(), units, n, trained)
    u, w = U.mean(0), S.mean(0)
    want = u / robust_scale(u[trained]) + 0.5 * w / robust_scale(w[trained])
    np.testing.assert_allclose(st.rows[trained], want[trained])
    assert not st.rows[~trained].any() and not st.per_item[:, ~trained].any()
    assert robust_scale(u[trained]) != robust_scale(u)  # the untrained rows would have moved the scale
    bm25 = rng.normal(size=n)
    bm25[3] = -50.0  # an untrained row that reads like the wrong answer
    fused, weights = fuse_scores(st.rows, {"bm25": bm25}, "global", trained)
    sub, sub_w = fuse_scores(st.rows[trained], {"bm25": bm25[trained]}, "global")
    np.testing.assert_array_equal(fused[trained], sub)
    assert weights == sub_w and not fused[~trained].any()
    np.testing.assert_allclose(sub, zscore(st.rows[trained]) + sub_w["bm25"] * zscore(bm25[trained]))
