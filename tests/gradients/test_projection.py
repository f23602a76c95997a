"""The Kronecker JL projection: what it computes, and where its matrices live."""

from __future__ import annotations

import torch

from gradian.gradients.projection import KroneckerProjector, ProjectionSpec, projected_numbers


def test_projection_is_p_o_g_p_i_transposed_per_example():
    proj = KroneckerProjector([(4, 96), (96, 4)], ["A", "B"], ProjectionSpec(dim=32, seed=5))
    gA = torch.randn(3, 4, 96, dtype=torch.float64)
    gB = torch.randn(3, 96, 4, dtype=torch.float64)
    (_, Pi), (Po, _) = proj.mats
    assert Pi.shape == (8, 96) and Po.shape == (8, 96)  # the wide side to dim // r, the rank side kept
    assert torch.equal(proj(0, gA), (gA @ Pi.T).reshape(3, -1))
    assert torch.equal(proj(1, gB), (Po @ gB).reshape(3, -1))
    assert proj.out_dim(0, (4, 96)) == projected_numbers((4, 96), "A", 32) == 32


def test_matrices_go_to_another_device_or_dtype_once_and_stay_on_the_cpu_as_they_are():
    """On a CPU in float64 the block's own matrix is used, no copy; in float32 (what an index build projects in)
    or on another device (``meta`` stands in for a GPU here) each block's matrices are converted once and kept."""
    proj = KroneckerProjector([(4, 96), (96, 4)], ["A", "B"], ProjectionSpec(dim=32))
    assert proj.matrices(0, "cpu", torch.float64)[1] is proj.mats[0][1] and not proj._moved
    f32 = proj.matrices(0, "cpu", torch.float32)[1]
    assert f32.dtype == torch.float32 and torch.equal(f32, proj.mats[0][1].float())
    assert proj.matrices(0, "cpu", torch.float32)[1] is f32  # kept, not converted again
    proj._moved.clear()
    out = proj(0, torch.empty(2, 4, 96, dtype=torch.float64, device="meta"))
    assert out.shape == (2, 32) and out.device.type == "meta"
    first = proj.matrices(0, torch.device("meta"), torch.float64)
    proj(0, torch.empty(5, 4, 96, dtype=torch.float64, device="meta"))
    assert proj.matrices(0, "meta", torch.float64)[1] is first[1] and first[1].device.type == "meta"
    assert list(proj._moved) == [("meta", torch.float64)] and list(proj._moved[("meta", torch.float64)]) == [0]


def test_an_index_projects_in_float32_unless_it_stores_float64():
    """``stored`` is what the builds write: a projected block computed in float32 (float64 for a float64 store),
    within float32 rounding of the float64 projection; a block kept whole is only cast. The precision is part of
    a projected index's identity, and an exact index's identity does not change."""
    from gradian.gradients.projection import projection_dtype
    from gradian.index.spec import GradSpec

    proj = KroneckerProjector([(4, 96), (96, 4)], ["A", "B"], ProjectionSpec(dim=32, seed=5))
    g = torch.randn(3, 4, 96, dtype=torch.float64)
    ref = proj(0, g)  # float64
    got = proj.stored(0, g, "float32")
    assert got.dtype == torch.float32
    assert torch.equal(got, proj(0, g.float()))  # computed in float32, not float64 and then cast
    assert not torch.equal(got, ref.float())
    assert float((got.double() - ref).abs().max() / ref.abs().max()) < 1e-6
    assert torch.equal(proj.stored(0, g, "float64"), ref)
    assert torch.equal(proj.stored(0, g, "bfloat16"), proj(0, g.float()).bfloat16())
    # a build keeps only the float32 matrices: the same draws, the same stored numbers, no float64 copy
    kept = KroneckerProjector([(4, 96), (96, 4)], ["A", "B"], ProjectionSpec(dim=32, seed=5), keep="float32")
    assert kept.mats[0][1].dtype == torch.float32 and torch.equal(kept.mats[0][1], proj.mats[0][1].float())
    assert torch.equal(kept.stored(0, g, "float32"), got) and not kept._moved
    whole = KroneckerProjector([(4, 96)], ["A"], ProjectionSpec(dim=0))
    assert torch.equal(whole.stored(0, g, "float32"), g.reshape(3, -1).float())

    assert projection_dtype("float32") == projection_dtype("bfloat16") == "float32"
    assert projection_dtype("float64") == "float64"
    exact, projected = GradSpec(), GradSpec(projection=ProjectionSpec(dim=512))
    assert exact.identity()["projection"] == {"dim": 0, "seed": 0}  # as before: exact index ids are unchanged
    assert projected.identity()["projection"] == {"dim": 512, "seed": 0, "compute": "float32"}
    assert projected.to_dict()["projection"] == {"dim": 512, "seed": 0}  # the manifest's spec is unchanged
    f64 = GradSpec(projection=ProjectionSpec(dim=512), storage_dtype="float64")
    assert f64.identity()["projection"]["compute"] == "float64"
