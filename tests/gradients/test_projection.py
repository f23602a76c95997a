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


def test_matrices_go_to_another_device_once_and_stay_on_the_cpu_as_they_are():
    """On a CPU in float64 (what every caller passes) the block's own matrix is used, no copy; on another
    device (``meta`` stands in for a GPU here) each block's matrices are copied there once and kept."""
    proj = KroneckerProjector([(4, 96), (96, 4)], ["A", "B"], ProjectionSpec(dim=32))
    assert proj.matrices(0, "cpu", torch.float64)[1] is proj.mats[0][1]
    assert proj.matrices(0, "cpu", torch.float32)[1].dtype == torch.float32 and not proj._moved  # nothing kept
    out = proj(0, torch.empty(2, 4, 96, dtype=torch.float64, device="meta"))
    assert out.shape == (2, 32) and out.device.type == "meta"
    first = proj.matrices(0, torch.device("meta"), torch.float64)
    proj(0, torch.empty(5, 4, 96, dtype=torch.float64, device="meta"))
    assert proj.matrices(0, "meta", torch.float64)[1] is first[1] and first[1].device.type == "meta"
    assert list(proj._moved) == [("meta", torch.float64)] and list(proj._moved[("meta", torch.float64)]) == [0]
