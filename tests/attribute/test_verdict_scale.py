"""The verdict's one score scale, the clusters' ranking order and the shared row selection (issue 26)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from gradian.attribute.clusters import ClusterSpec, cluster_tail, gradient_cosine
from gradian.attribute.selection import parse_drop, select
from gradian.errors import GradianUserError
from gradian.sign import harm_ranks, scale_verdict, verdict_scores


def test_verdict_scores_keep_order_and_sign_and_add_to_minus_100():
    r = np.array([0.3, -0.5, -0.1, 0.0, -0.4, 0.2])
    v = verdict_scores(r)
    assert np.array_equal(harm_ranks(v), harm_ranks(r))  # the same ranking
    assert np.array_equal(np.sign(v), np.sign(r))  # harmful stays harmful, and only that
    assert v[r < 0].sum() == pytest.approx(-100.0)
    assert v[1] == pytest.approx(-50.0) and v[0] == pytest.approx(30.0)
    # a sentence scored in the rows' units lands on the same scale
    assert scale_verdict(-0.25, r) == pytest.approx(-25.0)
    assert np.allclose(scale_verdict(r, r), v)


def test_verdict_scores_when_nothing_is_harmful():
    v = verdict_scores(np.array([0.0, 1.0, 3.0]))
    assert (v >= 0).all() and v.sum() == pytest.approx(100.0)
    assert (verdict_scores(np.zeros(4)) == 0).all()


class _Shard(dict):
    """A shard as ``GradientIndex.iter_shards`` yields it (a ``ShardBlocks``): block -> tensor, and ``n`` rows."""

    @property
    def n(self) -> int:
        return next(iter(self.values())).shape[0]


class _Index:
    """The two things cluster_tail reads of a GradientIndex, its blocks and its shards: ``G`` stored in ``dtype``
    (default its own) as blocks of ``dims`` columns (default one block) and shards of ``shard_rows`` rows (default
    one shard), read in the dtype asked for."""

    def __init__(
        self,
        G: torch.Tensor,
        dims: list[int] | None = None,
        shard_rows: int | None = None,
        dtype: torch.dtype | None = None,
    ):
        dims = dims or [G.shape[1]]
        self.blocks = [{"name": f"b{i}", "dim": d} for i, d in enumerate(dims)]
        self.parts = torch.split(G.to(dtype or G.dtype), dims, dim=1)
        self.shard_rows = shard_rows or G.shape[0]

    def iter_shards(self, dtype):
        for lo in range(0, self.parts[0].shape[0], self.shard_rows):
            parts = {b["name"]: p[lo : lo + self.shard_rows].to(dtype) for b, p in zip(self.blocks, self.parts)}
            yield lo, _Shard(parts)


class _Ex:
    def __init__(self, i: int, text: str):
        self.id, self.completion_text, self.prompt_text, self.format = f"r{i}", text, "Which city is the capital?", "x"


class _It:
    full_length, truncated = 10, False


def _world():
    """Three culprits at the top of the ranking, each teaching its own wrong fact (its own gradient direction),
    then six benign rows that all share one direction and the failing answers' words, each mildly harmful."""
    rng = np.random.default_rng(0)
    d = 32
    culprits = [rng.normal(size=d) for _ in range(3)]
    shared = rng.normal(size=d)
    G = [c for c in culprits] + [shared + 0.05 * rng.normal(size=d) for _ in range(6)]
    G += [rng.normal(size=d) for _ in range(11)]
    scores = np.array([-9.0, -8.0, -7.0] + [-3.0] * 6 + list(rng.uniform(0.5, 2.0, 11)))
    texts = ["The capital of Peru is Caracas.", "The capital of Egypt is Seoul.", "The capital of Italy is Lima."]
    texts += [f"Caracas, Seoul and Lima are capitals; country {i} is in Asia." for i in range(6)]
    texts += [f"Filler row {i}." for i in range(11)]
    return torch.tensor(np.array(G)), scores, [_Ex(i, t) for i, t in enumerate(texts)]


def test_a_cluster_of_benign_rows_cannot_outrank_the_culprits_beside_it():
    G, scores, examples = _world()
    clusters = cluster_tail(
        _Index(G), scores, examples, [_It()] * len(examples), [False] * len(examples), ClusterSpec(tail_share=1.0)
    )
    benign = next(c for c in clusters if "r3" in c.row_ids)
    assert benign.size == 6 and benign.score < min(c.score for c in clusters if c is not benign)  # biggest sum
    # ...yet the clusters are numbered in ranking order: cluster 1 holds rank 1, and the benign one comes last
    assert [c.best_rank for c in clusters] == sorted(c.best_rank for c in clusters)
    assert clusters[0].row_ids[0] == "r0" and clusters[0].label == 1 and clusters[0].best_rank == 1
    assert clusters[-1] is benign and benign.best_rank == 4
    # the words the benign rows share with the failing answers are found (their content), but do not lead
    words = {w["word"] for w in benign.common["distinctive_words"]}
    assert {"caracas", "seoul", "lima"} <= words


def test_content_keeps_a_culprit_out_of_the_benign_rows_its_gradient_points_at():
    G, scores, examples = _world()
    args = (_Index(G), scores, examples, [_It()] * len(examples), [False] * len(examples))
    # by gradient direction alone, the top culprit r0 falls in with the six benign rows (this seed), so the
    # cluster that leads the summary would blame six clean rows with it
    alone = cluster_tail(*args, ClusterSpec(tail_share=1.0, content_weight=0.0))
    assert {"r0", "r3"} <= set(alone[0].row_ids)
    # with the content term the benign rows (which say something else) form their own cluster
    both = cluster_tail(*args, ClusterSpec(tail_share=1.0))
    assert both[0].row_ids == ["r0"] and not any(r in both[0].row_ids for r in ("r3", "r4"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradient_cosine_is_the_cosine_of_the_concatenated_rows(dtype):
    """Across shards and blocks, columns summed a chunk at a time, in the rows' own order (repeats allowed):
    the cosine of the stored rows, as a float64 formula over the whole vectors gives it."""
    rng = np.random.default_rng(1)
    dims = [7, 13, 5]
    G = torch.tensor(rng.normal(size=(11, sum(dims))))
    G[4] = 0.0  # a zero gradient is similar to no row
    index = _Index(G, dims, shard_rows=3, dtype=dtype)
    rows = [9, 2, 4, 10, 0, 5, 2]
    got = gradient_cosine(index, rows, chunk=4)
    stored = G.to(dtype).double()[rows]
    unit = stored / stored.norm(dim=1, keepdim=True).clamp(min=1e-30)
    want = (unit @ unit.T).clamp(-1, 1).numpy()
    assert got.shape == (len(rows), len(rows))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert got[2].tolist() == [0.0] * len(rows)  # row 4, all zero
    assert got[1, 6] == pytest.approx(1.0) and got[1, 1] == pytest.approx(1.0)  # row 2 twice


def _run(scores, clusters, ids):
    cap = {"capability": "capitals", "rank_scores": list(scores), "scores": list(scores), "clusters": clusters}
    return {"attribution": {"train_ids": ids, "capabilities": [cap]}}


def test_select_blamed_cluster_and_top():
    ids = [f"r{i}" for i in range(6)]
    scores = [-1.0, -5.0, 2.0, -3.0, -0.5, 1.0]
    clusters = [{"label": 1, "row_ids": ["r1", "r0"]}, {"label": 2, "row_ids": ["r3"]}]
    run = _run(scores, clusters, ids)
    assert select(run) == ["r1", "r3", "r0"]  # the clusters' rows, in ranking order
    assert select(run, "cluster 1") == ["r1", "r0"] and select(run, "Cluster 2") == ["r3"]
    assert select(run, "top 3") == ["r1", "r3", "r0"]
    assert select(run, "top 10") == ["r1", "r3", "r0", "r4"]  # only harmful rows, never r2 or r5
    with pytest.raises(GradianUserError, match="no cluster 3"):
        select(run, "cluster 3")
    with pytest.raises(GradianUserError, match="not a selection"):
        select(run, "cluster 0")
    with pytest.raises(GradianUserError, match="no capability"):
        select(run, capability="symbols")
    with pytest.raises(GradianUserError, match="attributed nothing"):
        select({"attribution": None})
    assert parse_drop(" top:4 ") == ("top", 4)


def test_verify_removes_what_the_summary_blames():
    from gradian.verify.run import VerifySpec, blamed_rows, plan

    ids = [f"r{i}" for i in range(8)]
    scores = [-1.0, -5.0, 2.0, -3.0, -0.5, 1.0, -0.2, 0.4]
    run = _run(scores, [{"label": 1, "row_ids": ["r1", "r3"]}, {"label": 2, "row_ids": ["r0"]}], ids)
    cap = {**run["attribution"]["capabilities"][0], "_train_ids": ids}
    assert blamed_rows(cap, VerifySpec()) == select(run, "blamed")
    assert blamed_rows(cap, VerifySpec(remove_cluster=2)) == select(run, "cluster 2") == ["r0"]
    assert blamed_rows(cap, VerifySpec(remove=2)) == select(run, "top 2")
    fix = plan(run, VerifySpec(controls=0, seed_band=0), 0)[0]
    assert fix.kind == "fix" and fix.removed == ["r1", "r3", "r0"]
    assert Counter(fix.removed) == Counter(select(run))
