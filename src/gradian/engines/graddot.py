"""Gradient-dot (identity curvature, TracIn-like at one checkpoint): ``r = g_q``."""

from __future__ import annotations

from gradian.engines.base import Blocks, Engine
from gradian.index.store import GradientIndex


class GradDot(Engine):
    """``score_j = Σ_l ⟨g_q,l, g_j,l⟩``: the cheap second opinion; no curvature, no damping."""

    name = "graddot"

    def fit(self, index: GradientIndex) -> None:
        self.fitted = True

    def precondition(self, index: GradientIndex, queries: Blocks) -> Blocks:
        return {k: v.double() for k, v in queries.items()}

    def describe(self):
        return {"engine": self.name}
