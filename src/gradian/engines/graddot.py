"""Gradient-dot (identity curvature, TracIn-like at one checkpoint): ``r = g_q``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gradian.engines.base import Blocks, Engine, EngineSpec, ModelPass
from gradian.engines.registry import register

if TYPE_CHECKING:  # torch comes where the engine computes: its spec is read without it
    from gradian.index.store import GradientIndex


@dataclass(frozen=True)
class GradDotSpec(EngineSpec):
    """Gradient-dot has no knobs."""


@register
class GradDot(Engine):
    """``score_j = Σ_l ⟨g_q,l, g_j,l⟩``: the cheap second opinion; no curvature, no damping."""

    name = "graddot"
    spec_class = GradDotSpec
    needs = "index"
    summary = "identity curvature, TracIn at one checkpoint"

    def fit(self, index: GradientIndex, model_pass: ModelPass | None = None) -> None:
        self.fitted = True

    def precondition(self, index: GradientIndex, queries: Blocks) -> Blocks:
        return {k: v.double() for k, v in queries.items()}

    def describe(self):
        return {"engine": self.name}
